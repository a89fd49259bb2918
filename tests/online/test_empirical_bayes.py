"""The stream's own hyperparameters: the noise, the prior's scale, and the evidence they use."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import MultivariateNormal

import pyro_bbb as bbb
from pyro_bbb.online import RVGA, LoFi, lofi, rvga
from pyro_bbb.online.empirical_bayes import NoiseEstimate

from ..problems import (
    NOISE,
    PRIOR_SCALE,
    conjugate_problem,
    design,
    linear_bnn,
    linear_posterior,
    random_conjugate_problem,
)
from .streams import at_prior_mean, relative_error, stream

RTOL = 1e-6
EXACT = [
    (LoFi, {"rank": 4}),
    (RVGA, {"linearised": True}),
]
IDS = ["lofi", "rvga"]


def test_the_noise_estimate_takes_what_the_errors_hold_beyond_the_belief():
    g = torch.Generator().manual_seed(0)
    estimate = NoiseEstimate(torch.tensor(4.0))
    for step in range(400):
        predicted = torch.full((10, 1), 1.0 / (1 + step))  # a belief that sharpens
        errors = (0.25 + predicted).sqrt() * torch.randn(10, 1, generator=g)
        estimate.proposal(errors.square(), predicted)
        estimate.accept()
    # σ² = 0.25; measured on seeds 0-9: 0.22 to 0.26 (the last steps weigh about 1/γ ≈ 36
    # minibatches of 10 errors)
    assert float(estimate.variance) == pytest.approx(0.25, rel=0.2)


def test_the_noise_estimate_stays_positive_and_is_taken_only_when_accepted():
    estimate = NoiseEstimate(torch.tensor(1.0))
    value = estimate.proposal(torch.full((1, 1), 0.5), torch.full((1, 1), 3.0))
    assert float(value) == pytest.approx(0.005)  # the floor: 1 % of the errors
    assert float(estimate.variance) == 1.0
    estimate.accept()
    assert float(estimate.variance) == pytest.approx(0.005)


@pytest.mark.parametrize(("make", "options"), EXACT, ids=IDS)
@pytest.mark.parametrize("batch", [1, 10])
def test_the_log_evidence_is_the_streams_exact_log_marginal_likelihood(make, options, batch):
    # by the chain rule, the one-step-ahead log-densities add up to log p(y_1:n)
    x, y, *_ = conjugate_problem(num_data=30)
    updater = make(linear_bnn(x), init_loc=at_prior_mean(x), **options)
    stream(updater, x, y, batch)
    features = design(x)
    covariance = PRIOR_SCALE**2 * features @ features.T
    covariance.diagonal().add_(NOISE**2)
    exact = MultivariateNormal(torch.zeros(30, dtype=x.dtype), covariance).log_prob(y)
    assert updater.log_evidence == pytest.approx(float(exact), rel=1e-9)


@pytest.mark.parametrize(
    ("shift", "state"),
    [
        (
            lofi.shift_prior,
            lofi.init(
                torch.tensor([0.5, -1.0, 2.0]).double(),
                torch.tensor([2.0, 3.0, 4.0]).double(),
                torch.tensor([[1.0], [0.5], [-1.0]]).double(),
                rank=1,
            ),
        ),
        (
            rvga.shift_prior,
            rvga.init(
                torch.tensor([0.5, -1.0, 2.0]).double(),
                torch.tensor([[1.0, 0.3, 0.0], [0.3, 2.0, 0.1], [0.0, 0.1, 0.5]]).double(),
            ),
        ),
    ],
    ids=IDS,
)
def test_a_shift_of_the_prior_adds_its_precision_and_moves_the_mean_exactly(shift, state):
    # the posterior of a linear-Gaussian model under prior precision P0 + D, from the one
    # under P0: precision + D, and mean (Λ + D)⁻¹(Λμ + D μ0)
    delta = torch.tensor([1.0, -0.5, 2.0]).double()
    anchor = torch.tensor([0.0, 1.0, -1.0]).double()
    moved = shift(state, delta, anchor)
    if shift is lofi.shift_prior:
        precision = torch.diag(state.precision_diag) + state.precision_factor @ (
            state.precision_factor.T
        )
        new = torch.diag(moved.precision_diag) + moved.precision_factor @ moved.precision_factor.T
    else:
        precision = torch.linalg.inv(state.covariance_root @ state.covariance_root.T)
        new = torch.linalg.inv(moved.covariance_root @ moved.covariance_root.T)
    torch.testing.assert_close(new, precision + torch.diag(delta))
    expected = torch.linalg.solve(new, precision @ state.mean + delta * anchor)
    torch.testing.assert_close(moved.mean, expected)


@pytest.mark.parametrize(("make", "options"), EXACT, ids=IDS)
def test_a_learned_prior_scale_gives_the_exact_posterior_under_the_scale_it_learned(make, options):
    # data whose weights are far smaller than a prior of scale 10 expects: the scale falls
    # (the multiplier of the prior's precision rises), and the belief is the closed-form
    # posterior under the prior it ends with
    g = torch.Generator().manual_seed(3)
    x = torch.randn(60, 3, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([0.1, -0.05, 0.08]).double() + NOISE * torch.randn(
        60, generator=g, dtype=torch.float64
    )
    net = bbb.mlp([3, 1], prior=bbb.priors.Gaussian(10.0)).double()
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(scale=NOISE).double(), num_data=60)
    updater = make(model, init_loc=at_prior_mean(x), learn_prior_scale=True, **options)
    fn = stream(updater, x, y, 5)
    alpha = updater.prior_scale
    assert alpha > 1.3  # measured: 1.65-1.67; the steps are slow on a stream of 12 minibatches
    prior_precision = torch.eye(4, dtype=torch.float64) * alpha / 100
    mean, covariance, _ = linear_posterior(
        x, y, torch.zeros(4, dtype=torch.float64), prior_precision
    )
    assert relative_error(fn.loc, mean) < RTOL
    assert relative_error(fn.covariance_matrix, covariance) < RTOL


def test_the_prior_scale_is_not_learned_unless_asked():
    x, y, *_ = conjugate_problem(num_data=10)
    updater = LoFi(linear_bnn(x), init_loc=at_prior_mean(x))
    updater.update(x, y)
    assert updater.prior_scale is None


@pytest.mark.parametrize("make", [LoFi, RVGA], ids=IDS)
def test_a_prior_scale_a_classifier_cannot_learn_is_refused(make):
    net = bbb.mlp([3, 2], prior=bbb.priors.Gaussian(1.0))
    model = bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=20)
    with pytest.raises(ValueError, match=r"learn_prior_scale=True.*Categorical.*=False"):
        make(model, learn_prior_scale=True)


def test_a_prior_scale_from_a_start_that_is_not_diagonal_is_refused():
    # a belief carried from a stream (W ≠ 0), a LowRankGuide's covariance, a full covariance:
    # no diagonal precision to scale. The option was ignored without a word before
    x, y, *_ = conjugate_problem(num_data=10)
    model = linear_bnn(x)
    updater = LoFi(model, init_loc=at_prior_mean(x), rank=2)
    updater.update(x, y)
    with pytest.raises(ValueError, match=r"learn_prior_scale=True.*rank 2.*MeanFieldGuide"):
        LoFi(model, updater.guide, learn_prior_scale=True, rank=2)
    full = RVGA(model, init_loc=at_prior_mean(x), linearised=True)
    full.update(x, y)
    with pytest.raises(ValueError, match=r"learn_prior_scale=True.*full covariance"):
        RVGA(model, full.guide, learn_prior_scale=True)
    low_rank = bbb.LowRankGuide(model, rank=2)
    low_rank(x, y)
    with pytest.raises(ValueError, match=r"learn_prior_scale=True.*LowRankGuide's covariance"):
        RVGA(model, low_rank, learn_prior_scale=True)
    mean_field = bbb.MeanFieldGuide(model)
    mean_field(x, y)
    assert LoFi(model, mean_field, learn_prior_scale=True).update(x, y).prior_scale is not None


def kalman_filter(x, y, prior_variance, noise, dynamics_noise, batch):
    """The exact Kalman filter for y = [x, 1]·w + ε on a random walk w_t = w_{t-1} + N(0, qI).

    Per minibatch: predict (P + qI), score y under N(Xμ, XPXᵀ + σ²I), update. Float64.
    Returns the log-evidence, the final mean and the final covariance.
    """
    features = design(x)
    d = features.shape[1]
    mean = torch.zeros(d, dtype=torch.float64)
    covariance = prior_variance * torch.eye(d, dtype=torch.float64)
    log_evidence = 0.0
    for start in range(0, len(x), batch):
        rows, targets = features[start : start + batch], y[start : start + batch]
        covariance = covariance + dynamics_noise * torch.eye(d, dtype=torch.float64)
        gain_inner = rows @ covariance @ rows.T + noise**2 * torch.eye(len(rows)).double()
        log_evidence += float(MultivariateNormal(rows @ mean, gain_inner).log_prob(targets))
        gain = covariance @ rows.T @ torch.linalg.inv(gain_inner)
        mean = mean + gain @ (targets - rows @ mean)
        covariance = covariance - gain @ rows @ covariance
    return log_evidence, mean, covariance


@pytest.mark.parametrize(("make", "options"), [(LoFi, {"rank": 5}), *EXACT[1:]], ids=IDS)
@pytest.mark.parametrize("dynamics_noise", [0.0, 0.01, 0.3])
@pytest.mark.parametrize("batch", [1, 7])
def test_the_filters_are_the_kalman_filter_on_a_linear_gaussian_stream(
    make, options, dynamics_noise, batch
):
    # 4 features and a bias, full rank: the linearised filters are the Kalman filter, the
    # one-step-ahead predictive included (it reads the belief after the drift, P + qI; it
    # read P before, and the log-evidence came out too high whenever q > 0)
    x, y, *_ = random_conjugate_problem(200, 4)
    start = at_prior_mean(x)
    updater = make(linear_bnn(x), init_loc=start, dynamics_noise=dynamics_noise, **options)
    fn = stream(updater, x, y, batch)
    exact = kalman_filter(x, y, PRIOR_SCALE**2, NOISE, dynamics_noise, batch)
    log_evidence, mean, covariance = exact
    assert updater.log_evidence == pytest.approx(log_evidence, rel=1e-9)
    assert relative_error(fn.loc, mean) < 1e-9
    assert relative_error(fn.covariance_matrix, covariance) < 1e-9
