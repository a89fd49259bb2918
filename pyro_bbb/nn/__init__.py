"""Bayesian networks: layers whose weights are Pyro sample sites, and how to build them.

* :mod:`~pyro_bbb.nn.affine`: the affine maps (Linear, ConvNd, ConvTransposeNd) that accept
  weights with leading sample dims, and the effectful op :func:`bayesian_affine` that
  estimators intercept;
* :mod:`~pyro_bbb.nn.layers`: :class:`BayesianLayer`, the base of the Bayesian layers,
  :class:`BayesianAffine`, one layer class for every affine map, :func:`initial_values` and
  :func:`fresh_initial_values`;
* :mod:`~pyro_bbb.nn.module_layer`: :class:`BayesianModule`, any other module by weight
  sampling;
* :mod:`~pyro_bbb.nn.draws`: how several weight draws at once reach a network (through its
  layers where that is proved safe, else around its ``forward``, once per draw), and what a
  layer may ask of the draw under way;
* :mod:`~pyro_bbb.nn.builders`: :func:`bayesianize` any ``nn.Module``, or build an
  :func:`mlp` in one call;
* :mod:`~pyro_bbb.nn.network_summary`: :func:`summary`, a table of every parameter of a network;
* :mod:`~pyro_bbb.nn.multi_head`: :class:`MultiHead`, a shared body with one head per task.
* :mod:`~pyro_bbb.nn.training_mode`: whether a network is a function of its weights alone
  (no dropout or normalisation module in training mode).

Nothing in this package knows of guides, training or evaluation.
"""

from .affine import AffineMap, Conv2dMap, ConvMap, LinearMap, bayesian_affine
from .builders import bayesianize, mlp
from .draws import DrawPath, describe_draws, draw_path, settle_draws
from .layers import BayesianAffine, BayesianLayer, fresh_initial_values, initial_values
from .module_layer import BayesianModule
from .multi_head import MultiHead
from .network_summary import summary

__all__ = [
    "AffineMap",
    "BayesianAffine",
    "BayesianLayer",
    "BayesianModule",
    "Conv2dMap",
    "ConvMap",
    "DrawPath",
    "LinearMap",
    "MultiHead",
    "bayesian_affine",
    "bayesianize",
    "describe_draws",
    "draw_path",
    "fresh_initial_values",
    "initial_values",
    "mlp",
    "settle_draws",
    "summary",
]
