r"""The one-pass protocol on UCI regression: every training split streamed once, a point a time.

The protocol of the LoFi paper's UCI comparison (Chang, Durán-Martín, Shestopaloff, Jones and
Murphy 2023, "Low-rank extended Kalman filtering for online learning of neural networks from
streaming data", https://arxiv.org/abs/2305.19535): Gal's splits, one hidden layer of 50
units, features and target standardised on the training rows, each training row folded in
once, in the split's order, one at a time; test RMSE and log predictive density per point in
the target's original units after the last step. Our updaters run at the library's defaults
(a ``FanInGaussian(2.0)`` prior and a learned noise, as ``docs/online.md`` writes them), on
the same :func:`~pyro_bbb.mlp` (ReLU) whatever the data set; their figures are set beside the
published ones (:data:`PUBLISHED_RMSE`, tuned by the authors by Bayesian optimisation) and
beside our batch BNN on the same splits (:func:`~pyro_bbb.bench.uci.fit_split`, 2,000
full-batch epochs, the UCI protocol of :mod:`pyro_bbb.bench.uci`).

:data:`METHODS` names what can be run: the two updaters at their defaults, and the variants
``docs/online.md`` measures against them. This module holds no command line
(``benchmarks/online_uci.py``) and no figures.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pyro
import torch

from .._validation import check_int
from ..data import UCISplit, find_uci_folders, load_uci_folder, write_uci_folder
from ..infer import predict
from ..likelihoods import Gaussian
from ..model import BNN
from ..nn import mlp
from ..online import RVGA, LoFi, OnlineUpdater
from ..priors import FanInGaussian
from ._workers import script_hidden
from .uci import UCIConfig, fit_split
from .uci_results import SplitResult, _mean_se

__all__ = [
    "BATCH",
    "METHODS",
    "PUBLISHED_RMSE",
    "OnePassMethod",
    "one_pass_split",
    "run_one_pass",
    "summarise",
    "write_held_out_shapes",
]

#: Test RMSE after one pass, original units, mean over Gal's 20 splits: the LoFi authors'
#: figures as printed in their code's notebook (probml/rebayes,
#: ``demos/showdown/plots-xval-passes.ipynb``), hyperparameters tuned by Bayesian optimisation
#: on validation NLL; LoFi at rank 10.
PUBLISHED_RMSE: dict[str, dict[str, float]] = {
    "LoFi (published)": {
        "boston": 5.12,
        "concrete": 7.27,
        "energy": 2.36,
        "wine": 0.650,
        "yacht": 4.66,
    },
    "full-covariance EKF (published)": {
        "boston": 4.04,
        "concrete": 6.45,
        "energy": 1.58,
        "wine": 0.657,
        "yacht": 3.14,
    },
}


@dataclass(frozen=True)
class OnePassMethod:
    """An updater and the options it runs with, and the predictive it is scored by.

    Attributes:
        updater: ``"lofi"`` or ``"rvga"``.
        options: Keyword arguments of the updater beyond the model.
        predictive: Passed to :func:`~pyro_bbb.predict` (``None``: the guide's default,
            linearised for both updaters).
        label: How tables name it.
    """

    updater: str
    label: str
    options: dict[str, Any] = field(default_factory=dict)
    predictive: str | None = None

    def build(self, model: BNN) -> OnlineUpdater:
        """The updater on ``model``."""
        return {"lofi": LoFi, "rvga": RVGA}[self.updater](model, **self.options)


#: The methods by name: ``"lofi"`` and ``"rvga"`` at their defaults, and the variants they are
#: measured against in ``docs/online.md``.
METHODS: dict[str, OnePassMethod] = {
    "lofi": OnePassMethod("lofi", "LoFi (rank 10)"),
    "rvga": OnePassMethod("rvga", "R-VGA (Monte Carlo, 10 draws)"),
    "ekf": OnePassMethod("rvga", "R-VGA linearised (full-covariance EKF)", {"linearised": True}),
    "lofi_sampled": OnePassMethod("lofi", "LoFi, sampled predictive", predictive="sample"),
    "rvga_sampled": OnePassMethod("rvga", "R-VGA, sampled predictive", predictive="sample"),
    "lofi_iterated": OnePassMethod("lofi", "LoFi, 2 iterations", {"num_iterations": 2}),
    "lofi_damped": OnePassMethod(
        "lofi", "LoFi, 3 iterations of step 0.5", {"num_iterations": 3, "step_size": 0.5}
    ),
    "lofi_bong_mc": OnePassMethod("lofi", "LoFi, BONG Monte Carlo (10 draws)", {"num_samples": 10}),
    "lofi_prior": OnePassMethod("lofi", "LoFi, learned prior scale", {"learn_prior_scale": True}),
    "rvga_prior": OnePassMethod("rvga", "R-VGA, learned prior scale", {"learn_prior_scale": True}),
    "ekf_prior": OnePassMethod(
        "rvga", "EKF, learned prior scale", {"linearised": True, "learn_prior_scale": True}
    ),
}
BATCH = "batch"  #: our batch BNN, 2,000 full-batch epochs (the UCI protocol)


def one_pass_split(
    split: UCISplit, method: str, *, dataset: str, n_hidden: int = 50, seed: int = 0
) -> SplitResult:
    """Stream one split's training rows once, one at a time, and score the test rows.

    Args:
        split: A standardised split (:func:`~pyro_bbb.data.load_uci_folder`).
        method: A key of :data:`METHODS`, or ``"batch"`` for the batch BNN.
        dataset: The data set's name, recorded in the result.
        n_hidden: Hidden units.
        seed: Split ``k`` starts its network from seed ``seed + k``.

    Returns:
        The scores in original units; ``cpu_seconds`` is the stream's (the updates only). A
        stream whose update raises ``FloatingPointError`` scores NaN.
    """
    if method == BATCH:
        config = UCIConfig(epochs=2000, n_hidden=n_hidden, seed=seed)
        result = fit_split("bnn", split, dataset=dataset, n_hidden=n_hidden, config=config)
        return replace(result, method=BATCH)
    spec = METHODS[method]
    store = pyro.get_param_store()
    saved = store.get_state()
    store.clear()
    try:
        pyro.set_rng_seed(seed + split.index)
        net = mlp([split.x_train.shape[1], n_hidden, 1], prior=FanInGaussian(2.0))
        model = BNN(net, Gaussian(), num_data=len(split.x_train))
        updater = spec.build(model)
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            for row in range(len(split.x_train)):
                updater.update(split.x_train[row : row + 1], split.y_train[row : row + 1])
        except FloatingPointError:
            return SplitResult(dataset, split.index, method, math.nan, math.nan, math.nan, 0.0)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        prediction = predict(
            model, updater.guide, split.x_test, num_samples=200, predictive=spec.predictive
        )
    finally:
        store.clear()
        store.set_state(saved)
    return SplitResult.scored(
        prediction, split, dataset=dataset, method=method, seconds=seconds, cpu_seconds=cpu
    )


def _task(path: str, num_splits: int, k: int, methods: tuple[str, ...]) -> list[SplitResult]:
    """Every method on split ``k`` of one folder, on one thread: what a worker runs."""
    torch.set_num_threads(1)
    data = load_uci_folder(path, num_splits=num_splits)
    split = data[k]
    n_hidden = data.n_hidden or 50
    return [one_pass_split(split, m, dataset=data.name, n_hidden=n_hidden) for m in methods]


def run_one_pass(
    path: str,
    *,
    methods: Sequence[str] = ("lofi", "rvga", BATCH),
    num_splits: int | None = None,
    datasets: Sequence[str] | None = None,
    jobs: int = 1,
    on_result: Callable[[SplitResult], None] | None = None,
) -> list[SplitResult]:
    """The one-pass protocol on every data set folder at ``path``.

    Args:
        path: A data set folder, or a folder of them.
        methods: Keys of :data:`METHODS`, and ``"batch"``.
        num_splits: The first this many splits of each set (all of a set with fewer);
            ``None`` for every split.
        datasets: The folders' names to run; ``None`` for every one found.
        jobs: Worker processes (one thread each); splits run in parallel above 1.
        on_result: Called with each result as it arrives.

    Returns:
        Every result, by data set, split and method.

    Raises:
        ValueError: On an unknown method or data set.
    """
    unknown = [m for m in methods if m != BATCH and m not in METHODS]
    if unknown or not methods:
        raise ValueError(f"methods must be keys of METHODS or 'batch', got {list(methods)}")
    check_int("jobs", jobs)
    folders = {f.name: str(f) for f in find_uci_folders(path)}
    if datasets is not None:
        missing = [name for name in datasets if name not in folders]
        if missing:
            raise ValueError(f"datasets must name folders under {path!r} ({sorted(folders)})")
        folders = {name: folders[name] for name in datasets}
    tasks = []
    for folder in folders.values():
        available = len(load_uci_folder(folder))
        count = available if num_splits is None else min(num_splits, available)
        tasks += [(folder, count, k, tuple(methods)) for k in range(count)]
    results: list[SplitResult] = []
    if jobs == 1:
        for task in tasks:
            for result in _task(*task):
                results.append(result)
                if on_result is not None:
                    on_result(result)
    else:
        with script_hidden(), ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            for batch in pool.map(_task, *zip(*tasks, strict=True)):
                for result in batch:
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
    order = {m: i for i, m in enumerate(methods)}
    return sorted(results, key=lambda r: (r.dataset, r.split, order[r.method]))


def summarise(results: Sequence[SplitResult]) -> dict[str, dict[str, dict[str, float]]]:
    """Per data set and method: the scores' means and standard errors over the splits.

    Returns:
        ``{dataset: {method: {"rmse", "rmse_se", "log_likelihood", "log_likelihood_se",
        "cpu_seconds", "splits", "failed"}}}``; failed splits (NaN) are counted, not averaged.
    """
    groups: dict[str, dict[str, list[SplitResult]]] = {}
    for result in results:
        groups.setdefault(result.dataset, {}).setdefault(result.method, []).append(result)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for dataset, methods in groups.items():
        for method, group in methods.items():
            done = [r for r in group if not math.isnan(r.rmse)]
            row: dict[str, float] = {"splits": len(group), "failed": len(group) - len(done)}
            for name in ("rmse", "log_likelihood"):
                row[name], row[f"{name}_se"] = (
                    _mean_se([getattr(r, name) for r in done]) if done else (math.nan, math.nan)
                )
            row["cpu_seconds"] = sum(r.cpu_seconds for r in done) / max(len(done), 1)
            table.setdefault(dataset, {})[method] = row
    return table


def write_held_out_shapes(folder: str | os.PathLike[str], *, num_splits: int = 3) -> list[Path]:
    r"""Two larger regression sets of other shapes, written as split folders under ``folder``.

    * ``friedman``: 8,000 rows of Friedman's first function of 10 inputs (five of them
      irrelevant), :math:`10\sin(\pi x_1x_2) + 20(x_3 - \tfrac12)^2 + 10x_4 + 5x_5 +
      \varepsilon`, :math:`\varepsilon \sim \mathcal N(0, 1)`, inputs uniform on
      :math:`[0, 1]`;
    * ``smooth``: 6,000 rows of a nearly noiseless function of 4 inputs on very different
      scales, :math:`\tanh(x_1) x_2 + \sin(3x_3) + 10^{-3}x_4`, :math:`x_4` of std 1,000,
      noise of std 0.01: a target the network can fit almost exactly, where a noise estimate
      that collapses shows at once.

    Args:
        folder: Where to write the two folders.
        num_splits: Random 90/10 splits of each.

    Returns:
        The two folders.
    """
    g = torch.Generator().manual_seed(0)
    x = torch.rand(8000, 10, generator=g)
    y = (
        10 * torch.sin(math.pi * x[:, 0] * x[:, 1])
        + 20 * (x[:, 2] - 0.5) ** 2
        + 10 * x[:, 3]
        + 5 * x[:, 4]
        + torch.randn(8000, generator=g)
    )
    smooth = torch.randn(6000, 4, generator=g) * torch.tensor([1.0, 1.0, 1.0, 1000.0])
    target = (
        torch.tanh(smooth[:, 0]) * smooth[:, 1]
        + torch.sin(3 * smooth[:, 2])
        + 1e-3 * smooth[:, 3]
        + 0.01 * torch.randn(6000, generator=g)
    )
    root = Path(folder)
    return [
        write_uci_folder(root / "friedman", x, y, num_splits=num_splits),
        write_uci_folder(root / "smooth", smooth, target, num_splits=num_splits),
    ]
