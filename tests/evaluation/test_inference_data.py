"""ArviZ export of VI and NUTS with one schema."""

from __future__ import annotations

import warnings

import arviz as az
import matplotlib
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.evaluation import to_inference_data
from pyro_bbb.infer.mcmc import run_nuts

from ..problems import conjugate_problem, exact_guide, linear_bnn

matplotlib.use("Agg")


GROUPS = {
    "posterior",
    "posterior_predictive",
    "log_likelihood",
    "observed_data",
    "constant_data",
    "sample_stats",
}


def test_inference_data_has_the_same_schema_for_vi_and_nuts(nuts_result):
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    vi = to_inference_data(model, guide, x, y, num_samples=200, seed=0)
    nuts = to_inference_data(model, nuts_result, x, y)
    for data in (vi, nuts):
        assert set(data.groups()) >= GROUPS
        assert set(data.posterior.data_vars) == {"0.weight", "0.bias"}
        assert data.posterior["0.weight"].dims[2:] == ("0.out", "0.in")
        assert data.posterior["0.bias"].dims[2:] == ("0.out",)
        assert data.log_likelihood["obs"].dims[2:] == ("data",)
        assert data.posterior_predictive["obs"].shape[2:] == (30,)
        assert torch.equal(torch.as_tensor(data.observed_data["obs"].values), y)
        assert torch.equal(torch.as_tensor(data.constant_data["x"].values), x)
    assert vi.posterior["0.weight"].shape == (1, 200, 1, 3)
    assert nuts.posterior["0.weight"].shape == (2, 150, 1, 3)
    assert set(vi.sample_stats.data_vars) == {"lp", "log_q"}
    assert {"lp", "diverging", "tree_depth", "step_size"} <= set(nuts.sample_stats.data_vars)


def test_log_likelihood_is_pointwise_gaussian_density(nuts_result):
    x, y, *_ = conjugate_problem()
    data = to_inference_data(linear_bnn(x), nuts_result, x, y)
    w = nuts_result.samples["0.weight"][..., 0, :]  # (chains, draws, 3)
    b = nuts_result.samples["0.bias"]  # (chains, draws, 1)
    loc = torch.einsum("cdk,nk->cdn", w, x) + b
    expected = torch.distributions.Normal(loc, 0.5).log_prob(y)
    assert torch.allclose(torch.as_tensor(data.log_likelihood["obs"].values), expected)


def test_vi_sample_stats_are_the_log_joint_and_log_q():
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    data = to_inference_data(model, guide, x, y, num_samples=50, seed=1)
    w = torch.cat(
        [
            torch.as_tensor(data.posterior["0.weight"].values).reshape(50, 3),
            torch.as_tensor(data.posterior["0.bias"].values).reshape(50, 1),
        ],
        dim=1,
    )
    q = torch.distributions.MultivariateNormal(mean, covariance)
    assert torch.allclose(torch.as_tensor(data.sample_stats["log_q"].values)[0], q.log_prob(w))
    prior = torch.distributions.Normal(0.0, 1.0).log_prob(w).sum(-1)
    lik = torch.distributions.Normal(w[:, :3] @ x.T + w[:, 3:], 0.5).log_prob(y).sum(-1)
    assert torch.allclose(torch.as_tensor(data.sample_stats["lp"].values)[0], prior + lik)


def test_arviz_functions_run_on_vi_and_nuts(nuts_result):
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    vi = to_inference_data(model, guide, x, y, num_samples=300, seed=0)
    nuts = to_inference_data(model, nuts_result, x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a high Pareto k on 30 points is data
        loo = {name: az.loo(data) for name, data in (("vi", vi), ("nuts", nuts))}
        for data in (vi, nuts):
            assert len(az.summary(data)) == 4
            assert az.waic(data).elpd_waic < 0
            az.plot_posterior(data)
        table = az.compare({"vi": vi, "nuts": nuts})
    # both sample the same posterior: their elpd agree within the standard error
    assert abs(loo["vi"].elpd_loo - loo["nuts"].elpd_loo) < loo["vi"].se
    assert set(table.index) == {"vi", "nuts"}


def test_classification_inference_data_and_labels():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    y = (x[:, 0] > 0).long()
    model = bbb.BNN(bbb.mlp([2, 3, 3], activation="tanh"), bbb.likelihoods.Categorical(), 40)
    guide = bbb.MeanFieldGuide(model)
    data = to_inference_data(model, guide, x, y, num_samples=20, seed=0)
    predictive = torch.as_tensor(data.posterior_predictive["obs"].values)
    assert predictive.shape == (1, 20, 40) and predictive.max() <= 2
    assert data.log_likelihood["obs"].shape == (1, 20, 40)
    assert bool((torch.as_tensor(data.log_likelihood["obs"].values) <= 0).all())


def test_a_sampled_noise_scale_is_a_posterior_variable_and_enters_the_likelihood():
    x, y, *_ = conjugate_problem()
    net = bbb.mlp([3, 1]).double()
    model = bbb.BNN(net, bbb.likelihoods.Gaussian().double(), num_data=len(x))
    prior = torch.distributions.LogNormal(torch.tensor(0.0, dtype=torch.float64), 1.0)
    result = run_nuts(
        model, x, y, num_samples=20, warmup_steps=20, seed=0, progress=False, noise=prior,
        init_steps=50,
    )  # fmt: skip
    data = to_inference_data(model, result, x, y)
    scale = result.samples["likelihood.scale"]  # (1, 20)
    assert torch.equal(torch.as_tensor(data.posterior["likelihood.scale"].values), scale)
    loc = torch.einsum("cdk,nk->cdn", result.samples["0.weight"][..., 0, :], x)
    loc = loc + result.samples["0.bias"]
    expected = torch.distributions.Normal(loc, scale.unsqueeze(-1)).log_prob(y)
    assert torch.allclose(torch.as_tensor(data.log_likelihood["obs"].values), expected)
    prediction = result.predict(model, x, seed=0)
    assert torch.allclose(prediction.scale_samples.reshape(20, -1)[:, 0], scale[0])


def test_inference_data_on_a_test_set_larger_than_the_training_set(nuts_result):
    x, *_ = conjugate_problem()
    x_test, y_test, *_ = conjugate_problem(num_data=100, seed=1)
    model = linear_bnn(x)
    data = to_inference_data(model, nuts_result, x_test, y_test)
    assert data.log_likelihood["obs"].shape == (2, 150, 100)
    with pytest.raises(ValueError, match=r"y must have shape \(100,\) for x, got \(100, 1\)"):
        to_inference_data(model, nuts_result, x_test, y_test.unsqueeze(-1))
