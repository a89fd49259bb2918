r"""Posterior recovery on conjugate Bayesian linear regression.

With :math:`y = \tilde X w + \varepsilon`, :math:`\varepsilon \sim \mathcal{N}(0, \sigma^2)`
known, and prior :math:`w \sim \mathcal{N}(0, s^2 I)` (weights and bias), the posterior is
:math:`\mathcal{N}(m, \Lambda^{-1})` with :math:`\Lambda = \tilde X^\top \tilde X/\sigma^2 +
I/s^2` and :math:`m = \Lambda^{-1}\tilde X^\top y/\sigma^2`. The mean-field optimum has the
exact means ``m`` and variances :math:`1/\Lambda_{ii}` (Bishop 2006, §10.1.2).
"""

from __future__ import annotations

import torch

import pyro_bbb as bbb
from pyro_bbb.priors import Gaussian

NOISE, PRIOR_SCALE = 0.5, 1.0


def conjugate_problem(num_data=30, dim=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_data, dim, generator=g, dtype=torch.float64)
    x[:, 1] += 0.8 * x[:, 0]  # correlated features: a posterior with real correlations
    w = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    y = x @ w + 0.3 + NOISE * torch.randn(num_data, generator=g, dtype=torch.float64)
    design = torch.cat([x, torch.ones(num_data, 1, dtype=torch.float64)], dim=1)
    precision = (
        design.T @ design / NOISE**2 + torch.eye(dim + 1, dtype=torch.float64) / PRIOR_SCALE**2
    )
    covariance = torch.linalg.inv(precision)
    mean = covariance @ design.T @ y / NOISE**2
    return x, y, mean, covariance, precision


def linear_bnn(x):
    net = bbb.mlp([x.shape[1], 1], prior=Gaussian(PRIOR_SCALE)).double()
    return bbb.BNN(net, bbb.likelihoods.Gaussian(scale=NOISE).double(), num_data=len(x))


def flat_posterior(guide):
    """Means and variances of [w_1..w_d, b] from a guide's per-site posteriors."""
    post = guide.posterior()
    loc = torch.cat([post["0.weight"].mean.reshape(-1), post["0.bias"].mean.reshape(-1)])
    var = torch.cat([post["0.weight"].variance.reshape(-1), post["0.bias"].variance.reshape(-1)])
    return loc, var


def test_mean_field_guide_recovers_the_mean_field_optimum_of_linear_regression():
    x, y, mean, _, precision = conjugate_problem()
    model = linear_bnn(x)
    guide = bbb.MeanFieldGuide(model, init_scale=0.1)
    # a long run at a moderate rate, then a short one at a small rate to settle the iterate
    bbb.fit(model, guide, x, y, epochs=600, lr=0.03, num_particles=64, seed=0, progress=False)
    bbb.fit(model, guide, x, y, epochs=300, lr=0.003, num_particles=64, seed=1, progress=False)
    loc, var = flat_posterior(guide)
    optimum_var = 1 / precision.diagonal()
    posterior_sd = optimum_var.sqrt()
    # means within a tenth of a posterior standard deviation, variances within 10 %
    assert torch.all((loc - mean).abs() < 0.1 * posterior_sd), (loc, mean)
    assert torch.allclose(var, optimum_var, rtol=0.1), (var, optimum_var)


def test_elbo_gradient_vanishes_at_the_mean_field_optimum():
    """At (m, 1/Λᵢᵢ) the expected gradient is zero: averaged estimates are near zero."""
    x, y, mean, _, precision = conjugate_problem()
    model = linear_bnn(x)
    init = {"0.weight": mean[:-1].reshape(1, -1), "0.bias": mean[-1:].clone()}
    guide = bbb.MeanFieldGuide(model, init_scale=0.1, init_loc=init)
    guide(x, y)
    sd = (1 / precision.diagonal()).sqrt()
    with torch.no_grad():
        for name, values in (("0.weight", sd[:-1].reshape(1, -1)), ("0.bias", sd[-1:])):
            rho = guide.rhos.get_parameter(name)
            rho.copy_(torch.log(torch.expm1(values - guide.min_scale)))
    elbo = bbb.elbo.AnnealedELBO(num_particles=4096)
    loss = elbo.terms(model, guide, x, y).loss
    loss.backward()
    grad = guide.locs.get_parameter("0.weight").grad
    # gradient of the loss w.r.t. the means is Λ (μ - m) in expectation: zero here, with MC
    # noise of order sqrt(Λ_ii / particles)
    noise = (precision.diagonal()[:-1] / 4096).sqrt()
    assert torch.all(grad.reshape(-1).abs() < 5 * noise)
