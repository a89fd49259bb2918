"""The rows an automatic run holds out, and fit's validation option."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import pyro_bbb as bbb
from pyro_bbb.training.held_out import (
    MIN_HELD_OUT,
    check_validation,
    held_out_fraction,
    held_out_rows,
    held_out_split,
    hold_out,
)

from ..problems import linear_bnn, random_conjugate_problem


def test_the_held_out_rows_are_a_seeded_disjoint_split_of_every_row():
    train, held = hold_out(100, 10, seed=5)
    assert len(held) == 10 and len(train) == 90
    assert torch.equal(torch.cat([train, held]).sort().values, torch.arange(100))
    again = hold_out(100, 10, seed=5)
    assert torch.equal(again[1], held) and not torch.equal(hold_out(100, 10, seed=6)[1], held)


@pytest.mark.parametrize(
    ("num_data", "fraction", "count"),
    [(1000, 0.1, 100), (150, 0.1, 15), (60, 0.1, 0), (20, 0.5, 10), (19, 0.5, 0), (23, 0.5, 11)],
)
def test_too_few_rows_to_score_are_not_held_out(num_data, fraction, count):
    assert held_out_rows(num_data, fraction) == count
    assert count == 0 or count >= MIN_HELD_OUT


def test_a_split_draws_its_seed_when_the_fit_has_none():
    torch.manual_seed(0)
    train, held, seed = held_out_split(200, 0.1, None)
    assert isinstance(seed, int) and len(held) == 20 and len(train) == 180
    assert held_out_split(200, 0.0, None) == (None, None, None)


def test_the_default_holds_nothing_out_and_a_fraction_holds_out_tensor_rows_of_a_bnn():
    x, y, *_ = random_conjugate_problem(60, 2)
    model = linear_bnn(x)
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    assert held_out_fraction(model, x, None, None) == 0.0
    assert held_out_fraction(model, x, None, 0.2) == 0.2
    assert held_out_fraction(model, loader, None, None) == 0.0
    assert held_out_fraction(model, loader, None, 0) == 0.0
    assert held_out_fraction(model, loader, None, (x, y)) == 0.0  # scored as given
    assert held_out_fraction(model, x, None, (x, y)) == 0.0  # scored as given
    assert held_out_fraction(lambda x, y: None, x, None, None) == 0.0


def test_a_fraction_of_a_data_loader_s_rows_is_refused_naming_what_works():
    x, y, *_ = random_conjugate_problem(60, 2)
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    with pytest.raises(ValueError, match=r"validation=0.2 .* DataLoader's rows cannot be held"):
        held_out_fraction(linear_bnn(x), loader, None, 0.2)


@pytest.mark.parametrize("validation", [0.2, "pair"])
def test_validation_of_a_model_whose_predictive_cannot_be_scored_is_refused(validation):
    x, y, *_ = random_conjugate_problem(60, 2)
    validation = (x, y) if validation == "pair" else validation
    with pytest.raises(ValueError, match=r"validation=.* needs a network model.net .* function"):
        held_out_fraction(lambda x, y: None, x, None, validation)


@pytest.mark.parametrize(
    ("validation", "epochs", "error", "match"),
    [
        (0.1, 100, ValueError, r"validation= applies to a run of epochs=None"),
        (1.0, None, ValueError, r"validation must be a fraction of the rows in \[0, 0.5\]"),
        (0.6, None, ValueError, r"in \[0, 0.5\] \(the rest train\), got 0.6; .* \(x_val, y_val\)"),
        (-0.1, None, ValueError, r"in \[0, 0.5\] \(the rest train\), got -0.1"),
        ("10%", None, TypeError, r"validation must be a fraction .* got '10%'"),
        ((torch.zeros(3, 2), torch.zeros(4)), None, ValueError, r"as many rows each, got 3 and 4"),
    ],
)
def test_validation_refuses_what_it_cannot_use(validation, epochs, error, match):
    with pytest.raises(error, match=match):
        check_validation(validation, epochs)


def test_fit_names_the_bad_validation_argument():
    x, y, *_ = random_conjugate_problem(60, 2)
    model = linear_bnn(x)
    with pytest.raises(ValueError, match=r"validation must be a fraction of the rows"):
        bbb.fit(model, bbb.MeanFieldGuide(model), x, y, validation=2.0, progress=False)


@pytest.mark.parametrize("validation", [0.2, "pair"])
def test_validation_with_the_strict_rule_is_refused_since_it_scores_no_held_out_rows(validation):
    x, y, *_ = random_conjugate_problem(60, 2)
    validation = (x[:20], y[:20]) if validation == "pair" else validation
    with pytest.raises(ValueError, match=r'validation=.* until="converged" .* validation=None'):
        check_validation(validation, None, "converged")
    check_validation(None, None, "converged")
    check_validation(validation, None, "predictive")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"validation": 0.6}, r"validation must be a fraction of the rows in \[0, 0.5\]"),
        ({"validation": 0.2, "until": "converged"}, r'validation=0.2 .*until="converged"'),
        ({"validation": 0.2, "loader": True}, r"validation=0.2 .* DataLoader"),
    ],
)
def test_fit_refuses_a_validation_it_cannot_honour(options, match):
    x, y, *_ = random_conjugate_problem(1000, 2)
    model = linear_bnn(x)
    data = (
        (DataLoader(TensorDataset(x, y), batch_size=100),) if options.pop("loader", 0) else (x, y)
    )
    with pytest.raises(ValueError, match=match):
        bbb.fit(model, bbb.MeanFieldGuide(model), *data, progress=False, **options)


def test_a_fraction_that_holds_out_too_few_rows_to_score_warns_naming_it():
    with pytest.warns(UserWarning, match=r"validation=0.1 of 60 rows holds out 6, too few") as w:
        assert held_out_split(60, 0.1, 3) == (None, None, 3)
    assert len(w) == 1


def test_history_held_out_is_documented_as_counting_a_validation_pair_s_rows_too():
    # fit records a pair's rows in History.held_out (test_default_length's pair test); the
    # attribute's docstring must say so, not "rows held out ... 0 when none"
    section = bbb.History.__doc__.split("held_out:")[1].split("stopped:")[0]
    assert "(x_val, y_val)" in section and "nothing held out then" in section


def test_held_out_rows_are_scored_in_evaluation_mode_and_the_network_keeps_its_modes(
    monkeypatch,
):
    # a validation pass, as Keras' and Lightning's: before, the score ran a BatchNorm in
    # training mode, so it normalised each chunk of rows by the chunk's own statistics and
    # changed with how the rows were split
    from pyro_bbb.training import scoring

    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(
        nn.Linear(2, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.ReLU(), nn.Linear(8, 1)
    )
    model = bbb.BNN(bbb.bayesianize(net), bbb.likelihoods.Gaussian(scale=0.1), num_data=40)
    guide = bbb.MeanFieldGuide(model)
    x, y = torch.randn(40, 2), torch.randn(40)
    guide(x, y)
    model.train()
    score = scoring.HeldOutScore(x, y, seed=0)
    whole = score(model, guide)
    assert all(module.training for module in model.modules())  # given back
    monkeypatch.setattr(scoring, "_CHUNK", 7)
    assert score(model, guide) == pytest.approx(whole, abs=1e-5)  # rows split otherwise
    model.eval()
    assert score(model, guide) == pytest.approx(whole, abs=1e-5)  # what eval() gives
    assert not any(module.training for module in model.modules())
