"""Inference: guides, the annealed ELBO, estimators, prediction and NUTS.

* :mod:`~pyro_bbb.infer.guides`: :class:`MeanFieldGuide` and :class:`LowRankGuide`;
* :mod:`~pyro_bbb.infer.kl`: closed-form KL rules; :mod:`~pyro_bbb.infer.sites`: the
  annotation keys guides write and the ELBO and estimators read;
* :mod:`~pyro_bbb.infer.schedules`: β schedules; :mod:`~pyro_bbb.infer.elbo`:
  :class:`AnnealedELBO`;
* :mod:`~pyro_bbb.infer.reparam`: local reparameterisation and flipout as effect handlers;
* :mod:`~pyro_bbb.infer.predictive`: :func:`predict` and its summaries;
* :mod:`~pyro_bbb.infer.collapse`: how much of a posterior sits at its prior, and the
  :class:`PosteriorCollapseWarning` that :func:`~pyro_bbb.fit` gives;
* :mod:`~pyro_bbb.infer.mcmc`: :func:`run_nuts` on the same model.

As ``pyro.infer`` holds Pyro's inference and not a training loop, the loop and the machinery
of a run (minibatches, History, callbacks, ``torch.distributed``, checkpoints, continual
learning) are :mod:`pyro_bbb.training`, built on this package, and saving a trained model is
:mod:`pyro_bbb.io`. This package imports none of them, nor :mod:`pyro_bbb.evaluation`, the
plots or the command line.
"""

from .collapse import CollapseDiagnosis, PosteriorCollapseWarning, diagnose_collapse, weight_kl
from .elbo import AnnealedELBO, ELBOTerms
from .guides import LowRankGuide, MeanFieldGuide
from .mcmc import NUTSResult, replay_nuts, run_nuts
from .predictive import ClassificationPrediction, Prediction, RegressionPrediction, predict
from .reparam import flipout, local_reparameterization
from .schedules import (
    BetaSchedule,
    ConstantBeta,
    CyclicalAnnealing,
    LinearWarmup,
    SigmoidWarmup,
    as_schedule,
    delayed_warmup,
)

__all__ = [
    "AnnealedELBO",
    "BetaSchedule",
    "ClassificationPrediction",
    "CollapseDiagnosis",
    "ConstantBeta",
    "CyclicalAnnealing",
    "ELBOTerms",
    "LinearWarmup",
    "LowRankGuide",
    "MeanFieldGuide",
    "NUTSResult",
    "PosteriorCollapseWarning",
    "Prediction",
    "RegressionPrediction",
    "SigmoidWarmup",
    "as_schedule",
    "delayed_warmup",
    "diagnose_collapse",
    "flipout",
    "local_reparameterization",
    "predict",
    "replay_nuts",
    "run_nuts",
    "weight_kl",
]
