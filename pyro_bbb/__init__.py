"""pyro_bbb: variational Bayesian neural networks (Bayes by Backprop) as Pyro models.

A network becomes a Pyro model whose weights are sample sites (:func:`bayesianize`,
:func:`mlp`, :class:`BNN`); a guide approximates their posterior (:class:`MeanFieldGuide`
or any Pyro autoguide); :func:`fit` maximises a β-annealed ELBO; :func:`predict` returns
calibrated predictive uncertainty; :class:`LowRankGuide` captures weight correlations and
:func:`local_reparameterization` / :func:`flipout` lower the gradient variance;
:func:`run_nuts` samples the same model with NUTS, :func:`to_inference_data` exports VI and
NUTS to ArviZ, :func:`psis_khat` diagnoses a guide and :func:`compare` sets two posteriors
side by side.
``import pyro_bbb`` needs no matplotlib.
"""

from . import datasets, elbo, likelihoods, metrics, priors
from .compare import Comparison, compare
from .diagnostics import psis_khat, to_inference_data
from .guides import LowRankGuide, MeanFieldGuide
from .mcmc import NUTSResult, run_nuts
from .model import BNN
from .nn import BayesianAffine, bayesianize, mlp
from .predict import ClassificationPrediction, Prediction, RegressionPrediction, predict
from .reparam import flipout, local_reparameterization
from .train import Callback, History, fit

__version__ = "0.1.0"

__all__ = [
    "BNN",
    "BayesianAffine",
    "Callback",
    "ClassificationPrediction",
    "Comparison",
    "History",
    "LowRankGuide",
    "MeanFieldGuide",
    "NUTSResult",
    "Prediction",
    "RegressionPrediction",
    "bayesianize",
    "compare",
    "datasets",
    "elbo",
    "fit",
    "flipout",
    "likelihoods",
    "local_reparameterization",
    "metrics",
    "mlp",
    "predict",
    "priors",
    "psis_khat",
    "run_nuts",
    "to_inference_data",
]
