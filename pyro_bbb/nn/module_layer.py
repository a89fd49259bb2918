"""Any module made Bayesian by weight sampling: :class:`BayesianModule`.

This module holds the general mechanism that puts a prior on the parameters of any
``nn.Module`` (an LSTM, a LayerNorm, an Embedding, a layer of your own): a wrapper whose
parameters are Pyro sample sites and whose forward runs the original module with the drawn
values handed to it for the call (as :func:`torch.func.functional_call` does). The module
always sees one draw:
several draws at once reach a network around its ``forward`` (:mod:`pyro_bbb.nn.draws`).
The affine layers with their fast estimators are in :mod:`pyro_bbb.nn.layers`. Nothing here
knows of guides or training.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .._pyro_compat import PyroNameSharing, pyro_name, user_class
from .._shapes import sample_dims
from ..priors import PriorSpec
from .draws import current_draw
from .layers import BayesianLayer

__all__ = ["BayesianModule"]


class BayesianModule(PyroNameSharing, BayesianLayer):
    r"""Any module whose direct parameters are Pyro sample sites, by weight sampling.

    The wrapper takes over the parameters the module holds itself (``recurse=False``): those
    with a prior become :class:`~pyro.nn.PyroSample` sites named after the wrapper's place in
    the network and the parameter (``"rnn.weight_ih_l0"``), the others stay point estimates
    with the same names. The module keeps its buffers (running statistics) and its children,
    whose names are unchanged (the module shares the wrapper's Pyro name). Each forward draws
    the parameters, sets them on the module for the call and takes them out after it (what
    ``torch.func.functional_call(module, drawn, args, kwargs)`` does, without its walk over
    the module's tensors: 10-25 µs a call).

    The module sees one draw of its parameters at a time, with the shapes it was written
    for: when the weights carry sample dims (several particles, ``predict``, an ensemble),
    the network runs once per draw (:class:`~pyro_bbb.nn.draws.PerDrawForward`), and this
    layer reads the current draw's values (rules 1 and 2 of :mod:`pyro_bbb.nn.draws`).
    Called on its own with drawn sample dims, outside such a pass, it raises.

    Args:
        module: The module; its direct parameters are moved into the wrapper.
        priors: Prior per parameter name (e.g. ``{"weight_ih_l0": Gaussian(1.0)}``); a direct
            parameter without one stays a deterministic ``nn.Parameter``.
        centre_priors: See :class:`~pyro_bbb.nn.layers.BayesianLayer`.

    Raises:
        ValueError: If a prior names no direct floating-point parameter of ``module``.
    """

    #: The wrapped module's names do not appear in site names (see
    #: :func:`~pyro_bbb.nn.network_summary.summary`): it shares the wrapper's name and run
    #: context (a ``PyroModule`` when it has children), so its children's sites read
    #: ``"<path>.<child>.<param>"``.
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
            # Taken out, not left empty: forward then hands each value over by setattr,
            # which modules that cache their weights (nn.LSTM) follow.
            delattr(module, name)
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

    @property
    def wrapped_type(self) -> type[nn.Module]:
        """The class of the wrapped module, not Pyro's or this package's subclass of it."""
        return user_class(self._modules["module"])

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Draw the parameters and run the module with them.

        Args:
            *args: The module's arguments.
            **kwargs: The module's keyword arguments.

        Returns:
            The module's output.

        Raises:
            ValueError: If the drawn parameters carry sample dims outside a per-draw pass
                of the network (the layer called on its own under a Pyro plate).
        """
        values = {}
        draw = current_draw()  # inside a per-draw pass, the values read are the draw's own
        names = self._site_names()
        for name in self.parameter_names:
            value = self._value(name, names)
            if value is None:
                continue
            dims = len(self.parameter_shape(name))
            if draw is None and value.dim() > dims and sample_dims(value, dims):
                raise ValueError(
                    f"{type(self).__name__} {pyro_name(self) or '(root)'!r}: parameter "
                    f"{name!r} was drawn with sample dims, shape {tuple(value.shape)}; a module "
                    "runs on one draw at a time. Run the network through pyro_bbb.BNN, whose "
                    "forward passes several draws to it one at a time"
                )
            values[name] = value
        # What torch.func.functional_call does for parameters the module does not hold (they
        # were taken out): each handed over by setattr for the call, then taken out again;
        # without functional_call's walk over the module's tensors on every call
        module = self._modules["module"]
        for name, value in values.items():
            setattr(module, name, value)
        try:
            return module(*args, **kwargs)
        finally:
            for name in values:
                delattr(module, name)

    def extra_repr(self) -> str:  # noqa: D102
        priors = ", ".join(f"{k}={v!r}" for k, v in self.priors.items())
        return f"{self.wrapped_type.__name__}, {priors}"

    def __repr__(self) -> str:
        # The wrapped module's own repr may read the parameters it handed over (LayerNorm's
        # and BatchNorm's read `self.bias`): lend it their values as made, for the repr only.
        module = self._modules["module"]
        lent = [name for name in self.parameter_names if name not in module.__dict__]
        for name in lent:
            value = self._buffers.get(f"{name}_init")
            object.__setattr__(module, name, value if value is not None else getattr(self, name))
        try:
            return super().__repr__()
        finally:
            for name in lent:
                module.__dict__.pop(name, None)
