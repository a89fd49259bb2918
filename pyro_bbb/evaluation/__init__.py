"""Judging a posterior: ArviZ export, diagnostics, distances and the VI-versus-NUTS report.

* :mod:`~pyro_bbb.evaluation.inference_data`: :func:`to_inference_data` for guides and NUTS
  alike, one schema, at the size of a real network: the sites and units asked for
  (:mod:`~pyro_bbb.evaluation.selection`, ArviZ's ``var_names``, ``filter_vars`` and
  ``coords``), drawn in bounded memory (:mod:`~pyro_bbb.evaluation.draws`);
* :mod:`~pyro_bbb.evaluation.posterior_table`: :func:`posterior_summary`, a Gaussian
  guide's posterior by site or layer from its parameters (σ, signal-to-noise, KL, the share
  at the prior);
* :mod:`~pyro_bbb.evaluation.diagnostics`: :func:`psis_khat` for a guide,
  :func:`effective_sample_size` and :func:`r_hat` for NUTS, by weight, and
  :func:`function_space_diagnostics` on the network's output;
* :mod:`~pyro_bbb.evaluation.distances`: W2, total variation, top-1 agreement, label-set
  coverage between predictives;
* :mod:`~pyro_bbb.evaluation.comparison`: :func:`compare` two posteriors on a test set.

The scoring rules (RMSE, log-likelihood, ECE, …) are in :mod:`pyro_bbb.metrics`, which
prediction uses too. Nothing here draws a figure.
"""

from .comparison import Comparison, compare
from .diagnostics import (
    FunctionSpaceDiagnostics,
    effective_sample_size,
    function_space_diagnostics,
    psis_khat,
    r_hat,
)
from .distances import label_set_coverage, top1_agreement, total_variation, wasserstein2
from .inference_data import to_inference_data
from .posterior_table import posterior_summary

__all__ = [
    "Comparison",
    "FunctionSpaceDiagnostics",
    "compare",
    "effective_sample_size",
    "function_space_diagnostics",
    "label_set_coverage",
    "posterior_summary",
    "psis_khat",
    "r_hat",
    "to_inference_data",
    "top1_agreement",
    "total_variation",
    "wasserstein2",
]
