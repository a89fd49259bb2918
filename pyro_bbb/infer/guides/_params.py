"""Fast access to the real-valued parameters of a guide, one ``pyro.param`` statement each.

Reading ``guide.locs.fc1.weight`` walks one ``PyroModule.__getattr__`` per name component
and then issues the ``pyro.param`` statement; on a small network that walk costs more than
the arithmetic of the guide. :class:`ParamRef` resolves the path once and afterwards issues
the ``pyro.param`` statement directly, which is all the walk amounts to while the module and
Pyro's param store hold the same tensor. When they do not (the store was cleared or loaded,
or module-local params are enabled) it takes the module's own path, which re-synchronises
them, so the semantics are PyroModule's.
"""

from __future__ import annotations

from operator import attrgetter

import pyro
import torch
from pyro.nn import PyroModule
from pyro.nn.module import _is_module_local_param_enabled

__all__ = ["ParamRef"]


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
        owner = self._owner
        name = owner.__dict__.get("_pyro_name")
        if name is not None and not _is_module_local_param_enabled():
            fullname = f"{name}.{self._leaf}" if name else self._leaf
            if fullname in pyro.get_param_store():
                value = pyro.param(fullname)
                if value is owner._parameters.get(f"{self._leaf}_unconstrained"):
                    return value
        # Out of sync, substituted by a handler, or module-local: PyroModule's own path.
        return getattr(owner, self._leaf)
