r"""R-VGA: the recursive variational Gaussian approximation, with a full covariance.

Lambert, Bonnabel and Bach (2022), "The recursive variational Gaussian approximation
(R-VGA)", Statistics and Computing 32, https://arxiv.org/abs/2107.04409. Online variational
inference with a Gaussian :math:`q_t = \mathcal{N}(\mu_t, P_t)` asks at each step for the
:math:`q` closest to :math:`q_{t-1}(\theta)\,p(y_t \mid \theta)`; its fixed point gives the
recursion

.. math::

    P_t^{-1} = P_{t-1}^{-1} + \mathbb{E}_{q}\big[-\nabla^2_\theta \log p(y_t \mid \theta)\big],
    \qquad
    \mu_t = \mu_{t-1} + P_t\, \mathbb{E}_{q}\big[\nabla_\theta \log p(y_t \mid \theta)\big],

with the expectations under :math:`q_{t-1}`: the explicit scheme, exact for Bayesian linear
regression (the Kalman filter). The optimal :math:`q_t` solves the same equations with the
expectations under :math:`q_t` itself and :math:`P_{t-1}` in the mean's (the implicit
scheme); ``num_iterations > 1`` approaches it by Gauss-Newton steps, each with the
expectations under the last iterate :math:`q^{(i)} = \mathcal{N}(\mu^{(i)}, P^{(i)})`,

.. math::

    P^{(i+1)} = \big(P_{t-1}^{-1} + \mathbb{E}_{q^{(i)}}[-\nabla^2 \log p]\big)^{-1},
    \qquad
    \mu^{(i+1)} = \mu^{(i)} + P^{(i+1)}\big(P_{t-1}^{-1}(\mu_{t-1} - \mu^{(i)})
        + \mathbb{E}_{q^{(i)}}[\nabla \log p]\big),

the first of which is the explicit step (as the iterated extended Kalman filter relates to the
extended one); on a linear-Gaussian model every iterate is exact. For a network the Hessian is
replaced by the generalised Gauss-Newton matrix :math:`J^\top H J`
(:mod:`~pyro_bbb.online.observation`), and the expectations are taken either by Monte Carlo,
over draws :math:`\theta_s \sim q` (mirrored in pairs :math:`\mu \pm \varepsilon_s`, so
their mean is :math:`\mu` exactly), or linearised at the mean (then R-VGA is the extended
Kalman filter in information form).

The covariance is kept as a square root, :math:`P = SS^\top`: with the minibatch's
curvature :math:`AA^\top` (:math:`A = [J_n^\top L_n]_n`, ``k`` columns) and :math:`B = S^\top A`,

.. math::

    P_t = S(I + BB^\top)^{-1}S^\top = S'S'^\top, \qquad
    S' = S\big(I - B\,Q\,\mathrm{diag}(c)\,Q^\top B^\top\big),\;
    c_j = \frac{1}{\sqrt{1+\lambda_j}\,(1+\sqrt{1+\lambda_j})},

from the eigendecomposition :math:`B^\top B = Q\,\mathrm{diag}(\lambda)\,Q^\top`: :math:`O(d^2 k)`
per step, and :math:`P` stays positive definite by construction. A full covariance is
:math:`d^2` numbers: R-VGA is for networks of up to a few thousand weights; LoFi
(:mod:`~pyro_bbb.online.lofi`) is its low-rank, linear-cost successor.

This module holds :class:`RVGAState`, the pure :func:`init`, :func:`predict`, :func:`draws`
and :func:`update`, and :class:`RVGA`, the updater a user drives one minibatch at a time.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from .._validation import check_int
from .guide import CovarianceRoot
from .updater import FilterAlgebra, OnlineUpdater, Start

__all__ = [
    "RVGA",
    "RVGAState",
    "covariance_rows",
    "draws",
    "init",
    "output_covariance",
    "precision_times",
    "predict",
    "shift_prior",
    "update",
]


class RVGAState(NamedTuple):
    r"""The belief :math:`\mathcal{N}(\mu, SS^\top)`.

    Attributes:
        mean: :math:`\mu`, ``(d,)``.
        covariance_root: :math:`S`, ``(d, d)``, any square root of the covariance.
    """

    mean: torch.Tensor
    covariance_root: torch.Tensor


def init(mean: torch.Tensor, covariance: torch.Tensor) -> RVGAState:
    """A belief from a mean ``(d,)`` and a covariance: ``(d,)`` (a diagonal) or ``(d, d)``."""
    if covariance.dim() == 1:
        return RVGAState(mean, torch.diag(covariance.sqrt()))
    return RVGAState(mean, torch.linalg.cholesky(covariance))


def predict(state: RVGAState, dynamics_noise: float) -> RVGAState:
    r""":math:`P + qI`: the drift before a step (a Cholesky factorisation, :math:`O(d^3)`)."""
    if dynamics_noise == 0:
        return state
    root = state.covariance_root
    covariance = root @ root.mT
    covariance.diagonal().add_(dynamics_noise)
    return RVGAState(state.mean, torch.linalg.cholesky(covariance))


def draws(state: RVGAState, num_samples: int) -> torch.Tensor:
    r"""``num_samples`` (even) draws :math:`\mu \pm S\varepsilon_s`, mirrored, ``(num_samples, d)``.

    Uses torch's global random state.
    """
    half = num_samples // 2
    eps = torch.randn(half, state.mean.shape[0], dtype=state.mean.dtype, device=state.mean.device)
    offsets = eps @ state.covariance_root.mT
    return state.mean + torch.cat([offsets, -offsets])


def update(
    state: RVGAState,
    gradient: torch.Tensor,
    curvature_rows: torch.Tensor,
    *,
    iterate: torch.Tensor | None = None,
) -> RVGAState:
    r"""One R-VGA step from the expected gradient and curvature.

    With ``iterate`` :math:`\mu^{(i)}`, a Gauss-Newton step on the implicit equations from it
    (the module's notes): the gradient gains the prior's pull
    :math:`P_{t-1}^{-1}(\mu_{t-1} - \mu^{(i)})` and the step starts at :math:`\mu^{(i)}`.

    Args:
        state: :math:`q_{t-1}`.
        gradient: :math:`\mathbb{E}_q[\nabla_\theta \log p(y_t \mid \theta)]`, ``(d,)``.
        curvature_rows: :math:`A^\top`, ``(k, d)``, with :math:`AA^\top` the expected
            Gauss-Newton matrix of the minibatch.
        iterate: :math:`\mu^{(i)}` ``(d,)``, where the expectations were taken; ``None`` for
            the explicit step, at :math:`q_{t-1}`.

    Returns:
        :math:`q_t`.
    """
    if iterate is not None:
        gradient = gradient + precision_times(state, state.mean - iterate)
        state = RVGAState(iterate, state.covariance_root)
    mean, root = state
    projected = curvature_rows @ root  # Bᵀ = AᵀS, (k, d)
    k, d = projected.shape
    if k < d:
        gram = (projected @ projected.mT).double()
        eigenvalues, vectors = torch.linalg.eigh(gram)
        lifted = (1 + eigenvalues.clamp_min(0)).sqrt()
        mix = (vectors / (lifted * (1 + lifted))) @ vectors.mT
        root = root - (root @ projected.mT) @ mix.to(root.dtype) @ projected
    else:
        inner = torch.eye(d, dtype=torch.float64, device=root.device)
        inner = inner + (projected.mT @ projected).double()
        tril = torch.linalg.cholesky(inner).to(root.dtype)
        root = torch.linalg.solve_triangular(tril, root.mT, upper=False).mT  # S L⁻ᵀ
    return RVGAState(mean + root @ (root.mT @ gradient), root)


def precision_times(state: RVGAState, vector: torch.Tensor) -> torch.Tensor:
    r""":math:`P^{-1}v = S^{-\top}S^{-1}v` for ``vector`` ``(d,)`` (two solves, :math:`O(d^3)`)."""
    root = state.covariance_root
    inner = torch.linalg.solve(root, vector)
    return torch.linalg.solve(root.mT, inner)


def covariance_rows(state: RVGAState, rows: torch.Tensor) -> torch.Tensor:
    r"""``rows @ P``: :math:`(Pa)^\top = ((a^\top S)S^\top)` for rows ``(k, d)``; ``(k, d)``."""
    root = state.covariance_root
    return (rows @ root) @ root.mT


def shift_prior(state: RVGAState, delta: torch.Tensor, anchor: torch.Tensor) -> RVGAState:
    r"""Precision :math:`P^{-1} + \mathrm{diag}(\delta)`, and the mean's step towards ``anchor``.

    With :math:`LL^\top = I + S^\top\mathrm{diag}(\delta)S` (Cholesky, :math:`O(d^3)`),
    :math:`S' = SL^{-\top}` is a root of the new covariance; the mean takes the Newton step of
    the changed prior term, :math:`\mu + S'S'^\top\,\delta\odot(\mu_0 - \mu)`.

    Args:
        state: The belief.
        delta: The added precision ``(d,)``, negative only where the precision stays positive.
        anchor: :math:`\mu_0` ``(d,)``, the prior's mean.
    """
    mean, root = state
    inner = root.mT @ (delta.unsqueeze(-1) * root)
    inner.diagonal().add_(1)
    tril = torch.linalg.cholesky(inner.double()).to(root.dtype)
    root = torch.linalg.solve_triangular(tril, root.mT, upper=False).mT
    step = root @ (root.mT @ (delta * (anchor - mean)))
    return RVGAState(mean + step, root)


def output_covariance(state: RVGAState, rows: torch.Tensor) -> torch.Tensor:
    r""":math:`APA^\top = (AS)(AS)^\top` for rows :math:`A` ``(..., k, d)``; ``(..., k, k)``."""
    projected = rows @ state.covariance_root
    return projected @ projected.mT


class RVGA(OnlineUpdater):
    r"""The recursive variational Gaussian approximation over a BNN's weights (full covariance).

    ``rvga.update(x, y)`` folds a minibatch (or one point) into the belief by the R-VGA
    recursion (the module's notes have the maths): expected gradient and expected
    Gauss-Newton matrix under the belief, by Monte Carlo over ``num_samples`` mirrored draws
    or linearised at the mean. :attr:`guide` is the belief at every point of the stream, a
    full-rank :class:`~pyro_bbb.online.LowRankPrecisionGuide` that draws with the filter's own
    covariance root (:math:`O(d^2)` a draw) and computes the precision form
    (:math:`O(d^3)`) only when something asks for it.

    Args:
        model: A :class:`~pyro_bbb.BNN` with Gaussian priors on its weights and a Gaussian
            (fixed or learned scale), Categorical or Bernoulli likelihood.
        guide: The belief to start from: ``None`` for the prior (means at the network's
            initialisation), a trained :class:`~pyro_bbb.MeanFieldGuide` or
            :class:`~pyro_bbb.LowRankGuide`, or a full-rank
            :class:`~pyro_bbb.online.LowRankPrecisionGuide` (then updated in place).
        num_samples: Draws for the expectations, even, ``>= 2``; ignored when ``linearised``.
        linearised: Take the expectations at the mean (the extended Kalman filter).
        num_iterations: Gauss-Newton steps towards the implicit scheme (1: the explicit
            R-VGA).
        dynamics_noise: :math:`q \ge 0`, weight variance added before each step.
        init_loc: The starting mean when ``guide`` is ``None``.
        learn_prior_scale: Learn the prior's scale from the stream (see
            :class:`~pyro_bbb.online.OnlineUpdater`): a Gaussian likelihood's, from a start
            with a diagonal precision (the prior or a ``MeanFieldGuide``); each change
            re-factorises the covariance, :math:`O(d^3)`, so the belief follows once it has
            moved by 10 %.

    Raises:
        TypeError: On a model that is not a ``BNN`` or an unsupported guide.
        ValueError: On bad options (``learn_prior_scale`` for a classifier, or a start whose
            precision is not diagonal, included); at the first update, on non-Gaussian
            priors.
    """

    def __init__(
        self,
        model: Any,
        guide: Any = None,
        *,
        num_samples: int = 10,
        linearised: bool = False,
        num_iterations: int = 1,
        dynamics_noise: float = 0.0,
        init_loc: Any = None,
        learn_prior_scale: bool = False,
    ) -> None:
        self.num_samples = check_int("num_samples", num_samples, minimum=2)
        if self.num_samples % 2:
            raise ValueError(f"num_samples must be even (mirrored pairs), got {num_samples}")
        self.linearised = bool(linearised)
        super().__init__(
            model,
            guide,
            algebra=FilterAlgebra(
                predict, draws, update, output_covariance, covariance_rows, shift_prior
            ),
            guide_rank=None,
            dynamics_noise=dynamics_noise,
            init_loc=init_loc,
            learn_prior_scale=learn_prior_scale,
            num_iterations=check_int("num_iterations", num_iterations),
            num_draws=None if self.linearised else self.num_samples,
        )

    def _init_state(self, start: Start) -> RVGAState:
        if start.covariance_root is not None:
            return RVGAState(start.mean, start.covariance_root)
        if start.covariance is not None:
            return init(start.mean, start.covariance)
        if start.precision_factor is None or start.precision_factor.shape[1] == 0:
            return init(start.mean, start.precision_diag.reciprocal())
        factor = start.precision_factor
        precision = torch.diag(start.precision_diag) + factor @ factor.mT
        return init(start.mean, torch.cholesky_inverse(torch.linalg.cholesky(precision)))

    #: A shift re-factorises the covariance, O(d³): the belief follows the learned scale
    #: once it has moved by 10 %.
    prior_shift_tolerance = math.log(1.1)

    def _belief(self, state: RVGAState) -> CovarianceRoot:
        """The covariance root itself: draws need nothing more (the precision form waits)."""
        return CovarianceRoot(state.mean, state.covariance_root)

    def _check_guide(self, guide) -> None:
        if guide.rank is not None:
            raise ValueError(
                f"RVGA keeps a full covariance: its guide must have rank=None (full), got "
                f"rank {guide.rank}"
            )
