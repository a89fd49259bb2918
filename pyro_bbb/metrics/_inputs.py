"""Input checks of the metrics: float64 CPU copies, finiteness, shapes, probabilities, labels.

Every metric reads its inputs through these, so they all accept and refuse the same things
with the same messages. Nothing here computes a score.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_tensor

__all__ = [
    "LOG_PROB_TOL",
    "PROB_TOL",
    "as_float64",
    "check_finite",
    "check_same_shape",
    "class_log_probs",
    "class_probs",
    "labels_of",
    "probs_and_labels",
]

LOG_PROB_TOL = 1e-4
"""How far a row of log-probabilities may stray from normalised (its ``logsumexp`` from 0)."""

PROB_TOL = 1e-6
"""How far outside ``[0, 1]`` a probability may stray (float rounding) before it is rejected."""


def as_float64(x: torch.Tensor, name: str) -> torch.Tensor:
    check_tensor(name, x)
    if x.numel() == 0:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(x.shape)}")
    return x.detach().to(device="cpu", dtype=torch.float64)


def check_finite(x: torch.Tensor, name: str) -> None:
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} must be finite, got {int((~torch.isfinite(x)).sum())} NaN/inf")


def check_same_shape(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{a_name} and {b_name} must have the same shape, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def class_probs(probs: torch.Tensor) -> torch.Tensor:
    """Validate ``probs`` and return float64 class probabilities of shape ``(batch, classes)``.

    Binary ``(batch,)`` probabilities :math:`p` become the two columns ``[1 - p, p]``.
    """
    p = as_float64(probs, "probs")
    if p.dim() not in (1, 2):
        raise ValueError(
            f"probs must have shape (batch,) or (batch, classes), got {tuple(probs.shape)}"
        )
    if p.dim() == 2 and p.shape[1] < 2:
        raise ValueError(
            "probs of shape (batch, classes) needs classes >= 2; pass binary probabilities "
            f"p(y = 1) with shape (batch,), got {tuple(probs.shape)}"
        )
    check_finite(p, "probs")
    low, high = float(p.min()), float(p.max())
    if low < -PROB_TOL or high > 1 + PROB_TOL:
        raise ValueError(f"probs must lie in [0, 1], got values in [{low:.6g}, {high:.6g}]")
    p = p.clamp(0.0, 1.0)
    if p.dim() == 1:
        p = torch.stack([1.0 - p, p], dim=-1)
    return p


def class_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """Validate log-probabilities ``(batch, classes)``; return them as float64.

    Binary predictions come as two columns ``[log(1 - p), log p]``: from ``log p`` alone,
    ``log(1 - p)`` cannot be recovered once ``p`` rounds to 1.
    """
    lp = as_float64(log_probs, "log_probs")
    if lp.dim() != 2 or lp.shape[1] < 2:
        raise ValueError(
            "log_probs must have shape (batch, classes) with classes >= 2 (binary: the two "
            f"columns [log(1 - p), log p]), got {tuple(log_probs.shape)}"
        )
    if torch.isnan(lp).any() or (lp == math.inf).any():
        raise ValueError("log_probs must not hold NaN or +inf")
    hint = "; pass log-probabilities (log_softmax of the logits, or pred.log_probs)"
    if float(lp.max()) > LOG_PROB_TOL:
        raise ValueError(f"log_probs must be <= 0, got values up to {float(lp.max()):.6g}{hint}")
    total = torch.logsumexp(lp, dim=-1).abs().max()
    if float(total) > LOG_PROB_TOL:
        raise ValueError(
            "log_probs must be normalised, each row's logsumexp 0, got rows off by up to "
            f"{float(total):.6g}{hint}"
        )
    return lp


def labels_of(y: torch.Tensor, batch: int, num_classes: int) -> torch.Tensor:
    """Validate integer labels ``y`` of shape ``(batch,)`` against ``num_classes``."""
    check_tensor("y", y)
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise ValueError(f"y must hold integer class labels (e.g. y.long()), got dtype {y.dtype}")
    if y.dim() != 1:
        raise ValueError(f"y must have shape (batch,), got {tuple(y.shape)}")
    if y.shape[0] != batch:
        raise ValueError(f"y must have one label per prediction ({batch}), got {y.shape[0]}")
    y = y.detach().to(device="cpu", dtype=torch.int64)
    low, high = int(y.min()), int(y.max())
    if low < 0 or high >= num_classes:
        raise ValueError(
            f"y must hold labels in [0, {num_classes}) for {num_classes} classes, "
            f"got labels in [{low}, {high}]"
        )
    return y


def probs_and_labels(probs: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p = class_probs(probs)
    return p, labels_of(y, p.shape[0], p.shape[1])
