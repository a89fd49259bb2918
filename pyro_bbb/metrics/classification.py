r"""Scores of classification predictions: accuracy, NLL, Brier, calibration, AUROC.

``probs`` of shape ``(batch, classes)`` holds predictive class probabilities (``classes >=
2``) and ``y`` integer labels in ``[0, classes)``: a
:class:`~pyro_bbb.ClassificationPrediction`'s ``probs`` as it is, a Bernoulli model's too
(its two columns ``[p(y=0), p(y=1)]``). ``probs`` of shape ``(batch,)`` is also taken as
binary, :math:`p(y = 1)`, with labels in ``{0, 1}`` (the predicted class is 1 when
:math:`p > 0.5`, its confidence :math:`\max(p, 1 - p)`). :func:`nll` takes
log-probabilities ``(batch, classes)`` instead (binary as two columns: a prediction's
``log_probs``), computed from logits, so that its tails are exact. :func:`auroc` scores how
well a value (predictive entropy, mutual information) separates two groups, e.g. in- from
out-of-distribution inputs.
Each function returns a Python ``float`` (numpy arrays for the reliability curve).

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

from .._validation import check_int, check_tensor
from ._inputs import as_float64, class_log_probs, labels_of, probs_and_labels

__all__ = [
    "ReliabilityCurve",
    "accuracy",
    "auroc",
    "brier",
    "ece",
    "expected_calibration_error",
    "nll",
    "reliability_curve",
]


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
    p, labels = probs_and_labels(probs, y)
    return float((p.argmax(dim=-1) == labels).double().mean())


def nll(log_probs: torch.Tensor, y: torch.Tensor) -> float:
    r"""Mean negative log predictive probability of the true label, from log-probabilities.

    .. math:: \mathrm{NLL} = -\frac{1}{N}\sum_{i=1}^{N} \log p_{i, y_i}.

    It takes log-probabilities, not probabilities: computed from logits (``log_softmax``, or
    :attr:`~pyro_bbb.ClassificationPrediction.log_probs` of a prediction) they stay exact in
    the tails, where ``log(probs)`` underflows. Nothing is clamped: a confidently wrong
    prediction costs what it costs (a true label given probability 0 costs ``inf``), so the
    score cannot flatter an over-confident model.

    Args:
        log_probs: Normalised log-probabilities, shape ``(batch, classes)`` (each row's
            ``logsumexp`` is 0); binary predictions as the two columns
            ``[log(1 - p), log p]`` (``logsigmoid(-logit)``, ``logsigmoid(logit)``). Entries
            may be ``-inf``.
        y: Integer labels, shape ``(batch,)``, in ``[0, classes)``.

    Returns:
        The NLL, in nats per point.

    Raises:
        ValueError: If the batch sizes differ, labels are not integers or out of range, or
            ``log_probs`` holds NaN or ``+inf``, is positive or is not normalised (e.g.
            probabilities passed by mistake).
    """
    lp = class_log_probs(log_probs)
    labels = labels_of(y, lp.shape[0], lp.shape[1])
    return float(-lp.gather(-1, labels.unsqueeze(-1)).squeeze(-1).mean())


def brier(probs: torch.Tensor, y: torch.Tensor) -> float:
    r"""Brier score: mean squared distance between predicted probabilities and the one-hot label.

    .. math::
        \mathrm{BS} = \frac{1}{N}\sum_{i=1}^{N}\sum_{c=1}^{C}
            \big(p_{i,c} - \mathbf{1}[y_i = c]\big)^2.

    A perfect one-hot prediction scores 0; the uniform prediction scores :math:`(C - 1) / C`.
    For binary ``(batch,)`` probabilities the usual binary form
    :math:`\frac{1}{N}\sum_i (p_i - y_i)^2` is returned, which is half the two-class sum above;
    a Bernoulli model's prediction, whose ``probs`` has the two columns, gets the two-class
    sum (``brier(pred.probs[:, 1], y)`` gives the binary form).

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
    p, labels = probs_and_labels(probs, y)
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
    check_int("num_bins", num_bins)
    p, labels = probs_and_labels(probs, y)
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
    s = as_float64(scores, "scores")
    if s.dim() != 1:
        raise ValueError(f"scores must have shape (batch,), got {tuple(scores.shape)}")
    if torch.isnan(s).any():
        raise ValueError(f"scores must not hold NaN, got {int(torch.isnan(s).sum())}")
    check_tensor("labels", labels)
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
