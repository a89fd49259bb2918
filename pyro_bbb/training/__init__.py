"""Training: the loop that fits a guide, and the machinery of a run.

* :mod:`~pyro_bbb.training.loop`: :func:`fit` and its :class:`Callback` hooks;
* :mod:`~pyro_bbb.training.minibatches`: the minibatches, their order and the data checks;
* :mod:`~pyro_bbb.training.history`: :class:`History`, the per-epoch record of a fit;
* :mod:`~pyro_bbb.training.distributed`: data-parallel training on ``torch.distributed``;
* :mod:`~pyro_bbb.training.checkpoint`: fit's checkpoints and resuming bit for bit;
* :mod:`~pyro_bbb.training.continual`: :class:`VCL`, variational continual learning over
  ``fit`` (with :mod:`~pyro_bbb.training.coresets`).

Inference (:mod:`pyro_bbb.infer`: guides, the ELBO, estimators, prediction, NUTS) never
imports this package; ``fit`` is built on it. Saving a trained model is :mod:`pyro_bbb.io`.
"""

from .continual import VCL
from .coresets import select_coreset
from .history import History
from .loop import Callback, fit

__all__ = ["VCL", "Callback", "History", "fit", "select_coreset"]
