"""Tests of pyro_bbb.training.checkpoint: fit's checkpoints, resuming bit for bit, bad input."""

from __future__ import annotations

import random
from functools import partial

import numpy as np
import pyro
import pytest
import torch
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

import pyro_bbb as bbb
from pyro_bbb.infer import LinearWarmup
from pyro_bbb.io import files
from pyro_bbb.training.checkpoint import get_rng_state, pair_fingerprint, set_rng_state
from pyro_bbb.training.lr_schedules import CosineDecay

from .test_auto_epochs import _record

N = 48


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=g)
    return x, torch.sin(x.sum(-1)) + 0.1 * torch.randn(N, generator=g)


def _fresh(guide: str = "meanfield", sizes=(2, 8, 1)):
    """A model and guide built as a user's script builds them, in an empty param store."""
    pyro.clear_param_store()
    torch.manual_seed(1)  # the network's initialisation
    model = bbb.BNN(bbb.mlp(list(sizes)), bbb.likelihoods.Gaussian(), num_data=N)
    if guide == "lowrank":
        return model, bbb.LowRankGuide(model, rank=2)
    if guide == "ensemble":
        return model, bbb.Ensemble(model, lambda m: bbb.LowRankGuide(m, rank=2), k=3)
    return model, bbb.MeanFieldGuide(model)


def _store() -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in pyro.get_param_store().items()}


def _fit(model, guide, epochs, x=None, y=None, **options):
    if x is None:
        x, y = _data()
    # schedules drawn over the whole run, as an interrupted fit of 6 epochs draws them
    schedules = {"beta": LinearWarmup(5), "lr_schedule": CosineDecay(6, start=0.2)}
    options = {"batch_size": 12, "seed": 3, **schedules, **options}
    return bbb.fit(model, guide, x, y, epochs=epochs, **options)


CASES = {
    "meanfield": ("meanfield", {}),
    "lowrank": ("lowrank", {}),
    "meanfield-flipout-2-particles": ("meanfield", {"reparam": "flipout", "num_particles": 2}),
    "torch-scheduler": ("meanfield", {"lr_schedule": partial(StepLR, step_size=2, gamma=0.5)}),
    "ensemble": ("ensemble", {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_resume_equals_the_uninterrupted_fit_bit_for_bit(tmp_path, case):
    kind, options = CASES[case]
    full_history = _fit(*_fresh(kind), 6, **options)
    full = _store()
    path = tmp_path / "fit.pt"
    first = _fit(*_fresh(kind), 3, checkpoint=path, **options)
    assert 0 < first.beta[-1] < 1  # the cut is mid-warm-up: β(t) = t / 5
    assert first.lr[-1] < first.lr[0]  # and mid-decay of the learning rate
    history = _fit(*_fresh(kind), 6, resume=path, **options)
    resumed = _store()
    assert resumed.keys() == full.keys()
    for name, value in full.items():
        assert torch.equal(resumed[name], value), name
    for name in ("loss", "nll", "kl", "beta", "lr", "steps"):
        assert getattr(history, name) == getattr(full_history, name), name


def test_resume_continues_a_shuffled_dataloader_bit_for_bit(tmp_path):
    x, y = _data()

    def run(epochs, **options):
        model, guide = _fresh()
        torch.manual_seed(7)  # the loader draws its order from torch's global generator
        loader = DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True)
        # schedules of their own: the default ones are drawn over the run's `epochs`
        schedules = {"beta": LinearWarmup(5), "lr_schedule": CosineDecay(4)}
        bbb.fit(model, guide, loader, epochs=epochs, seed=None, **schedules, **options)
        return _store()

    full = run(4)
    run(2, checkpoint=tmp_path / "c.pt")
    resumed = run(4, resume=tmp_path / "c.pt")
    assert all(torch.equal(resumed[n], v) for n, v in full.items())


def test_resume_and_checkpoint_may_name_the_same_file(tmp_path):
    path = tmp_path / "fit.pt"
    _fit(*_fresh(), 2, checkpoint=path)
    history = _fit(*_fresh(), 4, checkpoint=path, resume=path)
    assert len(history) == 4
    assert len(files.read_file(path, argument="path")["history"]["loss"]) == 4


def test_checkpoints_are_written_every_k_epochs_and_at_the_end(tmp_path, monkeypatch):
    written = []
    original = files.write_atomic

    def recording(path, kind, payload):
        written.append(len(payload["history"]["loss"]))
        original(path, kind, payload)

    monkeypatch.setattr("pyro_bbb.training.checkpoint.write_atomic", recording)
    _fit(*_fresh(), 5, checkpoint=tmp_path / "c.pt", checkpoint_every=2)
    assert written == [2, 4, 5]


def test_a_callback_stopping_early_still_leaves_a_checkpoint_of_what_was_done(tmp_path):
    class StopAfterTwo(bbb.Callback):
        def on_epoch_end(self, epoch, history):
            return epoch == 1

    path = tmp_path / "c.pt"
    _fit(*_fresh(), 10, checkpoint=path, checkpoint_every=5, callbacks=[StopAfterTwo()])
    assert len(files.read_file(path, argument="path")["history"]["loss"]) == 2


def test_resume_to_the_epochs_already_done_returns_the_history_without_a_step(tmp_path):
    path = tmp_path / "c.pt"
    done = _fit(*_fresh(), 3, checkpoint=path)
    history = _fit(*_fresh(), 3, resume=path)
    assert history.loss == done.loss and history.steps == done.steps


def test_a_checkpoint_holds_every_state_a_resume_needs(tmp_path):
    path = tmp_path / "c.pt"
    _fit(*_fresh(), 2, checkpoint=path)
    payload = files.read_file(path, argument="path", kind="checkpoint")
    assert payload["pyro_bbb"] == "checkpoint"
    assert {"MeanFieldGuide.locs.0.weight", "likelihood.scale"} <= payload["params"].keys()
    assert payload["optimizer_class"] == "Adam" and payload["optimizer"]["state"]
    assert payload["history"]["steps"] == [4, 8] and payload["order_seed"] == 3
    assert payload["world_size"] == 1 and len(payload["rng"]) == 1
    assert {"torch", "random", "numpy"} <= payload["rng"][0].keys()


def test_random_states_round_trip_through_a_weights_only_file(tmp_path):
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    np.random.standard_normal()  # leaves a cached Gaussian in NumPy's state
    files.write_atomic(tmp_path / "rng.pt", "checkpoint", {"rng": get_rng_state()})
    expected = (torch.rand(3), random.random(), np.random.standard_normal(2))
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"])
    drawn = (torch.rand(3), random.random(), np.random.standard_normal(2))
    assert torch.equal(drawn[0], expected[0]) and drawn[1] == expected[1]
    assert np.array_equal(drawn[2], expected[2])


def test_a_write_that_fails_midway_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    _fit(*_fresh(), 2, checkpoint=path)
    before = path.read_bytes()

    def killed(obj, file):
        file.write(b"PK\x03\x04 half a zip")  # what a process killed mid-write leaves
        raise KeyboardInterrupt

    monkeypatch.setattr("pyro_bbb.io.files.torch.save", killed)
    with pytest.raises(KeyboardInterrupt):
        _fit(*_fresh(), 4, checkpoint=path, resume=path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize("every", [0, -1, 1.5])
def test_checkpoint_every_must_be_a_positive_int(tmp_path, every):
    with pytest.raises(ValueError, match=r"checkpoint_every must be a positive int"):
        _fit(*_fresh(), 2, checkpoint=tmp_path / "c.pt", checkpoint_every=every)


def test_checkpoint_every_without_checkpoint_is_an_error():
    with pytest.raises(ValueError, match=r"checkpoint_every=2 needs checkpoint=PATH"):
        _fit(*_fresh(), 2, checkpoint_every=2)


def test_a_checkpoint_in_a_missing_folder_is_an_error_before_training(tmp_path):
    with pytest.raises(ValueError, match=r"checkpoint=.*folder .* does not exist"):
        _fit(*_fresh(), 2, checkpoint=tmp_path / "missing" / "c.pt")


def test_resume_with_fewer_epochs_than_done_is_an_error_naming_epochs(tmp_path):
    _fit(*_fresh(), 3, checkpoint=tmp_path / "c.pt")
    with pytest.raises(ValueError, match=r"epochs=2 is fewer than the 3 epochs already done"):
        _fit(*_fresh(), 2, resume=tmp_path / "c.pt")


@pytest.mark.parametrize(
    ("written", "resumed", "message"),
    [
        ({}, {"batch_size": 24}, r"batch_size=12; this one has batch_size=24"),
        ({}, {"batch_size": None}, r"batch_size=12; this one has batch_size=None"),
        ({}, {"num_particles": 2}, r"num_particles=None; this one has num_particles=2"),
        ({"num_particles": 1}, {"num_particles": None}, r"num_particles=1; this one has"),
        ({}, {"reparam": "local"}, r"reparam=None; this one has reparam='local'"),
        ({"reparam": "flipout"}, {"reparam": "local"}, r"reparam='flipout'; this one has"),
        ({}, {"shuffle": False}, r"shuffle=True; this one has shuffle=False"),
    ],
)
def test_resume_with_another_step_option_is_an_error_naming_both_values(
    tmp_path, written, resumed, message
):
    path = tmp_path / "c.pt"
    _fit(*_fresh(), 2, checkpoint=path, **written)
    before = files.read_file(path, argument="path")
    with pytest.raises(ValueError, match=rf"resume=.* was written by a fit with {message}"):
        _fit(*_fresh(), 4, resume=path, **{**written, **resumed})
    # refused before a step: the file, and the fresh guide, are as they were
    assert len(files.read_file(path, argument="path")["history"]["loss"]) == 2
    assert before["options"] == {
        "batch_size": 12,
        "shuffle": True,
        "num_particles": None,  # the request: None resolves the same way on resume
        "reparam": None,
        "lr": None,
        "own_rate": True,
        "lr_schedule": "CosineDecay(epochs=6, start=0.2, floor=0.01)",
        **written,
    }


def test_a_dataloader_checkpoint_records_the_loaders_batch_size(tmp_path):
    x, y = _data()
    path = tmp_path / "c.pt"
    bbb.fit(*_fresh(), DataLoader(TensorDataset(x, y), batch_size=12), epochs=1, checkpoint=path)
    other = DataLoader(TensorDataset(x, y), batch_size=16)
    with pytest.raises(ValueError, match=r"batch_size=12; this one has batch_size=16"):
        bbb.fit(*_fresh(), other, epochs=2, resume=path)


def test_a_checkpoint_without_options_still_resumes(tmp_path):
    # checkpoints written before the options were recorded have no "options" entry
    path = tmp_path / "c.pt"
    _fit(*_fresh(), 2, checkpoint=path)
    payload = files.read_file(path, argument="path")
    del payload["options"]
    files.write_atomic(path, files.CHECKPOINT, payload)
    assert len(_fit(*_fresh(), 3, resume=path, batch_size=24)) == 3


def test_resume_from_another_model_is_an_error_naming_resume_and_the_site(tmp_path):
    _fit(*_fresh(), 2, checkpoint=tmp_path / "c.pt")
    model, guide = _fresh(sizes=(2, 5, 1))
    with pytest.raises(
        ValueError, match=r"resume=.* different architecture: site '0.weight' has shape \(8, 2\)"
    ):
        _fit(model, guide, 4, resume=tmp_path / "c.pt")
    assert len(pyro.get_param_store()) > 0  # set up, but nothing copied (no error above)


def test_resume_from_another_guide_is_an_error_naming_resume(tmp_path):
    _fit(*_fresh(), 2, checkpoint=tmp_path / "c.pt")
    with pytest.raises(ValueError, match=r"resume=.*LowRankGuide"):
        _fit(*_fresh("lowrank"), 4, resume=tmp_path / "c.pt")


def test_resume_with_another_data_set_size_is_an_error(tmp_path):
    _fit(*_fresh(), 2, checkpoint=tmp_path / "c.pt")
    pyro.clear_param_store()
    model = bbb.BNN(bbb.mlp([2, 8, 1]), bbb.likelihoods.Gaussian(), num_data=N - 8)
    x, y = _data()
    with pytest.raises(ValueError, match=r"resume=.*data set of 48 points; this fit has 40"):
        _fit(model, bbb.MeanFieldGuide(model), 4, resume=tmp_path / "c.pt", x=x[8:], y=y[8:])


def test_resume_from_a_saved_model_is_an_error_naming_resume(tmp_path):
    model, guide = _fresh()
    _fit(model, guide, 1)
    bbb.save(tmp_path / "m.pt", model, guide)
    with pytest.raises(ValueError, match=r"resume=.* holds a saved model"):
        _fit(*_fresh(), 2, resume=tmp_path / "m.pt")


def test_resume_from_a_missing_file_is_an_error_naming_resume(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"resume=.*no such file"):
        _fit(*_fresh(), 2, resume=tmp_path / "nothing.pt")


def _automatic(path, *, validation=None, stop=None, resume=None):
    """Two epochs of an automatic run (a callback stops it), or its resume."""

    class Stop(bbb.Callback):
        def on_epoch_end(self, epoch, history):
            return epoch == stop

    x, y = _data()
    return bbb.fit(
        *_fresh(), x, y, seed=3, progress=False, validation=validation, checkpoint=path,
        resume=resume, callbacks=[Stop()] if stop is not None else [], max_steps=8,
    )  # fmt: skip


def _pair(shift: float = 0.0):
    x, y = _data()
    return x[:16] + shift, y[:16]


@pytest.mark.parametrize(
    ("written", "resumed", "message"),
    [
        (
            "pair",
            None,
            r"with validation=\(x_val, y_val\) of 16 rows, sha256 \w+; this one has none",
        ),
        (
            "pair",
            "other",
            r"with validation=.* of 16 rows, sha256 \w+; this one has validation=.* of 16",
        ),
        (None, "pair", r"with no validation pair; this one has validation=\(x_val, y_val\) of 16"),
    ],
)
def test_resume_with_a_validation_pair_the_checkpoint_did_not_record_is_refused(
    tmp_path, written, resumed, message
):
    # the pair's scores end an automatic run's stages: resumed against other rows (or none)
    # the run would read other scores and stop elsewhere
    pairs = {None: None, "pair": _pair(), "other": _pair(shift=1.0)}
    path = tmp_path / "c.pt"
    _automatic(path, validation=pairs[written], stop=1)
    with pytest.raises(ValueError, match=rf"resume=.* was written by an automatic run {message}"):
        _automatic(tmp_path / "d.pt", validation=pairs[resumed], resume=path)


def test_a_checkpoint_records_its_validation_pair_and_resumes_with_the_same_one(tmp_path):
    path = tmp_path / "c.pt"
    whole = _automatic(tmp_path / "whole.pt", validation=_pair())
    expected = _store()
    _automatic(path, validation=_pair(), stop=1)
    options = files.read_file(path, argument="path")["options"]
    assert options["validation_pair"] == pair_fingerprint(_pair())
    assert pair_fingerprint(_pair()) != pair_fingerprint(_pair(shift=1.0))
    resumed = _automatic(tmp_path / "d.pt", validation=_pair(), resume=path)
    # the uninterrupted run, scored on the same rows: its History and parameters exactly
    assert len(whole) > 2 and _record(resumed) == _record(whole)
    assert resumed.stopped == whole.stopped
    assert all(torch.equal(value, expected[name]) for name, value in _store().items())


def _auto(path, *, stop=None, resume=None, **options):
    """An automatic run of the small model (a callback stops it after epoch ``stop``)."""

    class Stop(bbb.Callback):
        def on_epoch_end(self, epoch, history):
            return epoch == stop

    x, y = _data()
    options = {"seed": 3, "progress": False, "max_steps": 40, **options}
    return bbb.fit(*_fresh(), x, y, checkpoint=path, resume=resume,
                   callbacks=[Stop()] if stop is not None else [], **options)  # fmt: skip


@pytest.mark.parametrize(
    ("written", "resumed", "message"),
    [
        # a run whose rates fit chose (and halves), resumed at a rate given: the halvings
        # would be dropped and the rate doubled
        ({}, {"lr": 0.05}, r"lr=None; this one has lr=0.05"),
        ({"lr": 0.05}, {"lr": None}, r"lr=0.05; this one has lr=None"),
        ({}, {"lr_schedule": 1.0}, r"lr_schedule=None; this one has lr_schedule=1.0"),
        (
            {"lr_schedule": CosineDecay(6)},
            {"lr_schedule": CosineDecay(6, floor=0.1)},
            r"lr_schedule='CosineDecay\(epochs=6, start=0.5, floor=0.01\)'; this one has "
            r"lr_schedule='CosineDecay\(epochs=6, start=0.5, floor=0.1\)'",
        ),
        ({}, {"max_steps": 80}, r"max_steps=40; this one has max_steps=80"),
        (
            {},
            {"optimizer": lambda params: torch.optim.Adam(params, lr=0.01)},
            r"a fit that chose its rates \(lr=None\); this one follows an optimizer function",
        ),
    ],
)
def test_resume_with_another_rate_or_budget_is_refused_naming_both(
    tmp_path, written, resumed, message
):
    # everything that decides the run's rate and length is recorded in the checkpoint
    path = tmp_path / "c.pt"
    _auto(path, stop=1, **written)
    with pytest.raises(ValueError, match=rf"resume=.* was written by (a fit with )?{message}"):
        _auto(tmp_path / "d.pt", resume=path, **{**written, **resumed})


def test_a_checkpoint_records_the_rates_and_the_halvings_so_far(tmp_path):
    path = tmp_path / "c.pt"
    _auto(path, stop=1)
    payload = files.read_file(path, argument="path")
    assert {k: payload["options"][k] for k in ("lr", "own_rate", "lr_schedule", "max_steps")} == {
        "lr": None, "own_rate": True, "lr_schedule": None, "max_steps": 40,
    }  # fmt: skip
    assert payload["halvings"] == []
    # a record that the History does not bear out is refused, naming both
    payload["halvings"] = [1]
    files.write_atomic(path, files.CHECKPOINT, payload)
    with pytest.raises(ValueError, match=r"halved after epochs \[1\]; this fit reads \[\]"):
        _auto(tmp_path / "d.pt", resume=path)


def test_the_schedule_record_is_the_same_text_for_the_same_schedule():
    from pyro_bbb.training.checkpoint import schedule_record

    assert schedule_record(None) is None and schedule_record(0.5) == 0.5
    assert schedule_record(CosineDecay(6)) == schedule_record(CosineDecay(6))
    assert schedule_record(partial(StepLR, step_size=2)) == (
        "partial(torch.optim.lr_scheduler.StepLR, step_size=2)"
    )
    assert "0x" not in schedule_record(lambda t: 1.0)  # a function: its name, not its address
