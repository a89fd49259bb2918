"""The scores an automatic run reads: the iterate average, the training fit, held-out rows."""

from __future__ import annotations

import pyro
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.training.scoring import (
    AVERAGE_ETA,
    HeldOutScore,
    IterateAverage,
    SampleFit,
    score_every,
)

from ..problems import NOISE, PRIOR_SCALE, design, linear_bnn, random_conjugate_problem


def test_the_iterate_average_weighs_the_recent_iterates_as_polynomial_decay_averaging():
    param = torch.zeros(1)
    average = IterateAverage([param])
    iterates = torch.arange(1.0, 41.0)
    for value in iterates:
        param.fill_(value)
        average.update("train")
    # alpha_t = (eta + 1) / (t + eta): weights w_s = alpha_s * prod_{u > s} (1 - alpha_u)
    t = len(iterates)
    alphas = [(AVERAGE_ETA + 1) / (s + AVERAGE_ETA) for s in range(1, t + 1)]
    weights = [
        a * torch.prod(torch.tensor([1 - b for b in alphas[s + 1 :]])) for s, a in enumerate(alphas)
    ]
    expected = sum(w * v for w, v in zip(weights, iterates, strict=True))
    assert average.values[0].item() == pytest.approx(float(expected), rel=1e-5)
    assert sum(weights) == pytest.approx(1.0, rel=1e-5)
    # the last fifth carries most of the weight: a recent average, not the whole stage's
    assert sum(weights[-t // (AVERAGE_ETA + 1) :]) > 0.6


def test_the_average_restarts_with_each_stage_and_swaps_back_exactly():
    param = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    average = IterateAverage([param])
    average.update("fit")
    with torch.no_grad():
        param.add_(10.0)
    average.update("train")  # a new stage: the average is the current iterate
    assert torch.equal(average.values[0], param.detach())
    with torch.no_grad():
        param.add_(1.0)
    average.update("train")
    before = param.detach().clone()
    with pytest.raises(RuntimeError, match="inside"), average.swapped():
        assert not torch.equal(param.detach(), before)  # the average is in place
        raise RuntimeError("inside")
    assert torch.equal(param.detach(), before)  # put back, bit for bit, even on an error


def test_the_best_scoring_average_is_kept_survives_a_checkpoint_and_is_put_in_place():
    param = torch.nn.Parameter(torch.tensor([0.0]))
    average = IterateAverage([param])
    for step, score in zip([1.0, 2.0, 3.0], [-1.0, -0.5, float("nan")], strict=True):
        with torch.no_grad():
            param.fill_(step)
        average.update("train")
        average.keep_if_best(score, 1.0)  # the second is best; a score not read keeps nothing
    best = average.best[0].clone()
    assert torch.allclose(best, torch.tensor([1.0 + (2.0 - 1.0) * 5 / 6]))  # (eta+1)/(2+eta)
    again = IterateAverage([param])
    again.load_state_dict(average.state_dict())
    average.keep_if_best(-0.7, 1.0)  # worse: kept is kept
    assert average.restore_best() and torch.equal(param.detach(), best)
    assert not average.restore_best()  # put in place once
    assert torch.equal(again.best[0], best) and again.best_score == -0.5
    again.keep_if_best(-2.0, 0.5)  # another beta: another objective, the best starts again
    assert again.best_score == -2.0
    again.update("decay")  # a new stage forgets the last one's best
    assert again.best is None and not again.restore_best()


def _linear(num_data=2000, dim=3):
    x, y, *_ = random_conjugate_problem(num_data, dim)
    model = linear_bnn(x)
    guide = bbb.MeanFieldGuide(model, init_scale=0.3)
    guide(x, y)  # its parameters
    return model, guide, x, y


def test_the_training_fit_is_the_closed_form_expected_nll_and_kl_of_a_linear_model():
    # for y = Xw + b + noise and q(w) Gaussian, E_q[-log p(y | w)] and KL(q || p) are known
    model, guide, x, y = _linear()
    fit = SampleFit(x, y, num_data=len(x), seed=0)
    nll, kl = fit(model, guide)
    posterior = guide.posterior()
    loc = torch.cat([posterior["0.weight"].mean.reshape(-1), posterior["0.bias"].mean])
    var = torch.cat([posterior["0.weight"].variance.reshape(-1), posterior["0.bias"].variance])
    features = design(x)
    residual = y - features @ loc
    expected_sq = residual.pow(2) + features.pow(2) @ var  # E[(y - f(w))^2] row by row
    exact_nll = (expected_sq / (2 * NOISE**2)).mean() + torch.log(
        torch.tensor(NOISE * (2 * torch.pi) ** 0.5, dtype=torch.float64)
    )
    prior = torch.distributions.Normal(0.0, PRIOR_SCALE)
    q = torch.distributions.Normal(loc, var.sqrt())
    exact_kl = torch.distributions.kl_divergence(q, prior).sum() / len(x)
    assert kl == pytest.approx(float(exact_kl), rel=1e-6)
    # one draw per row (local reparameterisation): over 2,000 rows the estimate's relative
    # standard error is about 1 %
    assert nll == pytest.approx(float(exact_nll), rel=0.04)


def test_a_score_takes_the_same_draws_every_time_and_leaves_the_fits_random_stream():
    model, guide, x, y = _linear()
    fit = SampleFit(x, y, num_data=len(x), seed=3)
    held = HeldOutScore(x[:50], y[:50], seed=3)
    state = torch.get_rng_state()
    first = fit(model, guide), held(model, guide)
    assert torch.equal(torch.get_rng_state(), state)
    assert (fit(model, guide), held(model, guide)) == first


def test_a_held_out_score_is_the_log_predictive_density_of_its_rows():
    model, guide, x, y = _linear()
    held = HeldOutScore(x[:60], y[:60], seed=0)
    with torch.random.fork_rng():
        torch.manual_seed(held.seed)
        expected = bbb.predict(model, guide, x[:60], num_samples=8).log_likelihood(y[:60])
    assert held(model, guide) == pytest.approx(expected)


def test_a_score_leaves_batchnorm_running_statistics_as_they_were():
    pyro.set_rng_seed(0)
    net = bbb.bayesianize(
        torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    )
    x, y = torch.randn(64, 3), torch.randn(64)
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=64)
    guide = bbb.MeanFieldGuide(model)
    guide(x, y)
    buffers = {name: value.clone() for name, value in net.named_buffers()}
    assert any("running_mean" in name for name in buffers)
    SampleFit(x, y, num_data=64, seed=0)(model, guide)
    HeldOutScore(x, y, seed=0)(model, guide)
    assert all(torch.equal(value, buffers[name]) for name, value in net.named_buffers())


@pytest.mark.parametrize(("steps", "every"), [(1, 10), (3, 4), (10, 1), (938, 1)])
def test_scores_are_taken_at_least_ten_steps_apart(steps, every):
    assert score_every(steps) == every
