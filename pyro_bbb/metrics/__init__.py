"""Scoring rules and calibration metrics for predictions, computed on plain torch tensors.

The numbers a paper table reports: RMSE, test log-likelihood and interval coverage for
regression (:mod:`~pyro_bbb.metrics.regression`); accuracy, negative log-likelihood, Brier
score, expected calibration error, the reliability curve that ECE and
:func:`pyro_bbb.plots.plot_reliability` share, and the AUROC of a score that should separate
two groups (:mod:`~pyro_bbb.metrics.classification`, which states the conventions for
``probs`` and labels). Every name is importable from here. Nothing here draws predictive
samples, runs models or imports Pyro: pass it tensors that a predictive has already produced.
Every function returns a Python ``float`` (numpy arrays for the reliability curve), computed
in float64 on detached CPU copies of its inputs.
"""

from .classification import (
    ReliabilityCurve,
    accuracy,
    auroc,
    brier,
    ece,
    expected_calibration_error,
    nll,
    reliability_curve,
)
from .regression import gaussian_log_likelihood, interval_coverage, log_likelihood, rmse

__all__ = [
    "ReliabilityCurve",
    "accuracy",
    "auroc",
    "brier",
    "ece",
    "expected_calibration_error",
    "gaussian_log_likelihood",
    "interval_coverage",
    "log_likelihood",
    "nll",
    "reliability_curve",
    "rmse",
]
