"""Figures of training: the history of a fit and the posterior's weight standard deviations."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from .._validation import check_int
from ._figure import new_figure, save

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_history", "plot_weight_sigma"]


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


def _optional_series(history: object, name: str) -> np.ndarray:
    present = name in history if isinstance(history, Mapping) else hasattr(history, name)
    return _history_series(history, name) if present else np.zeros(0)


def plot_history(
    history: object, *, title: str | None = None, path: str | os.PathLike[str] | None = None
) -> Figure:
    """Plot per-epoch training curves: loss, NLL and KL above, the KL weight β below.

    Below, beside β, the fraction of weights at their prior (``history.collapsed``) when the
    history has it: most weights at the prior while the fit stays poor is posterior collapse
    (:class:`~pyro_bbb.PosteriorCollapseWarning`).

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

    figure = new_figure(figsize=(7.0, 5.0), layout="constrained")
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
        bottom.plot(np.arange(1, beta.size + 1), beta, color="C3", label="β")
        bottom.set_ylim(0.0, max(1.0, float(beta.max())) * 1.05)
    collapsed = _optional_series(history, "collapsed")
    if collapsed.size and np.isfinite(collapsed).any():
        bottom.plot(
            np.arange(1, collapsed.size + 1), collapsed, color="C4", ls="--", label="at prior"
        )
        bottom.legend(loc="best", fontsize="small")
    bottom.set_ylabel("β (KL weight)")
    bottom.set_xlabel("epoch")
    bottom.grid(True, alpha=0.3)
    if title is not None:
        figure.suptitle(title)
    save(figure, path)
    return figure


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
            they are), or the guide itself (its ``posterior()`` is read).
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
        TypeError: If ``scales`` is neither a mapping nor something with ``posterior()``.
    """
    if not isinstance(scales, Mapping) and callable(getattr(scales, "posterior", None)):
        scales = scales.posterior()  # a guide passed as it is: its posterior by site
    if not isinstance(scales, Mapping):
        raise TypeError(
            "scales must be {name: standard deviations}, e.g. guide.posterior(), got "
            f"{type(scales).__name__}"
        )
    if not scales:
        raise ValueError("scales must hold at least one entry")
    check_int("num_bins", num_bins)
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

    figure = new_figure(figsize=(7.0, 4.0), layout="constrained")
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
    save(figure, path)
    return figure
