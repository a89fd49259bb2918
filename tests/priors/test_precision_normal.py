"""The precision-form Gaussian against dense multivariate Normals."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import MultivariateNormal

from pyro_bbb.priors.precision_normal import LowRankPrecisionNormal


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
