"""Tests of pyro_bbb.nn.draws.current: the draw under way and what a layer may ask of it.

The rules are those stated in :mod:`pyro_bbb.nn.draws`: outside a pass there is no draw;
inside one a site reads as this draw's view, ``as_drawn`` finds the value as drawn by
identity, and ``select`` takes this draw's part of anything carrying the draws' dims.
"""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn
from torch.func import vmap

from pyro_bbb.nn import bayesianize
from pyro_bbb.nn.draws import Draw, DrawPath, current_draw, draw_path, one_draw
from pyro_bbb.nn.draws.current import drawn_once, running_draw


def _draw(sample, index, full):
    """A draw of the sites ``full`` (values as drawn), its views taken as the runner takes them."""
    count = torch.Size(sample).numel()
    views = {}
    for site, value in full.items():
        event = value.shape[len(sample) + 1 :]  # (*sample, 1, *event), under a data plate
        views[site] = value.reshape(count, *event)[index]
    return Draw(torch.Size(sample), index, full, views)


def test_select_takes_the_index_th_draw_of_a_tensor_with_the_draws_dims():
    value = torch.randn(6, 1, 4, 3)  # six draws under a data plate, a 4 x 3 weight
    replayed = value.squeeze(1)  # as Predictive replays them, no data-plate dim
    for index in range(6):
        draw = _draw((6,), index, {"w": value})
        torch.testing.assert_close(draw.select(value.exp(), 2), value[index, 0].exp())
        torch.testing.assert_close(draw.select(replayed.exp(), 2), value[index, 0].exp())


def test_select_gives_a_sites_own_view_without_a_copy():
    value = torch.randn(3, 1, 2)
    draw = _draw((3,), 1, {"b": value})
    view = draw.views["b"]
    assert draw.select(value, 1, "b") is view
    assert draw.select(view, 1, "b") is view
    # the same numbers in another tensor are not the site's: sliced like any other
    other = value.clone()
    assert draw.select(other, 1, "b") is not view
    torch.testing.assert_close(draw.select(other, 1, "b"), view)


def test_select_shares_what_has_no_or_size_one_sample_dims_across_draws():
    draw = _draw((4,), 2, {"w": torch.randn(4, 1, 3)})
    shared = torch.randn(3)
    assert draw.select(shared, 1) is shared  # a parameter every draw shares
    one = torch.randn(1, 1, 3)  # a part collapsed to one (a mean broadcast over particles)
    torch.testing.assert_close(draw.select(one, 1), one.reshape(3))


def test_select_follows_several_sample_dims_and_broadcasts_smaller_ones():
    # a pass over (particles 2, members 3): draw i is (i // 3, i % 3)
    draw_values = torch.randn(2, 3, 1, 5)
    per_member = torch.randn(3, 1, 5)  # the same for both particles
    for index in range(6):
        draw = _draw((2, 3), index, {"w": draw_values})
        torch.testing.assert_close(
            draw.select(draw_values, 1), draw_values[index // 3, index % 3, 0]
        )
        torch.testing.assert_close(draw.select(per_member, 1), per_member[index % 3, 0])


def test_select_under_vmap_gives_each_draw_its_own_slice():
    value = torch.randn(5, 1, 2, 3)
    variance = value.square()

    def one(index):
        return _draw((5,), index, {"w": value}).select(variance, 2)

    torch.testing.assert_close(vmap(one)(torch.arange(5)), variance.squeeze(1))


def test_as_drawn_finds_the_value_as_drawn_by_identity_only():
    value = torch.randn(3, 1, 2)
    draw = _draw((3,), 0, {"b": value})
    assert draw.as_drawn("b", draw.views["b"]) is value
    copy = draw.views["b"].clone()  # equal, but not what the site reads as
    assert draw.as_drawn("b", copy) is copy
    assert draw.as_drawn("other", draw.views["b"]) is draw.views["b"]  # not a drawn site
    assert draw.as_drawn(None, draw.views["b"]) is draw.views["b"]  # not a site at all


def test_the_current_draw_is_the_innermost_running_one_and_none_outside():
    assert current_draw() is None
    outer, inner = _draw((2,), 0, {}), _draw((2,), 1, {})
    with running_draw(outer):
        assert current_draw() is outer
        with pytest.raises(KeyError), running_draw(inner):
            assert current_draw() is inner
            raise KeyError("a failing draw")
        assert current_draw() is outer
    assert current_draw() is None


class _Reader(nn.Module):
    """Records, on every draw, what a layer reads and what the current draw says of it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.seen: list[tuple] = []

    def forward(self, x):
        draw = current_draw()
        weight = self.fc.weight
        self.seen.append((draw, weight, draw.as_drawn("fc.weight", weight)))
        return self.fc(x)


@pytest.mark.parametrize("vectorised", [True, False])
def test_inside_a_pass_a_site_reads_as_the_current_draws_view(vectorised):
    net = bayesianize(_Reader())
    if not vectorised:  # a data-dependent branch sends the draws round a loop
        net.fc.register_forward_hook(lambda m, i, out: out.abs() if out.sum() < 0 else out)
    x = torch.randn(4, 3)
    with pyro.plate("draws", 3, dim=-2), pyro.poutine.trace() as tape:
        out = net(x)
    assert out.shape == (3, 4, 2)
    assert draw_path(net).path is (DrawPath.VMAP if vectorised else DrawPath.LOOP)
    drawn = tape.trace.nodes["fc.weight"]["value"]  # (3, 1, 2, 3)
    seen = net.seen[-1] if vectorised else net.seen[-3:]
    for draw, weight, as_drawn in [seen] if vectorised else seen:
        assert draw is not None and draw.sample == (3,)
        assert weight is draw.views["fc.weight"] and weight.shape == (2, 3)
        assert as_drawn is drawn is draw.full["fc.weight"]
    assert current_draw() is None  # the pass is over


def test_one_draw_runs_a_networks_forward_without_reading_its_sites(monkeypatch):
    import pyro_bbb.nn.draws.per_draw as per_draw

    net = bayesianize(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 1)))
    assert draw_path(net) is None or draw_path(net).path is not DrawPath.BROADCAST
    x = torch.randn(5, 3)
    read = []
    original = per_draw._draw_sites
    monkeypatch.setattr(per_draw, "_draw_sites", lambda n: read.append(n) or original(n))
    torch.manual_seed(0)
    net(x)
    assert read  # without the claim the runner reads every site for sample dims
    read.clear()
    with one_draw():
        assert drawn_once()
        torch.manual_seed(0)
        out = net(x)
    assert not read and not drawn_once()
    torch.manual_seed(0)
    torch.testing.assert_close(out, net(x))
