r"""The linearised (GLM) predictive of a Gaussian guide: the network linearised at its mean.

A Gaussian belief :math:`q(\theta) = \mathcal{N}(\mu, \Sigma)` built from Gauss-Newton
curvature (a Laplace approximation, an online filter's belief) describes the *linearised*
network best, :math:`f_{\rm lin}(x; \theta) = f(x; \mu) + J(x)(\theta - \mu)` with
:math:`J(x) = \partial f(x; \theta)/\partial\theta` at :math:`\mu`. Running the network itself
at draws of such a belief under-fits (Immer, Korzepa and Bauer 2021, "Improving predictions of
Bayesian neural nets via local linearization", AISTATS, https://arxiv.org/abs/2008.08400):
the draws leave the region where the curvature was measured. Under :math:`q` the linearised
outputs are Gaussian, :math:`\mathcal{N}(f(x;\mu), J\Sigma J^\top)`.

:func:`linearised_outputs` draws them: for draws :math:`\theta_s \sim q` (the same draws the
sampled predictive uses) it returns :math:`f(x; \mu) + J(x)(\theta_s - \mu)` by one
forward-mode product (a JVP) per draw, ``vmap``-ed over draws, so :math:`J` is never formed
and any guide that draws Gaussian weights serves. The likelihood then turns each draw of the
outputs into a distribution as the model does (for a classifier, probabilities are the mean
of the softmax over Gaussian logits: the Monte Carlo link of Immer et al.).
:func:`check_gaussian_draws` says whether a guide's draws are Gaussian. Nothing here knows of
the predictive's summaries (:mod:`pyro_bbb.infer.predictive`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from torch.func import jvp, vmap

from .._support import independent_base
from ..model import BNN
from ..priors.precision_normal import LowRankPrecisionNormal

__all__ = ["check_gaussian_draws", "linearised_outputs"]

_GAUSSIAN = (
    dist.Normal,
    dist.MultivariateNormal,
    dist.LowRankMultivariateNormal,
    LowRankPrecisionNormal,
)


def check_gaussian_draws(trace: poutine.Trace, model: BNN) -> None:
    """Refuse a guide whose draws of the network's weights are not Gaussian.

    A guide's sites are Gaussian (``Normal``, a multivariate or low-rank Gaussian, the precision
    form of the online filters), or ``Delta`` sites that hand out slices of a Gaussian auxiliary
    draw (Pyro's autoguides, :class:`~pyro_bbb.online.LowRankPrecisionGuide`).

    Args:
        trace: A trace of the guide.
        model: The model, for its observed site's name.

    Raises:
        ValueError: Naming the first site drawn otherwise (a point mass, a scale mixture).
    """
    auxiliary = False
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site.get("is_observed") or name == model.observation_site:
            continue
        base = independent_base(site["fn"])
        if site["infer"].get("is_auxiliary"):
            auxiliary = True
        elif isinstance(base, dist.Delta) and auxiliary:
            continue
        if not isinstance(base, _GAUSSIAN):
            raise ValueError(
                "predictive='linearised' linearises the network at the mean of a Gaussian "
                f"guide, but site {name!r} is drawn from a {type(base).__name__}; a point mass "
                "has nothing to linearise (its predictive is the plug-in one, "
                "predictive='sample'), and other guides are sampled"
            )


def linearised_outputs(
    model: BNN,
    mean: Mapping[str, torch.Tensor],
    draws: Mapping[str, torch.Tensor],
    x: torch.Tensor,
) -> torch.Tensor:
    r"""Draws of the linearised network's outputs, :math:`f(x;\mu) + J(x)(\theta_s - \mu)`.

    Args:
        model: The :class:`~pyro_bbb.BNN`.
        mean: :math:`\mu`, ``{site: value of the site's shape}``.
        draws: :math:`\theta_s`, ``{site: (S, *site shape)}``.
        x: Inputs ``(batch, *features)``.

    Returns:
        ``(S, batch, C)``.
    """
    primals = {name: mean[name] for name in draws}

    def network(weights: dict[str, torch.Tensor]) -> torch.Tensor:
        return model.network_at(weights, x)

    def one(tangent: dict[str, torch.Tensor]) -> torch.Tensor:
        output, change = jvp(network, (primals,), (tangent,))
        return output + change

    tangents = {name: draws[name] - primals[name] for name in draws}
    with warnings.catch_warnings():
        # torch's forward mode loads its decompositions by torch.jit.script on first use and
        # warns that jit.script is deprecated: its own call, nothing a user can change
        warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
        return vmap(one)(tangents)
