"""A guide's parameters: created with a check against Pyro's param store, read fast.

:func:`set_param` creates a guide parameter after checking that Pyro's global param store
does not already hold one of that name with another shape (a second model in one session),
which would otherwise be silently reused and fail deep inside torch. A parameter of that
name and shape that :func:`~pyro_bbb.fit` trained for another guide (:mod:`pyro_bbb._fitted`),
left in the store by an earlier fit (a notebook cell run twice without
``pyro.clear_param_store()``), would be taken as this guide's starting value: a guide never
fitted would predict as the fitted one. Pyro shares it (same name, same parameter), so it is
taken, but not silently: :func:`taking_fitted` warns once per guide, naming the way out.
:func:`claim_fitted` does the same, when a fit begins, for what a guide's set-up does not
see: a model's point estimates (a learned noise scale, ``likelihood.scale``, that two
models of one name share) and Pyro's own autoguides. Neither warns where saved values
replace the ones taken (``fit(resume=...)``, :func:`~pyro_bbb.load`).

:class:`ParamRef` reads one fast. Reading ``guide.locs.fc1.weight`` walks one
``PyroModule.__getattr__`` per name component and then issues the ``pyro.param`` statement;
on a small network that walk costs more than the arithmetic of the guide. ``ParamRef``
resolves the path once and afterwards issues the ``pyro.param`` statement directly, which is
all the walk amounts to while the module and Pyro's param store hold the same tensor. When
they do not (the store was cleared or loaded, or module-local params are enabled) it takes
the module's own path, which re-synchronises them, so the semantics are PyroModule's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from operator import attrgetter

import pyro
import torch
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam

from ..._fitted import fitted_by, record_fit, values_replaced
from ..._pyro_compat import (
    SetupError,
    join_name,
    module_local_params,
    param_store_value,
    pyro_name,
    synced_parameter,
    unconstrained_parameter,
)

__all__ = ["ParamRef", "claim_fitted", "set_param", "taking_fitted"]

#: The param-store names of fitted parameters a guide being built takes (innermost build last).
_TAKING: list[list[str]] = []


def claim_fitted(
    named: Mapping[str, torch.Tensor], model: object, guide: object, *, set_up: bool
) -> None:
    """Record what a fit trains; warn where it trains what another fit trained for another.

    The guide's parameters are the guide's, the others (a learned noise scale) the
    model's. A parameter an earlier fit trained for another model, or for another guide
    that this package's set-up does not check (``set_up=False``: a Pyro autoguide), is
    shared by name with it (Pyro's rule): the fit starts from that fit's value and moves
    both. That is warned of once a fit, naming the way out, unless saved values replace
    them (:func:`~pyro_bbb._fitted.replacing_values`). Continuing a fit with the same
    model and guide warns of nothing.

    Args:
        named: Every parameter the fit trains, ``{param-store name: unconstrained}``.
        model: The model.
        guide: The guide.
        set_up: Whether the guide's own set-up checked its parameters (:func:`set_param`).
    """
    prefix = pyro_name(guide)
    prefix = f"{prefix}." if prefix else None
    shared: dict[str, list[str]] = {"model": [], "guide": []}
    for name, tensor in named.items():
        side = "guide" if prefix is not None and name.startswith(prefix) else "model"
        owner = guide if side == "guide" else model
        previous = fitted_by(tensor)
        if previous is not None and previous is not owner and not (side == "guide" and set_up):
            shared[side].append(name)
        record_fit([tensor], owner)
    if values_replaced():
        return
    for side, names in shared.items():
        if not names:
            continue
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        fix = (
            "give this model its own name (BNN(..., name='b') names its sites and "
            "parameters 'b.<name>')"
            if side == "model"
            else f"give this guide its own name (name='{prefix[:-1]}2')"
        )
        warnings.warn(
            f"Pyro's param store already holds {names[0]!r}{more}, trained by an earlier fit "
            f"of another {side}: this fit trains those very parameters (Pyro shares "
            "parameters by name), starting from that fit's values and moving the other "
            f"{side}'s with them. For a {side} of its own call pyro.clear_param_store() "
            f"before building it, or {fix}; to continue that fit, pass the fitted model "
            "and guide themselves to fit again",
            UserWarning,
            stacklevel=_outside_frames(),
        )


@contextlib.contextmanager
def taking_fitted(guide: str, name: str) -> Iterator[None]:
    """Warn once, after building a guide's parameters, if any takes a fitted value.

    Args:
        guide: The guide's class name, for the message.
        name: Its name in the param store (its ``name=``).
    """
    taken: list[str] = []
    _TAKING.append(taken)
    try:
        yield
    finally:
        _TAKING.pop()
    if taken and not values_replaced():
        more = f" and {len(taken) - 1} more of its parameters" if len(taken) > 1 else ""
        warnings.warn(
            f"Pyro's param store already holds {taken[0]!r}{more}, trained by an earlier "
            f"fit of another {guide} named {name!r}: this guide takes those fitted values in "
            "place of its own initialisation (Pyro shares parameters by name), so it starts "
            "from, and predicts as, the fitted guide. For a fresh guide call "
            "pyro.clear_param_store() before building the model and guide, or give this one "
            f"its own name (name='{name}2'); to continue that fit, pass the fitted guide "
            "itself to fit again",
            UserWarning,
            stacklevel=_outside_frames(),
        )


#: The packages a guide is set up through: a warning points at the first frame outside them.
_INSIDE = (
    *(
        os.path.dirname(module.__file__) + os.sep
        for module in (sys.modules[__name__.partition(".")[0]], pyro, torch)
    ),
    contextlib.__file__,
)


def _outside_frames() -> int:
    """The ``stacklevel`` of the caller's first frame outside pyro_bbb, Pyro and torch.

    A guide is set up on its first use, through ``fit``, ``predict`` or a handler, at a
    depth that varies; the warning is pointed at the user's line, so that Python's default
    filter shows it once per line of the user's, not once per session.
    """
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    return level


def set_param(root: PyroModule, path: str, value: torch.Tensor, *, site: str) -> None:
    """Create the guide parameter ``root.<path>`` with initial ``value``.

    Pyro's param store is global and returns a stored value in place of the initial one, so
    a parameter of the same name left by an earlier guide would be reused. With the same
    shape that is Pyro's documented sharing; with another shape it would fail later inside
    torch, far from the cause, so it is refused here.

    Args:
        root: The guide's ``PyroModule`` holding parameters of this kind (``guide.locs``).
        path: Dotted path below ``root`` (a site or block name).
        value: Initial value.
        site: The model site (or block) the parameter belongs to, for the error message.

    Raises:
        ValueError: If the param store holds ``<root name>.<path>`` with another shape.

    Warns:
        UserWarning: Through :func:`taking_fitted`, once a guide, when the store holds it
            with this shape, trained by ``fit`` for another guide (not where saved values
            replace it).
    """
    if not module_local_params():
        name = pyro_name(root)
        fullname = join_name(name, path)
        store = pyro.get_param_store()
        stored = store[fullname] if fullname in store else None  # noqa: SIM401 (no .get)
        unconstrained = getattr(stored, "unconstrained", lambda: stored)()
        taken = (
            stored is not None
            and stored.shape == value.shape
            and fitted_by(unconstrained) is not None
        )
        if taken and _TAKING:
            _TAKING[-1].append(fullname)
        if stored is not None and stored.shape != value.shape:
            guide = name.rpartition(".")[0] or name
            raise SetupError(
                f"Pyro's param store already holds {fullname!r} with shape "
                f"{tuple(store[fullname].shape)}, but site {site!r} of this model needs "
                f"{tuple(value.shape)}: it was left by an earlier guide of the same name "
                "(another model in this session). Call pyro.clear_param_store() before "
                f"building this guide, or give it its own name, e.g. name='{guide}2'."
            )
    deep_setattr(root, path, PyroParam(value))


class ParamRef:
    """A handle on the real-valued ``PyroParam`` at ``path`` (e.g. ``"fc1.weight"``) of a module.

    Args:
        root: The ``PyroModule`` holding the parameter (e.g. a guide's ``locs``).
        path: Dotted attribute path below ``root``.
    """

    def __init__(self, root: PyroModule, path: str) -> None:
        owner_path, _, self._leaf = path.rpartition(".")
        self._owner = attrgetter(owner_path)(root) if owner_path else root

    def __call__(self) -> torch.Tensor:
        """The parameter's current value, recorded as a ``pyro.param`` site."""
        value = param_store_value(self._owner, self._leaf)
        if value is None:  # out of sync, substituted by a handler, or module-local
            value = synced_parameter(self._owner, self._leaf)  # PyroModule's own path
        return value

    def module_value(self) -> torch.Tensor:
        """The module's own tensor, without a ``pyro.param`` statement.

        For a reader that has checked once that the module and Pyro's param store hold the
        same tensor (``fit``'s fused step, whose optimiser holds the store's tensors). The
        parameter is real-valued, so this is its value.
        """
        return unconstrained_parameter(self._owner, self._leaf)
