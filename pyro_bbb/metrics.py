r"""Scoring rules and calibration metrics for predictions, computed on plain torch tensors.

This module holds the numbers a paper table reports: RMSE and test log-likelihood for
regression; accuracy, negative log-likelihood, Brier score and expected calibration error for
classification; interval coverage; the binned reliability curve that ECE and
:func:`pyro_bbb.plots.plot_reliability` share; and the AUROC of a score that should separate
two groups (in- from out-of-distribution inputs, by predictive entropy or mutual information).
It does not draw predictive samples, run models or import Pyro: pass it tensors that a
predictive has already produced. Every function returns a Python ``float`` (or numpy arrays
for the reliability curve), computed in float64 on detached CPU copies of its inputs.

Classification conventions, shared by every classification metric here:

* ``probs`` of shape ``(batch, classes)`` holds predictive class probabilities, with
  ``classes >= 2``; ``y`` holds integer labels in ``[0, classes)``.
* ``probs`` of shape ``(batch,)`` is binary: it holds :math:`p(y = 1)`, and ``y`` holds labels
  in ``{0, 1}``. The predicted class is 1 when :math:`p > 0.5` (ties go to class 0, as argmax
  over ``[1 - p, p]`` would), and its confidence is :math:`\max(p, 1 - p)`.

References:
    Guo et al., *On Calibration of Modern Neural Networks*, ICML 2017,
    https://arxiv.org/abs/1706.04599 (reliability diagrams and ECE).
    Gneiting and Raftery, *Strictly Proper Scoring Rules, Prediction, and Estimation*, JASA 2007
    (log score and Brier score).
    Hanley and McNeil, *The Meaning and Use of the Area under a Receiver Operating
    Characteristic (ROC) Curve*, Radiology 1982 (AUROC as the Mann-Whitney statistic).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch

__all__ = [
    "ReliabilityCurve",
    "accuracy",
    "auroc",
    "brier",
    "ece",
    "expected_calibration_error",
    "gaussian_log_likelihood",
    "interval_coverage",
    "log_likelihood",
    "nll",
    "reliability_curve",
    "rmse",
]

_NLL_EPS = 1e-12
"""Probabilities are clamped to at least this before taking logs in :func:`nll`."""

_PROB_TOL = 1e-6
"""How far outside ``[0, 1]`` a probability may stray (float rounding) before it is rejected."""


class ReliabilityCurve(NamedTuple):
    """Binned confidence against accuracy, as drawn in a reliability diagram.

    All fields are numpy arrays of shape ``(num_bins,)``. Bins are equal-width over ``[0, 1]``;
    bin ``b`` holds confidences in :math:`(b / B, (b + 1) / B]` (bin 0 also holds 0).

    Attributes:
        bin_centers: Midpoint of each bin, float64.
        accuracy: Fraction of correct predictions in each bin; NaN for an empty bin.
        confidence: Mean confidence in each bin; NaN for an empty bin.
        counts: Number of predictions in each bin, int64.
    """

    bin_centers: npt.NDArray[np.float64]
    accuracy: npt.NDArray[np.float64]
    confidence: npt.NDArray[np.float64]
    counts: npt.NDArray[np.int64]


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------


def _as_float64(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.numel() == 0:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(x.shape)}")
    return x.detach().to(device="cpu", dtype=torch.float64)


def _check_finite(x: torch.Tensor, name: str) -> None:
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} must be finite, got {int((~torch.isfinite(x)).sum())} NaN/inf")


def _check_same_shape(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{a_name} and {b_name} must have the same shape, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def _class_probs(probs: torch.Tensor) -> torch.Tensor:
    """Validate ``probs`` and return float64 class probabilities of shape ``(batch, classes)``.

    Binary ``(batch,)`` probabilities :math:`p` become the two columns ``[1 - p, p]``.
    """
    p = _as_float64(probs, "probs")
    if p.dim() not in (1, 2):
        raise ValueError(
            f"probs must have shape (batch,) or (batch, classes), got {tuple(probs.shape)}"
        )
    if p.dim() == 2 and p.shape[1] < 2:
        raise ValueError(
            "probs of shape (batch, classes) needs classes >= 2; pass binary probabilities "
            f"p(y = 1) with shape (batch,), got {tuple(probs.shape)}"
        )
    _check_finite(p, "probs")
    low, high = float(p.min()), float(p.max())
    if low < -_PROB_TOL or high > 1 + _PROB_TOL:
        raise ValueError(f"probs must lie in [0, 1], got values in [{low:.6g}, {high:.6g}]")
    p = p.clamp(0.0, 1.0)
    if p.dim() == 1:
        p = torch.stack([1.0 - p, p], dim=-1)
    return p


def _labels(y: torch.Tensor, batch: int, num_classes: int) -> torch.Tensor:
    """Validate integer labels ``y`` of shape ``(batch,)`` against ``num_classes``."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise ValueError(f"y must hold integer class labels (e.g. y.long()), got dtype {y.dtype}")
    if y.dim() != 1:
        raise ValueError(f"y must have shape (batch,), got {tuple(y.shape)}")
    if y.shape[0] != batch:
        raise ValueError(f"y must have one label per row of probs ({batch}), got {y.shape[0]}")
    y = y.detach().to(device="cpu", dtype=torch.int64)
    low, high = int(y.min()), int(y.max())
    if low < 0 or high >= num_classes:
        raise ValueError(
            f"y must hold labels in [0, {num_classes}) for {num_classes} classes, "
            f"got labels in [{low}, {high}]"
        )
    return y


def _probs_and_labels(probs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p = _class_probs(probs)
    return p, _labels(y, p.shape[0], p.shape[1])


def _check_num_bins(num_bins: int) -> None:
    if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive int, got {num_bins!r}")


# ---------------------------------------------------------------------------------------------
# Regression
# ---------------------------------------------------------------------------------------------


def rmse(mean: torch.Tensor, y: torch.Tensor) -> float:
    r"""Root mean squared error of point predictions.

    .. math:: \mathrm{RMSE} = \sqrt{\frac{1}{N}\sum_{i=1}^{N} (\hat y_i - y_i)^2},

    where the sum runs over every entry (points and, for ``(batch, dim)`` inputs, dimensions).

    Args:
        mean: Predicted values (usually the predictive mean), shape ``(batch,)`` or
            ``(batch, dim)``.
        y: Targets, same shape as ``mean``. No broadcasting is done, so a ``(batch, 1)``
            prediction against ``(batch,)`` targets is an error rather than a silent
            ``(batch, batch)`` comparison.

    Returns:
        The RMSE, in the units of ``y``.

    Raises:
        ValueError: If the shapes differ, an input is empty or holds NaN/inf.
    """
    m = _as_float64(mean, "mean")
    t = _as_float64(y, "y")
    _check_same_shape(m, "mean", t, "y")
    _check_finite(m, "mean")
    _check_finite(t, "y")
    return math.sqrt(float(((m - t) ** 2).mean()))


def log_likelihood(log_probs: torch.Tensor) -> float:
    r"""Mean per-point log predictive density from per-sample log-likelihoods.

    Given Monte Carlo weight samples :math:`w_s \sim q(w)` and
    :math:`\ell_{s,i} = \log p(y_i \mid x_i, w_s)`, the predictive density of point :math:`i` is
    the mixture :math:`\frac{1}{S}\sum_s p(y_i \mid x_i, w_s)`, so

    .. math::
        \mathrm{LL} = \frac{1}{N}\sum_{i=1}^{N}
            \Big(\operatorname{logsumexp}_{s}\, \ell_{s,i} - \log S\Big),

    computed stably with ``logsumexp``.

    Args:
        log_probs: Per-sample, per-point log-likelihoods, shape ``(num_samples, batch)``
            (nats). Entries may be ``-inf``; NaN and ``+inf`` are rejected.

    Returns:
        The mean over points of the log of the sample-averaged likelihood, in nats per point.

    Raises:
        ValueError: If ``log_probs`` is not 2-D, is empty, or holds NaN or ``+inf``.
    """
    lp = _as_float64(log_probs, "log_probs")
    if lp.dim() != 2:
        raise ValueError(
            f"log_probs must have shape (num_samples, batch), got {tuple(log_probs.shape)}"
        )
    if torch.isnan(lp).any() or (lp == math.inf).any():
        raise ValueError("log_probs must not hold NaN or +inf")
    num_samples = lp.shape[0]
    per_point = torch.logsumexp(lp, dim=0) - math.log(num_samples)
    return float(per_point.mean())


def gaussian_log_likelihood(
    loc: torch.Tensor, scale: torch.Tensor | float, y: torch.Tensor
) -> float:
    r"""Test log-likelihood of targets under a Gaussian predictive *mixture*.

    Each weight sample :math:`s` predicts :math:`\mathcal{N}(\mu_{s,i}, \sigma_{s,i}^2)` for point
    :math:`i`; the predictive is their equal-weight mixture (not one Gaussian fitted to it):

    .. math::
        \mathrm{LL} = \frac{1}{N}\sum_{i=1}^{N}
            \Big(\operatorname{logsumexp}_{s}\,
            \log \mathcal{N}(y_i \mid \mu_{s,i}, \sigma_{s,i}^2) - \log S\Big).

    For ``(num_samples, batch, dim)`` inputs the dimensions are independent given :math:`s`, so
    :math:`\log \mathcal{N}` is summed over ``dim`` before mixing. The result is in the units
    implied by ``y``: if the model was fitted to standardized targets, either transform ``loc``
    and ``scale`` back first or subtract :math:`\log \sigma_y` (per dimension) from the result.

    Args:
        loc: Per-sample predictive means, shape ``(num_samples, batch)`` or
            ``(num_samples, batch, dim)``.
        scale: Per-sample predictive standard deviations (observation noise), same shape as
            ``loc`` or broadcastable to it (e.g. a scalar noise std). Must be positive.
        y: Targets, shape ``(batch,)`` or ``(batch, dim)`` matching ``loc.shape[1:]``.

    Returns:
        The mean per-point log predictive density, in nats per point.

    Raises:
        ValueError: If the shapes do not match, ``scale`` is not positive, or an input holds
            NaN/inf.
    """
    mu = _as_float64(loc, "loc")
    if mu.dim() not in (2, 3):
        raise ValueError(
            "loc must have shape (num_samples, batch) or (num_samples, batch, dim), "
            f"got {tuple(loc.shape)}"
        )
    sigma = _as_float64(torch.as_tensor(scale), "scale")
    try:
        sigma = sigma.expand_as(mu)
    except RuntimeError:
        raise ValueError(
            f"scale must be broadcastable to loc's shape {tuple(mu.shape)}, "
            f"got {tuple(sigma.shape)}"
        ) from None
    t = _as_float64(y, "y")
    if t.shape != mu.shape[1:]:
        raise ValueError(
            f"y must have shape {tuple(mu.shape[1:])} (loc without its sample dimension), "
            f"got {tuple(t.shape)}"
        )
    for value, name in ((mu, "loc"), (sigma, "scale"), (t, "y")):
        _check_finite(value, name)
    if (sigma <= 0).any():
        raise ValueError(f"scale must be positive, got minimum {float(sigma.min()):.6g}")
    z = (t - mu) / sigma
    log_density = -0.5 * z**2 - torch.log(sigma) - 0.5 * math.log(2 * math.pi)
    if log_density.dim() == 3:
        log_density = log_density.sum(-1)
    return log_likelihood(log_density)


def interval_coverage(lower: torch.Tensor, upper: torch.Tensor, y: torch.Tensor) -> float:
    r"""Fraction of targets inside their predictive intervals.

    .. math:: \frac{1}{N}\sum_{i=1}^{N} \mathbf{1}[l_i \le y_i \le u_i].

    A well-calibrated central 95% interval has coverage close to 0.95.

    Args:
        lower: Interval lower bounds, shape ``(batch,)`` or ``(batch, dim)``.
        upper: Interval upper bounds, same shape as ``lower``.
        y: Targets, same shape as ``lower``.

    Returns:
        The fraction of entries with ``lower <= y <= upper``, in ``[0, 1]``.

    Raises:
        ValueError: If the shapes differ, any ``lower > upper``, or an input holds NaN.
    """
    lo = _as_float64(lower, "lower")
    hi = _as_float64(upper, "upper")
    t = _as_float64(y, "y")
    _check_same_shape(lo, "lower", hi, "upper")
    _check_same_shape(lo, "lower", t, "y")
    for value, name in ((lo, "lower"), (hi, "upper"), (t, "y")):
        if torch.isnan(value).any():
            raise ValueError(f"{name} must not hold NaN")
    if (lo > hi).any():
        raise ValueError(f"lower must be <= upper everywhere, got {int((lo > hi).sum())} inverted")
    return float(((lo <= t) & (t <= hi)).double().mean())


# ---------------------------------------------------------------------------------------------
# Classification
# ---------------------------------------------------------------------------------------------


def accuracy(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of points whose most probable class is the true label.

    Args:
        probs: Predictive class probabilities, shape ``(batch, classes)``, or binary
            :math:`p(y = 1)` with shape ``(batch,)`` (predicts 1 when :math:`p > 0.5`).
        y: Integer labels, shape ``(batch,)``, in ``[0, classes)`` (``{0, 1}`` if binary).

    Returns:
        The accuracy, in ``[0, 1]``.

    Raises:
        ValueError: If the batch sizes differ, labels are not integers or out of range, or
            ``probs`` is not finite or outside ``[0, 1]``.
    """
    p, labels = _probs_and_labels(probs, y)
    return float((p.argmax(dim=-1) == labels).double().mean())


def nll(probs: torch.Tensor, y: torch.Tensor) -> float:
    r"""Mean negative log predictive probability of the true label.

    .. math:: \mathrm{NLL} = -\frac{1}{N}\sum_{i=1}^{N} \log \max(p_{i, y_i}, \epsilon),

    with :math:`\epsilon = 10^{-12}` so a confidently wrong prediction costs about 27.6 nats
    instead of infinity.

    Args:
        probs: Predictive class probabilities, shape ``(batch, classes)``, or binary
            :math:`p(y = 1)` with shape ``(batch,)``.
        y: Integer labels, shape ``(batch,)``, in ``[0, classes)`` (``{0, 1}`` if binary).

    Returns:
        The NLL, in nats per point.

    Raises:
        ValueError: If the batch sizes differ, labels are not integers or out of range, or
            ``probs`` is not finite or outside ``[0, 1]``.
    """
    p, labels = _probs_and_labels(probs, y)
    p_true = p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return float(-p_true.clamp_min(_NLL_EPS).log().mean())


def brier(probs: torch.Tensor, y: torch.Tensor) -> float:
    r"""Brier score: mean squared distance between predicted probabilities and the one-hot label.

    .. math::
        \mathrm{BS} = \frac{1}{N}\sum_{i=1}^{N}\sum_{c=1}^{C}
            \big(p_{i,c} - \mathbf{1}[y_i = c]\big)^2.

    A perfect one-hot prediction scores 0; the uniform prediction scores :math:`(C - 1) / C`.
    For binary ``(batch,)`` probabilities the usual binary form
    :math:`\frac{1}{N}\sum_i (p_i - y_i)^2` is returned, which is half the two-class sum above.

    Args:
        probs: Predictive class probabilities, shape ``(batch, classes)``, or binary
            :math:`p(y = 1)` with shape ``(batch,)``.
        y: Integer labels, shape ``(batch,)``, in ``[0, classes)`` (``{0, 1}`` if binary).

    Returns:
        The Brier score, in ``[0, 2]`` (``[0, 1]`` for binary input).

    Raises:
        ValueError: If the batch sizes differ, labels are not integers or out of range, or
            ``probs`` is not finite or outside ``[0, 1]``.
    """
    p, labels = _probs_and_labels(probs, y)
    one_hot = torch.nn.functional.one_hot(labels, p.shape[-1]).to(p.dtype)
    per_point = ((p - one_hot) ** 2).sum(-1)
    if probs.dim() == 1:
        per_point = per_point / 2
    return float(per_point.mean())


def reliability_curve(
    probs: torch.Tensor, y: torch.Tensor, *, num_bins: int = 15
) -> ReliabilityCurve:
    r"""Bin predictions by confidence and compare each bin's accuracy with its confidence.

    The confidence of a prediction is its largest class probability, :math:`\max_c p_{i,c}`
    (:math:`\max(p_i, 1 - p_i)` for binary input). Bins are equal-width over ``[0, 1]``; bin
    :math:`b` holds confidences in :math:`(b / B, (b + 1) / B]`, and bin 0 also holds 0.

    Args:
        probs: Predictive class probabilities, shape ``(batch, classes)``, or binary
            :math:`p(y = 1)` with shape ``(batch,)``.
        y: Integer labels, shape ``(batch,)``, in ``[0, classes)`` (``{0, 1}`` if binary).
        num_bins: Number of equal-width bins :math:`B`.

    Returns:
        A :class:`ReliabilityCurve` of numpy arrays, each of shape ``(num_bins,)``; accuracy and
        confidence are NaN in empty bins.

    Raises:
        ValueError: If ``num_bins`` is not a positive int, the batch sizes differ, labels are
            not integers or out of range, or ``probs`` is not finite or outside ``[0, 1]``.
    """
    _check_num_bins(num_bins)
    p, labels = _probs_and_labels(probs, y)
    confidence, predicted = p.max(dim=-1)
    correct = (predicted == labels).double()
    bin_index = (torch.ceil(confidence * num_bins).long() - 1).clamp(0, num_bins - 1)

    counts = torch.bincount(bin_index, minlength=num_bins)
    correct_sum = torch.bincount(bin_index, weights=correct, minlength=num_bins)
    confidence_sum = torch.bincount(bin_index, weights=confidence, minlength=num_bins)
    occupied = counts > 0
    nan = torch.full((num_bins,), math.nan, dtype=torch.float64)
    bin_accuracy = torch.where(occupied, correct_sum / counts.clamp_min(1), nan)
    bin_confidence = torch.where(occupied, confidence_sum / counts.clamp_min(1), nan)
    centers = (torch.arange(num_bins, dtype=torch.float64) + 0.5) / num_bins
    return ReliabilityCurve(
        bin_centers=centers.numpy(),
        accuracy=bin_accuracy.numpy(),
        confidence=bin_confidence.numpy(),
        counts=counts.numpy(),
    )


def expected_calibration_error(
    probs: torch.Tensor, y: torch.Tensor, *, num_bins: int = 15
) -> float:
    r"""Expected calibration error over equal-width confidence bins (Guo et al., 2017).

    .. math::
        \mathrm{ECE} = \sum_{b=1}^{B} \frac{n_b}{N}\,
            \big|\mathrm{acc}(b) - \mathrm{conf}(b)\big|,

    where :math:`n_b`, :math:`\mathrm{acc}(b)` and :math:`\mathrm{conf}(b)` are the count,
    accuracy and mean confidence of bin :math:`b` as computed by :func:`reliability_curve`.
    With ``num_bins=1`` this is :math:`|\text{accuracy} - \text{mean confidence}|`.

    Args:
        probs: Predictive class probabilities, shape ``(batch, classes)``, or binary
            :math:`p(y = 1)` with shape ``(batch,)`` (confidence of the predicted class).
        y: Integer labels, shape ``(batch,)``, in ``[0, classes)`` (``{0, 1}`` if binary).
        num_bins: Number of equal-width bins :math:`B` over ``[0, 1]``.

    Returns:
        The ECE, in ``[0, 1]``.

    Raises:
        ValueError: If ``num_bins`` is not a positive int, the batch sizes differ, labels are
            not integers or out of range, or ``probs`` is not finite or outside ``[0, 1]``.
    """
    curve = reliability_curve(probs, y, num_bins=num_bins)
    occupied = curve.counts > 0
    weights = curve.counts[occupied] / curve.counts.sum()
    gaps = np.abs(curve.accuracy[occupied] - curve.confidence[occupied])
    return float(np.sum(weights * gaps))


ece = expected_calibration_error
"""Short alias of :func:`expected_calibration_error`."""


# ---------------------------------------------------------------------------------------------
# Separating two groups by a score
# ---------------------------------------------------------------------------------------------


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    r"""Area under the ROC curve of ``scores`` as a detector of ``labels == 1``.

    The AUROC is the probability that a random positive scores above a random negative, ties
    counting one half (the Mann-Whitney statistic):

    .. math::
        \mathrm{AUROC} = \frac{1}{n_+ n_-}\sum_{i: y_i = 1}\sum_{j: y_j = 0}
            \Big(\mathbf{1}[s_i > s_j] + \tfrac12\,\mathbf{1}[s_i = s_j]\Big),

    computed in :math:`O(n \log n)` from average ranks. 1 separates perfectly, 0.5 is chance.
    For out-of-distribution detection, label the out-of-distribution inputs 1 and score every
    input by its predictive entropy or mutual information.

    Args:
        scores: One score per point, shape ``(batch,)``; higher means "more likely positive".
        labels: ``0`` or ``1`` per point, shape ``(batch,)``, integer or bool, with at least one
            of each.

    Returns:
        The AUROC, in ``[0, 1]``.

    Raises:
        ValueError: If the shapes differ or are not 1-D, a score is NaN, labels are not 0/1
            integers, or one of the two groups is empty.
    """
    s = _as_float64(scores, "scores")
    if s.dim() != 1:
        raise ValueError(f"scores must have shape (batch,), got {tuple(scores.shape)}")
    if torch.isnan(s).any():
        raise ValueError(f"scores must not hold NaN, got {int(torch.isnan(s).sum())}")
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
    if labels.dtype.is_floating_point or labels.dtype.is_complex:
        raise ValueError(f"labels must be integer or bool 0/1 labels, got dtype {labels.dtype}")
    if labels.shape != scores.shape:
        raise ValueError(
            f"labels must have the shape of scores {tuple(scores.shape)}, got {tuple(labels.shape)}"
        )
    y = labels.detach().cpu().to(torch.int64)
    if ((y != 0) & (y != 1)).any():
        raise ValueError("labels must hold only 0 and 1")
    positive = y == 1
    num_pos, num_neg = int(positive.sum()), int((~positive).sum())
    if num_pos == 0 or num_neg == 0:
        raise ValueError(
            f"auroc needs both labels present, got {num_pos} positive(s) and {num_neg} negative(s)"
        )
    values = s.numpy()
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # 1-based rank of the last point of each tie group
    average_rank = (ends - (counts - 1) / 2.0)[inverse]
    rank_sum = float(average_rank[positive.numpy()].sum())
    return (rank_sum - num_pos * (num_pos + 1) / 2.0) / (num_pos * num_neg)
