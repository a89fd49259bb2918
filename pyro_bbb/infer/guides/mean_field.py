r"""The mean-field Gaussian guide of Bayes by Backprop.

:class:`MeanFieldGuide` approximates every latent weight by an independent Gaussian with
:math:`\sigma = \text{softplus}(\rho)`. It samples the model's own site names with
``Normal(loc, scale).to_event(k)``, not through an auxiliary latent and a ``Delta`` as
Pyro's autoguides do, so the KL divergence to a Gaussian prior is available in closed form.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, ClassVar

import pyro.distributions as dist
import torch
from pyro.nn import PyroModule

from ._base import GaussianGuide, SiteWiseGuide
from ._init import InitLoc, InitScale, as_init_scale, scale_from_rho
from ._packed import PackedParameters
from ._params import ParamRef as _ParamRef
from ._params import set_param

__all__ = ["MeanFieldGuide"]


class MeanFieldGuide(GaussianGuide, SiteWiseGuide):
    r"""Fully factorised Gaussian guide over every weight.

    :math:`q(w) = \prod_i \mathcal{N}(w_i \mid \mu_i, \sigma_i^2)`, with

    .. math::

        \sigma_i = \text{softplus}(\rho_i) + \sigma_{\min}

    (Blundell et al. 2015, https://arxiv.org/abs/1505.05424). Parameters are created on the
    first call, on the model's device: ``locs.<site>`` and ``rhos.<site>``. On the CPU,
    ``fit`` keeps each kind in one buffer, every parameter a view of its stretch (the same
    tensors and names), so that its step takes every site in a few calls; ``torch.save`` of
    one such parameter alone writes its whole buffer.

    Args:
        model: The Pyro model, e.g. a :class:`~pyro_bbb.BNN`.
        init_scale: :math:`\sigma` at initialisation (weight units); ρ is set from it.
            Blundell et al. (2015) and the tutorials that follow them use 0.01–0.1. Or
            :class:`~pyro_bbb.infer.guides.moped.MOPED`, a scale per weight proportional to
            its initial mean's magnitude, for a guide that starts at a trained network.
        init_loc: Initial means: ``None`` for the network's own initialisation (pretrained
            weights if it was built from a trained module), a fitted guide of the same model
            (its means: an online filter's ``.guide``, to go on from a stream with ``fit``),
            a pretrained ``nn.Module`` with the same parameter names, or ``{site: tensor}``.
        min_scale: :math:`\sigma_{\min}`, a floor that keeps log-densities finite.
        name: Prefix of the parameters in Pyro's global param store (default: the class
            name). As with every Pyro autoguide, two guides with the same name share their
            parameters: give a second guide its own name, or call
            ``pyro.clear_param_store()`` between fits.
        create_plates: Passed to :class:`~pyro.infer.autoguide.AutoGuide`.

    Raises:
        ValueError: If ``init_scale`` is not above ``min_scale``.
    """

    parameter_kinds: ClassVar[dict[str, str]] = {"locs": "loc", "rhos": "scale"}

    def __init__(
        self,
        model: Callable[..., Any],
        *,
        init_scale: float | InitScale = 0.05,
        init_loc: InitLoc = None,
        min_scale: float = 1e-6,
        name: str | None = None,
        create_plates: Callable[..., Any] | None = None,
    ) -> None:
        self.init_scale = as_init_scale(init_scale)
        self.init_scale.check(min_scale)
        self.min_scale = float(min_scale)
        super().__init__(model, init_loc=init_loc, name=name, create_plates=create_plates)

    def _build(self, sites: dict[str, dict], locs: dict[str, torch.Tensor]) -> None:
        self._event_dims = {name: site["fn"].event_dim for name, site in sites.items()}
        self.locs = PyroModule()
        self.rhos = PyroModule()
        for name, loc in locs.items():
            set_param(self.locs, name, loc, site=name)
            set_param(self.rhos, name, self.init_scale.rho(loc, self.min_scale), site=name)
        self._params = {
            name: (_ParamRef(self.locs, name), _ParamRef(self.rhos, name)) for name in locs
        }

    def _packed(self) -> tuple[PackedParameters, PackedParameters] | None:
        r"""Every site's :math:`\mu` and :math:`\rho`, each kind in one buffer, ``(d,)``.

        The parameters ``locs.<site>`` and ``rhos.<site>`` (the param store's tensors, by
        their names) are views of two flat buffers, the sites end to end in the guide's
        order (:class:`~pyro_bbb.infer.guides._packed.PackedParameters`), so that the fused
        step takes the softplus, the draw and the KL of every site in a few calls. Packed on
        the first call, and again, values kept, after something gave a parameter other data
        (``guide.to(device)``, Pyro's param store loaded); checked on every call.

        Returns:
            ``(locs, rhos)``, or ``None`` where the parameters cannot share a buffer (they
            mix dtypes or devices).
        """
        locs = [loc.module_value() for loc, _ in self._params.values()]
        rhos = [rho.module_value() for _, rho in self._params.values()]
        packed = self.__dict__.get("_packing")
        if isinstance(packed, tuple) and packed[0].holds(locs) and packed[1].holds(rhos):
            return packed
        tensors = [*locs, *rhos]
        failed = isinstance(packed, list) and len(packed) == len(tensors)
        if failed and all(map(operator.is_, packed, tensors)):
            return None  # these very tensors could not be packed
        try:
            packed = (PackedParameters(locs), PackedParameters(rhos))
        except ValueError:
            packed = tensors
        self.__dict__["_packing"] = packed
        return packed if isinstance(packed, tuple) else None

    def _loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        loc_ref, rho_ref = self._params[name]
        return loc_ref(), scale_from_rho(rho_ref(), self.min_scale)

    def site_distribution(self, name: str) -> dist.TorchDistribution:
        r"""The guide's distribution of one site: :math:`\mathcal{N}(\mu, \sigma^2)`, one event."""
        loc, scale = self._loc_scale(name)
        return dist.Normal(loc, scale).to_event(self._event_dims[name])

    @torch.no_grad()
    def posterior(self) -> dict[str, dist.TorchDistribution]:
        """The approximate posterior of every site, detached from the parameters.

        Returns:
            ``{site name: Normal(loc, scale).to_event(k)}``.
        """
        self._require_setup()
        posterior = {}
        for name, event_dim in self._event_dims.items():
            loc, scale = self._loc_scale(name)
            posterior[name] = dist.Normal(loc.detach().clone(), scale).to_event(event_dim)
        return posterior

    def _marginals(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {name: self._loc_scale(name) for name in self._event_dims}
