"""Online learning: a BNN's Gaussian posterior updated one minibatch at a time, in one pass.

Each updater keeps a Gaussian belief over a :class:`~pyro_bbb.BNN`'s Bayesian weights and
folds a minibatch into it in closed form with ``update(x, y)``: no epochs, no replay, no
learning rate. Its :attr:`~pyro_bbb.online.updater.OnlineUpdater.guide` is the belief at every
point of the stream, for ``predict``, ``compare``, ``to_inference_data``, ``save``/``load``
and :func:`~pyro_bbb.priors.from_guide`.

* :mod:`~pyro_bbb.online.rvga`: :class:`RVGA`, the recursive variational Gaussian
  approximation (Lambert, Bonnabel and Bach 2022) with a full covariance, expectations by
  Monte Carlo or linearised; for networks of up to a few thousand weights;
* :mod:`~pyro_bbb.online.lofi`: :class:`LoFi`, the low-rank extended Kalman filter (Chang et
  al. 2023), a diagonal-plus-rank-``r`` precision whose cost grows linearly with the weights,
  with iterated and sampled (BONG, Jones, Chang and Murphy 2024) forms of its step;
* :mod:`~pyro_bbb.online.guide`: :class:`LowRankPrecisionGuide`, the belief as a Pyro guide;
* :mod:`~pyro_bbb.online.updater`: what the updaters share (checks, set-up, the
  one-step-ahead predictive and the stream's log-evidence);
* :mod:`~pyro_bbb.online.empirical_bayes`: what they learn from the stream besides the
  weights, the noise and the prior's scale;
* :mod:`~pyro_bbb.online.observation`: the likelihood's gradient and curvature per
  observation;
* :mod:`~pyro_bbb.online.network`: the network as a function of its flat weights, and its
  Jacobian by :mod:`torch.func`.

This package sits beside :mod:`pyro_bbb.training` (an alternative to ``fit``), on
:mod:`pyro_bbb.infer`; it imports nothing of training, evaluation, the plots or the command
line.
"""

from .guide import LowRankPrecisionGuide
from .lofi import LoFi, LoFiState
from .rvga import RVGA, RVGAState
from .updater import OnlineUpdater

__all__ = ["RVGA", "LoFi", "LoFiState", "LowRankPrecisionGuide", "OnlineUpdater", "RVGAState"]
