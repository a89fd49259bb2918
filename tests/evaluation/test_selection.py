"""ArviZ's var_names, filter_vars and coords read over a network's sites and layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pyro_bbb.evaluation.selection import select_coords, select_sites, site_dims

SITES = ["0.weight", "0.bias", "2.weight", "2.bias", "10.weight", "fc1.weight", "fc1.bias"]


def test_every_site_without_var_names():
    assert select_sites(None, SITES) == SITES


@pytest.mark.parametrize(
    ("var_names", "expected"),
    [
        ("2.bias", ["2.bias"]),
        ("0", ["0.weight", "0.bias"]),  # a layer: its sites, not layer 10's
        ("fc1", ["fc1.weight", "fc1.bias"]),
        (["fc1.bias", "0"], ["0.weight", "0.bias", "fc1.bias"]),  # in the network's order
        ("~0", ["2.weight", "2.bias", "10.weight", "fc1.weight", "fc1.bias"]),
        (["~0", "~fc1.bias"], ["2.weight", "2.bias", "10.weight", "fc1.weight"]),
    ],
)
def test_var_names_name_sites_or_layers_and_tilde_leaves_them_out(var_names, expected):
    assert select_sites(var_names, SITES) == expected


def test_filter_vars_reads_names_as_substrings_or_regular_expressions():
    assert select_sites("0", SITES, "like") == ["0.weight", "0.bias", "10.weight"]
    assert select_sites("bias", SITES, "like") == ["0.bias", "2.bias", "fc1.bias"]
    assert select_sites(r"^\d+\.weight$", SITES, "regex") == ["0.weight", "2.weight", "10.weight"]
    assert select_sites("~weight", SITES, "like") == ["0.bias", "2.bias", "fc1.bias"]


def test_a_bad_selection_is_refused_naming_what_there_is():
    with pytest.raises(KeyError, match=r"'fc2' matches none of the sites .*layers \['0', '2'"):
        select_sites("fc2", SITES)
    with pytest.raises(ValueError, match="mixes names to keep and names to leave out"):
        select_sites(["0", "~2"], SITES)
    with pytest.raises(ValueError, match="leaves none of the sites"):
        select_sites("~weight|bias", SITES, "regex")
    with pytest.raises(ValueError, match="filter_vars must be None, 'like' or 'regex'"):
        select_sites("0", SITES, "glob")
    with pytest.raises(ValueError, match="var_names must be None, a name or a list"):
        select_sites([], SITES)
    with pytest.warns(UserWarning, match="'~fc2' matches none"):
        assert select_sites(["~fc2", "~0"], SITES) == SITES[2:]


def test_coords_select_indices_along_named_dims():
    sizes = {"0.out": 5, "0.in": 3, "data": 100}
    chosen = select_coords({"0.out": [4, 1], "0.in": 2, "data": slice(10, 20, 5)}, sizes)
    assert chosen["0.out"].tolist() == [4, 1]
    assert chosen["0.in"].tolist() == [2]
    assert chosen["data"].tolist() == [10, 15]
    assert select_coords({"data": range(3)}, sizes)["data"].tolist() == [0, 1, 2]
    assert select_coords({"0.out": np.array([0])}, sizes)["0.out"].dtype == torch.long
    assert select_coords(None, sizes) == {}


def test_coords_out_of_range_or_on_no_dim_are_refused():
    sizes = {"0.out": 5}
    with pytest.raises(KeyError, match=r"no dim '1.out'; the dims are \['0.out'\]"):
        select_coords({"1.out": [0]}, sizes)
    with pytest.raises(ValueError, match=r"coords\['0.out'\] must lie in \[0, 5\).*5 to 5"):
        select_coords({"0.out": [5]}, sizes)
    with pytest.raises(ValueError, match="must be ints"):
        select_coords({"0.out": [0.5]}, sizes)
    with pytest.raises(ValueError, match="selects nothing"):
        select_coords({"0.out": []}, sizes)


def test_a_layers_weight_and_bias_share_its_out_dim():
    assert site_dims("fc1.weight", (4, 3)) == ["fc1.out", "fc1.in"]
    assert site_dims("fc1.bias", (4,)) == ["fc1.out"]
    assert site_dims("conv.weight", (6, 1, 5, 5)) == ["conv.out", "conv.in", "conv.kh", "conv.kw"]
    assert site_dims("scale", (2,)) == ["scale_dim_0"]
