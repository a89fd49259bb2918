r"""Priors made from a trained guide: yesterday's posterior is today's prior.

Bayes' rule is recursive, :math:`p(w \mid A \cup B) \propto p(B \mid w)\, p(w \mid A)`, so a
guide :math:`q_A(w) \approx p(w \mid A)` trained on one data set is the prior for the next
(variational continual learning, Nguyen et al. 2018, https://arxiv.org/abs/1710.10628).
:func:`from_guide` turns a trained guide into a prior specification, a mapping from site names
to per-site priors that goes wherever a prior goes (``mlp(..., prior=)``, ``bayesianize``, a
mapping of patterns):

* a :class:`NormalPosterior` per site from a mean-field guide (:class:`~pyro_bbb.MeanFieldGuide`,
  Pyro's ``AutoNormal``): independent Normals with the guide's means and standard deviations;
* a :class:`BlockPosterior` per site from a :class:`~pyro_bbb.LowRankGuide`: the sites of each
  of its blocks share one :class:`~pyro_bbb.priors.gaussian_block.GaussianBlock`, drawn site by site
  from exact conditionals;
* the same from a guide whose blocks are Gaussians in precision form
  (:class:`~pyro_bbb.priors.precision_normal.LowRankPrecisionNormal`, e.g. the belief of an
  online filter, :class:`~pyro_bbb.online.LowRankPrecisionGuide`): the sites share one
  :class:`~pyro_bbb.priors.precision_block.PrecisionBlock`.

The tensors are copied and detached: training another guide leaves the prior as it was. This
module reads guides by what they expose (``posterior()``, ``block_sites``, AutoNormal's
``locs`` and ``scales``) and imports nothing of :mod:`pyro_bbb.infer`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from operator import attrgetter

import pyro.distributions as dist
import torch

from .._pyro_compat import pyro_name
from .._support import base_support, independent_base, is_real_valued
from .gaussian_block import GaussianBlock, SiteConditional
from .precision_block import PrecisionBlock
from .precision_normal import LowRankPrecisionNormal

__all__ = ["BlockPosterior", "NormalPosterior", "PosteriorPrior", "from_guide"]


def _check_shape(site: str, expected: torch.Size, shape: torch.Size) -> None:
    if torch.Size(shape) != expected:
        raise ValueError(
            f"site {site!r} has shape {tuple(expected)} in the guide the prior was made from "
            f"(from_guide) but {tuple(shape)} in this model; the sites a carried prior covers "
            "must keep their shapes"
        )


class NormalPosterior:
    r"""Independent Normals :math:`\mathcal{N}(\mu_i, \sigma_i^2)` for one site, one per weight.

    ``cacheable``: a layer builds its distribution once per device and dtype, so treat it as
    immutable (assign a new prior to the layer rather than changing this one's tensors).

    Args:
        site: The site's name (for error messages).
        loc: :math:`\mu`, of the site's shape.
        scale: :math:`\sigma`, of the site's shape, positive.
    """

    cacheable = True

    def __init__(self, site: str, loc: torch.Tensor, scale: torch.Tensor) -> None:
        if loc.shape != scale.shape:
            raise ValueError(
                f"site {site!r}: loc {tuple(loc.shape)} and scale {tuple(scale.shape)} differ"
            )
        self.site = site
        self.loc = loc.detach().clone()
        self.scale = scale.detach().clone()

    @property
    def initial_loc(self) -> torch.Tensor:
        """Where a guide's mean for this site starts by default: the posterior mean."""
        return self.loc

    def site_distribution(
        self, shape: torch.Size, *, fan_in: int, device: torch.device, dtype: torch.dtype
    ) -> dist.TorchDistribution:
        """``Normal(loc, scale)`` on ``device``, one event of the site's shape.

        Raises:
            ValueError: If ``shape`` is not the site's shape in the guide.
        """
        _check_shape(self.site, self.loc.shape, shape)
        loc, scale = (t.to(device=device, dtype=dtype) for t in (self.loc, self.scale))
        return dist.Normal(loc, scale).to_event(len(shape))

    def __repr__(self) -> str:
        return f"NormalPosterior({self.site!r}, shape={tuple(self.loc.shape)})"


class BlockPosterior:
    """One site of a joint Gaussian block: its conditional given the block's sites drawn before.

    Not ``cacheable``: the distribution depends on those values. A Bayesian layer passes them
    as ``drawn`` (the sites named in :attr:`joint_sites` that this run of the model has drawn
    already); see :class:`~pyro_bbb.priors.gaussian_block.GaussianBlock` (covariance form) and
    :class:`~pyro_bbb.priors.precision_block.PrecisionBlock` (precision form) for the algebra.

    Args:
        site: The site's name.
        block: The block it belongs to: a ``GaussianBlock`` or a ``PrecisionBlock``.
    """

    cacheable = False

    def __init__(self, site: str, block: GaussianBlock | PrecisionBlock) -> None:
        if site not in block.sites:
            raise ValueError(f"site {site!r} is not in {block!r}")
        self.site, self.block = site, block

    @property
    def joint_sites(self) -> tuple[str, ...]:
        """The other sites of the block, whose drawn values the distribution depends on."""
        return tuple(name for name in self.block.sites if name != self.site)

    @property
    def initial_loc(self) -> torch.Tensor:
        """Where a guide's mean for this site starts by default: the marginal posterior mean."""
        return self.block.site_loc(self.site)

    def site_distribution(
        self,
        shape: torch.Size,
        *,
        fan_in: int,
        device: torch.device,
        dtype: torch.dtype,
        drawn: Mapping[str, torch.Tensor] | None = None,
    ) -> SiteConditional | dist.TorchDistribution:
        """The site's conditional given the values in ``drawn``, one event of its shape.

        Raises:
            ValueError: If ``shape`` is not the site's shape in the guide.
        """
        _check_shape(self.site, self.block.sites[self.site], shape)
        return self.block.conditional(self.site, drawn or {}, device=device, dtype=dtype)

    def __repr__(self) -> str:
        return f"BlockPosterior({self.site!r}, {self.block!r})"


class PosteriorPrior(Mapping):
    """A trained guide's posterior as a prior specification: one prior per site, by name.

    A read-only mapping ``{site name: prior}`` usable wherever a prior specification is; a
    site without an entry raises when the model is built, naming it. Combine it with priors
    for new sites as with any mapping: ``{**from_guide(guide), "head.*": Gaussian(1.0)}``.

    Args:
        priors: ``{site name: NormalPosterior | BlockPosterior}``.
        source: What the posterior came from, for ``repr`` and error messages.
    """

    def __init__(self, priors: Mapping[str, object], *, source: str = "a guide") -> None:
        self._priors = dict(priors)
        self.source = source

    def __getitem__(self, site: str) -> object:
        return self._priors[site]

    def __iter__(self) -> Iterator[str]:
        return iter(self._priors)

    def __len__(self) -> int:
        return len(self._priors)

    def means(self) -> dict[str, torch.Tensor]:
        """The posterior mean of every site, ``{site: tensor of the site's shape}``."""
        return {site: prior.initial_loc for site, prior in self._priors.items()}

    def __repr__(self) -> str:
        return f"PosteriorPrior(from {self.source}: sites {list(self._priors)})"


def from_guide(guide: object) -> PosteriorPrior:
    r"""A prior specification whose distribution for each site is a trained guide's posterior.

    Use it as the prior of the next model, for the next batch of data or the next task:
    ``mlp(sizes, prior=from_guide(guide))`` or ``bayesianize(net, prior={**from_guide(guide),
    "head.*": Gaussian(1.0)})``. The KL divergence of a new guide from it is computed in closed
    form: a mean-field guide against independent Normals, a low-rank guide against a low-rank
    block (by the matrix determinant lemma). A guide for a model with this prior starts its
    means at the posterior means by default (the practice of variational continual learning,
    Nguyen et al. 2018) and its scales at its own ``init_scale``, small by default, not at the
    posterior's.

    The sites are named as the network names them, without the guide's model's name
    (``"0.weight"`` for the site ``"a.0.weight"`` of ``BNN(..., name="a")``), so that the
    prior goes to a network of any model.

    Args:
        guide: A trained :class:`~pyro_bbb.MeanFieldGuide` or :class:`~pyro_bbb.LowRankGuide`,
            Pyro's ``AutoNormal``, a guide whose ``posterior()`` returns
            ``{site: Normal(loc, scale).to_event(k)}``, or one with ``block_sites`` whose
            ``posterior()`` returns a ``LowRankMultivariateNormal`` or a
            :class:`~pyro_bbb.priors.precision_normal.LowRankPrecisionNormal` per block (the
            online filters' :class:`~pyro_bbb.online.LowRankPrecisionGuide`).

    Returns:
        A :class:`PosteriorPrior`: :class:`NormalPosterior` per site for mean-field guides,
        :class:`BlockPosterior` per site of each low-rank block.

    Raises:
        ValueError: If the guide has no parameters yet, or a site is not real-valued or its
            posterior is not Gaussian.
        TypeError: If the guide exposes none of the above.
    """
    kind = type(guide).__name__
    if getattr(guide, "prototype_trace", ...) is None:
        raise ValueError(
            f"from_guide: the {kind} has no parameters yet; train it with fit (or call it once "
            "with the model's arguments) before using its posterior as a prior"
        )
    prefix = _model_prefix(guide)
    if hasattr(guide, "block_sites") and callable(getattr(guide, "posterior", None)):
        priors = _from_blocks(guide.posterior(), guide.block_sites, prefix)
    elif callable(getattr(guide, "posterior", None)):
        priors = _from_marginals(guide.posterior(), prefix)
    elif hasattr(guide, "locs") and hasattr(guide, "scales"):
        priors = _from_auto_normal(guide, prefix)
    else:
        raise TypeError(
            "from_guide needs a trained MeanFieldGuide, LowRankGuide or AutoNormal, or a guide "
            f"whose posterior() returns {{site: Normal}}; got {kind}"
        )
    return PosteriorPrior(priors, source=kind)


def _model_prefix(guide) -> str:
    """The name prefix of the guide's model (``"a."`` for ``BNN(..., name="a")``), or ``""``.

    Priors are given to a network by the names of its own sites (``"0.weight"``); a model's
    name goes in front of them only when it runs, so a carried prior leaves it out.
    """
    model = getattr(guide, "model", None)
    name = pyro_name(model) if isinstance(model, torch.nn.Module) else ""
    return f"{name}." if isinstance(name, str) and name else ""


def _relative(site: str, prefix: str) -> str:
    return site[len(prefix) :] if prefix and site.startswith(prefix) else site


def _normal_parts(site: str, fn: dist.TorchDistribution) -> tuple[torch.Tensor, torch.Tensor]:
    base = independent_base(fn)
    if not isinstance(base, torch.distributions.Normal):
        raise ValueError(
            f"from_guide: the posterior of site {site!r} is a {type(fn).__name__}, not a "
            "Gaussian; only Gaussian posteriors can be carried as priors"
        )
    shape = fn.batch_shape + fn.event_shape
    return base.loc.expand(shape), base.scale.expand(shape)


def _from_marginals(
    posterior: Mapping[str, dist.TorchDistribution], prefix: str
) -> dict[str, object]:
    priors = {}
    for site, fn in posterior.items():
        name = _relative(site, prefix)
        priors[name] = NormalPosterior(name, *_normal_parts(site, fn))
    return priors


def _from_blocks(
    posterior: Mapping[str, dist.TorchDistribution],
    layout: Mapping[str, Mapping[str, torch.Size]],
    prefix: str,
) -> dict[str, object]:
    priors: dict[str, object] = {}
    for name, layout_sites in layout.items():
        fn = posterior[name]  # a LowRankMultivariateNormal, or one in precision form
        sites = {_relative(site, prefix): shape for site, shape in layout_sites.items()}
        if isinstance(fn, LowRankPrecisionNormal):
            block = PrecisionBlock(fn.loc, fn.precision_factor, fn.precision_diag, sites)
        else:
            block = GaussianBlock(fn.loc, fn.cov_factor, fn.cov_diag, sites)
        priors.update({site: BlockPosterior(site, block) for site in sites})
    return priors


def _from_auto_normal(guide, prefix: str) -> dict[str, object]:
    observed = getattr(getattr(guide, "model", None), "observation_site", None)
    priors: dict[str, object] = {}
    with torch.no_grad():
        for site, node in guide.prototype_trace.iter_stochastic_nodes():
            if site == observed:
                continue
            if not is_real_valued(node["fn"]):
                raise ValueError(
                    f"from_guide: site {site!r} has support {base_support(node['fn'])}; only "
                    "real-valued sites can carry a Gaussian posterior as their prior"
                )
            loc = attrgetter(site)(guide.locs)
            scale = attrgetter(site)(guide.scales)
            name = _relative(site, prefix)
            priors[name] = NormalPosterior(name, loc, scale)
    return priors
