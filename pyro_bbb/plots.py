"""Matplotlib figures for predictive uncertainty, training histories and calibration.

This module holds four figure functions: regression bands that separate epistemic from total
uncertainty, a training-history plot (loss, NLL, KL and the KL weight β per epoch), a
reliability diagram, and histograms of the weights' posterior standard deviations against the
prior's. It does not compute predictions or metrics beyond calling
:mod:`pyro_bbb.metrics`.

Each function takes tensors or numpy arrays, returns a :class:`matplotlib.figure.Figure` and
saves it when ``path`` is given (the format follows the file's extension; parent folders are
created). Matplotlib is imported inside the functions, so importing this module is cheap and
does not need matplotlib installed. Figures are built directly on the Agg canvas, not through
``pyplot``: they never need a display, never change the user's backend, and are freed when no
longer referenced. In a notebook a returned figure displays itself; elsewhere, save it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pyro_bbb import metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "plot_history",
    "plot_regression_bands",
    "plot_reliability",
    "plot_weight_sigma",
]

ArrayLike = torch.Tensor | np.ndarray | Sequence[float]
"""Plot inputs: a tensor (any device; detached here), a numpy array or a sequence of floats."""


def _new_figure(**figure_kwargs: Any) -> Figure:
    """A figure attached to the Agg canvas, independent of ``pyplot`` and of any display."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(**figure_kwargs)
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: str | os.PathLike[str] | None) -> None:
    if path is not None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(target, dpi=150, bbox_inches="tight")


def _vector(values: ArrayLike, name: str) -> np.ndarray:
    """Flatten ``(n,)`` or ``(n, 1)`` input to a float64 numpy vector of shape ``(n,)``."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise ValueError(f"{name} must have shape (n,) or (n, 1), got {array.shape}")
    return array


# ---------------------------------------------------------------------------------------------
# Regression
# ---------------------------------------------------------------------------------------------


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
            (``torch.sin``, ``np.sin`` and :func:`pyro_bbb.datasets.gap_function` all work).
        shade: Optional ``(low, high)`` input intervals to shade grey, e.g.
            ``pyro_bbb.datasets.gap_regions()["gap"]``.
        shade_label: Legend label for the shaded intervals; none if omitted.
        title: Optional axes title.
        path: Where to save the figure; not saved if omitted.

    Returns:
        The figure, with one axes.

    Raises:
        ValueError: If the training or test arrays disagree in length, an array is not 1-D (or
            ``(n, 1)``), or a standard deviation is negative.
    """
    xs_train = _vector(x_train, "x_train")
    ys_train = _vector(y_train, "y_train")
    if xs_train.shape != ys_train.shape:
        raise ValueError(
            f"x_train and y_train must have the same length, got {xs_train.size} and "
            f"{ys_train.size}"
        )
    xs = _vector(x_test, "x_test")
    columns = {"mean": mean, "epistemic_std": epistemic_std, "total_std": total_std}
    test = {name: _vector(value, name) for name, value in columns.items()}
    for name, value in test.items():
        if value.shape != xs.shape:
            raise ValueError(
                f"{name} must have one value per x_test point ({xs.size}), got {value.size}"
            )
    for name in ("epistemic_std", "total_std"):
        if (test[name] < 0).any():
            raise ValueError(f"{name} must be non-negative, got minimum {test[name].min():.6g}")

    order = np.argsort(xs, kind="stable")
    xs = xs[order]
    mu, epistemic, total = (test[name][order] for name in columns)

    figure = _new_figure(figsize=(8.0, 4.5), layout="constrained")
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
    if true_fn is not None:
        truth = true_fn(torch.as_tensor(xs, dtype=torch.float32))
        ax.plot(xs, _vector(truth, "true_fn(x_test)"), "--", color="C1", lw=1.5, label="truth")
    ax.scatter(xs_train, ys_train, s=10, color="k", alpha=0.7, zorder=3, label="training data")
    ax.set_xlim(xs.min(), xs.max())
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    if title is not None:
        ax.set_title(title)
    ax.legend(loc="best", fontsize="small")
    _save(figure, path)
    return figure


# ---------------------------------------------------------------------------------------------
# Training history
# ---------------------------------------------------------------------------------------------


def _history_series(history: object, name: str) -> np.ndarray:
    if isinstance(history, Mapping):
        if name not in history:
            raise ValueError(f"history must have a {name!r} entry, got keys {sorted(history)}")
        values = history[name]
    elif hasattr(history, name):
        values = getattr(history, name)
    else:
        raise ValueError(
            f"history must have a {name!r} attribute (a list per epoch), "
            f"got {type(history).__name__} without it"
        )
    return np.asarray([float(v) for v in values], dtype=np.float64)


def plot_history(
    history: object, *, title: str | None = None, path: str | os.PathLike[str] | None = None
) -> Figure:
    """Plot per-epoch training curves: loss, NLL and KL above, the KL weight β below.

    The upper panel uses a log scale when every plotted value is positive and a symmetric log
    scale otherwise (a Gaussian negative log-likelihood, and so the loss, can be negative).
    Empty series are skipped.

    Args:
        history: Any object with attributes ``loss``, ``nll``, ``kl`` and ``beta``, each a
            sequence with one number (float or 0-d tensor) per epoch; a mapping with those keys
            also works.
        title: Optional figure title.
        path: Where to save the figure; not saved if omitted.

    Returns:
        The figure, with two axes sharing the epoch axis.

    Raises:
        ValueError: If ``history`` lacks one of the four series.
    """
    series = {name: _history_series(history, name) for name in ("loss", "nll", "kl", "beta")}

    figure = _new_figure(figsize=(7.0, 5.0), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    plotted = []
    for color, name in zip(("C0", "C1", "C2"), ("loss", "nll", "kl"), strict=True):
        values = series[name]
        if values.size:
            top.plot(np.arange(1, values.size + 1), values, color=color, label=name)
            plotted.append(values)
    if plotted:
        everything = np.concatenate(plotted)
        if np.all(everything > 0):
            top.set_yscale("log")
        else:
            top.set_yscale("symlog", linthresh=1.0)
        top.legend(loc="best", fontsize="small")
    top.set_ylabel("per epoch")
    top.grid(True, which="major", alpha=0.3)

    beta = series["beta"]
    if beta.size:
        bottom.plot(np.arange(1, beta.size + 1), beta, color="C3")
        bottom.set_ylim(0.0, max(1.0, float(beta.max())) * 1.05)
    bottom.set_ylabel("β (KL weight)")
    bottom.set_xlabel("epoch")
    bottom.grid(True, alpha=0.3)
    if title is not None:
        figure.suptitle(title)
    _save(figure, path)
    return figure


# ---------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------


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
            :math:`p(y = 1)` with shape ``(batch,)``.
        y: Integer labels, shape ``(batch,)``.
        num_bins: Number of equal-width confidence bins over ``[0, 1]``.
        title: Optional text placed before the ECE in the title.
        path: Where to save the figure; not saved if omitted.

    Returns:
        The figure, with two axes (reliability above, bin counts below).

    Raises:
        ValueError: As :func:`pyro_bbb.metrics.reliability_curve`.
    """
    probs_t = torch.as_tensor(probs)
    y_t = torch.as_tensor(y)
    curve = metrics.reliability_curve(probs_t, y_t, num_bins=num_bins)
    ece = metrics.expected_calibration_error(probs_t, y_t, num_bins=num_bins)
    width = 1.0 / num_bins
    occupied = curve.counts > 0

    figure = _new_figure(figsize=(5.0, 6.0), layout="constrained")
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
    _save(figure, path)
    return figure


# ---------------------------------------------------------------------------------------------
# Weight posteriors
# ---------------------------------------------------------------------------------------------


def _posterior_std(value: object, name: str) -> np.ndarray:
    """Flattened posterior standard deviations from a tensor/array or a distribution."""
    if hasattr(value, "variance") and not isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.variance.sqrt()  # a distribution: its marginal standard deviations
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    array = np.asarray(value, dtype=np.float64).reshape(-1)
    if array.size == 0:
        raise ValueError(f"scales[{name!r}] is empty")
    if not np.all(np.isfinite(array)) or (array <= 0).any():
        raise ValueError(f"scales[{name!r}] must hold positive finite standard deviations")
    return array


def plot_weight_sigma(
    scales: Mapping[str, object],
    *,
    prior_scale: float | Sequence[float] | None = None,
    num_bins: int = 50,
    title: str | None = None,
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """Histograms of the weights' posterior standard deviations σ, with the prior's σ marked.

    One step histogram per entry of ``scales`` (e.g. one per layer) on a shared logarithmic σ
    axis. Weights whose σ stays at the prior's learned nothing from the data; weights far
    below it are pinned down by the data. A guide that collapsed to its initial σ shows up as
    a spike there.

    Args:
        scales: ``{name: standard deviations}``, each a tensor or array of any shape, or a
            distribution whose ``variance`` gives them (so
            ``MeanFieldGuide.posterior()`` and ``LowRankGuide.posterior()`` can be passed as
            they are).
        prior_scale: The prior's standard deviation(s), drawn as vertical lines (e.g. 1.0 for
            ``Gaussian(1.0)``, or ``[sigma1, sigma2]`` for a scale mixture); none if omitted.
        num_bins: Number of logarithmic bins over the σ range.
        title: Optional axes title.
        path: Where to save the figure; not saved if omitted.

    Returns:
        The figure, with one axes.

    Raises:
        ValueError: If ``scales`` is empty, an entry holds a non-positive or non-finite σ,
            a prior scale is not positive, or ``num_bins`` is not a positive int.
    """
    if not scales:
        raise ValueError("scales must hold at least one entry")
    if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive int, got {num_bins!r}")
    series = {name: _posterior_std(value, name) for name, value in scales.items()}
    if prior_scale is None:
        priors: list[float] = []
    elif isinstance(prior_scale, (int, float)):
        priors = [float(prior_scale)]
    else:
        priors = [float(v) for v in prior_scale]
    if any(not (np.isfinite(v) and v > 0) for v in priors):
        raise ValueError(f"prior_scale must hold positive numbers, got {prior_scale!r}")

    everything = np.concatenate([*series.values(), np.asarray(priors, dtype=np.float64)])
    low, high = everything.min(), everything.max()
    if high <= low * 1.0001:
        low, high = low / 1.5, high * 1.5
    edges = np.geomspace(low / 1.05, high * 1.05, num_bins + 1)

    figure = _new_figure(figsize=(7.0, 4.0), layout="constrained")
    ax = figure.add_subplot()
    for i, (name, values) in enumerate(series.items()):
        label = f"{name} (median {np.median(values):.2g})"
        ax.hist(values, bins=edges, histtype="step", lw=1.5, color=f"C{i % 10}", label=label)
    for i, value in enumerate(priors):
        label = "prior σ" if i == 0 else None
        ax.axvline(value, color="k", ls="--", lw=1.2, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("posterior σ (weight units)")
    ax.set_ylabel("number of weights")
    if title is not None:
        ax.set_title(title)
    ax.legend(loc="best", fontsize="small")
    _save(figure, path)
    return figure
