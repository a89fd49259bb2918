"""Tests of pyro_bbb.nn.layers: the Bayesian layer, its priors, initial values, pickling."""

from __future__ import annotations

import dataclasses

import pyro
import pytest
import torch
import torch.nn.functional as F
from pyro.infer import Predictive
from torch import nn

import pyro_bbb
from pyro_bbb import BNN, MeanFieldGuide, bayesianize, likelihoods, mlp
from pyro_bbb.nn import initial_values
from pyro_bbb.priors import FanInGaussian, Gaussian, ScaleMixture

from ..support import requires_cuda
from .networks import TwoLayerNet, conv_loop, linear_loop, sample_sites


def test_bayesian_layer_rejects_inputs_with_wrong_feature_size():
    net = bayesianize(TwoLayerNet())
    with pytest.raises(ValueError, match=r"'fc1' expects input features \(3,\)"):
        net(torch.randn(4, 7))


def test_a_layer_checks_every_new_input_shape_after_accepting_one():
    # the check is remembered for the last shape that passed (free on every step of a fit):
    # a different shape is checked again, and a failure is never remembered
    net = bayesianize(TwoLayerNet())
    net(torch.randn(4, 3))
    net(torch.randn(4, 3))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"'fc1' expects input features \(3,\)"):
            net(torch.randn(4, 7))
    assert net(torch.randn(2, 5, 3)).shape[:2] == (2, 5)
    conv = bayesianize(nn.Conv2d(2, 4, 3))
    x = torch.randn(5, 2, 6, 6)
    conv(x)
    conv.affine = dataclasses.replace(conv.affine, groups=2)  # now takes 2 x 2 channels
    with pytest.raises(ValueError, match=r"expects input features \(4, None, None\)"):
        conv(x)


def test_bayesian_linear_layer_with_sampled_weights_matches_a_loop_of_f_linear():
    layer = bayesianize(nn.Linear(3, 2))
    P = 4
    weight, bias = torch.randn(P, 1, 2, 3), torch.randn(P, 1, 2)
    x = torch.randn(5, 3)
    out = pyro.poutine.condition(layer, data={"weight": weight, "bias": bias})(x)
    torch.testing.assert_close(out, linear_loop(x, weight, bias))


@pytest.mark.parametrize(
    "layer", [nn.Linear(3, 2, bias=False), nn.Conv2d(3, 2, 3, bias=False)], ids=["linear", "conv"]
)
def test_layers_without_bias_have_only_a_weight_site(layer):
    net = bayesianize(layer)
    x = torch.randn(4, 3) if isinstance(layer, nn.Linear) else torch.randn(4, 3, 5, 5)
    assert list(sample_sites(net, x)) == ["weight"]
    weight = torch.randn(6, 1, *layer.weight.shape)
    out = pyro.poutine.condition(net, data={"weight": weight})(x)
    functional = F.linear if isinstance(layer, nn.Linear) else F.conv2d
    expected = torch.stack([functional(x, weight[p, 0]) for p in range(6)])
    torch.testing.assert_close(out, expected)


def test_bayesian_conv_layers_with_sampled_weights_match_a_loop_of_f_conv2d():
    module = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.Tanh(), nn.Conv2d(4, 6, 3, stride=2, groups=2)
    )
    net = bayesianize(module)
    P = 3
    data = {
        "0.weight": torch.randn(P, 1, 4, 2, 3, 3),
        "0.bias": torch.randn(P, 1, 4),
        "2.weight": torch.randn(P, 1, 6, 2, 3, 3),
        "2.bias": torch.randn(P, 1, 6),
    }
    x = torch.randn(5, 2, 9, 9)
    out = pyro.poutine.condition(net, data=data)(x)
    # the deeper layer sees x with sample dims (P, B, C, H, W)
    hidden = torch.tanh(conv_loop(x, data["0.weight"], data["0.bias"], padding=1))
    expected = conv_loop(hidden, data["2.weight"], data["2.bias"], stride=2, groups=2)
    assert out.shape == (P, 5, 6, 4, 4)
    torch.testing.assert_close(out, expected)


def test_parallel_predictive_matches_sequential_replay_on_a_conv_bnn():
    module = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2, groups=2),
        nn.Flatten(-3),  # flatten the feature dims only: inputs carry sample dims
        nn.Linear(4 * 3 * 3, 3),
    )
    model = BNN(bayesianize(module), likelihoods.Categorical(), num_data=6)
    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 3, (6,))
    guide = MeanFieldGuide(model, init_scale=0.5)
    guide(x, y)
    S = 4
    samples = Predictive(model, guide=guide, num_samples=S, parallel=True)(x)
    assert samples["obs"].shape == (S, 6)
    assert samples["2.weight"].shape == (S, 1, 4, 2, 3, 3)
    # the logits of each parallel sample equal a plain forward pass with that sample's weights
    names = ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    draws = Predictive(model, guide=guide, num_samples=S, parallel=True, return_sites=names)(x)
    vectorised = pyro.poutine.condition(model.net, data=draws)(x)
    for s in range(S):
        one = {name: value[s].reshape(value.shape[2:]) for name, value in draws.items()}
        single = pyro.poutine.condition(model.net, data=one)(x)
        torch.testing.assert_close(vectorised[s], single, rtol=1e-4, atol=1e-5)


def test_initial_values_are_the_modules_own_initialisation():
    module = TwoLayerNet()
    net = bayesianize(module)
    values = initial_values(net)
    assert set(values) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    for name, param in module.named_parameters():
        torch.testing.assert_close(values[name], param.detach())


def test_initial_values_of_a_model_use_unprefixed_site_names():
    model = BNN(mlp([2, 3, 1]), likelihoods.Gaussian(), num_data=4)
    assert set(initial_values(model)) == {"0.weight", "0.bias", "2.weight", "2.bias"}


@pytest.mark.parametrize(
    "prior", [Gaussian(1.0), FanInGaussian(), ScaleMixture(0.5, 1.0, 0.01)], ids=repr
)
def test_priors_follow_the_module_dtype(prior):
    net = bayesianize(TwoLayerNet(), prior)
    assert net.fc1.prior_distribution("weight").sample().dtype == torch.float32
    net = net.to(torch.float64)
    for layer in (net.fc1, net.fc2):
        for param in ("weight", "bias"):
            assert layer.prior_distribution(param).sample().dtype == torch.float64
    sites = sample_sites(net, torch.randn(4, 3, dtype=torch.float64))
    assert all(site["value"].dtype == torch.float64 for site in sites.values())
    assert net(torch.randn(4, 3, dtype=torch.float64)).dtype == torch.float64


def test_bayesian_network_pickles_with_its_priors():
    import pickle

    net = bayesianize(TwoLayerNet(), ScaleMixture(0.5, 1.0, 0.01))
    copy = pickle.loads(pickle.dumps(net))
    assert list(sample_sites(copy, torch.randn(2, 3))) == list(sample_sites(net, torch.randn(2, 3)))


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize(
    "prior", [Gaussian(1.0), FanInGaussian(), ScaleMixture(0.5, 1.0, 0.01)], ids=repr
)
def test_priors_follow_the_module_to_cuda(prior):
    net = bayesianize(TwoLayerNet(), prior).to("cuda")
    for layer in (net.fc1, net.fc2):
        for param in ("weight", "bias"):
            assert layer.prior_distribution(param).sample().device.type == "cuda"
    sites = sample_sites(net, torch.randn(4, 3, device="cuda"))
    assert all(site["value"].device.type == "cuda" for site in sites.values())


def test_priors_are_immutable_so_layers_may_cache_them():
    prior = Gaussian(1.0)
    with pytest.raises(AttributeError, match="immutable"):
        prior.scale = 2.0
    with pytest.raises(AttributeError, match="immutable"):
        FanInGaussian(1.0).gain = 3.0


def test_layer_builds_its_prior_once_per_device_and_dtype_and_on_reassignment():
    net = pyro_bbb.mlp([2, 3, 1])
    layer = net[0]
    first = layer.prior_distribution("weight")
    assert layer.prior_distribution("weight") is first
    net.double()
    assert layer.prior_distribution("weight").base_dist.loc.dtype == torch.float64
    layer.priors["weight"] = Gaussian(0.5)
    assert torch.all(layer.prior_distribution("weight").base_dist.scale == 0.5)


def test_a_prior_with_learnable_hyperparameters_is_rebuilt_every_pass():
    scale = torch.tensor(2.0, requires_grad=True)
    prior = ScaleMixture(0.5, scale, 0.1)
    assert not prior.cacheable
    net = pyro_bbb.mlp([2, 3, 1], prior=prior)
    assert net[0].prior_distribution("weight") is not net[0].prior_distribution("weight")


def test_flatten_and_a_reshape_of_ones_own_counting_from_the_front_work_under_weight_draws():
    # nn.Flatten() and h.reshape(h.shape[0], -1) keep dim 0 and flatten the rest: weight draws
    # (particles, predict, an Ensemble) never reach them as extra leading dims.
    x, y = torch.randn(16, 2, 8), torch.randn(16)

    class KeepDim0(nn.Module):
        def forward(self, h):
            return h.reshape(h.shape[0], -1)

    for flatten in (nn.Flatten(), KeepDim0()):
        net = nn.Sequential(nn.Conv1d(2, 4, 3), nn.ReLU(), flatten, nn.Linear(24, 1))
        model = BNN(bayesianize(net, prior=Gaussian(1.0)), likelihoods.Gaussian(), 16)
        for guide in (MeanFieldGuide(model), pyro_bbb.Ensemble(model, MeanFieldGuide, k=3)):
            pyro_bbb.fit(model, guide, x, y, epochs=2, num_particles=2, progress=False, seed=0)
            pred = pyro_bbb.predict(model, guide, x, num_samples=5, seed=0)
            assert pred.mean.shape == (16,) and torch.all(pred.epistemic_std > 0)
            pyro.clear_param_store()
