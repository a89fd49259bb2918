"""What this package's guides share, and the class tree that says what each one is.

* :class:`SiteGuide`: the base. Its parameters are built at set-up from the model's latent
  sites and their initial means (:meth:`SiteGuide._build`); it says what each site's
  marginal ``(loc, scale)`` is, and turns that into ``marginals()`` and ``median()``; it keeps
  the init options and naming in one place.
* :class:`SiteWiseGuide`: one distribution per site, drawn site by site
  (:class:`~pyro_bbb.MeanFieldGuide`, :class:`~pyro_bbb.infer.guides.delta.DeltaGuide`).
* :class:`GaussianGuide`: Gaussian marginals, so ``quantiles()``
  (:class:`~pyro_bbb.MeanFieldGuide`, :class:`~pyro_bbb.LowRankGuide`).

**Members.** A guide can hold the ``K`` members of an ensemble
(:class:`~pyro_bbb.infer.ensemble.Ensemble`) at once: every parameter then carries a leading
member shape ``(K, 1, ..., 1)`` (the ones stand for the model's plates, so that the sites'
batch shape fits a plate of members left of them) and the members start from independent
initial means. A subclass builds its parameters from initial means that carry that shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.infer.autoguide import AutoGuide

from ..._pyro_compat import join_name, pyro_name, set_pyro_name
from ..._random_state import seeded
from ...nn.layers import fresh_initial_values, initial_values, layers_that_run
from ._init import InitLoc, global_latent_sites, initial_locs
from ._params import taking_fitted

__all__ = ["GaussianGuide", "SiteGuide", "SiteWiseGuide", "seeded_draws", "site_guide"]


def site_guide(guide: object) -> SiteGuide | None:
    """The package's guide behind ``guide``: itself, an ensemble's members, or ``None``."""
    for candidate in (guide, getattr(guide, "members", None)):
        if isinstance(candidate, SiteGuide):
            return candidate
    return None


@contextmanager
def seeded_draws(guide: object, seed: int | None, *args: Any) -> Iterator[None]:
    """Draws of ``guide`` inside come from ``seed``; the caller's random state is kept.

    Pyro's autoguides, this package's guides and an ensemble's members build their
    parameters on their first call, which runs the model once and so draws from its priors.
    A guide without parameters yet builds them first, from the caller's stream as any first
    call does, so that the seed's draws are the block's alone: a fresh guide's first seeded
    prediction is the one every later call gives.

    Args:
        guide: A guide (an :class:`~pyro_bbb.infer.Ensemble` builds its members), or
            anything else, left as it is.
        seed: The draws' seed, or ``None`` to draw from the current state.
        *args: The model's arguments (their CUDA devices' random states are kept too).
    """
    target = getattr(guide, "members", guide)
    if isinstance(target, AutoGuide) and target.prototype_trace is None:
        with poutine.block():
            target._setup_prototype(*args)
    with seeded(seed, *args, guide):
        yield


class SiteGuide(AutoGuide):
    """Base of this package's guides: parameters built from the model's latent sites.

    Args:
        model: The Pyro model.
        init_loc: Initial means (see :func:`~pyro_bbb.infer.guides._init.initial_locs`).
        name: Prefix in Pyro's param store (default: the class name).
        create_plates: Passed to :class:`~pyro.infer.autoguide.AutoGuide`.
    """

    def __init__(
        self,
        model: Callable[..., Any],
        *,
        init_loc: InitLoc = None,
        name: str | None = None,
        create_plates: Callable[..., Any] | None = None,
    ) -> None:
        super().__init__(model, create_plates=create_plates)
        # Not a submodule: a pretrained network only lends its values, so it must neither
        # move with guide.to() nor enter the guide's state_dict.
        object.__setattr__(self, "_init_loc", init_loc)
        if name is not None:
            set_pyro_name(self, name)

    #: ``(K, 1, ..., 1)`` for the members of an ensemble, ``()`` for a single guide.
    member_shape: tuple[int, ...] = ()

    #: What each module of parameters holds, by attribute: ``"loc"`` (means, in the
    #: weights' units), ``"scale"`` (ρ, :math:`\sigma = \mathrm{softplus}(\rho)`, in units
    #: of :math:`\log\sigma` where σ is small) or ``"factor"`` (a low-rank factor, in the
    #: weights' units). A subclass lists its own.
    parameter_kinds: ClassVar[dict[str, str]] = {"locs": "loc"}

    def parameter_roles(self) -> dict[str, tuple[str, str]]:
        """What each parameter of the guide is, by its name in Pyro's param store.

        Read by :mod:`pyro_bbb.training.rates`, which gives each kind a rate on its own
        scale.

        Returns:
            ``{param-store name: (kind, key)}``: the kind (:attr:`parameter_kinds`) and the
            site or block the parameter belongs to (``"fc1.weight"``; a low-rank block's
            name, ``"fc1"``). Empty before the guide is set up.
        """
        keys = getattr(self, "_params", None) or {}
        roles = {}
        for attribute, kind in self.parameter_kinds.items():
            root = getattr(self, attribute, None)
            if root is None:
                continue
            paths = getattr(self, "param_paths", {})  # a block's, where not its name
            for key in keys:
                roles[join_name(pyro_name(root), paths.get(key, key))] = (kind, key)
        return roles

    def _setup_prototype(self, *args, **kwargs) -> None:
        with layers_that_run() as layers:  # a model function's, which it has no other way to
            super()._setup_prototype(*args, **kwargs)  # show: their initial values start us
        sites = global_latent_sites(self.prototype_trace, type(self).__name__, self.model)
        network = self.model if isinstance(self.model, torch.nn.Module) else layers
        locs = initial_locs(self.model, sites, self._init_loc, network=network)
        if self.member_shape:
            locs = self._member_locs(locs, sites, network)
        with taking_fitted(type(self).__name__, pyro_name(self)):  # warns if it takes a fit's
            self._build(sites, locs)

    def _member_locs(
        self,
        locs: dict[str, torch.Tensor],
        sites: dict[str, dict],
        network: torch.nn.Module | list[torch.nn.Module],
    ) -> dict[str, torch.Tensor]:
        """Initial means of ``K`` members, ``{site: (*member_shape, *site shape)}``.

        Member 0 starts where a single guide would; the others from fresh draws of torch's
        default initialisation of each affine layer (:func:`~pyro_bbb.nn.fresh_initial_values`)
        of ``network`` (the model, or the layers a model function ran). A site outside the
        affine layers starts at the same value in every member; in a model function, where
        it starts at its prototype draw, the other members start at fresh draws of its prior.
        """
        count = self.member_shape[0]
        fresh = [fresh_initial_values(network) for _ in range(count - 1)]
        if not isinstance(self.model, torch.nn.Module):
            known = initial_values(network)
            for draw in fresh:
                for name, site in sites.items():
                    if name not in draw and name not in known:
                        draw[name] = site["fn"].sample().detach()
        draws = [locs, *fresh]
        return {
            name: torch.stack([draw.get(name, loc).to(loc) for draw in draws]).reshape(
                *self.member_shape, *loc.shape
            )
            for name, loc in locs.items()
        }

    def _build(self, sites: dict[str, dict], locs: dict[str, torch.Tensor]) -> None:
        """Create the parameters from the latent sites and their initial means.

        Each mean has the site's shape, with :attr:`member_shape` in front.
        """
        raise NotImplementedError

    def _marginals(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """``{site: (loc, scale)}`` of each site's Gaussian marginal, site-shaped."""
        raise NotImplementedError

    @torch.no_grad()
    def marginals(self, *args, **kwargs) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Mean and standard deviation of every site's Gaussian marginal.

        Takes the model's arguments only if the guide has not been called yet.

        Returns:
            ``{site: (loc, scale)}``, each a detached tensor of the site's shape.
        """
        self._require_setup(*args, **kwargs)
        return {
            site: (loc.detach().clone(), scale.detach().clone())
            for site, (loc, scale) in self._marginals().items()
        }

    @torch.no_grad()
    def median(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Posterior median (= mean) of every site, ``{site: tensor of the site's shape}``.

        Takes the model's arguments only if the guide has not been called yet.
        """
        self._require_setup(*args, **kwargs)
        return {site: loc.detach().clone() for site, (loc, _) in self._marginals().items()}

    def _require_setup(self, *args, **kwargs) -> None:
        if self.prototype_trace is None and args:
            self._setup_prototype(*args, **kwargs)
        if self.prototype_trace is None:
            raise RuntimeError(
                f"{type(self).__name__} has no parameters yet: call it (or fit) with the "
                "model's arguments first, or pass them to median()/quantiles()"
            )


class SiteWiseGuide(SiteGuide):
    """A guide with one distribution per latent site, drawn site by site.

    A subclass builds ``_event_dims`` (``{site: event dims}``) in :meth:`_build` and gives
    each site's distribution in :meth:`site_distribution`.
    """

    _event_dims: dict[str, int]

    def site_distribution(self, name: str) -> dist.TorchDistribution:
        """The guide's distribution of one site, one event of the site's shape."""
        raise NotImplementedError

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Draw every latent site; takes the model's arguments.

        Returns:
            ``{site name: sample}``; under a particle plate each sample has leading sample
            dims ``(num_particles, 1, *shape)``.
        """
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        return {name: pyro.sample(name, self.site_distribution(name)) for name in self._event_dims}


class GaussianGuide(SiteGuide):
    """A guide whose every site has a Gaussian marginal, so its quantiles are Normal ones."""

    @torch.no_grad()
    def quantiles(
        self, quantiles: Sequence[float] | torch.Tensor, *args, **kwargs
    ) -> dict[str, torch.Tensor]:
        """Marginal posterior quantiles of every site.

        Args:
            quantiles: Levels in ``(0, 1)``, e.g. ``[0.05, 0.5, 0.95]``.
            *args: The model's arguments, only if the guide has not been called yet.
            **kwargs: Likewise.

        Returns:
            ``{site: tensor (len(quantiles), *site shape)}``.
        """
        self._require_setup(*args, **kwargs)
        result = {}
        for site, (loc, scale) in self._marginals().items():
            q = quantile_levels(quantiles, loc)
            result[site] = dist.Normal(loc, scale).icdf(q.reshape(-1, *([1] * loc.dim())))
        return result


def quantile_levels(quantiles: Sequence[float] | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The levels as a tensor of ``like``'s dtype and device, checked to lie in ``(0, 1)``.

    Raises:
        ValueError: On a level outside ``(0, 1)``.
    """
    q = torch.as_tensor(quantiles, dtype=like.dtype, device=like.device)
    if ((q <= 0) | (q >= 1)).any():
        raise ValueError(f"quantiles must lie in (0, 1), got {q.tolist()}")
    return q
