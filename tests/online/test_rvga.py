"""R-VGA: the Kalman filter on conjugate regression, whichever way it takes its expectations."""

from __future__ import annotations

import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.online import RVGA, rvga

from ..problems import conjugate_problem, exact_guide, linear_bnn, linear_posterior

RTOL = 1e-6


def _at_prior_mean(x):
    dim = x.shape[1]
    return {"0.weight": torch.zeros(1, dim, dtype=x.dtype), "0.bias": torch.zeros(1, dtype=x.dtype)}


def _stream(updater, x, y, batch):
    for start in range(0, len(x), batch):
        updater.update(x[start : start + batch], y[start : start + batch])
    return updater.guide.distribution()


def _relative(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize(
    "options",
    [
        {"linearised": True},
        {"num_samples": 2},
        {"num_samples": 10, "num_iterations": 3},
        {"linearised": True, "num_iterations": 2},
    ],
    ids=["linearised", "monte-carlo", "implicit", "linearised-implicit"],
)
@pytest.mark.parametrize("batch", [1, 10])
def test_conjugate_regression_streamed_gives_the_exact_posterior(options, batch):
    # mirrored draws average to the mean exactly, so even the Monte Carlo expectations are
    # exact on a linear model; every Gauss-Newton iterate of the implicit scheme is too
    x, y, mean, covariance, _ = conjugate_problem(num_data=30)
    model = linear_bnn(x)
    fn = _stream(RVGA(model, init_loc=_at_prior_mean(x), **options), x, y, batch)
    assert _relative(fn.loc, mean) < RTOL
    assert _relative(fn.covariance_matrix, covariance) < RTOL


def test_update_is_bayes_rule_on_both_of_its_paths():
    g = torch.Generator().manual_seed(0)
    d = 5
    state = rvga.init(
        torch.randn(d, generator=g, dtype=torch.float64),
        torch.rand(d, generator=g, dtype=torch.float64) + 0.5,
    )
    gradient = torch.randn(d, generator=g, dtype=torch.float64)
    for k in (2, 8):  # fewer rows than weights (k x k eigenproblem), and more (d x d Cholesky)
        rows = torch.randn(k, d, generator=g, dtype=torch.float64)
        new = rvga.update(state, gradient, rows)
        prior = state.covariance_root @ state.covariance_root.T
        covariance = torch.linalg.inv(torch.linalg.inv(prior) + rows.T @ rows)
        torch.testing.assert_close(new.covariance_root @ new.covariance_root.T, covariance)
        torch.testing.assert_close(new.mean, state.mean + covariance @ gradient)


def test_dynamics_noise_adds_to_the_covariance():
    state = rvga.init(torch.zeros(3, dtype=torch.float64), torch.tensor([1.0, 2.0, 3.0]).double())
    moved = rvga.predict(state, 0.5)
    torch.testing.assert_close(
        moved.covariance_root @ moved.covariance_root.T,
        torch.diag(torch.tensor([1.5, 2.5, 3.5])).double(),
    )


def test_a_low_rank_posterior_is_continued_exactly():
    x, y, mean, covariance, _ = conjugate_problem(num_data=30)
    model = linear_bnn(x)
    start = exact_guide(
        model,
        x[:15],
        y[:15],
        *linear_posterior(
            x[:15], y[:15], torch.zeros(4, dtype=torch.float64), torch.eye(4, dtype=torch.float64)
        )[:2],
    )
    fn = _stream(RVGA(model, start, linearised=True), x[15:], y[15:], 5)
    assert _relative(fn.loc, mean) < RTOL
    assert _relative(fn.covariance_matrix, covariance) < RTOL


def test_its_own_guide_must_be_full_rank():
    x, *_ = conjugate_problem()
    model = linear_bnn(x)
    with pytest.raises(ValueError, match="rank=None"):
        RVGA(model, bbb.LowRankPrecisionGuide(model, rank=2))


def test_options_are_checked():
    x, *_ = conjugate_problem()
    model = linear_bnn(x)
    with pytest.raises(ValueError, match="even"):
        RVGA(model, num_samples=3)
    with pytest.raises(ValueError, match="num_iterations"):
        RVGA(model, num_iterations=0)
    with pytest.raises(ValueError, match="dynamics_noise"):
        RVGA(model, dynamics_noise=-1.0)
