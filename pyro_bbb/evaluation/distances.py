r"""Distances between two predictive distributions, per test point.

For regression, :func:`wasserstein2` between two sets of predictive samples; for
classification, :func:`total_variation` and :func:`top1_agreement` of the predictive
probabilities, the measures of Izmailov et al. 2021 (https://arxiv.org/abs/2104.14421), and
:func:`label_set_coverage`, the classification analogue of interval coverage. Plain tensor
functions: nothing here runs a model.
"""

from __future__ import annotations

import torch

from .._validation import check_open_unit_interval

__all__ = ["label_set_coverage", "top1_agreement", "total_variation", "wasserstein2"]


def wasserstein2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    r"""Wasserstein-2 distance between two 1-D sample sets, per column.

    For empirical distributions with quantile functions :math:`F_a^{-1}, F_b^{-1}`,

    .. math:: W_2(a, b)^2 = \int_0^1 \big(F_a^{-1}(u) - F_b^{-1}(u)\big)^2 \, du,

    computed exactly: both quantile functions are steps, constant between the merged
    breakpoints :math:`\{i/n\} \cup \{j/m\}`. With ``n == m`` this is the root mean squared
    difference of the sorted samples.

    Args:
        a: Samples ``(n, *batch)``.
        b: Samples ``(m, *batch)``, the same ``batch``.

    Returns:
        :math:`W_2` per column, ``batch``-shaped, in the samples' units.

    Raises:
        ValueError: If the batch shapes differ or a set is empty.
    """
    if a.shape[1:] != b.shape[1:] or a.shape[0] < 1 or b.shape[0] < 1:
        raise ValueError(
            f"a and b must be (n, *batch) and (m, *batch) with the same batch, n, m >= 1; got "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )
    a, b = a.double().sort(0).values, b.double().sort(0).values
    n, m = a.shape[0], b.shape[0]
    if n == m:
        return (a - b).pow(2).mean(0).sqrt()
    steps = torch.cat([torch.arange(1, n + 1) / n, torch.arange(1, m + 1) / m]).double()
    breaks = torch.unique(steps)  # sorted, ends at 1
    widths = torch.diff(breaks, prepend=breaks.new_zeros(1))
    mid = breaks - widths / 2
    i = (mid * n).long().clamp_max(n - 1)
    j = (mid * m).long().clamp_max(m - 1)
    shape = (-1,) + (1,) * (a.dim() - 1)
    return ((a[i] - b[j]).pow(2) * widths.reshape(shape)).sum(0).sqrt()


def _class_probs(probs: torch.Tensor, binary: bool) -> torch.Tensor:
    """``(batch, classes)``; a binary ``p(y=1)`` becomes ``[1 - p, p]``."""
    return torch.stack([1 - probs, probs], -1) if binary else probs


def total_variation(p: torch.Tensor, q: torch.Tensor, *, binary: bool = False) -> torch.Tensor:
    r"""Total variation :math:`\tfrac12 \sum_c |p_c - q_c|` between predictive distributions.

    Args:
        p: Probabilities ``(batch, classes)``, or ``p(y=1)`` ``(batch[, dim])`` if ``binary``.
        q: The same shape.
        binary: Whether the inputs are Bernoulli probabilities.

    Returns:
        Per point, ``(batch[, dim])``, in ``[0, 1]``.
    """
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {p.shape} and {q.shape}")
    return 0.5 * (_class_probs(p, binary) - _class_probs(q, binary)).abs().sum(-1)


def top1_agreement(p: torch.Tensor, q: torch.Tensor, *, binary: bool = False) -> torch.Tensor:
    """Whether the most probable labels agree, per point (1.0 or 0.0).

    Args:
        p: Probabilities ``(batch, classes)``, or ``p(y=1)`` ``(batch[, dim])`` if ``binary``.
        q: The same shape.
        binary: Whether the inputs are Bernoulli probabilities.

    Returns:
        ``(batch[, dim])`` of 0/1 floats.
    """
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {p.shape} and {q.shape}")
    top_p = _class_probs(p, binary).argmax(-1)
    top_q = _class_probs(q, binary).argmax(-1)
    return (top_p == top_q).double()


def label_set_coverage(
    probs: torch.Tensor, y: torch.Tensor, level: float = 0.95, *, binary: bool = False
) -> float:
    """Fraction of labels inside their ``level`` predictive label set.

    The set of a point holds its most probable labels, in order, until their mass reaches
    ``level``: the classification analogue of a central predictive interval.

    Args:
        probs: Predictive probabilities ``(batch, classes)``, or ``p(y=1)`` if ``binary``.
        y: Labels ``(batch[, dim])``.
        level: Mass of the set, in ``(0, 1)``.
        binary: Whether ``probs`` are Bernoulli probabilities.

    Returns:
        The coverage in ``[0, 1]``.
    """
    check_open_unit_interval("level", level)
    full = _class_probs(probs, binary)
    sorted_probs, order = full.sort(-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    in_set_sorted = mass_before < level
    in_set = torch.zeros_like(in_set_sorted).scatter(-1, order, in_set_sorted)
    hit = in_set.gather(-1, y.long().unsqueeze(-1)).squeeze(-1)
    return float(hit.double().mean())
