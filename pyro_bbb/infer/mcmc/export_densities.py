r"""Priors, noise priors and likelihoods as JAX log densities.

:func:`log_density` maps a torch distribution (a weight's prior, a sampled noise scale's
prior) to a JAX function summing its log density over a value; :func:`positive_bijection`
mirrors ``biject_to(support)`` of a noise prior, with its log-Jacobian; and
:func:`log_likelihood` maps a :mod:`pyro_bbb.likelihoods` observation model to
:math:`\sum_i \log p(y_i \mid f(x_i))`. Each follows torch's formula, so the exported
potential equals the torch one to rounding. Anything else raises
:class:`NotImplementedError`. Nothing here knows of networks or samplers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.distributions as tdist
from pyro.distributions import ExpandedDistribution
from torch.distributions import constraints

from ...likelihoods import Bernoulli, Categorical, Gaussian, Likelihood
from ...priors import ScaleMixture
from ._jax import jax, jnp, numpyro
from .export_ops import constant, unsupported

__all__ = ["log_density", "log_likelihood", "positive_bijection"]

#: Torch distributions with a NumPyro twin: its name and the parameters in NumPyro's order.
_TWINS: dict[type[tdist.Distribution], tuple[str, tuple[str, ...]]] = {
    tdist.Normal: ("Normal", ("loc", "scale")),
    tdist.Laplace: ("Laplace", ("loc", "scale")),
    tdist.Cauchy: ("Cauchy", ("loc", "scale")),
    tdist.StudentT: ("StudentT", ("df", "loc", "scale")),
    tdist.LogNormal: ("LogNormal", ("loc", "scale")),
    tdist.HalfNormal: ("HalfNormal", ("scale",)),
    tdist.HalfCauchy: ("HalfCauchy", ("scale",)),
    tdist.Gamma: ("Gamma", ("concentration", "rate")),
    tdist.InverseGamma: ("InverseGamma", ("concentration", "rate")),
    tdist.Exponential: ("Exponential", ("rate",)),
    tdist.Uniform: ("Uniform", ("low", "high")),
}

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _normal_log_prob(value, loc, scale):
    return -0.5 * ((value - loc) / scale) ** 2 - jnp.log(scale) - _HALF_LOG_2PI


def log_density(
    distribution: tdist.Distribution, *, dtype: np.dtype = np.float64, what: str = "a prior"
) -> Callable[[jax.Array], jax.Array]:
    r"""A torch distribution as ``value -> \sum \log p(value)`` in JAX (a scalar).

    ``Independent`` and expanded distributions are unwrapped: the sum runs over every
    element, as the log density of one site does. Supported: :class:`~pyro_bbb.priors.
    ScaleMixture` and the distributions in ``_TWINS`` (Normal, Laplace, Cauchy, StudentT,
    LogNormal, HalfNormal, HalfCauchy, Gamma, InverseGamma, Exponential, Uniform), by
    their NumPyro twins.

    Args:
        distribution: The torch distribution.
        dtype: NumPy dtype of its parameters in JAX.
        what: How to name it in an error, e.g. ``"the prior of site '0.weight'"``.

    Raises:
        NotImplementedError: For any other distribution.
    """
    base = distribution
    while isinstance(base, (tdist.Independent, ExpandedDistribution)):
        base = base.base_dist
    if isinstance(base, ScaleMixture):
        pi, sigma1, sigma2 = (constant(t, dtype) for t in (base.pi, base.sigma1, base.sigma2))
        log_pi, log_1m_pi = np.log(pi), np.log1p(-pi)

        def scale_mixture(value):
            components = jnp.stack(
                (
                    log_pi + _normal_log_prob(value, 0.0, sigma1),
                    log_1m_pi + _normal_log_prob(value, 0.0, sigma2),
                )
            )
            return jax.scipy.special.logsumexp(components, axis=0).sum()

        return scale_mixture
    twin = next((_TWINS[cls] for cls in type(base).__mro__ if cls in _TWINS), None)
    if twin is None:
        raise unsupported(f"{what}, a {type(base).__name__}")
    name, parameters = twin
    values = [constant(getattr(base, p), dtype) for p in parameters]
    if name == "Normal":  # the common case, written out as torch writes it
        loc, scale = values
        return lambda value: _normal_log_prob(value, loc, scale).sum()
    numpyro_distribution = getattr(numpyro.distributions, name)(*values)
    return lambda value: numpyro_distribution.log_prob(value).sum()


def positive_bijection(
    support: constraints.Constraint,
) -> Callable[[jax.Array], tuple[jax.Array, jax.Array]]:
    r"""``u -> (value, log|d value / d u|)`` as torch's ``biject_to(support)`` maps ``u``.

    For :math:`(a, \infty)` (``positive``, ``greater_than(a)``): :math:`a + e^u`; for
    :math:`(a, b)` (``interval(a, b)``): :math:`a + (b - a)\,\sigma(u)`.

    Raises:
        NotImplementedError: For any other support.
    """
    lower = float(getattr(support, "lower_bound", math.nan))
    upper = float(getattr(support, "upper_bound", math.nan))
    if isinstance(support, (constraints.greater_than, constraints.greater_than_eq)):

        def shifted_exp(u):
            return lower + jnp.exp(u), u

        return shifted_exp
    if isinstance(support, constraints.interval):
        width = upper - lower

        def scaled_sigmoid(u):
            log_jacobian = math.log(width) - jax.nn.softplus(-u) - jax.nn.softplus(u)
            return lower + width * jax.nn.sigmoid(u), log_jacobian

        return scaled_sigmoid
    raise unsupported(f"a noise prior with support {support}")


def log_likelihood(
    likelihood: Likelihood, y: torch.Tensor, *, dtype: np.dtype = np.float64
) -> Callable[[jax.Array, jax.Array | None], jax.Array]:
    r"""A likelihood as ``(output, scale) -> \sum_i \log p(y_i \mid output_i)`` in JAX.

    ``output`` is the network's output ``(batch, out)``; ``scale`` is a Gaussian noise
    scale (fixed, or sampled) where the likelihood has one to learn, else ``None``. Follows
    :mod:`pyro_bbb.likelihoods`: a Gaussian's mean (and, if heteroscedastic, raw scale
    :math:`\sigma = \mathrm{softplus}(\text{raw}) + \text{min\_scale}`) per target, a
    Categorical's logits, a Bernoulli's logits.

    Args:
        likelihood: The model's likelihood.
        y: The observed targets ``(batch[, dim])``.
        dtype: NumPy dtype in JAX.

    Raises:
        NotImplementedError: For any other likelihood.
    """
    if isinstance(likelihood, Gaussian):
        target = constant(y, dtype)
        if likelihood.heteroscedastic:
            floor = likelihood.min_scale

            def heteroscedastic(output, scale):
                width = output.shape[-1] // 2
                raw = output[..., width:]
                scale = jnp.where(raw > 20.0, raw, jax.nn.softplus(raw)) + floor
                loc = output[..., :width].reshape(target.shape)
                return _normal_log_prob(target, loc, scale.reshape(target.shape)).sum()

            return heteroscedastic
        fixed = None if likelihood.learned else constant(likelihood.scale, dtype)

        def gaussian(output, scale):
            scale = fixed if scale is None else scale
            return _normal_log_prob(target, output.reshape(target.shape), scale).sum()

        return gaussian
    if isinstance(likelihood, Categorical):
        labels = y.detach().cpu().long().numpy()

        def categorical(output, scale):
            log_p = jax.nn.log_softmax(output, axis=-1)
            return jnp.take_along_axis(log_p, labels[:, None], axis=-1).sum()

        return categorical
    if isinstance(likelihood, Bernoulli):
        target = constant(y, dtype)

        def bernoulli(output, scale):
            logits = output.reshape(target.shape)
            # torch's binary_cross_entropy_with_logits, negated
            return -(
                jnp.maximum(logits, 0) - logits * target + jnp.log1p(jnp.exp(-jnp.abs(logits)))
            ).sum()

        return bernoulli
    raise unsupported(f"the likelihood {type(likelihood).__name__}")
