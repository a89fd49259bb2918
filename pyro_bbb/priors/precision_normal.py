r"""A Gaussian in precision form, diagonal plus low rank: :class:`LowRankPrecisionNormal`.

Information adds up in the precision: every observation of a Bayesian update adds its
(Gauss-Newton) curvature to :math:`\Lambda = \Sigma^{-1}`. Online filters such as LoFi (Chang
et al. 2023) therefore keep :math:`\Lambda = \Upsilon + WW^\top`, a positive diagonal
:math:`\Upsilon` and a factor :math:`W` of rank :math:`r`. Its covariance
:math:`\Upsilon^{-1} - \Upsilon^{-1}W(I + W^\top\Upsilon^{-1}W)^{-1}W^\top\Upsilon^{-1}` is a
diagonal *minus* a low-rank term, which no diagonal-plus-low-rank covariance
(:class:`~pyro_bbb.LowRankGuide`'s :math:`D + VV^\top`) equals in general, so the precision form
has a distribution of its own: draws, log-density and marginal variances in
:math:`O(dr + r^3)` with the :math:`r \times r` capacitance :math:`K = I + \hat W^\top \hat W`,
:math:`\hat W = \Upsilon^{-1/2}W`, never a :math:`d \times d` matrix. Its block drawn site by
site is :mod:`~pyro_bbb.priors.precision_block`. This module knows nothing of guides or
inference.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.distributions.util import broadcast_shape
from torch.distributions.utils import lazy_property

__all__ = ["CovarianceRootNormal", "LowRankPrecisionNormal"]

_LOG_2PI = math.log(2 * math.pi)
_SHARED_ALGEBRA = ("_scaled_factor", "_gram", "_capacitance_tril", "_draw_coefficients")


class LowRankPrecisionNormal(dist.TorchDistribution):
    r""":math:`\mathcal{N}(\mu, (\Upsilon + WW^\top)^{-1})`: a diagonal-plus-low-rank precision.

    Draws use a square root of :math:`(I + \hat W\hat W^\top)^{-1}` with
    :math:`\hat W = \Upsilon^{-1/2} W`: with
    :math:`\hat W^\top \hat W = Q \,\mathrm{diag}(\lambda)\, Q^\top`,

    .. math::

        x = \mu + \Upsilon^{-1/2}\big(\varepsilon - \hat W Q\,\mathrm{diag}(c)\,Q^\top
            \hat W^\top \varepsilon\big), \qquad c_j = \frac{1}{\sqrt{1+\lambda_j}\,
            (1 + \sqrt{1+\lambda_j})},

    so :math:`\mathrm{Cov}[x] = \Upsilon^{-1/2}(I + \hat W \hat W^\top)^{-1}\Upsilon^{-1/2}
    = \Lambda^{-1}` (Woodbury), in :math:`O(dr)` per draw. The log-density uses
    :math:`\log\det\Lambda = \sum_i \log\Upsilon_i + \log\det(I + \hat W^\top\hat W)` (the
    matrix determinant lemma). The :math:`r \times r` algebra runs in float64, once per
    distribution, on the parameters as given: an ``expand`` (a plate of ``S`` draws) shares
    it and never copies :math:`W` per draw.

    Args:
        loc: :math:`\mu`, ``(*batch, d)``.
        precision_factor: :math:`W`, ``(*batch, d, r)``; ``r = 0`` is a diagonal precision.
        precision_diag: The diagonal of :math:`\Upsilon`, ``(*batch, d)``, positive.
        validate_args: As for every torch distribution.
    """

    arg_constraints = {  # noqa: RUF012 (torch's class-level convention)
        "loc": constraints.real_vector,
        "precision_factor": constraints.independent(constraints.real, 2),
        "precision_diag": constraints.independent(constraints.positive, 1),
    }
    support = constraints.real_vector
    has_rsample = True

    def __init__(
        self,
        loc: torch.Tensor,
        precision_factor: torch.Tensor,
        precision_diag: torch.Tensor,
        validate_args: bool | None = None,
    ) -> None:
        if loc.dim() < 1 or precision_factor.dim() < 2 or precision_diag.dim() < 1:
            raise ValueError(
                "loc must be (*batch, d), precision_factor (*batch, d, r) and precision_diag "
                f"(*batch, d); got {tuple(loc.shape)}, {tuple(precision_factor.shape)} and "
                f"{tuple(precision_diag.shape)}"
            )
        d = loc.shape[-1]
        if precision_factor.shape[-2] != d or precision_diag.shape[-1] != d:
            raise ValueError(
                f"loc has {d} values but precision_factor is {tuple(precision_factor.shape)} "
                f"and precision_diag {tuple(precision_diag.shape)}"
            )
        batch_shape = broadcast_shape(
            loc.shape[:-1], precision_factor.shape[:-2], precision_diag.shape[:-1]
        )
        rank = precision_factor.shape[-1]
        # the parameters as given: the algebra runs on these, never on a broadcast copy
        self._factor, self._diag = precision_factor, precision_diag
        self.loc = loc.expand(*batch_shape, d)
        self.precision_factor = precision_factor.expand(*batch_shape, d, rank)
        self.precision_diag = precision_diag.expand(*batch_shape, d)
        super().__init__(torch.Size(batch_shape), torch.Size((d,)), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):  # noqa: D102 (torch's API)
        new = self._get_checked_instance(LowRankPrecisionNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        d, rank = self.event_shape[0], self.rank
        new.loc = self.loc.expand(*batch_shape, d)
        new.precision_factor = self.precision_factor.expand(*batch_shape, d, rank)
        new.precision_diag = self.precision_diag.expand(*batch_shape, d)
        new._factor, new._diag = self._factor, self._diag
        for name in _SHARED_ALGEBRA:  # computed already: the expanded copy shares it
            if name in self.__dict__:
                new.__dict__[name] = self.__dict__[name]
        super(LowRankPrecisionNormal, new).__init__(batch_shape, self.event_shape, False)
        new._validate_args = self._validate_args
        return new

    @property
    def rank(self) -> int:
        """``r``, the columns of :math:`W`."""
        return self.precision_factor.shape[-1]

    # -- the r x r algebra, float64, computed once per distribution
    @lazy_property
    def _scaled_factor(self) -> torch.Tensor:
        r""":math:`\hat W = \Upsilon^{-1/2} W`, ``(*batch, d, r)`` (the batch as given)."""
        return self._factor * self._diag.rsqrt().unsqueeze(-1)

    @lazy_property
    def _gram(self) -> torch.Tensor:
        r""":math:`\hat W^\top \hat W` in float64, ``(*batch, r, r)``."""
        scaled = self._scaled_factor.double()
        return scaled.mT @ scaled

    @lazy_property
    def _capacitance_tril(self) -> torch.Tensor:
        r"""Cholesky factor of :math:`K = I + \hat W^\top \hat W`, float64."""
        eye = torch.eye(self.rank, dtype=torch.float64, device=self.loc.device)
        return torch.linalg.cholesky(eye + self._gram)

    @lazy_property
    def _draw_coefficients(self) -> torch.Tensor:
        r""":math:`Q\,\mathrm{diag}(c)\,Q^\top` of the draw, in the distribution's dtype."""
        eigenvalues, vectors = torch.linalg.eigh(self._gram)
        root = (1 + eigenvalues.clamp_min(0)).sqrt()
        coefficients = 1 / (root * (1 + root))
        return ((vectors * coefficients.unsqueeze(-2)) @ vectors.mT).to(self.loc.dtype)

    # -- moments
    @property
    def mean(self) -> torch.Tensor:
        r""":math:`\mu`, ``(*batch, d)``."""
        return self.loc

    @property
    def variance(self) -> torch.Tensor:
        r"""Marginal variances :math:`\mathrm{diag}\,\Lambda^{-1}`, ``(*batch, d)``.

        :math:`\Lambda^{-1} = \Upsilon^{-1/2}(I - \hat W K^{-1} \hat W^\top)\Upsilon^{-1/2}`,
        so the variance of value :math:`i` is :math:`(1 - \lVert (\hat W L^{-\top})_i
        \rVert^2)/\Upsilon_i` with :math:`LL^\top = K`.
        """
        whitened = torch.linalg.solve_triangular(
            self._capacitance_tril, self._scaled_factor.double().mT, upper=False
        )  # L⁻¹ Ŵᵀ, (*batch, r, d)
        shrink = 1 - whitened.square().sum(-2)
        variance = (shrink / self._diag.double()).to(self.loc.dtype)
        return variance.expand(self.loc.shape)

    @property
    def precision_matrix(self) -> torch.Tensor:
        r"""Dense :math:`\Upsilon + WW^\top`, ``(*batch, d, d)`` (small ``d`` only)."""
        return torch.diag_embed(self.precision_diag) + self.precision_factor @ (
            self.precision_factor.mT
        )

    @property
    def covariance_matrix(self) -> torch.Tensor:
        r"""Dense :math:`(\Upsilon + WW^\top)^{-1}`, ``(*batch, d, d)`` (small ``d`` only)."""
        scaled = self._scaled_factor.double()
        whitened = torch.linalg.solve_triangular(self._capacitance_tril, scaled.mT, upper=False)
        inner = torch.eye(self.event_shape[0], dtype=torch.float64, device=self.loc.device)
        inner = inner - whitened.mT @ whitened
        root = self.precision_diag.double().rsqrt()
        return (root.unsqueeze(-1) * inner * root.unsqueeze(-2)).to(self.loc.dtype)

    def log_det_precision(self) -> torch.Tensor:
        r""":math:`\log\det\Lambda`, ``(*batch,)``."""
        diag_part = self._diag.log().sum(-1)
        capacitance = 2 * self._capacitance_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return (diag_part + capacitance.to(diag_part.dtype)).expand(self.batch_shape)

    # -- draws and densities
    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        """Draw ``(*sample_shape, *batch, d)``, differentiably in ``loc``."""
        shape = self._extended_shape(sample_shape)
        return self.reparameterize(torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device))

    def reparameterize(self, noise: torch.Tensor) -> torch.Tensor:
        r"""The draw for standard normal noise :math:`\varepsilon` ``(..., d)``: linear in it.

        Returns:
            :math:`\mu + \Upsilon^{-1/2}(\varepsilon - \hat W Q\,\mathrm{diag}(c)\,Q^\top
            \hat W^\top \varepsilon)`, the shape of ``noise`` broadcast with the batch.
        """
        scaled = self._scaled_factor
        projected = (noise.unsqueeze(-2) @ scaled).squeeze(-2)  # Ŵᵀε, (..., r)
        mixed = (projected.unsqueeze(-2) @ self._draw_coefficients).squeeze(-2)
        correction = (mixed.unsqueeze(-2) @ scaled.mT).squeeze(-2)  # ŴQcQᵀŴᵀε, (..., d)
        return self.loc + (noise - correction) * self._diag.rsqrt()

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        r""":math:`\log \mathcal{N}(x \mid \mu, \Lambda^{-1})`, the broadcast batch dims."""
        if self._validate_args:
            self._validate_sample(value)
        delta = value - self.loc
        projected = (delta.unsqueeze(-2) @ self._factor).squeeze(-2)
        mahalanobis = (self._diag * delta.square()).sum(-1) + projected.square().sum(-1)
        d = self.event_shape[0]
        return -0.5 * (d * _LOG_2PI - self.log_det_precision() + mahalanobis)

    def entropy(self) -> torch.Tensor:
        """Differential entropy (nats), ``(*batch,)``."""
        d = self.event_shape[0]
        return 0.5 * (d * (1 + _LOG_2PI) - self.log_det_precision())


class CovarianceRootNormal(LowRankPrecisionNormal):
    r"""A full-rank Gaussian given by any square root :math:`S` of its covariance, :math:`SS^\top`.

    The form a full-covariance filter (R-VGA) keeps its belief in. Draws are
    :math:`\mu + S\varepsilon`, :math:`O(d^2)` each with no factorisation, and the marginal
    variances are the rows' squared norms of :math:`S`. The precision form of the family,
    :math:`\Lambda = (SS^\top)^{-1} = cI + WW^\top` (:math:`c` half the precision's smallest
    eigenvalue, :math:`W` the Cholesky factor of the rest: exact), costs :math:`O(d^3)` and is
    computed only when something asks for it (the density, ``precision_factor``,
    ``precision_diag``), once per distribution and shared by its ``expand``-ed copies.

    Args:
        loc: :math:`\mu`, ``(d,)``.
        covariance_root: :math:`S`, ``(d, d)``, invertible (not necessarily triangular).
        validate_args: As for every torch distribution.
    """

    arg_constraints = {  # noqa: RUF012 (torch's class-level convention)
        "loc": constraints.real_vector,
        "covariance_root": constraints.independent(constraints.real, 2),
    }

    def __init__(
        self,
        loc: torch.Tensor,
        covariance_root: torch.Tensor,
        validate_args: bool | None = None,
    ) -> None:
        d = loc.shape[-1]
        if loc.dim() != 1 or covariance_root.shape != (d, d):
            raise ValueError(
                f"loc must be (d,) and covariance_root (d, d); got {tuple(loc.shape)} and "
                f"{tuple(covariance_root.shape)}"
            )
        self.loc = loc
        self.covariance_root = covariance_root
        dist.TorchDistribution.__init__(
            self, torch.Size(), torch.Size((d,)), validate_args=validate_args
        )

    def expand(self, batch_shape, _instance=None):  # noqa: D102 (torch's API)
        new = self._get_checked_instance(CovarianceRootNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(*batch_shape, self.event_shape[0])
        new.covariance_root = self.covariance_root
        for name, value in self.__dict__.items():  # the precision form, if computed already
            if name in _SHARED_ALGEBRA or name in _ROOT_ALGEBRA:
                new.__dict__[name] = value
        dist.TorchDistribution.__init__(new, batch_shape, self.event_shape, False)
        new._validate_args = self._validate_args
        return new

    @property
    def rank(self) -> int:
        """``d``: the precision form is full rank."""
        return self.event_shape[0]

    @lazy_property
    def _precision_form(self) -> tuple[torch.Tensor, torch.Tensor]:
        r"""``(W (d, d), diag (d,))`` with :math:`cI + WW^\top = (SS^\top)^{-1}`, float64 inside."""
        root = self.covariance_root.double()
        precision = torch.cholesky_inverse(torch.linalg.cholesky(root @ root.mT))
        floor = 0.5 * torch.linalg.eigvalsh(precision)[0]
        precision.diagonal().sub_(floor)
        factor = torch.linalg.cholesky(precision).to(self.loc.dtype)
        diag = floor.to(self.loc.dtype).expand(self.event_shape[0]).clone()
        return factor, diag

    @lazy_property
    def _factor(self) -> torch.Tensor:
        return self._precision_form[0]

    @lazy_property
    def _diag(self) -> torch.Tensor:
        return self._precision_form[1]

    @property
    def precision_factor(self) -> torch.Tensor:
        r""":math:`W`, ``(*batch, d, d)`` (computed on first use, :math:`O(d^3)`)."""
        return self._factor.expand(*self.batch_shape, *self._factor.shape)

    @property
    def precision_diag(self) -> torch.Tensor:
        r"""The diagonal of :math:`\Upsilon = cI`, ``(*batch, d)`` (computed on first use)."""
        return self._diag.expand(*self.batch_shape, self.event_shape[0])

    @property
    def variance(self) -> torch.Tensor:
        r"""Marginal variances, the rows' squared norms of :math:`S`, ``(*batch, d)``."""
        return self.covariance_root.square().sum(-1).expand(self.loc.shape)

    @property
    def covariance_matrix(self) -> torch.Tensor:
        r"""Dense :math:`SS^\top`, ``(*batch, d, d)``."""
        covariance = self.covariance_root @ self.covariance_root.mT
        return covariance.expand(*self.batch_shape, *covariance.shape)

    def reparameterize(self, noise: torch.Tensor) -> torch.Tensor:
        r""":math:`\mu + S\varepsilon` for standard normal noise ``(..., d)``, :math:`O(d^2)`."""
        return self.loc + noise @ self.covariance_root.mT


_ROOT_ALGEBRA = ("_precision_form", "_factor", "_diag")
