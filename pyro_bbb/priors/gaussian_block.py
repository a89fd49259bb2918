r"""The joint Gaussian of a block of sites, drawn one site at a time.

A trained :class:`~pyro_bbb.LowRankGuide` approximates a block of weights (a layer's weight
and bias, or a whole network) by one Gaussian :math:`\mathcal{N}(\mu, D + VV^\top)` over their
concatenated, flattened values. Used as a prior, the block must still be drawn site by site
under the model's own names (``"fc1.weight"``, then ``"fc1.bias"``), with an exact log
density. :class:`GaussianBlock` does it by the chain rule: each site is drawn from its
Gaussian conditional given the sites of the block already drawn in this run of the model, so
the sites' log densities add up to the block's joint log density in any order, and a site the
model never draws is marginalised out.

The conditionals of a low-rank-plus-diagonal Gaussian are low-rank-plus-diagonal too. For a
site :math:`b` given the sites :math:`a` drawn before it, :math:`\Sigma_{ba} = V_b V_a^\top`
and the Woodbury identity give

.. math::

    b \mid a \sim \mathcal{N}\big(\mu_b + U_b z,\; D_b + U_b U_b^\top\big), \qquad
    U_b = V_b L^{-\top}, \quad z = L^{-1} V_a^\top D_a^{-1}(a - \mu_a),

where :math:`LL^\top = I_r + V_a^\top D_a^{-1} V_a` is the :math:`r \times r` capacitance of the
sites drawn so far: :math:`O(d r)` work per draw once :math:`L` and :math:`U_b` are cached, and
never a :math:`d \times d` matrix.

This module holds :class:`GaussianBlock` and :class:`SiteConditional`, the distribution of one
site given the others, on the bookkeeping every form of block shares
(:mod:`~pyro_bbb.priors.site_block`). It knows nothing of guides or inference; the ELBO reads
:attr:`SiteConditional.block` and :attr:`SiteConditional.given` to compute the KL divergence
of a whole block in closed form.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyro.distributions as dist
import torch

from .site_block import BlockSiteConditional, SiteBlock

__all__ = ["GaussianBlock", "SiteConditional"]


class GaussianBlock(SiteBlock):
    r""":math:`\mathcal{N}(\mu, D + VV^\top)` over the concatenated values of named sites.

    The tensors are detached and copied; moved copies for each device and dtype the block is
    used on are made once and cached, as are the factors of each conditional.

    Args:
        loc: :math:`\mu`, shape ``(d,)``.
        cov_factor: :math:`V`, shape ``(d, r)`` with ``r >= 1``.
        cov_diag: The diagonal of :math:`D`, shape ``(d,)``, positive.
        sites: ``{site name: shape}`` in the order the sites are concatenated; the shapes'
            sizes add up to ``d``.

    Raises:
        ValueError: On inconsistent shapes or a non-positive diagonal.
    """

    FACTOR, DIAGONAL = "cov_factor", "cov_diag"
    cov_factor: torch.Tensor
    cov_diag: torch.Tensor

    def __init__(
        self,
        loc: torch.Tensor,
        cov_factor: torch.Tensor,
        cov_diag: torch.Tensor,
        sites: Mapping[str, Sequence[int]],
    ) -> None:
        super().__init__(loc, cov_factor, cov_diag, sites)

    def site_marginal(self, site: str) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Mean and std of each value of ``site`` under the joint, each in the site's shape.

        The marginal of one value :math:`i` is
        :math:`\mathcal{N}(\mu_i, D_{ii} + \sum_k V_{ik}^2)`.
        """
        self._check_sites((site,))
        part = self._slices[site]
        variance = self.cov_diag[part] + self.cov_factor[part].square().sum(-1)
        shape = self.sites[site]
        return self.loc[part].reshape(shape), variance.sqrt().reshape(shape)

    # -- the pieces on a device
    def _pieces(self, device: torch.device, dtype: torch.dtype) -> dict[str, tuple]:
        """Per site, on ``device``: ``(mu, V, D, V / D)``, each flat over the site."""
        key = ("pieces", device, dtype)
        pieces = self._cache.get(key)
        if pieces is None:
            loc, factor, diag = (
                t.to(device=device, dtype=dtype) for t in (self.loc, self.cov_factor, self.cov_diag)
            )
            pieces = {
                name: (loc[s], factor[s], diag[s], factor[s] / diag[s].unsqueeze(-1))
                for name, s in self._slices.items()
            }
            self._cache[key] = pieces
        return pieces

    def joint(
        self, sites: Sequence[str], *, device: torch.device, dtype: torch.dtype
    ) -> dist.LowRankMultivariateNormal:
        """The marginal of ``sites`` (a subset, in any order) over their concatenation.

        Returns:
            A ``LowRankMultivariateNormal`` with event shape ``(sum of the sites' sizes,)``.

        Raises:
            KeyError: If a site is not in the block.
        """
        sites = tuple(sites)
        key = ("joint", sites, device, dtype)
        joint = self._cache.get(key)
        if joint is None:
            self._check_sites(sites)
            pieces = self._pieces(device, dtype)
            loc, factor, diag = (torch.cat([pieces[s][i] for s in sites]) for i in range(3))
            joint = dist.LowRankMultivariateNormal(loc, factor, diag)
            self._cache[key] = joint
        return joint

    def _conditional(
        self,
        site: str,
        given: tuple[str, ...],
        factors: tuple,
        values: Iterator[tuple[str, torch.Tensor]],
    ) -> SiteConditional:
        base, tril, factor = factors
        if not given:
            return SiteConditional(base, None, self.sites[site], block=self, site=site, given=())
        pieces = self._pieces(tril.device, tril.dtype)
        projected = 0  # V_aᵀ D_a⁻¹ (a − μ_a), shape (*batch, r)
        for name, flat in values:
            loc, _, _, scaled = pieces[name]
            projected = projected + (flat - loc) @ scaled
        z = torch.linalg.solve_triangular(tril, projected.unsqueeze(-1), upper=False).squeeze(-1)
        return SiteConditional(
            base, z @ factor.mT, self.sites[site], block=self, site=site, given=given
        )

    def _conditional_factors(self, site, given, device, dtype):
        """``(base, L, U_b)`` of a conditional, computed in float64 and cast once."""
        pieces = self._pieces(device, torch.float64)
        loc, factor, diag, _ = pieces[site]
        rank = self.rank
        capacitance = torch.eye(rank, dtype=torch.float64, device=device)
        for name in given:
            _, v, _, scaled = pieces[name]
            capacitance = capacitance + v.mT @ scaled
        tril = torch.linalg.cholesky(capacitance)
        # U_b = V_b L⁻ᵀ, from L U_bᵀ = V_bᵀ
        cond_factor = torch.linalg.solve_triangular(tril, factor.mT, upper=False).mT
        cast = {"device": device, "dtype": dtype}
        base = dist.LowRankMultivariateNormal(
            loc.to(**cast), cond_factor.to(**cast), diag.to(**cast)
        )
        return base, tril.to(**cast), cond_factor.to(**cast)


class SiteConditional(BlockSiteConditional):
    r"""One site of a :class:`GaussianBlock` given the block's sites drawn before it.

    :math:`\mathcal{N}(\mu_b + \text{shift}, D_b + U_b U_b^\top)` reshaped to the site's shape:
    ``base`` is the flat Gaussian with the shift left out, so that it is built once, and
    ``shift`` (``(*batch, d_b)``, or ``None`` for a site drawn first) carries the dependence on
    the drawn values.

    Attributes:
        block: The :class:`GaussianBlock` this site belongs to.
        site: The site's name.
        given: The names of the block's sites this distribution is conditioned on.
    """

    def __init__(
        self,
        base: dist.LowRankMultivariateNormal,
        shift: torch.Tensor | None,
        shape: torch.Size,
        *,
        block: GaussianBlock,
        site: str,
        given: tuple[str, ...],
        batch_shape: torch.Size | None = None,
    ) -> None:
        self.base, self.shift = base, shift
        if batch_shape is None:
            batch_shape = torch.Size(()) if shift is None else shift.shape[:-1]
        super().__init__(batch_shape, shape, block=block, site=site, given=given)

    def expand(self, batch_shape, _instance=None) -> SiteConditional:  # noqa: D102 (torch's API)
        batch_shape = torch.Size(batch_shape)
        shift = None if self.shift is None else self.shift.expand(*batch_shape, -1)
        return SiteConditional(
            self.base,
            shift,
            self.event_shape,
            block=self.block,
            site=self.site,
            given=self.given,
            batch_shape=batch_shape,
        )

    def _flat_mean(self) -> torch.Tensor:
        return self.base.loc if self.shift is None else self.base.loc + self.shift

    def _flat_variance(self) -> torch.Tensor:
        return self.base.variance

    def _flat_rsample(self, sample_shape: torch.Size) -> torch.Tensor:
        flat = self.base.rsample(sample_shape + self.batch_shape)
        return flat if self.shift is None else flat + self.shift

    def _flat_log_prob(self, flat: torch.Tensor) -> torch.Tensor:
        return self.base.log_prob(flat if self.shift is None else flat - self.shift)
