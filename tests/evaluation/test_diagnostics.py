"""Diagnostics: PSIS k̂ of a guide, ESS and R̂ of a NUTS run."""

from __future__ import annotations

import matplotlib
import pytest

from pyro_bbb.evaluation import effective_sample_size, psis_khat, r_hat

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
