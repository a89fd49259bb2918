"""Scores of the UCI protocol: per split, summarised, set beside the published figures.

:class:`UCIResults` collects one :class:`SplitResult` per (data set, split, method), gives
mean ± standard error over splits, whether the BNN meets the published figures, and writes
Markdown and JSON. The published figures are data, read from ``published_uci.json`` next to
this module into :data:`PUBLISHED` (with :data:`PUBLISHED_SOURCES` naming each column's
paper); the protocol that produces the scores is :mod:`pyro_bbb.bench.uci`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .. import metrics
from .._validation import check_choice
from ..data import UCISplit
from ..infer import RegressionPrediction
from .uci_config import UCIConfig

__all__ = [
    "METHODS",
    "PUBLISHED",
    "PUBLISHED_SOURCES",
    "SplitResult",
    "UCIResults",
]

#: The methods the protocol compares, all on the same model code.
METHODS: tuple[str, ...] = ("bnn", "bnn_ensemble", "deterministic", "deep_ensemble", "mc_dropout")
"""The methods the protocol runs: the BNN, an ensemble of BNNs, a deterministic net, a deep
ensemble of deterministic nets and MC dropout."""

Figures = dict[str, dict[str, dict[str, tuple[float, float]]]]

_METHOD_LABELS = {
    "bnn": "BNN (ours)",
    "bnn_ensemble": "BNN ensemble (ours)",
    "deterministic": "deterministic",
    "deep_ensemble": "deep ensemble (ours)",
    "mc_dropout": "MC dropout",
}


def _load_published() -> tuple[dict[str, str], Figures]:
    text = resources.files(__package__).joinpath("published_uci.json").read_text("utf-8")
    data = json.loads(text)
    figures = {
        metric: {
            dataset: {method: (float(v[0]), float(v[1])) for method, v in by_method.items()}
            for dataset, by_method in by_dataset.items()
        }
        for metric, by_dataset in data["figures"].items()
    }
    return dict(data["sources"]), figures


PUBLISHED_SOURCES: dict[str, str]
"""Where each column of :data:`PUBLISHED` comes from: ``{method: paper and table}``."""

PUBLISHED: Figures
"""Published test RMSE and log-likelihood per point (higher is better), ``{metric: {data set:
{method: (mean, standard error)}}}``, in original units at the two decimals printed, for the
nine standard sets (boston, concrete, energy, kin8nm, naval, power, protein, wine, yacht) under
the standard protocol (20 splits, one hidden layer of 50 units; protein 5 splits, 100 units);
the deep ensembles' spread is the standard deviation over splits, as published. Data-set keys
are the folder names (``"wine"`` is red wine). Sources: :data:`PUBLISHED_SOURCES`."""

PUBLISHED_SOURCES, PUBLISHED = _load_published()


@dataclass(frozen=True)
class SplitResult:
    """The test scores of one method on one split, in the target's original units.

    Attributes:
        dataset: Data set name (the folder's name).
        split: Split index ``k``.
        method: One of :data:`METHODS`.
        rmse: Test RMSE of the predictive mean.
        log_likelihood: Mean test log predictive density per point (nats).
        noise_std: The learned noise std (original units).
        seconds: Wall time of training and prediction.
        cpu_seconds: CPU time of this process for the same (on a shared machine, closer than
            the wall time to what the split costs on an idle core).
    """

    dataset: str
    split: int
    method: str
    rmse: float
    log_likelihood: float
    noise_std: float
    seconds: float
    cpu_seconds: float = math.nan

    @classmethod
    def scored(
        cls,
        prediction: RegressionPrediction,
        split: UCISplit,
        *,
        dataset: str,
        method: str,
        seconds: float,
        cpu_seconds: float,
    ) -> SplitResult:
        """The test scores of a prediction on the split's standardised test features.

        Args:
            prediction: The predictive at ``split.x_test``, in standardised target units.
            split: The split (its target scaler and test targets).
            dataset: Data set name.
            method: The method's name.
            seconds: Wall time of training and prediction.
            cpu_seconds: CPU time of the same.
        """
        if not isinstance(prediction, RegressionPrediction):
            raise TypeError(f"a UCI split is scored on a RegressionPrediction, got {prediction!r}")
        prediction = prediction.unstandardize(split.y_scaler.mean, split.y_scaler.std)
        return cls(
            dataset=dataset,
            split=split.index,
            method=method,
            rmse=metrics.rmse(prediction.mean, split.y_test),
            log_likelihood=prediction.log_likelihood(split.y_test),
            noise_std=float(prediction.aleatoric_std.mean()),
            seconds=seconds,
            cpu_seconds=cpu_seconds,
        )


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (sample std with n - 1, over sqrt n; 0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


@dataclass
class UCIResults:
    """Every split's scores of a :func:`run_uci` run, with summaries and writers.

    Attributes:
        config: The run's :class:`UCIConfig`.
        results: One :class:`SplitResult` per (data set, split, method).
        seconds: Wall time of the run.
        jobs: Worker processes used.
    """

    config: UCIConfig
    results: list[SplitResult] = field(default_factory=list)
    seconds: float = 0.0
    jobs: int = 1

    @property
    def datasets(self) -> list[str]:
        """The data set names, in the order they were run."""
        return list(dict.fromkeys(r.dataset for r in self.results))

    @property
    def methods(self) -> list[str]:
        """The methods run, in :data:`METHODS` order."""
        present = {r.method for r in self.results}
        return [m for m in METHODS if m in present]

    def summary(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Mean ± standard error over splits.

        Returns:
            ``{data set: {method: {"rmse": (mean, se), "log_likelihood": (mean, se),
            "splits": n, "seconds_per_split": s, "cpu_seconds_per_split": c}}}``.
        """
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for dataset in self.datasets:
            out[dataset] = {}
            for method in self.methods:
                rows = [r for r in self.results if r.dataset == dataset and r.method == method]
                if rows:
                    out[dataset][method] = {
                        "rmse": _mean_se([r.rmse for r in rows]),
                        "log_likelihood": _mean_se([r.log_likelihood for r in rows]),
                        "splits": len(rows),
                        "seconds_per_split": sum(r.seconds for r in rows) / len(rows),
                        "cpu_seconds_per_split": sum(r.cpu_seconds for r in rows) / len(rows),
                    }
        return out

    def targets(self) -> dict[str, dict[str, bool | None]]:
        """The BNN's standing against the published figures, per data set.

        Returns:
            ``{data set: {"rmse_beats_vi", "ll_beats_vi", "ll_at_least_pbp"}}``, each a bool,
            or ``None`` where no figure is published for the data set or no BNN was run.
        """
        out: dict[str, dict[str, bool | None]] = {}
        for dataset, by_method in self.summary().items():
            ours = by_method.get("bnn")
            rmse_pub = PUBLISHED["rmse"].get(dataset)
            ll_pub = PUBLISHED["log_likelihood"].get(dataset)
            known = ours is not None and rmse_pub is not None and ll_pub is not None
            out[dataset] = {
                "rmse_beats_vi": ours["rmse"][0] < rmse_pub["VI"][0] if known else None,
                "ll_beats_vi": ours["log_likelihood"][0] > ll_pub["VI"][0] if known else None,
                "ll_at_least_pbp": (
                    ours["log_likelihood"][0] >= ll_pub["PBP"][0] if known else None
                ),
            }
        return out

    def to_markdown(self) -> str:
        """Two Markdown tables (RMSE, then log-likelihood): ours beside the published figures."""
        summary = self.summary()
        published = list(PUBLISHED_SOURCES)
        lines = []
        titles = (
            ("rmse", "Test RMSE, original units (lower is better)"),
            ("log_likelihood", "Test log-likelihood per point, original units (higher is better)"),
        )
        for metric, title in titles:
            lines.append(f"{title}, mean ± s.e. over splits")
            lines.append("")
            ours = [_METHOD_LABELS[m] for m in self.methods]
            header = ["data set", "splits", *ours, *(f"{p} (published)" for p in published)]
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + " --- |" * len(header))
            for dataset, by_method in summary.items():
                splits = max(v["splits"] for v in by_method.values())
                cells = [dataset, str(splits)]
                cells += [_format(by_method[m][metric]) for m in self.methods]
                figures = PUBLISHED[metric].get(dataset, {})
                cells += [_format(figures[p], 2) if p in figures else "–" for p in published]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
        c = self.config
        guide = c.guide + (f" (rank {c.rank})" if c.guide == "lowrank" else "")
        if c.epochs is None:
            length = (
                "fit's default length (epochs=None: until more training stops improving the "
                "predictive)"
            )
            warmup = "fit's own β warm-up"
        else:
            length = f"{c.epochs} epochs"
            warmup = (
                f"β 0 for the first {c.hold:.0%} of the epochs, then linear to {c.beta:g} over "
                f"the next {c.warmup:.0%}"
            )
        lines.append(
            f"{length}, batch {c.batch_size or 'full'}, Adam "
            + (
                "at fit's own rate (halved where it stops paying)"
                if c.lr is None
                else f"lr {c.lr:g} under fit's default learning-rate schedule"
            )
            + "; "
            f"BNN: {guide} guide, reparam {c.reparam}, initial σ {c.init_scale:g}, {warmup}; "
            f"MC dropout p = {c.dropout:g}; ensembles of {c.members}; "
            f"{c.num_samples} predictive samples. "
            f"Wall time {self.seconds:.0f} s with {self.jobs} worker(s); CPU time "
            f"{sum(r.cpu_seconds for r in self.results):.0f} s over all fits."
        )
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        """Every split's numbers, the summary, the targets and the config, JSON-ready."""
        return {
            "config": asdict(self.config),
            "seconds": self.seconds,
            "jobs": self.jobs,
            "summary": self.summary(),
            "targets": self.targets(),
            "published": PUBLISHED,
            "splits": [asdict(r) for r in self.results],
        }

    def save(self, folder: str | os.PathLike[str], stem: str = "uci") -> tuple[Path, Path]:
        """Write ``<stem>.md`` and ``<stem>.json`` into ``folder`` (created if needed).

        Returns:
            The paths of the Markdown and JSON files.
        """
        root = Path(folder)
        root.mkdir(parents=True, exist_ok=True)
        md, js = root / f"{stem}.md", root / f"{stem}.json"
        md.write_text(self.to_markdown())
        js.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return md, js

    def scores(
        self, metric: str = "log_likelihood"
    ) -> tuple[
        dict[str, dict[str, tuple[float, float]]], dict[str, dict[str, tuple[float, float]]]
    ]:
        """Each data set's mean ± s.e. per method, and the published figures for the same sets.

        The two mappings are what :func:`pyro_bbb.plots.plot_scores` draws:
        ``plot_scores(*results.scores())`` (``pyro-bbb bench uci`` saves that figure as
        ``uci.png``).

        Args:
            metric: ``"log_likelihood"`` (test log-likelihood per point, nats) or ``"rmse"``
                (test RMSE, original units).

        Returns:
            ``({data set: {method label: (mean, s.e.)}}, {data set: {source: (mean,
            spread)}})``; a data set without published figures has an empty mapping.

        Raises:
            ValueError: On another ``metric``.
        """
        check_choice("metric", metric, ("log_likelihood", "rmse"))
        ours = {
            dataset: {_METHOD_LABELS[m]: by_method[m][metric] for m in by_method}
            for dataset, by_method in self.summary().items()
        }
        published = {dataset: dict(PUBLISHED[metric].get(dataset, {})) for dataset in ours}
        return ours, published

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> UCIResults:
        """The results a :meth:`save` wrote to ``<stem>.json``, to summarise or plot again.

        Raises:
            ValueError: If the file holds no UCI run (no ``config`` and ``splits``).
        """
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or not {"config", "splits"} <= data.keys():
            raise ValueError(f"{path} holds no UCI run: expected 'config' and 'splits' keys")
        return cls(
            config=UCIConfig(**data["config"]),
            results=[SplitResult(**row) for row in data["splits"]],
            seconds=float(data.get("seconds", 0.0)),
            jobs=int(data.get("jobs", 1)),
        )


def _format(value: tuple[float, float], decimals: int | None = None) -> str:
    """``mean ± spread`` at ``decimals`` places.

    By default two, or two significant digits of a mean below 0.1: naval's RMSE, about
    0.001–0.005 in its original units, would otherwise print as ``0.00 ± 0.00``. The published
    figures are printed at two decimals, as published.
    """
    mean, se = value
    if decimals is None:
        size = abs(mean)
        decimals = 2 if size == 0 or size >= 0.1 else 1 - math.floor(math.log10(size))
    return f"{mean:.{decimals}f} ± {se:.{decimals}f}"
