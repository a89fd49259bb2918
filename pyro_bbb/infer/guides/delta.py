r"""The point-mass guide: one value per weight, the deterministic network as a guide.

:class:`DeltaGuide` puts a ``Delta`` at every latent site, at a learned value. Trained on the
ELBO it maximises :math:`\log p(y \mid w) + \beta \log p(w)`: with β = 1 that is the MAP
network, the prior acting as weight decay. It is the member of a deep ensemble
(:class:`~pyro_bbb.infer.Ensemble` of ``DeltaGuide``; Lakshminarayanan et al. 2017), the
deterministic baseline beside Bayes by Backprop on the very same model. It samples the model's
own site names, as :class:`~pyro_bbb.MeanFieldGuide` does, so the same predictive, ArviZ
export and estimators read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyro.distributions as dist
import torch
from pyro.nn import PyroModule

from ._base import SiteWiseGuide, quantile_levels
from ._params import ParamRef as _ParamRef
from ._params import set_param

__all__ = ["DeltaGuide"]


class DeltaGuide(SiteWiseGuide):
    r"""A point mass at a learned value of every weight, :math:`q(w) = \delta(w - \mu)`.

    The degenerate Gaussian guide (:math:`\sigma = 0`): its KL to a prior has no finite
    value, and the annealed ELBO scores it as :math:`\log \delta_\mu(\mu) - \log p(\mu) =
    -\log p(\mu)`, so training gives the MAP weights (maximum likelihood at β = 0). Its
    marginals have scale 0; it has no density, so PSIS :math:`\hat k` does not apply to it.
    Parameters are created on the first call: ``locs.<site>``.

    Args:
        model: The Pyro model, e.g. a :class:`~pyro_bbb.BNN`.
        init_loc: Initial values, as in :class:`~pyro_bbb.MeanFieldGuide`.
        name: Prefix of the parameters in Pyro's param store (default: the class name).
        create_plates: Passed to :class:`~pyro.infer.autoguide.AutoGuide`.
    """

    def _build(self, sites: dict[str, dict], locs: dict[str, torch.Tensor]) -> None:
        self._event_dims = {name: site["fn"].event_dim for name, site in sites.items()}
        self.locs = PyroModule()
        for name, loc in locs.items():
            set_param(self.locs, name, loc, site=name)
        self._params = {name: _ParamRef(self.locs, name) for name in locs}

    def site_distribution(self, name: str) -> dist.TorchDistribution:
        """The guide's distribution of one site: a ``Delta`` at its value, one event."""
        return dist.Delta(self._params[name](), event_dim=self._event_dims[name])

    @torch.no_grad()
    def quantiles(
        self, quantiles: Sequence[float] | torch.Tensor, *args: Any, **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        """Every quantile of a point mass is its value.

        Args:
            quantiles: Levels in ``(0, 1)``.
            *args: The model's arguments, only if the guide has not been called yet.
            **kwargs: Likewise.

        Returns:
            ``{site: tensor (len(quantiles), *site shape)}``, the value repeated.
        """
        self._require_setup(*args, **kwargs)
        result = {}
        for site, ref in self._params.items():
            loc = ref().detach()
            q = quantile_levels(quantiles, loc)
            result[site] = loc.expand(q.numel(), *loc.shape).clone()
        return result

    def _marginals(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {name: (loc := ref(), torch.zeros_like(loc)) for name, ref in self._params.items()}
