"""LoFi: exact on conjugate regression at full rank, closer to it as the rank grows."""

from __future__ import annotations

import itertools

import pyro
import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence

import pyro_bbb as bbb
from pyro_bbb.online import LoFi, lofi
from pyro_bbb.priors import FanInGaussian

from ..problems import (
    NOISE,
    conjugate_problem,
    linear_bnn,
    linear_posterior,
    wide_conjugate_problem,
)
from .streams import at_prior_mean, relative_error, stream

RTOL = 1e-6


@pytest.mark.parametrize("rank", [4, 6])
@pytest.mark.parametrize("batch", [1, 10])
@pytest.mark.parametrize(
    "options",
    [{}, {"num_iterations": 3}, {"num_samples": 4}],
    ids=["lofi", "iterated", "monte-carlo"],
)
def test_rank_at_least_the_weights_gives_the_exact_posterior(rank, batch, options):
    # on a linear model every Gauss-Newton iterate is exact, and mirrored draws average to
    # the mean, so the iterated and the sampled (BONG) steps are exact too
    x, y, mean, covariance, _ = conjugate_problem(num_data=30)
    model = linear_bnn(x)
    fn = stream(LoFi(model, rank=rank, init_loc=at_prior_mean(x), **options), x, y, batch)
    assert relative_error(fn.loc, mean) < RTOL
    assert relative_error(fn.covariance_matrix, covariance) < RTOL


def test_the_kl_to_the_exact_posterior_shrinks_as_the_rank_grows():
    x, y, mean, covariance, _ = wide_conjugate_problem(num_data=60, dim=11)
    exact = MultivariateNormal(mean, covariance)
    kls = []
    for rank in (0, 1, 2, 4, 8, 12):
        pyro.clear_param_store()
        fn = stream(LoFi(linear_bnn(x), rank=rank, init_loc=at_prior_mean(x)), x, y, 1)
        kls.append(float(kl_divergence(MultivariateNormal(fn.loc, fn.covariance_matrix), exact)))
    assert all(a >= b for a, b in itertools.pairwise(kls)), kls
    assert kls[0] > 1 and kls[-1] < 1e-9, kls


def test_update_adds_the_curvature_to_the_precision_and_takes_a_newton_step():
    g = torch.Generator().manual_seed(0)
    d, rank, k = 6, 6, 3
    state = lofi.init(
        torch.randn(d, generator=g, dtype=torch.float64),
        torch.rand(d, generator=g, dtype=torch.float64) + 1,
        torch.randn(d, 2, generator=g, dtype=torch.float64),
        rank=rank,
    )
    rows = torch.randn(k, d, generator=g, dtype=torch.float64)
    gradient = torch.randn(d, generator=g, dtype=torch.float64)
    new = lofi.update(state, gradient, rows)
    before = torch.diag(state.precision_diag) + state.precision_factor @ state.precision_factor.T
    after = torch.diag(new.precision_diag) + new.precision_factor @ new.precision_factor.T
    torch.testing.assert_close(after, before + rows.T @ rows)
    torch.testing.assert_close(new.mean, state.mean + torch.linalg.solve(after, gradient))


def test_projection_keeps_the_diagonal_of_the_precision():
    g = torch.Generator().manual_seed(1)
    d = 9
    state = lofi.init(
        torch.zeros(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64), rank=2
    )
    rows = torch.randn(5, d, generator=g, dtype=torch.float64)
    new = lofi.update(state, torch.zeros(d, dtype=torch.float64), rows)
    full = 1 + rows.square().sum(0)
    kept = new.precision_diag + new.precision_factor.square().sum(1)
    torch.testing.assert_close(kept, full)
    assert new.precision_factor.shape == (d, 2)


def test_init_brings_a_wider_factor_to_the_rank_keeping_the_diagonal():
    g = torch.Generator().manual_seed(3)
    factor = torch.randn(8, 5, generator=g, dtype=torch.float64)
    diag = torch.ones(8, dtype=torch.float64)
    state = lofi.init(torch.zeros(8, dtype=torch.float64), diag, factor, rank=2)
    assert state.precision_factor.shape == (8, 2)
    kept = state.precision_diag + state.precision_factor.square().sum(1)
    torch.testing.assert_close(kept, diag + factor.square().sum(1))
    # the kept part is the best rank-2 approximation of WWᵀ
    eigenvalues = torch.linalg.eigvalsh(factor @ factor.T)
    top = state.precision_factor @ state.precision_factor.T
    torch.testing.assert_close(torch.linalg.eigvalsh(top)[-2:], eigenvalues[-2:])


def test_dynamics_noise_adds_to_the_covariance_exactly():
    g = torch.Generator().manual_seed(2)
    d = 7
    state = lofi.init(
        torch.zeros(d, dtype=torch.float64),
        torch.rand(d, generator=g, dtype=torch.float64) + 0.5,
        torch.randn(d, 3, generator=g, dtype=torch.float64),
        rank=3,
    )
    moved = lofi.predict(state, 0.3)
    covariance = torch.linalg.inv(
        torch.diag(state.precision_diag) + state.precision_factor @ state.precision_factor.T
    )
    after = torch.diag(moved.precision_diag) + moved.precision_factor @ moved.precision_factor.T
    torch.testing.assert_close(torch.linalg.inv(after), covariance + 0.3 * torch.eye(d).double())


def test_a_mean_field_posterior_is_continued_exactly():
    x, y, *_ = conjugate_problem(num_data=30)
    model = linear_bnn(x)
    start = bbb.MeanFieldGuide(model)
    start(x, y)
    prior_mean = torch.tensor([0.5, -1.0, 0.2, 0.1], dtype=torch.float64)
    prior_std = torch.tensor([0.3, 0.4, 0.5, 0.6], dtype=torch.float64)
    with torch.no_grad():
        start.locs.get_submodule("0").weight.copy_(prior_mean[:3].reshape(1, 3))
        start.locs.get_submodule("0").bias.copy_(prior_mean[3:])
        rho = torch.log(torch.expm1(prior_std - start.min_scale))
        start.rhos.get_submodule("0").weight.copy_(rho[:3].reshape(1, 3))
        start.rhos.get_submodule("0").bias.copy_(rho[3:])
    fn = stream(LoFi(model, start, rank=4), x, y, 5)
    mean, covariance, _ = linear_posterior(x, y, prior_mean, torch.diag(prior_std**-2))
    assert relative_error(fn.loc, mean) < RTOL
    assert relative_error(fn.covariance_matrix, covariance) < RTOL


def test_a_low_rank_guide_is_refused_with_the_reason():
    x, y, *_ = conjugate_problem()
    model = linear_bnn(x)
    guide = bbb.LowRankGuide(model, rank=2)
    guide(x, y)
    with pytest.raises(ValueError, match="precision form"):
        LoFi(model, guide, rank=4)


def test_its_own_guide_of_another_rank_is_refused():
    x, _, *_ = conjugate_problem()
    model = linear_bnn(x)
    with pytest.raises(ValueError, match="rank 3"):
        LoFi(model, bbb.LowRankPrecisionGuide(model, rank=3), rank=4)


def _wave(seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    y = (torch.sin(2 * x) + 0.3 * x + 0.1 * torch.randn(n, 1, generator=g)).squeeze(-1)
    return x, y


def test_a_nonlinear_regression_stream_is_learned_in_one_pass():
    # measured on seeds 0-5 (600 points, [1, 30, 1] tanh, rank 10, learned noise): prior
    # predictive -1.83 to -1.57 nats per point, after the stream 0.07 to 0.39, noise σ 0.13 to
    # 0.22 (the data's is 0.1; the rest is what one pass leaves unfitted)
    x, y = _wave(0, 600)
    x_test, y_test = _wave(100, 300)
    model = bbb.BNN(
        bbb.mlp([1, 30, 1], activation="tanh", prior=FanInGaussian(2.0)),
        bbb.likelihoods.Gaussian(),
        num_data=len(x),
    )
    updater = LoFi(model, rank=10)
    before = bbb.predict(model, updater.guide, x_test, num_samples=100).log_likelihood(y_test)
    stream(updater, x, y, 10)
    after = bbb.predict(model, updater.guide, x_test, num_samples=100).log_likelihood(y_test)
    assert before < -1.2 and after > -0.3, (before, after)
    assert 0.08 < float(updater.noise_scale) < 0.3


def test_a_classification_stream_is_learned_in_one_pass():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 2.0], [2.0, -1.0], [-2.0, -1.0]])
    labels = torch.randint(0, 3, (600,), generator=g)
    x = centres[labels] + 0.8 * torch.randn(600, 2, generator=g)
    model = bbb.BNN(
        bbb.mlp([2, 16, 3], prior=FanInGaussian(1.0)), bbb.likelihoods.Categorical(), num_data=600
    )
    updater = _stream_and_return(LoFi(model, rank=5), x[:500], labels[:500])
    prediction = bbb.predict(model, updater.guide, x[500:], num_samples=100)
    accuracy = float((prediction.predicted == labels[500:]).double().mean())
    assert accuracy > 0.9, accuracy  # measured on seeds 0-5: 0.96 to 1.0


def _stream_and_return(updater, x, y, batch=10):
    stream(updater, x, y, batch)
    return updater


def test_the_noise_scale_is_written_to_the_likelihood():
    x, y, *_ = wide_conjugate_problem(num_data=400, dim=3, seed=4)
    model = bbb.BNN(
        bbb.mlp([3, 1]).double(), bbb.likelihoods.Gaussian(init_scale=2.0).double(), num_data=400
    )
    updater = _stream_and_return(LoFi(model, rank=4), x, y)
    learned = float(model.likelihood.scale.detach())
    assert float(updater.noise_scale) == pytest.approx(learned, rel=1e-12)
    # measured on seeds 0-5: 0.46 to 0.57 for σ = 0.5
    assert learned == pytest.approx(NOISE, rel=0.2)


def test_damped_iterations_approach_the_one_step_posterior():
    # step size s: each iterate closes a fraction s of the gap to the exact one-step mean
    x, y, *_ = conjugate_problem(num_data=10)
    prior_mean = torch.zeros(4, dtype=torch.float64)
    mean, _, _ = linear_posterior(x, y, prior_mean, torch.eye(4, dtype=torch.float64))
    errors = []
    for iterations in (1, 2, 4):
        model = linear_bnn(x)
        updater = LoFi(
            model, rank=4, init_loc=at_prior_mean(x), num_iterations=iterations, step_size=0.5
        )
        updater.update(x, y)
        errors.append(relative_error(updater.state.mean, mean))
    assert errors[0] == pytest.approx(0.5 * relative_error(prior_mean, mean), rel=1e-6)
    assert errors[2] < errors[1] < errors[0]


def test_the_update_options_are_checked():
    x, *_ = conjugate_problem()
    model = linear_bnn(x)
    with pytest.raises(ValueError, match="num_iterations"):
        LoFi(model, num_iterations=0)
    with pytest.raises(ValueError, match="even"):
        LoFi(model, num_samples=3)
    with pytest.raises(ValueError, match=r"step_size must be in \(0, 1\], got 1.5"):
        LoFi(model, step_size=1.5)
