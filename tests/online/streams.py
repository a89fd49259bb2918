"""What the tests of the online updaters share: a start at the prior mean, a stream, an error."""

from __future__ import annotations

import torch


def at_prior_mean(x):
    """``init_loc`` of a linear BNN on ``x`` at the zero prior mean, in ``x``'s dtype."""
    dim = x.shape[1]
    return {"0.weight": torch.zeros(1, dim, dtype=x.dtype), "0.bias": torch.zeros(1, dtype=x.dtype)}


def stream(updater, x, y, batch):
    """Feed ``x, y`` to ``updater`` in minibatches of ``batch``; its belief at the end."""
    for start in range(0, len(x), batch):
        updater.update(x[start : start + batch], y[start : start + batch])
    return updater.guide.distribution()


def relative_error(a, b):
    """The largest difference of ``a`` from ``b``, relative to ``b``'s largest entry."""
    return float((a - b).abs().max() / b.abs().max())
