"""Figures of predictions: regression bands (epistemic and total) and reliability diagrams."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import metrics
from ._figure import ArrayLike, new_figure, save, vector

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_regression_bands", "plot_reliability"]


def plot_regression_bands(
    x_train: ArrayLike,
    y_train: ArrayLike,
    x_test: ArrayLike,
    mean: ArrayLike,
    epistemic_std: ArrayLike,
    total_std: ArrayLike,
    *,
    true_fn: Callable[[torch.Tensor], Any] | None = None,
    shade: Sequence[tuple[float, float]] | None = None,
    shade_label: str | None = None,
    title: str | None = None,
    reference: tuple[str, ArrayLike, ArrayLike] | None = None,
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    r"""Plot a 1-D regression fit with epistemic and total ±2σ bands.

    The total band, :math:`\bar\mu(x) \pm 2\sigma_{\text{total}}(x)`, is drawn light; the
    epistemic band, :math:`\bar\mu(x) \pm 2\sigma_{\text{epistemic}}(x)`, darker on top. With
    :math:`S` weight samples predicting :math:`\mathcal{N}(\mu_s, \sigma_s^2)`, these are
    usually :math:`\sigma^2_{\text{epistemic}} = \operatorname{Var}_s[\mu_s]` and
    :math:`\sigma^2_{\text{total}} = \sigma^2_{\text{epistemic}} + \mathbb{E}_s[\sigma_s^2]`.
    Test points are sorted by ``x_test`` before the lines are drawn.

    Args:
        x_train: Training inputs, shape ``(num_train,)`` or ``(num_train, 1)``.
        y_train: Training targets, shape ``(num_train,)``.
        x_test: Grid of inputs the predictions were made at, shape ``(num_test,)`` or
            ``(num_test, 1)``.
        mean: Predictive mean at ``x_test``, shape ``(num_test,)``.
        epistemic_std: Epistemic standard deviation at ``x_test``, shape ``(num_test,)``.
        total_std: Total predictive standard deviation at ``x_test``, shape ``(num_test,)``.
        true_fn: Optional noiseless function, drawn dashed; called with a float32 tensor of
            sorted test inputs of shape ``(num_test,)`` and returning ``(num_test,)`` values
            (``torch.sin``, ``np.sin`` and :func:`pyro_bbb.data.gap_function` all work).
        shade: Optional ``(low, high)`` input intervals to shade grey, e.g.
            ``pyro_bbb.data.gap_regions()["gap"]``.
        shade_label: Legend label for the shaded intervals; none if omitted.
        title: Optional axes title.
        reference: Optional ``(label, mean, epistemic_std)`` of another posterior at
            ``x_test`` (e.g. NUTS's), drawn as its mean and ±2σ epistemic outline in red.
        path: Where to save the figure; not saved if omitted.

    Returns:
        The figure, with one axes.

    Raises:
        ValueError: If the training or test arrays disagree in length, an array is not 1-D (or
            ``(n, 1)``), or a standard deviation is negative.
    """
    xs_train = vector(x_train, "x_train")
    ys_train = vector(y_train, "y_train")
    if xs_train.shape != ys_train.shape:
        raise ValueError(
            f"x_train and y_train must have the same length, got {xs_train.size} and "
            f"{ys_train.size}"
        )
    xs = vector(x_test, "x_test")
    columns = {"mean": mean, "epistemic_std": epistemic_std, "total_std": total_std}
    test = {name: vector(value, name) for name, value in columns.items()}
    for name, value in test.items():
        if value.shape != xs.shape:
            raise ValueError(
                f"{name} must have one value per x_test point ({xs.size}), got {value.size}"
            )
    for name in ("epistemic_std", "total_std"):
        if (test[name] < 0).any():
            raise ValueError(f"{name} must be non-negative, got minimum {test[name].min():.6g}")

    if reference is not None:
        reference_label, *values = reference
        for name, value in zip(("reference mean", "reference epistemic_std"), values, strict=True):
            test[name] = vector(value, name)
            if test[name].shape != xs.shape:
                raise ValueError(
                    f"{name} must have one value per x_test point ({xs.size}), got "
                    f"{test[name].size}"
                )

    order = np.argsort(xs, kind="stable")
    xs = xs[order]
    mu, epistemic, total = (test[name][order] for name in columns)

    figure = new_figure(figsize=(8.0, 4.5), layout="constrained")
    ax = figure.add_subplot()
    for i, (low, high) in enumerate(shade or ()):
        label = shade_label if i == 0 else None
        ax.axvspan(low, high, color="0.5", alpha=0.12, lw=0, label=label)
    ax.fill_between(
        xs, mu - 2 * total, mu + 2 * total, color="C0", alpha=0.18, lw=0, label="±2σ total"
    )
    ax.fill_between(
        xs,
        mu - 2 * epistemic,
        mu + 2 * epistemic,
        color="C0",
        alpha=0.4,
        lw=0,
        label="±2σ epistemic",
    )
    ax.plot(xs, mu, color="C0", lw=2, label="predictive mean")
    if reference is not None:
        ref_mu, ref_std = test["reference mean"][order], test["reference epistemic_std"][order]
        ax.plot(xs, ref_mu, color="C3", lw=1.5, label=f"{reference_label} mean")
        for sign in (-1, 1):
            label = f"{reference_label} ±2σ epistemic" if sign > 0 else None
            ax.plot(xs, ref_mu + sign * 2 * ref_std, color="C3", lw=1, ls=":", label=label)
    if true_fn is not None:
        truth = true_fn(torch.as_tensor(xs, dtype=torch.float32))
        ax.plot(xs, vector(truth, "true_fn(x_test)"), "--", color="C1", lw=1.5, label="truth")
    ax.scatter(xs_train, ys_train, s=10, color="k", alpha=0.7, zorder=3, label="training data")
    ax.set_xlim(xs.min(), xs.max())
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    if title is not None:
        ax.set_title(title)
    ax.legend(loc="best", fontsize="small")
    save(figure, path)
    return figure


def plot_reliability(
    probs: torch.Tensor | np.ndarray,
    y: torch.Tensor | np.ndarray,
    *,
    num_bins: int = 15,
    title: str | None = None,
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Draw a reliability diagram: per-bin accuracy against confidence, with the diagonal.

    Bins come from :func:`pyro_bbb.metrics.reliability_curve` and the title reports
    :func:`pyro_bbb.metrics.expected_calibration_error` for the same bins. Bars show each bin's
    accuracy, dots its mean confidence; a calibrated model has both on the dashed diagonal. A
    lower panel shows how many predictions fall in each bin.

    Args:
        probs: Predictive class probabilities, shape ``(batch, classes)``, or binary
            :math:`p(y = 1)` with shape ``(batch,)``; or a
            :class:`~pyro_bbb.ClassificationPrediction`, whose ``probs`` are read.
        y: Integer labels, shape ``(batch,)``.
        num_bins: Number of equal-width confidence bins over ``[0, 1]``.
        title: Optional text placed before the ECE in the title.
        path: Where to save the figure; not saved if omitted.

    Returns:
        The figure, with two axes (reliability above, bin counts below).

    Raises:
        TypeError: If ``probs`` is neither probabilities nor a classifier's prediction (a
            regression's, whose calibration is its intervals' coverage).
        ValueError: As :func:`pyro_bbb.metrics.reliability_curve`.
    """
    probs = getattr(probs, "probs", probs)  # a prediction passed as it is
    if not isinstance(probs, (torch.Tensor, np.ndarray)):
        raise TypeError(
            "plot_reliability draws a classifier's calibration: probs must be class "
            f"probabilities or a ClassificationPrediction, got {type(probs).__name__}; a "
            "regression's calibration is its intervals' coverage "
            "(pyro_bbb.metrics.interval_coverage(*prediction.interval(0.9), y))"
        )
    probs_t = torch.as_tensor(probs)
    y_t = torch.as_tensor(y)
    curve = metrics.reliability_curve(probs_t, y_t, num_bins=num_bins)
    ece = metrics.expected_calibration_error(probs_t, y_t, num_bins=num_bins)
    width = 1.0 / num_bins
    occupied = curve.counts > 0

    figure = new_figure(figsize=(5.0, 6.0), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    top.plot([0, 1], [0, 1], "--", color="0.4", lw=1, label="perfect calibration")
    top.bar(
        curve.bin_centers[occupied],
        curve.accuracy[occupied],
        width=width,
        color="C0",
        alpha=0.7,
        edgecolor="k",
        lw=0.5,
        label="accuracy",
    )
    top.plot(
        curve.bin_centers[occupied],
        curve.confidence[occupied],
        "o",
        color="C3",
        ms=4,
        label="mean confidence",
    )
    top.set_xlim(0.0, 1.0)
    top.set_ylim(0.0, 1.0)
    top.set_ylabel("accuracy")
    top.legend(loc="upper left", fontsize="small")
    prefix = f"{title} " if title else "Reliability "
    top.set_title(f"{prefix}(ECE = {ece:.3f})")

    bottom.bar(curve.bin_centers, curve.counts, width=width, color="0.6", edgecolor="k", lw=0.5)
    bottom.set_xlabel("confidence")
    bottom.set_ylabel("count")
    save(figure, path)
    return figure
