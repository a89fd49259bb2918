"""Tests of pyro_bbb.nn.sample_dims: nn.Flatten and nn.Unflatten under weight draws."""

from __future__ import annotations

import copy
import pickle

import pyro
import pytest
import torch
from torch import nn
from torch.func import functional_call

from pyro_bbb import bayesianize
from pyro_bbb.nn.sample_dims import SampleDimsFlatten, SampleDimsUnflatten, current_sample_dims
from pyro_bbb.priors import Gaussian

K = 3  # weight draws


def _networks():
    # (plain network, input); each has a reshape counting dims from the front
    return [
        (nn.Sequential(nn.Conv1d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(24, 1)),
         torch.randn(5, 2, 8)),
        (nn.Sequential(nn.Flatten(), nn.Linear(16, 2)), torch.randn(5, 2, 8)),  # no draws yet
        (nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Unflatten(1, (2, 4)), nn.Conv1d(2, 3, 2),
                       nn.Flatten(1, 2), nn.Linear(9, 1)), torch.randn(5, 6)),
        (nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(8, 1)),  # weight sampling
         torch.randint(0, 10, (5, 2))),
        (nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(start_dim=2), nn.Conv1d(2, 3, 4),
                       nn.Flatten(), nn.Linear(18, 1)), torch.randn(5, 1, 5, 5)),
    ]  # fmt: skip


@pytest.mark.parametrize("plain, x", _networks(), ids=["conv1d", "first", "unflatten", "embedding",
                                                       "flatten-twice"])  # fmt: skip
def test_each_draw_gives_what_the_plain_network_gives_with_those_weights(plain, x):
    net = bayesianize(plain, prior=Gaussian(1.0))
    draws = {name: torch.randn(K, *p.shape) for name, p in plain.named_parameters()}
    out = pyro.poutine.condition(net, data=draws)(x)
    loop = torch.stack(
        [functional_call(plain, {n: w[k] for n, w in draws.items()}, (x,)) for k in range(K)]
    )
    assert out.shape == loop.shape
    torch.testing.assert_close(out, loop)
    # without draws it is the plain network's reshape
    one = {name: w[0] for name, w in draws.items()}
    torch.testing.assert_close(pyro.poutine.condition(net, data=one)(x), loop[0])


def test_the_count_never_outlives_a_call_even_one_that_raises():
    plain, x = _networks()[0]
    net = bayesianize(plain, prior=Gaussian(1.0))
    draws = {name: torch.randn(K, *p.shape) for name, p in plain.named_parameters()}
    with pytest.raises(RuntimeError):  # after the draws' sample dims were counted
        pyro.poutine.condition(net, data={**draws, "3.weight": torch.randn(K, 1, 7)})(x)
    assert current_sample_dims() == 0
    first = bayesianize(nn.Sequential(nn.Flatten(), nn.Linear(16, 1)))
    assert first(x).shape == (5, 1)  # a stale count would have flattened dims 2.. only


def test_reshapes_are_swapped_in_place_and_the_network_pickles():
    net = bayesianize(nn.Sequential(nn.Linear(4, 6), nn.Unflatten(-1, (2, 3)), nn.Flatten()))
    assert isinstance(net[1], SampleDimsUnflatten) and isinstance(net[2], SampleDimsFlatten)
    assert (net[2].start_dim, net[2].end_dim, net[1].dim) == (1, -1, -1)
    x, draws = torch.randn(5, 4), {"0.weight": torch.randn(K, 6, 4), "0.bias": torch.randn(K, 6)}
    expected = pyro.poutine.condition(net, data=draws)(x)
    assert expected.shape == (K, 5, 6)
    for other in (pickle.loads(pickle.dumps(net)), copy.deepcopy(net)):
        torch.testing.assert_close(pyro.poutine.condition(other, data=draws)(x), expected)
