"""Tests of pyro_bbb.nn.builders: bayesianize and mlp."""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro.infer import Predictive
from pyro.nn import PyroModule
from torch import nn

import pyro_bbb
from pyro_bbb import BNN, BayesianAffine, MeanFieldGuide, bayesianize, likelihoods, mlp
from pyro_bbb.nn import initial_values
from pyro_bbb.priors import Gaussian

from .networks import NestedNet, TwoLayerNet, linear_loop, sample_sites


def test_bayesianize_names_sites_after_module_attributes():
    net = bayesianize(TwoLayerNet())
    sites = sample_sites(net, torch.randn(4, 3))
    assert list(sites) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert sites["fc1.weight"]["value"].shape == (5, 3)
    assert sites["fc2.bias"]["value"].shape == (2,)


def test_bayesianize_names_sequential_sites_by_index():
    net = bayesianize(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)))
    assert list(sample_sites(net, torch.randn(4, 3))) == [
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
    ]


def test_bayesianize_names_nested_sites_by_full_path():
    net = bayesianize(NestedNet())
    assert list(sample_sites(net, torch.randn(4, 3))) == [
        "body.0.weight",
        "body.0.bias",
        "head.weight",
        "head.bias",
    ]


def test_bayesianize_of_a_bare_linear_layer_names_sites_weight_and_bias():
    net = bayesianize(nn.Linear(3, 2))
    assert isinstance(net, BayesianAffine)
    assert list(sample_sites(net, torch.randn(4, 3))) == ["weight", "bias"]


def test_mlp_sites_follow_sequential_indices():
    net = mlp([2, 6, 6, 1])
    assert list(sample_sites(net, torch.randn(3, 2))) == [
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
        "4.weight",
        "4.bias",
    ]


def test_bayesianized_forward_draws_new_weights_from_the_prior_each_call():
    net = bayesianize(TwoLayerNet())
    x = torch.randn(4, 3)
    assert not torch.equal(net(x), net(x))


def test_bayesianize_leaves_the_original_module_unchanged():
    module = TwoLayerNet()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    net = bayesianize(module)
    assert type(module) is TwoLayerNet
    assert type(module.fc1) is nn.Linear
    assert not isinstance(module, PyroModule)
    for key, value in module.state_dict().items():
        assert torch.equal(value, before[key])
    assert isinstance(net.fc1, BayesianAffine)
    assert net is not module


def test_bayesianize_inplace_converts_the_module_itself():
    module = TwoLayerNet()
    net = bayesianize(module, inplace=True)
    assert net is module
    assert isinstance(module, PyroModule)
    assert isinstance(module.fc1, BayesianAffine)


def test_deterministic_patterns_keep_biases_as_parameters():
    net = bayesianize(TwoLayerNet(), deterministic=["*.bias"])
    assert list(sample_sites(net, torch.randn(4, 3))) == ["fc1.weight", "fc2.weight"]
    for layer in (net.fc1, net.fc2):
        assert isinstance(layer._parameters["bias"], nn.Parameter)
        assert layer.bayesian_parameters == ("weight",)


def test_deterministic_accepts_a_single_pattern_string():
    net = bayesianize(TwoLayerNet(), deterministic="fc2.*")
    assert list(sample_sites(net, torch.randn(4, 3))) == ["fc1.weight", "fc1.bias"]


def test_deterministic_bias_is_used_as_is_in_the_forward_pass():
    net = bayesianize(nn.Linear(3, 2), deterministic=["bias"])
    with torch.no_grad():
        net.bias.fill_(100.0)
    out = pyro.poutine.condition(net, data={"weight": torch.zeros(2, 3)})(torch.randn(4, 3))
    torch.testing.assert_close(out, torch.full((4, 2), 100.0))


def test_bayesianize_rejects_a_network_left_without_random_parameters():
    with pytest.raises(ValueError, match=r"found no parameter to make Bayesian"):
        bayesianize(TwoLayerNet(), deterministic=["*"])


def test_bayesianize_of_a_network_bayesian_already_says_so():
    with pytest.raises(ValueError, match=r"layers are Bayesian already \(as mlp's are\)"):
        bayesianize(pyro_bbb.mlp([2, 3, 1]))
    with pytest.raises(ValueError, match=r"deterministic=\['\*'\]\)$"):  # not said of a plain net
        bayesianize(TwoLayerNet(), deterministic=["*"])


def test_bayesianize_rejects_a_non_module():
    with pytest.raises(TypeError, match=r"module must be a torch.nn.Module"):
        bayesianize(lambda x: x)


def test_normalisation_layers_become_bayesian_by_weight_sampling():
    module = nn.Sequential(
        nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 4), nn.LayerNorm(4)
    )
    net = bayesianize(module)
    sites = sample_sites(net, torch.randn(6, 3))
    assert list(sites) == [f"{i}.{p}" for i in (0, 1, 3, 4) for p in ("weight", "bias")]
    assert isinstance(net[1], pyro_bbb.nn.BayesianModule)
    assert net[1].wrapped_type is nn.BatchNorm1d


def test_deterministic_normalisation_parameters_are_point_estimates():
    module = nn.Sequential(
        nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 4), nn.LayerNorm(4)
    )
    net = bayesianize(module, deterministic=["1.*", "4.*"])
    sites = sample_sites(net, torch.randn(6, 3))
    assert list(sites) == ["0.weight", "0.bias", "3.weight", "3.bias"]
    for index in (1, 4):
        assert isinstance(net[index]._parameters["weight"], nn.Parameter)
        assert isinstance(net[index]._parameters["bias"], nn.Parameter)
    # the normalisation parameters are trainable point estimates: Pyro param sites
    trace = pyro.poutine.trace(net).get_trace(torch.randn(6, 3))
    params = {name for name, site in trace.nodes.items() if site["type"] == "param"}
    assert {"1.weight", "1.bias", "4.weight", "4.bias"} <= params


def test_a_conv_padded_other_than_with_zeros_is_drawn_by_weight_sampling():
    conv = nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect")
    net = bayesianize(nn.Sequential(conv))
    assert isinstance(net[0], pyro_bbb.nn.BayesianModule)
    x = torch.randn(4, 1, 5, 5)
    weight, bias = torch.randn(2, 1, 3, 3), torch.randn(2)
    out = pyro.poutine.condition(net, data={"0.weight": weight, "0.bias": bias})(x)
    padded = nn.functional.pad(x, (1, 1, 1, 1), mode="reflect")
    torch.testing.assert_close(out, nn.functional.conv2d(padded, weight, bias))


def test_bayesian_mlp_with_sampled_weights_matches_a_loop_over_samples():
    net = mlp([3, 4, 2], activation="tanh")
    P = 5
    data = {
        "0.weight": torch.randn(P, 4, 3),
        "0.bias": torch.randn(P, 4),
        "2.weight": torch.randn(P, 2, 4),
        "2.bias": torch.randn(P, 2),
    }
    x = torch.randn(6, 3)
    out = pyro.poutine.condition(net, data=data)(x)
    hidden = torch.tanh(linear_loop(x, data["0.weight"], data["0.bias"]))
    torch.testing.assert_close(out, linear_loop(hidden, data["2.weight"], data["2.bias"]))


def test_parallel_predictive_works_on_an_mlp_bnn():
    x, y = torch.randn(10, 3), torch.randn(10)
    model = BNN(mlp([3, 8, 1]), likelihoods.Gaussian(), num_data=10)
    guide = MeanFieldGuide(model)
    guide(x, y)
    S = 7
    samples = Predictive(model, guide=guide, num_samples=S, parallel=True)(x)
    assert samples["obs"].shape == (S, 10)
    assert samples["0.weight"].reshape(S, 8, 3).shape == (S, 8, 3)
    # every sample used its own weights: the sampled outputs differ between samples
    assert samples["obs"].std(0).min() > 0


@pytest.mark.parametrize("sizes", [[3], [], [3, 0, 1], [3, -2], [3, 2.5, 1]])
def test_mlp_rejects_bad_sizes(sizes):
    with pytest.raises(ValueError, match=r"sizes must be at least two positive ints"):
        mlp(sizes)


def test_mlp_rejects_unknown_activation_listing_the_choices():
    with pytest.raises(ValueError, match=r"activation must be one of .*'relu'.*'swish'"):
        mlp([2, 3, 1], activation="swish")


def test_mlp_uses_the_activation_between_layers_only():
    net = mlp([2, 3, 3, 1], activation="tanh")
    assert isinstance(net[1], nn.Tanh) and isinstance(net[3], nn.Tanh)
    assert len(net) == 5
    assert [isinstance(m, BayesianAffine) for m in net] == [True, False, True, False, True]


def test_mlp_accepts_an_activation_factory():
    net = mlp([2, 3, 1], activation=nn.Softsign)
    assert isinstance(net[1], nn.Softsign)


def test_mlp_passes_priors_and_deterministic_patterns_through():
    net = mlp([2, 3, 1], prior={"0.*": Gaussian(2.0), "*": Gaussian(0.5)}, deterministic=["2.bias"])
    assert net[0].priors["weight"].scale == 2.0
    assert net[2].priors["weight"].scale == 0.5
    assert net[2].bayesian_parameters == ("weight",)


def test_initial_values_skip_deterministic_parameters():
    net = bayesianize(TwoLayerNet(), deterministic=["*.bias"])
    assert set(initial_values(net)) == {"fc1.weight", "fc2.weight"}


@pytest.mark.filterwarnings("ignore::pyro_bbb.infer.predictive.TrainingModeWarning")
def test_a_conv_net_with_batchnorm_pooling_and_flatten_keeps_its_layers_and_trains():
    import pickle

    cnn = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 3),
    )
    net = bayesianize(cnn, deterministic="1.*")
    # torch's own layers, unchanged: the draws go around the network, not through them
    assert type(net[3]).forward is nn.MaxPool2d.forward
    assert type(net[4]).forward is nn.Flatten.forward
    model = BNN(net, likelihoods.Categorical(), num_data=12)
    guide = MeanFieldGuide(model)
    x, y = torch.randn(12, 1, 8, 8), torch.randint(0, 3, (12,))
    pyro_bbb.fit(model, guide, x, y, epochs=2, num_particles=3, progress=False)
    pred = pyro_bbb.predict(model, guide, x, num_samples=5)
    assert pred.probs_samples.shape == (5, 12, 3)
    assert sorted(guide.median()) == ["0.bias", "0.weight", "5.bias", "5.weight"]
    pickle.loads(pickle.dumps((model, guide)))
