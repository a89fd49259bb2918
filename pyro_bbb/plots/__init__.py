"""Matplotlib figures for predictive uncertainty, training histories and calibration.

This module holds six figure functions: regression bands that separate epistemic from total
uncertainty, a training-history plot (loss, NLL, KL and the KL weight β per epoch), a
reliability diagram, histograms of the weights' posterior standard deviations against the
prior's, a network's posterior summed up by site or layer (:func:`plot_posterior_summary`),
and a benchmark's scores beside published ones. It does not compute predictions or
metrics beyond calling :mod:`pyro_bbb.metrics`.

Each function takes tensors or numpy arrays, returns a :class:`matplotlib.figure.Figure` and
saves it when ``path`` is given (the format follows the file's extension; parent folders are
created). Matplotlib is imported inside the functions, so importing this module is cheap and
does not need matplotlib installed. Figures are built directly on the Agg canvas, not through
``pyplot``: they never need a display, never change the user's backend, and are freed when no
longer referenced. In a notebook a returned figure displays itself; elsewhere, save it.
"""

from .benchmarks import plot_scores
from .posterior import plot_posterior_summary
from .predictive import plot_regression_bands, plot_reliability
from .training import plot_history, plot_weight_sigma

__all__ = [
    "plot_history",
    "plot_posterior_summary",
    "plot_regression_bands",
    "plot_reliability",
    "plot_scores",
    "plot_weight_sigma",
]
