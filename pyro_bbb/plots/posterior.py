r"""A figure of a network's posterior by site or layer: σ, signal-to-noise, the share at the prior.

:func:`plot_posterior_summary` draws the table of :func:`~pyro_bbb.posterior_summary`, one row
of the table a row of the figure: the spread of the posterior standard deviations (the
quantiles' range, the median and the mean), the spread of the signal-to-noise ratios
:math:`|\mu| / \sigma` (a weight below 1 is hard to tell from 0), and the share of weights
at their prior, with the row's KL to the prior written beside it. It computes nothing.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from ._figure import new_figure, save

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_posterior_summary"]


def _quantile_columns(columns: list[str], prefix: str) -> list[tuple[float, str]]:
    """``[(level in %, column)]`` of the columns ``<prefix>_<q>%``, by level."""
    found = []
    for column in columns:
        match = re.fullmatch(rf"{prefix}_([0-9.]+)%", column)
        if match:
            found.append((float(match.group(1)), column))
    return sorted(found)


def plot_posterior_summary(
    table: Any, *, title: str | None = None, path: str | os.PathLike[str] | None = None
) -> Figure:
    r"""Plot a posterior summary: σ and signal-to-noise ranges, and the share at the prior.

    Three panels share the rows (sites, layers or members and sites, top to bottom as in
    the table): the posterior standard deviations (log scale: a bar over the lowest to
    the highest quantile of the table, a dot at the median, a cross at the mean), the
    signal-to-noise ratios :math:`|\mu| / \sigma` likewise (a dotted line at 1), and the
    share of weights at their prior, labelled with the row's KL in nats.

    Args:
        table: The ``pandas.DataFrame`` of :func:`~pyro_bbb.posterior_summary` (any
            ``by``), or one with its columns ``sigma_mean``, ``sigma_<q>%``, ``snr_<q>%``
            (at least two levels each), ``kl`` and ``at_prior``.
        title: Optional figure title.
        path: Where to save the figure; not saved if omitted.

    Returns:
        The figure.

    Raises:
        ValueError: If a column is missing.
    """
    columns = list(table.columns)
    sigma = _quantile_columns(columns, "sigma")
    snr = _quantile_columns(columns, "snr")
    missing = [c for c in ("sigma_mean", "kl", "at_prior") if c not in columns]
    if missing or len(sigma) < 2 or len(snr) < 2:
        raise ValueError(
            "table must be a posterior_summary table, with sigma_mean, kl, at_prior and at "
            f"least two sigma_<q>% and snr_<q>% columns; got columns {columns}"
        )
    labels = [
        " / ".join(map(str, key)) if isinstance(key, tuple) else str(key) for key in table.index
    ]
    rows = np.arange(len(labels))
    height = max(2.5, 0.35 * len(labels) + 1.2)
    figure = new_figure(figsize=(11.0, height), layout="constrained")
    spread, ratio, share = figure.subplots(1, 3, sharey=True, width_ratios=(3, 3, 2))
    for axis, quantiles, mean, name in (
        (spread, sigma, "sigma_mean", "posterior σ"),
        (ratio, snr, None, "signal-to-noise |μ| / σ"),
    ):
        low = table[quantiles[0][1]].to_numpy(dtype=float)
        high = table[quantiles[-1][1]].to_numpy(dtype=float)
        middle = min(quantiles, key=lambda q: abs(q[0] - 50))[1]
        axis.hlines(rows, low, high, color="C0", linewidth=4, alpha=0.5,
                    label=f"{quantiles[0][0]:g}–{quantiles[-1][0]:g}%")  # fmt: skip
        axis.plot(table[middle].to_numpy(dtype=float), rows, "o", color="C0",
                  label=middle.rpartition("_")[2])  # fmt: skip
        if mean is not None:
            axis.plot(table[mean].to_numpy(dtype=float), rows, "x", color="C3", label="mean")
        if np.all(low > 0):
            axis.set_xscale("log")
        axis.set_xlabel(name)
        axis.legend(loc="best", fontsize="small")
    ratio.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    at_prior = table["at_prior"].to_numpy(dtype=float)
    share.barh(rows, at_prior, color="C2", alpha=0.7)
    kls = table["kl"].to_numpy(dtype=float)
    for row, (value, kl) in enumerate(zip(at_prior, kls, strict=True)):
        share.text(min(value, 1.0) + 0.02, row, f"KL {kl:.3g}", va="center", fontsize="small")
    share.set_xlim(0, 1.5)
    share.set_xticks([0, 0.5, 1])
    share.set_xlabel("share of weights at the prior")
    spread.set_yticks(rows, labels)
    spread.invert_yaxis()
    if title:
        figure.suptitle(title)
    save(figure, path)
    return figure
