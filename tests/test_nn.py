"""Tests of pyro_bbb.nn and pyro_bbb.ops: bayesianize, the Bayesian layers and mlp."""

from __future__ import annotations

import pyro
import pytest
import torch
import torch.nn.functional as F
from pyro.infer import Predictive
from pyro.nn import PyroModule
from torch import nn

import pyro_bbb
from pyro_bbb import BNN, BayesianAffine, MeanFieldGuide, bayesianize, likelihoods, mlp
from pyro_bbb.nn import initial_values
from pyro_bbb.ops import Conv2dMap, LinearMap
from pyro_bbb.priors import FanInGaussian, Gaussian, ScaleMixture

from .conftest import requires_cuda


class TwoLayerNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 5)
        self.fc2 = nn.Linear(5, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class NestedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(self.body(x))


def _sample_sites(fn, *args) -> dict[str, dict]:
    trace = pyro.poutine.trace(fn).get_trace(*args)
    return {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and name != "data"
    }


# --- site names ----------------------------------------------------------------------------


def test_bayesianize_names_sites_after_module_attributes():
    net = bayesianize(TwoLayerNet())
    sites = _sample_sites(net, torch.randn(4, 3))
    assert list(sites) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert sites["fc1.weight"]["value"].shape == (5, 3)
    assert sites["fc2.bias"]["value"].shape == (2,)


def test_bayesianize_names_sequential_sites_by_index():
    net = bayesianize(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)))
    assert list(_sample_sites(net, torch.randn(4, 3))) == [
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
    ]


def test_bayesianize_names_nested_sites_by_full_path():
    net = bayesianize(NestedNet())
    assert list(_sample_sites(net, torch.randn(4, 3))) == [
        "body.0.weight",
        "body.0.bias",
        "head.weight",
        "head.bias",
    ]


def test_bayesianize_of_a_bare_linear_layer_names_sites_weight_and_bias():
    net = bayesianize(nn.Linear(3, 2))
    assert isinstance(net, BayesianAffine)
    assert list(_sample_sites(net, torch.randn(4, 3))) == ["weight", "bias"]


def test_mlp_sites_follow_sequential_indices():
    net = mlp([2, 6, 6, 1])
    assert list(_sample_sites(net, torch.randn(3, 2))) == [
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


# --- copying -------------------------------------------------------------------------------


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


# --- which parameters are random ------------------------------------------------------------


def test_deterministic_patterns_keep_biases_as_parameters():
    net = bayesianize(TwoLayerNet(), deterministic=["*.bias"])
    assert list(_sample_sites(net, torch.randn(4, 3))) == ["fc1.weight", "fc2.weight"]
    for layer in (net.fc1, net.fc2):
        assert isinstance(layer._parameters["bias"], nn.Parameter)
        assert layer.bayesian_parameters == ("weight",)


def test_deterministic_accepts_a_single_pattern_string():
    net = bayesianize(TwoLayerNet(), deterministic="fc2.*")
    assert list(_sample_sites(net, torch.randn(4, 3))) == ["fc1.weight", "fc1.bias"]


def test_deterministic_bias_is_used_as_is_in_the_forward_pass():
    net = bayesianize(nn.Linear(3, 2), deterministic=["bias"])
    with torch.no_grad():
        net.bias.fill_(100.0)
    out = pyro.poutine.condition(net, data={"weight": torch.zeros(2, 3)})(torch.randn(4, 3))
    torch.testing.assert_close(out, torch.full((4, 2), 100.0))


def test_bayesianize_rejects_a_network_left_without_random_parameters():
    with pytest.raises(ValueError, match=r"no Linear or Conv2d parameter"):
        bayesianize(TwoLayerNet(), deterministic=["*"])


def test_bayesianize_rejects_a_non_module():
    with pytest.raises(TypeError, match=r"module must be a torch.nn.Module"):
        bayesianize(lambda x: x)


def test_normalisation_layer_parameters_stay_deterministic():
    module = nn.Sequential(
        nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 4), nn.LayerNorm(4)
    )
    net = bayesianize(module)
    sites = _sample_sites(net, torch.randn(6, 3))
    assert list(sites) == ["0.weight", "0.bias", "3.weight", "3.bias"]
    for index in (1, 4):
        assert isinstance(net[index]._parameters["weight"], nn.Parameter)
        assert isinstance(net[index]._parameters["bias"], nn.Parameter)
    # the normalisation parameters are trainable point estimates: Pyro param sites
    trace = pyro.poutine.trace(net).get_trace(torch.randn(6, 3))
    params = {name for name, site in trace.nodes.items() if site["type"] == "param"}
    assert {"1.weight", "1.bias", "4.weight", "4.bias"} <= params


def test_bayesianize_rejects_conv_with_non_zero_padding_mode():
    conv = nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect")
    with pytest.raises(ValueError, match=r"padding_mode='zeros'.*'reflect'"):
        bayesianize(nn.Sequential(conv))


def test_bayesian_layer_rejects_inputs_with_wrong_feature_size():
    net = bayesianize(TwoLayerNet())
    with pytest.raises(ValueError, match=r"'fc1' expects input features \(3,\)"):
        net(torch.randn(4, 7))


# --- weights with leading sample dimensions: linear -----------------------------------------


def _linear_loop(x, weight, bias):
    """Reference: one F.linear per sample; x (P, B, in) or (B, in)."""
    outs = []
    for p in range(weight.shape[0]):
        xp = x[p] if x.dim() == 3 else x
        outs.append(F.linear(xp, weight[p].reshape(weight.shape[-2:]), bias[p].reshape(-1)))
    return torch.stack(outs)


@pytest.mark.parametrize("keep_plate_dim", [True, False])
@pytest.mark.parametrize("x_has_samples", [False, True])
def test_linear_map_with_sampled_weights_matches_a_loop_of_f_linear(keep_plate_dim, x_has_samples):
    P, B, n_in, n_out = 4, 5, 3, 2
    weight = torch.randn(P, 1, n_out, n_in) if keep_plate_dim else torch.randn(P, n_out, n_in)
    bias = torch.randn(P, 1, n_out) if keep_plate_dim else torch.randn(P, n_out)
    x = torch.randn(P, B, n_in) if x_has_samples else torch.randn(B, n_in)
    out = LinearMap()(x, weight, bias)
    assert out.shape == (P, B, n_out)
    torch.testing.assert_close(out, _linear_loop(x, weight, bias))


def test_linear_map_with_plain_weights_broadcasts_over_input_sample_dims():
    x = torch.randn(3, 5, 4)
    weight, bias = torch.randn(2, 4), torch.randn(2)
    out = LinearMap()(x, weight, bias)
    expected = torch.stack([F.linear(x[p], weight, bias) for p in range(3)])
    torch.testing.assert_close(out, expected)


def test_bayesian_linear_layer_with_sampled_weights_matches_a_loop_of_f_linear():
    layer = bayesianize(nn.Linear(3, 2))
    P = 4
    weight, bias = torch.randn(P, 1, 2, 3), torch.randn(P, 1, 2)
    x = torch.randn(5, 3)
    out = pyro.poutine.condition(layer, data={"weight": weight, "bias": bias})(x)
    torch.testing.assert_close(out, _linear_loop(x, weight, bias))


# --- weights with leading sample dimensions: conv2d -----------------------------------------


def _conv_loop(x, weight, bias, **kwargs):
    """Reference: one F.conv2d per sample; x (P, B, C, H, W) or (B, C, H, W)."""
    outs = []
    for p in range(weight.shape[0]):
        xp = x[p] if x.dim() == 5 else x
        w = weight[p].reshape(weight.shape[-4:])
        outs.append(F.conv2d(xp, w, bias[p].reshape(-1), **kwargs))
    return torch.stack(outs)


CONV_CASES = [
    {"stride": 1, "padding": 0, "groups": 1},
    {"stride": 2, "padding": 1, "groups": 1},
    {"stride": 1, "padding": 1, "groups": 2},
    {"stride": 2, "padding": 2, "groups": 4, "dilation": 2},
]


@pytest.mark.parametrize("options", CONV_CASES)
@pytest.mark.parametrize("keep_plate_dim", [True, False])
@pytest.mark.parametrize("x_has_samples", [False, True])
def test_conv2d_map_with_sampled_weights_matches_a_loop_of_f_conv2d(
    options, keep_plate_dim, x_has_samples
):
    P, B, c_in, c_out = 3, 2, 4, 8
    groups = options["groups"]
    weight_shape = (c_out, c_in // groups, 3, 3)
    weight = torch.randn(P, 1, *weight_shape) if keep_plate_dim else torch.randn(P, *weight_shape)
    bias = torch.randn(P, 1, c_out) if keep_plate_dim else torch.randn(P, c_out)
    x = torch.randn(P, B, c_in, 7, 6) if x_has_samples else torch.randn(B, c_in, 7, 6)
    affine = Conv2dMap(
        stride=(options["stride"],) * 2,
        padding=(options["padding"],) * 2,
        dilation=(options.get("dilation", 1),) * 2,
        groups=groups,
    )
    out = affine(x, weight, bias)
    expected = _conv_loop(x, weight, bias, **options)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected)


def test_conv2d_map_with_plain_weights_broadcasts_over_input_sample_dims():
    x = torch.randn(3, 2, 4, 6, 6)
    weight, bias = torch.randn(6, 2, 3, 3), torch.randn(6)
    out = Conv2dMap(padding=(1, 1), groups=2)(x, weight, bias)
    expected = torch.stack([F.conv2d(x[p], weight, bias, padding=1, groups=2) for p in range(3)])
    torch.testing.assert_close(out, expected)


def test_conv2d_map_with_same_padding_and_sampled_weights_matches_a_loop():
    x = torch.randn(2, 3, 7, 7)
    weight, bias = torch.randn(4, 1, 5, 3, 3, 3), torch.randn(4, 1, 5)
    out = Conv2dMap(padding="same")(x, weight, bias)
    torch.testing.assert_close(out, _conv_loop(x, weight, bias, padding="same"))
    assert out.shape == (4, 2, 5, 7, 7)


@pytest.mark.parametrize(
    "layer", [nn.Linear(3, 2, bias=False), nn.Conv2d(3, 2, 3, bias=False)], ids=["linear", "conv"]
)
def test_layers_without_bias_have_only_a_weight_site(layer):
    net = bayesianize(layer)
    x = torch.randn(4, 3) if isinstance(layer, nn.Linear) else torch.randn(4, 3, 5, 5)
    assert list(_sample_sites(net, x)) == ["weight"]
    weight = torch.randn(6, 1, *layer.weight.shape)
    out = pyro.poutine.condition(net, data={"weight": weight})(x)
    functional = F.linear if isinstance(layer, nn.Linear) else F.conv2d
    expected = torch.stack([functional(x, weight[p, 0]) for p in range(6)])
    torch.testing.assert_close(out, expected)


def test_conv2d_map_rejects_inputs_without_channel_and_spatial_dims():
    with pytest.raises(ValueError, match=r"x must be \(\*sample, batch, channels, height, width\)"):
        Conv2dMap()(torch.randn(3, 8, 8), torch.randn(2, 3, 3, 3), None)


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
    hidden = torch.tanh(_conv_loop(x, data["0.weight"], data["0.bias"], padding=1))
    expected = _conv_loop(hidden, data["2.weight"], data["2.bias"], stride=2, groups=2)
    assert out.shape == (P, 5, 6, 4, 4)
    torch.testing.assert_close(out, expected)


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
    hidden = torch.tanh(_linear_loop(x, data["0.weight"], data["0.bias"]))
    torch.testing.assert_close(out, _linear_loop(hidden, data["2.weight"], data["2.bias"]))


# --- vectorised prediction -----------------------------------------------------------------


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


# --- mlp builder ---------------------------------------------------------------------------


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


# --- initial values ------------------------------------------------------------------------


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


def test_initial_values_skip_deterministic_parameters():
    net = bayesianize(TwoLayerNet(), deterministic=["*.bias"])
    assert set(initial_values(net)) == {"fc1.weight", "fc2.weight"}


# --- priors follow the module --------------------------------------------------------------


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
    sites = _sample_sites(net, torch.randn(4, 3, dtype=torch.float64))
    assert all(site["value"].dtype == torch.float64 for site in sites.values())
    assert net(torch.randn(4, 3, dtype=torch.float64)).dtype == torch.float64


def test_bayesian_network_pickles_with_its_priors():
    import pickle

    net = bayesianize(TwoLayerNet(), ScaleMixture(0.5, 1.0, 0.01))
    copy = pickle.loads(pickle.dumps(net))
    assert list(_sample_sites(copy, torch.randn(2, 3))) == list(
        _sample_sites(net, torch.randn(2, 3))
    )


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
    sites = _sample_sites(net, torch.randn(4, 3, device="cuda"))
    assert all(site["value"].device.type == "cuda" for site in sites.values())


def test_four_d_only_layers_take_inputs_with_sample_dims_after_bayesianize():
    import pickle

    cnn = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(-3),
        nn.Linear(4 * 4 * 4, 3),
    )
    net = bayesianize(cnn)
    assert isinstance(net[3], nn.MaxPool2d) and isinstance(net[1], nn.BatchNorm2d)
    model = BNN(net, likelihoods.Categorical(), num_data=12)
    guide = MeanFieldGuide(model)
    x, y = torch.randn(12, 1, 8, 8), torch.randint(0, 3, (12,))
    pyro_bbb.fit(model, guide, x, y, epochs=2, num_particles=3, progress=False)
    pred = pyro_bbb.predict(model, guide, x, num_samples=5)
    assert pred.probs_samples.shape == (5, 12, 3)
    # the pooled output of each sample equals pooling that sample on its own
    sample = torch.randn(5, 12, 4, 8, 8)
    expected = torch.stack([nn.functional.max_pool2d(s, 2) for s in sample])
    assert torch.equal(net[3](sample), expected)
    assert sorted(guide.median()) == ["0.bias", "0.weight", "5.bias", "5.weight"]
    pickle.loads(pickle.dumps((model, guide)))
