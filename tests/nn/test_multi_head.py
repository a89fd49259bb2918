"""MultiHead: a shared body and one head per task, only the active head drawn."""

from __future__ import annotations

import pyro
import pyro.poutine as poutine
import pytest
import torch
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.nn import MultiHead
from pyro_bbb.priors import Gaussian


def multi_head(num_heads=3):
    body = nn.Sequential(nn.Linear(4, 5), nn.ReLU())
    return MultiHead(body, [nn.Linear(5, 2) for _ in range(num_heads)])


def test_a_bayesian_multi_head_draws_the_body_and_the_active_head_only():
    net = bbb.bayesianize(multi_head(), prior={"heads.*": Gaussian(0.5), "*": Gaussian(1.0)})
    assert net.heads[2].priors["weight"].scale == 0.5
    net.head = 2
    trace = poutine.trace(net).get_trace(torch.randn(7, 4))
    sites = [name for name, site in trace.nodes.items() if site["type"] == "sample"]
    assert sites == ["body.0.weight", "body.0.bias", "heads.2.weight", "heads.2.bias"]


def test_a_multi_head_is_the_body_then_the_head():
    net = multi_head()
    net.head = 1
    x = torch.randn(6, 4)
    assert torch.equal(net(x), net.heads[1](net.body(x)))


def test_a_multi_head_model_predicts_with_vectorised_weight_samples():
    net = bbb.bayesianize(multi_head())
    net.head = 1
    model = bbb.BNN(net, bbb.likelihoods.Categorical(2), num_data=8)
    guide = bbb.MeanFieldGuide(model)
    x = torch.randn(8, 4)
    guide(x)
    pred = bbb.predict(model, guide, x, num_samples=5)
    assert pred.probs_samples.shape == (5, 8, 2)
    assert pyro.get_param_store().keys() >= {"MeanFieldGuide.locs.heads.1.weight"}


@pytest.mark.parametrize("head", [-1, 3, 1.0, True])
def test_a_head_out_of_range_is_refused(head):
    net = multi_head()
    with pytest.raises(ValueError, match=r"head must be an int in \[0, 3\)"):
        net.head = head


def test_a_multi_head_needs_a_head():
    with pytest.raises(ValueError, match="at least one"):
        MultiHead(nn.Linear(2, 2), [])
