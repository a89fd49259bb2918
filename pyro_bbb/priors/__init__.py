"""Priors: what a weight's prior can be, and how a layer picks one by name.

* :mod:`~pyro_bbb.priors.families`: the prior families (:class:`Gaussian`,
  :class:`ScaleMixture`, :class:`FanInGaussian`) and the :class:`Prior` protocol a prior
  specification follows;
* :mod:`~pyro_bbb.priors.matching`: :func:`resolve_prior`, which picks a site's prior from a
  :data:`PriorSpec` by name pattern;
* :mod:`~pyro_bbb.priors.posterior`: :func:`from_guide`, a trained guide's posterior as the
  next prior (:class:`PosteriorPrior`), per site or per low-rank block;
* :mod:`~pyro_bbb.priors.gaussian_block`: the algebra of a low-rank block drawn site by site
  (its exact conditionals).

This package knows nothing of inference or training.
"""

from .families import FanInGaussian, Gaussian, Prior, ScaleMixture
from .matching import PriorSpec, resolve_prior
from .posterior import PosteriorPrior, from_guide

__all__ = [
    "FanInGaussian",
    "Gaussian",
    "PosteriorPrior",
    "Prior",
    "PriorSpec",
    "ScaleMixture",
    "from_guide",
    "resolve_prior",
]
