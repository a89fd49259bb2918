r"""LoFi: a low-rank extended Kalman filter over a network's weights, in precision form.

The belief is :math:`\mathcal{N}(\mu, \Lambda^{-1})` with a diagonal-plus-low-rank precision
:math:`\Lambda = \Upsilon + WW^\top`, :math:`W \in \mathbb{R}^{d\times r}` (Chang, Durán-Martín,
Shestopaloff, Jones and Murphy 2023, "Low-rank extended Kalman filtering for online learning
of neural networks from streaming data", https://arxiv.org/abs/2305.19535). Each minibatch is
one step of Bayes' rule with the network linearised at the mean, which is also one natural
gradient step of the Bayesian online natural gradient with a linearised likelihood (BONG,
Jones, Chang and Murphy 2024, https://arxiv.org/abs/2405.19681):

.. math::

    \tilde\Lambda = \Upsilon + WW^\top + AA^\top, \qquad
    \mu' = \mu + \tilde\Lambda^{-1} \textstyle\sum_n J_n^\top g_n,

with :math:`A = [J_n^\top L_n]_n` (:math:`d \times BC`) the root of the minibatch's Gauss-Newton
matrix and :math:`g_n, L_n` the likelihood's gradient and curvature root
(:mod:`~pyro_bbb.online.observation`). :math:`\tilde\Lambda^{-1}` acts through Woodbury with the
:math:`m \times m` capacitance, :math:`m = r + BC`. Then the precision goes back to rank
:math:`r`: with :math:`\tilde W = [W, A] = USV^\top`, keep :math:`W' = U_rS_r` and move the
diagonal of the discarded part onto :math:`\Upsilon`,

.. math::

    \Upsilon' = \Upsilon + \mathrm{diag}\big(\tilde W \tilde W^\top - W'W'^\top\big),

so the precision's diagonal stays exact. With :math:`r` at least the number of weights nothing
is discarded and, on a linear-Gaussian model, the filter is the exact Kalman filter. The SVD
comes from the :math:`m \times m` Gram matrix, so a step costs :math:`O(d m^2)`: linear in
:math:`d`.

**Drift.** Before a step, a dynamics noise :math:`q` (weight variance per step) turns the
covariance :math:`\Lambda^{-1}` into :math:`\Lambda^{-1} + qI`, and that stays in the family
exactly, at the same rank (:func:`predict`).

This module holds :class:`LoFiState`, the pure :func:`init`, :func:`predict` and
:func:`update`, and :class:`LoFi`, the updater a user drives one minibatch at a time.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import torch

from .._validation import check_int
from ..priors.precision_normal import CovarianceRootNormal, LowRankPrecisionNormal
from .guide import Belief, LowRankPrecisionGuide
from .updater import FilterAlgebra, OnlineUpdater, Start

__all__ = [
    "LoFi",
    "LoFiState",
    "covariance_rows",
    "draws",
    "init",
    "output_covariance",
    "predict",
    "shift_prior",
    "update",
]


class LoFiState(NamedTuple):
    r"""The belief :math:`\mathcal{N}(\mu, (\Upsilon + WW^\top)^{-1})`.

    Attributes:
        mean: :math:`\mu`, ``(d,)``.
        precision_diag: The diagonal of :math:`\Upsilon`, ``(d,)``, positive.
        precision_factor: :math:`W`, ``(d, r)``.
    """

    mean: torch.Tensor
    precision_diag: torch.Tensor
    precision_factor: torch.Tensor


def init(
    mean: torch.Tensor,
    precision_diag: torch.Tensor,
    precision_factor: torch.Tensor | None = None,
    *,
    rank: int,
) -> LoFiState:
    """A belief of rank ``rank``, from a mean and a diagonal-plus-low-rank precision.

    A factor with fewer columns is padded with zeros; one with more is brought to ``rank``
    as :func:`update` does (top singular directions kept, the rest's diagonal kept).

    Args:
        mean: ``(d,)``.
        precision_diag: ``(d,)``, positive.
        precision_factor: ``(d, k)`` or ``None`` (a diagonal precision).
        rank: ``r >= 0``.
    """
    d = mean.shape[0]
    if precision_factor is None:
        precision_factor = mean.new_zeros(d, 0)
    if precision_factor.shape[1] <= rank:
        pad = mean.new_zeros(d, rank - precision_factor.shape[1])
        return LoFiState(mean, precision_diag, torch.cat([precision_factor, pad], 1))
    factor, discarded = _project(precision_factor, rank)
    return LoFiState(mean, precision_diag + discarded, factor)


def predict(state: LoFiState, dynamics_noise: float) -> LoFiState:
    r"""Add :math:`qI` to the covariance, exactly, keeping the rank.

    With :math:`s = 1/(1 + q\Upsilon)` (elementwise), Woodbury gives
    :math:`(\Lambda^{-1} + qI)^{-1} = \Upsilon s + \bar W \bar W^\top`,
    :math:`\bar W = \mathrm{diag}(s) W R^{-\top}`, :math:`RR^\top = I + qW^\top \mathrm{diag}(s) W`.

    Args:
        state: The belief.
        dynamics_noise: :math:`q \ge 0`, weight variance added per step.
    """
    if dynamics_noise == 0:
        return state
    shrink = 1 / (1 + dynamics_noise * state.precision_diag)
    factor = state.precision_factor * shrink.unsqueeze(-1)
    wide = factor.double()
    inner = torch.eye(factor.shape[1], dtype=torch.float64, device=factor.device)
    inner = inner + dynamics_noise * state.precision_factor.double().mT @ wide
    root = torch.linalg.cholesky(inner)
    factor = torch.linalg.solve_triangular(root, wide.mT, upper=False).mT.to(factor.dtype)
    return LoFiState(state.mean, state.precision_diag * shrink, factor)


def update(
    state: LoFiState,
    gradient: torch.Tensor,
    curvature_rows: torch.Tensor,
    *,
    iterate: torch.Tensor | None = None,
    step_size: float = 1.0,
) -> LoFiState:
    r"""One linearised Bayes step, then the projection back to rank :math:`r`.

    From the belief :math:`\mathcal N(\mu, \Lambda^{-1})` before the minibatch and the
    likelihood linearised at an iterate :math:`\mu^{(i)}` (the mean itself for the plain
    step), the Gauss-Newton step on the one-step posterior,

    .. math::

        \tilde\Lambda = \Lambda + AA^\top, \qquad
        \mu^{(i+1)} = \mu^{(i)} + s\,\tilde\Lambda^{-1}\big(\textstyle\sum_n J_n^\top g_n
            + \Lambda(\mu - \mu^{(i)})\big),

    with :math:`J_n, g_n, A` taken at :math:`\mu^{(i)}` and :math:`s` the step size: with
    :math:`\mu^{(i)} = \mu` and :math:`s = 1` the extended Kalman filter's step (BONG's one
    natural-gradient step of unit size), repeated the iterated one.

    Args:
        state: The belief before the minibatch.
        gradient: :math:`\sum_n J_n^\top g_n`, ``(d,)``: the log-likelihood's gradient in the
            weights at the iterate.
        curvature_rows: :math:`A^\top`, ``(k, d)``: rows whose outer products add up to the
            minibatch's Gauss-Newton matrix, :math:`\sum_n J_n^\top H_n J_n = AA^\top`.
        iterate: :math:`\mu^{(i)}` ``(d,)``; ``None`` for the belief's mean.
        step_size: :math:`s \in (0, 1]`.

    Returns:
        The belief after the minibatch, of the same rank.
    """
    mean, diag, factor = state
    if iterate is not None:  # Λ(μ − μ⁽ⁱ⁾) = Υδ + W(Wᵀδ)
        offset = mean - iterate
        gradient = gradient + diag * offset + factor @ (factor.mT @ offset)
        mean = iterate
    rank = factor.shape[1]
    inverse = 1 / diag
    # Woodbury: Λ̃⁻¹g = Υ⁻¹g − Υ⁻¹W̃ K̃⁻¹ W̃ᵀΥ⁻¹g, K̃ = I + W̃ᵀΥ⁻¹W̃, W̃ = [W, A]. The k rows of
    # A are the big operand (k·d): each pass over them is read once where it can be.
    scaled_factor = factor * inverse.unsqueeze(-1)
    scaled_rows = curvature_rows * inverse
    both = curvature_rows @ torch.cat([factor, scaled_factor], 1)  # AᵀW and AᵀΥ⁻¹W
    rows_factor, rows_scaled_factor = both[:, :rank], both[:, rank:]
    capacitance = _blocks(
        factor.mT @ scaled_factor, rows_scaled_factor, curvature_rows @ scaled_rows.mT
    )
    capacitance.diagonal().add_(1)
    v = gradient * inverse
    projected = torch.cat([factor.mT @ v, curvature_rows @ v]).double()
    solved = torch.linalg.solve(capacitance, projected).to(mean.dtype)
    step = v - scaled_factor @ solved[:rank] - scaled_rows.mT @ solved[rank:]
    gram = _blocks(factor.mT @ factor, rows_factor, curvature_rows @ curvature_rows.mT)
    new_factor, discarded = _project_gram(factor, curvature_rows, gram, rank)
    return LoFiState(mean + step_size * step, diag + discarded, new_factor)


def draws(state: LoFiState, num_samples: int) -> torch.Tensor:
    r"""``num_samples`` (even) draws :math:`\mu \pm \varepsilon_s`, mirrored, ``(num_samples, d)``.

    Uses torch's global random state.
    """
    fn = LowRankPrecisionNormal(state.mean, state.precision_factor, state.precision_diag)
    noise = torch.randn(num_samples // 2, state.mean.shape[0], dtype=state.mean.dtype)
    offsets = fn.reparameterize(noise.to(state.mean.device)) - state.mean
    return state.mean + torch.cat([offsets, -offsets])


def covariance_rows(state: LoFiState, rows: torch.Tensor) -> torch.Tensor:
    r"""``rows @ Λ⁻¹``: :math:`(\Lambda^{-1}a)^\top` for each row :math:`a` ``(k, d)``; ``(k, d)``.

    By Woodbury, :math:`\Lambda^{-1}a = \Upsilon^{-1}a - \Upsilon^{-1}WK^{-1}W^\top
    \Upsilon^{-1}a` with :math:`K = I + W^\top\Upsilon^{-1}W`, :math:`O(kdr + r^3)`.
    """
    _, diag, factor = state
    scaled_rows = rows * (1 / diag)
    scaled_factor = (factor / diag.unsqueeze(-1)).double()
    capacitance = torch.eye(factor.shape[1], dtype=torch.float64, device=factor.device)
    capacitance = capacitance + factor.double().mT @ scaled_factor
    solved = torch.linalg.solve(capacitance, factor.double().mT @ scaled_rows.double().mT)
    return scaled_rows - (scaled_factor @ solved).mT.to(rows.dtype)


def shift_prior(state: LoFiState, delta: torch.Tensor, anchor: torch.Tensor) -> LoFiState:
    r"""Precision :math:`\Lambda + \mathrm{diag}(\delta)`, and the mean's step towards ``anchor``.

    :math:`\Upsilon' = \Upsilon + \delta` (exact: the prior's precision sits in the
    diagonal), :math:`\mu' = \mu + \Lambda'^{-1}\,\delta\odot(\mu_0 - \mu)`, the Newton step
    of the changed prior term; exact on a linear-Gaussian model.

    Args:
        state: The belief.
        delta: The added precision ``(d,)``; may be negative where it keeps the diagonal
            positive.
        anchor: :math:`\mu_0` ``(d,)``, the prior's mean.
    """
    mean, diag, factor = state
    shifted = LoFiState(mean, diag + delta, factor)
    step = covariance_rows(shifted, (delta * (anchor - mean)).unsqueeze(0)).squeeze(0)
    return LoFiState(mean + step, shifted.precision_diag, factor)


def output_covariance(state: LoFiState, rows: torch.Tensor) -> torch.Tensor:
    r""":math:`A\Lambda^{-1}A^\top` for rows :math:`A` ``(..., k, d)``; ``(..., k, k)``.

    By Woodbury, :math:`O(kdr + k^2d)`: the belief's predicted covariance of outputs whose
    Jacobian rows are ``rows``.
    """
    _, diag, factor = state
    inverse = 1 / diag
    first = (rows * inverse) @ rows.mT
    scaled = (factor * inverse.unsqueeze(-1)).double()
    capacitance = torch.eye(factor.shape[1], dtype=torch.float64, device=factor.device)
    capacitance = capacitance + factor.double().mT @ scaled
    root = torch.linalg.cholesky(capacitance)
    whitened = torch.linalg.solve_triangular(root, scaled.mT @ rows.double().mT, upper=False)
    return first - (whitened.mT @ whitened).to(first.dtype)


def _blocks(top_left, bottom_left, bottom_right) -> torch.Tensor:
    """The symmetric ``[[TL, BLᵀ], [BL, BR]]`` in float64."""
    top = torch.cat([top_left, bottom_left.mT], 1)
    bottom = torch.cat([bottom_left, bottom_right], 1)
    return torch.cat([top, bottom], 0).double()


def _project_gram(
    factor: torch.Tensor, rows: torch.Tensor, gram: torch.Tensor, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The top-``rank`` part of :math:`\tilde W = [W, A]` and the diagonal of the rest.

    From the Gram matrix :math:`\tilde W^\top\tilde W = Q\,\mathrm{diag}(s^2)\,Q^\top`:
    :math:`W' = \tilde W Q_r = U_r S_r`, and the rest's diagonal is
    :math:`\mathrm{diag}(\tilde W\tilde W^\top) - \mathrm{diag}(W'W'^\top)`, without
    concatenating the two factors or forming the rest.
    """
    _, vectors = torch.linalg.eigh(gram)  # ascending
    top = vectors[:, vectors.shape[1] - rank :].flip(-1).to(factor.dtype)
    r = factor.shape[1]
    kept = factor @ top[:r] + rows.mT @ top[r:]
    total = factor.square().sum(-1) + torch.linalg.vector_norm(rows, dim=0).square()
    return kept, (total - kept.square().sum(-1)).clamp_min(0)


def _project(factor: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-``rank`` part of a factor and the diagonal of the rest."""
    rows = factor.new_zeros(0, factor.shape[0])
    gram = _blocks(factor.mT @ factor, rows @ factor, rows @ rows.mT)
    return _project_gram(factor, rows, gram, rank)


class LoFi(OnlineUpdater):
    r"""The low-rank extended Kalman filter (LoFi) over a BNN's weights, one minibatch a step.

    ``lofi.update(x, y)`` folds a minibatch (or one point, ``x[i:i+1]``) into the belief in
    closed form: one forward and reverse pass per row for the network's Jacobian, then
    :math:`O(d(r + BC)^2)` of linear algebra, no epochs, no replay, no learning rate (see
    the module's notes for the maths). :attr:`guide` is the belief at every point of the
    stream, a :class:`~pyro_bbb.online.LowRankPrecisionGuide` for ``predict``, ``compare``,
    ``to_inference_data``, ``save`` and ``from_guide``.

    Args:
        model: A :class:`~pyro_bbb.BNN` with Gaussian priors on its weights and a Gaussian
            (fixed or learned scale), Categorical or Bernoulli likelihood.
        guide: The belief to start from: ``None`` for the prior (means at the network's
            initialisation), a :class:`~pyro_bbb.MeanFieldGuide` (a trained posterior:
            precision :math:`1/\sigma^2`), or a
            :class:`~pyro_bbb.online.LowRankPrecisionGuide` (then updated in place).
        rank: ``r``, the columns of :math:`W`, ``>= 0`` (0: a diagonal precision).
        dynamics_noise: :math:`q \ge 0`, weight variance added to the belief before each
            step, for data that drift (0: a static target).
        init_loc: The starting mean when ``guide`` is ``None`` (see
            :class:`~pyro_bbb.online.LowRankPrecisionGuide`).
        learn_prior_scale: Learn the prior's scale from the stream (see
            :class:`~pyro_bbb.online.OnlineUpdater`): a Gaussian likelihood's, from a start
            with a diagonal precision (the prior or a ``MeanFieldGuide``).
        num_iterations: Gauss-Newton steps on the minibatch, each relinearised at the last
            iterate (1: the LoFi step; more: the iterated filter).
        num_samples: ``None`` to linearise at the mean (LoFi); an even number of mirrored
            draws from the belief to take the expected gradient and Gauss-Newton matrix by
            Monte Carlo instead (BONG's sampled form, Jones, Chang and Murphy 2024).
        step_size: The size :math:`s \in (0, 1]` of each Gauss-Newton step (1: BONG's unit
            natural-gradient step; below 1, iterated, the Bayesian learning rule's damped
            steps).

    Raises:
        TypeError: On a model that is not a ``BNN`` or an unsupported guide.
        ValueError: On a bad rank, dynamics noise, iteration count, number of draws or step
            size; on ``learn_prior_scale`` for a classifier or a start whose precision is not
            diagonal; at the first update, on non-Gaussian priors or a
            ``LowRankPrecisionGuide`` of another rank.
    """

    def __init__(
        self,
        model: Any,
        guide: Any = None,
        *,
        rank: int = 10,
        dynamics_noise: float = 0.0,
        init_loc: Any = None,
        learn_prior_scale: bool = False,
        num_iterations: int = 1,
        num_samples: int | None = None,
        step_size: float = 1.0,
    ) -> None:
        self.rank = check_int("rank", rank, minimum=0)
        num_iterations = check_int("num_iterations", num_iterations)
        self.num_samples = check_int("num_samples", num_samples, minimum=2, optional=True)
        if self.num_samples is not None and self.num_samples % 2:
            raise ValueError(f"num_samples must be even (mirrored pairs), got {num_samples}")
        if not 0 < step_size <= 1:
            raise ValueError(f"step_size must be in (0, 1], got {step_size!r}")
        self.step_size = float(step_size)
        step = partial(update, step_size=self.step_size)
        super().__init__(
            model,
            guide,
            algebra=FilterAlgebra(
                predict, draws, step, output_covariance, covariance_rows, shift_prior
            ),
            guide_rank=self.rank,
            dynamics_noise=dynamics_noise,
            init_loc=init_loc,
            learn_prior_scale=learn_prior_scale,
            num_iterations=num_iterations,
            num_draws=self.num_samples,
        )

    def _init_state(self, start: Start) -> LoFiState:
        if start.covariance is not None:
            raise ValueError(
                "LoFi keeps its belief in precision form and cannot start exactly from a "
                "LowRankGuide's covariance D + VVᵀ; start from a MeanFieldGuide, a "
                "LowRankPrecisionGuide, or the prior (guide=None), or use RVGA"
            )
        if start.covariance_root is not None:  # a full-rank belief: its precision form
            fn = CovarianceRootNormal(start.mean, start.covariance_root)
            return init(start.mean, fn.precision_diag, fn.precision_factor, rank=self.rank)
        return init(start.mean, start.precision_diag, start.precision_factor, rank=self.rank)

    def _belief(self, state: LoFiState) -> Belief:
        return state.mean, state.precision_factor, state.precision_diag

    def _check_guide(self, guide: LowRankPrecisionGuide) -> None:
        if guide.rank != self.rank:
            raise ValueError(
                f"the guide has rank {guide.rank} but LoFi was built with rank={self.rank}; "
                "give LoFi the guide's rank"
            )
