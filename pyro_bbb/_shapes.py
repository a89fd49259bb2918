"""Shape helpers for the hot path: cheaper than their ``torch`` counterparts on small tuples.

``torch.broadcast_shapes`` runs through ``torch._refs`` in Python and costs tens of
microseconds, which on a small network is comparable to a matrix product; these do the same
arithmetic on tuples.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["broadcast_shape", "collapse_broadcast"]


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
