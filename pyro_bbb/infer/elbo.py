r"""The β-annealed ELBO, with closed-form KL terms where they exist.

The objective, over the whole data set of ``N`` points, is

.. math::

    \mathcal{L}_\beta(q) = \mathbb{E}_{q(w)}\Big[\sum_{i=1}^N \log p(y_i \mid x_i, w)\Big]
        - \beta\, \mathrm{KL}\big(q(w) \,\|\, p(w)\big).

β multiplies every *latent* term, in the model (log prior) and the guide (log q) alike, and
never an observed one. A minibatch of ``B`` points enters with its log-likelihood scaled by
``N / B`` (the model's subsampled plate), and the KL once per step. The KL of a site is
computed in closed form where a rule exists for the guide/prior pair (a Normal guide against
a Gaussian prior, :mod:`pyro_bbb.infer.kl`) and by Monte Carlo otherwise (a scale-mixture
prior, Pyro's autoguides). A prior block from :func:`~pyro_bbb.priors.from_guide` (a low-rank
Gaussian over several sites, drawn site by site) gets its KL in closed form as one term when the
guide's sites for it are one low-rank block or independent Normals. ``docs/kl_scaling.md``
relates this to the forms in the literature (Blundell et al. 2015; Graves 2011).

This module holds no training loop and no schedule: :func:`~pyro_bbb.fit` sets
:attr:`AnnealedELBO.beta` from a :mod:`~pyro_bbb.infer.schedules` schedule at each step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.distributions.kl import kl_divergence
from pyro.distributions.util import scale_and_mask
from pyro.infer import ELBO
from pyro.poutine.util import site_is_subsample

from .._shapes import broadcast_shape, collapse_broadcast
from .._validation import check_int, check_nonnegative_number
from ..priors.gaussian_block import SiteConditional
from .kl import diagonal_normal_kl
from .sites import JOINT_KEY, is_point_mass, model_in_plates

__all__ = ["AnnealedELBO", "ELBOTerms"]


def _diagonal_normal(fns) -> torch.distributions.Distribution | None:
    """The product of (independent) Normal site priors as one ``Normal.to_event(1)``."""
    locs, scales = [], []
    for fn in fns:
        base = getattr(fn, "base_dist", fn)
        if not isinstance(base, torch.distributions.Normal) or (
            fn is not base and not isinstance(fn, torch.distributions.Independent)
        ):
            return None
        shape = fn.batch_shape + fn.event_shape
        flat = (*fn.batch_shape, fn.event_shape.numel())
        locs.append(base.loc.expand(shape).reshape(flat))
        scales.append(base.scale.expand(shape).reshape(flat))
    batch = broadcast_shape(*(loc.shape[:-1] for loc in locs))
    locs = [loc.expand(*batch, loc.shape[-1]) for loc in locs]
    scales = [scale.expand(*batch, scale.shape[-1]) for scale in scales]
    return dist.Normal(torch.cat(locs, -1), torch.cat(scales, -1)).to_event(1)


def _block_members(names, model_nodes) -> dict[int, list[str]] | None:
    """The sites of ``names`` drawn from each prior block, if the blocks close over ``names``.

    Keyed by ``id(block)``, in the order of ``names``. ``None`` unless every site the model
    drew from one of these blocks is among ``names`` and was conditioned only on sites drawn
    from the same block: then the prior of ``names`` is the product of the blocks' marginals
    and the other sites' Normals, and its KL is one closed-form term.
    """
    members: dict[int, list[str]] = {}
    for name in names:
        fn = model_nodes[name]["fn"]
        if isinstance(fn, SiteConditional):
            members.setdefault(id(fn.block), []).append(name)
    for name, node in model_nodes.items():
        fn = node.get("fn")
        if not isinstance(fn, SiteConditional) or id(fn.block) not in members:
            continue
        own = members[id(fn.block)]
        # a site drawn from the block outside `names`, or conditioned on a value drawn from
        # something else (another block's site of the same name), breaks the product form
        if name not in own or not set(fn.given) <= set(own):
            return None
    return members


def _flat_prior(names, model_nodes) -> torch.distributions.Distribution | None:
    """The joint prior of the sites ``names``, flat over their concatenation, or ``None``.

    Independent Normals give ``Normal(...).to_event(1)``. With prior blocks among the sites
    (closed over ``names``, see :func:`_block_members`), one block alone gives its own
    marginal; a mix gives a ``LowRankMultivariateNormal`` whose factor holds each block's
    columns in its sites' rows and zeros elsewhere.
    """
    fns = [model_nodes[name]["fn"] for name in names]
    conditionals = [fn for fn in fns if isinstance(fn, SiteConditional)]
    if not conditionals:
        return _diagonal_normal(fns)
    members = _block_members(names, model_nodes)
    if members is None:
        return None
    like = conditionals[0].base.loc
    where = {"device": like.device, "dtype": like.dtype}
    joints = {
        key: model_nodes[sites[0]]["fn"].block.joint(sites, **where)
        for key, sites in members.items()
    }
    if len(conditionals) == len(fns) and len(joints) == 1:
        return next(iter(joints.values()))
    position = {}  # site -> (block key, first row in the block's joint, first column)
    columns = 0
    for key, sites in members.items():
        start = 0
        for site in sites:
            position[site] = (key, start, columns)
            start += model_nodes[site]["fn"].event_shape.numel()
        columns += joints[key].cov_factor.shape[-1]
    locs, variances, rows = [], [], []
    for name, fn in zip(names, fns, strict=True):
        size = fn.event_shape.numel()
        row = torch.zeros(size, columns, **where)
        if name in position:
            key, start, first = position[name]
            joint = joints[key]
            locs.append(joint.loc[start : start + size])
            variances.append(joint.cov_diag[start : start + size])
            row[:, first : first + joint.cov_factor.shape[-1]] = joint.cov_factor[
                start : start + size
            ]
        else:
            normal = _diagonal_normal([fn])
            if normal is None:
                return None
            loc = collapse_broadcast(normal.base_dist.loc, 1)
            scale = collapse_broadcast(normal.base_dist.scale, 1)
            if loc.shape[:-1].numel() != 1 or scale.shape[:-1].numel() != 1:
                return None  # a prior with batch dims of its own: left to Monte Carlo
            locs.append(loc.reshape(-1))
            variances.append(scale.reshape(-1).pow(2))
        rows.append(row)
    return dist.LowRankMultivariateNormal(torch.cat(locs), torch.cat(rows), torch.cat(variances))


class ELBOTerms(NamedTuple):
    r"""One estimate of the annealed objective and its parts, all for the whole data set.

    Attributes:
        loss: :math:`-\mathcal{L}_\beta`, the differentiable scalar to minimise.
        nll: Expected negative log-likelihood, :math:`-\mathbb{E}_q \sum_i \log p(y_i|w)`.
        kl: :math:`\mathrm{KL}(q \| p)`, unweighted by β (closed form or one-sample MC).
        beta: The β used.
        sites: Each site's contribution: its scaled log-likelihood (observed sites) or its
            KL term (latent sites), for diagnostics such as locating a NaN.
    """

    loss: torch.Tensor
    nll: torch.Tensor
    kl: torch.Tensor
    beta: float
    sites: dict[str, torch.Tensor]


def _total(terms: list[torch.Tensor]) -> torch.Tensor:
    """The sum of scalar terms, in one op for many."""
    if not terms:
        return torch.zeros(())
    if len(terms) == 1:
        return terms[0]
    return torch.stack(terms).sum()


def _signature(fn: object) -> tuple:
    base = getattr(fn, "base_dist", None)
    if base is None:
        return (type(fn),)
    return (type(fn), getattr(fn, "reinterpreted_batch_ndims", None), *_signature(base))


class AnnealedELBO(ELBO):
    r"""The β-weighted ELBO with closed-form KL where one exists.

    .. math::

        -\text{loss} = \frac{1}{S}\sum_{s=1}^S \Big[\log p(y \mid w_s) - \beta \sum_{k}
            \mathrm{KL}_k\Big], \qquad w_s \sim q

    where :math:`\mathrm{KL}_k = \mathrm{KL}(q_k \| p_k)` in closed form when registered, else
    :math:`\log q_k(w_s) - \log p_k(w_s)`. With ``num_particles = S > 1`` the particles are
    drawn in one vectorised pass (a ``pyro.plate`` left of the model's plates), never a
    Python loop. Under an :class:`~pyro_bbb.infer.Ensemble` the model runs inside the
    members' plate and the estimate is the sum of the members' own. Works with
    ``pyro.infer.SVI`` and any reparameterised guide, including
    Pyro's autoguides (whose ``Delta`` sites get the Monte Carlo KL).

    Args:
        beta: Initial KL weight, ≥ 0; :func:`~pyro_bbb.fit` updates :attr:`beta` at each step.
        num_particles: Samples of ``w`` per estimate.
        max_plate_nesting: The model's plate depth; guessed from a first trace if omitted
            (a :class:`~pyro_bbb.BNN` declares 1).
        analytic_kl: Use closed-form KL terms where registered. ``False`` forces Monte Carlo.
    """

    def __init__(
        self,
        beta: float = 1.0,
        *,
        num_particles: int = 1,
        max_plate_nesting: int | None = None,
        analytic_kl: bool = True,
    ) -> None:
        check_int("num_particles", num_particles)
        super().__init__(
            num_particles=num_particles,
            vectorize_particles=True,
            max_plate_nesting=float("inf") if max_plate_nesting is None else max_plate_nesting,
        )
        self.beta = beta
        self.analytic_kl = analytic_kl
        self._has_closed_form: dict[tuple, bool] = {}

    def set_num_particles(self, num_particles: int) -> None:
        """Change the number of particles after the first evaluation, keeping its set-up.

        The first evaluation fixes ``max_plate_nesting``, and Pyro counts the particle plate
        in it only when there is more than one particle; it is moved by that one dim here,
        so the particles' plate stays left of every model plate.

        Args:
            num_particles: Samples of ``w`` per estimate from now on.
        """
        check_int("num_particles", num_particles)
        before = self.particle_plate_dims
        self.num_particles = num_particles
        if self.max_plate_nesting != float("inf"):
            self.max_plate_nesting += self.particle_plate_dims - before

    @property
    def particle_plate_dims(self) -> int:
        """Dims the vectorised particles add to the model's plates: 1 for more than one.

        Pyro wraps no particle plate around a single particle, and counts the plate in
        ``max_plate_nesting`` only when it wraps one.
        """
        return int(self.num_particles > 1)

    @property
    def beta(self) -> float:
        """The current KL weight."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = check_nonnegative_number("beta", value)

    # -- traces
    def _traces(self, model, guide, args, kwargs):
        model, declared = model_in_plates(model, guide)  # an ensemble's model: in its plate
        if self.max_plate_nesting == float("inf"):
            if declared is not None:
                self.max_plate_nesting = declared + self.particle_plate_dims
            else:
                self._guess_max_plate_nesting(model, guide, args, kwargs)
        guide = self._vectorized_num_particles(guide)
        model = self._vectorized_num_particles(model)
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(
            *args, **kwargs
        )
        return model_trace, guide_trace

    def _get_trace(self, model, guide, args, kwargs):
        model_trace, guide_trace = self._traces(model, guide, args, kwargs)
        return model_trace, guide_trace

    def _closed_form_kl(self, q, p) -> torch.Tensor | None:
        # Pyro registers KL(δ_v ‖ p) = -log p(v), which drops the Delta's log_density: under
        # an autoguide, the log-Jacobian of a constrained site's transform (AutoNormal on a
        # LogNormal latent). The Monte Carlo term log δ_v(v) - log p(v) keeps it.
        if not self.analytic_kl or is_point_mass(q):
            return None
        fast = diagonal_normal_kl(q, p)
        if fast is not None:
            return fast
        key = (_signature(q), _signature(p))
        if self._has_closed_form.get(key) is False:
            return None
        try:
            kl = kl_divergence(q, p)
        except NotImplementedError:
            self._has_closed_form[key] = False
            return None
        self._has_closed_form[key] = True
        return kl

    def terms(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> ELBOTerms:
        """Estimate the objective and its parts from one (vectorised) draw.

        Args:
            model: The Pyro model.
            guide: The guide; every latent site must be reparameterised.
            *args: The model's arguments (e.g. a minibatch ``x, y``).
            **kwargs: The model's keyword arguments.

        Returns:
            :class:`ELBOTerms` for this estimate.

        Raises:
            NotImplementedError: For a guide site without ``rsample``.
            ValueError: For a model latent site the guide does not sample.
        """
        model_trace, guide_trace = self._traces(model, guide, args, kwargs)
        log_liks: list[torch.Tensor] = []
        kls: list[torch.Tensor] = []
        sites: dict[str, torch.Tensor] = {}
        guide_nodes = guide_trace.nodes
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site):
                continue
            if site["is_observed"]:
                term = self._log_prob(site)
                log_liks.append(term)
                sites[name] = term
            elif name not in guide_nodes:
                raise ValueError(
                    f"model site {name!r} is latent but the guide does not sample it; every "
                    "latent site needs a guide site of the same name"
                )
        covered: set[str] = set()
        for name, site in guide_nodes.items():
            if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
                continue
            if name in covered:
                continue
            if not site["fn"].has_rsample:
                raise NotImplementedError(
                    f"guide site {name!r} ({type(site['fn']).__name__}) is not "
                    "reparameterisable; AnnealedELBO needs rsample (use Trace_ELBO for "
                    "score-function gradients)"
                )
            model_site = model_trace.nodes.get(name)
            if model_site is None:
                if not site["infer"].get("is_auxiliary"):
                    raise ValueError(f"guide site {name!r} is not in the model")
                term = self._group_kl(site, model_trace)
                if term is None:
                    term = self._log_prob(site)
                else:
                    covered.update(site["infer"][JOINT_KEY])
            elif isinstance(model_site["fn"], SiteConditional) and (
                block := self._block_kl(model_site["fn"], model_trace, guide_nodes)
            ):
                term, names = block
                covered.update(names)
            else:
                term = self._kl_term(site, model_site)
            kls.append(term)
            sites[name] = term
        nll = -_total(log_liks)
        kl = _total(kls)
        if self.num_particles > 1:
            nll, kl = nll / self.num_particles, kl / self.num_particles
        return ELBOTerms(nll + self.beta * kl, nll, kl, self.beta, sites)

    def _group_kl(self, aux_site, model_trace) -> torch.Tensor | None:
        """Closed-form KL of a guide block that joins several model sites, if available."""
        names = aux_site["infer"].get(JOINT_KEY)
        if not names or any(name not in model_trace.nodes for name in names):
            return None
        prior = _flat_prior(names, model_trace.nodes)
        if prior is None:
            return None
        return self._scaled_kl(aux_site, aux_site["fn"], prior)

    def _block_kl(self, fn, model_trace, guide_nodes) -> tuple[torch.Tensor, list[str]] | None:
        """Closed-form KL of a prior block whose guide sites are independent Normals.

        The sites are those the model drew from ``fn``'s block; their guide sites must be
        plain (reinterpreted) Normals, as a mean-field guide draws them.
        """
        if not self.analytic_kl:
            return None
        names = [
            name
            for name, node in model_trace.nodes.items()
            if isinstance(node.get("fn"), SiteConditional) and node["fn"].block is fn.block
        ]
        guide_sites = [guide_nodes.get(name) for name in names]
        if any(site is None or site["infer"].get(JOINT_KEY) for site in guide_sites):
            return None
        q = _diagonal_normal([site["fn"] for site in guide_sites])
        prior = None if q is None else _flat_prior(names, model_trace.nodes)
        if prior is None:
            return None
        term = self._scaled_kl(guide_sites[0], q, prior)
        return None if term is None else (term, names)

    def _scaled_kl(self, guide_site, q, p) -> torch.Tensor | None:
        closed = self._closed_form_kl(q, p)
        if closed is None:
            return None
        if closed.shape != q.batch_shape:
            closed = closed.expand(q.batch_shape)
        return scale_and_mask(closed, guide_site["scale"], guide_site["mask"]).sum()

    def _kl_term(self, guide_site, model_site) -> torch.Tensor:
        q, p = guide_site["fn"], model_site["fn"]
        closed = self._closed_form_kl(q, p)
        if closed is not None:
            return scale_and_mask(closed, guide_site["scale"], guide_site["mask"]).sum()
        return self._log_prob(guide_site) - self._log_prob(model_site)

    @staticmethod
    def _log_prob(site) -> torch.Tensor:
        log_p = site["fn"].log_prob(site["value"])
        return scale_and_mask(log_p, site["scale"], site["mask"]).sum()

    # -- the pyro.infer.ELBO interface
    def differentiable_loss(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """The negative annealed ELBO as a differentiable scalar."""
        return self.terms(model, guide, *args, **kwargs).loss

    def loss(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> float:
        """The negative annealed ELBO as a float, without gradients."""
        with torch.no_grad():
            return self.terms(model, guide, *args, **kwargs).loss.item()

    def loss_and_grads(
        self, model: Callable[..., Any], guide: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> float:
        """Compute the loss and backpropagate it into the parameters (for ``pyro.infer.SVI``)."""
        loss = self.terms(model, guide, *args, **kwargs).loss
        if loss.requires_grad:
            loss.backward()
        return loss.item()
