"""Diagnostics: PSIS k̂ of a guide, ESS and R̂ of a NUTS run, by weight and in function space."""

from __future__ import annotations

import matplotlib
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.evaluation import (
    effective_sample_size,
    function_space_diagnostics,
    psis_khat,
    r_hat,
)

from ..problems import conjugate_problem, exact_guide, linear_bnn

matplotlib.use("Agg")


def test_psis_khat_is_small_for_the_exact_posterior_and_large_for_a_narrow_guide():
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    exact = exact_guide(model, x, y, mean, covariance)
    assert psis_khat(model, exact, x, y, num_samples=1000, seed=0) < 0.5
    narrow = exact_guide(model, x, y, mean, covariance, shrink=0.1)
    assert psis_khat(model, narrow, x, y, num_samples=1000, seed=0) > 0.7


def test_psis_khat_needs_the_whole_training_set():
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    with pytest.raises(ValueError, match=r"x has 20 rows but model\.num_data=30"):
        psis_khat(model, guide, x[:20], y[:20])


def test_ess_and_rhat_by_site(nuts_result):
    ess = effective_sample_size(nuts_result)
    rhat = r_hat(nuts_result)
    assert ess["0.weight"].shape == (1, 3) and rhat["0.bias"].shape == (1,)
    draws = nuts_result.num_chains * nuts_result.num_samples
    # a well-mixed Gaussian posterior: ESS a good fraction of the draws, R-hat near 1
    assert all(bool((v > 0.2 * draws).all()) for v in ess.values())
    assert all(bool((v < 1.05).all()) for v in rhat.values())


def _tanh_result(first: dict, second: dict):
    """A two-chain NUTSResult of a 1-2-1 tanh net from two chains' site draws."""
    from pyro_bbb.infer.mcmc import NUTSResult

    samples = {name: torch.stack([first[name], second[name]]) for name in first}
    stats = {"diverging": torch.zeros(2, first["0.bias"].shape[0], dtype=torch.bool)}
    return NUTSResult(samples=samples, sample_stats=stats, mcmc=(None, None), wall_time=1.0,
                      warmup_steps=0)  # fmt: skip


def test_function_space_diagnostics_see_through_hidden_unit_permutations():
    torch.manual_seed(0)
    model = bbb.BNN(bbb.mlp([1, 2, 1], activation="tanh"), bbb.likelihoods.Gaussian(0.1), 10)
    draws = 400
    # chain 0 near one mode; chain 1 the same functions with the two hidden units swapped
    first = {
        "0.weight": torch.tensor([[1.0], [-2.0]]) + 0.1 * torch.randn(draws, 2, 1),
        "0.bias": torch.tensor([0.5, -0.5]) + 0.1 * torch.randn(draws, 2),
        "2.weight": torch.tensor([[1.5, 0.7]]) + 0.1 * torch.randn(draws, 1, 2),
        "2.bias": 0.1 * torch.randn(draws, 1),
    }
    swapped = {name: value.flip(-1 if name == "2.weight" else 1) for name, value in first.items()}
    swapped["2.bias"] = first["2.bias"]
    result = _tanh_result(first, swapped)
    x = torch.linspace(-3, 3, 7).unsqueeze(-1)
    assert float(r_hat(result)["0.weight"].min()) > 1.5  # weight space: "not converged"
    checks = function_space_diagnostics(model, result, x)
    assert checks.ess.shape == checks.r_hat.shape == (7,)
    assert checks.chain_means.shape == (2, 7)
    torch.testing.assert_close(checks.chain_means[0], checks.chain_means[1])  # same functions
    assert float(checks.r_hat.max()) < 1.01 and checks.converged(min_ess=100)
    # a chain in another function: the output shows it
    other = {**first, "2.bias": first["2.bias"] + 1.0}
    split = function_space_diagnostics(model, _tanh_result(first, other), x)
    assert float(split.r_hat.min()) > 1.5 and not split.converged()
    torch.testing.assert_close(split.chain_means[1] - split.chain_means[0], torch.ones(7))


def test_function_space_diagnostics_of_a_linear_model_follow_its_weights(nuts_result):
    x, *_ = conjugate_problem()
    checks = function_space_diagnostics(linear_bnn(x), nuts_result, x[:5])
    # linear regression: the output is linear in the weights, as well sampled as they are
    assert checks.ess.shape == (5,) and float(checks.ess.min()) > 50
    assert float(checks.r_hat.max()) < 1.05
