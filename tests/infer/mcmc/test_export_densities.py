"""Priors, noise priors and their bijections in JAX equal torch's, in float64."""

from __future__ import annotations

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from torch.distributions import biject_to, constraints

from pyro_bbb.priors import ScaleMixture

from ...support import requires_numpyro

pytestmark = requires_numpyro


def f64(*values):
    return [torch.tensor(v, dtype=torch.float64) for v in values]


@pytest.mark.parametrize(
    ("distribution", "support"),
    [
        (dist.Normal(*f64(0.3, 1.7)), "real"),
        (dist.Laplace(*f64(-0.2, 0.5)), "real"),
        (dist.Cauchy(*f64(0.1, 2.0)), "real"),
        (dist.StudentT(*f64(3.0, 0.4, 1.2)), "real"),
        (ScaleMixture(*f64(0.3, 1.5, 0.01)), "real"),
        (dist.LogNormal(*f64(-1.0, 0.5)), "positive"),
        (dist.HalfNormal(*f64(0.8)), "positive"),
        (dist.HalfCauchy(*f64(1.3)), "positive"),
        (dist.Gamma(*f64(2.0, 3.0)), "positive"),
        (dist.InverseGamma(*f64(3.0, 2.0)), "positive"),
        (dist.Exponential(*f64(1.5)), "positive"),
        (dist.Uniform(*f64(0.2, 3.0)), "interval"),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str) else v,
)
def test_log_density_sums_torch_log_prob_over_a_site(distribution, support):
    from pyro_bbb.infer.mcmc._jax import jax, jnp
    from pyro_bbb.infer.mcmc.export_densities import log_density

    site = distribution.expand(torch.Size([4, 3])).to_event(2)  # as a layer's prior is built
    g = torch.Generator().manual_seed(0)
    value = torch.randn(4, 3, generator=g, dtype=torch.float64)
    if support == "positive":
        value = value.exp()
    elif support == "interval":
        value = 0.2 + 2.8 * torch.rand(4, 3, generator=g, dtype=torch.float64)
    value.requires_grad_()
    expected = site.log_prob(value)
    if expected.requires_grad:
        (expected_grad,) = torch.autograd.grad(expected, value)
    else:  # a uniform density is flat
        expected_grad = torch.zeros_like(value)
    with jax.enable_x64(True):
        density = log_density(site)
        got, grad = jax.value_and_grad(density)(jnp.asarray(value.detach().numpy()))
    assert float(got) == pytest.approx(float(expected.detach()), rel=1e-10)
    np.testing.assert_allclose(np.asarray(grad), expected_grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "support",
    [
        constraints.positive,
        constraints.nonnegative,
        constraints.greater_than(0.3),
        constraints.interval(0.05, 2.0),
    ],
    ids=str,
)
def test_positive_bijection_is_torchs_biject_to_with_its_jacobian(support):
    from pyro_bbb.infer.mcmc._jax import jax, jnp
    from pyro_bbb.infer.mcmc.export_densities import positive_bijection

    u = torch.linspace(-4, 4, 9, dtype=torch.float64)
    transform = biject_to(support)
    expected = transform(u)
    with jax.enable_x64(True):
        value, log_jacobian = jax.vmap(positive_bijection(support))(jnp.asarray(u.numpy()))
    np.testing.assert_allclose(np.asarray(value), expected.numpy(), rtol=1e-12)
    np.testing.assert_allclose(
        np.asarray(log_jacobian), transform.log_abs_det_jacobian(u, expected).numpy(), rtol=1e-12
    )


def test_a_distribution_without_a_translation_is_refused_by_name():
    from pyro_bbb.infer.mcmc.export_densities import log_density, positive_bijection

    with pytest.raises(NotImplementedError, match=r"the prior of '0.weight', a Gumbel.*'pyro'"):
        log_density(dist.Gumbel(0.0, 1.0), what="the prior of '0.weight'")
    with pytest.raises(NotImplementedError, match="support"):
        positive_bijection(constraints.real)
