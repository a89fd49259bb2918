"""A guide refuses parameters that Pyro's global param store holds with another shape."""

from __future__ import annotations

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
