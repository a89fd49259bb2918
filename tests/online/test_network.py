"""The network as a function of its flat weights: layout, priors, and Jacobians by torch.func."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.online.network import (
    network_function,
    outputs_and_jacobian,
    pull_back_rows,
    weight_layout,
)
from pyro_bbb.priors import FanInGaussian, Gaussian, ScaleMixture


def _networks():
    torch.manual_seed(0)
    conv = nn.Sequential(
        nn.Conv1d(1, 3, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 8, 2)
    )
    return {
        "mlp": (bbb.mlp([3, 5, 4, 2], activation="tanh"), torch.randn(4, 3)),
        "bayesianized": (
            bbb.bayesianize(nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))),
            torch.randn(4, 3),
        ),
        "conv1d": (bbb.bayesianize(conv), torch.randn(4, 1, 8)),
        "layernorm": (
            bbb.bayesianize(nn.Sequential(nn.Linear(3, 5), nn.LayerNorm(5), nn.Linear(5, 2))),
            torch.randn(4, 3),
        ),
    }


@pytest.mark.parametrize("name", list(_networks()))
def test_the_jacobian_is_autograd_s_on_every_kind_of_network(name):
    net, x = _networks()[name]
    model = bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=10)
    layout = weight_layout(model, x)
    f = network_function(model, layout, x)
    theta = layout.prior_loc + 0.3 * torch.randn(layout.size)
    outputs, jacobian = outputs_and_jacobian(f, layout, theta, x)
    expected = torch.autograd.functional.jacobian(lambda t: f(layout.unflatten(t), x), theta)
    torch.testing.assert_close(outputs, f(layout.unflatten(theta), x))
    torch.testing.assert_close(jacobian, expected, atol=1e-5, rtol=1e-4)


def test_several_weight_vectors_are_vectorised():
    net, x = _networks()["mlp"]
    model = bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=10)
    layout = weight_layout(model, x)
    f = network_function(model, layout, x)
    thetas = torch.randn(3, layout.size)
    outputs, jacobian = outputs_and_jacobian(f, layout, thetas, x)
    assert outputs.shape == (3, 4, 2) and jacobian.shape == (3, 4, 2, layout.size)
    one = outputs_and_jacobian(f, layout, thetas[1], x)[1]
    torch.testing.assert_close(jacobian[1], one)


def test_pulled_back_cotangents_are_jacobian_transposed_products():
    net, x = _networks()["mlp"]
    model = bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=10)
    layout = weight_layout(model, x)
    f = network_function(model, layout, x)
    theta = torch.randn(layout.size)
    y = torch.randn(4, 2)

    def cotangents(out, target):
        return torch.stack([out * target, target.square()], -1)  # (C, 2), from out and y

    outputs, pulled = pull_back_rows(f, layout, theta, x, y, cotangents)
    _, jacobian = outputs_and_jacobian(f, layout, theta, x)
    for n in range(4):
        u = cotangents(outputs[n], y[n])
        torch.testing.assert_close(pulled[:, n], (jacobian[n].T @ u).T)


def test_the_layout_reads_names_shapes_and_prior_variances():
    model = bbb.BNN(bbb.mlp([3, 4, 1], prior=FanInGaussian(2.0)), bbb.likelihoods.Gaussian(), 10)
    layout = weight_layout(model, torch.zeros(1, 3))
    assert layout.sites == {
        "0.weight": (4, 3),
        "0.bias": (4,),
        "2.weight": (1, 4),
        "2.bias": (1,),
    }
    expected = torch.cat([torch.full((16,), 4 / 3), torch.full((5,), 4 / 4)])
    torch.testing.assert_close(layout.prior_variance, expected)
    theta = torch.arange(21.0)
    torch.testing.assert_close(layout.flatten(layout.unflatten(theta)), theta)
    with pytest.raises(ValueError, match=r"site '0\.bias' must have shape"):
        layout.flatten({**layout.unflatten(theta), "0.bias": torch.zeros(3)})


def test_a_non_gaussian_prior_is_refused_by_name():
    net = bbb.mlp([2, 3, 1], prior={"0.*": ScaleMixture(), "2.*": Gaussian(1.0)})
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=10)
    with pytest.raises(ValueError, match=r"site '0\.weight' has a ScaleMixture prior"):
        weight_layout(model, torch.zeros(1, 2))


def test_the_layout_leaves_the_random_state_as_it_was():
    model = bbb.BNN(bbb.mlp([3, 4, 1]), bbb.likelihoods.Gaussian(), num_data=10)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    weight_layout(model, torch.zeros(2, 3))
    torch.testing.assert_close(torch.rand(3), expected)
