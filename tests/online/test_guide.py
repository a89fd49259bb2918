"""The filters' belief as a guide: every tool that takes a guide takes it, exactly."""

from __future__ import annotations

import pyro
import pyro.poutine as poutine
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.online import RVGA, LoFi, LowRankPrecisionGuide
from pyro_bbb.priors import FanInGaussian, from_guide
from pyro_bbb.priors.precision_block import PrecisionSiteConditional

from ..problems import conjugate_problem, linear_bnn


def _small_model():
    return bbb.BNN(
        bbb.mlp([2, 6, 1], activation="tanh", prior=FanInGaussian(1.0)),
        bbb.likelihoods.Gaussian(0.3),
        num_data=40,
    )


def _trained(model, rank=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    y = torch.sin(x[:, 0]) + 0.3 * torch.randn(40, generator=g)
    updater = LoFi(model, rank=rank)
    for start in range(0, 40, 10):
        updater.update(x[start : start + 10], y[start : start + 10])
    return updater.guide, x, y


def test_at_set_up_it_holds_the_prior_around_the_initial_weights():
    model = _small_model()
    guide = LowRankPrecisionGuide(model, rank=2)
    guide(torch.zeros(1, 2))
    fan_in = torch.cat([torch.full((18,), 2.0), torch.full((7,), 6.0)])  # 0.*: 2, 2.*: 6
    torch.testing.assert_close(guide.precision_diag, fan_in)  # 1 / (1 / fan_in)
    assert guide.precision_factor.shape == (25, 2) and not guide.precision_factor.any()
    initial = bbb.nn.initial_values(model)
    torch.testing.assert_close(guide.median()["0.weight"], initial["0.weight"])


def test_a_belief_set_before_set_up_is_taken_at_set_up():
    model = _small_model()
    guide = LowRankPrecisionGuide(model, rank=1)
    loc, factor, diag = torch.arange(25.0), torch.ones(25, 1), torch.full((25,), 4.0)
    guide.set_belief(loc, factor, diag)
    guide(torch.zeros(1, 2))
    torch.testing.assert_close(guide.loc, loc)
    with pytest.raises(ValueError, match=r"precision_factor must have shape \(25, 1\)"):
        guide.set_belief(loc, torch.ones(25, 2), diag)
    with pytest.raises(ValueError, match="positive"):
        guide.set_belief(loc, factor, -diag)


def test_the_sites_are_slices_of_one_draw_of_the_belief():
    model = _small_model()
    guide, x, _ = _trained(model)
    trace = poutine.trace(guide).get_trace(x)
    block = trace.nodes["_LowRankPrecisionGuide_network"]
    assert block["infer"]["is_auxiliary"]
    flat = torch.cat([trace.nodes[s]["value"].reshape(-1) for s in guide.block_sites["network"]])
    torch.testing.assert_close(flat, block["value"])
    torch.testing.assert_close(
        block["fn"].log_prob(block["value"]), guide.distribution().log_prob(flat)
    )


def test_predict_draws_from_the_belief():
    x, _, *_ = conjugate_problem(num_data=30)
    model = linear_bnn(x)
    guide = LowRankPrecisionGuide(model, rank=2)
    guide(x)
    g = torch.Generator().manual_seed(1)
    guide.set_belief(
        torch.tensor([1.0, -1.0, 0.5, 0.2]).double(),
        torch.randn(4, 2, generator=g, dtype=torch.float64),
        torch.full((4,), 20.0, dtype=torch.float64),
    )
    prediction = bbb.predict(model, guide, x, num_samples=20_000, seed=0)
    fn = guide.distribution()
    features = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    expected_std = (features @ fn.covariance_matrix @ features.T).diagonal().sqrt()
    # 20,000 draws: the std's relative error is about 0.5 %
    torch.testing.assert_close(prediction.epistemic_std, expected_std, rtol=0.03, atol=0)
    torch.testing.assert_close(prediction.mean, features @ fn.loc, atol=0.02, rtol=0)


def test_save_and_load_carry_the_belief_and_the_learned_noise(tmp_path):
    model = bbb.BNN(
        bbb.mlp([2, 6, 1], activation="tanh", prior=FanInGaussian(1.0)),
        bbb.likelihoods.Gaussian(),
        num_data=40,
    )
    guide, *_ = _trained(model)
    bbb.save(tmp_path / "belief.pt", model, guide)
    pyro.clear_param_store()
    fresh = bbb.BNN(
        bbb.mlp([2, 6, 1], activation="tanh", prior=FanInGaussian(1.0)),
        bbb.likelihoods.Gaussian(),
        num_data=40,
    )
    loaded = LowRankPrecisionGuide(fresh, rank=3)
    bbb.load(tmp_path / "belief.pt", fresh, loaded)
    for name in ("loc", "precision_factor", "precision_diag"):
        torch.testing.assert_close(getattr(loaded, name), getattr(guide, name))
    torch.testing.assert_close(fresh.likelihood.scale, model.likelihood.scale)


def test_from_guide_carries_the_belief_exactly_as_a_prior():
    model = _small_model()
    guide, x, _ = _trained(model)
    prior = from_guide(guide)
    carried = bbb.BNN(
        bbb.mlp([2, 6, 1], activation="tanh", prior=prior),
        bbb.likelihoods.Gaussian(0.3),
        num_data=40,
    )
    trace = poutine.trace(carried).get_trace(x)
    sites = list(guide.block_sites["network"])
    assert all(isinstance(trace.nodes[s]["fn"], PrecisionSiteConditional) for s in sites)
    joint = sum(trace.nodes[s]["fn"].log_prob(trace.nodes[s]["value"]) for s in sites)
    flat = torch.cat([trace.nodes[s]["value"].reshape(-1) for s in sites])
    torch.testing.assert_close(joint, guide.distribution().log_prob(flat))


def test_to_inference_data_takes_the_belief_with_its_density():
    model = _small_model()
    guide, x, y = _trained(model)
    data = bbb.to_inference_data(model, guide, x, y, num_samples=30, seed=0)
    assert data.posterior["0.weight"].shape == (4, 30, 6, 2)  # four chains of 30 draws
    assert "log_q" in data.sample_stats or "lp" in data.sample_stats


def test_marginals_are_the_belief_variances_by_site():
    model = _small_model()
    guide, *_ = _trained(model)
    fn = guide.distribution()
    marginals = guide.marginals()
    flat = torch.cat([scale.reshape(-1) for _, scale in marginals.values()])
    torch.testing.assert_close(flat, fn.variance.sqrt())


def test_compare_sets_the_belief_beside_another_posterior():
    model = _small_model()
    guide, x, y = _trained(model)
    same = bbb.compare(model, guide, guide, x, y, names=["lofi", "lofi again"], num_samples=50)
    rows = same.to_dict()
    assert rows["method"] == ["lofi", "lofi again"]
    assert rows["test_log_likelihood"][0] == rows["test_log_likelihood"][1]


@pytest.mark.parametrize("make", [LoFi, RVGA], ids=["lofi", "rvga"])
def test_save_carries_the_belief_of_the_last_update_unused_since(tmp_path, make):
    # the updater hands its belief to the guide when the guide is next used; saving is a use
    model = _small_model()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 2, generator=g)
    updater = make(model)
    updater.update(x[:10], torch.sin(x[:10, 0])).update(x[10:], torch.sin(x[10:, 0]))
    bbb.save(tmp_path / "belief.pt", model, updater.guide)
    fresh = _small_model()
    loaded = LowRankPrecisionGuide(fresh, rank=updater.guide.rank)
    bbb.load(tmp_path / "belief.pt", fresh, loaded)
    fn = loaded.distribution()
    torch.testing.assert_close(fn.loc, updater.state.mean)
    if make is RVGA:  # saved in precision form, exactly
        root = updater.state.covariance_root.double()
        torch.testing.assert_close(
            fn.precision_matrix.double(), torch.linalg.inv(root @ root.T), rtol=1e-4, atol=1e-3
        )
    else:
        torch.testing.assert_close(fn.precision_factor, updater.state.precision_factor)
