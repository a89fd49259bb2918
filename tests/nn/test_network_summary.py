"""Tests of pyro_bbb.nn.network_summary: every parameter listed, Bayesian or point estimate."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.nn import bayesianize, summary
from pyro_bbb.priors import Gaussian


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(2, 3, batch_first=True)
        self.norm = nn.LayerNorm(3)
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(self.norm(out[..., -1, :]))


def test_summary_lists_every_parameter_with_its_kind_shape_prior_and_estimator():
    module = Recurrent()
    net = bayesianize(module, {"head.*": Gaussian(0.5), "*": Gaussian(1.0)}, deterministic="norm.*")
    table = summary(net, reparam="local")
    by_name = {p.name: p for p in table.parameters}
    assert set(by_name) == {name for name, _ in module.named_parameters()}
    assert by_name["head.weight"].estimator == "local"
    assert by_name["head.weight"].prior == "Gaussian(scale=0.5, loc=0)"
    assert by_name["rnn.weight_hh_l0"].estimator == "weight sampling"
    assert by_name["rnn.weight_hh_l0"].shape == (9, 3)
    assert by_name["rnn.weight_hh_l0"].module_type == "GRU"
    assert {p.name for p in table.deterministic} == {"norm.weight", "norm.bias"}
    total = sum(p.numel() for p in module.parameters())
    assert sum(p.count for p in table.parameters) == total
    text = str(table)
    assert "| norm.bias | LayerNorm | point estimate | 3 | - | - | 3 |" in text
    bayesian = sum(p.count for p in table.bayesian)
    assert f"Bayesian: {bayesian:,} scalars in {len(table.bayesian)} sites" in text


def test_a_model_summary_uses_the_model_site_names_and_lists_a_learned_noise():
    net = bbb.mlp([2, 3, 1])
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=4, name="m")
    names = [p.name for p in model.summary().parameters]
    assert names[:4] == ["m.0.weight", "m.0.bias", "m.2.weight", "m.2.bias"]
    assert any(name.startswith("m.likelihood") for name in names[4:])
    assert bbb.nn.summary(model).parameters == model.summary().parameters


def test_fit_with_an_estimator_names_the_layers_left_to_weight_sampling():
    x, y = torch.randn(8, 4, 2), torch.randn(8)
    model = bbb.BNN(bayesianize(Recurrent()), bbb.likelihoods.Gaussian(scale=0.5), num_data=8)
    guide = bbb.MeanFieldGuide(model)
    with pytest.warns(UserWarning, match=r"applies to the affine layers \['head'\]; the layers "
                      r"\['rnn', 'norm'\] have no affine map"):  # fmt: skip
        bbb.fit(model, guide, x, y, epochs=1, reparam="flipout", progress=False)


def test_fit_of_an_affine_network_with_an_estimator_does_not_warn():
    x, y = torch.randn(8, 2), torch.randn(8)
    model = bbb.BNN(bbb.mlp([2, 3, 1]), bbb.likelihoods.Gaussian(scale=0.5), num_data=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", bbb.ConvergenceWarning)  # one epoch: not the point
        bbb.fit(model, bbb.MeanFieldGuide(model), x, y, epochs=1, reparam="local", progress=False)


def test_a_frozen_body_under_a_bayesian_head_is_listed_as_frozen_and_is_not_trained():
    trained = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))
    for param in trained[0].parameters():
        param.requires_grad_(False)
    model = bbb.BNN(bayesianize(trained, only="2.*"), bbb.likelihoods.Gaussian(scale=0.5), 8)
    table = model.summary()
    assert [p.name for p in table.deterministic if not p.trainable] == ["0.weight", "0.bias"]
    assert "| 0.weight | Linear | point estimate (frozen) | 3×2 |" in str(table)
    before = trained[0].weight.detach().clone()
    bbb.fit(model, bbb.MeanFieldGuide(model), torch.randn(8, 2), torch.randn(8), epochs=3,
            progress=False)  # fmt: skip
    assert torch.equal(model.net[0].weight, before)
