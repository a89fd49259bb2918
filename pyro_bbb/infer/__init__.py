"""Inference: guides, the annealed ELBO, estimators, training, prediction and NUTS.

* :mod:`~pyro_bbb.infer.guides`: :class:`MeanFieldGuide`, :class:`LowRankGuide` and
  :class:`DeltaGuide`; :mod:`~pyro_bbb.infer.ensemble`: an :class:`Ensemble` of ``K`` of
  them as one guide;
* :mod:`~pyro_bbb.infer.kl`: closed-form KL rules; :mod:`~pyro_bbb.infer.sites`: the
  annotation keys guides write and the ELBO and estimators read;
* :mod:`~pyro_bbb.infer.schedules`: β schedules; :mod:`~pyro_bbb.infer.lr_schedules`:
  learning-rate schedules (:class:`InverseTimeDecay`, fit's default, and
  :class:`CosineDecay`); :mod:`~pyro_bbb.infer.elbo`: :class:`AnnealedELBO`;
* :mod:`~pyro_bbb.infer.reparam`: local reparameterisation and flipout as effect handlers;
* :mod:`~pyro_bbb.infer.training`: :func:`fit` (with :mod:`~pyro_bbb.infer.minibatches`
  and :mod:`~pyro_bbb.infer.history`); :mod:`~pyro_bbb.infer.distributed`: data-parallel
  training on ``torch.distributed``; :mod:`~pyro_bbb.infer.checkpoint`: fit's checkpoints
  and resuming;
* :mod:`~pyro_bbb.infer.serialization`: :func:`save` and :func:`load` of a trained model
  and guide, in the files of :mod:`~pyro_bbb.infer.files` (atomic write, safe read);
* :mod:`~pyro_bbb.infer.predictive`: :func:`predict` and its summaries;
* :mod:`~pyro_bbb.infer.continual`: :class:`VCL`, variational continual learning over
  ``fit`` (with :mod:`~pyro_bbb.infer.coresets`);
* :mod:`~pyro_bbb.infer.collapse`: how much of a posterior sits at its prior, and the
  :class:`PosteriorCollapseWarning` that :func:`fit` gives;
* :mod:`~pyro_bbb.infer.mcmc`: :func:`run_nuts` on the same model.

This package imports nothing of :mod:`pyro_bbb.evaluation`, the plots or the command line.
"""

from .collapse import CollapseDiagnosis, PosteriorCollapseWarning, diagnose_collapse, weight_kl
from .continual import VCL
from .coresets import select_coreset
from .elbo import AnnealedELBO, ELBOTerms
from .ensemble import Ensemble
from .guides import DeltaGuide, LowRankGuide, MeanFieldGuide
from .history import History
from .lr_schedules import CosineDecay, InverseTimeDecay
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
from .serialization import load, save
from .training import Callback, fit

__all__ = [
    "VCL",
    "AnnealedELBO",
    "BetaSchedule",
    "Callback",
    "ClassificationPrediction",
    "CollapseDiagnosis",
    "ConstantBeta",
    "CosineDecay",
    "CyclicalAnnealing",
    "DeltaGuide",
    "ELBOTerms",
    "Ensemble",
    "History",
    "InverseTimeDecay",
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
    "fit",
    "flipout",
    "load",
    "local_reparameterization",
    "predict",
    "replay_nuts",
    "run_nuts",
    "save",
    "select_coreset",
    "weight_kl",
]
