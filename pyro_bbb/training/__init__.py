"""Training: the loop that fits a guide, and the machinery of a run.

* :mod:`~pyro_bbb.training.loop`: :func:`fit`, a short loop over the parts below;
* :mod:`~pyro_bbb.training.steps`: the optimiser steps of an epoch (``SVI``'s ``step``
  written out); :mod:`~pyro_bbb.training.records`: their record on the device, read once an
  epoch, and the report of a non-finite loss; :mod:`~pyro_bbb.training.captured`: the fused
  step on static buffers, captured as one CUDA graph on a GPU;
  :mod:`~pyro_bbb.training.optimizers`:
  the optimiser; :mod:`~pyro_bbb.training.lr_schedules`: its learning-rate schedule
  (:class:`InverseTimeDecay`, fit's default, and :class:`CosineDecay`);
  :mod:`~pyro_bbb.training.particles`: fit's default number of weight samples a step;
  :mod:`~pyro_bbb.training.callbacks`: the :class:`Callback` hooks;
* :mod:`~pyro_bbb.training.minibatches`: the minibatches, their order and the data checks;
* :mod:`~pyro_bbb.training.run_length`: how long a fit runs, a fixed number of epochs or
  (``epochs=None``) the stages of :mod:`~pyro_bbb.training.auto_epochs` until more
  training stops improving the predictive (``until="predictive"``, the default) or, with
  ``until="converged"``, until the convergence check passes;
  :mod:`~pyro_bbb.training.convergence`: the convergence check and
  :class:`ConvergenceWarning`;
* :mod:`~pyro_bbb.training.history`: :class:`History`, the per-epoch record of a fit;
* :mod:`~pyro_bbb.training.distributed`: data-parallel training on ``torch.distributed``;
* :mod:`~pyro_bbb.training.checkpoint`: fit's checkpoints and resuming bit for bit;
* :mod:`~pyro_bbb.training.continual`: :class:`VCL`, variational continual learning over
  ``fit`` (with :mod:`~pyro_bbb.training.coresets`).

Inference (:mod:`pyro_bbb.infer`: guides, the ELBO, estimators, prediction, NUTS) never
imports this package; ``fit`` is built on it. Saving a trained model is :mod:`pyro_bbb.io`.
"""

from .callbacks import Callback
from .continual import VCL
from .convergence import Convergence, ConvergenceWarning, check_convergence
from .coresets import select_coreset
from .history import History
from .loop import fit
from .lr_schedules import CosineDecay, InverseTimeDecay
from .minibatches import TargetScaleWarning

__all__ = [
    "VCL",
    "Callback",
    "Convergence",
    "ConvergenceWarning",
    "CosineDecay",
    "History",
    "InverseTimeDecay",
    "TargetScaleWarning",
    "check_convergence",
    "fit",
    "select_coreset",
]
