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
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide import AutoGuide

from ..infer.guides._init import InitLoc, global_latent_sites, initial_locs
from ..priors.precision_normal import LowRankPrecisionNormal
from .network import gaussian_prior

__all__ = ["LowRankPrecisionGuide"]

Belief = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``(loc (d,), precision_factor (d, r), precision_diag (d,))``."""

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

    Raises:
        ValueError: On a negative rank, and at set-up on a prior that is not a Gaussian with
            independent values.
    """

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
        self._source: Callable[[], Belief | None] | None = None  # see follow()

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

    def follow(self, source: Callable[[], Belief | None] | None) -> None:
        """Show a belief held elsewhere, converted only when this guide is next used.

        Args:
            source: Called before every use of the guide (a draw, ``posterior``,
                ``marginals``); returns the belief ``(loc, precision_factor, precision_diag)``
                when it changed since the last call, else ``None``. ``None`` stops following.
                An online updater follows its state this way, so that a belief kept in
                another form (R-VGA's covariance) is converted once per use, not per update.
        """
        self._source = source

    def _pull(self) -> None:
        if self._source is not None:
            belief = self._source()
            if belief is not None:
                self.set_belief(*belief)

    def distribution(self) -> LowRankPrecisionNormal:
        """The belief over the flat weights, ``(d,)``, on the buffers (not detached)."""
        self._require_setup()
        self._pull()
        return LowRankPrecisionNormal(self.loc, self.precision_factor, self.precision_diag)

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
