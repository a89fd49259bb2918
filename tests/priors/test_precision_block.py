"""The precision-form Gaussian and its block, against dense multivariate Normals."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import MultivariateNormal

from pyro_bbb.priors.precision_block import (
    LowRankPrecisionNormal,
    PrecisionBlock,
    PrecisionSiteConditional,
)

SITES = {"a": (2,), "b": (3, 1), "c": (2,)}


def _belief(d=7, rank=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(d, generator=g, dtype=torch.float64)
    factor = torch.randn(d, rank, generator=g, dtype=torch.float64)
    diag = torch.rand(d, generator=g, dtype=torch.float64) + 0.5
    precision = torch.diag(diag) + factor @ factor.T
    return loc, factor, diag, MultivariateNormal(loc, precision_matrix=precision)


@pytest.mark.parametrize("rank", [0, 1, 3, 9])
def test_moments_and_density_equal_the_dense_gaussian(rank):
    loc, factor, diag, dense = _belief(rank=rank)
    fn = LowRankPrecisionNormal(loc, factor, diag)
    value = torch.randn(5, 7, dtype=torch.float64)
    torch.testing.assert_close(fn.covariance_matrix, dense.covariance_matrix)
    torch.testing.assert_close(fn.precision_matrix, dense.precision_matrix)
    torch.testing.assert_close(fn.variance, dense.variance)
    torch.testing.assert_close(fn.log_prob(value), dense.log_prob(value))
    torch.testing.assert_close(fn.entropy(), dense.entropy())


def test_the_draw_is_a_square_root_of_the_covariance():
    loc, factor, diag, dense = _belief()
    fn = LowRankPrecisionNormal(loc, factor, diag)
    root = fn.reparameterize(torch.eye(7, dtype=torch.float64)) - loc  # rows: T e_i
    torch.testing.assert_close(root.T @ root, dense.covariance_matrix)


def test_draws_match_the_covariance_in_distribution():
    loc, factor, diag, dense = _belief()
    fn = LowRankPrecisionNormal(loc, factor, diag)
    torch.manual_seed(1)
    draws = fn.rsample((40_000,))
    # σ of a covariance entry estimate ≈ sqrt((Σii Σjj + Σij²)/n): ~0.01 here; 5 σ
    torch.testing.assert_close(torch.cov(draws.T), dense.covariance_matrix, atol=0.06, rtol=0)


def test_expand_and_batch_shapes():
    loc, factor, diag, _ = _belief()
    fn = LowRankPrecisionNormal(loc, factor, diag).expand((4, 1))
    assert fn.batch_shape == (4, 1) and fn.event_shape == (7,)
    assert fn.rsample((2,)).shape == (2, 4, 1, 7)
    assert fn.log_prob(torch.zeros(3, 1, 1, 7, dtype=torch.float64)).shape == (3, 4, 1)


def test_rejects_inconsistent_shapes():
    loc, factor, diag, _ = _belief()
    with pytest.raises(ValueError, match="precision_factor"):
        LowRankPrecisionNormal(loc, factor[:5], diag)


def _block(rank=3):
    loc, factor, diag, dense = _belief(rank=rank)
    return PrecisionBlock(loc, factor, diag, SITES), dense


def _values(seed=3):
    g = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(shape, generator=g, dtype=torch.float64) for name, shape in SITES.items()
    }


@pytest.mark.parametrize("order", [("a", "b", "c"), ("c", "a", "b"), ("b", "c", "a")])
def test_site_conditionals_multiply_to_the_joint_density_in_any_order(order):
    block, dense = _block()
    values = _values()
    where = {"device": torch.device("cpu"), "dtype": torch.float64}
    total, drawn = 0.0, {}
    for site in order:
        fn = block.conditional(site, drawn, **where)
        assert isinstance(fn, PrecisionSiteConditional) and fn.event_shape == SITES[site]
        total = total + fn.log_prob(values[site])
        drawn[site] = values[site]
    flat = torch.cat([values[name].reshape(-1) for name in SITES])
    torch.testing.assert_close(total, dense.log_prob(flat))


def test_a_site_drawn_first_has_its_marginal_and_the_marginal_std_matches():
    block, dense = _block()
    where = {"device": torch.device("cpu"), "dtype": torch.float64}
    fn = block.conditional("b", {}, **where)
    marginal = dense.covariance_matrix[2:5, 2:5]
    torch.testing.assert_close(fn.flat.covariance_matrix, marginal)
    _, std = block.site_marginal("b")
    torch.testing.assert_close(std.reshape(-1), marginal.diagonal().sqrt())


def test_conditionals_take_drawn_values_with_sample_dims():
    block, _ = _block()
    where = {"device": torch.device("cpu"), "dtype": torch.float64}
    drawn = {"a": torch.randn(4, 1, 2, dtype=torch.float64)}
    fn = block.conditional("b", drawn, **where)
    assert fn.batch_shape == (4, 1)
    assert fn.rsample().shape == (4, 1, 3, 1)
    one = block.conditional("b", {"a": drawn["a"][2, 0]}, **where)
    torch.testing.assert_close(fn.mean[2, 0], one.mean)


def test_block_rejects_unknown_sites_and_wrong_shapes():
    block, _ = _block()
    where = {"device": torch.device("cpu"), "dtype": torch.float64}
    with pytest.raises(KeyError, match="not in the block"):
        block.conditional("z", {}, **where)
    with pytest.raises(ValueError, match="must end in shape"):
        block.conditional("b", {"a": torch.zeros(3, dtype=torch.float64)}, **where)
    loc, factor, diag, _ = _belief()
    with pytest.raises(ValueError, match="positive"):
        PrecisionBlock(loc, factor, -diag, SITES)
