"""Which of Pyro's parameters a fit has trained, and for whom: the record its warnings read.

Pyro's param store is global and shares a parameter by name: a guide or model built later
under a name a fit trained takes the fitted tensor in place of its own initial value.
:func:`~pyro_bbb.fit` records the tensors it trains with their owner (the model, or the
guide) by :func:`record_fit`; a guide's set-up (:mod:`pyro_bbb.infer.guides._params`) and
the next fit ask :func:`fitted_by` to tell a parameter taken from another fit, and warn.
Where the values taken are about to be replaced by saved ones (``fit(resume=...)``,
:func:`~pyro_bbb.load`), :func:`replacing_values` says so and nothing is warned.

The bottom layer: the guides (inference), ``load`` (files) and ``fit`` (training) read it;
it imports nothing of the package.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator

import torch

__all__ = ["GONE", "fitted_by", "record_fit", "replacing_values", "values_replaced"]

#: :func:`fitted_by` of a tensor whose owner no longer exists (a model or guide dropped).
GONE = object()

#: ``id(tensor) -> (weak reference to it, weak reference to its owner)``: an entry goes
#: with its tensor, and a new tensor at a reused address is not taken for it.
_FITTED: dict[int, tuple[weakref.ref, weakref.ref]] = {}
#: How many sections are replacing a guide's values (:func:`replacing_values`).
_REPLACING: list[int] = [0]


def record_fit(tensors: Iterable[torch.Tensor], owner: object) -> None:
    """Record that a fit trains ``tensors`` (the param store's, by name) for ``owner``."""
    owned = weakref.ref(owner)
    for tensor in tensors:
        key = id(tensor)
        _FITTED[key] = (weakref.ref(tensor, lambda _, key=key: _FITTED.pop(key, None)), owned)


def fitted_by(tensor: torch.Tensor) -> object | None:
    """Whom a fit trained ``tensor`` for: the owner, :data:`GONE`, or ``None`` (no fit)."""
    entry = _FITTED.get(id(tensor))
    if entry is None or entry[0]() is not tensor:
        return None
    owner = entry[1]()
    return GONE if owner is None else owner


@contextlib.contextmanager
def replacing_values() -> Iterator[None]:
    """A section that sets up a model and guide whose values saved ones then replace."""
    _REPLACING[0] += 1
    try:
        yield
    finally:
        _REPLACING[0] -= 1


def values_replaced() -> bool:
    """Whether a :func:`replacing_values` section is running."""
    return _REPLACING[0] > 0
