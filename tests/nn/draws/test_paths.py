"""Tests of pyro_bbb.nn.draws.paths: the way draws take, from the structure where it tells."""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn
from torch.func import functional_call, vmap

import pyro_bbb as bbb
from pyro_bbb.nn import bayesianize, mlp
from pyro_bbb.nn.draws import (
    DrawPath,
    broadcasts_draws,
    describe_draws,
    draw_path,
    is_vmap_limitation,
    paths,
    per_draw,
    per_draw_forward,
    unbatched_layer,
)

from ...support import user_networks

ConvView, Recurrent = user_networks.ConvView, user_networks.Recurrent


def test_mlps_and_sequential_stacks_of_linear_layers_broadcast_and_get_no_runner():
    assert broadcasts_draws(mlp([2, 5, 1], dropout=0.1))
    plain = nn.Sequential(nn.Linear(2, 4), nn.LayerNorm(4), nn.GELU(), nn.Linear(4, 1))
    net = bayesianize(plain, deterministic="1.*")
    assert per_draw_forward(net) is None and draw_path(net).path is DrawPath.BROADCAST
    for other in (
        nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(2, 1)),
        nn.Sequential(nn.Linear(2, 4), nn.Softmax(dim=1)),  # counts dims from the front
        nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4)),
        ConvView(),
    ):
        net = bayesianize(other)
        assert not broadcasts_draws(net) and per_draw_forward(net) is not None
        assert draw_path(net) is None  # not yet met draws: vmap will be tried
    assert "broadcast" in describe_draws(mlp([2, 1]))


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU, nn.RNN])
def test_a_bayesian_recurrent_layer_takes_the_loop_without_trying_vmap(monkeypatch, cell):
    net = bayesianize(Recurrent(cell))
    name = cell.__name__
    assert unbatched_layer(net) == (
        f"layer 'rnn' ({name}), whose fused recurrent kernel has no batching rule for drawn weights"
    )

    def no_vmap(*args, **kwargs):
        raise AssertionError("vmap was tried")

    monkeypatch.setattr(per_draw, "vmap", no_vmap)
    x = torch.randn(4, 5, 3)
    with pyro.plate("draws", 3, dim=-2):
        out = net(x)
    assert out.shape == (3, 4, 1)
    known = draw_path(net)
    assert known.path is DrawPath.LOOP and known.reason == unbatched_layer(net)
    assert f"'rnn' ({name})" in describe_draws(net)


def test_a_recurrent_layer_left_deterministic_is_decided_by_trying_vmap():
    # its input carries no draws when it comes first, so vmap batches it: the structure
    # alone cannot tell, and says nothing
    net = bayesianize(Recurrent(nn.LSTM), only="head.*")
    assert unbatched_layer(net) is None
    x = torch.randn(4, 5, 3)
    net(x)  # the deterministic weights enter the param store, as a guide's set-up does
    with pyro.plate("draws", 3, dim=-2):
        net(x)
    assert draw_path(net).path is DrawPath.VMAP


def test_an_unreached_head_says_nothing_of_the_path():
    body = nn.Linear(3, 4)
    heads = [nn.Linear(4, 1), nn.LSTMCell(4, 2)]
    net = bayesianize(bbb.nn.MultiHead(body, heads))
    assert unbatched_layer(net) is None  # head 0 is active
    net.head = 1
    assert unbatched_layer(net) == (
        "layer 'heads.1' (LSTMCell), whose fused recurrent kernel has no batching rule for "
        "drawn weights"
    )


@pytest.mark.parametrize(
    ("module", "x"),
    [
        (nn.LSTM(2, 3, batch_first=True), torch.randn(4, 5, 2)),
        (nn.GRU(2, 3, batch_first=True), torch.randn(4, 5, 2)),
        (nn.RNN(2, 3, batch_first=True), torch.randn(4, 5, 2)),
        (nn.LSTMCell(2, 3), torch.randn(4, 2)),
    ],
    ids=["lstm", "gru", "rnn", "lstm_cell"],
)
def test_the_kernels_taken_for_unbatched_have_no_batching_rule_in_this_torch(module, x):
    # If a torch release adds the rule, this fails: take the class out of the table, and
    # vmap will be tried (and taken) for it.
    assert isinstance(module, paths._UNBATCHED_WITH_DRAWN_WEIGHTS)
    name, value = next(iter(module.named_parameters()))
    drawn = value.detach().expand(3, *value.shape).clone()
    with pytest.raises(RuntimeError) as caught:
        vmap(lambda w: functional_call(module, {name: w}, (x,)), randomness="different")(drawn)
    assert is_vmap_limitation(caught.value)


def test_a_cell_vmap_batches_is_left_to_vmap():
    cell = nn.GRUCell(2, 3)  # batched by vmap's slow fallback, which it warns of
    assert not isinstance(cell, paths._UNBATCHED_WITH_DRAWN_WEIGHTS)
    name, value = next(iter(cell.named_parameters()))
    drawn = value.detach().expand(3, *value.shape).clone()
    h = torch.randn(4, 2)
    with pytest.warns(UserWarning, match="batching rule for aten::gru_cell"):
        out = vmap(lambda w: functional_call(cell, {name: w}, (h,)))(drawn)
    assert out.shape == (3, 4, 3)
    net = bayesianize(nn.Sequential(nn.Linear(2, 2), nn.GRUCell(2, 3)))
    assert unbatched_layer(net) is None


def test_vmap_limitations_are_told_from_errors_of_a_networks_own():
    assert is_vmap_limitation(RuntimeError("Batching rule not implemented for aten::lstm.input."))
    assert is_vmap_limitation(RuntimeError("vmap: inplace arithmetic(self, *extra_args) is not"))
    assert not is_vmap_limitation(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    # what vmap cannot take or return is a ValueError of vmap's own
    assert is_vmap_limitation(ValueError("vmap(one, ...): `one` must only return Tensors"))
    assert not is_vmap_limitation(ValueError("expected 3 features, got 4"))
    assert not is_vmap_limitation(KeyError("vmap"))
