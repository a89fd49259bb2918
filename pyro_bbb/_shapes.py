"""Shape helpers for the hot path: cheaper than their ``torch`` counterparts on small tuples.

``torch.broadcast_shapes`` runs through ``torch._refs`` in Python and costs tens of
microseconds, which on a small network is comparable to a matrix product; these do the same
arithmetic on tuples. :func:`sample_dims` reads the sample dims off a drawn parameter: under
Pyro plates a global weight site drawn ``P`` times (particles, predictive samples) has shape
``(P, 1, *weight_shape)``, the ``1`` being the model's data plate dim, and replayed by
``Predictive`` it is ``(P, *weight_shape)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["broadcast_shape", "collapse_broadcast", "sample_dims", "sample_dims_of"]


def broadcast_shape(*shapes: Sequence[int]) -> torch.Size:
    """The broadcast of several shapes (NumPy rules), as ``torch.broadcast_shapes``.

    Raises:
        ValueError: If two shapes do not broadcast.
    """
    ndim = max((len(s) for s in shapes), default=0)
    result = [1] * ndim
    for shape in shapes:
        offset = ndim - len(shape)
        for i, size in enumerate(shape):
            current = result[offset + i]
            if size != current and size != 1:
                if current != 1:
                    raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
                result[offset + i] = size
    return torch.Size(result)


def collapse_broadcast(t: torch.Tensor, event_dims: int) -> torch.Tensor:
    """Narrow leading (non-event) dims that are stride-0 expansions to size 1.

    Same values after broadcasting, no copy: a parameter a plate expanded over particles is
    then computed with once, not once per particle.
    """
    for dim in range(t.dim() - event_dims):
        if t.stride(dim) == 0 and t.shape[dim] > 1:
            t = t.narrow(dim, 0, 1)
    return t


def sample_dims(param: torch.Tensor, event_dims: int) -> torch.Size:
    """The sample dims of a drawn parameter, a trailing size-1 (data plate) dim dropped.

    Empty for a plain parameter. ``(P, 1, out, in)`` (drawn under a particle plate) and
    ``(P, out, in)`` (as ``Predictive`` replays guide samples) both give ``(P,)``.

    Args:
        param: The parameter's value, ``(*sample, [1,] *event)``.
        event_dims: The number of trailing dims that are the parameter's own.
    """
    return torch.Size(sample_dims_of(param.shape, event_dims))


def sample_dims_of(shape: Sequence[int], event_dims: int) -> Sequence[int]:
    """:func:`sample_dims` of a parameter of ``shape``, for a draw not formed (yet)."""
    dims = shape[: len(shape) - event_dims]
    return dims[:-1] if dims and dims[-1] == 1 else dims
