r"""Closed-form KL divergences between the guides' Gaussians and Gaussian priors.

This module holds the KL rules the ELBO uses: :func:`diagonal_normal_kl`, a fast path for
diagonal Gaussians, and, registered with ``torch.distributions.register_kl``,
:func:`kl_low_rank_diagonal` (a low-rank-plus-diagonal Gaussian against a diagonal one) and
:func:`kl_diagonal_low_rank` and :func:`kl_low_rank_low_rank` (a diagonal or a low-rank
Gaussian against a low-rank one, such as a prior made from a low-rank guide by
:func:`~pyro_bbb.priors.from_guide`; the prior's parts are computed once). Both sides (guides
and the ELBO) may import this module; it imports neither.

**Diagonal Gaussians.** ``torch.distributions.kl_divergence(Normal, Normal)`` evaluates

.. math::

    \tfrac12\Big(\tfrac{\sigma_q^2}{\sigma_p^2} + \tfrac{(\mu_q-\mu_p)^2}{\sigma_p^2} - 1
        - \log\tfrac{\sigma_q^2}{\sigma_p^2}\Big)

element by element, with the prior's parameters broadcast to the weights' shape: about a
dozen passes over every weight tensor forward and as many backward. A Bayesian layer's prior
is almost always one scalar :math:`(\mu_p, \sigma_p)` expanded to the weight's shape (stride
0), and then the sum over a site's ``n`` weights reduces to

.. math::

    \mathrm{KL} = \frac{\sum \sigma_q^2 + \sum (\mu_q-\mu_p)^2}{2\sigma_p^2}
        - \sum \log\sigma_q + n\big(\log\sigma_p - \tfrac12\big),

three reductions (the sums of squares as dot products, which write no squared copy), less
than a hand-written Bayes by Backprop loss costs. Guide parameters broadcast over particle
dims (stride 0) are likewise evaluated once. Anything else (a prior with per-weight
parameters) gets the elementwise formula, still without materialising the broadcast prior.
"""

from __future__ import annotations

import math
from weakref import WeakKeyDictionary

import pyro.distributions as dist
import torch
from torch.distributions import Distribution, Independent, Normal, register_kl

from .._pyro_compat import low_rank_capacitance_tril, low_rank_parts
from .._shapes import collapse_broadcast

__all__ = [
    "diagonal_normal_kl",
    "kl_diagonal_low_rank",
    "kl_low_rank_diagonal",
    "kl_low_rank_low_rank",
    "kl_to_scalar_normal",
    "scalar_normal_parameters",
]

_NORMALS = (Normal, dist.Normal)


def _normal_and_event_dims(d: Distribution) -> tuple[Normal, int] | None:
    event_dims = 0
    while isinstance(d, Independent):
        event_dims += d.reinterpreted_batch_ndims
        d = d.base_dist
    if type(d) not in _NORMALS:  # a subclass may mean something else
        return None
    return d, event_dims


def _is_broadcast_scalar(t: torch.Tensor) -> bool:
    return all(s == 0 or n == 1 for s, n in zip(t.stride(), t.shape, strict=True))


def _scalar(t: torch.Tensor) -> torch.Tensor:
    """The single value of a tensor that is one number broadcast to a shape (a view)."""
    return t.as_strided((), ())


def _number(t: torch.Tensor) -> torch.Tensor | float:
    """A constant CPU scalar as a Python float (saves tensor ops); otherwise the tensor.

    Reading a CUDA tensor would synchronise the device, and a learnable prior parameter
    must stay in the graph.
    """
    if t.device.type == "cpu" and not t.requires_grad:
        return t.item()
    return t


#: A layer builds its prior once (see BayesianLayer.prior_distribution), so the same
#: Normal comes back every step; its constants are read once.
_SCALAR_PARAMETERS: WeakKeyDictionary[Normal, tuple | None] = WeakKeyDictionary()


def _scalar_parameters(p: Normal) -> tuple[torch.Tensor | float, torch.Tensor | float] | None:
    """``(loc, scale)`` of a Normal whose parameters are each one number broadcast, else None."""
    try:
        return _SCALAR_PARAMETERS[p]
    except KeyError:
        pass
    if _is_broadcast_scalar(p.loc) and _is_broadcast_scalar(p.scale):
        constants = (_number(_scalar(p.loc)), _number(_scalar(p.scale)))
    else:
        constants = None
    if not any(isinstance(c, torch.Tensor) for c in constants or ()):
        _SCALAR_PARAMETERS[p] = constants  # tensors (learnable, CUDA) are read every time
    return constants


def diagonal_normal_kl(q: Distribution, p: Distribution) -> torch.Tensor | None:
    r""":math:`\mathrm{KL}(q \| p)` for two (reinterpreted) Normals of one shape, or ``None``.

    Equal to ``torch.distributions.kl_divergence(q, p)`` (summed over the event dims, shape
    ``batch_shape``) but computed without materialising broadcast parameters.

    Args:
        q: ``Normal`` or ``Independent(Normal)`` (the guide's distribution of a site).
        p: The same kind, with the same batch and event shapes (the prior).

    Returns:
        The KL divergence in nats, shape ``q.batch_shape``; ``None`` when ``q`` and ``p``
        are not both diagonal Normals of one shape (the caller then falls back to the
        general rule).
    """
    q_parts, p_parts = _normal_and_event_dims(q), _normal_and_event_dims(p)
    if q_parts is None or p_parts is None:
        return None
    (q_base, event_dims), (p_base, p_event_dims) = q_parts, p_parts
    if (
        event_dims != p_event_dims
        or q.batch_shape != p.batch_shape
        or q.event_shape != p.event_shape
    ):
        return None
    batch_shape = q.batch_shape

    def total(t: torch.Tensor) -> torch.Tensor:  # over the event dims; `sum(())` sums all
        return t.sum(tuple(range(-event_dims, 0))) if event_dims else t

    q_loc = collapse_broadcast(q_base.loc, event_dims)
    q_scale = collapse_broadcast(q_base.scale, event_dims)
    constants = _scalar_parameters(p_base)
    if constants is not None:
        kl = kl_to_scalar_normal(q_loc, q_scale, *constants, event_dims=event_dims)
    else:
        p_loc = collapse_broadcast(p_base.loc, event_dims)
        p_scale = collapse_broadcast(p_base.scale, event_dims)
        ratio = q_scale / p_scale
        kl = total(0.5 * (ratio.square() + ((q_loc - p_loc) / p_scale).square() - 1) - ratio.log())
    if kl.shape == batch_shape:
        return kl
    return kl.expand(batch_shape)


def scalar_normal_parameters(
    p: Distribution,
) -> tuple[torch.Tensor | float, torch.Tensor | float] | None:
    """``(loc, scale)`` of a (reinterpreted) Normal whose parameters are one number each.

    A Python float for a constant CPU number, else a 0-d tensor; ``None`` for any other
    distribution (per-weight parameters, another family).
    """
    parts = _normal_and_event_dims(p)
    return None if parts is None else _scalar_parameters(parts[0])


def kl_to_scalar_normal(
    loc: torch.Tensor,
    scale: torch.Tensor,
    prior_loc: torch.Tensor | float,
    prior_scale: torch.Tensor | float,
    *,
    event_dims: int,
    variance: torch.Tensor | None = None,
) -> torch.Tensor:
    r""":math:`\mathrm{KL}(\mathcal{N}(\mu, \sigma^2) \| \mathcal{N}(m, s^2))` over the event dims.

    .. math::

        \frac{\sum \sigma^2 + \sum (\mu - m)^2}{2s^2} - \sum \log\sigma
            + n\big(\log s - \tfrac12\big)

    for a prior of one number :math:`(m, s)` and :math:`n` weights per event: three
    reductions (dot products for the sums of squares when a site is one event).

    Args:
        loc: :math:`\mu`, ``(*batch, *event)``.
        scale: :math:`\sigma`, broadcastable to ``loc``.
        prior_loc: :math:`m`, a number or a 0-d tensor.
        prior_scale: :math:`s`, a number or a 0-d tensor.
        event_dims: The number of trailing dims that form one event (summed over).
        variance: :math:`\sigma^2` when the caller has it already (local
            reparameterisation does): :math:`\sum \sigma^2` is then its sum, one pass
            forward and an addition to its gradient backward, where the product of
            :math:`\sigma` with itself costs three.

    Returns:
        The KL divergence in nats, ``(*batch)``.
    """
    m, s = prior_loc, prior_scale
    deviation = loc if isinstance(m, float) and m == 0.0 else loc - m
    if variance is not None and variance.shape != scale.shape:
        variance = None  # a caller's σ² of another shape: take σ·σ here
    if event_dims == loc.dim() and scale.shape == deviation.shape:  # one event: a site
        if variance is not None:
            squares = variance.sum() + _sum_of_squares(deviation)
        else:
            squares = _sum_of_squares(scale) + _sum_of_squares(deviation)
        log_scales = scale.log().sum()
        n = loc.numel()
    else:
        dims = tuple(range(-event_dims, 0))

        def total(t: torch.Tensor) -> torch.Tensor:  # over the event dims
            if event_dims == t.dim():
                return t.sum()  # one op backward too, where a list of dims unsqueezes each
            return t.sum(dims) if event_dims else t

        variance = scale.square() if variance is None else variance
        if scale.shape == deviation.shape:
            squares = total(variance + deviation.square())
        else:  # broadcast against each other (a parameter expanded over particles)
            squares = total(variance) + total(deviation.square())
        log_scales = total(scale.log())
        n = math.prod(loc.shape[loc.dim() - event_dims :])
    if isinstance(s, float):
        return squares / (2 * s * s) - log_scales + n * (math.log(s) - 0.5)
    return squares / (2 * s.square()) - log_scales + n * (s.log() - 0.5)


def _sum_of_squares(t: torch.Tensor) -> torch.Tensor:
    r""":math:`\sum t^2` as one dot product.

    ``t.square().sum()`` writes the squares to a new tensor the size of ``t`` and its
    backward makes three passes over ``t``; the dot product reads ``t`` once and its
    backward is one product per side. On a layer of 300,000 weights that is a tenth of the
    KL's cost, and two fewer allocations of the layer's size per step.
    """
    flat = t.reshape(-1)
    return torch.dot(flat, flat)


@register_kl(dist.LowRankMultivariateNormal, Independent)
def kl_low_rank_diagonal(q: dist.LowRankMultivariateNormal, p: Independent) -> torch.Tensor:
    r"""KL divergence from :math:`\mathcal{N}(\mu, D + VV^\top)` to a diagonal Gaussian.

    .. math::

        \mathrm{KL} = \tfrac12\Big[\sum_i \frac{D_i + \sum_k V_{ik}^2 + (\mu_i - m_i)^2}{s_i^2}
            - d + \sum_i \log s_i^2 - \sum_i \log D_i
            - \log\det(I_r + V^\top D^{-1} V)\Big]

    using the matrix determinant lemma for :math:`\log\det(D + VV^\top)`: cost
    :math:`O(d r^2 + r^3)`, memory :math:`O(d r)`.

    Args:
        q: Event shape ``(d,)``, rank ``r``.
        p: ``Normal(m, s).to_event(1)`` with event shape ``(d,)``.

    Returns:
        KL of the broadcast batch shape.

    Raises:
        NotImplementedError: If ``p`` is not a diagonal Normal over one event dim.
    """
    base = p.base_dist
    if p.reinterpreted_batch_ndims != 1 or not isinstance(base, torch.distributions.Normal):
        raise NotImplementedError
    loc, var = base.loc, base.scale.pow(2)
    factor, diag = low_rank_parts(q)
    trace_term = ((diag + factor.pow(2).sum(-1)) / var).sum(-1)
    mahalanobis = ((q.loc - loc).pow(2) / var).sum(-1)
    # log det(D + VVᵀ) = log det D + log det(I + Vᵀ D⁻¹ V); torch keeps the Cholesky factor of
    # that r × r capacitance matrix from the constructor, so it is not factorised again.
    capacitance_tril = low_rank_capacitance_tril(q)
    log_det_q = diag.log().sum(-1) + 2 * capacitance_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    d = q.event_shape[-1]
    return 0.5 * (trace_term + mahalanobis - d + var.log().sum(-1) - log_det_q)


#: A carried low-rank prior (``GaussianBlock.joint``) is the same object every step; the parts
#: of its inverse covariance are computed once.
_LOW_RANK_PARTS: WeakKeyDictionary[Distribution, tuple] = WeakKeyDictionary()


def _low_rank_inverse(p: dist.LowRankMultivariateNormal) -> tuple[torch.Tensor, ...]:
    r"""``(A, colsum(A∘A), log det Σ)`` of a low-rank Gaussian's covariance :math:`\Sigma`.

    :math:`\Sigma = D + VV^\top` and, by Woodbury's identity, :math:`\Sigma^{-1} = D^{-1} -
    A^\top A` with :math:`A = L^{-1} V^\top D^{-1}` (``(r, d)``), where :math:`LL^\top = I_r +
    V^\top D^{-1} V` is the capacitance torch factorised when ``p`` was built; the log
    determinant by the matrix determinant lemma. Kept for a ``p`` with constant parameters.
    """
    parts = _LOW_RANK_PARTS.get(p)
    if parts is not None:
        return parts
    (factor, diag), tril = low_rank_parts(p), low_rank_capacitance_tril(p)
    a = torch.linalg.solve_triangular(tril, factor.mT / diag.unsqueeze(-2), upper=False)
    log_det = diag.log().sum(-1) + 2 * tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    parts = (a, a.pow(2).sum(-2), log_det)
    if not (factor.requires_grad or diag.requires_grad):
        _LOW_RANK_PARTS[p] = parts
    return parts


def _against_low_rank(
    delta: torch.Tensor,
    trace_diag: torch.Tensor,
    log_det_q: torch.Tensor,
    p: dist.LowRankMultivariateNormal,
    q_factor: torch.Tensor | None = None,
) -> torch.Tensor:
    r""":math:`\mathrm{KL}(q \| p)` for a Gaussian q against a low-rank p.

    From :math:`\delta = m - \mu`, the diagonal part of q's covariance, :math:`\log\det
    \Sigma_q` and q's factor (``None`` for a diagonal q).
    """
    a, a2, log_det_p = _low_rank_inverse(p)
    diag = low_rank_parts(p)[1]
    # tr(Σ_p⁻¹ Σ_q) with Σ_q = S + V_q V_qᵀ: Σ S/D - colsum(A∘A)·S, then the factor's part
    trace = (trace_diag / diag).sum(-1) - (a2 * trace_diag).sum(-1)
    if q_factor is not None:
        trace = trace + (q_factor.pow(2).sum(-1) / diag).sum(-1)
        trace = trace - (a @ q_factor).pow(2).sum((-2, -1))
    projected = (a @ delta.unsqueeze(-1)).squeeze(-1)
    mahalanobis = (delta.pow(2) / diag).sum(-1) - projected.pow(2).sum(-1)
    d = p.event_shape[-1]
    return 0.5 * (trace + mahalanobis - d + log_det_p - log_det_q)


@register_kl(Independent, dist.LowRankMultivariateNormal)
def kl_diagonal_low_rank(q: Independent, p: dist.LowRankMultivariateNormal) -> torch.Tensor:
    r"""KL divergence from a diagonal Gaussian to :math:`\mathcal{N}(\mu, D + VV^\top)`.

    For :math:`q = \mathcal{N}(m, S)` with :math:`S` diagonal, and
    :math:`\Sigma_p^{-1} = D^{-1} - A^\top A` (Woodbury, :math:`A = L^{-1} V^\top D^{-1}`
    with :math:`LL^\top = I_r + V^\top D^{-1} V`),

    .. math::

        \mathrm{KL} = \tfrac12\Big[\sum_i \frac{S_i + \delta_i^2}{D_i}
            - \sum_i S_i \sum_k A_{ki}^2 - \lVert A\delta \rVert^2 - d
            + \log\det\Sigma_p - \sum_i \log S_i\Big], \qquad \delta = m - \mu,

    with :math:`\log\det\Sigma_p = \sum_i \log D_i + 2\sum_k \log L_{kk}` (the
    determinant lemma). The prior's parts are computed once for a constant prior; then each
    call costs :math:`O(d r)` and no :math:`d \times d` matrix.

    Args:
        q: ``Normal(m, s).to_event(1)`` with event shape ``(d,)`` (a mean-field guide over a
            block's sites, flattened).
        p: Event shape ``(d,)``, rank ``r``.

    Returns:
        KL of the broadcast batch shape.

    Raises:
        NotImplementedError: If ``q`` is not a diagonal Normal over one event dim.
    """
    parts = _normal_and_event_dims(q)
    if parts is None or parts[1] != 1:
        raise NotImplementedError
    base = parts[0]
    delta = collapse_broadcast(base.loc, 1) - p.loc
    variance = collapse_broadcast(base.scale, 1).pow(2)
    kl = _against_low_rank(delta, variance, variance.log().sum(-1), p)
    return _expanded(kl, q, p)


@register_kl(dist.LowRankMultivariateNormal, dist.LowRankMultivariateNormal)
def kl_low_rank_low_rank(
    q: dist.LowRankMultivariateNormal, p: dist.LowRankMultivariateNormal
) -> torch.Tensor:
    r"""KL divergence between two low-rank-plus-diagonal Gaussians.

    For :math:`q = \mathcal{N}(m, S + WW^\top)` (rank :math:`r_q`) and
    :math:`p = \mathcal{N}(\mu, D + VV^\top)` (rank :math:`r`), with :math:`A` as in
    :func:`kl_diagonal_low_rank`,

    .. math::

        \mathrm{tr}(\Sigma_p^{-1}\Sigma_q) = \sum_i \frac{S_i + \sum_j W_{ij}^2}{D_i}
            - \sum_i S_i \sum_k A_{ki}^2 - \lVert A W \rVert_F^2,

    and :math:`\log\det\Sigma_q` by the determinant lemma from the capacitance torch keeps.
    Equal to torch's rule for the pair; this one computes the prior's parts once for a
    constant prior (a carried posterior), so each step costs :math:`O(d\, r\, r_q)`.

    Args:
        q: Event shape ``(d,)`` (a low-rank guide's block).
        p: Event shape ``(d,)``.

    Returns:
        KL of the broadcast batch shape.
    """
    if q.event_shape != p.event_shape:
        raise ValueError(
            f"the two Gaussians have event shapes {tuple(q.event_shape)} and {tuple(p.event_shape)}"
        )
    factor, diag = low_rank_parts(q)
    tril = low_rank_capacitance_tril(q)
    log_det_q = diag.log().sum(-1) + 2 * tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    delta = collapse_broadcast(q.loc, 1) - p.loc
    kl = _against_low_rank(delta, diag, log_det_q, p, factor)
    return _expanded(kl, q, p)


def _expanded(kl: torch.Tensor, q: Distribution, p: Distribution) -> torch.Tensor:
    shape = torch.broadcast_shapes(q.batch_shape, p.batch_shape)
    return kl.expand(shape) if kl.shape != shape else kl
