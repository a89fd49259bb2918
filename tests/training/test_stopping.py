"""The rules that end an automatic run's stages, read off synthetic Histories."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.training.convergence import autocorrelation_time
from pyro_bbb.training.stopping import (
    DECAY_SHARE,
    FIT_TOLERANCE,
    MIN_FIT_SCORES,
    MIN_SCORES,
    TOLERANCE,
    Converges,
    StopsPaying,
    _change,
)

from ..problems import linear_bnn, random_conjugate_problem
from ..support import FULL


def _history(num_data=100, *, nll=None, kl=None, validation=None, plain=None):
    """A History whose scored lists are given (``nan`` where not scored)."""
    length = len(next(v for v in (nll, validation, plain) if v is not None))
    history = bbb.History(num_data=num_data, held_out=10)
    history.averaged_nll = list(nll) if nll is not None else [math.nan] * length
    history.averaged_kl = (
        list(kl) if kl is not None else [0.0 if nll is not None else math.nan] * length
    )
    history.validation = list(validation) if validation is not None else [math.nan] * length
    total = list(plain) if plain is not None else [0.0] * length
    history.nll, history.kl = total, [0.0] * length
    history.loss, history.beta, history.lr = total, [1.0] * length, [0.01] * length
    return history


def _every_third(values):
    """Scores read every third epoch, ``nan`` between."""
    return [v if (i + 1) % 3 == 0 else math.nan for i, v in enumerate(values)]


def test_the_likelihood_only_stage_goes_on_while_its_last_half_lowers_the_loss():
    # the beta = 1 loss per data point falls by 0.1 over the last half: still paying
    falling = np.linspace(3.0, 2.8, 24)
    verdict = StopsPaying().judge(_history(nll=falling), "fit", 0, 24, scored=False)
    assert not verdict.done and "fell by 0.104" in verdict.found


def test_the_likelihood_only_stage_ends_when_its_last_half_lowers_the_loss_by_little():
    # a fast fall, then a last half that lowers it by less than FIT_TOLERANCE a data point
    values = [3.0, 2.5, 2.2, 2.1, *np.linspace(2.1, 2.1 - FIT_TOLERANCE / 2, 4)]
    verdict = StopsPaying().judge(_history(nll=values), "fit", 0, 8, scored=False)
    assert verdict.done and "had stopped paying" in verdict.found


def test_a_loss_that_rises_again_ends_the_likelihood_only_stage():
    values = [3.0, 2.6, 2.5, 2.45, 2.44, 2.46, 2.5, 2.55]  # fitting the noise costs KL
    assert StopsPaying().judge(_history(nll=values), "fit", 0, 8, scored=False).done


def test_the_likelihood_only_stage_reads_its_sum_of_nll_and_kl():
    # the expected NLL falls, but the KL rises faster: the beta = 1 loss rises
    nll, kl = np.linspace(3.0, 2.0, 8), np.linspace(0.0, 1.5, 8)
    assert StopsPaying().judge(_history(nll=nll, kl=kl), "fit", 0, 8, scored=False).done
    assert not StopsPaying().judge(_history(nll=nll), "fit", 0, 8, scored=False).done


def test_a_stage_is_not_judged_on_fewer_scores_than_it_needs():
    flat = [2.0] * 3 * MIN_FIT_SCORES
    short = _every_third(flat)[: 3 * MIN_FIT_SCORES - 1]  # one score short
    verdict = StopsPaying().judge(_history(nll=short), "fit", 0, len(short), scored=False)
    assert not verdict.done and "read 3 time(s)" in verdict.found
    assert StopsPaying().judge(_history(nll=_every_third(flat)), "fit", 0, 12, False).done


def test_the_full_rate_stage_reads_the_held_out_rows_where_they_are_scored():
    rising = list(np.linspace(-1.0, -0.8, MIN_SCORES))  # still gaining 0.1 nats a row
    flat = [-0.8 + 0.001 * (-1) ** i for i in range(MIN_SCORES)]
    rule = StopsPaying()
    assert not rule.judge(_history(validation=rising), "train", 0, MIN_SCORES, True).done
    verdict = rule.judge(_history(validation=flat), "train", 0, MIN_SCORES, True)
    assert verdict.done and "held-out log-likelihood" in verdict.found
    assert f"less than {TOLERANCE:g}" in verdict.found


def test_the_full_rate_stage_reads_the_training_fit_where_nothing_is_held_out():
    # the expected log-likelihood (minus the averaged NLL) of the training sample
    improving = np.linspace(2.0, 1.8, MIN_SCORES)  # NLL falling by 0.1 over the last half
    declining = np.linspace(1.8, 1.9, MIN_SCORES)  # the posterior drifting towards the prior
    rule = StopsPaying()
    assert not rule.judge(_history(nll=improving), "train", 0, MIN_SCORES, False).done
    verdict = rule.judge(_history(nll=declining), "train", 0, MIN_SCORES, False)
    assert verdict.done and "expected log-likelihood" in verdict.found


def test_the_predictive_rules_decay_is_three_sevenths_of_the_run_before_it():
    length, floor = StopsPaying().decay_plan(_history(nll=[1.0]), 0, 700)
    assert length == math.ceil(DECAY_SHARE * 700) == 300 and floor == 0.01


def test_the_strict_rule_asks_for_the_convergence_check_on_the_last_half():
    rng = np.random.default_rng(0)
    flat = list(1000 + rng.normal(0, 1, 40))
    history = _history(plain=flat)
    assert Converges().judge(history, "train", 0, 40, False).done
    falling = list(np.linspace(1000, 900, 40) + rng.normal(0, 1, 40))
    verdict = Converges().judge(_history(plain=falling), "train", 0, 40, False)
    assert not verdict.done and "may still have been falling" in verdict.found


def test_a_long_stage_is_not_judged_every_epoch_and_the_strict_rule_less_often():
    strict = [n for n in range(1000, 2000) if Converges().due(n)]
    predictive = [n for n in range(1000, 2000) if StopsPaying().due(n)]
    assert len(strict) < len(predictive) < 100
    assert all(StopsPaying().due(n) for n in range(1, 100))


@pytest.mark.parametrize("rule", [StopsPaying(), Converges()])
def test_a_rule_reads_the_stage_it_is_asked_of_and_nothing_else(rule):
    # the verdict on epochs 20-59 is that of their record alone: what came before or after
    # them does not move it, and a record that differs inside them does
    rng = np.random.default_rng(0)
    inside = list(np.linspace(3.0, 2.9, 40) + rng.normal(0, 0.001, 40))

    def verdict(before, after, stage=inside):
        values = [*before, *stage, *after]
        history = _history(nll=values, validation=values, plain=[100 * v for v in values])
        history.kl = list(rng.normal(5.0, 0.01, len(values)))  # the strict rule's KL
        history.kl[20:60] = [5.0] * 40
        return rule.judge(history, "train", 20, 60, True)

    first = verdict([9.0] * 20, [])
    assert verdict(list(np.linspace(0.0, 1.0, 20)), [7.0] * 30) == first
    assert verdict([9.0] * 20, [], [5.0 - v for v in inside]) != first


def test_a_stretch_of_readings_changes_by_the_slope_over_the_intervals_they_close():
    # each reading closes a scoring interval: four readings of a line rising by one an
    # interval span four intervals (the first opened by the reading before them)
    assert _change([0.0, 1.0, 2.0, 3.0]) == pytest.approx(4.0)
    assert _change([5.0, 4.0]) == pytest.approx(-2.0)
    assert _change([7.0, 7.0, 7.0]) == 0.0


def test_the_strict_rules_decay_may_take_four_times_the_run_before_it():
    # 332 tau reaches the floor of 0.3 %, unless four times the run before it is shorter;
    # the cap was the run itself, which stopped a short run's rate at 1-2 % of lr, where a
    # LowRankGuide's sds still wander by several per cent
    rng = np.random.default_rng(0)
    for start in (50, 1000):
        history = _history(plain=[0.0] * start)
        history.kl = list(rng.normal(0, 1, start))
        tau = autocorrelation_time(history.kl[start // 2 :])
        planned, floor = Converges().decay_plan(history, 0, start)
        full = math.ceil(tau * (1 / 0.003 - 1))
        assert planned == (4 * start if start == 50 else full) == min(full, 4 * start)
        assert floor == pytest.approx(max(0.003, tau / (tau + planned)))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["lowrank", "meanfield"])
def test_the_strict_fit_meets_conjugate_posteriors_of_every_size_within_5_percent(family):
    # fit(model, guide, x, y, until="converged") with nothing else, on conjugate
    # regressions of 2-8 features and 60-1,000 points (low-rank at full rank; mean-field
    # against its own optimum). With the decay capped at the run before it, the low-rank
    # guide's sds came out up to 5.1 % off (8 x 1,000, problem and seed 6: a full-rate
    # stage of 200 epochs, the rate stopped at 0.7 % of lr); measured with the cap at four
    # times the run, over problems and seeds 0-3 of each size and 4-7 of 6 x 300 and
    # 8 x 1,000: within 3.0 % (low-rank) and 1.9 % (mean-field). The short form runs the
    # case that failed.
    cases = [("8x1000", 6)]
    if FULL:
        sizes = ("2x60", "3x150", "6x300", "8x1000")
        cases += [(size, seed) for size in sizes for seed in range(4)]
    for size, seed in cases:
        dim, num_data = map(int, size.split("x"))
        x, y, _, covariance, precision = random_conjugate_problem(num_data, dim, seed=seed)
        pyro.clear_param_store()
        pyro.set_rng_seed(seed)
        model = linear_bnn(x)
        if family == "lowrank":
            guide = bbb.LowRankGuide(model, rank=dim + 1)
            target = covariance.diagonal().sqrt()
        else:
            guide = bbb.MeanFieldGuide(model)
            target = precision.diagonal().rsqrt()
        bbb.fit(model, guide, x, y, seed=seed, progress=False, until="converged")
        marginals = guide.marginals()
        sd = torch.cat([marginals["0.weight"][1].reshape(-1), marginals["0.bias"][1]])
        assert (sd / target - 1).abs().max() < 0.05, (size, seed, sd / target - 1)
