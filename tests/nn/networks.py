"""Small networks and loop references shared by the tests of :mod:`pyro_bbb.nn`."""

from __future__ import annotations

import pyro
import torch
import torch.nn.functional as F
from torch import nn


class TwoLayerNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 5)
        self.fc2 = nn.Linear(5, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class NestedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(self.body(x))


def sample_sites(fn, *args) -> dict[str, dict]:
    trace = pyro.poutine.trace(fn).get_trace(*args)
    return {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and name != "data"
    }


def linear_loop(x, weight, bias):
    """Reference: one F.linear per sample; x (P, B, in) or (B, in)."""
    outs = []
    for p in range(weight.shape[0]):
        xp = x[p] if x.dim() == 3 else x
        outs.append(F.linear(xp, weight[p].reshape(weight.shape[-2:]), bias[p].reshape(-1)))
    return torch.stack(outs)


def conv_loop(x, weight, bias, **kwargs):
    """Reference: one F.conv2d per sample; x (P, B, C, H, W) or (B, C, H, W)."""
    outs = []
    for p in range(weight.shape[0]):
        xp = x[p] if x.dim() == 5 else x
        w = weight[p].reshape(weight.shape[-4:])
        outs.append(F.conv2d(xp, w, bias[p].reshape(-1), **kwargs))
    return torch.stack(outs)
