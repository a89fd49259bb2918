"""fit's default number of particles: by what the guide draws, recorded, and overridable."""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoDelta, AutoNormal

import pyro_bbb as bbb
from pyro_bbb.training.particles import default_num_particles, draw_size


def _data(features, n=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    return x, x.sum(-1) + 0.1 * torch.randn(n, generator=g)


def _model(sizes, n=32):
    return bbb.BNN(bbb.mlp(sizes), bbb.likelihoods.Gaussian(), num_data=n)


def _set_up(guide, x, y):
    guide(x, y)
    return guide


@pytest.fixture(autouse=True)
def _clear():
    pyro.clear_param_store()


@pytest.mark.parametrize(
    ("draws", "rows", "particles"),
    [
        (4, 150, 8),  # the conjugate problem: 600 a sample
        (751, 32, 8),  # 24,032: 10 would fit, 8 is the most
        (2_651, 40, 2),  # 106,040
        (2_651, 33, 2),
        (2_651, 32, 3),  # 84,832
        (2_651, 100, 1),  # 265,100: over 2**18 alone
        (478_410, 1, 1),
        (0, 1000, 1),  # a point estimate draws nothing
    ],
)
def test_the_default_keeps_weights_times_rows_within_2_to_the_18_and_at_most_8(
    draws, rows, particles
):
    assert default_num_particles(draws, rows) == particles


@pytest.mark.parametrize(
    ("sizes", "weights"), [([3, 1], 4), ([13, 50, 1], 751), ([64, 110, 1], 7_261)]
)
def test_the_draws_of_a_mean_field_guide_are_the_networks_weights(sizes, weights):
    x, y = _data(sizes[0])
    guide = _set_up(bbb.MeanFieldGuide(_model(sizes)), x, y)
    assert draw_size(guide, x, y) == weights


def test_a_low_rank_block_counts_once_and_an_ensemble_counts_every_member():
    x, y = _data(13)
    model = _model([13, 50, 1])  # 751 weights
    low_rank = _set_up(bbb.LowRankGuide(model, rank=4), x, y)
    assert draw_size(low_rank, x, y) == 751  # the block; its per-weight slices are Deltas
    ensemble = _set_up(bbb.Ensemble(model, bbb.MeanFieldGuide, k=5), x, y)
    assert draw_size(ensemble, x, y) == 5 * 751


@pytest.mark.parametrize("make", [AutoDelta, bbb.DeltaGuide], ids=["AutoDelta", "DeltaGuide"])
def test_a_point_estimate_draws_nothing(make):
    x, y = _data(3)
    model = _model([3, 1])
    guide = _set_up(make(model), x, y)
    assert draw_size(guide, x, y) == 0


def test_counting_changes_no_random_state_and_no_parameter():
    x, y = _data(3)
    model = _model([3, 4, 1])
    guide = _set_up(AutoNormal(model), x, y)
    before = {name: value.detach().clone() for name, value in pyro.get_param_store().items()}
    state = torch.get_rng_state()
    assert draw_size(guide, x, y) == 3 * 4 + 4 + 4 + 1
    assert torch.equal(torch.get_rng_state(), state)
    for name, value in pyro.get_param_store().items():
        assert torch.equal(value.detach(), before[name])


@pytest.mark.parametrize(
    ("sizes", "rows", "batch_size", "passed", "taken"),
    [
        ([3, 1], 32, None, None, 8),
        ([3, 1], 32, None, 1, 1),
        ([3, 1], 32, None, 3, 3),
        ([13, 50, 1], 400, None, None, 1),  # 751 weights on 400 rows: 300,400
        ([13, 50, 1], 400, 100, None, 3),  # on minibatches of 100: 75,100
    ],
)
def test_fit_records_the_number_it_took(sizes, rows, batch_size, passed, taken):
    x, y = _data(sizes[0], rows)
    model = _model(sizes, rows)
    guide = bbb.MeanFieldGuide(model)
    history = bbb.fit(
        model, guide, x, y, epochs=1, batch_size=batch_size, num_particles=passed, seed=0,
        progress=False,
    )  # fmt: skip
    assert history.num_particles == taken


@pytest.mark.parametrize("make", [bbb.MeanFieldGuide, AutoNormal], ids=["fused", "traced"])
def test_the_default_draws_as_many_particles_as_passing_that_number_does(make):
    # the same steps, the same draws: num_particles=None is fit with the resolved number,
    # also where Pyro's ELBO traces the model and guide (its plates set up with one particle)
    x, y = _data(3)
    results = []
    for passed in (None, 8):
        pyro.clear_param_store()
        torch.manual_seed(0)  # the network's initialisation, drawn before fit seeds anything
        model = _model([3, 4, 1])
        guide = make(model)
        history = bbb.fit(
            model, guide, x, y, epochs=5, num_particles=passed, seed=0, progress=False
        )
        params = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
        results.append((history.loss, params))
    (loss_default, default), (loss_eight, eight) = results
    assert loss_default == loss_eight
    assert default.keys() == eight.keys()
    for name in default:
        assert torch.equal(default[name], eight[name]), name


@pytest.mark.parametrize("bad", [0, -1, 1.5, "4"])
def test_a_bad_number_of_particles_is_refused_naming_num_particles(bad):
    x, y = _data(3)
    model = _model([3, 1])
    with pytest.raises(ValueError, match="num_particles must be a positive int"):
        bbb.fit(model, bbb.MeanFieldGuide(model), x, y, epochs=1, num_particles=bad)
