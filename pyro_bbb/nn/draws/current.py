"""The draw a per-draw pass of a network runs on, and what a layer may ask of it.

When a network runs once per weight draw (:mod:`~pyro_bbb.nn.draws.per_draw`), the draw
under way is held in a :class:`contextvars.ContextVar` for the duration of the pass:
:func:`current_draw` gives it (``None`` outside a pass), and :class:`Draw` answers what a
layer or an estimator acting for one may ask (the contract is stated in
:mod:`pyro_bbb.nn.draws`). :func:`one_draw` lets a caller that put a run's values in place
itself say that they are one draw, with no sample dims. Nothing here knows of layers,
guides or training.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..._shapes import sample_dims

__all__ = ["Draw", "current_draw", "drawn_once", "one_draw", "running_draw"]


@dataclass(frozen=True)
class Draw:
    """The draw a per-draw pass of a network runs on.

    Attributes:
        sample: The draws' sample shape; the pass runs ``prod(sample)`` of them.
        index: This draw's flat index: an int in a loop, a 0-d tensor batched by
            :func:`torch.func.vmap` in a vectorised pass.
        full: Each drawn site's value as drawn, ``(*sample, [1,] *shape)``, by site name.
        views: Each drawn site's value for this draw, ``shape``, by site name: what a read
            of the site gives inside the pass.
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

        Args:
            site: The site name of the parameter ``value`` was read from (``None`` for one
                that is not a site).
            value: What the layer read.

        Returns:
            ``full[site]``, ``(*sample, [1,] *shape)``, when ``value`` is ``views[site]``
            itself; ``value`` otherwise (a deterministic parameter, a value of another run).
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
        own = sample_dims(value, event_dims)
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


_ONE_DRAW: contextvars.ContextVar[bool] = contextvars.ContextVar("pyro_bbb_one_draw", default=False)


def drawn_once() -> bool:
    """Whether the caller said the current run's values are one draw (:func:`one_draw`)."""
    return _ONE_DRAW.get()


@contextmanager
def one_draw() -> Iterator[None]:
    """Say, for the block, that every site the run reads holds one draw, with no sample dims.

    A caller that put every value of a run in place itself knows it (the fused step of
    :mod:`pyro_bbb.infer.fused` with one weight draw): the runner of a network's ``forward``
    (:class:`~pyro_bbb.nn.draws.PerDrawForward`) then runs the network's own ``forward`` at
    once, without reading every site to find sample dims (on a ResNet's 62 sites, 170 µs a
    call). Nothing checks the claim: a value with sample dims would reach a layer that
    refuses it (:class:`~pyro_bbb.nn.module_layer.BayesianModule` raises).
    """
    token = _ONE_DRAW.set(True)
    try:
        yield
    finally:
        _ONE_DRAW.reset(token)
