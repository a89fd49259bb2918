r"""The standard UCI regression benchmark: a BNN beside a deterministic net and MC dropout.

This module runs the protocol of Hernández-Lobato and Adams (2015) on every data set folder
it is given (the split-folder format read by :func:`pyro_bbb.data.load_uci_folder`):
for each split, standardize features and target on the training rows, fit a network with one
hidden layer and a learned Gaussian noise scale, and score the test rows in original units by

* the RMSE of the predictive mean, and
* the log predictive density per point,
  :math:`\frac1N\sum_i \log \frac1S\sum_s \mathcal{N}(y_i \mid \mu_s(x_i), \sigma_s^2)`,
  the Gaussian mixture over weight samples (the :math:`-\log \sigma_y` of the
  standardization included),

reported as mean ± standard error over splits. Five methods share one model, the same
:func:`~pyro_bbb.mlp`, :class:`~pyro_bbb.BNN`, N(0, 1) prior and learned noise, so they differ
only in how the weights are inferred:

* ``"bnn"``: Bayes by Backprop, a :class:`~pyro_bbb.MeanFieldGuide` (or
  :class:`~pyro_bbb.LowRankGuide`) trained on the β-annealed ELBO;
* ``"bnn_ensemble"``: an :class:`~pyro_bbb.Ensemble` of ``members`` such guides, trained as
  one, predicting with their uniform mixture;
* ``"deterministic"``: a point estimate (Pyro's ``AutoDelta``), i.e. the MAP weights, the
  prior acting as weight decay;
* ``"deep_ensemble"``: an :class:`~pyro_bbb.Ensemble` of ``members`` point estimates
  (:class:`~pyro_bbb.DeltaGuide`), independently initialised (Lakshminarayanan et al. 2017,
  without their adversarial examples; the learned noise scale, a parameter of the model, is
  shared by the members);
* ``"mc_dropout"``: the same point estimate with dropout after the hidden layer, kept on at
  prediction (Gal and Ghahramani 2016).

Its options are a :class:`~pyro_bbb.bench.uci_config.UCIConfig`; the scores and the
published figures they are set beside are in :mod:`pyro_bbb.bench.uci_results`. This module
holds no plotting and no command line (see :mod:`pyro_bbb.cli`).

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
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import lru_cache, partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

import pyro
import torch
from pyro.infer.autoguide import AutoDelta, init_to_value

from .._display import show_progress
from .._validation import check_choice, check_int
from ..data import UCIFolder, UCISplit, find_uci_folders, load_uci_folder, uci_num_splits
from ..infer import (
    DeltaGuide,
    Ensemble,
    LinearWarmup,
    LowRankGuide,
    MeanFieldGuide,
    predict,
)
from ..likelihoods import Gaussian
from ..model import BNN
from ..nn import initial_values, mlp
from ..training import fit
from ._workers import script_hidden
from .uci_config import UCIConfig
from .uci_results import METHODS, SplitResult, UCIResults

__all__ = ["UCIConfig", "fit_split", "run_uci"]

Method = Literal["bnn", "bnn_ensemble", "deterministic", "deep_ensemble", "mc_dropout"]


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
    if method in ("bnn", "bnn_ensemble"):
        if config.guide == "lowrank":
            family = partial(LowRankGuide, rank=config.rank, init_scale=config.init_scale)
        else:
            family = partial(MeanFieldGuide, init_scale=config.init_scale)
        guide = family(model) if method == "bnn" else Ensemble(model, family, k=config.members)
    elif method == "deep_ensemble":
        guide = Ensemble(model, DeltaGuide, k=config.members)
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
        split: A standardized split from :func:`~pyro_bbb.data.load_uci_folder`.
        dataset: The data set's name, recorded in the result.
        n_hidden: Hidden units of the one hidden layer.
        config: Training and scoring options.

    Returns:
        The split's :class:`SplitResult`, in original target units.

    Raises:
        ValueError: On an unknown ``method``.
    """
    check_choice("method", method, METHODS)
    start, cpu_start = time.perf_counter(), time.process_time()
    seed = config.seed + split.index
    with _own_param_store():
        pyro.set_rng_seed(seed)
        model, guide = _build(method, split.x_train.shape[1], n_hidden, len(split.x_train), config)
        if method in ("bnn", "bnn_ensemble"):
            beta: Any = None  # an automatic run's own warm-up
            if config.epochs is not None:
                beta = LinearWarmup(
                    config.warmup * config.epochs,
                    end=config.beta,
                    delay=config.hold * config.epochs,
                )
            reparam, particles = config.reparam, config.num_particles
        else:
            beta, reparam = 1.0, None  # the log prior as weight decay, at full weight
            particles = 1  # a point estimate (with dropout: one mask a step, as published)
        fit(
            model,
            guide,
            split.x_train,
            split.y_train,
            epochs=config.epochs,
            batch_size=_batch_size(config.batch_size, len(split.x_train)),
            lr=config.lr,
            beta=beta,
            num_particles=particles,
            reparam=reparam,
            seed=seed,
            progress=False,
        )
        # A point estimate without dropout predicts the same at every sample: one is enough
        # (of each member, for a deep ensemble); an ensemble of BNNs shares the samples out.
        num_samples = {
            "deterministic": 1,
            "deep_ensemble": 1,
            "bnn_ensemble": max(1, config.num_samples // config.members),
        }.get(method, config.num_samples)
        pred = predict(model, guide, split.x_test, num_samples=num_samples, seed=seed)
    return SplitResult.scored(
        pred, split, dataset=dataset, method=method,
        seconds=time.perf_counter() - start, cpu_seconds=time.process_time() - cpu_start,
    )  # fmt: skip


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
            :func:`~pyro_bbb.data.find_uci_folders`).
        num_splits: Use the first this many splits of each data set (all of a data set with
            fewer); ``None`` for all.
        datasets: Names of the data set folders to run (``["yacht", "boston"]``); ``None``
            runs every one found.
        methods: Which of :data:`METHODS` to run, in that order on each split.
        config: Training options; the defaults of :class:`UCIConfig` if omitted.
        jobs: Worker processes; splits run in parallel when above 1 (each worker uses one
            thread). The workers start without running the calling script again, so this
            works from a script without an ``if __name__ == "__main__":`` guard and from a
            notebook.
        progress: Show the bar; ``None`` shows it when stderr is a terminal or in a notebook.
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
    check_int("jobs", jobs)
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
    check_int("num_splits", num_splits, optional=True)
    tasks = []
    for folder in folders:
        available = uci_num_splits(folder)
        count = available if num_splits is None else min(num_splits, available)
        tasks += [(folder, count, k) for k in range(count)]

    from tqdm.auto import tqdm

    show = show_progress(progress)
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
                with script_hidden():  # the workers start here and need only this package
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
