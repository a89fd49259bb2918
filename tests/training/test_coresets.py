"""Coreset selection: random and k-center splits of a task's points."""

from __future__ import annotations

import pytest
import torch

from pyro_bbb.training.coresets import select_coreset


@pytest.mark.parametrize("method", ["random", "k-center"])
def test_the_coreset_and_the_rest_partition_the_rows(method):
    x = torch.randn(50, 2, 3)
    chosen, rest = select_coreset(x, 7, method=method, generator=torch.Generator().manual_seed(0))
    assert chosen.shape == (7,) and rest.shape == (43,)
    assert torch.equal(torch.sort(torch.cat([chosen, rest])).values, torch.arange(50))
    assert torch.equal(chosen, chosen.sort().values) and torch.equal(rest, rest.sort().values)


def test_a_random_coreset_is_reproducible_from_its_generator_and_varies_with_it():
    x = torch.randn(100, 4)
    draw = [select_coreset(x, 10, generator=torch.Generator().manual_seed(s))[0] for s in (1, 1, 2)]
    assert torch.equal(draw[0], draw[1]) and not torch.equal(draw[0], draw[2])


def test_k_center_adds_the_point_farthest_from_those_chosen():
    # points on a line at 0, 1, ..., 10: from the first, the farthest is 10, then 5
    x = torch.arange(11.0).unsqueeze(-1)
    chosen, _ = select_coreset(x, 3, method="k-center")
    assert chosen.tolist() == [0, 5, 10]
    # two clusters: a k-center coreset of 2 takes one point of each
    x = torch.cat([torch.zeros(20, 2) + 0.01 * torch.randn(20, 2), 5 + torch.zeros(5, 2)])
    chosen, _ = select_coreset(x, 2, method="k-center")
    assert chosen[0] < 20 <= chosen[1]


@pytest.mark.parametrize(
    ("size", "method", "message"),
    [(0, "random", "size"), (10, "random", "smaller than the 10 rows"), (3, "greedy", "method")],
)
def test_bad_sizes_and_methods_are_refused(size, method, message):
    with pytest.raises(ValueError, match=message):
        select_coreset(torch.randn(10, 2), size, method=method)
