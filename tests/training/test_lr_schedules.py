"""Learning-rate schedules: CosineDecay's shape, fit applying them, History.lr, bad input."""

from __future__ import annotations

import itertools
import math
from functools import partial

import pyro
import pytest
import torch
from torch.optim.lr_scheduler import StepLR

import pyro_bbb as bbb
from pyro_bbb.infer import LowRankGuide, MeanFieldGuide
from pyro_bbb.training import CosineDecay, InverseTimeDecay
from pyro_bbb.training.lr_schedules import LRSchedule

from ..problems import conjugate_problem, linear_bnn
from ..support import scaled


def _fit(epochs=6, **options):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 2, generator=g)
    y = x.sum(-1) + 0.1 * torch.randn(24, generator=g)
    model = bbb.BNN(bbb.mlp([2, 4, 1]), bbb.likelihoods.Gaussian(), num_data=24)
    guide = bbb.MeanFieldGuide(model)
    return bbb.fit(model, guide, x, y, epochs=epochs, lr=0.02, seed=0, progress=False, **options)


def test_cosine_decay_holds_then_falls_along_a_half_cosine_to_its_floor():
    decay = CosineDecay(100, start=0.5, floor=0.01)
    assert decay(0) == decay(50) == 1.0
    assert decay(75) == pytest.approx((1 + 0.01) / 2)
    assert decay(100) == pytest.approx(0.01)
    assert decay(1000) == pytest.approx(0.01)
    values = [decay(t) for t in range(50, 101)]
    assert all(a > b for a, b in itertools.pairwise(values))


def test_inverse_time_decay_holds_then_falls_as_one_over_the_steps_to_its_floor():
    decay = InverseTimeDecay(100, start=0.5, floor=0.01)
    assert decay(0) == decay(50) == 1.0
    assert decay(75) == pytest.approx(1 / (1 + 99 * 0.5))
    assert decay(100) == pytest.approx(0.01)
    assert decay(1000) == pytest.approx(0.01)


def test_fit_decays_the_rate_by_default_over_the_last_thirty_percent():
    history = _fit(epochs=10, batch_size=12)  # two steps an epoch: t = epoch, epoch + 1/2
    decay = InverseTimeDecay(10, start=0.7)
    expected = [0.02 * (decay(e) + decay(e + 0.5)) / 2 for e in range(10)]
    assert history.lr == pytest.approx(expected, rel=1e-12)
    assert history.lr[:7] == [0.02] * 7
    assert history.lr[-1] < 0.02 / 10


def test_a_number_is_a_constant_factor():
    assert _fit(lr_schedule=1.0).lr == [0.02] * 6
    assert _fit(lr_schedule=0.5).lr == pytest.approx([0.01] * 6)


def test_a_callable_of_the_epoch_sets_the_rate_before_each_step():
    history = _fit(lr_schedule=lambda t: 1 / (1 + t))
    assert history.lr == pytest.approx([0.02 / (1 + e) for e in range(6)])


def test_a_torch_scheduler_class_is_built_on_the_optimiser_and_stepped_every_epoch():
    history = _fit(lr_schedule=partial(StepLR, step_size=2, gamma=0.5))
    assert history.lr == pytest.approx([0.02, 0.02, 0.01, 0.01, 0.005, 0.005])


def test_a_decayed_rate_moves_the_parameters_less():
    # the same noise, a rate of 0 after the first epoch: the guide stops changing
    frozen = _fit(lr_schedule=lambda t: 1.0 if t < 1 else 0.0)
    assert frozen.lr[1:] == [0.0] * 5
    assert len(set(frozen.kl[2:])) == 1  # analytic KL of unchanged parameters


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("cosine", TypeError, "lr_schedule must be a number, a callable"),
        (lambda t: "fast", TypeError, "must return a number"),
        (lambda t: -1.0, ValueError, r"lr_schedule\(0.0\) must be a finite number >= 0"),
        (lambda optimizer: StepLR(optimizer, 2), TypeError, "functools.partial"),
        (-0.5, ValueError, "lr_schedule must be a finite number >= 0"),
        (math.nan, ValueError, "lr_schedule must be a finite number >= 0"),
    ],
)
def test_bad_schedules_are_refused_naming_lr_schedule(spec, error, match):
    with pytest.raises(error, match=match):
        _fit(lr_schedule=spec)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"start": 1.0}, "start must be in"),
        ({"floor": 2.0}, "floor must be in"),
        ({"floor": 0.0}, "floor must be in"),
    ],
)
@pytest.mark.parametrize("decay", [CosineDecay, InverseTimeDecay])
def test_decays_refuse_bad_options(decay, options, match):
    with pytest.raises(ValueError, match=match):
        decay(10, **options)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["lowrank", "meanfield"])
def test_at_fits_defaults_the_conjugate_posteriors_scales_are_within_5_percent(family):
    # 3 features and a bias, 150 points, known noise: the exact posterior is known. The
    # low-rank guide (rank 4 = the block's size) can represent it exactly; mean-field's own
    # optimum has the exact means and variances 1 / diag(precision) (Bishop 2006, §10.1.2).
    # fit's defaults: the decayed rate, and 8 particles on a network of 4 weights. Measured
    # over sixteen seeds: within 3.8 % (low-rank) and 3.4 % (mean-field), means within
    # 0.06 sd; one particle leaves 6.8 % and 8.6 % (docs/concepts.md).
    x, y, mean, covariance, precision = conjugate_problem(num_data=150)
    target = covariance.diagonal().sqrt() if family == "lowrank" else precision.diagonal().rsqrt()
    for seed in range(scaled(1, 8)):
        pyro.clear_param_store()
        model = linear_bnn(x)
        guide = LowRankGuide(model, rank=4) if family == "lowrank" else MeanFieldGuide(model)
        history = bbb.fit(model, guide, x, y, epochs=3000, seed=seed, progress=False)
        assert history.num_particles == 8
        marginals = guide.marginals()
        loc = torch.cat([marginals["0.weight"][0].reshape(-1), marginals["0.bias"][0]])
        sd = torch.cat([marginals["0.weight"][1].reshape(-1), marginals["0.bias"][1]])
        assert (sd / target - 1).abs().max() < 0.05, (seed, sd / target - 1)
        assert ((loc - mean).abs() / target).max() < 0.15, (seed, (loc - mean) / target)


# --- rates held in tensors (the static and captured step) --------------------------------------


@pytest.mark.parametrize(
    "spec",
    [InverseTimeDecay(4), partial(StepLR, step_size=1, gamma=0.5)],
    ids=["callable", "torch"],
)
def test_rates_held_in_tensors_move_in_place_and_read_as_numbers(spec):
    params = [torch.zeros(3, requires_grad=True)]
    as_numbers = LRSchedule(spec, torch.optim.Adam(params, lr=0.02, fused=True))
    held = LRSchedule(spec, torch.optim.Adam(params, lr=0.02, fused=True))
    held.hold_in_tensors()
    assert held.holds_in_tensors and not as_numbers.holds_in_tensors
    rate = held.optimizer.param_groups[0]["lr"]
    assert isinstance(rate, torch.Tensor) and rate.dtype == torch.float64  # on the CPU: exact
    for epoch in range(4):
        for i in range(3):
            as_numbers.before_step(epoch + i / 3)
            held.before_step(epoch + i / 3)
            assert held.lr == as_numbers.lr
            assert held.optimizer.param_groups[0]["lr"] is rate  # the same tensor, moved
            assert rate.item() == as_numbers.lr
        for schedule in (as_numbers, held):
            schedule.optimizer.step()  # no gradients: nothing moves, but torch expects it
            schedule.after_epoch()
    assert held.lr == as_numbers.lr
    # what a checkpoint holds: the rates as numbers, loadable by an optimiser without tensors
    group = held.optimizer.state_dict()["param_groups"][0]
    assert group["lr"] == as_numbers.lr and not isinstance(group["lr"], torch.Tensor)
    assert all(not isinstance(r, torch.Tensor) for r in held.state_dict().get("_last_lr", []))
    fresh = torch.optim.Adam(params, lr=1.0, fused=True)
    fresh.load_state_dict(held.optimizer.state_dict())
    assert fresh.param_groups[0]["lr"] == as_numbers.lr
    # loaded back, the rates are numbers again: a captured step must know
    held.optimizer.load_state_dict(held.optimizer.state_dict())
    assert not held.holds_in_tensors


def test_a_rate_given_as_a_tensor_starts_every_factor_from_its_first_value():
    params = [torch.zeros(3, requires_grad=True)]
    optim = torch.optim.Adam(params, lr=torch.tensor(0.1), fused=True)
    schedule = LRSchedule(lambda epoch: 0.5, optim)
    for epoch in range(3):
        schedule.before_step(epoch)
    assert optim.param_groups[0]["lr"].item() == pytest.approx(0.05)
