"""A network's posterior by site or layer, read from the guide's parameters in closed form."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoNormal

import pyro_bbb as bbb
from pyro_bbb.infer.collapse import CollapseMonitor


def _model():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x = torch.randn(10, 2)
    model = bbb.BNN(bbb.mlp([2, 3, 1]), bbb.likelihoods.Gaussian(0.1), num_data=10)
    return model, x


def _set(guide, site, loc, scale):
    store = pyro.get_param_store()
    with torch.no_grad():
        store[f"MeanFieldGuide.locs.{site}"].fill_(loc)
        store[f"MeanFieldGuide.rhos.{site}"].fill_(math.log(math.expm1(scale - guide.min_scale)))


def test_each_site_reads_its_sigmas_signal_to_noise_and_kl_in_closed_form():
    # layer 0 at its N(0, 1) prior; layer 2 at N(3, 0.5^2): KL per weight
    # log(1 / 0.5) + (0.25 + 9) / 2 - 1/2, signal-to-noise 3 / 0.5 = 6
    model, x = _model()
    guide = bbb.MeanFieldGuide(model)
    guide(x)
    for site in ("0.weight", "0.bias"):
        _set(guide, site, 0.0, 1.0)
    for site in ("2.weight", "2.bias"):
        _set(guide, site, 3.0, 0.5)
    table = bbb.posterior_summary(model, guide, x)
    assert list(table.index) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert table["layer"].tolist() == ["0", "0", "2", "2"]
    assert table["weights"].tolist() == [6, 3, 3, 1]
    kl = math.log(2) + (0.25 + 9) / 2 - 0.5
    assert table["kl"].tolist() == pytest.approx([0, 0, 3 * kl, kl], abs=1e-5)
    assert table["at_prior"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert table.loc["2.weight", "sigma_mean"] == pytest.approx(0.5)
    assert table.loc["2.weight", "sigma_95%"] == pytest.approx(0.5)
    assert table.loc["2.weight", "snr_5%"] == pytest.approx(6.0, rel=1e-5)
    assert table.loc["0.bias", "snr_50%"] == pytest.approx(0.0)
    layers = bbb.posterior_summary(model, guide, x, by="layer", quantiles=[0.1, 0.9])
    assert list(layers.index) == ["0", "2"]
    assert layers["weights"].tolist() == [9, 4]
    assert layers.loc["2", "kl"] == pytest.approx(4 * kl, rel=1e-5)
    assert {"sigma_10%", "sigma_90%", "snr_10%", "snr_90%"} <= set(layers.columns)


def test_the_share_at_the_prior_is_the_collapse_checks():
    model, x = _model()
    guide = bbb.MeanFieldGuide(model, init_scale=0.3)
    guide(x)
    _set(guide, "0.weight", 0.0, 1.0)  # 6 of 13 weights at the prior
    network = bbb.posterior_summary(model, guide, x, by="network")
    assert list(network.index) == ["network"] and network["weights"].item() == 13
    assert network["at_prior"].item() == pytest.approx(CollapseMonitor(model, guide, x).fraction())
    assert network["at_prior"].item() == pytest.approx(6 / 13)


def test_a_low_rank_guide_is_read_by_its_marginals():
    model, x = _model()
    guide = bbb.LowRankGuide(model, rank=2, init_scale=0.2)
    guide(x)
    table = bbb.posterior_summary(model, guide, x, quantiles=[0.5])
    covariance = guide.covariance("0")  # weight then bias, 9 x 9
    sigma = covariance.diagonal().sqrt().detach()
    assert table.loc["0.weight", "sigma_mean"] == pytest.approx(float(sigma[:6].mean()), rel=1e-5)
    assert table.loc["0.bias", "sigma_50%"] == pytest.approx(float(sigma[6:].median()), rel=1e-5)


def test_an_online_filters_belief_is_read_by_its_marginals_and_their_kl():
    # it was refused: "for any other guide (... an online filter's guide ...) export draws"
    model, x = _model()
    lofi = bbb.LoFi(model, rank=2)
    lofi.update(x, torch.randn(10))
    table = bbb.posterior_summary(model, lofi.guide, x, quantiles=[0.5])
    marginals = lofi.guide.marginals()
    loc, scale = marginals["0.weight"]
    assert table.loc["0.weight", "weights"] == 6
    assert table.loc["0.weight", "sigma_mean"] == pytest.approx(float(scale.mean()), rel=1e-5)
    # each weight's KL to the model's N(0, 1) prior, summed over the site
    prior = torch.distributions.Normal(0.0, 1.0)
    kl = torch.distributions.kl_divergence(torch.distributions.Normal(loc, scale), prior)
    assert table.loc["0.weight", "kl"] == pytest.approx(float(kl.sum()), rel=1e-4)


def test_an_ensemble_has_a_row_per_member_and_site():
    model, x = _model()
    ensemble = bbb.Ensemble(model, bbb.MeanFieldGuide, k=3)
    ensemble(x)
    table = bbb.posterior_summary(model, ensemble, x, by="layer")
    assert list(table.index) == [(m, layer) for m in range(3) for layer in ("0", "2")]
    assert table.index.names == ["member", "layer"]
    # the members start from different means: their signal-to-noise differs
    assert table.loc[(0, "0"), "snr_50%"] != table.loc[(1, "0"), "snr_50%"]


def test_a_guide_without_gaussian_marginals_is_refused_with_the_way_to_summarise_it():
    model, x = _model()
    with pytest.raises(TypeError, match=r"got DeltaGuide.*to_inference_data.*az.summary"):
        bbb.posterior_summary(model, bbb.DeltaGuide(model), x)
    with pytest.raises(TypeError, match="got AutoNormal"):
        bbb.posterior_summary(model, AutoNormal(model), x)
    guide = bbb.MeanFieldGuide(model)
    with pytest.raises(ValueError, match="by must be"):
        bbb.posterior_summary(model, guide, x, by="unit")
    with pytest.raises(ValueError, match=r"quantiles must lie in \(0, 1\)"):
        bbb.posterior_summary(model, guide, x, quantiles=[0.5, 1.0])
