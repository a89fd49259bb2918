"""Gradient estimators as Pyro effect handlers (filled in by local reparameterisation)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager

__all__ = ["estimator"]

_ESTIMATORS: dict[str, Callable[[], ContextManager]] = {}


def estimator(name: str | None) -> Callable[[], ContextManager]:
    """The handler factory for an estimator name; ``None`` is plain weight sampling."""
    if name is None:
        return contextlib.nullcontext
    if name not in _ESTIMATORS:
        raise ValueError(f"reparam must be None or one of {sorted(_ESTIMATORS)}, got {name!r}")
    return _ESTIMATORS[name]
