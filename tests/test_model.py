"""Tests of pyro_bbb.BNN with Pyro's tools, and of pyro_bbb.MeanFieldGuide."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
import torch.nn.functional as F
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDiagonalNormal, AutoLowRankMultivariateNormal, AutoNormal
from torch import nn

from pyro_bbb import (
    BNN,
    Ensemble,
    LowRankGuide,
    MeanFieldGuide,
    bayesianize,
    fit,
    likelihoods,
    mlp,
    predict,
)
from pyro_bbb.infer import AnnealedELBO
from pyro_bbb.nn import initial_values

SITES = ["0.weight", "0.bias", "2.weight", "2.bias"]
SHAPES = {"0.weight": (8, 1), "0.bias": (8,), "2.weight": (1, 8), "2.bias": (1,)}


def _toy_data(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.linspace(-2, 2, n).unsqueeze(-1)
    y = torch.sin(2 * x.squeeze(-1)) + 0.1 * torch.randn(n, generator=generator)
    return x, y


def _regression_model(n: int = 32, hidden: int = 8) -> BNN:
    return BNN(mlp([1, hidden, 1]), likelihoods.Gaussian(), num_data=n)


def _decreased(losses: list[float], window: int = 10) -> tuple[float, float]:
    return sum(losses[:window]) / window, sum(losses[-window:]) / window


def _latent_sites(trace) -> list[str]:
    return [
        name
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and name != "data"
    ]


# --- BNN with Pyro's inference tools -----------------------------------------------------


@pytest.mark.parametrize("loss", [Trace_ELBO, AnnealedELBO], ids=["Trace_ELBO", "AnnealedELBO"])
def test_bnn_trains_with_pyro_svi_and_the_loss_decreases(loss):
    x, y = _toy_data()
    model = _regression_model()
    guide = MeanFieldGuide(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), loss())
    losses = [svi.step(x, y) for _ in range(80)]
    assert all(math.isfinite(v) for v in losses)
    first, last = _decreased(losses)
    assert last < 0.75 * first
    # SVI trained the guide's parameters and the likelihood's learned noise scale
    assert "likelihood.scale" in pyro.get_param_store()
    assert any(name.startswith("MeanFieldGuide.locs") for name in pyro.get_param_store())


@pytest.mark.parametrize(
    "guide_class",
    [AutoNormal, AutoDiagonalNormal, AutoLowRankMultivariateNormal],
    ids=lambda c: c.__name__,
)
def test_bnn_trains_with_pyro_autoguides_through_fit(guide_class):
    x, y = _toy_data()
    model = _regression_model(hidden=4)
    guide = guide_class(model)
    history = fit(model, guide, x, y, epochs=50, lr=0.03, progress=False)
    assert all(math.isfinite(v) for v in history.loss)
    first, last = _decreased(history.plain_loss)  # the annealed loss rises with beta
    assert last < 0.9 * first


def test_bnn_model_relations_show_weights_feeding_the_observation():
    x, y = _toy_data(8)
    model = _regression_model(8)
    relations = pyro.infer.inspect.get_model_relations(model, model_args=(x, y))
    assert relations["observed"] == ["obs"]
    assert sorted(relations["sample_sample"]["obs"]) == sorted(SITES)
    assert relations["sample_param"]["obs"] == ["likelihood.scale"]
    assert relations["plate_sample"] == {"data": ["obs"]}


def test_bnn_renders_with_pyro_render_model():
    x, y = _toy_data(8)
    model = _regression_model(8)
    try:
        graph = pyro.render_model(model, model_args=(x, y))
    except ImportError:
        pytest.skip("needs the graphviz Python package (in the test extra)")
    assert "obs" in graph.source


# --- the data plate ------------------------------------------------------------------------


def test_minibatch_log_likelihood_is_scaled_by_num_data_over_batch_size():
    x, y = _toy_data(32)
    model = BNN(mlp([1, 8, 1]), likelihoods.Gaussian(scale=0.5), num_data=32)
    trace = pyro.poutine.trace(model).get_trace(x[:8], y[:8])
    trace.compute_log_prob()
    obs = trace.nodes["obs"]
    assert obs["scale"] == 32 / 8
    # the scaled log-likelihood is N/B times the batch's plain log-likelihood
    plain = obs["fn"].log_prob(y[:8]).sum()
    torch.testing.assert_close(obs["log_prob_sum"], 4 * plain)
    # the weights' prior is not scaled
    for name in SITES:
        assert trace.nodes[name]["scale"] == 1.0


def test_full_batch_log_likelihood_is_unscaled():
    x, y = _toy_data(32)
    model = _regression_model(32)
    trace = pyro.poutine.trace(model).get_trace(x, y)
    assert trace.nodes["obs"]["scale"] == 1.0
    assert trace.nodes["data"]["value"].tolist() == list(range(32))


def test_prediction_plate_is_sized_to_the_inputs():
    x, _ = _toy_data(32)
    model = _regression_model(32)
    trace = pyro.poutine.trace(model).get_trace(x[:5])
    assert trace.nodes["obs"]["value"].shape == (5,)
    assert not trace.nodes["obs"]["is_observed"]
    assert trace.nodes["obs"]["scale"] == 1.0


# --- names ---------------------------------------------------------------------------------


def test_model_sites_keep_the_network_names_unprefixed():
    x, y = _toy_data(8)
    model = _regression_model(8)
    trace = pyro.poutine.trace(model).get_trace(x, y)
    assert _latent_sites(trace) == SITES
    assert not any(name.startswith("net.") for name in trace.nodes)
    # reading model.net repeatedly must not rename the sites
    _ = model.net, model.net
    assert _latent_sites(pyro.poutine.trace(model).get_trace(x, y)) == SITES


def test_learned_noise_scale_is_the_param_likelihood_scale():
    x, y = _toy_data(8)
    model = _regression_model(8)
    trace = pyro.poutine.trace(model).get_trace(x, y)
    params = [name for name, site in trace.nodes.items() if site["type"] == "param"]
    assert params == ["likelihood.scale"]
    assert trace.nodes["likelihood.scale"]["value"].item() == pytest.approx(1.0)


# --- BNN argument checks -------------------------------------------------------------------


def test_bnn_rejects_a_plain_torch_network():
    with pytest.raises(TypeError, match=r"net must be a Bayesian PyroModule.*Sequential"):
        BNN(nn.Sequential(nn.Linear(1, 1)), likelihoods.Gaussian(), num_data=4)


def test_bnn_rejects_a_likelihood_that_is_not_a_likelihood():
    with pytest.raises(TypeError, match=r"likelihood must be a pyro_bbb.likelihoods.Likelihood"):
        BNN(mlp([1, 1]), torch.distributions.Normal, num_data=4)


@pytest.mark.parametrize("num_data", [0, -3, 2.5, True, "10"])
def test_bnn_rejects_num_data_that_is_not_a_positive_int(num_data):
    with pytest.raises(ValueError, match=r"num_data must be a positive int"):
        BNN(mlp([1, 1]), likelihoods.Gaussian(), num_data=num_data)


def test_bnn_rejects_a_batch_larger_than_num_data():
    x, y = _toy_data(8)
    model = _regression_model(4)
    with pytest.raises(ValueError, match=r"the batch has 8 rows but num_data=4"):
        model(x, y)


def test_bnn_rejects_integer_features_and_mismatched_rows():
    x, y = _toy_data(8)
    model = _regression_model(8)
    with pytest.raises(ValueError, match=r"x must be floating point.*torch.int64"):
        model(torch.ones(8, 1, dtype=torch.long), y)
    with pytest.raises(ValueError, match=r"same number of rows.*\(8, 1\).*\(7,\)"):
        model(x, y[:7])


def _token_model(**kwargs) -> BNN:
    net = bayesianize(nn.Sequential(nn.Embedding(10, 3), nn.Flatten(-2), nn.Linear(6, 1)), **kwargs)
    return BNN(net, likelihoods.Gaussian(scale=0.5), num_data=8)


@pytest.mark.parametrize("deterministic", [(), ("0.*",)], ids=["bayesian", "point_estimate"])
def test_a_network_whose_first_layer_is_an_embedding_takes_token_ids(deterministic):
    ids, y = torch.randint(0, 10, (8, 2)), torch.randn(8)
    model = _token_model(deterministic=deterministic)
    assert model.accepts_token_ids
    guide = MeanFieldGuide(model)
    history = fit(model, guide, ids, y, epochs=2, progress=False)
    assert len(history.loss) == 2
    with pytest.raises(ValueError, match=r"x must hold integer token ids, got dtype torch.bool"):
        model(ids > 3, y)


def test_integer_features_are_refused_with_a_hint_when_the_first_layer_is_not_an_embedding():
    model = _regression_model(8)
    assert not model.accepts_token_ids
    with pytest.raises(ValueError, match=r"first layer is nn.Embedding\), got dtype torch.int32"):
        model(torch.ones(8, 1, dtype=torch.int32))


# --- MeanFieldGuide ------------------------------------------------------------------------


def _set_up_guide(**kwargs) -> tuple[BNN, MeanFieldGuide]:
    x, y = _toy_data(8)
    model = _regression_model(8)
    guide = MeanFieldGuide(model, **kwargs)
    guide(x, y)
    return model, guide


def test_mean_field_guide_samples_the_model_sites_with_normal_distributions():
    x, y = _toy_data(8)
    _, guide = _set_up_guide()
    trace = pyro.poutine.trace(guide).get_trace(x, y)
    assert _latent_sites(trace) == SITES
    for name in SITES:
        fn = trace.nodes[name]["fn"]
        assert isinstance(fn.base_dist, torch.distributions.Normal)
        assert fn.event_shape == SHAPES[name]
        assert fn.batch_shape == ()


def test_mean_field_guide_initial_scale_is_init_scale():
    _set_up_guide(init_scale=0.03, min_scale=1e-5)
    store = pyro.get_param_store()
    for name in SITES:
        rho = store[f"MeanFieldGuide.rhos.{name}"]
        assert rho.shape == SHAPES[name]
        torch.testing.assert_close(F.softplus(rho) + 1e-5, torch.full(SHAPES[name], 0.03))


@pytest.mark.parametrize("init_scale", [1e-4, 0.5, 3.0])
def test_mean_field_guide_posterior_scale_starts_at_init_scale(init_scale):
    _, guide = _set_up_guide(init_scale=init_scale)
    for name, d in guide.posterior().items():
        torch.testing.assert_close(d.base_dist.scale, torch.full(SHAPES[name], init_scale))


@pytest.mark.parametrize("init_scale", [0.0, -0.1, 1e-7, math.nan])
def test_mean_field_guide_rejects_init_scale_not_above_min_scale(init_scale):
    model = _regression_model(8)
    with pytest.raises(ValueError, match=r"init_scale must"):
        MeanFieldGuide(model, init_scale=init_scale, min_scale=1e-6)


def test_mean_field_guide_median_quantiles_and_posterior_agree_with_its_parameters():
    _, guide = _set_up_guide(init_scale=0.2)
    store = pyro.get_param_store()
    with torch.no_grad():
        for name in SITES:
            store[f"MeanFieldGuide.locs.{name}"].normal_()
    median = guide.median()
    quantiles = guide.quantiles([0.5, 0.8413447460685429, 0.15865525393145707])
    posterior = guide.posterior()
    assert list(median) == SITES
    for name in SITES:
        loc = store[f"MeanFieldGuide.locs.{name}"].detach()
        scale = F.softplus(store[f"MeanFieldGuide.rhos.{name}"].detach()) + guide.min_scale
        torch.testing.assert_close(median[name], loc)
        assert quantiles[name].shape == (3, *SHAPES[name])
        torch.testing.assert_close(quantiles[name][0], loc)
        torch.testing.assert_close(quantiles[name][1], loc + scale, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(quantiles[name][2], loc - scale, rtol=1e-4, atol=1e-5)
        d = posterior[name]
        assert d.event_shape == SHAPES[name]
        torch.testing.assert_close(d.mean, loc)
        torch.testing.assert_close(d.stddev, scale)
        assert not d.mean.requires_grad
    # the posterior is a snapshot, not a view of the parameters
    with torch.no_grad():
        store["MeanFieldGuide.locs.0.bias"].add_(1.0)
    torch.testing.assert_close(posterior["0.bias"].mean, median["0.bias"])
    # the median is a copy: changing it leaves the guide alone
    median["0.bias"].fill_(123.0)
    assert not torch.equal(guide.median()["0.bias"], median["0.bias"])


def test_mean_field_guide_sets_itself_up_from_model_arguments_in_median():
    x, y = _toy_data(8)
    model = _regression_model(8)
    guide = MeanFieldGuide(model)
    with pytest.raises(RuntimeError, match=r"has no parameters yet"):
        guide.median()
    assert list(guide.median(x, y)) == SITES


def test_mean_field_guide_rejects_quantiles_outside_the_unit_interval():
    _, guide = _set_up_guide()
    with pytest.raises(ValueError, match=r"quantiles must lie in \(0, 1\)"):
        guide.quantiles([0.0, 0.5])


def test_mean_field_guide_means_start_at_the_modules_own_initialisation():
    module = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1))
    model = BNN(bayesianize(module), likelihoods.Gaussian(), num_data=8)
    guide = MeanFieldGuide(model)
    x, y = _toy_data(8)
    guide(x, y)
    median = guide.median()
    for name, param in module.named_parameters():
        torch.testing.assert_close(median[name], param.detach())
    assert set(median) == set(initial_values(model))


def test_mean_field_guide_means_start_at_a_pretrained_modules_parameters():
    module = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1))
    model = BNN(bayesianize(module), likelihoods.Gaussian(), num_data=8)
    pretrained = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1))
    with torch.no_grad():
        for param in pretrained.parameters():
            param.add_(5.0)
    guide = MeanFieldGuide(model, init_loc=pretrained)
    x, y = _toy_data(8)
    guide(x, y)
    median = guide.median()
    for name, param in pretrained.named_parameters():
        torch.testing.assert_close(median[name], param.detach())
    # the pretrained module lends its values only: it is no part of the guide
    guide_tensors = {id(t) for t in (*guide.parameters(), *guide.state_dict().values())}
    assert not guide_tensors & {id(p) for p in pretrained.parameters()}
    assert not any(key.startswith("_init_loc") for key in guide.state_dict())
    # the guide copied the values: training it leaves the pretrained module alone
    store = pyro.get_param_store()
    with torch.no_grad():
        store["MeanFieldGuide.locs.0.bias"].zero_()
    assert pretrained[0].bias.abs().min() > 0


def test_mean_field_guide_means_start_at_values_from_a_mapping():
    x, y = _toy_data(8)
    model = _regression_model(8)
    bias = torch.tensor([0.25])
    guide = MeanFieldGuide(model, init_loc={"2.bias": bias})
    guide(x, y)
    median = guide.median()
    torch.testing.assert_close(median["2.bias"], bias)
    # sites not named keep the network's own initialisation
    torch.testing.assert_close(median["0.weight"], initial_values(model)["0.weight"])


def test_mean_field_guide_means_start_at_another_fitted_guides_means():
    # a low-rank guide's, or an online filter's belief: fit goes on from where it stands
    x, y = _toy_data(8)
    model = _regression_model(8)
    fitted = LowRankGuide(model, rank=2, name="fitted")
    with pytest.raises(ValueError, match=r"has not been fitted or called"):
        MeanFieldGuide(model, init_loc=fitted, name="early")(x, y)
    fitted(x, y)
    with torch.no_grad():
        pyro.get_param_store()["fitted.locs.2"].fill_(0.75)  # layer 2: weight and bias
    guide = MeanFieldGuide(model, init_loc=fitted)
    guide(x, y)
    for name, value in fitted.median().items():
        torch.testing.assert_close(guide.median()[name], value)
    assert guide.median()["2.bias"].item() == 0.75
    ensemble = Ensemble(model, MeanFieldGuide, k=2)
    ensemble(x, y)
    with pytest.raises(ValueError, match=r"an ensemble of 2 members, .* pass one member's"):
        MeanFieldGuide(model, init_loc=ensemble, name="from_ensemble")(x, y)


def test_mean_field_guide_rejects_init_loc_for_an_unknown_site():
    x, y = _toy_data(8)
    guide = MeanFieldGuide(_regression_model(8), init_loc={"fc9.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"unknown site\(s\) \['fc9.weight'\]"):
        guide(x, y)


def test_mean_field_guide_rejects_init_loc_of_the_wrong_shape_naming_the_site():
    x, y = _toy_data(8)
    guide = MeanFieldGuide(_regression_model(8), init_loc={"0.weight": torch.zeros(8)})
    with pytest.raises(ValueError, match=r"site '0.weight' must have shape \(8, 1\), got \(8,\)"):
        guide(x, y)


def test_mean_field_guide_rejects_a_pretrained_module_of_another_architecture():
    x, y = _toy_data(8)
    other = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 4), nn.Linear(4, 1))
    guide = MeanFieldGuide(_regression_model(8), init_loc=other)
    with pytest.raises(ValueError, match=r"init_loc for site '2.weight' must have shape \(1, 8\)"):
        guide(x, y)
    missing = nn.Sequential(nn.Linear(1, 8))
    guide = MeanFieldGuide(_regression_model(8), init_loc=missing, name="second")
    with pytest.raises(ValueError, match=r"no parameter for site\(s\) \['2.weight', '2.bias'\]"):
        guide(x, y)


def test_mean_field_guide_rejects_an_init_loc_of_another_type():
    x, y = _toy_data(8)
    guide = MeanFieldGuide(_regression_model(8), init_loc=[1.0, 2.0])
    with pytest.raises(
        TypeError, match=r"init_loc must be None, a fitted guide, a pretrained nn.Module"
    ):
        guide(x, y)


def test_named_models_keep_their_own_sites_and_point_estimates():
    x, y = torch.randn(20, 2), torch.randn(20)
    first = BNN(mlp([2, 3, 1]), likelihoods.Gaussian(), 20, name="first")
    second = BNN(mlp([2, 3, 1]), likelihoods.Gaussian(), 20, name="second")
    guide = MeanFieldGuide(first, name="first_guide")
    fit(first, guide, x, y, epochs=100, lr=0.05, progress=False)
    assert sorted(guide.median()) == [
        "first.0.bias",
        "first.0.weight",
        "first.2.bias",
        "first.2.weight",
    ]
    trace = pyro.poutine.trace(second).get_trace(x, y)
    assert "second.likelihood.scale" in trace.nodes
    # the second model's learned noise did not move with the first model's training
    assert first.likelihood.scale.item() != pytest.approx(1.0, abs=1e-3)
    assert trace.nodes["second.likelihood.scale"]["value"].item() == pytest.approx(1.0)


def test_model_name_must_be_a_string():
    with pytest.raises(TypeError, match="name"):
        BNN(mlp([2, 1]), likelihoods.Gaussian(), 5, name=3)


class _Squeezed(torch.nn.Module):
    """A regression network whose forward ends in ``.squeeze(-1)``: ``(batch,)``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.fc(x).squeeze(-1)


def test_a_network_returning_one_number_per_row_without_an_output_dim_is_refused_naming_the_fix():
    net = bayesianize(_Squeezed())
    model = BNN(net, likelihoods.Gaussian(), num_data=20)
    x, y = torch.randn(20, 3), torch.randn(20)
    with pytest.raises(ValueError, match=r"returned shape \(20,\) for 20 rows.*\(batch, 1\)"):
        pyro.poutine.trace(model).get_trace(x, y)
    guide = MeanFieldGuide(model)
    with pytest.raises(ValueError, match=r"returned shape \(8,\) for 8 rows.*squeeze"):
        fit(model, guide, x, y, epochs=1, batch_size=8)


def test_inputs_of_the_wrong_shape_are_refused_by_fit_and_predict_naming_what_came():
    # before: predict named the shape of the two rows it probes with ((2,) for x[0] of
    # (3,), (2, 2) for features (100, 2)), and an input with a dim of its own failed in fit
    # and predict on "the size of tensor a (100) must match the size of tensor b (8)"
    pyro.clear_param_store()
    x, y = torch.randn(40, 3), torch.randn(40)
    model = BNN(mlp([3, 8, 1]), likelihoods.Gaussian(), num_data=40)
    guide = MeanFieldGuide(model)
    fit(model, guide, x, y, epochs=1, progress=False)
    with pytest.raises(ValueError, match=r"got shape \(3,\); for one point.*x\.unsqueeze\(0\)"):
        predict(model, guide, x[0], num_samples=4)
    with pytest.raises(ValueError, match=r"expects input features \(3,\) in its last 1 dim\(s\), "
                       r"got \(2,\) there"):  # fmt: skip
        predict(model, guide, x[:, :2], num_samples=4)
    stray = r"returned shape \(\d+, 1, 1\) for \d+ rows of x.*a dim the network does not take"
    with pytest.raises(ValueError, match=stray):
        predict(model, guide, x.unsqueeze(1), num_samples=4)
    with pytest.raises(ValueError, match=stray):
        fit(model, guide, x.unsqueeze(1), y, epochs=1, progress=False)
