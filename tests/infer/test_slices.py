"""A model replayed slice by slice: what a row's activations take, and the slices put together."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.infer.slices import (
    Concatenation,
    ModelReplay,
    Undrawn,
    activation_bytes,
    concatenate,
    rows_per_slice,
)

S = 7  # weight draws


def _replay(net: nn.Module, x: torch.Tensor, likelihood=None) -> ModelReplay:
    model = bbb.BNN(net, likelihood or bbb.likelihoods.Gaussian(0.1), num_data=len(x))
    guide = bbb.MeanFieldGuide(model)
    plate = pyro.plate("draws", S, dim=-2)
    with torch.no_grad():
        guide_trace = poutine.trace(plate(guide)).get_trace(x)
    return ModelReplay(model, guide_trace, plate, "obs", model)


def _counted(replay: ModelReplay, x: torch.Tensor) -> int:
    with torch.no_grad(), activation_bytes() as count:
        replay.trace(x)
    return count[0]


def test_a_rows_activations_are_what_the_modules_return_for_every_draw():
    # mlp([3, 5, 2]): Linear (5), ReLU (5), Linear (2) per row and draw, float32; what does
    # not grow with the rows (the undrawn observation) cancels between 4 rows and 2
    pyro.set_rng_seed(0)
    x = torch.randn(4, 3)
    replay = _replay(bbb.mlp([3, 5, 2]), x, bbb.likelihoods.Categorical())
    assert _counted(replay, x) - _counted(replay, x[:2]) == 2 * S * (5 + 5 + 2) * 4


def test_a_network_run_once_per_draw_is_counted_for_every_draw_too():
    # a ConvNet goes around the network once per draw (torch.func.vmap): inside, each module
    # returns one draw's tensor, counted S times. Conv (2x4), Tanh (2x4), Flatten (a view of
    # 8, counted: a module's output is not known to be a view inside vmap), Linear (1), and
    # the network's output for all draws that the pass returns (1)
    pyro.set_rng_seed(0)
    net = nn.Sequential(nn.Conv1d(1, 2, 3), nn.Tanh(), nn.Flatten(), nn.Linear(8, 1))
    net = bbb.bayesianize(net, bbb.priors.Gaussian(1.0))
    x = torch.randn(4, 1, 6)
    replay = _replay(net, x)
    assert "once per draw" in bbb.nn.summary(net).draws
    assert _counted(replay, x) - _counted(replay, x[:2]) == 2 * S * (8 + 8 + 8 + 1 + 1) * 4


def test_a_slice_takes_the_rows_whose_activations_fit_the_budget_and_the_probe_changes_nothing():
    pyro.set_rng_seed(0)
    x = torch.randn(1000, 3)
    replay = _replay(bbb.mlp([3, 5, 2]), x, bbb.likelihoods.Categorical())
    # the probe's two rows also share the undrawn observation's 8 bytes (a long zero)
    per_row = S * (5 + 5 + 2) * 4 + 8 / 2
    state = torch.get_rng_state()
    rows = rows_per_slice(replay.trace, x, budget=100 * per_row)
    assert rows == 100
    assert torch.equal(torch.get_rng_state(), state)
    assert rows_per_slice(replay.trace, x, budget=100 * per_row, factor=2) == 50
    assert rows_per_slice(replay.trace, x, budget=1.0) == 1
    assert rows_per_slice(replay.trace, x, budget=1e12) == 1000
    assert rows_per_slice(lambda rows: None, x) == 1000  # nothing counted: one pass


def test_an_undrawn_site_keeps_its_distribution_and_draws_no_random_number():
    def model():
        pyro.sample("kept", dist.Normal(0.0, 1.0))
        with pyro.plate("rows", 3):
            pyro.sample("label", dist.Categorical(logits=torch.zeros(3, 4)))

    state = torch.get_rng_state()
    trace = poutine.trace(Undrawn({"label", "kept"})(model)).get_trace()
    assert torch.equal(torch.get_rng_state(), state)
    assert trace.nodes["label"]["value"].shape == (3,)
    assert trace.nodes["label"]["value"].dtype == torch.long
    assert isinstance(trace.nodes["label"]["fn"], dist.Categorical)
    assert trace.nodes["kept"]["value"].item() == 0.0


@pytest.mark.parametrize(
    "whole",
    [
        dist.Normal(torch.randn(3, 10), torch.rand(3, 10) + 0.1),
        dist.Normal(torch.randn(3, 10), torch.tensor(0.5)).expand((3, 10)),
        dist.Normal(torch.randn(3, 10, 2), torch.rand(3, 10, 2) + 0.1).to_event(1),
        dist.Categorical(logits=torch.randn(3, 10, 4)),
        dist.Bernoulli(logits=torch.randn(3, 10)),
        dist.Bernoulli(logits=torch.randn(3, 10, 2)).to_event(1),
    ],
)
def test_slices_put_together_are_the_distribution_of_every_row(whole):
    base = whole.base_dist if isinstance(whole, dist.Independent) else whole
    names = ("loc", "scale") if isinstance(base, dist.Normal) else ("logits",)

    def part(rows: slice) -> dist.TorchDistribution:  # the batch is (draws, rows[, dim])
        values = {}
        for name in names:
            value = getattr(base, name)
            value = value.expand(*base.batch_shape, *value.shape[len(base.batch_shape) :])
            values[name] = value[:, rows]
        piece = type(base)(**values)
        return dist.Independent(piece, 1) if isinstance(whole, dist.Independent) else piece

    parts = [part(slice(0, 4)), part(slice(4, 7)), part(slice(7, 10))]
    joined = concatenate(parts, 10)
    assert type(joined) is type(whole)
    assert joined.batch_shape == whole.batch_shape and joined.event_shape == whole.event_shape
    joined_base = joined.base_dist if isinstance(joined, dist.Independent) else joined
    for name in names:
        expected = getattr(base, name).expand_as(getattr(joined_base, name))
        torch.testing.assert_close(getattr(joined_base, name), expected)
    assert concatenate(parts[:1], 4) is parts[0]  # one slice: its own distribution


def test_a_distribution_that_cannot_be_put_together_names_the_way_out():
    parts = [dist.StudentT(3.0, torch.zeros(2, 4), 1.0), dist.StudentT(3.0, torch.zeros(2, 4), 1.0)]
    with pytest.raises(NotImplementedError, match=r"Normal, Categorical or Bernoulli.*StudentT"):
        concatenate(parts, 8)
    incomplete = Concatenation(10)
    incomplete.add(dist.Normal(torch.zeros(2, 4), 1.0))
    with pytest.raises(RuntimeError, match="4 of 10 rows"):
        incomplete.result()
