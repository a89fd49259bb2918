"""Every use this package makes of a private name of Pyro or torch, in one place.

Pyro (1.9) and torch keep some of what a plugin needs behind private names: the context in
which a ``PyroModule`` caches the values its ``PyroSample`` attributes drew, a module's Pyro
name, the factor of a low-rank Gaussian. Each is wrapped here, with why it is needed and
what the public way costs, so that a release that renames one fails in
``tests/test_pyro_compat.py`` under that name, not somewhere deep in a fit. No other module
of the package touches a private name of either library.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pyro
import torch
from pyro.nn import PyroModule
from pyro.nn.module import _is_module_local_param_enabled
from pyro.poutine.runtime import _PYRO_STACK
from torch import nn
from torch.nn.modules.conv import _ConvNd, _ConvTransposeNd

__all__ = [
    "PyroNameSharing",
    "SetupError",
    "active_handlers",
    "autonormal_latent",
    "cached_value",
    "concatenated",
    "conv_kinds",
    "fused_adam_step",
    "join_name",
    "low_rank_capacitance_tril",
    "low_rank_parts",
    "module_local_params",
    "param_store_value",
    "pyro_name",
    "root_network",
    "run_context",
    "sample_attributes",
    "set_cached_value",
    "set_pyro_name",
    "site_name",
    "stretches_of",
    "synced_parameter",
    "tensor_version",
    "unconstrained_parameter",
    "user_class",
]


# ----------------------------------------------------------------------------- errors
class SetupError(ValueError):
    """A ``ValueError`` of this package's, raised while a model or guide runs under a trace.

    Pyro's ``poutine.trace`` catches a ``ValueError`` and raises it again, of the same class,
    with the trace's table of shapes ("Trace Shapes: ... Param Sites: ...") appended to its
    message (``TraceHandler.__call__``): useful after an error of the user's model, noise
    after a message of ours that already says what is wrong and what to do. This class
    drops that table from any message it is built with, so the error reads as raised.
    """

    _TABLE = re.compile(r"\n\s*Trace Shapes:")

    def __init__(self, message: object = "") -> None:
        super().__init__(self._TABLE.split(str(message), maxsplit=1)[0])


# ----------------------------------------------------------------------------- names
def join_name(prefix: str, name: str) -> str:
    """A Pyro name under ``prefix``: ``"fc1" + "weight"`` gives ``"fc1.weight"``.

    Pyro's own rule for the names of a ``PyroModule``'s sites and parameters (its private
    ``_make_name``); written out here, where the rule is kept, as it is one line.
    """
    return f"{prefix}.{name}" if prefix else name


def pyro_name(module: nn.Module) -> str:
    """The name Pyro gives ``module``'s sites as a prefix (``""`` at a root, or not Pyro's).

    ``PyroModule._pyro_name`` is private; Pyro's public route to it, ``_pyro_get_fullname``,
    is private too.
    """
    return module.__dict__.get("_pyro_name") or ""


def set_pyro_name(module: PyroModule, name: str) -> None:
    """Name ``module``'s parameters ``<name>.<path>`` in Pyro's param store.

    ``PyroModule(name=...)`` takes the name at construction only; Pyro's autoguides, built
    by ``AutoGuide.__init__``, have no such argument.
    """
    module._pyro_name = name


def site_name(module: nn.Module, param: str) -> str:
    """The full site (or parameter) name of ``module``'s parameter ``param``.

    The one rule for site names in this package: the module's Pyro name, then the
    parameter, as ``PyroSample`` names its ``pyro.sample`` statement (``"fc1.weight"``, or
    ``"b.fc1.weight"`` in a model named ``"b"``).
    """
    return join_name(pyro_name(module), param)


def user_class(module: nn.Module) -> type[nn.Module]:
    """The class a user gave ``module``, not the ``PyroModule[...]`` Pyro made of it.

    Pyro builds those classes in ``pyro.nn.module`` and offers no public way back.
    """
    return next(cls for cls in type(module).__mro__ if cls.__module__ != "pyro.nn.module")


# ----------------------------------------------------------------------------- a run's values
def run_context(module: PyroModule) -> AbstractContextManager:
    """A run of ``module``: while inside, what its ``PyroSample`` attributes draw is cached.

    The private ``PyroModule._pyro_context``, which ``module(...)`` enters around its
    ``forward``; entering it directly lets a caller put values in place before the forward
    runs (:func:`set_cached_value`), where Pyro's public way, ``poutine.condition``, traces.
    """
    return module._pyro_context


def cached_value(module: PyroModule, site: str) -> torch.Tensor | None:
    """The value the current run of ``module``'s network drew at ``site``, if any.

    A ``PyroSample`` attribute returns it from its module's private ``_pyro_context``;
    reading ``getattr(module, param)`` (public) builds the site name again on every access:
    measured, 19 µs a read against 2.3 µs (six reads a step of a 1-50-50-1 network: 2 % of
    its step). ``None`` outside a run.
    """
    return module._pyro_context.get(site)


def set_cached_value(module: PyroModule, site: str, value: torch.Tensor) -> None:
    """Make ``value`` what every read of ``site`` returns for the rest of the current run.

    How a value reaches the layers without a ``pyro.sample`` statement (a fused step, one
    draw of a per-draw pass); Pyro's only way in is ``poutine.condition``, which issues the
    statement and is traced. No effect outside a run.
    """
    module._pyro_context.set(site, value)


def root_network(net: PyroModule, name: str, owner: PyroModule) -> None:
    """Root ``net``'s site names at ``name`` and share ``owner``'s run context.

    How a model holds a network whose sites read ``"fc1.weight"``, not ``"net.fc1.weight"``:
    the private ``PyroModule._pyro_set_supermodule`` is what a ``PyroModule`` parent calls on
    its children; there is no public equivalent.
    """
    net._pyro_set_supermodule(name, owner._pyro_context)


class PyroNameSharing:
    """A ``PyroModule`` mixin: the module in ``_shares_name_with`` takes this one's name.

    For a wrapper whose wrapped module's children must keep the names they had in the
    network (``"block.norm"``, not ``"block.module.norm"``). Overrides the private
    ``PyroModule._pyro_set_supermodule``, the hook Pyro calls to name a submodule.
    """

    #: The attribute holding the module that shares this one's name and context.
    _shares_name_with: str = "module"

    def _pyro_set_supermodule(self, name: str, context: Any) -> None:
        super()._pyro_set_supermodule(name, context)  # type: ignore[misc]
        shared = self._modules.get(self._shares_name_with)  # type: ignore[attr-defined]
        if isinstance(shared, PyroModule):
            shared._pyro_set_supermodule(name, context)

    def share_name(self) -> None:
        """Pass this module's current name and context on (after a conversion)."""
        shared = self._modules.get(self._shares_name_with)  # type: ignore[attr-defined]
        if isinstance(shared, PyroModule):
            shared._pyro_set_supermodule(pyro_name(self), self._pyro_context)  # type: ignore[arg-type]


def sample_attributes(module: nn.Module) -> Mapping[str, Any]:
    """The ``PyroSample`` attributes of ``module`` by name (empty for any other module).

    Pyro keeps them in the private ``_pyro_samples``; the public way is to compare every
    attribute's class, which would call each one (and issue its sample statement).
    """
    return module.__dict__.get("_pyro_samples", {})


def module_local_params() -> bool:
    """Whether ``pyro.settings`` has module-local parameters on (the param store bypassed).

    Pyro's private ``_is_module_local_param_enabled``; ``pyro.settings.get`` has the same
    answer under a name that is not documented either.
    """
    return _is_module_local_param_enabled()


def active_handlers() -> tuple[Any, ...]:
    """The Pyro handlers (messengers) in effect here, innermost last.

    Pyro's private ``_PYRO_STACK``; ``pyro.poutine.runtime.am_i_wrapped`` only says whether
    it is empty.
    """
    return tuple(_PYRO_STACK)


# ----------------------------------------------------------------------------- parameters
def unconstrained_parameter(module: PyroModule, leaf: str) -> torch.Tensor:
    """The tensor a real-valued ``PyroParam`` named ``leaf`` is stored as in ``module``.

    Pyro stores it under the private name ``<leaf>_unconstrained``; the public
    ``getattr(module, leaf)`` issues a ``pyro.param`` statement and builds the constrained
    value each time.
    """
    return module._parameters[f"{leaf}_unconstrained"]


def param_store_value(module: PyroModule, leaf: str) -> torch.Tensor | None:
    """``getattr(module, leaf)`` for a real-valued ``PyroParam``, fast, or ``None``.

    What ``PyroModule.__getattr__`` amounts to while the module and Pyro's param store hold
    the same tensor: one ``pyro.param`` statement under the full name. ``None`` when they do
    not (the store was cleared or loaded, module-local params are on): the caller then takes
    ``getattr``, which re-synchronises them. Walking ``guide.locs.fc1.weight`` by
    ``getattr`` costs one ``__getattr__`` per name component, more than a small network's
    guide arithmetic.
    """
    name = module.__dict__.get("_pyro_name")
    if name is None or module_local_params():
        return None
    fullname = join_name(name, leaf)
    if fullname not in pyro.get_param_store():
        return None
    value = pyro.param(fullname)
    return value if value is module._parameters.get(f"{leaf}_unconstrained") else None


def synced_parameter(module: PyroModule, leaf: str) -> torch.Tensor:
    """``getattr(module, leaf)``, the param store's tensor where it holds another one.

    ``PyroModule`` takes a tensor the store holds in place of its own (a store loaded or
    set since, ``pyro.get_param_store().load(path)``) only inside a run of the module: read
    outside one, as a guide's ``posterior()`` is, the module would give its stale tensor.
    Where the store holds the name, the read runs inside the module's run context, which
    re-synchronises them; where it does not (the store was cleared) it runs outside, so
    that a read does not put the module's tensor back in the store for a later guide of
    the same name to take.
    """
    name = module.__dict__.get("_pyro_name")
    held = name is not None and join_name(name, leaf) in pyro.get_param_store()
    if held and not module_local_params():
        with run_context(module):
            return getattr(module, leaf)
    return getattr(module, leaf)


def autonormal_latent(site: str) -> str:
    """The name of the unconstrained latent ``AutoNormal`` draws for a model site.

    ``AutoNormal`` samples ``"<site>_unconstrained"`` and puts a ``Delta`` at ``site``; the
    naming is an implementation detail of Pyro's autoguides, documented nowhere.
    """
    return f"{site}_unconstrained"


# ----------------------------------------------------------------------------- torch
def conv_kinds(module: nn.Module) -> tuple[bool, bool]:
    """``(is a convolution, is a transposed one)``, of any dimension.

    torch's common bases ``_ConvNd`` and ``_ConvTransposeNd`` are private; the public way
    lists six classes and misses a user's subclass of their bases.
    """
    return isinstance(module, _ConvNd), isinstance(module, _ConvTransposeNd)


def low_rank_parts(
    fn: torch.distributions.LowRankMultivariateNormal,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""``(V, D)`` of :math:`\mathcal{N}(\mu, VV^\top + \mathrm{diag}(D))`, not broadcast.

    torch keeps them as private ``_unbroadcasted_cov_factor``/``_unbroadcasted_cov_diag``;
    the public ``cov_factor`` and ``cov_diag`` are expanded to the batch shape, which costs
    a copy in every product and hides which parts are shared.
    """
    return fn._unbroadcasted_cov_factor, fn._unbroadcasted_cov_diag


def low_rank_capacitance_tril(fn: torch.distributions.LowRankMultivariateNormal) -> torch.Tensor:
    r"""The Cholesky factor of :math:`I + V^\top D^{-1} V` torch computed at construction.

    Private ``_capacitance_tril``; computing it again costs a ``rank × rank`` Cholesky.
    """
    return fn._capacitance_tril


# ----------------------------------------------------------------------------- tensors
def stretches_of(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``flat``'s consecutive stretches as views with the shapes of ``like``, in one call.

    torch's private ``torch._C._nn.unflatten_dense_tensors`` (what data-parallel training
    uses to unpack a bucket); the public way is a ``narrow`` and a ``view`` a tensor from
    Python, about 1 µs each, 190 of them a step on a ResNet's packed guide.
    """
    return torch._C._nn.unflatten_dense_tensors(flat, list(like))


def concatenated(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Every tensor's values end to end in a new 1-d tensor, in one call.

    torch's private ``torch._C._nn.flatten_dense_tensors`` (data-parallel training's packing
    of a bucket); the public way reshapes each tensor from Python before ``torch.cat``. It
    returns a view of the tensor itself when given one, so one tensor is copied here.
    """
    if len(tensors) == 1:
        return tensors[0].reshape(-1).clone()
    return torch._C._nn.flatten_dense_tensors(list(tensors))


def fused_adam_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: float | torch.Tensor,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
) -> None:
    """One Adam update of every tensor in place, by torch's fused kernel (``fused=True``).

    torch's private ``torch._fused_adam_``, the kernel ``torch.optim.Adam(fused=True)`` calls
    after adding one to each step count: called directly, it takes tensors that are not each
    a parameter (a stretch of packed parameters, as one). The public way is
    ``torch.optim.Adam``, which spends about 3 µs a tensor around the kernel (its Python loop
    over the tensors, the step counts' increment one tensor at a time).
    """
    torch._fused_adam_(
        params, grads, exp_avgs, exp_avg_sqs, [], steps,
        amsgrad=False, lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
        maximize=False, grad_scale=None, found_inf=None,
    )  # fmt: skip


def tensor_version(tensor: torch.Tensor) -> int:
    """How many times ``tensor``'s storage has been changed in place (``copy_``, ``add_``…).

    torch's private ``Tensor._version`` (the counter autograd checks its saved tensors
    against). A guide that caches a factorisation of its buffers keys it on this, so that any
    in-place change of them, ``load`` included, is seen; the public alternative is to compare
    the values at every use, which costs what the cache saves.
    """
    return tensor._version
