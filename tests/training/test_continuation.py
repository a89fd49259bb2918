"""Tests of pyro_bbb.training.continuation: a fitted guide given to fit again goes on."""

from __future__ import annotations

import pyro
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.training.continuation import DECAYED, ContinuedRate, FitEnd

N = 40


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.linspace(-2, 2, N).unsqueeze(-1)
    return x, torch.sin(2 * x.squeeze(-1)) + 0.1 * torch.randn(N, generator=g)


def _fresh(name: str | None = None):
    """A model and guide as a user's script builds them, in an empty param store."""
    pyro.clear_param_store()
    torch.manual_seed(1)  # the network's initialisation
    model = bbb.BNN(bbb.mlp([1, 8, 1], activation="tanh"), bbb.likelihoods.Gaussian(), num_data=N)
    return model, bbb.MeanFieldGuide(model, name=name)


def _fit(model, guide, **options):
    x, y = _data()
    return bbb.fit(model, guide, x, y, progress=False, **{"seed": 0, **options})


def test_a_fitted_guide_continues_an_automatic_run_at_its_final_beta_and_rate():
    model, guide = _fresh()
    first = _fit(model, guide, max_steps=1_000)
    assert first.stage[0] == "fit" and first.stage[-1] == "decay"  # a whole automatic run
    ended = dict(guide.fit_end)
    second = _fit(model, guide, max_steps=1_000, seed=1)
    # no likelihood-only stage and no warm-up: beta at its final value from the first step
    assert second.continues == ended and ended["epochs"] == len(first)
    assert second.stage[0] == "train" and set(second.stage) <= {"train", "decay"}
    assert second.beta == [1.0] * len(second)
    # the rate where the first left it (one step an epoch: an epoch's rate is its step's)
    assert second.lr[0] == pytest.approx(first.lr[-1], rel=1e-9)
    assert first.lr[-1] <= DECAYED * first.lr[0]  # decayed already: neither halved nor decayed
    assert max(second.lr) == pytest.approx(min(second.lr), rel=1e-9)
    assert second.stopped.startswith(f"continued a fit of {len(first):,} epochs")
    assert "continued" in repr(second)
    assert guide.fit_end["epochs"] == len(second)  # the guide now records the second fit


class _StopAt(bbb.Callback):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_epoch_end(self, epoch, history):
        return epoch == self.epoch


def test_a_run_stopped_at_the_full_rate_continues_there_then_decays():
    model, guide = _fresh()
    first = _fit(model, guide, max_steps=2_000, beta=1.0, callbacks=[_StopAt(99)])
    assert first.stage[-1] == "train" and len(first) == 100  # stopped before its decay
    second = _fit(model, guide, max_steps=2_000, seed=1)
    assert second.lr[0] == pytest.approx(first.lr[-1], rel=1e-9)
    assert second.stage[0] == "train" and second.stage[-1] == "decay"
    assert second.lr[-1] < second.lr[0]  # halved or decayed from where the first left it


def test_a_fixed_run_of_a_fitted_guide_holds_its_final_beta_and_rate():
    model, guide = _fresh()
    first = _fit(model, guide, epochs=30)
    assert first.beta[0] == 0.0 and first.lr[-1] < DECAYED * first.lr[0]
    second = _fit(model, guide, epochs=10)
    assert second.continues["epochs"] == 30
    assert second.beta == [1.0] * 10
    assert second.lr == pytest.approx([first.lr[-1]] * 10, rel=1e-9)


def test_a_continued_rate_above_the_floor_is_held_then_decayed_to_it():
    rate = ContinuedRate(10, 0.5)
    assert rate(0) == rate(7) == 0.5
    assert rate(10) == pytest.approx(0.01)  # the floor: 1 % of the base rate
    assert ContinuedRate(10, 0.012)(10) == 0.012  # at the floor already: held


def test_beta_and_lr_given_to_a_continued_fit_are_followed_as_given():
    model, guide = _fresh()
    _fit(model, guide, epochs=30)
    second = _fit(model, guide, epochs=10, beta=0.5, lr=3e-3, lr_schedule=1.0)
    assert second.continues is not None
    assert second.beta == [0.5] * 10
    assert second.lr == pytest.approx([3e-3] * 10, rel=1e-9)


def test_a_users_final_beta_is_where_the_next_fit_continues():
    model, guide = _fresh()
    _fit(model, guide, epochs=10, beta=0.25)
    assert guide.fit_end["beta"] == 0.25
    assert _fit(model, guide, epochs=5).beta == [0.25] * 5


def test_a_new_guide_starts_over():
    model, guide = _fresh()
    _fit(model, guide, max_steps=300)
    model, guide = _fresh()  # pyro.clear_param_store() and a new guide: a fresh start
    history = _fit(model, guide, max_steps=300)
    assert history.continues is None and history.stage[0] == "fit" and history.beta[0] == 0.0


def test_a_guide_whose_record_is_cleared_keeps_its_values_and_starts_its_schedule_over():
    model, guide = _fresh()
    _fit(model, guide, epochs=30)
    fitted = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
    guide.fit_end = None
    history = _fit(model, guide, epochs=1, lr=1e-12)  # a step that moves nothing measurably
    assert history.continues is None and history.beta == [0.0]
    for name, value in pyro.get_param_store().items():
        assert torch.allclose(value.detach(), fitted[name], atol=1e-9), name


def test_a_guide_record_that_is_not_one_is_refused_naming_it():
    model, guide = _fresh()
    guide.fit_end = {"beta": 1.0}
    with pytest.raises(ValueError, match=r"guide.fit_end must be the record fit leaves"):
        _fit(model, guide, epochs=2)


@pytest.mark.parametrize("length", [{"epochs": 8}, {"max_steps": 400}], ids=["fixed", "automatic"])
def test_a_continued_fit_resumes_from_its_checkpoint_bit_for_bit(tmp_path, length):
    def continued(**options):
        model, guide = _fresh()
        _fit(model, guide, epochs=20)
        return _fit(model, guide, batch_size=10, seed=5, **length, **options)

    full = continued()
    full_store = {k: v.detach().clone() for k, v in pyro.get_param_store().items()}
    path = tmp_path / "fit.pt"
    cut = continued(checkpoint=path, callbacks=[_StopAt(3)])
    assert len(cut) == 4 < len(full)
    # a new process: fresh model and guide, holding no record; the checkpoint carries it
    model, guide = _fresh()
    history = _fit(model, guide, batch_size=10, seed=5, resume=path, **length)
    assert history.continues == full.continues and history.continues["epochs"] == 20
    for name in ("loss", "beta", "lr", "stage"):
        assert getattr(history, name) == getattr(full, name), name
    for name, value in pyro.get_param_store().items():
        assert torch.equal(value.detach(), full_store[name]), name


def test_the_record_holds_plain_values_only():
    model, guide = _fresh()
    _fit(model, guide, epochs=3)
    assert set(guide.fit_end) == set(FitEnd.__annotations__)
    assert all(v is None or isinstance(v, (int, float, str)) for v in guide.fit_end.values())
