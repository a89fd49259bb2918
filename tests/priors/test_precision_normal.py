"""The precision-form Gaussian against dense multivariate Normals."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import MultivariateNormal

from pyro_bbb.priors.precision_normal import CovarianceRootNormal, LowRankPrecisionNormal


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


def test_an_expanded_copy_shares_the_factorisation_and_copies_nothing_per_draw():
    # a plate of S draws expands the distribution: the r x r algebra stays one, unbatched
    loc, factor, diag, dense = _belief(rank=3)
    fn = LowRankPrecisionNormal(loc, factor, diag)
    fn.rsample()
    wide = fn.expand((200, 1))
    assert wide._draw_coefficients is fn._draw_coefficients
    assert wide._scaled_factor.shape == (7, 3)
    draws = wide.rsample()
    assert draws.shape == (200, 1, 7)
    torch.testing.assert_close(wide.variance, dense.variance.expand(200, 1, 7))
    torch.testing.assert_close(wide.log_prob(draws), dense.log_prob(draws))


def test_a_covariance_root_gives_the_same_gaussian_in_both_forms():
    loc, _, _, dense = _belief(rank=3)
    g = torch.Generator().manual_seed(2)
    root = dense.scale_tril @ torch.linalg.qr(torch.randn(7, 7, generator=g).double())[0]
    fn = CovarianceRootNormal(loc, root)  # any root, not triangular
    torch.testing.assert_close(fn.reparameterize(torch.eye(7).double()) - loc, root.T)
    torch.testing.assert_close(fn.variance, dense.variance)
    assert "_precision_form" not in fn.__dict__  # nothing above needed it
    value = torch.randn(5, 7, dtype=torch.float64)
    torch.testing.assert_close(fn.precision_matrix, dense.precision_matrix)
    torch.testing.assert_close(fn.log_prob(value), dense.log_prob(value))
    torch.testing.assert_close(fn.entropy(), dense.entropy())
    wide = fn.expand((4, 1))
    assert wide.rsample().shape == (4, 1, 7) and wide._factor is fn._factor
