r"""How far one posterior is from another: predictive quality, calibration, agreement, cost.

:func:`compare` scores two posteriors of one model, each a trained guide (VI) or a
:class:`~pyro_bbb.infer.mcmc.NUTSResult`, on a test set, and returns a :class:`Comparison`:
test log-likelihood, RMSE or accuracy, coverage of the 95 % predictive interval (or label
set), wall time, ESS per second for NUTS and PSIS :math:`\hat k` for VI, and how far their
predictives are apart, point by point (:mod:`~pyro_bbb.evaluation.distances`): the
Wasserstein-2 distance between the predictive samples (regression) or the total variation and
top-1 agreement of the predictive probabilities (classification), the measures of Izmailov et
al. 2021 (https://arxiv.org/abs/2104.14421).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import metrics
from .._pyro_compat import pyro_name
from ..infer.mcmc import NUTSResult
from ..infer.predictive import ClassificationPrediction, RegressionPrediction, predict
from .diagnostics import effective_sample_size, psis_khat
from .distances import label_set_coverage, top1_agreement, total_variation, wasserstein2
from .inference_data import warn_if_stopped_on_predictive

__all__ = ["Comparison", "compare"]


_LABELS = {
    "kind": "kind",
    "test_log_likelihood": "test log-likelihood (nats/point)",
    "rmse": "RMSE",
    "accuracy": "accuracy",
    "coverage_95": "95% interval coverage",
    "wall_time_s": "wall time (s)",
    "ess_per_s": "ESS/s (min over weights)",
    "psis_khat": "PSIS k-hat",
    "w2_mean": "W2 to the other, mean over points",
    "tv_mean": "TV to the other, mean over points",
    "top1_agreement": "top-1 agreement with the other",
}


@dataclass(frozen=True)
class Comparison:
    """Two posteriors side by side; print it, or read :meth:`to_dict`.

    Attributes:
        names: The two methods' names.
        task: ``"regression"`` or ``"classification"``.
        columns: ``{column: [value for a, value for b]}``; ``None`` where a column does not
            apply (ESS/s for VI, k̂ for NUTS, a time not given). Pairwise columns (``w2_mean``,
            or ``tv_mean`` and ``top1_agreement``) hold the same value twice.
        pointwise: Per test point: ``{"w2": (batch,)}`` or ``{"tv": ..., "agreement": ...}``.
    """

    names: tuple[str, str]
    task: str
    columns: dict[str, list]
    pointwise: dict[str, torch.Tensor] = field(repr=False)

    def to_dict(self) -> dict[str, list]:
        """Column-oriented, one entry per method: ``pandas.DataFrame(c.to_dict())`` works."""
        return {"method": list(self.names), **{k: list(v) for k, v in self.columns.items()}}

    def _rows(self) -> list[tuple[str, str, str]]:
        rows = []
        for key, values in self.columns.items():
            cells = [_format(v) for v in values]
            rows.append((_LABELS.get(key, key), *cells))
        return rows

    def __str__(self) -> str:
        rows = [("", *self.names), *self._rows()]
        width = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = [
            f"{r[0]:<{width[0]}}  {r[1]:>{width[1]}}  {r[2]:>{width[2]}}".rstrip() for r in rows
        ]
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        lines = [f"| | {self.names[0]} | {self.names[1]} |", "| --- | ---: | ---: |"]
        lines += [f"| {label} | {a} | {b} |" for label, a, b in self._rows()]
        return "\n".join(lines)


def _format(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if math.isnan(value):
        return "nan"
    return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"


# ---------------------------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------------------------


def _predictive(model, posterior, x, num_samples: int, seed: int):
    """The predictive at ``x`` of a guide or NUTS result, through :func:`~pyro_bbb.predict`."""
    if not isinstance(posterior, NUTSResult):
        return predict(model, posterior, x, num_samples=num_samples, seed=seed)
    return posterior.predict(model, x, seed=seed)


def _unpack(item, position: str):
    """``(posterior, wall time or None)`` from a guide, ``(guide, history)`` or NUTS result."""
    if isinstance(item, NUTSResult):
        return item, item.wall_time
    if isinstance(item, tuple):
        if len(item) != 2 or not hasattr(item[1], "seconds"):
            raise TypeError(
                f"{position} must be a guide, a NUTSResult or a (guide, History) pair; got a "
                f"tuple of {[type(v).__name__ for v in item]}"
            )
        return item[0], float(sum(item[1].seconds))
    if not callable(item):
        raise TypeError(
            f"{position} must be a guide, a NUTSResult or a (guide, History) pair; "
            f"got {type(item).__name__}"
        )
    return item, None


def _name(posterior) -> str:
    if isinstance(posterior, NUTSResult):
        return "NUTS"
    name = pyro_name(posterior) if isinstance(posterior, torch.nn.Module) else ""
    return name or type(posterior).__name__


@torch.no_grad()
def compare(
    model: Callable[..., Any],
    a: Callable[..., Any] | NUTSResult,
    b: Callable[..., Any] | NUTSResult,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    *,
    names: Sequence[str] | None = None,
    x_train: torch.Tensor | None = None,
    y_train: torch.Tensor | None = None,
    num_samples: int = 1000,
    seed: int = 0,
) -> Comparison:
    r"""Compare two posteriors of ``model`` on a test set.

    Each of ``a`` and ``b`` is a trained guide, a ``(guide, History)`` pair (to report the
    training time from :func:`~pyro_bbb.fit`'s history), or a
    :class:`~pyro_bbb.infer.mcmc.NUTSResult`. Both predictives are drawn with the same ``seed``
    (common random numbers), so a posterior compared with itself has distance exactly 0.

    Columns (see :class:`Comparison`):

    * ``test_log_likelihood``: mean :math:`\log \frac1S\sum_s p(y_i \mid x_i, w_s)`;
    * ``rmse`` of the predictive mean (regression) or ``accuracy`` (classification);
    * ``coverage_95``: fraction of test targets in the central 95 % predictive interval
      (regression) or in the 95 % label set (classification,
      :func:`label_set_coverage`);
    * ``wall_time_s``: NUTS's whole run, or the training time of a ``(guide, History)``;
    * ``ess_per_s``: NUTS's smallest bulk ESS over all weights, per second of wall time;
    * ``psis_khat``: :func:`~pyro_bbb.psis_khat` of a guide, only if ``x_train`` and
      ``y_train`` (the whole training set) are given;
    * pairwise: ``w2_mean``, the mean over test points of :func:`wasserstein2` between the
      two sets of predictive samples of ``y`` (regression), or ``tv_mean`` and
      ``top1_agreement`` of the mean predictive probabilities (classification).

    Args:
        model: The model both posteriors are of, e.g. a :class:`~pyro_bbb.BNN`.
        a: The first posterior.
        b: The second posterior.
        x_test: Test inputs ``(batch, *features)``.
        y_test: Test targets ``(batch[, dim])``.
        names: Names for ``a`` and ``b`` (default: the guide's name, or ``"NUTS"``; two
            of the same name get ``" (a)"`` and ``" (b)"``).
        x_train: The whole training set's inputs, for k̂.
        y_train: Its targets.
        num_samples: Predictive draws of a guide; a NUTS result uses all its draws.
        seed: Seed of the predictive draws (the same for ``a`` and ``b``).

    Returns:
        A :class:`Comparison`.

    Warns:
        ConvergenceWarning: Once per guide, when its fit stopped on the predictive
            (``fit``'s default ``until="predictive"``): the report and its distances read
            a posterior whose sds may be far from their optimum; compare the guide of a
            ``fit(..., until="converged")`` with NUTS.

    Raises:
        TypeError: If ``a`` or ``b`` is neither a guide, a pair nor a NUTS result.
        ValueError: If only one of ``x_train``/``y_train`` is given, or ``names`` is not two
            names.
    """
    (post_a, time_a), (post_b, time_b) = _unpack(a, "a"), _unpack(b, "b")
    if names is None:
        names = (_name(post_a), _name(post_b))
        if names[0] == names[1]:  # two guides of one class: told apart as the arguments are
            names = (f"{names[0]} (a)", f"{names[1]} (b)")
    names = tuple(names)
    if len(names) != 2 or not all(isinstance(n, str) for n in names):
        raise ValueError(f"names must be two strings, got {names!r}")
    if (x_train is None) != (y_train is None):
        raise ValueError("pass both x_train and y_train (for PSIS k-hat), or neither")
    for posterior in (post_a, post_b):
        warn_if_stopped_on_predictive(posterior, "compare")
        if getattr(posterior, "prototype_trace", False) is None:
            # an autoguide creates its parameters on its first call, which draws random
            # numbers: do it before the seeded draws, so that both see the same stream
            posterior(x_test)
    preds = [_predictive(model, p, x_test, num_samples, seed) for p in (post_a, post_b)]
    regression = isinstance(preds[0], RegressionPrediction)
    columns: dict[str, list] = {"kind": [], "test_log_likelihood": []}
    columns.update({"rmse": []} if regression else {"accuracy": []})
    columns.update({"coverage_95": [], "wall_time_s": [], "ess_per_s": [], "psis_khat": []})
    for posterior, pred, seconds in zip((post_a, post_b), preds, (time_a, time_b), strict=True):
        nuts = isinstance(posterior, NUTSResult)
        columns["kind"].append("NUTS" if nuts else "VI")
        columns["test_log_likelihood"].append(pred.log_likelihood(y_test))
        if regression:
            columns["rmse"].append(metrics.rmse(pred.mean, y_test))
            lower, upper = pred.interval(0.95)
            columns["coverage_95"].append(metrics.interval_coverage(lower, upper, y_test))
        else:
            assert isinstance(pred, ClassificationPrediction)
            columns["accuracy"].append(metrics.accuracy(pred.probs, y_test))
            # a binary prediction's probs have both classes, as a Categorical's
            columns["coverage_95"].append(label_set_coverage(pred.probs, y_test, 0.95))
        columns["wall_time_s"].append(seconds)
        if nuts:
            ess = torch.cat([v.reshape(-1) for v in effective_sample_size(posterior).values()])
            columns["ess_per_s"].append(float(ess.min()) / posterior.wall_time)
        else:
            columns["ess_per_s"].append(None)
        if nuts or x_train is None:
            columns["psis_khat"].append(None)
        else:
            columns["psis_khat"].append(
                psis_khat(model, posterior, x_train, y_train, num_samples=num_samples, seed=seed)
            )
    if regression:
        w2 = wasserstein2(preds[0].samples, preds[1].samples)
        pointwise = {"w2": w2}
        columns["w2_mean"] = [float(w2.mean())] * 2
    else:
        tv = total_variation(preds[0].probs, preds[1].probs)
        agreement = top1_agreement(preds[0].probs, preds[1].probs)
        pointwise = {"tv": tv, "agreement": agreement}
        columns["tv_mean"] = [float(tv.mean())] * 2
        columns["top1_agreement"] = [float(agreement.mean())] * 2
    return Comparison(names, "regression" if regression else "classification", columns, pointwise)
