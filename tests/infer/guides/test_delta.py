"""DeltaGuide: the point estimate; on the ELBO at β = 1 it finds the MAP weights."""

from __future__ import annotations

import pyro
import pytest
import torch

import pyro_bbb as bbb

from ...problems import conjugate_problem, linear_bnn


def test_trained_on_the_elbo_it_lands_on_the_map_weights():
    # a Gaussian posterior's mode is its mean, known in closed form
    pyro.clear_param_store()
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = bbb.DeltaGuide(model)
    bbb.fit(model, guide, x, y, epochs=600, beta=1.0, lr=0.05, seed=0, progress=False)
    median = guide.median()
    found = torch.cat([median["0.weight"].reshape(-1), median["0.bias"]])
    sd = covariance.diagonal().sqrt()
    assert ((found - mean).abs() / sd).max() < 0.02


def test_its_marginals_have_zero_scale_and_its_draws_are_its_values():
    pyro.clear_param_store()
    x, y, *_ = conjugate_problem()
    model = linear_bnn(x)
    guide = bbb.DeltaGuide(model)
    draws = guide(x, y)
    for name, (loc, scale) in guide.marginals().items():
        assert torch.equal(draws[name], loc)
        assert torch.equal(scale, torch.zeros_like(loc))


def test_every_quantile_of_a_point_mass_is_its_value():
    pyro.clear_param_store()
    x, y, *_ = conjugate_problem()
    guide = bbb.DeltaGuide(linear_bnn(x))
    quantiles = guide.quantiles([0.05, 0.5, 0.95], x, y)
    for name, value in guide.median().items():
        assert torch.equal(quantiles[name], value.expand(3, *value.shape))
    with pytest.raises(ValueError, match=r"quantiles must lie in \(0, 1\)"):
        guide.quantiles([0.0, 0.5])
    assert not isinstance(guide, bbb.infer.guides._base.GaussianGuide)
