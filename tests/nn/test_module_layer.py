"""Tests of pyro_bbb.nn.module_layer: any module made Bayesian by weight sampling."""

from __future__ import annotations

import warnings

import pyro
import pytest
import torch
from pyro.infer import Predictive
from torch import nn
from torch.func import functional_call

import pyro_bbb as bbb
from pyro_bbb.nn import BayesianAffine, BayesianModule, bayesianize, initial_values
from pyro_bbb.nn.draws import DrawPath, draw_path
from pyro_bbb.priors import Gaussian, ScaleMixture

from .networks import sample_sites


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(2, 4, batch_first=True)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[..., -1, :])


class Scaled(nn.Module):
    """A module of one's own with a direct parameter and a child."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.tensor(0.5))
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.gain * self.fc(x)


@pytest.mark.parametrize(
    ("module", "x", "sites"),
    [
        (nn.Sequential(nn.Conv1d(2, 4, 3), nn.ReLU(), nn.Flatten(-2), nn.Linear(24, 1)),
         torch.randn(5, 2, 8), ["0.weight", "0.bias", "3.weight", "3.bias"]),
        (Recurrent(), torch.randn(5, 7, 2),
         ["rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0", "rnn.bias_hh_l0",
          "head.weight", "head.bias"]),
        (nn.Sequential(nn.LayerNorm(3), nn.Linear(3, 1)), torch.randn(5, 3),
         ["0.weight", "0.bias", "1.weight", "1.bias"]),
        (nn.Sequential(nn.Embedding(10, 4), nn.Flatten(-2), nn.Linear(8, 1)),
         torch.randint(0, 10, (5, 2)), ["0.weight", "2.weight", "2.bias"]),
        (Scaled(), torch.randn(5, 3), ["fc.weight", "fc.bias", "gain"]),
    ],
    ids=["conv1d", "lstm", "layer_norm", "embedding", "own_module"],
)  # fmt: skip
def test_every_parameter_of_any_network_becomes_a_site_named_by_its_path(module, x, sites):
    pyro.clear_param_store()
    model = bbb.BNN(bayesianize(module), bbb.likelihoods.Gaussian(scale=0.1), num_data=5)
    guide = bbb.MeanFieldGuide(model)
    guide(x)
    assert sorted(guide.median()) == sorted(sites)
    assert {p.name for p in model.summary().deterministic} == set()


def test_a_wrapped_module_computes_what_the_module_computes_with_the_drawn_weights():
    lstm = nn.LSTM(2, 3, batch_first=True)
    net = bayesianize(lstm)
    draws = {name: torch.randn_like(p) for name, p in lstm.named_parameters()}
    x = torch.randn(4, 5, 2)
    out, (h, c) = pyro.poutine.condition(net, data=draws)(x)
    ref, (h_ref, c_ref) = functional_call(lstm, draws, (x,))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(c, c_ref)


def test_a_wrapped_module_called_on_drawn_sample_dims_outside_a_per_draw_pass_says_so():
    # the layer on its own, not a network's root: no runner takes the draws one at a time
    layer = bayesianize(nn.Sequential(nn.LayerNorm(3)))[0]
    assert isinstance(layer, BayesianModule)
    with (
        pytest.raises(ValueError, match=r"'0': parameter 'weight' was drawn with sample dims"),
        pyro.plate("draws", 2, dim=-2),
    ):
        layer(torch.randn(4, 3))


def one_draw(draws, shapes, s):
    return {name: value[s].reshape(shapes[name]) for name, value in draws.items()}


def test_vectorised_draws_through_a_wrapped_module_match_a_loop_over_draws():
    net = bayesianize(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2)))
    x = torch.randn(6, 3)
    net(x)  # a call without sample dims: the layer learns its input's rank
    shapes = {name: value.shape for name, value in initial_values(net).items()}
    draws = Predictive(net, num_samples=5, parallel=True)(x)
    draws = {name: draws[name] for name in shapes}
    out = pyro.poutine.condition(net, data=draws)(x)
    assert out.shape == (5, 6, 2)
    for s in range(5):
        expected = pyro.poutine.condition(net, data=one_draw(draws, shapes, s))(x)
        torch.testing.assert_close(out[s], expected)


def test_a_network_vmap_cannot_batch_runs_its_draws_in_a_loop_and_names_the_layer():
    net = bayesianize(Recurrent())
    x = torch.randn(3, 5, 2)
    net(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is printed: fit's set-up reports it
        draws = Predictive(net, num_samples=4, parallel=True)(x)
        draws = {name: value for name, value in draws.items() if name != "_RETURN"}
        out = pyro.poutine.condition(net, data=draws)(x)
    known = draw_path(net)
    assert known.path is DrawPath.LOOP and "'rnn' (LSTM)" in known.reason
    assert out.shape == (4, 3, 1)
    shapes = {name: value.shape for name, value in initial_values(net).items()}
    first = pyro.poutine.condition(net, data=one_draw(draws, shapes, 0))(x)
    torch.testing.assert_close(out[0], first)


class Gain(nn.Module):
    """A parameter of its own beside a layer, written for one draw."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.tensor(0.5))
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.gain * self.fc(x)


def test_a_module_with_children_gets_one_draw_of_its_own_parameters_at_a_time():
    net = bayesianize(Gain())
    x = torch.randn(6, 3)
    net(x)
    shapes = {name: value.shape for name, value in initial_values(net).items()}
    assert sorted(shapes) == ["fc.bias", "fc.weight", "gain"]
    draws = Predictive(net, num_samples=4, parallel=True)(x)
    draws = {name: draws[name] for name in shapes}
    out = pyro.poutine.condition(net, data=draws)(x)
    assert out.shape == (4, 6, 2)
    for s in range(4):
        expected = pyro.poutine.condition(net, data=one_draw(draws, shapes, s))(x)
        torch.testing.assert_close(out[s], expected)


def test_only_makes_the_named_layers_bayesian_and_keeps_the_rest_as_they_were():
    trained = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    net = bayesianize(trained, only="2.*")
    assert list(sample_sites(net, torch.randn(5, 3))) == ["2.weight", "2.bias"]
    torch.testing.assert_close(net[0].weight, trained[0].weight)
    assert isinstance(net[2], BayesianAffine) and not isinstance(net[0], BayesianAffine)


def test_only_and_deterministic_take_a_module_by_its_name():
    # "make the last layer Bayesian": only="2" used to match no parameter
    trained = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert list(sample_sites(bayesianize(trained, only="2"), torch.randn(5, 3))) == [
        "2.weight",
        "2.bias",
    ]
    kept = bayesianize(trained, deterministic="0")
    assert list(sample_sites(kept, torch.randn(5, 3))) == ["2.weight", "2.bias"]
    # a name is a whole component: "2" is not "20"
    wide = nn.Sequential(*[nn.Linear(3, 3) for _ in range(21)])
    assert list(sample_sites(bayesianize(wide, only="2"), torch.randn(5, 3))) == [
        "2.weight",
        "2.bias",
    ]


def test_only_refuses_a_pattern_that_matches_no_parameter():
    with pytest.raises(ValueError, match=r"only: pattern\(s\) \['head\.\*'\] match no parameter"):
        bayesianize(nn.Sequential(nn.Linear(3, 2)), only="head.*")


def test_guide_means_start_at_the_trained_weights_of_every_layer_kind():
    trained = Recurrent()
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.0)  # "trained": away from torch's initialisation
    model = bbb.BNN(bayesianize(trained), bbb.likelihoods.Gaussian(scale=0.1), num_data=5)
    guide = bbb.MeanFieldGuide(model)
    guide(torch.randn(5, 7, 2))
    median = guide.median()
    for name, value in trained.named_parameters():
        torch.testing.assert_close(median[name], value.detach())
    assert set(initial_values(model)) == set(dict(trained.named_parameters()))


def test_centred_priors_have_the_trained_weights_as_their_mean_and_stay_gaussian():
    trained = nn.Sequential(nn.Linear(3, 2), nn.LayerNorm(2))
    net = bayesianize(trained, Gaussian(0.1), centre_priors=True)
    for index, name in ((0, "weight"), (1, "weight"), (1, "bias")):
        prior = net[index].prior_distribution(name)
        assert isinstance(prior.base_dist, torch.distributions.Normal)
        torch.testing.assert_close(prior.mean, getattr(trained[index], name).detach())
        torch.testing.assert_close(prior.stddev, torch.full_like(prior.mean, 0.1))


def test_a_centred_scale_mixture_is_shifted_by_the_weights():
    trained = nn.Linear(3, 2)
    net = bayesianize(trained, ScaleMixture(0.5, 1.0, 0.01), centre_priors=True)
    prior = net.prior_distribution("weight")
    w = trained.weight.detach()
    base = ScaleMixture(0.5, 1.0, 0.01).site_distribution(
        w.shape, fan_in=3, device=w.device, dtype=w.dtype
    )
    value = w + 0.3
    torch.testing.assert_close(prior.log_prob(value), base.log_prob(value - w))


def test_frozen_parameters_left_deterministic_stay_frozen():
    trained = nn.Sequential(nn.LayerNorm(3), nn.Linear(3, 1))
    trained[0].weight.requires_grad_(False)
    net = bayesianize(trained, only="0.bias")
    assert isinstance(net[0], BayesianModule)
    assert not net[0].weight.requires_grad


def test_centre_priors_leaves_a_posterior_carried_from_a_guide_as_it_is():
    from pyro_bbb.priors import from_guide

    x = torch.randn(6, 3)
    model = bbb.BNN(bbb.mlp([3, 2]), bbb.likelihoods.Gaussian(scale=0.5), num_data=6)
    guide = bbb.MeanFieldGuide(model, init_scale=0.1, init_loc={"0.weight": torch.ones(2, 3)})
    guide(x)
    trained = nn.Sequential(nn.Linear(3, 2))
    net = bayesianize(trained, {**from_guide(guide), "*": Gaussian(1.0)}, centre_priors=True)
    torch.testing.assert_close(net[0].prior_distribution("weight").mean, torch.ones(2, 3))


def test_vectorised_elbo_particles_flow_through_a_wrapped_module():
    x, y = torch.randn(16, 3), torch.randn(16)
    net = bayesianize(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.LayerNorm(8), nn.Linear(8, 1)))
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(scale=0.5), num_data=16)
    guide = bbb.MeanFieldGuide(model, init_scale=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # LayerNorm is vmapped: no loop, no warning
        warnings.simplefilter("ignore", bbb.ConvergenceWarning)  # 30 epochs: not the point
        history = bbb.fit(
            model, guide, x, y, epochs=30, num_particles=4, lr=0.02, beta=1.0, progress=False
        )
    assert history.loss[-1] < history.loss[0]
    # the LayerNorm's posterior moved from its initial mean (ones) under training
    assert not torch.equal(guide.median()["2.weight"], torch.ones(8))


class _Fails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))

    def forward(self, x):
        if x.sum() > 0:
            raise RuntimeError("the module's own error")
        return self.weight * x


def test_a_wrapped_module_holds_the_drawn_values_only_for_its_call():
    layer = bayesianize(nn.Sequential(_Fails()))[0]
    inner = layer._modules["module"]
    draw = torch.full((3,), 2.0)
    out = pyro.poutine.condition(layer, data={"0.weight": draw})(-torch.ones(3))
    torch.testing.assert_close(out, -draw)
    assert "weight" not in inner.__dict__ and not hasattr(inner, "weight")
    with pytest.raises(RuntimeError, match="own error"):
        pyro.poutine.condition(layer, data={"0.weight": draw})(torch.ones(3))
    assert not hasattr(inner, "weight")  # taken out after a failed call too


def test_an_lstm_runs_on_each_call_s_weights_not_on_weights_it_cached():
    lstm = nn.LSTM(2, 3, batch_first=True)
    net = bayesianize(lstm)
    x = torch.randn(4, 5, 2)
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        draws = {
            name: torch.randn(p.shape, generator=g)
            for name, p in nn.LSTM(2, 3, batch_first=True).named_parameters()
        }
        out, _ = pyro.poutine.condition(net, data=draws)(x)
        torch.testing.assert_close(
            out, functional_call(nn.LSTM(2, 3, batch_first=True), draws, (x,))[0]
        )
