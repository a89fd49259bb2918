"""pyro_bbb: variational Bayesian neural networks (Bayes by Backprop) as Pyro models.

A network becomes a Pyro model whose weights are sample sites (:func:`bayesianize`,
:func:`mlp`, :class:`BNN`); a guide approximates their posterior (:class:`MeanFieldGuide`,
:class:`LowRankGuide` or any Pyro autoguide; :class:`DeltaGuide` for the point estimate;
an :class:`Ensemble` of any of them, trained as one); :func:`fit` maximises a β-annealed ELBO;
:func:`predict` returns calibrated predictive uncertainty; :func:`local_reparameterization`
and :func:`flipout` lower the gradient variance; :func:`run_nuts` samples the same model
with NUTS, :func:`to_inference_data` exports VI and NUTS to ArviZ,
:func:`posterior_summary` sums a guide's posterior up by site or layer, :func:`psis_khat`
diagnoses a guide and :func:`compare` sets two posteriors side by side. :func:`fit` trains
data-parallel under ``torchrun`` and writes checkpoints it can resume from; :func:`save` and
:func:`load` carry a trained model and guide to another process. By default :func:`fit`
trains until more training stops paying (``until="converged"``: until the posterior stops
moving), goes on from where it ended when given a fitted guide again, and warns with
:class:`ConvergenceWarning` when a budget ends a run before its test passed, and with
:class:`PosteriorCollapseWarning` when the posterior ends at its prior while the network
misses structure in the data; before training, :class:`TargetScaleWarning` when regression
targets are far from unit scale. For data that arrive as a stream,
:class:`LoFi` and :class:`RVGA` update the posterior one minibatch at a time in closed
form, in one pass (:class:`LowRankPrecisionGuide` is their belief as a guide).

The package mirrors Pyro's layout: :mod:`pyro_bbb.nn`, :mod:`pyro_bbb.priors`,
:mod:`pyro_bbb.likelihoods` and :mod:`pyro_bbb.model` say what a BNN is;
:mod:`pyro_bbb.infer` holds guides, the ELBO, β schedules, estimators, prediction and NUTS;
:mod:`pyro_bbb.training` holds :func:`fit` and the machinery of a run (minibatches, History,
callbacks, ``torch.distributed``, checkpoints, continual learning); :mod:`pyro_bbb.online`
the streaming updaters beside it; :mod:`pyro_bbb.io` saves
and loads; :mod:`pyro_bbb.evaluation` judges posteriors; :mod:`pyro_bbb.metrics` scores
predictions; :mod:`pyro_bbb.data` holds data sets; :mod:`pyro_bbb.plots` draws figures.
``import pyro_bbb`` needs no matplotlib.
"""

from . import data, evaluation, infer, io, likelihoods, metrics, nn, online, priors, training
from .evaluation import Comparison, compare, posterior_summary, psis_khat, to_inference_data
from .infer import (
    ClassificationPrediction,
    DeltaGuide,
    Ensemble,
    LowRankGuide,
    MeanFieldGuide,
    NUTSResult,
    PosteriorCollapseWarning,
    Prediction,
    RegressionPrediction,
    flipout,
    local_reparameterization,
    predict,
    run_nuts,
)
from .io import load, save
from .model import BNN
from .nn import BayesianAffine, BayesianModule, bayesianize, mlp, summary
from .online import RVGA, LoFi, LowRankPrecisionGuide
from .training import Callback, ConvergenceWarning, History, TargetScaleWarning, fit

__version__ = "0.1.0"

__all__ = [
    "BNN",
    "RVGA",
    "BayesianAffine",
    "BayesianModule",
    "Callback",
    "ClassificationPrediction",
    "Comparison",
    "ConvergenceWarning",
    "DeltaGuide",
    "Ensemble",
    "History",
    "LoFi",
    "LowRankGuide",
    "LowRankPrecisionGuide",
    "MeanFieldGuide",
    "NUTSResult",
    "PosteriorCollapseWarning",
    "Prediction",
    "RegressionPrediction",
    "TargetScaleWarning",
    "bayesianize",
    "compare",
    "data",
    "evaluation",
    "fit",
    "flipout",
    "infer",
    "io",
    "likelihoods",
    "load",
    "local_reparameterization",
    "metrics",
    "mlp",
    "nn",
    "online",
    "posterior_summary",
    "predict",
    "priors",
    "psis_khat",
    "run_nuts",
    "save",
    "summary",
    "to_inference_data",
    "training",
]
