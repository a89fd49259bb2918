"""A network's buffers kept as they were through a pass that only checks or probes it.

Deciding how draws reach a network runs it, and so do ``fit``'s set-up checks: a
``BatchNorm`` in training mode would move its running statistics each time. Nothing here
knows of draws.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ..layers import BayesianLayer

__all__ = ["kept_buffers"]


@contextmanager
def kept_buffers(module: nn.Module) -> Iterator[None]:
    """Restore ``module``'s buffers (e.g. BatchNorm's running statistics) on leaving.

    For passes that check or probe a network: they must leave it as it was.
    """
    saved = [(buffer, buffer.detach().clone()) for buffer in _changeable_buffers(module)]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def _changeable_buffers(root: nn.Module) -> Iterator[torch.Tensor]:
    """Every buffer but the Bayesian layers' initial values, which no forward changes."""
    for module in root.modules():
        constant = {f"{p}_init" for p in module.priors} if isinstance(module, BayesianLayer) else ()
        for name, buffer in module.named_buffers(recurse=False):
            if name not in constant:
                yield buffer
