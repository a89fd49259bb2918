r"""A BNN's potential :math:`U(\theta) = -\log p(y, w(\theta))` as a pure JAX function.

:func:`export_potential` builds, from a :class:`~pyro_bbb.BNN` and the flat layout of
:mod:`~pyro_bbb.infer.mcmc.potential`, a JAX function of the same flat vector
:math:`\theta` whose value and gradient equal those of the torch
:class:`~pyro_bbb.infer.mcmc.potential.Potential`:

.. math::

    U(\theta) = -\Big[\sum_{\text{sites } k} \log p_k(w_k)
        + \sum_i \log p\big(y_i \mid f_w(x_i), \sigma\big)
        + \log p(\sigma) + \log\Big|\frac{d\sigma}{du}\Big|\Big],

with the last two terms only for a sampled noise scale :math:`\sigma = T(u)` (``noise=``
a prior). The network comes from :mod:`~pyro_bbb.infer.mcmc.export_network`, priors and
likelihood from :mod:`~pyro_bbb.infer.mcmc.export_densities`; constants (data, fixed
parameters) are copied to the CPU in the precision asked for, whatever the model's device
and dtype. It samples nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ...model import BNN
from ..sites import base_support
from ._jax import jax
from .export_densities import log_density, log_likelihood, positive_bijection
from .export_network import export_network
from .export_ops import constant, unsupported
from .potential import FlatSite

__all__ = ["export_potential"]


def export_potential(
    model: BNN,
    x: torch.Tensor,
    y: torch.Tensor,
    sites: list[FlatSite],
    noise_value: torch.Tensor | None = None,
    *,
    dtype: np.dtype = np.float64,
) -> Callable[[jax.Array], jax.Array]:
    r"""The model's potential energy as a JAX function ``theta (dim,) -> U`` (a scalar).

    Call it (and build it) under ``jax.enable_x64(True)`` for float64.

    Args:
        model: A :class:`~pyro_bbb.BNN` with its own forward, whose network
            :func:`~pyro_bbb.infer.mcmc.export_network.export_network` can export.
        x: The whole training set's inputs ``(num_data, *features)``.
        y: Its targets ``(num_data[, dim])``.
        sites: The flat layout (:func:`~pyro_bbb.infer.mcmc.potential.flat_layout`).
        noise_value: A learned Gaussian noise scale held fixed, else ``None``.
        dtype: ``np.float64`` or ``np.float32``.

    Returns:
        :math:`U(\theta)`, pure and traceable (``jax.jit``, ``jax.grad``, ``jax.vmap``).

    Raises:
        NotImplementedError: For a model other than a :class:`~pyro_bbb.BNN`, a site no
            Bayesian layer samples, or a layer, operation, prior or likelihood the export
            does not know.
    """
    if not isinstance(model, BNN) or type(model).forward is not BNN.forward:
        raise unsupported(
            f"the model {type(model).__name__}: it exports a pyro_bbb.BNN (network, "
            "likelihood, data plate) with BNN's own forward"
        )
    net = export_network(model.net, dtype=dtype)
    weights = [site for site in sites if site.prior is None]
    priors = {}
    for site in weights:
        if site.name not in net.sites:
            raise unsupported(f"the site {site.name!r}, which no Bayesian layer samples")
        path, param = net.sites[site.name]
        layer = model.net.get_submodule(path)
        priors[site.name] = log_density(
            layer.prior_distribution(param), dtype=dtype, what=f"the prior of {site.name!r}"
        )
    likelihood = log_likelihood(model.likelihood, y, dtype=dtype)
    inputs = constant(x, dtype) if x.is_floating_point() else x.cpu().numpy()  # token ids
    fixed_scale = None if noise_value is None else constant(noise_value, dtype)
    noise = next((site for site in sites if site.prior is not None), None)
    if noise is not None:
        noise_prior = log_density(noise.prior, dtype=dtype, what="the noise prior")
        bijection = positive_bijection(base_support(noise.prior))

    def potential(theta: jax.Array) -> jax.Array:
        params = {s.name: theta[s.start : s.stop].reshape(s.shape) for s in weights}
        log_joint = sum(priors[name](value) for name, value in params.items())
        scale = fixed_scale
        if noise is not None:
            scale, log_jacobian = bijection(theta[noise.start])
            log_joint = log_joint + noise_prior(scale) + log_jacobian
        return -(log_joint + likelihood(net(params, inputs), scale))

    # one abstract evaluation: shape errors and refusals that only the forward pass meets
    # (e.g. an adaptive pool over a size it does not divide) surface here, not in a sampler
    theta = jax.ShapeDtypeStruct((sites[-1].stop,), dtype)
    if jax.eval_shape(potential, theta).shape != ():
        raise unsupported("a network whose output does not fit its likelihood")
    return potential
