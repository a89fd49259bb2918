"""NUTS on the full-batch model: posterior recovery, the noise choice, bad input."""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.evaluation import effective_sample_size
from pyro_bbb.infer.mcmc import NUTSResult, run_nuts
from pyro_bbb.infer.mcmc.chains import guide_start
from pyro_bbb.infer.mcmc.potential import flat_layout

from ...problems import conjugate_problem, exact_guide, linear_bnn
from ...support import scaled


def flat_draws(result: NUTSResult) -> torch.Tensor:
    """Pooled draws of [w_1..w_d, b], ``(num_draws, d + 1)``."""
    flat = result.flat_samples()
    return torch.cat([flat["0.weight"].flatten(1), flat["0.bias"]], dim=1)


def test_nuts_recovers_the_exact_posterior_of_linear_regression():
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    result = run_nuts(
        model, x, y, num_samples=scaled(400, 2000), warmup_steps=scaled(200, 500),
        seed=0, progress=False, init_steps=100,
    )  # fmt: skip
    draws = flat_draws(result)
    ess = torch.cat([v.reshape(-1) for v in effective_sample_size(result).values()])
    assert result.num_divergences == 0
    # mean: within 4 Monte Carlo standard errors sd / sqrt(ESS)
    sd = covariance.diagonal().sqrt()
    assert torch.all((draws.mean(0) - mean).abs() < 4 * sd / ess.sqrt()), (draws.mean(0), mean)
    # covariance: Var[hat Σ_ij] ≈ (Σ_ii Σ_jj + Σ_ij²) / ESS for Gaussian draws
    estimate = torch.cov(draws.T)
    se = ((covariance.diagonal().outer(covariance.diagonal()) + covariance**2) / ess.min()).sqrt()
    assert torch.all((estimate - covariance).abs() < 4 * se), (estimate, covariance)


def test_result_holds_samples_stats_mcmc_and_time_by_chain():
    x, y, *_ = conjugate_problem()
    result = run_nuts(
        linear_bnn(x), x, y, num_samples=30, warmup_steps=20, num_chains=2, num_workers=1,
        seed=1, progress=False, init_steps=10,
    )  # fmt: skip
    assert result.samples["0.weight"].shape == (2, 30, 1, 3)
    assert result.samples["0.bias"].shape == (2, 30, 1)
    for name in ("lp", "diverging", "tree_depth", "n_steps", "step_size", "acceptance_rate"):
        assert result.sample_stats[name].shape == (2, 30), name
    assert len(result.mcmc) == 2 and result.wall_time > 0
    n_steps = result.sample_stats["n_steps"]
    # a tree of depth k has at most 2^k - 1 leapfrog steps
    assert torch.all(n_steps <= 2 ** result.sample_stats["tree_depth"] - 1)
    assert torch.all(n_steps >= 1)
    rate = result.sample_stats["acceptance_rate"]
    assert torch.all((rate >= 0) & (rate <= 1))
    # chains are seeded apart
    assert not torch.equal(result.samples["0.bias"][0], result.samples["0.bias"][1])


def test_same_seed_gives_the_same_draws():
    x, y, *_ = conjugate_problem()
    kwargs = dict(num_samples=10, warmup_steps=10, seed=3, progress=False, init_steps=5)
    a = run_nuts(linear_bnn(x), x, y, **kwargs)
    b = run_nuts(linear_bnn(x), x, y, **kwargs)
    assert torch.equal(a.samples["0.weight"], b.samples["0.weight"])


def test_jit_and_eager_potentials_agree():
    x, y, *_ = conjugate_problem()
    kwargs = dict(num_samples=5, warmup_steps=5, seed=2, progress=False, init="prior")
    a = run_nuts(linear_bnn(x), x, y, jit_compile=True, **kwargs)
    b = run_nuts(linear_bnn(x), x, y, jit_compile=False, **kwargs)
    assert torch.allclose(a.samples["0.weight"], b.samples["0.weight"], atol=1e-6)


def test_learned_noise_needs_a_choice_and_a_prior_samples_it():
    x, y, *_ = conjugate_problem()
    net = bbb.mlp([3, 1]).double()
    model = bbb.BNN(net, bbb.likelihoods.Gaussian().double(), num_data=len(x))
    with pytest.raises(ValueError, match="noise='fixed'"):
        run_nuts(model, x, y, num_samples=5, warmup_steps=5)
    prior = dist.LogNormal(torch.tensor(0.0, dtype=torch.float64), 1.0)
    result = run_nuts(
        model, x, y, num_samples=scaled(300, 1000), warmup_steps=200, seed=0, progress=False,
        noise=prior, init_steps=100,
    )  # fmt: skip
    scale = result.samples["likelihood.scale"]
    assert scale.shape == (1, result.num_samples) and bool((scale > 0).all())
    # the data's noise is 0.5; 30 points pin it to about ±0.07
    assert abs(float(scale.mean()) - 0.5) < 0.15
    fixed = run_nuts(
        model, x, y, num_samples=5, warmup_steps=5, noise="fixed", progress=False, init_steps=5
    )
    assert fixed.noise == "fixed" and fixed.noise_value == pytest.approx(1.0)
    assert "likelihood.scale" not in fixed.samples


def test_noise_is_refused_for_a_fixed_scale():
    x, y, *_ = conjugate_problem()
    with pytest.raises(ValueError, match="only for a Gaussian likelihood with a learned scale"):
        run_nuts(linear_bnn(x), x, y, num_samples=5, warmup_steps=5, noise="fixed")


def test_minibatched_model_is_refused():
    x, y, *_ = conjugate_problem()
    model = linear_bnn(x)
    with pytest.raises(ValueError, match="x has 20 rows but the model has num_data=30"):
        run_nuts(model, x[:20], y[:20], num_samples=5, warmup_steps=5)


def test_mismatched_x_and_y_are_refused():
    x, y, *_ = conjugate_problem()
    with pytest.raises(ValueError, match=r"same number of rows, got x \(30, 3\) and y \(29,\)"):
        run_nuts(linear_bnn(x), x, y[:-1], num_samples=5, warmup_steps=5)
    with pytest.raises(TypeError, match=r"y must be a torch\.Tensor"):
        run_nuts(linear_bnn(x), x, y.numpy(), num_samples=5, warmup_steps=5)


@pytest.mark.parametrize(
    ("option", "value"), [("num_samples", 0), ("warmup_steps", -1), ("num_chains", 1.5)]
)
def test_bad_counts_are_refused(option, value):
    x, y, *_ = conjugate_problem()
    kwargs = {"num_samples": 5, "warmup_steps": 5, option: value}
    with pytest.raises(ValueError, match=option):
        run_nuts(linear_bnn(x), x, y, **kwargs)


def test_classification_net_runs_in_spawned_workers():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = bbb.BNN(bbb.mlp([2, 3, 2], activation="tanh"), bbb.likelihoods.Categorical(), 40)
    result = run_nuts(
        model, x, y, num_samples=10, warmup_steps=10, num_chains=2, num_workers=2, seed=0,
        progress=False, init_steps=20, max_tree_depth=4,
    )  # fmt: skip
    assert result.samples["0.weight"].shape == (2, 10, 3, 2)
    assert result.mcmc == (None, None)  # MCMC objects stay in the workers
    assert torch.all(result.sample_stats["tree_depth"] <= 4)


def test_a_guide_gives_the_starts_and_the_initial_inverse_mass_matrix():
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    guide = exact_guide(model, x, y, mean, covariance)
    sites, *_ = flat_layout(model, x, y, None)
    starts, inverse_mass = guide_start(model, guide, x, y, sites, num_chains=3, num_draws=4000)
    assert starts.shape == (3, 4) and not torch.equal(starts[0], starts[1])
    # the variances of 4000 draws: within 4 standard errors sqrt(2 / 4000) (relative)
    assert torch.allclose(inverse_mass, covariance.diagonal(), rtol=4 * (2 / 4000) ** 0.5)
    result = run_nuts(
        model, x, y, num_samples=20, warmup_steps=20, num_chains=2, num_workers=1, seed=0,
        progress=False, init=guide,
    )  # fmt: skip
    assert result.samples["0.weight"].shape == (2, 20, 1, 3)
