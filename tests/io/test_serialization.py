"""Tests of pyro_bbb.io.serialization: save and load a trained model and guide."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoNormal

import pyro_bbb as bbb
from pyro_bbb.training.lr_schedules import CosineDecay

from ..support import REPO, requires_cuda

N = 40
X_TEST = torch.linspace(-3, 3, 7).unsqueeze(-1)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(N, 1, generator=g) * 4 - 2
    return x, torch.sin(2 * x.squeeze(-1)) + 0.1 * torch.randn(N, generator=g)


def _build(guide="meanfield", sizes=(1, 16, 1), init_seed=0):
    torch.manual_seed(init_seed)
    model = bbb.BNN(bbb.mlp(list(sizes), activation="tanh"), bbb.likelihoods.Gaussian(), N)
    if guide == "lowrank":
        return model, bbb.LowRankGuide(model, rank=2)
    if guide == "autonormal":
        return model, AutoNormal(model)
    return model, bbb.MeanFieldGuide(model)


def _trained(guide="meanfield"):
    model, guide = _build(guide)
    bbb.fit(model, guide, *_data(), epochs=30, batch_size=10, seed=0)
    return model, guide


def _store():
    return {name: value.detach().clone() for name, value in pyro.get_param_store().items()}


FRESH_PROCESS = """
import sys
import torch
import pyro_bbb as bbb

torch.manual_seed(123)  # another initialisation: load must replace it
model = bbb.BNN(bbb.mlp([1, 16, 1], activation="tanh"), bbb.likelihoods.Gaussian(), 40)
guide = bbb.{guide}
bbb.load(sys.argv[1], model, guide)
x = torch.linspace(-3, 3, 7).unsqueeze(-1)
pred = bbb.predict(model, guide, x, num_samples=50, seed=0)
torch.save(pred.samples, sys.argv[2])
"""


@pytest.mark.parametrize(
    ("kind", "guide"),
    [("meanfield", "MeanFieldGuide(model)"), ("lowrank", "LowRankGuide(model, rank=2)")],
)
def test_predictions_after_loading_in_a_fresh_process_are_identical(tmp_path, kind, guide):
    model, trained = _trained(kind)
    before = bbb.predict(model, trained, X_TEST, num_samples=50, seed=0).samples
    bbb.save(tmp_path / "bnn.pt", model, trained)
    script = tmp_path / "load_bnn.py"  # a user's script: top level, no main guard
    script.write_text(textwrap.dedent(FRESH_PROCESS.format(guide=guide)))
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "bnn.pt"), str(tmp_path / "pred.pt")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert torch.equal(torch.load(tmp_path / "pred.pt"), before)


@pytest.mark.parametrize("kind", ["meanfield", "lowrank", "autonormal"])
def test_load_fills_a_guide_that_was_never_called(tmp_path, kind):
    model, guide = _trained(kind)
    bbb.save(tmp_path / "bnn.pt", model, guide)
    saved = _store()
    assert "likelihood.scale" in saved  # the model's point estimate travels too
    pyro.clear_param_store()
    model, guide = _build(kind, init_seed=9)
    bbb.load(tmp_path / "bnn.pt", model, guide)
    loaded = _store()
    assert loaded.keys() == saved.keys()
    assert all(torch.equal(loaded[name], value) for name, value in saved.items())
    assert torch.equal(model.likelihood.scale, saved["likelihood.scale"])


def test_load_leaves_the_random_state_as_it_was(tmp_path):
    model, guide = _trained("lowrank")  # its set-up draws the factors' initial values
    bbb.save(tmp_path / "bnn.pt", model, guide)
    pyro.clear_param_store()
    model, guide = _build("lowrank")
    torch.manual_seed(4)
    bbb.load(tmp_path / "bnn.pt", model, guide)
    drawn = torch.rand(3)
    torch.manual_seed(4)
    assert torch.equal(drawn, torch.rand(3))


def test_a_loaded_guide_keeps_how_its_fit_ended_and_warns_as_the_fitted_one(tmp_path):
    # the ArviZ export warns of a posterior whose fit stopped on the predictive: it reads
    # guide.fit_until, which a saved and loaded guide must carry as the fitted one does
    model, guide = _build()
    bbb.fit(model, guide, *_data(), max_steps=300, seed=0, progress=False)
    assert guide.fit_until == "predictive"
    ended = getattr(guide, "fit_end", None)
    bbb.save(tmp_path / "bnn.pt", model, guide)
    pyro.clear_param_store()
    model, guide = _build(init_seed=5)
    bbb.load(tmp_path / "bnn.pt", model, guide)
    with pytest.warns(UserWarning, match="whose fit stopped on the predictive"):
        bbb.to_inference_data(model, guide, *_data(), num_samples=8, seed=0)
    assert guide.fit_until == "predictive" and guide.fit_end == ended is not None
    # and its next fit continues the saved one
    history = bbb.fit(model, guide, *_data(), epochs=2, seed=0, progress=False)
    assert history.continues == ended and history.beta == [1.0, 1.0]


def test_a_checkpoint_loads_without_a_record_of_how_the_fit_ended(tmp_path):
    # a checkpoint written while a fit ran holds the end of the fit that one continued, not
    # its own end; it is resumed with fit(resume=...), and a load leaves no record
    model, guide = _build()
    bbb.fit(model, guide, *_data(), epochs=3, seed=0, checkpoint=tmp_path / "c.pt")
    pyro.clear_param_store()
    model, guide = _build(init_seed=5)
    guide.fit_until = "predictive"
    bbb.load(tmp_path / "c.pt", model, guide)
    assert guide.fit_until is None and guide.fit_end is None


def test_a_fit_checkpoint_loads_like_a_saved_model(tmp_path):
    model, guide = _build()
    bbb.fit(model, guide, *_data(), epochs=3, seed=0, checkpoint=tmp_path / "c.pt")
    saved = _store()
    pyro.clear_param_store()
    bbb.load(tmp_path / "c.pt", *_build(init_seed=5))
    assert all(torch.equal(_store()[name], value) for name, value in saved.items())


# --- errors: nothing half-loaded -----------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "site", "there", "here"),
    [
        ((2, 16, 1), "0.weight", "(16, 1)", "(16, 2)"),  # another input width
        ((1, 8, 1), "0.weight", "(16, 1)", "(8, 1)"),  # another hidden width
        ((1, 16, 16, 1), "2.weight", "(1, 16)", "(16, 16)"),  # another depth
    ],
)
def test_another_architecture_names_the_first_mismatched_site_and_both_shapes(
    tmp_path, sizes, site, there, here
):
    bbb.save(tmp_path / "bnn.pt", *_trained())
    pyro.clear_param_store()
    model, guide = _build(sizes=sizes)
    message = f"different architecture: site '{site}' has shape {there} there and {here} in this"
    with pytest.raises(ValueError, match=re.escape(message)):
        bbb.load(tmp_path / "bnn.pt", model, guide)


def test_another_guide_class_is_an_error_naming_a_parameter(tmp_path):
    bbb.save(tmp_path / "bnn.pt", *_trained())
    pyro.clear_param_store()
    with pytest.raises(ValueError, match=r"parameter 'LowRankGuide.locs.0'"):
        bbb.load(tmp_path / "bnn.pt", *_build("lowrank"))


def test_another_dtype_is_an_error_naming_both(tmp_path):
    bbb.save(tmp_path / "bnn.pt", *_trained())
    pyro.clear_param_store()
    model, guide = _build()
    model.double()
    with pytest.raises(ValueError, match=r"site '0.weight' is float32 there and float64 in"):
        bbb.load(tmp_path / "bnn.pt", model, guide)


def test_a_truncated_file_is_a_clear_error_and_loads_nothing(tmp_path):
    bbb.save(tmp_path / "bnn.pt", *_trained())
    data = (tmp_path / "bnn.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) * 2 // 3])
    pyro.clear_param_store()
    model, guide = _build(init_seed=3)
    guide(X_TEST)  # set up: its parameters must survive the failed load unchanged
    before = _store()
    with pytest.raises(ValueError, match=r"path=.*cut.pt' cannot be read: .* or it is truncated"):
        bbb.load(tmp_path / "cut.pt", model, guide)
    assert all(torch.equal(_store()[name], value) for name, value in before.items())


def test_a_mismatch_found_late_still_loads_nothing(tmp_path):
    # Same network, so the sites match; the parameters differ (a learned vs. fixed noise).
    bbb.save(tmp_path / "bnn.pt", *_trained())
    pyro.clear_param_store()
    torch.manual_seed(3)
    net = bbb.mlp([1, 16, 1], activation="tanh")
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(scale=0.1), N)
    guide = bbb.MeanFieldGuide(model)
    guide(X_TEST)
    before = _store()
    with pytest.raises(ValueError, match=r"parameter 'likelihood.scale'"):
        bbb.load(tmp_path / "bnn.pt", model, guide)
    assert all(torch.equal(_store()[name], value) for name, value in before.items())


def test_a_file_that_is_not_ours_is_a_clear_error(tmp_path):
    model, guide = _trained()
    torch.save(guide.state_dict(), tmp_path / "state_dict.pt")
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"is not a pyro_bbb file \(it holds a dict with keys"):
        bbb.load(tmp_path / "state_dict.pt", model, guide)
    with pytest.raises(ValueError, match=r"cannot be read"):
        bbb.load(tmp_path / "notes.pt", model, guide)
    with pytest.raises(FileNotFoundError, match=r"path=.*missing.pt': no such file"):
        bbb.load(tmp_path / "missing.pt", model, guide)


def test_saving_a_guide_that_was_never_set_up_is_an_error(tmp_path):
    model, guide = _build()
    with pytest.raises(ValueError, match=r"MeanFieldGuide has no parameters yet"):
        bbb.save(tmp_path / "bnn.pt", model, guide)
    assert not (tmp_path / "bnn.pt").exists()


def test_a_hand_written_guide_is_refused_with_a_hint(tmp_path):
    model, _ = _build()
    with pytest.raises(TypeError, match=r"guide must be a Pyro autoguide.*param_store"):
        bbb.save(tmp_path / "bnn.pt", model, lambda x, y=None: None)


@requires_cuda
def test_a_model_saved_on_the_cpu_loads_onto_cuda(tmp_path):
    model, guide = _trained()
    before = bbb.predict(model, guide, X_TEST, num_samples=20, seed=0).mean
    bbb.save(tmp_path / "bnn.pt", model, guide)
    pyro.clear_param_store()
    model, guide = _build(init_seed=2)
    model.to("cuda")
    bbb.load(tmp_path / "bnn.pt", model, guide)
    after = bbb.predict(model, guide, X_TEST.cuda(), num_samples=20, seed=0).mean
    assert torch.allclose(after.cpu(), before, atol=1e-5)


# --- files of earlier versions ----------------------------------------------------------------
# Written by tests/io/data/make_low_rank_v1.py with the version that stored a LowRankGuide's
# factor V as `factors.<block>`, (d, rank); it is now V^T, `factors_t.<block>`, (rank, d).
DATA = REPO / "tests" / "io" / "data"
V1 = {"N": 40, "sizes": [1, 8, 1]}


def _v1_data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(V1["N"], 1, generator=g) * 4 - 2
    return x, torch.sin(2 * x.squeeze(-1)) + 0.1 * torch.randn(V1["N"], generator=g)


def _v1_fresh(kind, seed=0):
    pyro.clear_param_store()
    torch.manual_seed(seed)
    model = bbb.BNN(bbb.mlp(V1["sizes"], activation="tanh"), bbb.likelihoods.Gaussian(), V1["N"])
    if kind == "ensemble":
        return model, bbb.Ensemble(model, lambda m: bbb.LowRankGuide(m, rank=2), k=2)
    return model, bbb.LowRankGuide(model, rank=2)


def _v1_fit(model, guide, epochs, **options):
    schedules = {"beta": bbb.infer.LinearWarmup(3), "lr_schedule": CosineDecay(4, start=0.2)}
    return bbb.fit(model, guide, *_v1_data(), epochs=epochs, batch_size=10, seed=0,
                   num_particles=1,  # what the files were written with: fit's default then
                   progress=False, **schedules, **options)  # fmt: skip


def _as_now(name, value):
    """A parameter of the old layout under its name and layout now."""
    if ".factors." in name:
        return name.replace(".factors.", ".factors_t."), value.mT
    return name, value


def test_a_low_rank_guide_saved_with_its_factor_untransposed_loads_converted():
    path = DATA / "low_rank_v1_model.pt"
    saved = torch.load(path, weights_only=True)["params"]
    assert saved["LowRankGuide.factors.0"].shape == (16, 2)  # V, (d, rank): the old layout
    model, guide = _v1_fresh("guide", seed=123)  # another initialisation: load replaces it
    bbb.load(path, model, guide)

    assert _store().keys() == {_as_now(name, value)[0] for name, value in saved.items()}
    for name, value in saved.items():
        now, expected = _as_now(name, value)
        assert torch.equal(pyro.param(now).unconstrained().detach(), expected), name
    # what that version predicted from the same file
    predictions = torch.load(DATA / "low_rank_v1_expected.pt", weights_only=True)["predictions"]
    samples = bbb.predict(model, guide, X_TEST, num_samples=20, seed=0).samples
    torch.testing.assert_close(samples, predictions)


@pytest.mark.parametrize("kind", ["guide", "ensemble"])
def test_a_checkpoint_with_the_factor_untransposed_resumes_as_the_fit_it_was_cut_from(kind):
    # the old version's fit of 4 epochs; its checkpoint after 2, resumed here to 4: the
    # optimiser's moments of the factor must be converted with it, or the steps differ
    expected = torch.load(DATA / "low_rank_v1_expected.pt", weights_only=True)
    uninterrupted = dict(_as_now(*item) for item in expected[f"{kind}_uninterrupted"].items())
    _v1_fit(*_v1_fresh(kind, seed=123), 4, resume=DATA / f"low_rank_v1_{kind}_checkpoint.pt")

    resumed = _store()
    assert resumed.keys() == uninterrupted.keys()
    # to a float32 ulp or two: the ensemble's steps are now fused, the file's were traced
    # (the same terms, summed in another order)
    for name, value in uninterrupted.items():
        torch.testing.assert_close(resumed[name], value, rtol=1e-6, atol=1e-7, msg=name)
