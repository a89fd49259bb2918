"""The linearised (GLM) predictive: the network linearised at a Gaussian guide's mean."""

from __future__ import annotations

import pytest
import torch
from torch.func import jacrev

import pyro_bbb as bbb
from pyro_bbb.online import LowRankPrecisionGuide
from pyro_bbb.priors import FanInGaussian


def _model(sizes, likelihood=None):
    net = bbb.mlp(sizes, activation="tanh", prior=FanInGaussian(1.0)).double()
    likelihood = bbb.likelihoods.Gaussian(0.1).double() if likelihood is None else likelihood
    return bbb.BNN(net, likelihood, num_data=20)


def _belief(guide, x, d, seed=0):
    """A Gaussian belief with correlations: N(mean, (diag + WWᵀ)⁻¹)."""
    guide(x)
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(d, generator=g, dtype=torch.float64)
    factor = torch.randn(d, 3, generator=g, dtype=torch.float64)
    guide.set_belief(mean, factor, torch.full((d,), 25.0, dtype=torch.float64))
    return guide.distribution()


def test_on_a_network_linear_in_its_weights_it_is_the_sampled_predictive():
    x = torch.randn(7, 3, dtype=torch.float64)
    model = _model([3, 1])
    guide = LowRankPrecisionGuide(model, rank=3)
    _belief(guide, x, 4)
    sampled = bbb.predict(model, guide, x, num_samples=50, seed=1, predictive="sample")
    linearised = bbb.predict(model, guide, x, num_samples=50, seed=1, predictive="linearised")
    torch.testing.assert_close(linearised.loc_samples, sampled.loc_samples)
    torch.testing.assert_close(linearised.scale_samples, sampled.scale_samples)


def test_its_outputs_are_gaussian_around_the_network_at_the_mean_with_covariance_jsjt():
    # 20,000 draws: the std's relative error is about 0.5 %, the mean's error 0.7 % of a std
    x = torch.linspace(-2, 2, 9, dtype=torch.float64).unsqueeze(-1)
    model = _model([1, 6, 1])
    guide = LowRankPrecisionGuide(model, rank=3)
    fn = _belief(guide, x, 19)
    prediction = bbb.predict(model, guide, x, num_samples=20_000, seed=0, predictive="linearised")
    layout = guide.block_sites["network"]

    def network(theta):
        values, start = {}, 0
        for name, shape in layout.items():
            values[name] = theta[start : start + shape.numel()].reshape(shape)
            start += shape.numel()
        return model.network_at(values, x).squeeze(-1)

    jacobian = jacrev(network)(fn.loc)
    expected_std = (jacobian @ fn.covariance_matrix @ jacobian.T).diagonal().sqrt()
    torch.testing.assert_close(prediction.epistemic_std, expected_std, rtol=0.03, atol=0)
    torch.testing.assert_close(
        prediction.mean, network(fn.loc), atol=0.05 * float(expected_std.min()), rtol=0
    )
    # the sampled predictive runs the network at the draws: another distribution
    sampled = bbb.predict(model, guide, x, num_samples=20_000, seed=0, predictive="sample")
    assert float((sampled.mean - network(fn.loc)).abs().max()) > 0.05
    # an online filter's guide is linearised unless told otherwise
    default = bbb.predict(model, guide, x, num_samples=20_000, seed=0)
    torch.testing.assert_close(default.loc_samples, prediction.loc_samples)


def test_a_mean_field_guide_and_a_classifier_are_linearised_too():
    x = torch.randn(5, 2, dtype=torch.float64)
    model = _model([2, 4, 3], bbb.likelihoods.Categorical())
    guide = bbb.MeanFieldGuide(model, init_scale=0.1)
    guide(x)
    prediction = bbb.predict(model, guide, x, num_samples=30, predictive="linearised")
    assert isinstance(prediction, bbb.ClassificationPrediction)
    assert prediction.logits_samples.shape == (30, 5, 3)
    torch.testing.assert_close(prediction.probs.sum(-1), torch.ones(5, dtype=torch.float64))


def test_what_cannot_be_linearised_is_refused_with_the_reason():
    x = torch.randn(5, 2, dtype=torch.float64)
    model = _model([2, 4, 1])
    point = bbb.DeltaGuide(model)
    point(x)
    with pytest.raises(ValueError, match=r"site '0.weight' is drawn from a Delta.*plug-in"):
        bbb.predict(model, point, x, predictive="linearised")
    ensemble = bbb.Ensemble(model, bbb.MeanFieldGuide, k=2)
    with pytest.raises(ValueError, match="Ensemble has one per member"):
        bbb.predict(model, ensemble, x, predictive="linearised")
    guide = bbb.MeanFieldGuide(model)
    guide(x)
    with pytest.raises(ValueError, match="reparam must be None, got 'local'"):
        bbb.predict(model, guide, x, predictive="linearised", reparam="local")
    with pytest.raises(ValueError, match="predictive must be 'sample' or 'linearised'"):
        bbb.predict(model, guide, x, predictive="glm")
