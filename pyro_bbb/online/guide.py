r"""The belief of an online filter as a Pyro guide: a Gaussian in precision form.

:class:`LowRankPrecisionGuide` is a Pyro autoguide over every latent weight of a model as one
block, :math:`q(\theta) = \mathcal{N}(\mu, (\Upsilon + WW^\top)^{-1})`
(:class:`~pyro_bbb.priors.precision_normal.LowRankPrecisionNormal`). Like Pyro's
``AutoLowRankMultivariateNormal`` it draws the block as one auxiliary site and hands each
model site its slice as a ``Delta``, so everything that takes a guide takes it: ``predict``,
``compare``, ``to_inference_data``, ``save``/``load``, ``Predictive``, and
:func:`~pyro_bbb.priors.from_guide` (a :class:`~pyro_bbb.priors.precision_block.PrecisionBlock`
prior, exact).

The belief is updated in closed form by a filter (:mod:`pyro_bbb.online.lofi`,
:mod:`pyro_bbb.online.rvga`), not by gradients, so it is held in buffers, not in Pyro's
param store: it moves with ``.to()``, is saved by ``save``, and two guides in one process
never share it. ``fit`` trains nothing of it; to go on with ``fit``, carry it as a prior with
``from_guide``. Before it is set up (its first call, as every Pyro autoguide) it holds the
model's prior, or the belief last given to :meth:`LowRankPrecisionGuide.set_belief`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide import AutoGuide

from .._pyro_compat import tensor_version
from ..infer.guides._init import InitLoc, global_latent_sites, initial_locs
from ..priors.precision_normal import CovarianceRootNormal, LowRankPrecisionNormal
from .network import gaussian_prior

__all__ = ["CovarianceRoot", "LowRankPrecisionGuide"]

Belief = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``(loc (d,), precision_factor (d, r), precision_diag (d,))``."""


class CovarianceRoot(NamedTuple):
    """A full-rank belief by its mean ``(d,)`` and any square root ``(d, d)`` of its covariance."""

    loc: torch.Tensor
    covariance_root: torch.Tensor


BLOCK = "network"


class LowRankPrecisionGuide(AutoGuide):
    r"""A Gaussian over all latent weights with a diagonal-plus-low-rank precision.

    .. math::

        q(\theta) = \mathcal{N}\big(\mu,\; (\Upsilon + WW^\top)^{-1}\big), \qquad
        \Upsilon = \mathrm{diag}(\upsilon) \succ 0,\; W \in \mathbb{R}^{d \times r},

    over the concatenation :math:`\theta` of the model's latent sites in the order the model
    draws them (one block, ``"network"``). Buffers: ``loc`` ``(d,)``, ``precision_diag``
    ``(d,)`` and ``precision_factor`` ``(d, r)``. At set-up (the first call) the belief is
    the model's prior, :math:`\Upsilon = \mathrm{diag}(1/s^2)` and :math:`W = 0` for a
    Gaussian prior of variances :math:`s^2`, with the mean at ``init_loc``; a belief given
    to :meth:`set_belief` before replaces it.

    Args:
        model: The Pyro model, e.g. a :class:`~pyro_bbb.BNN` whose weights have Gaussian
            priors.
        rank: ``r``, the columns of :math:`W`, ``>= 0``; ``None`` for ``d`` (a full
            precision, as :class:`~pyro_bbb.online.RVGA` needs).
        init_loc: The starting mean: ``None`` for the network's own initialisation (a
            symmetric start at the prior mean 0 gives hidden units identical gradients that
            never separate), a pretrained ``nn.Module``, or ``{site: tensor}``.
        create_plates: Passed to :class:`~pyro.infer.autoguide.AutoGuide`.

    Attributes:
        default_predictive: ``"linearised"``: what :func:`~pyro_bbb.predict` uses for this
            guide unless told otherwise. The belief comes from Gauss-Newton curvature, so it
            describes the network linearised at its mean (Immer, Korzepa and Bauer 2021);
            the network run at its draws under-fits (measured in ``docs/online.md``).

    Raises:
        ValueError: On a negative rank, and at set-up on a prior that is not a Gaussian with
            independent values.
    """

    default_predictive = "linearised"

    def __init__(
        self,
        model: Callable[..., Any],
        *,
        rank: int | None = 10,
        init_loc: InitLoc = None,
        create_plates: Callable[..., Any] | None = None,
    ) -> None:
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
            raise ValueError(f"rank must be an int >= 0 or None (full rank), got {rank!r}")
        super().__init__(model, create_plates=create_plates)
        self.rank = rank
        # Not a submodule: a pretrained network only lends its values.
        object.__setattr__(self, "_init_loc", init_loc)
        self._pending: Belief | None = None
        self._source: Callable[[], Belief | CovarianceRoot | None] | None = None  # follow()
        self._root: torch.Tensor | None = None  # a covariance root, see set_covariance_root()
        self._distribution: LowRankPrecisionNormal | None = None  # of the current belief
        self._buffers_key: tuple = ()  # the buffers _root and _distribution were made for

    # -- set-up
    def _setup_prototype(self, *args, **kwargs) -> None:
        super()._setup_prototype(*args, **kwargs)
        sites = global_latent_sites(self.prototype_trace, type(self).__name__, self.model)
        locs = initial_locs(self.model, sites, self._init_loc)
        self._sites = {name: site["value"].shape for name, site in sites.items()}
        variances = [
            gaussian_prior(name, site["fn"], site["value"].shape)[1].square().reshape(-1)
            for name, site in sites.items()
        ]
        loc = torch.cat([locs[name].reshape(-1) for name in sites])
        diag = torch.cat(variances).reciprocal().to(loc)
        rank = loc.shape[0] if self.rank is None else self.rank
        factor = torch.zeros(loc.shape[0], rank, dtype=loc.dtype, device=loc.device)
        self.register_buffer("loc", loc)
        self.register_buffer("precision_factor", factor)
        self.register_buffer("precision_diag", diag)
        if self.rank is None:  # full rank: draws from the prior's root, no factorisation
            self._root = torch.diag(diag.rsqrt())
            self._buffers_key = self._current_key()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.set_belief(*pending)

    @property
    def is_set_up(self) -> bool:
        """Whether the guide has been called once (its buffers exist)."""
        return self.prototype_trace is not None

    @property
    def size(self) -> int:
        """``d``, the number of latent values (after set-up)."""
        self._require_setup()
        return self.loc.shape[0]

    # -- the belief
    @torch.no_grad()
    def set_belief(
        self, loc: torch.Tensor, precision_factor: torch.Tensor, precision_diag: torch.Tensor
    ) -> None:
        r"""Make the guide :math:`\mathcal{N}(\mu, (\Upsilon + WW^\top)^{-1})`.

        Before set-up the values are kept and become the guide's at set-up.

        Args:
            loc: :math:`\mu`, ``(d,)``.
            precision_factor: :math:`W`, ``(d, r)`` with the guide's rank.
            precision_diag: The diagonal of :math:`\Upsilon`, ``(d,)``, positive.

        Raises:
            ValueError: On shapes that do not fit the guide, or a non-positive diagonal.
        """
        if not self.is_set_up:
            self._pending = (
                loc.detach().clone(),
                precision_factor.detach().clone(),
                precision_diag.detach().clone(),
            )
            return
        for name, value in (
            ("loc", loc),
            ("precision_factor", precision_factor),
            ("precision_diag", precision_diag),
        ):
            target = getattr(self, name)
            if value.shape != target.shape:
                raise ValueError(
                    f"{name} must have shape {tuple(target.shape)} for this guide, got "
                    f"{tuple(value.shape)}"
                )
        if not bool((precision_diag > 0).all()):
            raise ValueError("precision_diag must be positive")
        self.loc.copy_(loc)
        self.precision_factor.copy_(precision_factor)
        self.precision_diag.copy_(precision_diag)
        self._root = self._distribution = None
        self._buffers_key = self._current_key()

    @torch.no_grad()
    def set_covariance_root(self, loc: torch.Tensor, covariance_root: torch.Tensor) -> None:
        r"""Make a full-rank guide :math:`\mathcal{N}(\mu, SS^\top)`, for any square root :math:`S`.

        Draws are then :math:`\mu + S\varepsilon`, :math:`O(d^2)` each with no factorisation
        (:class:`~pyro_bbb.priors.precision_normal.CovarianceRootNormal`); the precision form
        (the buffers ``precision_factor`` and ``precision_diag``, :math:`O(d^3)`) is computed
        only when it is asked for: by the density, :meth:`posterior` or ``state_dict``
        (``save``). :class:`~pyro_bbb.online.RVGA` shows its belief this way.

        Args:
            loc: :math:`\mu`, ``(d,)``.
            covariance_root: :math:`S`, ``(d, d)``, invertible; kept, not copied.

        Raises:
            ValueError: On a guide of rank below ``d``, or shapes that do not fit it.
        """
        self._require_setup()
        d = self.loc.shape[0]
        if self.precision_factor.shape[1] != d:
            raise ValueError(
                f"a covariance root makes a full-rank belief; this guide has rank {self.rank}"
            )
        if loc.shape != (d,) or covariance_root.shape != (d, d):
            raise ValueError(
                f"loc must be ({d},) and covariance_root ({d}, {d}) for this guide, got "
                f"{tuple(loc.shape)} and {tuple(covariance_root.shape)}"
            )
        self.loc.copy_(loc)
        self._root = covariance_root.detach()
        self._distribution = None
        self._buffers_key = self._current_key()

    def follow(self, source: Callable[[], Belief | CovarianceRoot | None] | None) -> None:
        """Show a belief held elsewhere, taken only when this guide is next used.

        Args:
            source: Called before every use of the guide (a draw, ``posterior``,
                ``marginals``, ``state_dict``); returns the belief when it changed since the
                last call, else ``None``: ``(loc, precision_factor, precision_diag)``, or a
                :class:`CovarianceRoot` (see :meth:`set_covariance_root`). ``None`` stops
                following. An online updater follows its state this way, so that its belief
                reaches the guide once per use, not once per update.
        """
        self._source = source

    def _pull(self) -> None:
        if self._source is not None:
            belief = self._source()
            if isinstance(belief, CovarianceRoot):
                self.set_covariance_root(*belief)
            elif belief is not None:
                self.set_belief(*belief)

    def distribution(self) -> LowRankPrecisionNormal:
        """The belief over the flat weights, ``(d,)``, on the buffers (not detached).

        One distribution per belief: its factorisations are computed once and kept until the
        belief changes, so repeated draws (``predict``) pay for them once.
        """
        self._require_setup()
        self._pull()
        if self._buffers_key != self._current_key():  # changed in place (load) or moved
            self._root = self._distribution = None
            self._buffers_key = self._current_key()
        if self._distribution is None:
            if self._root is not None:
                self._distribution = CovarianceRootNormal(self.loc, self._root)
            else:
                self._distribution = LowRankPrecisionNormal(
                    self.loc, self.precision_factor, self.precision_diag
                )
        return self._distribution

    def _current_key(self) -> tuple:
        """Where the buffers are and how often they were changed in place."""
        buffers = (self.loc, self.precision_factor, self.precision_diag)
        return tuple((t.data_ptr(), tensor_version(t)) for t in buffers)

    @torch.no_grad()
    def _settle(self) -> None:
        """The current belief in the buffers: pulled, and a covariance root's precision form."""
        fn = self.distribution()
        if self._root is not None:
            self.precision_factor.copy_(fn.precision_factor)
            self.precision_diag.copy_(fn.precision_diag)
            self._buffers_key = self._current_key()  # still the belief the root draws from

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        if self.is_set_up:
            self._settle()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _apply(self, fn, *args, **kwargs):
        if self.is_set_up:
            self._settle()  # the buffers move; a root kept aside would stay behind
        return super()._apply(fn, *args, **kwargs)

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Draw the block and hand each model site its slice; takes the model's arguments.

        Returns:
            ``{site name: sample}``.
        """
        if not self.is_set_up:
            self._setup_prototype(*args, **kwargs)
        theta = pyro.sample(
            f"_{type(self).__name__}_{BLOCK}", self.distribution(), infer={"is_auxiliary": True}
        )
        batch, start, result = theta.shape[:-1], 0, {}
        for name, shape in self._sites.items():
            stop = start + shape.numel()
            value = theta[..., start:stop].reshape(*batch, *shape)
            result[name] = pyro.sample(name, dist.Delta(value, event_dim=len(shape)))
            start = stop
        return result

    # -- summaries, as the other guides give them
    @property
    def block_sites(self) -> dict[str, dict[str, torch.Size]]:
        """The sites of the one block, in their order in it: ``{"network": {site: shape}}``."""
        self._require_setup()
        return {BLOCK: dict(self._sites)}

    @torch.no_grad()
    def posterior(self) -> dict[str, LowRankPrecisionNormal]:
        """The belief, detached: ``{"network": LowRankPrecisionNormal over (d,)}``."""
        self._settle()
        fn = self.distribution()
        return {
            BLOCK: LowRankPrecisionNormal(
                *(t.clone() for t in (fn.loc, fn.precision_factor, fn.precision_diag))
            )
        }

    @torch.no_grad()
    def marginals(self, *args, **kwargs) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Mean and standard deviation of every site's Gaussian marginal, site-shaped.

        Takes the model's arguments only if the guide has not been called yet.
        """
        self._require_setup(*args, **kwargs)
        fn = self.distribution()
        std = fn.variance.sqrt()
        result, start = {}, 0
        for name, shape in self._sites.items():
            stop = start + shape.numel()
            result[name] = (
                fn.loc[start:stop].reshape(shape).clone(),
                std[start:stop].reshape(shape),
            )
            start = stop
        return result

    @torch.no_grad()
    def median(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """The mean (= median) of every site, ``{site: tensor of the site's shape}``."""
        return {name: loc for name, (loc, _) in self.marginals(*args, **kwargs).items()}

    def _require_setup(self, *args, **kwargs) -> None:
        if not self.is_set_up and args:
            self._setup_prototype(*args, **kwargs)
        if not self.is_set_up:
            raise RuntimeError(
                f"{type(self).__name__} is not set up yet: call it (or update a filter with "
                "it) with the model's arguments first, or pass them to marginals()/median()"
            )
