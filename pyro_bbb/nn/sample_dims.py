"""The sample dims of drawn parameters, and the draw a per-draw pass of a network runs on.

Under Pyro plates a global weight site drawn ``P`` times (particles, predictive samples) has
shape ``(P, 1, *weight_shape)``: the ``1`` is the model's data plate dim; replayed by
``Predictive`` it is ``(P, *weight_shape)``. :func:`sample_shape` reads the sample dims off
either. When a network runs once per draw (:mod:`pyro_bbb.nn.draws`), the draw under way is
held in a :class:`contextvars.ContextVar` for the duration of the pass, and
:meth:`Draw.select` gives a parameter's value (or anything derived from it) for that draw.
Nothing here knows of layers, guides or training.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = [
    "Draw",
    "current_draw",
    "running_draw",
    "sample_shape",
    "sample_shape_of",
]


def sample_shape(param: torch.Tensor, event_dims: int) -> torch.Size:
    """Sample dims of a parameter with a trailing size-1 (data plate) dim dropped.

    Empty for a plain parameter. ``(P, 1, out, in)`` (drawn under a particle plate) and
    ``(P, out, in)`` (as ``Predictive`` replays guide samples) both give ``(P,)``.
    """
    return torch.Size(sample_shape_of(param.shape, event_dims))


def sample_shape_of(shape: Sequence[int], event_dims: int) -> Sequence[int]:
    """:func:`sample_shape` of a parameter of ``shape``, for a draw not formed (yet)."""
    dims = shape[: len(shape) - event_dims]
    return dims[:-1] if dims and dims[-1] == 1 else dims


@dataclass(frozen=True)
class Draw:
    """The draw a per-draw pass of a network runs on.

    Attributes:
        sample: The draws' sample shape; the pass runs ``prod(sample)`` of them.
        index: This draw's flat index: an int in a loop, a 0-d tensor batched by
            :func:`torch.func.vmap` in a vectorised pass.
        full: Each drawn site's value as drawn, ``(*sample, [1,] *shape)``, by site name.
        views: Each drawn site's value for this draw, ``shape``, by site name.
    """

    sample: torch.Size
    index: int | torch.Tensor
    full: Mapping[str, torch.Tensor]
    views: Mapping[str, torch.Tensor]

    @property
    def count(self) -> int:
        """The number of draws in the pass."""
        return math.prod(self.sample)

    def as_drawn(self, site: str | None, value: torch.Tensor) -> torch.Tensor:
        """The value of ``site`` as drawn, if ``value`` is this draw's view of it; else ``value``.

        Estimators match a layer's weights with the draws they recorded by identity, and
        those recorded the values as drawn, with their sample dims.
        """
        view = self.views.get(site) if site is not None else None
        return self.full[site] if view is not None and view is value else value

    def select(self, value: torch.Tensor, event_dims: int, site: str | None = None) -> torch.Tensor:
        """``value``'s slice for this draw.

        Args:
            value: A parameter's draw, or anything derived from it that carries its sample
                dims, ``(*sample, [1,] *event)``; its sample dims may be any that broadcast
                to the pass's (size 1 for a part every draw shares).
            event_dims: The number of trailing dims that are the parameter's own.
            site: The site whose drawn value (or this draw's view of it) ``value`` is, if
                it is one: its slice is then the vectorised pass's input, with no copy.

        Returns:
            ``(*event,)``.
        """
        if site is not None and (self.full.get(site) is value or self.views.get(site) is value):
            return self.views[site]
        event = value.shape[value.dim() - event_dims :]
        own = sample_shape(value, event_dims)
        if math.prod(own) == 1:
            return value if value.dim() == event_dims else value.reshape(event)
        flat = value.reshape(*own, *event).expand(*self.sample, *event)
        return flat.reshape(self.count, *event)[self.index]


_CURRENT: contextvars.ContextVar[Draw | None] = contextvars.ContextVar(
    "pyro_bbb_current_draw", default=None
)


def current_draw() -> Draw | None:
    """The draw of the per-draw pass under way, or ``None`` outside one."""
    return _CURRENT.get()


@contextmanager
def running_draw(draw: Draw) -> Iterator[None]:
    """Make ``draw`` the current one for the duration of the block."""
    token = _CURRENT.set(draw)
    try:
        yield
    finally:
        _CURRENT.reset(token)
