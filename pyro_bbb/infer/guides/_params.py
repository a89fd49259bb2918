"""A guide's parameters: created with a check against Pyro's param store, read fast.

:func:`set_param` creates a guide parameter after checking that Pyro's global param store
does not already hold one of that name with another shape (a second model in one session),
which would otherwise be silently reused and fail deep inside torch.

:class:`ParamRef` reads one fast. Reading ``guide.locs.fc1.weight`` walks one
``PyroModule.__getattr__`` per name component and then issues the ``pyro.param`` statement;
on a small network that walk costs more than the arithmetic of the guide. ``ParamRef``
resolves the path once and afterwards issues the ``pyro.param`` statement directly, which is
all the walk amounts to while the module and Pyro's param store hold the same tensor. When
they do not (the store was cleared or loaded, or module-local params are enabled) it takes
the module's own path, which re-synchronises them, so the semantics are PyroModule's.
"""

from __future__ import annotations

from operator import attrgetter

import pyro
import torch
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam

from ..._pyro_compat import (
    join_name,
    module_local_params,
    param_store_value,
    pyro_name,
    unconstrained_parameter,
)

__all__ = ["ParamRef", "set_param"]


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
    """
    if not module_local_params():
        name = pyro_name(root)
        fullname = join_name(name, path)
        store = pyro.get_param_store()
        if fullname in store and store[fullname].shape != value.shape:
            guide = name.rpartition(".")[0] or name
            raise ValueError(
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
            value = getattr(self._owner, self._leaf)  # PyroModule's own path
        return value

    def module_value(self) -> torch.Tensor:
        """The module's own tensor, without a ``pyro.param`` statement.

        For a reader that has checked once that the module and Pyro's param store hold the
        same tensor (``fit``'s fused step, whose optimiser holds the store's tensors). The
        parameter is real-valued, so this is its value.
        """
        return unconstrained_parameter(self._owner, self._leaf)
