"""The convergence check: trends on block means, the window it reads, fit's warning."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyro
import pytest

import pyro_bbb as bbb
from pyro_bbb.training import History
from pyro_bbb.training.convergence import (
    MIN_WINDOW,
    ConvergenceWarning,
    autocorrelation_time,
    check_convergence,
    trend,
)

from ..problems import (
    conjugate_problem,
    exact_guide,
    linear_bnn,
    optimal_mean_field,
    random_conjugate_problem,
)
from ..support import scaled


def _history(plain, kl=None, beta=None, lr=None):
    """A History whose plain loss is ``plain`` (nll = plain - kl)."""
    n = len(plain)
    kl = np.zeros(n) if kl is None else np.asarray(kl, float)
    history = History(num_data=100)
    history.kl = list(map(float, kl))
    history.nll = list(map(float, np.asarray(plain, float) - kl))
    history.loss = list(history.nll)
    history.beta = [1.0] * n if beta is None else list(beta)
    history.lr = [0.01] * n if lr is None else list(lr)
    return history


def test_a_straight_line_changes_by_its_slope_times_the_epochs_with_no_error():
    line = trend(3.0 - 0.5 * np.arange(40))
    assert line.change == pytest.approx(-0.5 * 40)
    assert line.se == pytest.approx(0.0, abs=1e-9) and line.scatter == pytest.approx(0.0, abs=1e-9)
    assert line.fall_bound() == pytest.approx(20) and line.moving()
    assert line.dof == pytest.approx(38)


def test_a_window_shorter_than_the_minimum_is_refused():
    with pytest.raises(ValueError, match=f"at least {MIN_WINDOW} epochs, got 9"):
        trend(np.arange(9.0))
    with pytest.raises(ValueError, match="finite"):
        trend([1.0] * 11 + [math.nan])


def test_noise_without_a_trend_is_almost_never_called_moving():
    # White noise and an AR(1) wander of autocorrelation time 9 (neighbouring epochs alike,
    # as parameters at a constant rate). 400 series each; measured 0 and 0 of 400.
    rng = np.random.default_rng(0)
    false = 0
    for _ in range(400):
        white = rng.normal(size=200)
        wander = np.zeros(200)
        for t in range(1, 200):
            wander[t] = 0.8 * wander[t - 1] + rng.normal()
        false += trend(white).moving() + trend(wander).moving()
    assert false / 800 < 0.01


def test_the_bound_on_the_fall_covers_the_true_fall_95_times_in_100():
    # a fall of 4 over the window under unit noise, white and autocorrelated (AR(1), tau 9)
    rng = np.random.default_rng(1)
    white, wander = 0, 0
    for _ in range(400):
        noise = np.zeros(200)
        for t in range(1, 200):
            noise[t] = 0.8 * noise[t - 1] + 0.6 * rng.normal()
        line = -0.02 * np.arange(200)
        white += trend(rng.normal(size=200) + line).fall_bound() >= 4
        wander += trend(noise + line).fall_bound() >= 4
    assert white / 400 > 0.9 and wander / 400 > 0.85


def test_the_autocorrelation_time_of_an_ar1_series_is_one_plus_phi_over_one_minus_phi():
    rng = np.random.default_rng(2)
    x = np.zeros(20_000)
    for t in range(1, len(x)):
        x[t] = 0.8 * x[t - 1] + rng.normal()
    assert autocorrelation_time(x) == pytest.approx(9.0, rel=0.2)
    assert autocorrelation_time(rng.normal(size=5000)) == pytest.approx(1.0, abs=0.2)
    assert autocorrelation_time(np.ones(20)) == 1.0


def test_the_check_reads_the_last_half_of_the_full_rate_epochs_at_the_final_beta():
    # beta ramps over epochs 0-39, the rate holds to epoch 99 and then decays: the check
    # reads epochs 70-99, where a falling loss is found although the end is flat.
    beta = list(np.minimum(1.0, np.arange(200) / 40))
    lr = [0.01] * 100 + list(0.004 / (1 + 99 * np.arange(100) / 100))
    plain = np.concatenate([1000 - 2.0 * np.arange(100), np.full(100, 800.0)])
    convergence = check_convergence(_history(plain, beta=beta, lr=lr))
    assert convergence.window == (70, 99)
    assert not convergence.converged
    assert "may still have been falling over epochs 70-99" in convergence.message
    flat = check_convergence(_history(np.full(200, 800.0), beta=beta, lr=lr))
    assert flat.converged and flat.window == (70, 99)


def test_a_moving_kl_under_a_flat_loss_is_not_converged():
    rng = np.random.default_rng(3)
    kl = 40 + 0.01 * np.arange(100) + 0.01 * rng.normal(size=100)
    convergence = check_convergence(_history(800 + rng.normal(size=100), kl=kl))
    assert not convergence.converged and "the KL was still rising" in convergence.message


def test_a_run_too_short_to_read_is_not_converged():
    convergence = check_convergence(_history(np.arange(5.0)))
    assert not convergence.converged and convergence.window is None
    assert "5 epoch(s) at its final beta, too few" in convergence.message
    with pytest.raises(ValueError, match="no epoch"):
        check_convergence(History(num_data=1))


def _conjugate_fit(epochs, **options):
    x, y, *_ = random_conjugate_problem(1000, 8)
    pyro.set_rng_seed(0)
    model = linear_bnn(x)
    return bbb.fit(
        model, bbb.MeanFieldGuide(model), x, y, epochs=epochs, seed=0, progress=False, **options
    )


@pytest.mark.parametrize("family", ["meanfield", "lowrank"])
def test_a_fit_cut_short_warns_saying_what_fell_and_what_to_change(family):
    # 8 features, 1,000 points, 50 epochs: the scales 3-16 times too wide, the means 120-145
    # posterior sds off (benchmarks/convergence.py, four seeds); the loss falls by thousands
    # of nats in a noise of thousands, so only a bound on its fall tells it has not stopped
    x, y, *_ = random_conjugate_problem(1000, 8)
    pyro.set_rng_seed(0)
    model = linear_bnn(x)
    guide = bbb.LowRankGuide(model, rank=9) if family == "lowrank" else bbb.MeanFieldGuide(model)
    match = r'still have been falling .*epochs=None with until="converged"'
    with pytest.warns(ConvergenceWarning, match=match) as w:
        history = bbb.fit(model, guide, x, y, epochs=50, seed=0, progress=False)
    assert len(w) == 1 and w[0].filename == __file__
    assert history.converged is False and history.convergence.window == (25, 35)


@pytest.mark.parametrize("family", ["meanfield", "lowrank"])
def test_a_fit_at_the_optimum_is_silent(family):
    # Known converged: started at the optimum (mean-field's closed form, or the exact
    # posterior), beta = 1 at a constant rate. The first epochs are Adam's jolt from fresh
    # moments; the check reads the second half. Seeds 0-7 measured silent.
    x, y, mean, covariance, precision = conjugate_problem(num_data=150)
    for seed in range(scaled(2, 8)):
        pyro.clear_param_store()
        model = linear_bnn(x)
        if family == "lowrank":
            guide = exact_guide(model, x, y, mean, covariance)
        else:
            guide = optimal_mean_field(model, x, y, mean, precision)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConvergenceWarning)
            history = bbb.fit(
                model, guide, x, y, epochs=600, beta=1.0, lr_schedule=1.0, seed=seed,
                progress=False,
            )  # fmt: skip
        assert history.converged and history.convergence.window == (300, 599)


def test_history_records_the_check_and_every_epochs_stage():
    x, y, *_ = random_conjugate_problem(60, 2)
    model = linear_bnn(x)
    history = bbb.fit(model, bbb.MeanFieldGuide(model), x, y, epochs=3, progress=False)
    assert history.stage == ["", "", ""] and history.as_dict()["stage"] == history.stage
    assert history.converged is False and not History(num_data=1).converged


def test_the_advice_names_the_strict_run_for_convergence_not_the_default_length():
    # epochs=None alone stops on the predictive (until="predictive"): the check's advice must
    # send a user after convergence to until="converged", and not say epochs=None gets there
    message = check_convergence(_history([1.0, 1.0, 1.0])).message
    assert 'until="converged", which trains until this check passes' in message
    assert "epochs=None, which trains until this check passes" not in message
    assert "epochs=None alone stops once more training stops improving the predictive" in message
