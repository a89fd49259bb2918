r"""The precision-form Gaussian over a block of sites, drawn one site at a time.

A :class:`~pyro_bbb.priors.precision_normal.LowRankPrecisionNormal`,
:math:`\mathcal{N}(\mu, (\Upsilon + WW^\top)^{-1})`, over the concatenated values of named
sites (the belief of an online filter, carried as a prior by
:func:`~pyro_bbb.priors.from_guide`), drawn site by site under the model's own names with an
exact log density, as :class:`~pyro_bbb.priors.gaussian_block.GaussianBlock` does for the
covariance form.

**Marginals and conditionals stay in the family.** Marginalising the sites :math:`c` out of a
precision :math:`\Upsilon + WW^\top` leaves, by the Schur complement and the push-through
identity :math:`I - W_c^\top(\Upsilon_c + W_cW_c^\top)^{-1}W_c = K_c^{-1}`,

.. math::

    \Lambda_{\text{rest}} = \Upsilon_{\text{rest}} + \tilde W \tilde W^\top, \qquad
    \tilde W = W_{\text{rest}} R, \quad
    RR^\top = K_c^{-1} = (I + W_c^\top \Upsilon_c^{-1} W_c)^{-1},

and a site :math:`b` given the sites :math:`a` drawn before it is

.. math::

    b \mid a \sim \mathcal{N}\big(\mu_b - \Upsilon_b^{-1}\tilde W_b \tilde K_b^{-1}
        \tilde W_a^\top (a - \mu_a),\; (\Upsilon_b + \tilde W_b \tilde W_b^\top)^{-1}\big),
    \qquad \tilde K_b = I + \tilde W_b^\top \Upsilon_b^{-1} \tilde W_b,

again in precision form. This module holds :class:`PrecisionBlock` and
:class:`PrecisionSiteConditional`, on the bookkeeping every form of block shares
(:mod:`~pyro_bbb.priors.site_block`); it knows nothing of guides or inference.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch

from .precision_normal import LowRankPrecisionNormal
from .site_block import BlockSiteConditional, SiteBlock

__all__ = ["PrecisionBlock", "PrecisionSiteConditional"]


class PrecisionBlock(SiteBlock):
    r""":math:`\mathcal{N}(\mu, (\Upsilon + WW^\top)^{-1})` over the concatenated values of sites.

    The precision-form counterpart of :class:`~pyro_bbb.priors.gaussian_block.GaussianBlock`,
    with the same interface (:attr:`sites`, :meth:`site_marginal`, :meth:`site_loc`,
    :meth:`conditional`), so a :class:`~pyro_bbb.priors.posterior.BlockPosterior` draws
    either. Each site is drawn from its conditional given the block's sites drawn before it
    in this run of the model, the sites not drawn yet marginalised out (the module's notes
    have the algebra); the sites' log densities add up to the block's joint one in any
    order. The tensors are detached and copied; the factors of each conditional are computed
    once in float64 and cached per device and dtype.

    Args:
        loc: :math:`\mu`, ``(d,)``.
        precision_factor: :math:`W`, ``(d, r)``.
        precision_diag: The diagonal of :math:`\Upsilon`, ``(d,)``, positive.
        sites: ``{site name: shape}`` in the order the sites are concatenated; the shapes'
            sizes add up to ``d``.

    Raises:
        ValueError: On inconsistent shapes or a non-positive diagonal.
    """

    FACTOR, DIAGONAL = "precision_factor", "precision_diag"
    precision_factor: torch.Tensor
    precision_diag: torch.Tensor

    def __init__(
        self,
        loc: torch.Tensor,
        precision_factor: torch.Tensor,
        precision_diag: torch.Tensor,
        sites: Mapping[str, Sequence[int]],
    ) -> None:
        super().__init__(loc, precision_factor, precision_diag, sites)

    def distribution(self) -> LowRankPrecisionNormal:
        """The joint Gaussian of the whole block, over ``(d,)``."""
        return LowRankPrecisionNormal(self.loc, self.precision_factor, self.precision_diag)

    def site_marginal(self, site: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std of each value of ``site`` under the joint, each in the site's shape."""
        self._check_sites((site,))
        variance = self._cache.get("variance")
        if variance is None:
            variance = self._cache["variance"] = self.distribution().variance
        part, shape = self._slices[site], self.sites[site]
        return self.loc[part].reshape(shape), variance[part].sqrt().reshape(shape)

    def _conditional(
        self,
        site: str,
        given: tuple[str, ...],
        factors: tuple,
        values: Iterator[tuple[str, torch.Tensor]],
    ) -> PrecisionSiteConditional:
        loc, factor, diag, gain, given_factors = factors
        shift = 0
        for (_, flat), (given_loc, given_factor) in zip(values, given_factors, strict=True):
            shift = shift + (flat - given_loc) @ given_factor  # W̃_aᵀ (a − μ_a), (*batch, r)
        mean = loc if not given else loc - shift @ gain.mT
        flat = LowRankPrecisionNormal(mean, factor, diag)
        return PrecisionSiteConditional(flat, self.sites[site], block=self, site=site, given=given)

    def _conditional_factors(self, site, given, device, dtype):
        r"""``(μ_b, W̃_b, Υ_b, Υ_b⁻¹W̃_b K̃_b⁻¹, [(μ_a, W̃_a)])`` in float64, cast once."""
        wide = {"device": device, "dtype": torch.float64}
        loc, factor, diag = (
            t.to(**wide) for t in (self.loc, self.precision_factor, self.precision_diag)
        )
        eye = torch.eye(self.rank, **wide)
        rest = [name for name in self.sites if name != site and name not in given]
        capacitance = eye.clone()
        for name in rest:  # K_c = I + W_cᵀ Υ_c⁻¹ W_c of the sites marginalised out
            part = self._slices[name]
            capacitance = capacitance + factor[part].mT @ (factor[part] / diag[part, None])
        # R with RRᵀ = K_c⁻¹: R = L⁻ᵀ for K_c = LLᵀ
        root = torch.linalg.solve_triangular(
            torch.linalg.cholesky(capacitance), eye, upper=False
        ).mT
        part = self._slices[site]
        site_factor = factor[part] @ root
        scaled = site_factor / diag[part, None]
        site_capacitance = eye + site_factor.mT @ scaled
        gain = torch.linalg.solve(site_capacitance, scaled.mT).mT  # Υ_b⁻¹ W̃_b K̃_b⁻¹
        cast = {"device": device, "dtype": dtype}
        given_factors = [
            (loc[self._slices[name]].to(**cast), (factor[self._slices[name]] @ root).to(**cast))
            for name in given
        ]
        return (
            loc[part].to(**cast),
            site_factor.to(**cast),
            diag[part].to(**cast),
            gain.to(**cast),
            given_factors,
        )


class PrecisionSiteConditional(BlockSiteConditional):
    """One site of a :class:`PrecisionBlock` given the block's sites drawn before it.

    A :class:`LowRankPrecisionNormal` over the site's flattened values, reshaped to the site's
    shape (one event).

    Attributes:
        block: The :class:`PrecisionBlock` this site belongs to.
        site: The site's name.
        given: The names of the block's sites this distribution is conditioned on.
    """

    def __init__(
        self,
        flat: LowRankPrecisionNormal,
        shape: torch.Size,
        *,
        block: PrecisionBlock,
        site: str,
        given: tuple[str, ...],
    ) -> None:
        self.flat = flat
        super().__init__(flat.batch_shape, shape, block=block, site=site, given=given)

    def expand(self, batch_shape, _instance=None) -> PrecisionSiteConditional:  # noqa: D102
        return PrecisionSiteConditional(
            self.flat.expand(batch_shape),
            self.event_shape,
            block=self.block,
            site=self.site,
            given=self.given,
        )

    def _flat_mean(self) -> torch.Tensor:
        return self.flat.mean

    def _flat_variance(self) -> torch.Tensor:
        return self.flat.variance

    def _flat_rsample(self, sample_shape: torch.Size) -> torch.Tensor:
        return self.flat.rsample(sample_shape)

    def _flat_log_prob(self, flat: torch.Tensor) -> torch.Tensor:
        return self.flat.log_prob(flat)
