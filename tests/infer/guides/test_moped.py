"""MOPED: a mean-field guide that starts at a trained network, scales relative to |w|."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.infer.guides import MOPED


def trained_net():
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    with torch.no_grad():
        net[0].bias.zero_()  # a weight at 0 takes the floor
        net[2].weight.mul_(10.0)
    return net


def test_moped_starts_every_mean_at_the_trained_weight_and_sigma_at_delta_times_its_size():
    trained = trained_net()
    model = bbb.BNN(bbb.bayesianize(trained), bbb.likelihoods.Gaussian(scale=0.1), num_data=5)
    guide = bbb.MeanFieldGuide(model, init_scale=MOPED(0.2, floor=1e-3), min_scale=1e-6)
    guide(torch.randn(5, 3))
    marginals = guide.marginals()
    for name, w in trained.named_parameters():
        loc, scale = marginals[name]
        torch.testing.assert_close(loc, w.detach())
        expected = (0.2 * w.detach().abs()).clamp_min(1e-3)
        torch.testing.assert_close(scale, expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(marginals["0.bias"][1], torch.full((4,), 1e-3))


def test_moped_refuses_a_floor_at_or_below_the_guide_min_scale():
    model = bbb.BNN(bbb.mlp([2, 1]), bbb.likelihoods.Gaussian(scale=0.1), num_data=5)
    with pytest.raises(ValueError, match=r"MOPED floor must exceed min_scale=0.01, got 0.001"):
        bbb.MeanFieldGuide(model, init_scale=MOPED(0.1, floor=1e-3), min_scale=0.01)
    with pytest.raises(ValueError, match=r"delta must be a positive finite number, got 0.0"):
        MOPED(0.0)


def test_moped_in_a_low_rank_guide_splits_each_weights_variance_3_to_1_in_expectation():
    trained = trained_net()
    model = bbb.BNN(bbb.bayesianize(trained), bbb.likelihoods.Gaussian(scale=0.1), num_data=5)
    guide = bbb.LowRankGuide(model, rank=2, init_scale=MOPED(0.2), min_scale=1e-6)
    guide(torch.randn(5, 3))
    block = guide.block_distribution("2")  # the last layer: weight then bias
    w = torch.cat([trained[2].weight.detach().reshape(-1), trained[2].bias.detach()])
    sigma = (0.2 * w.abs()).clamp_min(1e-3)
    torch.testing.assert_close(block.loc, w)
    torch.testing.assert_close(block.cov_diag, 0.75 * sigma**2, rtol=1e-4, atol=1e-9)
    # the factor's rows are sigma_i / (2 sqrt(rank)) times standard normals
    rows = block.cov_factor / (0.5 * sigma[:, None] / 2**0.5)
    assert rows.abs().max() < 6
