"""What many tests share: the size of statistical checks, the CUDA and NumPyro markers, and
the networks of ``examples/user_networks.py``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

#: The repository's root (examples and scripts are run from here).
REPO = Path(__file__).resolve().parent.parent

#: The five UCI regression sets, if a checkout of the shared data lies beside the repository
#: (``PYRO_BBB_UCI`` points elsewhere); tests that need them skip without them.
UCI_ROOT = Path(os.environ.get("PYRO_BBB_UCI", REPO.parent / "shared" / "data" / "uci"))

#: ``PYRO_BBB_FULL=1`` runs the slow statistical checks at full size; CI runs a short form.
FULL = os.environ.get("PYRO_BBB_FULL", "") == "1"


def scaled(short: int, full: int) -> int:
    """A size for a statistical check: ``short`` in CI, ``full`` with ``PYRO_BBB_FULL=1``."""
    return full if FULL else short


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

#: Whether the NumPyro backend's extra (JAX and NumPyro) is installed.
HAS_NUMPYRO = all(importlib.util.find_spec(name) for name in ("jax", "numpyro"))

requires_numpyro = pytest.mark.skipif(
    not HAS_NUMPYRO, reason='needs the numpyro extra: pip install "pyro-bbb[numpyro]"'
)


def _load_user_networks():
    """``examples/user_networks.py``: networks written for activations ``(batch, ...)``."""
    spec = importlib.util.spec_from_file_location(
        "user_networks", REPO / "examples" / "user_networks.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its networks pickle by reference, as a user's would
    spec.loader.exec_module(module)
    return module


user_networks = _load_user_networks()
