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
:class:`PrecisionSiteConditional`; it knows nothing of guides or inference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from .precision_normal import LowRankPrecisionNormal

__all__ = ["PrecisionBlock", "PrecisionSiteConditional"]


class PrecisionBlock:
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

    def __init__(
        self,
        loc: torch.Tensor,
        precision_factor: torch.Tensor,
        precision_diag: torch.Tensor,
        sites: Mapping[str, Sequence[int]],
    ) -> None:
        self.sites = {name: torch.Size(shape) for name, shape in sites.items()}
        d = sum(shape.numel() for shape in self.sites.values())
        if (
            loc.shape != (d,)
            or precision_diag.shape != (d,)
            or precision_factor.dim() != 2
            or precision_factor.shape[0] != d
        ):
            raise ValueError(
                f"a block of sites {list(self.sites)} has {d} values: loc and precision_diag "
                f"must be ({d},) and precision_factor ({d}, rank), got {tuple(loc.shape)}, "
                f"{tuple(precision_diag.shape)} and {tuple(precision_factor.shape)}"
            )
        if not bool((precision_diag > 0).all()):
            raise ValueError("precision_diag must be positive")
        self.loc = loc.detach().clone()
        self.precision_factor = precision_factor.detach().clone()
        self.precision_diag = precision_diag.detach().clone()
        self._slices: dict[str, slice] = {}
        start = 0
        for name, shape in self.sites.items():
            self._slices[name] = slice(start, start + shape.numel())
            start += shape.numel()
        self._cache: dict[tuple, object] = {}

    @property
    def rank(self) -> int:
        """``r``, the columns of :math:`W`."""
        return self.precision_factor.shape[1]

    def __repr__(self) -> str:
        return (
            f"PrecisionBlock(sites={list(self.sites)}, size={self.loc.shape[0]}, rank={self.rank})"
        )

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": {}}  # rebuilt where unpickled

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

    def site_loc(self, site: str) -> torch.Tensor:
        """The marginal mean of one site, in the site's shape."""
        self._check_sites((site,))
        return self.loc[self._slices[site]].reshape(self.sites[site])

    def conditional(
        self,
        site: str,
        drawn: Mapping[str, torch.Tensor],
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> dist.TorchDistribution:
        """The distribution of ``site`` given the values of the block's sites in ``drawn``.

        Args:
            site: A site of the block.
            drawn: Values of other sites of the block, ``(*batch, *site shape)`` each; entries
                for sites outside the block are ignored.
            device: Where the distribution lives.
            dtype: Its floating-point type.

        Returns:
            A :class:`PrecisionSiteConditional` with event shape the site's shape and batch
            shape the broadcast of the drawn values' leading dims.

        Raises:
            KeyError: If ``site`` is not in the block.
            ValueError: If a drawn value does not have its site's shape.
        """
        self._check_sites((site,))
        given = tuple(name for name in self.sites if name in drawn and name != site)
        key = ("conditional", site, given, device, dtype)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._conditional_factors(site, given, device, dtype)
        loc, factor, diag, gain, given_factors = cached
        shift = 0
        for name, (given_loc, given_factor) in zip(given, given_factors, strict=True):
            value, shape = drawn[name], self.sites[name]
            if value.shape[value.dim() - len(shape) :] != shape:
                raise ValueError(
                    f"site {name!r} of the block must end in shape {tuple(shape)}, got a value "
                    f"of shape {tuple(value.shape)}"
                )
            flat = value.reshape(*value.shape[: value.dim() - len(shape)], -1)
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

    def _check_sites(self, sites: Sequence[str]) -> None:
        unknown = [s for s in sites if s not in self.sites]
        if unknown:
            raise KeyError(
                f"site(s) {unknown} are not in the block; its sites are {list(self.sites)}"
            )


class PrecisionSiteConditional(dist.TorchDistribution):
    """One site of a :class:`PrecisionBlock` given the block's sites drawn before it.

    A :class:`LowRankPrecisionNormal` over the site's flattened values, reshaped to the site's
    shape (one event).

    Attributes:
        block: The :class:`PrecisionBlock` this site belongs to.
        site: The site's name.
        given: The names of the block's sites this distribution is conditioned on.
    """

    arg_constraints = {}  # noqa: RUF012 (torch's class-level convention)
    has_rsample = True

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
        self.block, self.site, self.given = block, site, given
        super().__init__(flat.batch_shape, torch.Size(shape), validate_args=False)

    @property
    def support(self) -> constraints.Constraint:
        """The reals, one event of the site's shape."""
        return constraints.independent(constraints.real, len(self.event_shape))

    def expand(self, batch_shape, _instance=None) -> PrecisionSiteConditional:  # noqa: D102
        return PrecisionSiteConditional(
            self.flat.expand(batch_shape),
            self.event_shape,
            block=self.block,
            site=self.site,
            given=self.given,
        )

    def _site_shaped(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.reshape(*flat.shape[:-1], *self.event_shape)

    @property
    def mean(self) -> torch.Tensor:
        """The conditional mean, ``(*batch, *site shape)``."""
        return self._site_shaped(self.flat.mean)

    @property
    def variance(self) -> torch.Tensor:
        """The conditional variances, ``(*batch, *site shape)``."""
        return self._site_shaped(self.flat.variance)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        """Draw ``(*sample_shape, *batch, *site shape)``."""
        return self._site_shaped(self.flat.rsample(sample_shape))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Log-density of ``value`` ``(..., *site shape)``, shape the broadcast batch dims."""
        flat = value.reshape(*value.shape[: value.dim() - len(self.event_shape)], -1)
        return self.flat.log_prob(flat)
