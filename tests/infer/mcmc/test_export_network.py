"""What the network export refuses, by name, and what it reads as constants."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pyro_bbb as bbb

from ...support import requires_numpyro

pytestmark = requires_numpyro


def export(net, x, model=None):
    from pyro_bbb.infer.mcmc._jax import jax
    from pyro_bbb.infer.mcmc.export import export_potential
    from pyro_bbb.infer.mcmc.potential import flat_layout

    model = model or bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=len(x))
    y = torch.zeros(len(x), dtype=torch.long)
    sites, *_ = flat_layout(model, x, y, None)
    with jax.enable_x64(True):
        return export_potential(model, x, y, sites)


class Sine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 3)

    def forward(self, x):
        return torch.sin(self.fc(x))


class Branching(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 3)

    def forward(self, x):
        out = self.fc(x)
        return out if out.sum() > 0 else -out


@pytest.mark.parametrize(
    ("net", "x", "message"),
    [
        (bbb.mlp([2, 4, 3], activation=nn.Hardswish), torch.randn(5, 2),
         r"module '1' \(Hardswish\)"),
        (bbb.bayesianize(nn.Sequential(nn.Linear(2, 4), nn.PReLU(), nn.Linear(4, 3))),
         torch.randn(5, 2), r"module '1' \(PReLU\)"),
        (bbb.bayesianize(Sine()), torch.randn(5, 2), "the operation torch.sin"),
        (bbb.bayesianize(Branching()), torch.randn(5, 2), "torch.fx cannot trace"),
        (bbb.bayesianize(nn.Sequential(nn.Conv2d(1, 3, 3), nn.MaxPool2d(2, ceil_mode=True),
                                       nn.Flatten(), nn.Linear(12, 3))),
         torch.randn(5, 1, 6, 6), "ceil_mode"),
        (bbb.bayesianize(nn.Sequential(nn.Conv2d(1, 3, 2), nn.AdaptiveAvgPool2d(2),
                                       nn.Flatten(), nn.Linear(12, 3))),
         torch.randn(5, 1, 6, 6), "5x5 inputs"),
    ],
    ids=["unknown_activation", "unknown_layer", "unknown_function", "untraceable",
         "ceil_mode", "adaptive_pool_uneven"],
)  # fmt: skip
def test_what_cannot_be_exported_is_named_and_sent_to_the_pyro_backend(net, x, message):
    with pytest.raises(NotImplementedError, match=message) as error:
        export(net, x)
    assert "backend='pyro'" in str(error.value)


def test_dropout_in_training_mode_is_refused():
    net, x = bbb.mlp([2, 4, 3], dropout=0.2), torch.randn(5, 2)
    model = bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=len(x))
    with pytest.raises(NotImplementedError, match="dropout in training mode"):
        export(net, x, model)
    model.eval()
    export(net, x, model)


def test_the_sites_are_read_by_the_model_s_names_and_the_rest_are_constants():
    from pyro_bbb.infer.mcmc.export_network import export_network

    net = bbb.mlp([2, 4, 1], deterministic=["2.bias"])
    bbb.BNN(net, bbb.likelihoods.Gaussian(0.1), num_data=3, name="m")(torch.randn(3, 2))
    exported = export_network(net)
    assert exported.sites == {
        "m.0.weight": ("0", "weight"), "m.0.bias": ("0", "bias"), "m.2.weight": ("2", "weight"),
    }  # fmt: skip
