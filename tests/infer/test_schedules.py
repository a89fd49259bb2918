"""Tests of pyro_bbb.infer.schedules: β schedules follow their formulas, reject bad input."""

from __future__ import annotations

import math

import pytest

from pyro_bbb.infer import (
    ConstantBeta,
    CyclicalAnnealing,
    LinearWarmup,
    SigmoidWarmup,
    as_schedule,
    delayed_warmup,
)


def test_schedules_follow_their_formulas():
    assert ConstantBeta(0.3)(123.0) == 0.3
    linear = LinearWarmup(10)
    assert [linear(t) for t in (0, 2.5, 10, 50)] == [0.0, 0.25, 1.0, 1.0]
    assert LinearWarmup(4, start=0.5, end=1.0)(2) == 0.75
    delayed = LinearWarmup(10, delay=20)
    assert [delayed(t) for t in (0, 19.9, 20, 25, 30, 99)] == [0.0, 0.0, 0.0, 0.5, 1.0, 1.0]
    sigmoid = SigmoidWarmup(midpoint=20, steepness=0.5)
    assert sigmoid(20) == 0.5
    assert sigmoid(30) == pytest.approx(1 / (1 + math.exp(-5)))
    assert sigmoid(-1e6) == 0.0
    cyclical = CyclicalAnnealing(cycle_length=10, ratio=0.5)
    assert [cyclical(t) for t in (0, 2.5, 5, 9, 10, 12.5)] == [0.0, 0.5, 1.0, 1.0, 0.0, 0.5]
    assert isinstance(as_schedule(0.5), ConstantBeta)


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: ConstantBeta(-0.1), "beta"),
        (lambda: LinearWarmup(0), "warmup"),
        (lambda: LinearWarmup(5, delay=-1), "delay"),
        (lambda: SigmoidWarmup(3, steepness=0), "steepness"),
        (lambda: CyclicalAnnealing(0), "cycle_length"),
        (lambda: CyclicalAnnealing(5, ratio=1.5), "ratio"),
        (lambda: as_schedule("fast"), "beta"),
    ],
)
def test_schedules_reject_invalid_parameters_naming_them(make, argument):
    with pytest.raises((ValueError, TypeError), match=argument):
        make()


def test_delayed_warmup_holds_beta_at_zero_for_a_quarter_and_reaches_one_at_half_way():
    schedule = delayed_warmup(400)
    assert [schedule(t) for t in (0, 99, 100, 150, 200, 399)] == [0, 0, 0, 0.5, 1, 1]
    with pytest.raises(ValueError, match="hold"):
        delayed_warmup(100, hold=0.8, ramp=0.5)
