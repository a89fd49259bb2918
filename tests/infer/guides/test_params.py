"""A guide refuses parameters that Pyro's global param store holds with another shape."""

from __future__ import annotations

import pyro
import pytest
import torch

import pyro_bbb as bbb


def _model(width: int) -> bbb.BNN:
    return bbb.BNN(bbb.mlp([3, width, 1]), bbb.likelihoods.Gaussian(), num_data=20)


@pytest.mark.parametrize(
    ("guide_cls", "stored", "needed"),
    # mean-field: the site "0.weight"; low-rank: the block "0" of weight and bias, flattened
    [(bbb.MeanFieldGuide, "(8, 3)", "(5, 3)"), (bbb.LowRankGuide, "(32,)", "(20,)")],
)
def test_a_second_model_in_one_session_gets_an_error_naming_the_site_shapes_and_fixes(
    guide_cls, stored, needed
):
    x, y = torch.randn(20, 3), torch.randn(20)
    bbb.fit(_model(8), guide_cls(_model(8)), x, y, epochs=1, progress=False)
    second = guide_cls(_model(5))
    with pytest.raises(ValueError) as error:
        bbb.fit(_model(5), second, x, y, epochs=1, progress=False)
    message = str(error.value)
    assert "site '0" in message
    assert f"shape {stored}" in message and f"needs {needed}" in message
    assert "pyro.clear_param_store()" in message and "name=" in message


def test_a_second_guide_with_its_own_name_trains_beside_the_first():
    x, y = torch.randn(20, 3), torch.randn(20)
    bbb.fit(_model(8), bbb.MeanFieldGuide(_model(8)), x, y, epochs=1, progress=False)
    model = _model(5)
    guide = bbb.MeanFieldGuide(model, name="second")
    history = bbb.fit(model, guide, x, y, epochs=2, progress=False)
    assert len(history) == 2 and guide.median()["0.weight"].shape == (5, 3)


def test_a_guide_with_the_same_shapes_shares_the_stored_parameters():
    # Pyro's documented behaviour, kept: a same-named guide of the same shapes reuses them.
    x = torch.randn(20, 3)
    first = bbb.MeanFieldGuide(_model(4))
    first(x)
    second = bbb.MeanFieldGuide(_model(4))
    second(x)
    assert torch.equal(first.median()["0.weight"], second.median()["0.weight"])


def _warnings_of_taking(seen) -> list:
    return [w for w in seen if "trained by an earlier fit" in str(w.message)]


@pytest.mark.parametrize("guide_cls", [bbb.MeanFieldGuide, bbb.LowRankGuide])
def test_a_guide_built_after_a_fit_warns_once_that_it_takes_the_fitted_values(guide_cls):
    # a notebook cell run twice: the second, never-fitted guide would predict as the fitted
    # one without a word
    import warnings

    x, y = torch.randn(20, 3), torch.randn(20)
    fitted = guide_cls(_model(4))
    bbb.fit(fitted.model, fitted, x, y, epochs=2, progress=False)
    model = _model(4)
    second = guide_cls(model)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        bbb.predict(model, second, x, num_samples=2)
    (warning,) = _warnings_of_taking(seen)
    message = str(warning.message)
    assert f"holds '{guide_cls.__name__}.locs.0" in message
    assert "pyro.clear_param_store()" in message and f"name='{guide_cls.__name__}2'" in message
    assert warning.filename == __file__  # the user's line, not the set-up's
    # it does take them (Pyro's sharing, kept): the warning says what happens
    assert torch.equal(fitted.median()["0.weight"], second.median()["0.weight"])


def test_continuing_a_fit_with_its_guide_and_a_fresh_or_renamed_guide_do_not_warn():
    import warnings

    import pyro

    x, y = torch.randn(20, 3), torch.randn(20)
    model = _model(4)
    guide = bbb.MeanFieldGuide(model)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        bbb.fit(model, guide, x, y, epochs=2, progress=False)
        bbb.fit(model, guide, x, y, epochs=2, progress=False, beta=1.0)  # continue the fit
        other = _model(4)
        bbb.predict(other, bbb.MeanFieldGuide(other, name="second"), x, num_samples=2)
        pyro.clear_param_store()
        fresh = _model(4)
        bbb.predict(fresh, bbb.MeanFieldGuide(fresh), x, num_samples=2)
    assert not _warnings_of_taking(seen)


def _warned(run) -> list[str]:
    """The messages of every param-store warning ``run()`` raises."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in seen if "Pyro's param store already holds" in str(w.message)]


def test_resuming_or_loading_in_the_process_that_saved_warns_of_nothing(tmp_path):
    # the documented ways back: the fresh model and guide take the store's fitted values at
    # set-up, and the checkpoint's or file's values then replace them
    x, y = torch.randn(20, 3), torch.randn(20)
    model = _model(4)
    guide = bbb.MeanFieldGuide(model)
    bbb.fit(model, guide, x, y, epochs=2, progress=False, checkpoint=tmp_path / "c.pt")
    bbb.save(tmp_path / "m.pt", model, guide)

    def resume():
        again = _model(4)
        bbb.fit(again, bbb.MeanFieldGuide(again), x, y, epochs=3, progress=False,
                resume=tmp_path / "c.pt")  # fmt: skip

    def load():
        again = _model(4)
        bbb.load(tmp_path / "m.pt", again, bbb.MeanFieldGuide(again))

    assert _warned(resume) == [] and _warned(load) == []


def test_a_second_model_of_the_same_name_warns_that_it_shares_the_learned_noise():
    # two homoscedastic BNNs: the second guide has its own name, but the models' learned
    # noise is one parameter, "likelihood.scale"
    x, y = torch.randn(20, 3), torch.randn(20)
    first = _model(4)
    bbb.fit(first, bbb.MeanFieldGuide(first), x, y, epochs=2, progress=False)
    # the same model with a second guide shares its own noise: nothing to say
    assert _warned(lambda: bbb.fit(first, bbb.MeanFieldGuide(first, name="other"), x, y,
                                   epochs=1, progress=False)) == []  # fmt: skip
    second = _model(4)
    (message,) = _warned(
        lambda: bbb.fit(
            second, bbb.MeanFieldGuide(second, name="second"), x, y, epochs=1, progress=False
        )
    )
    assert "'likelihood.scale', trained by an earlier fit of another model" in message
    assert "BNN(..., name='b')" in message and "pyro.clear_param_store()" in message


def test_a_second_model_with_its_own_name_has_its_own_learned_noise():
    import pyro

    x, y = torch.randn(20, 3), torch.randn(20)
    first = _model(4)
    bbb.fit(first, bbb.MeanFieldGuide(first), x, y, epochs=2, progress=False)
    second = bbb.BNN(bbb.mlp([3, 4, 1]), bbb.likelihoods.Gaussian(), num_data=20, name="b")
    assert _warned(lambda: bbb.fit(second, bbb.MeanFieldGuide(second, name="second"), x, y,
                                   epochs=1, progress=False)) == []  # fmt: skip
    store = pyro.get_param_store()
    assert {"likelihood.scale", "b.likelihood.scale"} <= set(store.keys())
    assert first.likelihood.scale.item() != second.likelihood.scale.item()


def test_a_pyro_autoguide_built_after_a_fit_of_its_name_warns_when_it_is_fitted():
    # Pyro's autoguides create their parameters inside Pyro, unchecked at set-up: the fit
    # that trains the second one says it trains the first one's parameters
    from pyro.infer.autoguide import AutoNormal

    x, y = torch.randn(20, 3), torch.randn(20)
    model = _model(4)
    bbb.fit(model, AutoNormal(model), x, y, epochs=2, progress=False)
    messages = _warned(lambda: bbb.fit(model, AutoNormal(model), x, y, epochs=1, progress=False))
    (message,) = messages
    assert "'AutoNormal.locs." in message and "another guide" in message
    assert "name='AutoNormal2'" in message
    guide = AutoNormal(model)  # continuing that fit with the same guide says nothing
    bbb.fit(model, guide, x, y, epochs=1, progress=False)
    assert _warned(lambda: bbb.fit(model, guide, x, y, epochs=1, progress=False)) == []


@pytest.mark.parametrize("guide_cls", [bbb.MeanFieldGuide, bbb.LowRankGuide])
def test_a_guide_read_outside_a_call_reads_the_param_store_it_was_loaded_from(guide_cls, tmp_path):
    # Pyro's way back: pyro.get_param_store().load(path). PyroModule takes the store's
    # tensors only inside a call of the guide, so posterior() and median() read before any
    # call gave the guide's initial values
    x, y = torch.randn(20, 3), torch.randn(20)
    model = _model(4)
    guide = guide_cls(model)
    bbb.fit(model, guide, x, y, epochs=5, lr=0.05, progress=False)
    fitted = {name: value.clone() for name, value in guide.median().items()}
    sd = {name: site.stddev.clone() for name, site in guide.posterior().items()}
    pyro.get_param_store().save(tmp_path / "params.pt")

    pyro.clear_param_store()
    model = _model(4)
    fresh = guide_cls(model)
    fresh(x, y)  # set up at its initial values
    assert not torch.equal(fresh.median()["0.weight"], fitted["0.weight"])
    pyro.get_param_store().load(tmp_path / "params.pt")
    for name, value in fresh.median().items():
        assert torch.equal(value, fitted[name]), name
    for name, site in fresh.posterior().items():
        assert torch.allclose(site.stddev, sd[name]), name


def test_reading_a_guide_after_the_store_was_cleared_does_not_put_it_back():
    # a later guide of the same name must not take the cleared guide's values
    x = torch.randn(20, 3)
    guide = bbb.MeanFieldGuide(_model(4))
    guide(x)
    pyro.clear_param_store()
    guide.median(), guide.posterior()
    assert "MeanFieldGuide.locs.0.weight" not in pyro.get_param_store()
