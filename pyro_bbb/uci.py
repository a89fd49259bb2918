r"""The standard UCI regression benchmark: a BNN beside a deterministic net and MC dropout.

This module runs the protocol of Hernández-Lobato and Adams (2015) on every data set folder
it is given (the split-folder format read by :func:`pyro_bbb.datasets.load_uci_folder`):
for each split, standardize features and target on the training rows, fit a network with one
hidden layer and a learned Gaussian noise scale, and score the test rows in original units by

* the RMSE of the predictive mean, and
* the log predictive density per point,
  :math:`\frac1N\sum_i \log \frac1S\sum_s \mathcal{N}(y_i \mid \mu_s(x_i), \sigma_s^2)`,
  the Gaussian mixture over weight samples (the :math:`-\log \sigma_y` of the
  standardization included),

reported as mean ± standard error over splits. Three methods share one model, the same
:func:`~pyro_bbb.mlp`, :class:`~pyro_bbb.BNN`, N(0, 1) prior and learned noise, so they differ
only in how the weights are inferred:

* ``"bnn"``: Bayes by Backprop, a :class:`~pyro_bbb.MeanFieldGuide` (or
  :class:`~pyro_bbb.LowRankGuide`) trained on the β-annealed ELBO;
* ``"deterministic"``: a point estimate (Pyro's ``AutoDelta``), i.e. the MAP weights, the
  prior acting as weight decay;
* ``"mc_dropout"``: the same point estimate with dropout after the hidden layer, kept on at
  prediction (Gal and Ghahramani 2016).

The published figures are in :data:`PUBLISHED`. This module holds no plotting and no command
line (see :mod:`pyro_bbb.cli`).

References:
    Hernández-Lobato and Adams, *Probabilistic Backpropagation for Scalable Learning of
    Bayesian Neural Networks*, ICML 2015, https://arxiv.org/abs/1502.05336 (protocol, splits,
    VI and PBP figures).
    Gal and Ghahramani, *Dropout as a Bayesian Approximation*, ICML 2016,
    https://arxiv.org/abs/1506.02142 (MC dropout figures).
    Lakshminarayanan, Pritzel and Blundell, *Simple and Scalable Predictive Uncertainty
    Estimation using Deep Ensembles*, NeurIPS 2017, https://arxiv.org/abs/1612.01474.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

import pyro
import torch
from pyro.infer.autoguide import AutoDelta, init_to_value

from . import metrics
from .datasets import UCIFolder, UCISplit, find_uci_folders, load_uci_folder, uci_num_splits
from .elbo import Linear
from .guides import LowRankGuide, MeanFieldGuide
from .likelihoods import Gaussian
from .model import BNN
from .nn import initial_values, mlp
from .predict import RegressionPrediction, predict
from .train import fit

__all__ = [
    "METHODS",
    "PUBLISHED",
    "PUBLISHED_SOURCES",
    "SplitResult",
    "UCIConfig",
    "UCIResults",
    "fit_split",
    "run_uci",
]

Method = Literal["bnn", "deterministic", "mc_dropout"]

#: The methods :func:`run_uci` compares, all on the same model code.
METHODS: tuple[str, ...] = ("bnn", "deterministic", "mc_dropout")

_METHOD_LABELS = {"bnn": "BNN (ours)", "deterministic": "deterministic", "mc_dropout": "MC dropout"}

#: Where each column of :data:`PUBLISHED` comes from.
PUBLISHED_SOURCES: dict[str, str] = {
    "VI": "Graves 2011, as run by Hernández-Lobato & Adams 2015 (Table 1)",
    "PBP": "Hernández-Lobato & Adams 2015 (Table 1)",
    "MC dropout": "Gal & Ghahramani 2016 (Table 1)",
    "Deep ensembles": "Lakshminarayanan et al. 2017 (Table 1; ± sd as listed in BENCHMARKS.md)",
}

#: Published test RMSE and log-likelihood per point, ``{metric: {data set: {method: (mean,
#: standard error)}}}``, for the standard 20 splits and one hidden layer of 50 units; the keys
#: of data sets are the folder names (``"wine"`` is red wine). Sources: :data:`PUBLISHED_SOURCES`.
PUBLISHED: dict[str, dict[str, dict[str, tuple[float, float]]]] = {
    "rmse": {
        "boston": {
            "VI": (4.32, 0.29),
            "PBP": (3.01, 0.18),
            "MC dropout": (2.97, 0.19),
            "Deep ensembles": (3.28, 1.00),
        },
        "concrete": {
            "VI": (7.19, 0.12),
            "PBP": (5.67, 0.09),
            "MC dropout": (5.23, 0.12),
            "Deep ensembles": (6.03, 0.58),
        },
        "energy": {
            "VI": (2.65, 0.08),
            "PBP": (1.80, 0.05),
            "MC dropout": (1.66, 0.04),
            "Deep ensembles": (2.09, 0.29),
        },
        "wine": {
            "VI": (0.65, 0.01),
            "PBP": (0.64, 0.01),
            "MC dropout": (0.62, 0.01),
            "Deep ensembles": (0.64, 0.04),
        },
        "yacht": {
            "VI": (6.89, 0.67),
            "PBP": (1.02, 0.05),
            "MC dropout": (1.11, 0.38),
            "Deep ensembles": (1.58, 0.48),
        },
    },
    "log_likelihood": {
        "boston": {
            "VI": (-2.90, 0.07),
            "PBP": (-2.57, 0.09),
            "MC dropout": (-2.46, 0.06),
            "Deep ensembles": (-2.41, 0.25),
        },
        "concrete": {
            "VI": (-3.39, 0.02),
            "PBP": (-3.16, 0.02),
            "MC dropout": (-3.04, 0.02),
            "Deep ensembles": (-3.06, 0.18),
        },
        "energy": {
            "VI": (-2.39, 0.03),
            "PBP": (-2.04, 0.02),
            "MC dropout": (-1.99, 0.02),
            "Deep ensembles": (-1.38, 0.22),
        },
        "wine": {
            "VI": (-0.98, 0.01),
            "PBP": (-0.97, 0.01),
            "MC dropout": (-0.93, 0.01),
            "Deep ensembles": (-0.94, 0.12),
        },
        "yacht": {
            "VI": (-3.43, 0.16),
            "PBP": (-1.63, 0.02),
            "MC dropout": (-1.55, 0.03),
            "Deep ensembles": (-1.18, 0.21),
        },
    },
}


@dataclass(frozen=True)
class UCIConfig:
    """How every split is trained and scored; one config serves all methods and data sets.

    Attributes:
        epochs: Passes over the training rows (the folders' ``n_epochs.txt`` says 40, too few
            for mean-field VI; see ``docs/benchmarks.md``).
        batch_size: Minibatch size; ``None`` (the default) trains on the full batch, one step
            per epoch.
        lr: Adam learning rate.
        guide: The BNN's guide, ``"meanfield"`` or ``"lowrank"``.
        rank: Rank of the low-rank guide (one block per layer).
        reparam: Gradient estimator of the BNN: ``None``, ``"local"`` or ``"flipout"``.
        init_scale: Initial posterior std of every weight (BNN).
        warmup: Length of the linear KL warm-up from β = 0, as a fraction of ``epochs`` (BNN).
        beta: β after the warm-up (BNN); 1 is the ELBO.
        noise_init: Initial noise std, in standardized target units (all methods).
        dropout: Dropout probability of ``"mc_dropout"``.
        num_samples: Weight (or dropout-mask) samples per prediction.
        n_hidden: Hidden units; ``None`` takes each folder's ``n_hidden.txt`` (50 if absent).
        seed: Split ``k`` is trained with seed ``seed + k``, the same for every method.
    """

    epochs: int = 2000
    batch_size: int | None = None
    lr: float = 1e-2
    guide: Literal["meanfield", "lowrank"] = "meanfield"
    rank: int = 2
    reparam: str | None = "local"
    init_scale: float = 1e-2
    warmup: float = 0.25
    beta: float = 1.0
    noise_init: float = 0.5
    dropout: float = 0.05
    num_samples: int = 100
    n_hidden: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "num_samples", "rank"):
            value = getattr(self, name)
            if name == "batch_size" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.guide not in ("meanfield", "lowrank"):
            raise ValueError(f"guide must be 'meanfield' or 'lowrank', got {self.guide!r}")
        if self.reparam not in (None, "local", "flipout"):
            raise ValueError(f"reparam must be None, 'local' or 'flipout', got {self.reparam!r}")
        for name in ("lr", "init_scale", "warmup", "noise_init"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not (isinstance(self.beta, (int, float)) and math.isfinite(self.beta)) or self.beta < 0:
            raise ValueError(f"beta must be a finite number >= 0, got {self.beta!r}")
        if not 0 < self.dropout < 1:
            raise ValueError(f"dropout must be in (0, 1), got {self.dropout!r}")
        if self.n_hidden is not None and (not isinstance(self.n_hidden, int) or self.n_hidden < 1):
            raise ValueError(f"n_hidden must be a positive int or None, got {self.n_hidden!r}")


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


@contextlib.contextmanager
def _own_param_store() -> Iterator[None]:
    """Run with an empty Pyro param store, then put the caller's store back."""
    store = pyro.get_param_store()
    saved = store.get_state()
    store.clear()
    try:
        yield
    finally:
        store.clear()
        store.set_state(saved)


def _build(method: str, num_features: int, n_hidden: int, num_data: int, config: UCIConfig):
    """The model and guide of one method; every method uses the same mlp, prior and noise."""
    dropout = config.dropout if method == "mc_dropout" else 0.0
    net = mlp([num_features, n_hidden, 1], dropout=dropout)
    model = BNN(net, Gaussian(init_scale=config.noise_init), num_data=num_data)
    if method == "bnn":
        if config.guide == "lowrank":
            guide = LowRankGuide(model, rank=config.rank, init_scale=config.init_scale)
        else:
            guide = MeanFieldGuide(model, init_scale=config.init_scale)
    else:
        # A point mass started at the network's own initialisation: MAP weights.
        guide = AutoDelta(model, init_loc_fn=init_to_value(values=initial_values(model)))
    return model, guide


def fit_split(
    method: str, split: UCISplit, *, dataset: str, n_hidden: int, config: UCIConfig
) -> SplitResult:
    """Train one method on one split and score it on the split's test rows.

    The Pyro param store is emptied for the fit and restored afterwards.

    Args:
        method: One of :data:`METHODS`.
        split: A standardized split from :func:`~pyro_bbb.datasets.load_uci_folder`.
        dataset: The data set's name, recorded in the result.
        n_hidden: Hidden units of the one hidden layer.
        config: Training and scoring options.

    Returns:
        The split's :class:`SplitResult`, in original target units.

    Raises:
        ValueError: On an unknown ``method``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    start, cpu_start = time.perf_counter(), time.process_time()
    seed = config.seed + split.index
    with _own_param_store():
        pyro.set_rng_seed(seed)
        model, guide = _build(method, split.x_train.shape[1], n_hidden, len(split.x_train), config)
        if method == "bnn":
            beta: Any = Linear(warmup=config.warmup * config.epochs, end=config.beta)
            reparam = config.reparam
        else:
            beta, reparam = 1.0, None  # the log prior as weight decay, at full weight
        fit(
            model,
            guide,
            split.x_train,
            split.y_train,
            epochs=config.epochs,
            batch_size=_batch_size(config.batch_size, len(split.x_train)),
            lr=config.lr,
            beta=beta,
            reparam=reparam,
            seed=seed,
            progress=False,
        )
        # A point estimate without dropout predicts the same at every sample: one is enough.
        num_samples = 1 if method == "deterministic" else config.num_samples
        pred = predict(model, guide, split.x_test, num_samples=num_samples, seed=seed)
    assert isinstance(pred, RegressionPrediction)
    pred = pred.unstandardize(split.y_scaler.mean, split.y_scaler.std)
    return SplitResult(
        dataset=dataset,
        split=split.index,
        method=method,
        rmse=metrics.rmse(pred.mean, split.y_test),
        log_likelihood=pred.log_likelihood(split.y_test),
        noise_std=float(pred.aleatoric_std.mean()),
        seconds=time.perf_counter() - start,
        cpu_seconds=time.process_time() - cpu_start,
    )


def _batch_size(batch_size: int | None, num_data: int) -> int | None:
    return None if batch_size is None or batch_size >= num_data else batch_size


# --------------------------------------------------------------------------------------- runs


@lru_cache(maxsize=8)
def _folder(path: str, num_splits: int) -> UCIFolder:
    """A folder read once per process and run (each split of it is one task)."""
    return load_uci_folder(path, num_splits=num_splits)


def _run_one_split(
    path: str, num_splits: int, k: int, methods: tuple[str, ...], config: UCIConfig
) -> list[SplitResult]:
    """Every method on split ``k`` of one folder; what a worker process runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one hidden layer of 50 units: one thread is fastest
    try:
        data = _folder(path, num_splits)
        n_hidden = config.n_hidden or data.n_hidden or 50
        split = data[k]
        return [
            fit_split(m, split, dataset=data.name, n_hidden=n_hidden, config=config)
            for m in methods
        ]
    finally:
        torch.set_num_threads(threads)


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
                cells += [_format(figures[p]) if p in figures else "–" for p in published]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
        c = self.config
        guide = c.guide + (f" (rank {c.rank})" if c.guide == "lowrank" else "")
        lines.append(
            f"{c.epochs} epochs, batch {c.batch_size or 'full'}, Adam lr {c.lr:g}; "
            f"BNN: {guide} guide, reparam {c.reparam}, initial σ {c.init_scale:g}, "
            f"β linear from 0 to {c.beta:g} over the first {c.warmup:.0%} of the epochs; "
            f"MC dropout p = {c.dropout:g}; {c.num_samples} predictive samples. "
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


def _format(value: tuple[float, float]) -> str:
    mean, se = value
    return f"{mean:.2f} ± {se:.2f}"


def run_uci(
    path: str | os.PathLike[str],
    *,
    num_splits: int | None = None,
    datasets: Sequence[str] | None = None,
    methods: Sequence[str] = METHODS,
    config: UCIConfig | None = None,
    jobs: int = 1,
    progress: bool | None = None,
    on_result: Callable[[SplitResult], None] | None = None,
) -> UCIResults:
    """Run the UCI protocol on every data set folder at ``path``.

    One progress bar runs over all (data set, split) pairs; its label shows the current data
    set and the running mean of the first method's RMSE and log-likelihood on it.

    Args:
        path: A data set folder, or a folder of them (see
            :func:`~pyro_bbb.datasets.find_uci_folders`).
        num_splits: Use the first this many splits of each data set (all of a data set with
            fewer); ``None`` for all.
        datasets: Names of the data set folders to run (``["yacht", "boston"]``); ``None``
            runs every one found.
        methods: Which of :data:`METHODS` to run, in that order on each split.
        config: Training options; the defaults of :class:`UCIConfig` if omitted.
        jobs: Worker processes; splits run in parallel when above 1 (each worker uses one
            thread).
        progress: Show the bar; ``None`` shows it when stderr is a terminal.
        on_result: Called with each :class:`SplitResult` as it arrives.

    Returns:
        The :class:`UCIResults`, results ordered by data set, split and method.

    Raises:
        FileNotFoundError: If ``path`` holds no data set folder.
        ValueError: On an unknown method or data set, no method, ``num_splits`` or ``jobs``
            below 1.
    """
    methods = tuple(methods)
    unknown = [m for m in methods if m not in METHODS]
    if not methods or unknown:
        raise ValueError(f"methods must be a non-empty subset of {METHODS}, got {list(methods)}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    config = UCIConfig() if config is None else config
    folders = [str(f) for f in find_uci_folders(path)]
    if datasets is not None:
        by_name = {Path(f).name: f for f in folders}
        missing = [name for name in datasets if name not in by_name]
        if missing or not datasets:
            raise ValueError(
                f"datasets must name folders found under {str(path)!r} ({sorted(by_name)}), "
                f"got {list(datasets)}"
            )
        folders = [by_name[name] for name in datasets]
    if num_splits is not None and (
        isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1
    ):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    tasks = []
    for folder in folders:
        available = uci_num_splits(folder)
        count = available if num_splits is None else min(num_splits, available)
        tasks += [(folder, count, k) for k in range(count)]

    from tqdm.auto import tqdm

    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=len(tasks), unit="split", disable=not show, dynamic_ncols=True)
    start = time.perf_counter()
    collected: dict[tuple[str, int], list[SplitResult]] = {}
    running: dict[str, list[SplitResult]] = {}

    def record(results: list[SplitResult]) -> None:
        first = results[0]
        collected[(first.dataset, first.split)] = results
        running.setdefault(first.dataset, []).append(first)
        rows = running[first.dataset]
        rmse = sum(r.rmse for r in rows) / len(rows)
        ll = sum(r.log_likelihood for r in rows) / len(rows)
        bar.set_description(f"{first.dataset} {first.method} rmse {rmse:.3g} ll {ll:.3g}")
        bar.update()
        if on_result is not None:
            for result in results:
                on_result(result)

    try:
        if jobs == 1:
            for folder, count, k in tasks:
                record(_run_one_split(folder, count, k, methods, config))
        else:
            context = get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
                futures = [
                    pool.submit(_run_one_split, folder, count, k, methods, config)
                    for folder, count, k in tasks
                ]
                for future in as_completed(futures):
                    record(future.result())
    finally:
        bar.close()
        _folder.cache_clear()  # a later run re-reads the folders, in case they changed
    ordered = [r for key in sorted(collected) for r in collected[key]]
    return UCIResults(
        config=config, results=ordered, seconds=time.perf_counter() - start, jobs=jobs
    )
