"""The caller's random state, kept: draws seeded for reproducibility, or taken unnoticed.

``predict(seed=...)``, ``to_inference_data(seed=...)`` and ``psis_khat(seed=...)`` give the
same draws for the same seed, and leave the random stream of whoever called them where it was:
evaluating a guide inside a training loop (a callback scoring every epoch) must not reset
the loop's draws to the same numbers each time. A check that traces a model "without using
up random numbers" keeps the state the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pyro
import torch

from ._devices import cuda_devices

__all__ = ["kept_random_state", "seeded"]


@contextmanager
def kept_random_state(*things: object) -> Iterator[None]:
    """Restores Python's, NumPy's, torch's and the touched CUDA devices' random states on exit.

    Args:
        *things: Tensors or modules whose CUDA devices' states are kept too.
    """
    state = pyro.util.get_rng_state()
    try:
        with torch.random.fork_rng(devices=cuda_devices(*things)):
            yield
    finally:
        pyro.util.set_rng_state(state)


@contextmanager
def seeded(seed: int | None, *things: object) -> Iterator[None]:
    """Draws inside come from ``seed``; the random state outside is left as it was.

    Args:
        seed: The seed (``pyro.set_rng_seed``), or ``None`` to draw from the current state,
            advancing it as any draw does.
        *things: Tensors or modules whose CUDA devices' states are kept too.
    """
    if seed is None:
        yield
        return
    with kept_random_state(*things):
        pyro.set_rng_seed(seed)
        yield
