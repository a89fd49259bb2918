r"""Streams: the online updaters against batch ``fit`` and two one-pass baselines, one protocol.

A stream is a data set that arrives in order, in minibatches of ``batch_size`` rows, each seen
once. Every method learns the same model (:class:`~pyro_bbb.BNN`, its network initialised from
the same seed) from the same stream, and is timed in CPU seconds (``time.process_time``) over
its learning alone, scores and figures left out:

* an online updater (:class:`~pyro_bbb.online.LoFi`, :class:`~pyro_bbb.online.RVGA`): one
  ``update`` per minibatch (:func:`run_updater`);
* streaming variational continual learning (:func:`streaming_vcl`): one
  :func:`~pyro_bbb.fit` per minibatch, with the previous minibatch's posterior as the prior
  (:class:`~pyro_bbb.training.VCL` with a task per minibatch, Nguyen et al. 2018);
* one-pass Adam (:func:`one_pass_adam`): a deterministic network (the MAP weights,
  :class:`~pyro_bbb.DeltaGuide`), one ``fit`` epoch over the stream in its order;
* batch ``fit`` (:func:`batch_fit`): a :class:`~pyro_bbb.MeanFieldGuide` fitted on the whole
  data at once, the reference the one-pass methods are measured against.

:func:`regression_scores` and :func:`classification_scores` score a prediction.
``benchmarks/online.py`` runs the comparisons; this module holds no figures and no command
line.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .. import metrics
from ..infer import ClassificationPrediction, DeltaGuide, MeanFieldGuide, RegressionPrediction
from ..model import BNN
from ..online import OnlineUpdater
from ..training import VCL, ConvergenceWarning, fit

__all__ = [
    "batch_fit",
    "classification_scores",
    "minibatches",
    "one_pass_adam",
    "regression_scores",
    "run_updater",
    "streaming_vcl",
]


def minibatches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The stream: consecutive ``(x, y)`` minibatches of ``batch_size`` rows, in order."""
    for start in range(0, len(x), batch_size):
        yield x[start : start + batch_size], y[start : start + batch_size]


def run_updater(
    updater: OnlineUpdater,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 10,
    every: int | None = None,
    callback: Callable[[int], None] | None = None,
) -> float:
    """Stream ``x, y`` through an updater, one ``update`` per minibatch.

    Args:
        updater: The online updater.
        x: Features ``(N, *features)``, in stream order.
        y: Targets ``(N, ...)``.
        batch_size: Rows per minibatch.
        every: Call ``callback`` after every ``every`` minibatches (and after the last).
        callback: Called with the number of points seen so far; its time is not counted.

    Returns:
        The CPU seconds the updates took.
    """
    seconds = 0.0
    batches = list(minibatches(x, y, batch_size))
    for index, (xb, yb) in enumerate(batches, 1):
        start = time.process_time()
        updater.update(xb, yb)
        seconds += time.process_time() - start
        if callback is not None and (index == len(batches) or (every and index % every == 0)):
            callback(updater.num_seen)
    return seconds


def streaming_vcl(
    model: BNN,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 10,
    name: str = "streaming_vcl",
    **fit_options: Any,
) -> tuple[VCL, float]:
    """Streaming VCL: one ``fit`` per minibatch, the previous posterior as its prior.

    Each minibatch is a task of :class:`~pyro_bbb.training.VCL` (mean-field guides, the plain
    ELBO): its ``fit`` sees only that minibatch, for 100 epochs unless ``epochs`` is given
    (full-batch steps on it; ``epochs=None`` trains each minibatch until more training stops
    improving the predictive, with ``until="converged"`` until the convergence check passes).
    A fit of one minibatch is short by design, so its ``ConvergenceWarning`` is not shown.

    Args:
        model: The model (its ``num_data`` is set to each minibatch's size).
        x: Features, in stream order.
        y: Targets.
        batch_size: Rows per minibatch.
        name: Prefix of the guides in Pyro's param store.
        **fit_options: Passed to every ``fit`` (``epochs``, 100 by default, ``lr``, …);
            ``progress`` is off.

    Returns:
        The :class:`~pyro_bbb.training.VCL` (predict with ``vcl.predict``) and its CPU
        seconds.
    """
    fit_options = {"progress": False, "epochs": 100, **fit_options}
    vcl = VCL(model, name=name)
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for xb, yb in minibatches(x, y, batch_size):
            vcl.fit(xb, yb, **fit_options)
    return vcl, time.process_time() - start


def one_pass_adam(
    model: BNN,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 10,
    name: str = "one_pass_adam",
    **fit_options: Any,
) -> tuple[DeltaGuide, float]:
    """A deterministic network trained by one epoch of Adam over the stream, in its order.

    ``fit`` with a :class:`~pyro_bbb.DeltaGuide` (the MAP weights: the prior as weight
    decay), ``epochs=1``, minibatches of ``batch_size`` in the stream's order, and ``fit``'s
    other defaults (Adam at ``fit``'s own rates, a rate per layer from its weights' size,
    :mod:`~pyro_bbb.training.rates`).

    Returns:
        The guide and the CPU seconds.
    """
    fit_options = {"progress": False, **fit_options}
    guide = DeltaGuide(model, name=name)
    start = time.process_time()
    fit(model, guide, x, y, epochs=1, batch_size=batch_size, shuffle=False, **fit_options)
    return guide, time.process_time() - start


def batch_fit(
    model: BNN, x: torch.Tensor, y: torch.Tensor, *, name: str = "batch_fit", **fit_options: Any
) -> tuple[MeanFieldGuide, float]:
    """A :class:`~pyro_bbb.MeanFieldGuide` fitted on all the data at once (``fit``'s defaults).

    Returns:
        The guide and the CPU seconds.
    """
    fit_options = {"progress": False, **fit_options}
    guide = MeanFieldGuide(model, name=name)
    start = time.process_time()
    fit(model, guide, x, y, **fit_options)
    return guide, time.process_time() - start


def regression_scores(prediction: RegressionPrediction, y: torch.Tensor) -> dict[str, float]:
    """Test log-likelihood (nats per point), RMSE and the mean epistemic standard deviation."""
    return {
        "log_likelihood": prediction.log_likelihood(y),
        "rmse": metrics.rmse(prediction.mean, y),
        "epistemic_std": float(prediction.epistemic_std.mean()),
    }


def classification_scores(
    prediction: ClassificationPrediction, y: torch.Tensor
) -> dict[str, float]:
    """Accuracy, NLL (nats per point) and ECE (15 bins)."""
    return {
        "accuracy": metrics.accuracy(prediction.probs, y),
        "nll": metrics.nll(prediction.log_probs, y),
        "ece": metrics.expected_calibration_error(prediction.probs, y, num_bins=15),
    }
