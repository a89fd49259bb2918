"""Shared test set-up: a clean Pyro state per test, and the size of statistical checks."""

from __future__ import annotations

import os

import pyro
import pytest
import torch

#: ``PYRO_BBB_FULL=1`` runs the slow statistical checks at full size; CI runs a short form.
FULL = os.environ.get("PYRO_BBB_FULL", "") == "1"


@pytest.fixture(autouse=True)
def clean_pyro_state():
    """Every test starts with an empty param store, fixed seeds and validation on."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    torch.set_num_threads(1)  # small nets: one thread is fastest, and robust to a busy machine
    with pyro.validation_enabled(True):
        yield
    pyro.clear_param_store()


def scaled(short: int, full: int) -> int:
    """A size for a statistical check: ``short`` in CI, ``full`` with ``PYRO_BBB_FULL=1``."""
    return full if FULL else short


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
