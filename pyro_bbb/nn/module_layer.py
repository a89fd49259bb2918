"""Any module made Bayesian by weight sampling: :class:`BayesianModule`.

This module holds the general mechanism that puts a prior on the parameters of any
``nn.Module`` (an LSTM, a LayerNorm, an Embedding, a layer of your own): a wrapper whose
parameters are Pyro sample sites and whose forward runs the original module through
:func:`torch.func.functional_call` with the drawn values. Weights with leading sample dims
(particles, predictive samples) run through :func:`torch.func.vmap` over that call; a module
without a batching rule for ``vmap`` (e.g. ``nn.LSTM``) runs its draws one after another,
and says so once. The affine layers with their fast estimators are in
:mod:`pyro_bbb.nn.layers`. Nothing here knows of guides or training.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from pyro.nn import PyroModule
from torch import nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_map

from .._shapes import broadcast_shape
from ..priors import PriorSpec
from .affine import sample_shape
from .layers import BayesianLayer, user_class
from .sample_dims import note_sample_dims

__all__ = ["BayesianModule"]


class BayesianModule(BayesianLayer):
    r"""Any module whose direct parameters are Pyro sample sites, by weight sampling.

    The wrapper takes over the parameters the module holds itself (``recurse=False``): those
    with a prior become :class:`~pyro.nn.PyroSample` sites named after the wrapper's place in
    the network and the parameter (``"rnn.weight_ih_l0"``), the others stay point estimates
    with the same names. The module keeps its buffers (running statistics) and its children,
    whose names are unchanged (the module shares the wrapper's Pyro name). Each forward draws
    the parameters and calls ``functional_call(module, drawn, args, kwargs)``.

    **Sample dims.** The first argument is the input ``(*sample, batch, ...)``: the layer
    records its number of dims on a call without sample dims (the guide's first trace, a
    prior draw) and counts the extra leading dims of a later input as sample dims (before any
    such call, leading dims equal to the weights' sample shape are taken as sample dims).
    Weights drawn with sample dims ``(P, 1, *shape)`` or ``(P, *shape)`` and such inputs are
    mapped over with :func:`torch.func.vmap`; a module that ``vmap`` cannot batch runs the
    ``P`` draws in a loop instead, with a one-time :class:`UserWarning` naming it. Outputs
    (tensors or tuples of them, as ``nn.LSTM`` returns) get the sample dims in front. A
    module with children (a module of your own with a parameter beside its layers) is not
    mapped over, since its Bayesian children draw their own weights: it is given its
    parameters with their sample dims in front, ``(P, *shape)``, and its forward must
    broadcast them (``self.gain[..., None, None] * self.fc(x)``), as in any Pyro model.

    Args:
        module: The module; its direct parameters are moved into the wrapper.
        priors: Prior per parameter name (e.g. ``{"weight_ih_l0": Gaussian(1.0)}``); a direct
            parameter without one stays a deterministic ``nn.Parameter``.
        centre_priors: See :class:`~pyro_bbb.nn.layers.BayesianLayer`.

    Raises:
        ValueError: If a prior names no direct floating-point parameter of ``module``.
    """

    #: The wrapped module's names do not appear in site names (see
    #: :func:`~pyro_bbb.nn.network_summary.summary`).
    unnamed_children = ("module",)

    def __init__(
        self, module: nn.Module, priors: Mapping[str, PriorSpec], *, centre_priors: bool = False
    ) -> None:
        super().__init__(priors, centre_priors=centre_priors)
        params = dict(module.named_parameters(recurse=False))
        unknown = sorted(set(self.priors) - set(params))
        if unknown:
            raise ValueError(
                f"{type(module).__name__} has no direct parameter(s) {unknown}; its direct "
                f"parameters are {sorted(params)}"
            )
        for name, value in params.items():
            del module._parameters[name]
            fan_in = int(value[0].numel()) if value.dim() > 1 else 1
            self._add_parameter(name, value, fan_in)
        self.parameter_names = tuple(params)
        self.module = module

    def __getattr__(self, name: str) -> Any:
        # PyroModule would rename the wrapped module "<path>.module" on access; it shares the
        # wrapper's name instead, so its children keep the names they had in the network.
        if name == "module" and "module" in self.__dict__.get("_modules", {}):
            return self._modules["module"]
        return super().__getattr__(name)

    def _pyro_set_supermodule(self, name: str, context: Any) -> None:
        # The wrapped module (a PyroModule when it has children) takes the wrapper's own name
        # and context, so its children's sites read "<path>.<child>.<param>".
        super()._pyro_set_supermodule(name, context)
        module = self._modules.get("module")
        if isinstance(module, PyroModule):
            module._pyro_set_supermodule(name, context)

    @property
    def wrapped_type(self) -> type[nn.Module]:
        """The class of the wrapped module, not Pyro's or this package's subclass of it."""
        return user_class(self._modules["module"])

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Draw the parameters and run the module with them.

        Args:
            *args: The module's arguments; the first is the input ``(*sample, batch, ...)``.
            **kwargs: The module's keyword arguments.

        Returns:
            The module's output, with the draws' sample dims in front of every tensor.
        """
        module = self._modules["module"]
        values = {name: getattr(self, name) for name in self.parameter_names}
        values = {name: value for name, value in values.items() if value is not None}
        shapes = {name: self.parameter_shape(name) for name in values}
        w_sample = broadcast_shape(
            *(sample_shape(value, len(shapes[name])) for name, value in values.items())
        )
        x = args[0] if args else None
        x_sample = self._input_sample_shape(x, w_sample)
        sample = broadcast_shape(w_sample, x_sample)
        if not sample:
            return functional_call(module, values, args, kwargs)
        note_sample_dims(len(sample))
        if next(module.children(), None) is not None:
            # Layers inside it draw their own weights, with their own sample dims: mapping
            # over draws would draw those once per draw. Its forward broadcasts instead.
            values = {
                name: value.reshape(*sample_shape(value, len(shapes[name])), *shapes[name])
                for name, value in values.items()
            }
            return functional_call(module, values, args, kwargs)
        return self._mapped(module, values, shapes, args, kwargs, sample, len(x_sample))

    def _input_sample_shape(self, x: object, w_sample: torch.Size) -> torch.Size:
        if not isinstance(x, torch.Tensor):
            return torch.Size()
        rank = self.__dict__.get("_input_rank")
        if rank is None and not w_sample:
            self.__dict__["_input_rank"] = rank = x.dim()
        if rank is not None:
            return x.shape[: max(x.dim() - rank, 0)]
        n = len(w_sample)
        return x.shape[:n] if x.dim() > n and x.shape[:n] == w_sample else torch.Size()

    def _mapped(self, module, values, shapes, args, kwargs, sample, x_dims):
        """Run the module once per draw: ``vmap`` over the flattened sample dims, or a loop."""
        n = math.prod(sample)
        flat = {}
        for name, value in values.items():
            own = sample_shape(value, len(shapes[name]))
            if own:
                value = value.reshape(*own, *shapes[name]).expand(*sample, *shapes[name])
                flat[name] = value.reshape(n, *shapes[name])
        fixed = {name: value for name, value in values.items() if name not in flat}
        x, rest = args[0], args[1:]
        if x_dims:
            x = x.expand(*sample, *x.shape[x_dims:]).reshape(n, *x.shape[x_dims:])

        def call(drawn, x):
            return functional_call(module, {**fixed, **drawn}, (x, *rest), kwargs)

        out = None
        if self.__dict__.get("_vmap_error") is None:
            try:
                out = vmap(call, in_dims=(0, 0 if x_dims else None))(flat, x)
            except RuntimeError as error:
                error_text = str(error).splitlines()[0]
                self.__dict__["_vmap_error"] = error_text
                warnings.warn(
                    f"layer {self._pyro_name or '(root)'!r} ({self.wrapped_type.__name__}) "
                    f"cannot be vectorised over weight samples by torch.func.vmap "
                    f"({error_text}); its {n} draws run one after another",
                    UserWarning,
                    stacklevel=2,
                )
        if out is None:
            outs = [
                call({k: v[i] for k, v in flat.items()}, x[i] if x_dims else x) for i in range(n)
            ]
            out = tree_map(lambda *leaves: torch.stack(leaves), *outs)
        return tree_map(lambda t: t.reshape(*sample, *t.shape[1:]), out)

    def extra_repr(self) -> str:  # noqa: D102
        priors = ", ".join(f"{k}={v!r}" for k, v in self.priors.items())
        return f"{self.wrapped_type.__name__}, {priors}"
