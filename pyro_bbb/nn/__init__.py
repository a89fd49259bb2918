"""Bayesian networks: layers whose weights are Pyro sample sites, and how to build them.

* :mod:`~pyro_bbb.nn.affine`: the affine maps (Linear, Conv2d) that accept weights with
  leading sample dims, and the effectful op :func:`bayesian_affine` that estimators intercept;
* :mod:`~pyro_bbb.nn.layers`: :class:`BayesianAffine`, one layer class for both maps, and
  :func:`initial_values` and :func:`fresh_initial_values`;
* :mod:`~pyro_bbb.nn.builders`: :func:`bayesianize` any ``nn.Module``, or build an
  :func:`mlp` in one call;
* :mod:`~pyro_bbb.nn.multi_head`: :class:`MultiHead`, a shared body with one head per task.

Nothing in this package knows of guides, training or evaluation.
"""

from .affine import AffineMap, Conv2dMap, LinearMap, bayesian_affine
from .builders import bayesianize, mlp
from .layers import BayesianAffine, fresh_initial_values, initial_values
from .multi_head import MultiHead

__all__ = [
    "AffineMap",
    "BayesianAffine",
    "Conv2dMap",
    "LinearMap",
    "MultiHead",
    "bayesian_affine",
    "bayesianize",
    "fresh_initial_values",
    "initial_values",
    "mlp",
]
