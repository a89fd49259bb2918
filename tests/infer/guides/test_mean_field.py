"""MeanFieldGuide recovers the mean-field optimum of conjugate Bayesian linear regression.

With :math:`y = \tilde X w + \varepsilon` and a Gaussian prior, the mean-field optimum has the
exact posterior means and the variances :math:`1/\\Lambda_{ii}` (Bishop 2006, §10.1.2).
"""

from __future__ import annotations

import torch

import pyro_bbb as bbb

from ...problems import conjugate_problem, flat_posterior, linear_bnn


def test_mean_field_guide_recovers_the_mean_field_optimum_of_linear_regression():
    x, y, mean, _, precision = conjugate_problem()
    model = linear_bnn(x)
    guide = bbb.MeanFieldGuide(model, init_scale=0.1)
    # a long run at a moderate rate, then a short one at a small rate to settle the iterate
    options = {"num_particles": 64, "beta": 1.0, "progress": False}  # the plain ELBO's optimum
    bbb.fit(model, guide, x, y, epochs=600, lr=0.03, seed=0, **options)
    bbb.fit(model, guide, x, y, epochs=300, lr=0.003, seed=1, **options)
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
    elbo = bbb.infer.AnnealedELBO(num_particles=4096)
    loss = elbo.terms(model, guide, x, y).loss
    loss.backward()
    grad = guide.locs.get_parameter("0.weight").grad
    # gradient of the loss w.r.t. the means is Λ (μ - m) in expectation: zero here, with MC
    # noise of order sqrt(Λ_ii / particles)
    noise = (precision.diagonal()[:-1] / 4096).sqrt()
    assert torch.all(grad.reshape(-1).abs() < 5 * noise)
