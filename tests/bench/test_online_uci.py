"""The one-pass UCI protocol: each split streamed once, scored in original units."""

from __future__ import annotations

import math

import pyro
import pytest
import torch

from pyro_bbb.bench.online_uci import METHODS, one_pass_split, run_one_pass, summarise
from pyro_bbb.data import load_uci_folder, write_uci_folder


@pytest.fixture
def folder(tmp_path):
    """A small set whose target is in units of 100: scores must come back in those units."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 3, generator=g)
    y = 100 * (torch.sin(x[:, 0]) + 0.5 * x[:, 1]) + 500 + 10 * torch.randn(60, generator=g)
    return write_uci_folder(tmp_path / "toy", x, y, num_splits=2)


def test_a_split_is_streamed_once_and_scored_in_original_units(folder):
    split = load_uci_folder(folder)[0]
    pyro.get_param_store()["kept"] = torch.ones(1)  # the caller's store is put back
    result = one_pass_split(split, "lofi", dataset="toy", n_hidden=8)
    assert torch.equal(pyro.param("kept"), torch.ones(1))
    assert result.method == "lofi" and result.split == 0 and result.cpu_seconds > 0
    # in units of the target (std about 100), not of the standardised one
    assert 5 < result.rmse < 150 and 5 < result.noise_std < 150
    assert -8 < result.log_likelihood < -3


def test_the_protocol_runs_every_split_and_summarises_them(folder):
    results = run_one_pass(str(folder.parent), methods=("lofi", "ekf"), num_splits=2)
    assert [(r.split, r.method) for r in results] == [
        (0, "lofi"),
        (0, "ekf"),
        (1, "lofi"),
        (1, "ekf"),
    ]
    table = summarise(results)["toy"]
    assert set(table) == {"lofi", "ekf"} and table["lofi"]["splits"] == 2
    expected = sum(r.rmse for r in results if r.method == "lofi") / 2
    assert table["lofi"]["rmse"] == pytest.approx(expected)
    assert table["lofi"]["rmse_se"] > 0 and not math.isnan(table["ekf"]["log_likelihood"])


def test_unknown_methods_are_refused_with_the_names():
    assert "lofi" in METHODS and "rvga" in METHODS
    with pytest.raises(ValueError, match="methods must be keys of METHODS or 'batch'"):
        run_one_pass(".", methods=("sgd",))
