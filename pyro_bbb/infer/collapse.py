r"""Posterior collapse: most weights at their prior while the likelihood explains the data alone.

A mean-field Gaussian posterior over a network fitted to little data can settle where most
weights sit at their prior (their KL divergence to it near zero) and a large learned noise, or
a near-uniform class distribution, accounts for the targets: the predictive mean is then a
flat line, however good the fit a plain network finds. Sometimes that is the optimum of the
ELBO (Coker et al. 2022, https://arxiv.org/abs/2106.07052; Trippe and Turner 2018,
https://arxiv.org/abs/1811.07006), sometimes a poor local one. This module measures it:

* :func:`weight_kl`: :math:`\mathrm{KL}(q(w_i) \| p(w_i))` of every weight's marginal;
* :class:`CollapseMonitor`: the fraction of weights below :data:`KL_THRESHOLD`, cheaply, once
  per epoch, for :attr:`History.collapsed <pyro_bbb.History>`;
* :func:`diagnose_collapse`: that fraction beside what the predictive mean leaves unexplained
  on the training points, against what a nearest-neighbour average leaves
  (:func:`neighbour_residual`, a model-free estimate of the noise) and what a constant
  leaves, as a :class:`CollapseDiagnosis` whose :attr:`~CollapseDiagnosis.collapsed` decides
  whether :func:`~pyro_bbb.fit` warns with :class:`PosteriorCollapseWarning`.

Most weights at the prior is not collapse by itself: a fitted mean-field network prunes
whole units (over half its weights on the README's demo and on UCI boston, Trippe and Turner
2018), and on noisy data (UCI wine) the noise rightly explains most of the targets. What
marks collapse is that the predictive mean misses structure that is plainly in the data: a
residual several times what five neighbours leave.

It reads a guide's marginals and a model's priors and runs the predictive; it never trains.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import pyro.distributions as dist
import torch
from pyro.infer.autoguide import AutoNormal
from torch.distributions import Normal, kl_divergence

from .._random_state import kept_random_state
from .._support import independent_base
from ..nn.draws import kept_buffers
from ..nn.layers import BayesianLayer
from ..nn.training_mode import in_evaluation_mode
from ..priors.gaussian_block import SiteConditional
from ..priors.precision_block import PrecisionSiteConditional
from .guides._base import SiteGuide
from .predictive import RegressionPrediction, predict
from .sites import is_real_valued, prior_latent_sites

__all__ = [
    "FRACTION_THRESHOLD",
    "KL_THRESHOLD",
    "NEIGHBOURS",
    "RESIDUAL_RATIO",
    "CollapseDiagnosis",
    "CollapseMonitor",
    "PosteriorCollapseWarning",
    "diagnose_collapse",
    "neighbour_residual",
    "target_spread",
    "warn_if_collapsed",
    "weight_kl",
]

#: A weight whose marginal KL to its prior is below this many nats counts as at its prior.
KL_THRESHOLD = 0.05
#: The posterior counts as collapsed when at least this fraction of weights is at its prior ...
FRACTION_THRESHOLD = 0.5
#: ... and the predictive mean leaves this many times the residual of a nearest-neighbour
#: average (and at least half of what a constant leaves).
RESIDUAL_RATIO = 2.0
#: Neighbours of the model-free reference, :func:`neighbour_residual`.
NEIGHBOURS = 5
#: Monte Carlo draws per weight for a KL with no closed form (a scale-mixture prior).
_MC_DRAWS = 16


class PosteriorCollapseWarning(UserWarning):
    """Most weights ended at their prior and the likelihood explains the targets alone."""


def _marginals(guide) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
    """``{site: (loc, scale)}`` of each weight's Gaussian marginal, or ``None`` if unknown."""
    if isinstance(guide, SiteGuide):
        if guide.prototype_trace is None:
            return None
        return guide._marginals()  # not cloned: read once per epoch by the monitor
    if isinstance(guide, AutoNormal) and guide.prototype_trace is not None:
        return {name: guide._get_loc_and_scale(name) for name in guide._event_dims}
    if getattr(guide, "is_set_up", False) and callable(getattr(guide, "marginals", None)):
        return guide.marginals()  # an online filter's belief (its marginals in closed form)
    return None


def _gaussian_marginals(prior, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each value's marginal ``(loc, scale)`` under a Gaussian prior, or ``None``.

    A site of a carried joint block (:func:`~pyro_bbb.priors.from_guide` of a low-rank or
    precision-form guide) is conditioned on the block's earlier sites; its values' marginals
    come from the block.
    """
    base = independent_base(prior)
    if type(base) in (Normal, dist.Normal):
        return base.loc.expand(shape), base.scale.expand(shape)
    if isinstance(base, SiteConditional):
        loc, scale = base.block.site_marginal(base.site)
        return loc.to(base.base.loc), scale.to(base.base.loc)
    if isinstance(base, PrecisionSiteConditional):
        loc, scale = base.block.site_marginal(base.site)
        return loc.to(base.flat.loc), scale.to(base.flat.loc)
    return None


def _gaussian_kl(loc, scale, p_loc, p_scale) -> torch.Tensor:
    """KL of ``N(loc, scale²)`` to ``N(p_loc, p_scale²)``, per element (torch's rule)."""
    return kl_divergence(
        Normal(loc, scale, validate_args=False), Normal(p_loc, p_scale, validate_args=False)
    )


def _elementwise_kl(loc, scale, prior) -> torch.Tensor:
    """KL of ``N(loc, scale²)`` to the prior's marginals, per element; else Monte Carlo."""
    marginal = _gaussian_marginals(prior, loc.shape)
    if marginal is not None:
        return _gaussian_kl(loc, scale, *marginal)
    q = dist.Normal(loc, scale)
    draws = q.sample((_MC_DRAWS,))
    return (q.log_prob(draws) - independent_base(prior).expand(loc.shape).log_prob(draws)).mean(0)


@torch.no_grad()
def weight_kl(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    x: torch.Tensor,
    y: torch.Tensor | None = None,
) -> dict[str, torch.Tensor] | None:
    r""":math:`\mathrm{KL}(q(w_i) \| p(w_i))` of every weight's marginal, in nats.

    Closed form against a Gaussian prior, a 16-draw Monte Carlo estimate per weight against
    any other (a scale mixture). Sites that are not real-valued or lie inside a plate are left
    out.

    Args:
        model: The model; it is traced once on one row for its priors (every random state is
            restored afterwards).
        guide: A set-up :class:`~pyro_bbb.MeanFieldGuide`, :class:`~pyro_bbb.LowRankGuide`
            or :class:`~pyro_bbb.LowRankPrecisionGuide` (its marginals), or ``AutoNormal``.
        x: Inputs the model accepts, ``(batch, *features)``, e.g. a minibatch.
        y: Targets, for a model that needs them.

    Returns:
        ``{site: tensor of the site's shape}``, or ``None`` for a guide whose marginals are
        not known (a point estimate, a normalising flow).
    """
    marginals = _marginals(guide)
    if marginals is None:
        return None
    sites = prior_latent_sites(model, x) if y is None else prior_latent_sites(model, x, y)
    kls = {}
    for name, (loc, scale) in marginals.items():
        site = sites.get(name)
        if site is None or not is_real_valued(site["fn"]):
            continue
        kls[name] = _elementwise_kl(loc.detach(), scale.detach(), site["fn"])
    return kls


def _fraction(kls: Iterable[torch.Tensor]) -> float:
    kls = list(kls)
    total = sum(k.numel() for k in kls)
    if not total:
        return math.nan
    below = sum(int((k < KL_THRESHOLD).sum()) for k in kls)
    return below / total


class CollapseMonitor:
    """The fraction of weights at their prior, cheaply, as often as :func:`~pyro_bbb.fit` asks.

    The model is traced once for its priors, on a minibatch. When every prior is a Gaussian
    with fixed parameters they are flattened into one vector, so a call costs one pass over
    the guide's marginals (a few percent of a step of a small network); otherwise the KL is
    computed per site, from priors read again at each call where one may have learnable
    parameters (a prior a network's layers do not build once).

    Args:
        model: The model.
        guide: The guide (set up).
        *data: The model's arguments (a minibatch ``x, y``).
    """

    def __init__(
        self, model: Callable[..., Any], guide: Callable[..., Any], *data: torch.Tensor
    ) -> None:
        self._model, self._guide, self._data = model, guide, list(data)
        self._fixed_priors = _priors_are_fixed(model)
        marginals = _marginals(guide)
        self._sites = prior_latent_sites(model, *self._data) if marginals is not None else {}
        self._names = [
            name
            for name in (marginals or {})
            if name in self._sites and is_real_valued(self._sites[name]["fn"])
        ]
        self._flat_prior = self._flatten_priors(marginals)

    def _flatten_priors(self, marginals) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One ``(loc, scale)`` vector over every weight, if all priors are fixed Gaussians."""
        if not self._names:
            return None
        locs, scales = [], []
        for name in self._names:
            prior = _gaussian_marginals(self._sites[name]["fn"], marginals[name][0].shape)
            if prior is None or prior[0].requires_grad or prior[1].requires_grad:
                return None
            locs.append(prior[0].reshape(-1))
            scales.append(prior[1].reshape(-1))
        return torch.cat(locs), torch.cat(scales)

    @torch.no_grad()
    def fraction(self) -> float:
        """Fraction of weights whose marginal KL to the prior is below :data:`KL_THRESHOLD`.

        ``nan`` for a guide whose marginals are not known.
        """
        marginals = _marginals(self._guide)
        if marginals is None or not self._names:
            return math.nan
        if self._flat_prior is None:
            sites = (
                self._sites if self._fixed_priors else prior_latent_sites(self._model, *self._data)
            )
            return _fraction(
                _elementwise_kl(*marginals[name], sites[name]["fn"]) for name in self._names
            )
        loc = torch.cat([marginals[name][0].reshape(-1) for name in self._names])
        scale = torch.cat([marginals[name][1].reshape(-1) for name in self._names])
        return _fraction_below(loc, scale, *self._flat_prior)


def _fraction_below(
    loc: torch.Tensor, scale: torch.Tensor, p_loc: torch.Tensor, p_scale: torch.Tensor
) -> float:
    r"""The fraction of :math:`\mathrm{KL}(N(\mu, \sigma^2) \| N(m, s^2))` below the threshold.

    ``loc`` and ``scale`` are fresh vectors, overwritten here: with :math:`r = \sigma/s` and
    :math:`z = (\mu - m)/s`, :math:`\mathrm{KL} = \tfrac12(r^2 + z^2 - 1) - \log r`, torch's
    rule for two Normals, in place (read once an epoch: a fresh buffer per term, as the rule
    makes them, cost a ResNet's epoch several milliseconds, and the Normals' construction
    a small network's full-batch step several percent).
    """
    ratio = scale.div_(p_scale)
    kl = loc.sub_(p_loc).div_(p_scale).square_().addcmul_(ratio, ratio).sub_(1.0).mul_(0.5)
    kl.sub_(ratio.log_())
    return int((kl < KL_THRESHOLD).sum()) / kl.numel()


def _priors_are_fixed(model: object) -> bool:
    """Whether every prior of the model's Bayesian layers is built once (nothing learnable)."""
    if not isinstance(model, torch.nn.Module):
        return False
    layers = [m for m in model.modules() if isinstance(m, BayesianLayer)]
    return bool(layers) and all(
        getattr(prior, "cacheable", False) for layer in layers for prior in layer.priors.values()
    )


def neighbour_residual(x: torch.Tensor, y: torch.Tensor, *, k: int = NEIGHBOURS) -> float:
    """What a ``k``-nearest-neighbour average leaves unexplained, leave one out.

    Features are standardised column by column; each point is predicted by the mean (or, for
    integer labels, the most frequent label) of its ``k`` nearest other points. An estimate,
    free of any model, of how much of the targets the inputs can explain at all.

    Args:
        x: Inputs ``(n, *features)``, flattened per row.
        y: Targets ``(n[, dim])``, floating (regression) or integer labels.
        k: Neighbours.

    Returns:
        The RMS residual (floating targets) or the error rate (labels).
    """
    n = x.shape[0]
    k = min(k, n - 1)
    features = x.reshape(n, -1).double()
    features = (features - features.mean(0)) / features.std(0).clamp_min(1e-12)
    distance = torch.cdist(features, features)
    distance.fill_diagonal_(math.inf)
    neighbours = distance.topk(k, largest=False).indices  # (n, k)
    if torch.is_floating_point(y):
        y = y.double()
        return (y - y[neighbours].mean(1)).pow(2).mean().sqrt().item()
    return (y[neighbours].mode(1).values != y).double().mean().item()


@dataclass(frozen=True)
class CollapseDiagnosis:
    r"""How much of the posterior sits at the prior, and what the network leaves unexplained.

    Attributes:
        collapsed_fraction: Fraction of weights whose marginal KL to the prior is below
            :data:`KL_THRESHOLD` nats.
        residual: RMS residual of the predictive mean on the training points (regression),
            or the fraction of them it misclassifies (classification).
        reference: The same for a 5-nearest-neighbour average, leave one out
            (:func:`neighbour_residual`): what the inputs can explain without any model.
        baseline: The same for a constant prediction: the targets' standard deviation, or the
            error rate of always predicting the most frequent label.
        noise: The noise std, averaged over the points (regression), else ``None``.
        noise_learned: Whether that noise was learned (a fixed one is the user's choice).
    """

    collapsed_fraction: float
    residual: float
    reference: float
    baseline: float
    noise: float | None
    noise_learned: bool = False

    @property
    def collapsed(self) -> bool:
        """Whether the posterior counts as collapsed.

        At least :data:`FRACTION_THRESHOLD` of the weights at their prior and the predictive
        leaving :data:`RESIDUAL_RATIO` times what the neighbour average leaves and at least
        half of what a constant leaves; or a learned noise above the targets' own standard
        deviation, whatever the weights: no fit of the data needs a noise wider than the
        data, and such a noise takes in the spread of the functions the posterior draws (ten
        points of :math:`x^2` on a 1-32-1 network: noise 1.14 where the targets' std is
        0.36, the predictive mean no better than a constant, 21 % of the weights at their
        prior; on ten points a neighbour average is no reference).
        """
        misses = self.residual >= RESIDUAL_RATIO * self.reference
        misses = misses and self.residual >= 0.5 * self.baseline
        return self._noise_too_wide or (self.collapsed_fraction >= FRACTION_THRESHOLD and misses)

    @property
    def _noise_too_wide(self) -> bool:
        return self.noise_learned and self.noise is not None and self.noise > self.baseline

    def message(self) -> str:
        """The warning's text: what was measured and what to try."""
        if self._noise_too_wide:
            fit = (
                f"the learned noise std {self.noise:.3g} is above the targets' own standard "
                f"deviation {self.baseline:.3g}: it takes in the spread of the functions the "
                "posterior draws, and the predictive mean leaves an RMS residual of "
                f"{self.residual:.3g} on the training points"
            )
        elif self.noise is not None:
            fit = (
                f"the learned noise std {self.noise:.3g} explains the targets: the predictive "
                f"mean leaves an RMS residual of {self.residual:.3g} on the training points "
                f"(a constant leaves {self.baseline:.3g}), where a 5-nearest-neighbour average "
                f"leaves {self.reference:.3g}"
            )
        else:
            fit = (
                f"the predictive misclassifies {self.residual:.1%} of the training points "
                f"(the most frequent label alone {self.baseline:.1%}), where a "
                f"5-nearest-neighbour vote misclassifies {self.reference:.1%}"
            )
        return (
            f"posterior collapse: {self.collapsed_fraction:.0%} of the weights ended at their "
            f"prior (KL < {KL_THRESHOLD:g} nats each) and {fit}. On this little data the "
            "mean-field ELBO may prefer the prior to a fit. What helps, measured in "
            "docs/small_data.md: a smaller network; a tempered posterior "
            "(beta=LinearWarmup(..., end=0.1)), which fits but is not the Bayesian one; more "
            "data; compare with pyro_bbb.run_nuts on the same model."
        )


@torch.no_grad()
def diagnose_collapse(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    num_samples: int = 32,
    seed: int | None = 0,
) -> CollapseDiagnosis | None:
    """Measure posterior collapse on (a subset of) the training data.

    Args:
        model: A trained :class:`~pyro_bbb.BNN`.
        guide: Its guide.
        x: Training inputs ``(n, *features)``; a few thousand rows are plenty.
        y: Their targets.
        num_samples: Weight samples for the predictive.
        seed: Seed of the predictive's draws (every random state, and the network's
            buffers, such as a BatchNorm's running statistics, are restored afterwards).

    Returns:
        A :class:`CollapseDiagnosis`, or ``None`` when the guide's marginals are unknown, the
        likelihood is neither Gaussian, Categorical nor Bernoulli, or there are fewer than
        two points.
    """
    kls = weight_kl(model, guide, x, y)
    if not kls or x.shape[0] < 2:
        return None
    fraction = _fraction(kls.values())
    buffers = kept_buffers(model) if isinstance(model, torch.nn.Module) else nullcontext()
    # in evaluation mode (running statistics), leaving the network, its modes and buffers
    with kept_random_state(x), buffers, in_evaluation_mode(model):
        try:
            pred = predict(model, guide, x, num_samples=num_samples, seed=seed)
        except NotImplementedError:
            return None
    if isinstance(pred, RegressionPrediction):
        y = y.to(pred.mean.dtype)
        residual = (y - pred.mean).pow(2).mean().sqrt().item()
        baseline = target_spread(y)
        reference = neighbour_residual(x, y)
        likelihood = getattr(model, "likelihood", None)
        learned = getattr(likelihood, "learned", False) or getattr(
            likelihood, "heteroscedastic", False
        )
        return CollapseDiagnosis(
            fraction, residual, reference, baseline, _noise(pred), noise_learned=learned
        )
    if pred.binary and y.dim() > 1:
        return None  # multi-label: no single error rate
    labels = y.long()
    residual = (pred.predicted != labels).double().mean().item()
    baseline = 1 - torch.bincount(labels).max().item() / len(labels)
    reference = neighbour_residual(x, labels)
    return CollapseDiagnosis(fraction, residual, reference, baseline, None)


def target_spread(y: torch.Tensor) -> float:
    """The targets' standard deviation (every column's together): what a constant leaves."""
    return (y - y.mean(0)).pow(2).mean().sqrt().item()


def _noise(pred: RegressionPrediction) -> float:
    return pred.aleatoric_std.mean().item()


def warn_if_collapsed(diagnosis: CollapseDiagnosis | None, *, stacklevel: int = 3) -> None:
    """Warn with :class:`PosteriorCollapseWarning` if ``diagnosis`` says collapsed."""
    if diagnosis is not None and diagnosis.collapsed:
        warnings.warn(diagnosis.message(), PosteriorCollapseWarning, stacklevel=stacklevel)
