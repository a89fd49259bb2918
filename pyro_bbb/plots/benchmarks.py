"""A benchmark's scores beside published ones: one panel per data set, mean ± spread."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ._figure import new_figure, save

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_scores"]

Scores = Mapping[str, Mapping[str, tuple[float, float]]]
"""``{data set: {method: (mean, spread)}}``."""


def plot_scores(
    ours: Scores,
    published: Scores | None = None,
    *,
    xlabel: str = "test log-likelihood per point (nats), higher is better",
    columns: int = 3,
    path: str | os.PathLike[str] | None = None,
) -> Figure:
    """One panel per data set: each method's mean score with its spread as an error bar.

    The methods measured here are drawn filled, one row each and in the order given; the
    published figures for the same data set (if any) are drawn hollow and grey below them, so
    the eye compares each of ours with the published values on one axis. Panels have their
    own x-axis: the scores of different data sets are in different units.

    Args:
        ours: ``{data set: {method: (mean, spread)}}``, e.g. a UCI run's mean ± standard error
            over splits, in the panel order wanted.
        published: The same for published figures, ``{data set: {source: (mean, spread)}}``;
            data sets missing from ``ours`` are ignored.
        xlabel: The score's name and direction, under every panel of the bottom row.
        columns: Panels per row (at most the number of data sets).
        path: Where to save the figure (the format follows the extension), or ``None``.

    Returns:
        The figure.

    Raises:
        ValueError: If ``ours`` is empty, a data set has no scores, or ``columns`` < 1.
    """
    if not ours:
        raise ValueError("ours must hold at least one data set, got none")
    empty = [name for name, scores in ours.items() if not scores]
    if empty:
        raise ValueError(f"ours has no scores for data set(s) {empty}")
    if not isinstance(columns, int) or columns < 1:
        raise ValueError(f"columns must be a positive int, got {columns!r}")
    published = published or {}
    columns = min(columns, len(ours))
    rows = math.ceil(len(ours) / columns)
    height = max(len(ours[d]) + len(published.get(d, {})) for d in ours)
    figure = new_figure(figsize=(4.2 * columns, (0.35 * height + 1.0) * rows))
    axes = figure.subplots(rows, columns, squeeze=False)
    for index, (dataset, scores) in enumerate(ours.items()):
        ax = axes[index // columns][index % columns]
        entries = [(label, value, True) for label, value in scores.items()]
        entries += [(label, value, False) for label, value in published.get(dataset, {}).items()]
        for row, (_, (mean, spread), measured) in enumerate(entries):
            y = len(entries) - 1 - row
            ax.errorbar(
                mean, y, xerr=spread, fmt="o", capsize=3,
                color="C0" if measured else "0.45",
                markerfacecolor="C0" if measured else "white",
            )  # fmt: skip
        ax.set_yticks(range(len(entries)))
        labels = [label if measured else f"{label} (published)" for label, _, measured in entries]
        ax.set_yticklabels(labels[::-1], fontsize=8)
        ax.set_title(dataset)
        ax.grid(axis="x", alpha=0.3)
        if index // columns == rows - 1 or index + columns >= len(ours):
            ax.set_xlabel(xlabel, fontsize=8)
    for index in range(len(ours), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    figure.tight_layout()
    save(figure, path)
    return figure
