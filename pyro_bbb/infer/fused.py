r"""The annealed ELBO of a :class:`~pyro_bbb.BNN` under this package's guides, without traces.

:meth:`AnnealedELBO.terms <pyro_bbb.infer.elbo.AnnealedELBO.terms>` traces the guide, replays
the model on the trace and reads every term off the two traces. That is what makes it work
for any model, guide and handler, and on a small network it costs more than the arithmetic:
every ``pyro.param`` and ``pyro.sample`` statement goes through Pyro's handler stack, is
copied into a trace and looked up again.

For the case this package builds, a :class:`~pyro_bbb.BNN` whose Bayesian parameters all sit
in its Bayesian layers (:class:`~pyro_bbb.nn.layers.BayesianAffine`, or any module made Bayesian
by :func:`~pyro_bbb.bayesianize`: an LSTM, a BatchNorm, an attention block), trained with
:class:`~pyro_bbb.MeanFieldGuide` or :class:`~pyro_bbb.LowRankGuide` (or an
:class:`~pyro_bbb.infer.Ensemble` of either's members), :class:`FusedELBO` computes the
same :class:`~pyro_bbb.infer.elbo.ELBOTerms` directly:

* the guide's noise is drawn in the guide's order and shapes, so the same random state
  gives the same weights (and a checkpointed fit resumes onto the same stream);
* the weights reach the network through its ``PyroModule`` context, the cache a
  ``PyroSample`` reads before it would issue a ``pyro.sample`` statement, so the network's
  own ``forward`` runs;
* local reparameterisation and flipout apply the same arithmetic as their handlers
  (:func:`~pyro_bbb.infer.reparam.local_affine`, :func:`~pyro_bbb.infer.reparam.flipout_affine`),
  on networks whose Bayesian layers are all affine (the traced path takes the others);
* every KL term is the one the traced ELBO takes: closed form where it has one (a Gaussian
  prior, :mod:`~pyro_bbb.infer.kl`), :math:`\log q(w) - \log p(w)` otherwise (the scale
  mixture), β times the sum, the likelihood scaled by :math:`N/B`;
* an ensemble's members are the leading dim of every guide parameter, ``(K, 1, *shape)``, as
  the traced guide draws them inside its member plate: the weights keep that dim (particles
  go left of it), the network runs every member in one batched pass, and the sums over the
  member dim make the objective the sum of the members' own.

:func:`fused_elbo` returns ``None`` for anything else (another model or guide, Pyro's
autoguides, an ensemble of point-mass members, a network with sample sites outside
Bayesian layers, ``"local"`` or ``"flipout"`` on a network with Bayesian layers other than
affine ones, a prior tied to other sites, module-local parameters), and the traced path
stays the one for those. ``fit`` also compares the sites of one traced
evaluation with the fused one before using it (a network whose ``forward`` issues sample
statements of its own is then declined). The two paths are kept in step by a test that
takes every guide, prior and estimator the package offers from the package itself (a guide,
prior family or estimator added later is enumerated without being listed) and checks loss,
parts and every gradient of the fused path against the traced one, or that the fused path
declines (``tests/infer/test_fused_every_pair.py``); others check each likelihood and
ensembles of each guide's members.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass

import pyro.distributions as dist
import torch

from .._pyro_compat import module_local_params, run_context, sample_attributes, set_cached_value
from .._shapes import sample_dims_of
from ..likelihoods import Bernoulli, Categorical, Gaussian
from ..model import BNN
from ..nn.affine import AffineMap
from ..nn.draws import one_draw
from ..nn.layers import BayesianAffine, BayesianLayer
from ._low_rank_block import LowRankBlock, cholesky
from ._low_rank_draw import (
    LowRankDraw,
    compiled_draw_applies,
    prepare_kernels,
    prior_constants,
)
from ._mean_field_block import (
    MeanFieldBlock,
    PackedMeanFieldBlock,
    SiteLayout,
    packed_block_runs,
)
from .elbo import AnnealedELBO, ELBOTerms
from .ensemble import Ensemble
from .guides import LowRankGuide, MeanFieldGuide
from .guides._init import scale_from_rho
from .kl import kl_to_scalar_normal, scalar_normal_parameters
from .reparam import AffineEstimator, Split, flipout_affine, local_affine

__all__ = ["FusedELBO", "fused_elbo"]

_AffineOp = Callable[[AffineMap, torch.Tensor, Split, Split | None], torch.Tensor]
_OPS: dict[str | None, _AffineOp | None] = {
    None: None,
    "local": local_affine,
    "flipout": flipout_affine,
}
_LIKELIHOODS = (Gaussian, Categorical, Bernoulli)


@dataclass(frozen=True)
class _Site:
    """A Bayesian parameter of the network: its layer, and its place in the guide."""

    name: str
    layer: BayesianLayer
    param: str  # "weight" or "bias"
    shape: torch.Size

    @property
    def event_dims(self) -> int:
        return len(self.shape)

    def prior(self) -> dist.TorchDistribution:
        return self.layer.prior_distribution(self.param)


def _network_sites(model: BNN) -> dict[str, _Site] | None:
    """The Bayesian parameters of the model's network by site name, or ``None``.

    ``None`` when a module other than a Bayesian layer (an affine one or any module made
    Bayesian, :class:`~pyro_bbb.nn.module_layer.BayesianModule`) has sample sites, or a
    prior is tied to other sites (a block from ``from_guide``): the traced path handles
    those.
    """
    sites = {}
    for module in model.net.modules():
        samples = sample_attributes(module)
        if not isinstance(module, BayesianLayer):
            if samples:
                return None
            continue
        if set(samples) != set(module.priors):
            return None
        names = module._site_names()
        for param, prior in module.priors.items():
            if getattr(prior, "joint_sites", ()):
                return None
            shape = module.parameter_shape(param)
            sites[names[param]] = _Site(names[param], module, param, shape)
    return sites


def fused_elbo(
    model: Callable, guide: Callable, elbo: AnnealedELBO, reparam: str | None
) -> FusedELBO | None:
    """A :class:`FusedELBO` for this model, guide and estimator, or ``None`` if not ours.

    Args:
        model: The model.
        guide: The guide, already set up (called once): a :class:`~pyro_bbb.MeanFieldGuide`,
            a :class:`~pyro_bbb.LowRankGuide`, or an :class:`~pyro_bbb.infer.Ensemble` of
            either's members.
        elbo: The ELBO whose ``beta``, ``num_particles`` and ``analytic_kl`` are followed.
        reparam: The estimator: ``None``, ``"local"`` or ``"flipout"``.

    Returns:
        The fused evaluation, or ``None`` when the model, guide or estimator is not one it
        reproduces (the traced :class:`~pyro_bbb.infer.elbo.AnnealedELBO` is then the path).
    """
    ensemble = guide if type(guide) is Ensemble else None
    if ensemble is not None:
        guide = ensemble.members
        if not _particles_beside_members(ensemble, elbo):
            return None
    if (
        getattr(type(model), "forward", None) is not BNN.forward  # a function: traced
        or type(guide) not in (MeanFieldGuide, LowRankGuide)
        or guide.prototype_trace is None
        or guide.model is not model
        or type(model.likelihood) not in _LIKELIHOODS
        or type(elbo) is not AnnealedELBO
        or reparam not in _OPS
        or module_local_params()
    ):
        return None
    sites = _network_sites(model)
    if sites is None:
        return None
    if reparam is not None and not all(isinstance(s.layer, BayesianAffine) for s in sites.values()):
        return None  # the estimators sample affine layers' pre-activations only
    guide_sites = (
        list(guide._event_dims)
        if isinstance(guide, MeanFieldGuide)
        else [piece.site for block in guide._blocks for piece in block.slices]
    )
    if sorted(guide_sites) != sorted(sites):
        return None
    if isinstance(guide, MeanFieldGuide):
        draws: _Draws = _MeanFieldDraws(guide, sites, elbo)
    else:
        draws = _LowRankDraws(guide, sites, elbo)
        if not draws.supported():
            return None
    draws.splits = {None: None, "local": "variance", "flipout": "value"}[reparam]
    if ensemble is not None:
        draws.particle_padding = ()  # the members' parameters carry the data plate's dim
        draws.members = True
    draws.prepare()
    return FusedELBO(model, elbo, draws, _OPS[reparam])


def _particles_beside_members(ensemble: Ensemble, elbo: AnnealedELBO) -> bool:
    """Whether the traced ELBO puts its particle plate just left of the member plate.

    It does when it set its plate depth from the ensemble's (``fit``'s ELBO, or one not
    yet evaluated); the fused draws then have the shapes of the traced ones.
    """
    nesting = elbo.max_plate_nesting
    declared = ensemble.model_plate_nesting + 1 + elbo.particle_plate_dims
    return nesting == float("inf") or nesting == declared


class FusedELBO:
    """:meth:`AnnealedELBO.terms` of a ``BNN`` under one of our guides, computed directly.

    Built by :func:`fused_elbo`; see the module's notes for what it computes and when.
    """

    def __init__(self, model: BNN, elbo: AnnealedELBO, draws: _Draws, op: _AffineOp | None):
        self.model, self.elbo, self._draws, self._op = model, elbo, draws, op

    def parameters(self) -> list[torch.Tensor]:
        """The guide's parameter tensors this evaluation reads."""
        return self._draws.parameters()

    def covers(self, traced: ELBOTerms) -> bool:
        """Whether a traced evaluation of the same step has exactly the sites this one has.

        A network whose ``forward`` issues sample statements of its own has more.
        """
        return set(traced.sites) == {self.model.observation_site, *self._draws.term_names()}

    def terms(
        self, x: torch.Tensor, y: torch.Tensor, *, beta: torch.Tensor | None = None
    ) -> ELBOTerms:
        """Estimate the objective and its parts on a minibatch, as the traced ELBO would.

        Args:
            x: Features ``(batch, *features)``, already checked.
            y: Targets ``(batch[, dim])``, already checked.
            beta: β as a 0-dim tensor of the loss's dtype and device, read when the step
                runs (a step captured as a CUDA graph sees the value written into it before
                each replay); ``None`` takes the ELBO's ``beta``. The loss is the same bit
                for bit either way.

        Returns:
            :class:`~pyro_bbb.infer.elbo.ELBOTerms`; ``sites`` holds the same names as the
            traced path's (the observation and every latent term). ``beta`` is the tensor
            when one was given.
        """
        model, particles = self.model, self.elbo.num_particles
        sample = (particles, *self._draws.particle_padding) if particles > 1 else ()
        draw = self._draws.draw(sample)
        with run_context(model):
            for name, value in draw.values.items():
                set_cached_value(model, name, value)
            layers = nullcontext() if self._op is None else _GivenSplits(self._op, draw.splits)
            one = not sample and not self._draws.members  # no sample dims on any value
            with layers, one_draw() if one else nullcontext():
                output = model.net(x)
            log_lik = model.likelihood.log_prob(output, y).sum()
        batch = x.shape[0]
        if batch != model.num_data:
            log_lik = log_lik * (model.num_data / batch)
        sites = {model.observation_site: log_lik, **draw.kl_terms}
        nll = -log_lik
        closed, sampled = draw.closed_kl, draw.sampled_kl
        if particles > 1:
            nll = nll / particles
            sampled = None if sampled is None else sampled / particles
        kl = _add(closed, sampled)
        if kl is None:
            kl = torch.zeros((), dtype=nll.dtype, device=nll.device)
        if beta is None:
            beta = self.elbo.beta
        return ELBOTerms(nll + beta * kl, nll, kl, beta, sites)


def _add(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None:
        return b
    return a if b is None else a + b


def _total(terms: list[torch.Tensor]) -> torch.Tensor | None:
    """The sum of scalar terms; by additions, whose backward passes the gradient through."""
    total = None
    for term in terms:
        total = term if total is None else total + term
    return total


class _GivenSplits(AffineEstimator):
    """Applies an estimator to every Bayesian layer, from splits made by the fused step."""

    def __init__(self, op: _AffineOp, splits: dict[str, Split]) -> None:
        super().__init__()
        self._op, self._splits = op, splits

    def split(self, site: str | None, value: torch.Tensor, event_dims: int) -> Split:
        split = self._splits.get(site) if site is not None else None
        return Split(value, None, None) if split is None else split

    def apply(self, affine, x, weight, bias):
        return self._op(affine, x, weight, bias)


@dataclass
class _Draw:
    """One draw of the guide: the weights, the estimators' splits and the KL terms."""

    values: dict[str, torch.Tensor]
    splits: dict[str, Split]
    kl_terms: dict[str, torch.Tensor]  # by the traced path's site names
    closed_kl: torch.Tensor | None  # closed-form terms: once, whatever the particles
    sampled_kl: torch.Tensor | None  # Monte Carlo terms: summed over particles


class _Draws:
    """A guide's draws and KL terms, as its traced evaluation makes them."""

    #: What the estimator needs of each weight: nothing (``None``), the drawn value and its
    #: batch-shared part (``"value"``, flipout) or also its variance (``"variance"``, local).
    splits: str | None = None

    #: The size-1 dims between the particle dim and a guide parameter's own shape: the
    #: model's data plate, ``(1,)``; none for an ensemble's members, whose parameters
    #: ``(K, 1, *shape)`` carry the member plate and the data plate's dim themselves.
    particle_padding: tuple[int, ...] = (1,)

    #: Whether the parameters carry an ensemble's member dim (so every draw has sample dims).
    members: bool = False

    def draw(self, sample: tuple[int, ...]) -> _Draw:
        raise NotImplementedError

    def prepare(self) -> None:
        """Build what the draws will need once, before the first step (nothing by default)."""

    def parameters(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def term_names(self) -> Iterable[str]:
        raise NotImplementedError


def _standard_normal(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """Standard normal noise drawn as ``torch.distributions.Normal.rsample`` draws it."""
    return torch.empty(shape, dtype=like.dtype, device=like.device).normal_()


def _constant(value: float | torch.Tensor) -> bool:
    """A prior's number the block takes: a float, or a 0-d tensor that needs no gradient."""
    if isinstance(value, float):
        return True
    return isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad


def _is_normal(fn: object) -> bool:
    while isinstance(fn, torch.distributions.Independent):
        fn = fn.base_dist
    return isinstance(fn, torch.distributions.Normal)


def _closed_form(elbo: AnnealedELBO, q: dist.TorchDistribution, p) -> bool:
    """Whether the traced ELBO takes this site's KL in closed form."""
    with torch.no_grad():
        return elbo._closed_form_kl(q, p) is not None


class _MeanFieldDraws(_Draws):
    r""":class:`~pyro_bbb.MeanFieldGuide`: :math:`w = \mu + \sigma\varepsilon` per site."""

    def __init__(self, guide: MeanFieldGuide, sites: dict[str, _Site], elbo: AnnealedELBO):
        self._guide, self._elbo = guide, elbo
        # in the guide's order: that is the order its sites draw their noise in
        self._sites = [sites[name] for name in guide._event_dims]
        self._refs = [guide._params[site.name] for site in self._sites]
        self._kinds: dict[str, tuple] = {}
        self._one_draw: bool | None = None  # found at the first draw
        self._block: tuple[list, list, SiteLayout | None] | None = None  # priors, (m, s), layout

    def parameters(self) -> list[torch.Tensor]:
        return [ref.module_value() for refs in self._refs for ref in refs]

    def term_names(self) -> Iterable[str]:
        return [site.name for site in self._sites]

    def _kind(self, site: _Site, prior, loc, scale) -> tuple:
        """How the traced ELBO takes this site's KL: ``("scalar", m, s)``, closed or sampled.

        Kept while the layer hands out the same prior object (a cached prior).
        """
        kind = self._kinds.get(site.name)
        if kind is not None and kind[0] is prior:
            return kind[1]
        constants = scalar_normal_parameters(prior) if self._elbo.analytic_kl else None
        if constants is not None:
            how = ("scalar", *constants)
        else:
            q = dist.Normal(loc, scale, validate_args=False).to_event(site.event_dims)
            how = ("closed",) if _closed_form(self._elbo, q, prior) else ("sampled",)
        if getattr(site.layer.priors[site.param], "cacheable", False):
            self._kinds[site.name] = (prior, how)
        return how

    def _layout(self) -> SiteLayout | None:
        """The sites' layout when one :class:`MeanFieldBlock` draws them all, else ``None``.

        That is the common case, on any device: a single guide (no member dims; one draw
        or a step's particles), weight sampling, and a closed-form KL to a prior of one
        number per site, a Python float (read from a CPU tensor) or a 0-d tensor on the
        weights' device that needs no gradient (a learnable prior scale takes the
        site-by-site path, whose autograd reaches it). Kept while the layers hand out the
        same priors (or, numbers read on the CPU, priors with the same numbers), so nothing
        is read back from a GPU to decide it.
        """
        if self.splits is not None or not self._elbo.analytic_kl:
            return None
        if self._one_draw is None:  # no member dims: the guide's parameters are the sites'
            self._one_draw = all(
                loc_ref.module_value().shape == site.shape
                for site, (loc_ref, _) in zip(self._sites, self._refs, strict=True)
            )
        if not self._one_draw:
            return None
        priors = [site.prior() for site in self._sites]
        cached = self._block
        if cached is not None and all(a is b for a, b in zip(cached[0], priors, strict=True)):
            return cached[2]
        pairs = [scalar_normal_parameters(prior) for prior in priors]
        numbers = all(p is not None and all(type(v) is float for v in p) for p in pairs)
        if numbers and cached is not None and pairs == cached[1]:
            self._block = (priors, pairs, cached[2])
            return cached[2]
        layout = None
        if numbers or all(p is not None and all(map(_constant, p)) for p in pairs):
            layout = SiteLayout(
                [site.shape for site in self._sites],
                [m for m, _ in pairs],
                [s for _, s in pairs],
                self._guide.min_scale,
            )
        self._block = (priors, pairs, layout)
        return layout

    def prepare(self) -> None:
        """Pack the guide's parameters now, at set-up, if the steps take the packed block.

        The packing only moves their values into two buffers (each parameter the same
        tensor, a view of them); done in the first step, it would be that step's time.
        """
        if self._elbo.num_particles == 1 and self._layout() is not None:
            self._packed(())

    def _packed(self, sample: tuple[int, ...]):
        """The guide's packed parameters when a block's draw of ``sample`` takes them."""
        if sample or not packed_block_runs(self._refs[0][0].module_value().device):
            return None
        return self._guide._packed()

    def _block_draw(self, layout: SiteLayout, sample: tuple[int, ...]) -> _Draw:
        """Every site in one pass (:class:`~pyro_bbb.infer._mean_field_block.MeanFieldBlock`).

        One draw on the CPU takes the guide's packed parameters
        (:class:`~pyro_bbb.infer._mean_field_block.PackedMeanFieldBlock`): a few calls over
        the whole network instead of some twenty a site.
        """
        packed = self._packed(sample)
        if packed is not None:
            locs, rhos = packed
            total, kl, *values = PackedMeanFieldBlock.apply(
                layout, locs.buffer, rhos.buffer, *locs.tensors, *rhos.tensors
            )
        else:
            locs = [loc_ref.module_value() for loc_ref, _ in self._refs]
            rhos = [rho_ref.module_value() for _, rho_ref in self._refs]
            total, kl, *values = MeanFieldBlock.apply(layout, sample, *locs, *rhos)
        names = [site.name for site in self._sites]
        return _Draw(
            dict(zip(names, values, strict=True)),
            {},
            dict(zip(names, kl.unbind(), strict=True)),
            total,
            None,
        )

    def draw(self, sample: tuple[int, ...]) -> _Draw:
        layout = self._layout()
        if layout is not None:
            return self._block_draw(layout, sample)
        parts = []
        for site, (loc_ref, rho_ref) in zip(self._sites, self._refs, strict=True):
            loc = loc_ref.module_value()
            scale = scale_from_rho(rho_ref.module_value(), self._guide.min_scale)
            prior = site.prior()
            parts.append((site, loc, scale, prior, self._kind(site, prior, loc, scale)))
        # Local reparameterisation uses the weights' means and variances only: unless a KL
        # term is sampled, the weights are not drawn (the traced guide draws them unused).
        skip = self.splits == "variance" and all(how[0] != "sampled" for *_, how in parts)
        values, splits, kl_terms = {}, {}, {}
        closed, sampled = [], []
        for site, loc, scale, prior, how in parts:
            shape = (*sample, *loc.shape)  # loc: (K, 1, *site shape) for an ensemble's members
            if skip:
                value = None
                # what the layer is handed (the estimator replaces it): the mean, a view with
                # the draws' sample dims, so a network run once per draw sees how many
                values[site.name] = loc.expand(shape) if sample else loc
            else:
                value = torch.addcmul(loc, _standard_normal(shape, loc), scale)
                values[site.name] = value
            variance = scale.pow(2) if self.splits == "variance" else None
            if self.splits:
                dims = sample_dims_of(shape, site.event_dims)
                splits[site.name] = Split(loc, variance, value, dims)
            if how[0] == "scalar":
                term = kl_to_scalar_normal(
                    loc, scale, how[1], how[2], event_dims=site.event_dims, variance=variance
                )
                if term.dim():  # one per member
                    term = term.sum()
                closed.append(term)
            else:
                q = dist.Normal(loc, scale, validate_args=False).to_event(site.event_dims)
                if how[0] == "closed":
                    term = self._elbo._closed_form_kl(q, prior).sum()
                    closed.append(term)
                else:
                    term = q.log_prob(value).sum() - prior.log_prob(value).sum()
                    sampled.append(term)
            kl_terms[site.name] = term
        return _Draw(values, splits, kl_terms, _total(closed), _total(sampled))


class _LowRankDraws(_Draws):
    r""":class:`~pyro_bbb.LowRankGuide`: a block's draw, sliced into its sites.

    :math:`\theta = \mu + V\varepsilon_2 + D^{1/2}\varepsilon_1` per block, from the guide's
    :math:`V^\top`, ``(rank, d)``: every product below runs along rows of length ``d``.
    """

    def __init__(self, guide: LowRankGuide, sites: dict[str, _Site], elbo: AnnealedELBO):
        self._guide, self._elbo, self._sites = guide, elbo, sites
        self._blocks = list(guide._blocks)
        self._refs = [guide._params[block.name] for block in self._blocks]

    def parameters(self) -> list[torch.Tensor]:
        return [ref.module_value() for refs in self._refs for ref in refs]

    def term_names(self) -> Iterable[str]:
        names = []
        closed = self._closed_form_priors()
        for block in self._blocks:
            names.append(block.aux_site)
            if closed is None:
                names += [piece.site for piece in block.slices]
        return names

    def _closed_form_priors(self) -> dict[str, tuple] | None:
        """Each site's Gaussian prior ``(m, s)`` when the traced ELBO takes the KL in closed form.

        The traced ELBO flattens the priors of a block into one diagonal Normal when every
        one is a Normal (else it samples the KL); this path takes the common case, one number
        ``(m, s)`` per site, and :func:`fused_elbo` declines per-weight Normal priors.
        """
        if not self._elbo.analytic_kl:
            return None
        constants = {}
        for name, site in self._sites.items():
            pair = scalar_normal_parameters(site.prior())
            if pair is None:
                return None
            constants[name] = pair
        return constants

    def supported(self) -> bool:
        """False when every prior is a Normal but one has per-weight parameters."""
        if not self._elbo.analytic_kl or self._closed_form_priors() is not None:
            return True
        return not all(_is_normal(site.prior()) for site in self._sites.values())

    def draw(self, sample: tuple[int, ...]) -> _Draw:
        guide = self._guide
        priors = self._closed_form_priors()
        values, splits, kl_terms = {}, {}, {}
        closed, sampled = [], []
        for block, refs in zip(self._blocks, self._refs, strict=True):
            loc, rho, factor_t = (ref.module_value() for ref in refs)
            # loc: (d,), or (K, 1, d) for an ensemble's members (factor_t (K, 1, rank, d))
            eps_diag = _standard_normal((*sample, *loc.shape), loc)
            eps_factor = _standard_normal((*sample, *loc.shape[:-1], guide.rank), loc)
            # Local reparameterisation reads μ + Vε₂ and σ² only: with a closed-form KL the
            # draw θ is not formed (ε₁ is still drawn, as the traced guide draws it).
            unused = self.splits == "variance" and priors is not None
            noise = (eps_diag, eps_factor)
            fused = self._fused_draw(block, priors, sample, (loc, rho, factor_t), noise)
            if fused is not None:  # the whole draw and its KL in two compiled passes
                theta, twice_kl, groups = fused
            else:
                scale = scale_from_rho(rho, guide.min_scale)
                if priors is not None:
                    groups = self._prior_groups(block, priors)
                    shared, twice_kl = _block_draws(loc, scale, factor_t, eps_factor, groups)
                elif loc.dim() > 1:
                    shared = loc + (eps_factor.unsqueeze(-2) @ factor_t).squeeze(-2)
                else:
                    shared = loc + eps_factor @ factor_t
                if unused:
                    theta = shared
                elif self.splits:  # the estimator reads μ + Vε₂ as well
                    theta = torch.addcmul(shared, scale, eps_diag)
                else:  # into the draw's own buffer: one buffer of the block's size fewer
                    theta = shared.addcmul_(scale, eps_diag)
            # one split, not a slice per site: its backward writes each gradient once
            sizes = [piece.stop - piece.start for piece in block.slices]
            pieces = theta.split(sizes, dim=-1)
            if self.splits:
                means = shared.split(sizes, dim=-1)
                variances = scale.pow(2).split(sizes, -1) if self.splits == "variance" else None
            for k, piece in enumerate(block.slices):
                value = pieces[k].reshape(*theta.shape[:-1], *piece.shape)
                values[piece.site] = value  # under `unused`, replaced by the estimator
                if unused:
                    value = None
                if self.splits:
                    mean = means[k].reshape(*shared.shape[:-1], *piece.shape)
                    variance = (
                        None
                        if variances is None
                        else variances[k].reshape(*scale.shape[:-1], *piece.shape)
                    )
                    dims = sample_dims_of(mean.shape, len(piece.shape))
                    splits[piece.site] = Split(mean, variance, value, dims)
            if priors is not None:
                term = _closed_kl(block, twice_kl, groups)
                if term.dim():  # one per member
                    term = term.sum()
                kl_terms[block.aux_site] = term
                closed.append(term)
            else:
                q = self._distribution(loc, scale, factor_t)
                log_q = q.log_prob(theta).sum()
                kl_terms[block.aux_site] = log_q
                sampled.append(log_q)
                for piece in block.slices:
                    prior = self._sites[piece.site].prior()
                    term = -prior.log_prob(values[piece.site]).sum()
                    kl_terms[piece.site] = term
                    sampled.append(term)
        return _Draw(values, splits, kl_terms, _total(closed), _total(sampled))

    def prepare(self) -> None:
        """Compile (or load) the blocks' compiled passes now, at set-up, if a step takes them.

        Built in the first step, they would be that step's time and memory (seconds, and
        Inductor's modules).
        """
        if self.splits or self._elbo.num_particles > 1 or self._closed_form_priors() is None:
            return
        for refs in self._refs:
            loc, _, factor_t = (ref.module_value() for ref in refs)
            if compiled_draw_applies(loc, factor_t):
                prepare_kernels(loc, factor_t.shape[0], self._guide.min_scale)

    def _fused_draw(self, block, priors, sample, params, noise):
        """``(θ, G, groups)`` by :class:`~pyro_bbb.infer._low_rank_draw.LowRankDraw`, or ``None``.

        Taken for one draw of a single guide's block under weight sampling, with a
        closed-form KL to priors of fixed numbers, where the compiled passes run and pay
        (:func:`~pyro_bbb.infer._low_rank_draw.compiled_draw_applies`).
        """
        loc, rho, factor_t = params
        if priors is None or self.splits or sample or not compiled_draw_applies(loc, factor_t):
            return None
        groups = self._prior_groups(block, priors)
        constants = prior_constants(groups, loc)
        if constants is None:
            return None
        theta, twice_kl = LowRankDraw.apply(
            loc, rho, factor_t, *noise, *constants, self._guide.min_scale
        )
        return theta, twice_kl, groups

    @staticmethod
    def _prior_groups(block, priors) -> list[tuple[int, tuple]]:
        """``[(size, (m, s))]``: the whole block if its sites share a prior, else each site."""
        pairs = [priors[piece.site] for piece in block.slices]
        if all(pair is pairs[0] or pair == pairs[0] for pair in pairs):
            return [(block.size, pairs[0])]  # one prior: no slicing
        return [(p.stop - p.start, pair) for p, pair in zip(block.slices, pairs, strict=True)]

    def _distribution(self, loc, scale, factor_t) -> dist.TorchDistribution:
        return dist.LowRankMultivariateNormal(loc, factor_t.mT, scale.pow(2), validate_args=False)


#: Numbers in one member's factor ``rank × d`` from which an ensemble's low-rank members go
#: through :class:`~pyro_bbb.infer._low_rank_block.LowRankBlock` one at a time: a block that
#: large is bound by memory traffic, which the Function halves (784-400-400-10, rank 4, five
#: members: 74 ms a step, against 146 ms batched); below it the Python of one call per
#: member costs more than the arithmetic (1-50-50-1: 4.2 ms a step, against 2.5 ms batched).
_PER_MEMBER_NUMBERS = 2**16


def _block_draws(
    loc: torch.Tensor,
    scale: torch.Tensor,
    factor_t: torch.Tensor,
    eps: torch.Tensor,
    groups: list[tuple[int, tuple]],
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""A block's shared draw :math:`\mu + V\varepsilon_2` and :math:`G` (see :func:`_closed_kl`).

    A single guide's block (``loc`` ``(d,)``) goes through
    :class:`~pyro_bbb.infer._low_rank_block.LowRankBlock`; an ensemble's members (``loc``
    ``(K, 1, d)``, ``factor_t`` ``(K, 1, rank, d)``, ``eps`` ``(*sample, K, 1, rank)``)
    through it one member at a time when the block is large (:data:`_PER_MEMBER_NUMBERS`),
    else as the same terms in batched products over the member dim, left to autograd.

    Returns:
        The draw, ``(*sample, d)`` or ``(*sample, K, 1, d)``, and :math:`G`, a scalar or one
        per member, ``(K, 1)``.
    """
    prior_locs = _prior_locs([m for _, (m, _) in groups], loc)
    coefs = _coefficients([s for _, (_, s) in groups], loc)
    sizes = tuple(n for n, _ in groups)
    if loc.dim() == 1:
        return LowRankBlock.apply(loc, scale, factor_t, eps, prior_locs, coefs, sizes)
    size, rank = loc.shape[-1], factor_t.shape[-2]
    members = loc.shape[:-1]
    if rank * size >= _PER_MEMBER_NUMBERS:
        count = members.numel()
        lead = eps.shape[: eps.dim() - len(members) - 1]  # the particle dims
        draws = zip(
            loc.reshape(count, size).unbind(),
            scale.reshape(count, size).unbind(),
            factor_t.reshape(count, rank, size).unbind(),
            eps.reshape(*lead, count, rank).unbind(len(lead)),
            strict=True,
        )
        shared, twice = zip(
            *(LowRankBlock.apply(*member, prior_locs, coefs, sizes) for member in draws),
            strict=True,
        )
        shared = torch.stack(shared, len(lead)).reshape(*lead, *members, size)
        return shared, torch.stack(twice).reshape(members)
    shared = loc + (eps.unsqueeze(-2) @ factor_t).squeeze(-2)
    # log det(D + VV^T) = sum log sigma^2 + log det(I + U D^-1 U^T), the determinant lemma
    whitened = (factor_t / scale.unsqueeze(-2)).reshape(-1, rank, size)
    eye = torch.eye(rank, dtype=loc.dtype, device=loc.device)
    tril = cholesky(torch.baddbmm(eye, whitened, whitened.mT))
    half_log_det = scale.log().sum(-1) + tril.diagonal(dim1=-2, dim2=-1).log().sum(-1).reshape(
        members
    )
    twice = -2 * half_log_det
    for j, (mean, std, rows) in enumerate(
        zip(loc.split(sizes, -1), scale.split(sizes, -1), factor_t.split(sizes, -1), strict=True)
    ):
        deviation = mean if prior_locs is None else mean - prior_locs[j]
        squares = std.square().sum(-1) + deviation.square().sum(-1) + rows.square().sum((-2, -1))
        twice = twice + coefs[j] * squares
    return shared, twice


def _closed_kl(block, twice_kl: torch.Tensor, groups: list[tuple[int, tuple]]) -> torch.Tensor:
    r""":math:`\mathrm{KL}(\mathcal{N}(\mu, D + VV^\top) \| \prod_j \mathcal{N}(m_j, s_j^2))`.

    .. math::

        \tfrac12\Big[\sum_j \frac{\sum_{i \in j} D_i + \lVert V_i \rVert^2
            + (\mu_i - m_j)^2}{s_j^2} + n_j \log s_j^2 - d
            - \log\det(D + VV^\top)\Big]

    site by site :math:`j` of the block: ``twice_kl`` is all but the constants
    :math:`n_j \log s_j^2 - d`, from :class:`~pyro_bbb.infer._low_rank_block.LowRankBlock`
    (with :math:`\log\det(D + VV^\top) = \sum_i \log D_i + \log\det(I_r + V^\top D^{-1} V)`,
    the matrix determinant lemma: :math:`O(d r^2)`, no :math:`d \times d` matrix).
    """
    total = twice_kl - block.size
    for n, (_, s) in groups:
        total = total + n * 2 * (s.log() if isinstance(s, torch.Tensor) else math.log(s))
    return 0.5 * total


def _prior_locs(locs: list, like: torch.Tensor) -> torch.Tensor | None:
    """Each group's prior mean as one tensor, or ``None`` when every one is the number 0."""
    if all(isinstance(m, float) and m == 0.0 for m in locs):
        return None
    if all(isinstance(m, float) for m in locs):
        return _numbers(tuple(locs), like.dtype, like.device)
    return torch.stack([torch.as_tensor(m, dtype=like.dtype, device=like.device) for m in locs])


def _coefficients(scales: list, like: torch.Tensor) -> torch.Tensor:
    """``1 / s²`` of each group's prior scale, one tensor (its gradient flows to a tensor s)."""
    if all(isinstance(s, float) for s in scales):
        return _numbers(tuple(1.0 / (s * s) for s in scales), like.dtype, like.device)
    return torch.stack(
        [
            torch.as_tensor(s, dtype=like.dtype, device=like.device).square().reciprocal()
            for s in scales
        ]
    )


@functools.lru_cache(maxsize=256)
def _numbers(values: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` as a tensor, made once per device and dtype and shared (never written to).

    Made every step, it would copy from the host each time: on CUDA a transfer a captured
    step cannot contain.
    """
    return torch.tensor(values, dtype=dtype, device=device)
