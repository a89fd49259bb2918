"""Tests of pyro_bbb.infer.kl: the fast diagonal-Gaussian KL against torch's rule."""

import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import kl_divergence

from pyro_bbb.infer.kl import (
    _LOW_RANK_PARTS,
    diagonal_normal_kl,
    kl_diagonal_low_rank,
    kl_low_rank_low_rank,
    kl_to_scalar_normal,
)
from pyro_bbb.priors import ScaleMixture

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@settings(max_examples=60, deadline=None)
@given(
    shape=shapes,
    particles=st.sampled_from([None, 1, 3]),
    per_weight_prior=st.booleans(),
    prior_loc=st.floats(-1, 1),
    prior_scale=st.floats(0.05, 3),
    seed=st.integers(0, 2**16),
)
def test_diagonal_normal_kl_equals_torch(
    shape, particles, per_weight_prior, prior_loc, prior_scale, seed
):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(shape, generator=g, dtype=torch.float64)
    scale = torch.rand(shape, generator=g, dtype=torch.float64) + 0.01
    if per_weight_prior:
        p_loc = torch.randn(shape, generator=g, dtype=torch.float64)
        p_scale = torch.rand(shape, generator=g, dtype=torch.float64) + 0.1
        p = dist.Normal(p_loc, p_scale)
    else:
        p = dist.Normal(torch.tensor(prior_loc, dtype=torch.float64), prior_scale).expand(shape)
    q = dist.Normal(loc, scale).to_event(len(shape))
    p = p.to_event(len(shape))
    if particles is not None:  # as a particle plate broadcasts a global site
        q, p = q.expand((particles, 1)), p.expand((particles, 1))
    fast = diagonal_normal_kl(q, p)
    assert fast is not None
    expected = kl_divergence(q, p)
    assert fast.shape == expected.shape
    torch.testing.assert_close(fast, expected, rtol=1e-9, atol=1e-9)


def test_diagonal_normal_kl_gradients_match_torch():
    loc = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    rho = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    prior = dist.Normal(torch.tensor(0.2, dtype=torch.float64), 0.7).expand((5, 3)).to_event(2)
    grads = []
    for kl in (diagonal_normal_kl, kl_divergence):
        q = dist.Normal(loc, torch.nn.functional.softplus(rho)).to_event(2)
        grads.append(torch.autograd.grad(kl(q, prior), (loc, rho)))
    for fast, general in zip(*grads, strict=True):
        torch.testing.assert_close(fast, general)


@pytest.mark.parametrize("batch", [(), (3,)], ids=["one event", "a batch of events"])
@pytest.mark.parametrize("shape", [(7,), (4, 6), (2, 3, 5)])
@pytest.mark.parametrize("prior", [(0.0, 1.0), (0.3, 0.5)])
def test_kl_to_scalar_normal_equals_torch_with_or_without_the_callers_variance(batch, shape, prior):
    # one event takes the dot-product path, a batch of them (ensemble members) the general one
    torch.manual_seed(0)
    loc = torch.randn(batch + shape, dtype=torch.float64, requires_grad=True)
    rho = torch.randn(batch + shape, dtype=torch.float64, requires_grad=True)
    m, s = prior
    expected = kl_divergence(
        dist.Normal(loc, torch.nn.functional.softplus(rho)).to_event(len(shape)),
        dist.Normal(m, s).expand(batch + shape).to_event(len(shape)),
    ).sum()
    grads = torch.autograd.grad(expected, (loc, rho))
    for given_variance in (False, True):
        scale = torch.nn.functional.softplus(rho)
        variance = scale.square() if given_variance else None
        kl = kl_to_scalar_normal(loc, scale, m, s, event_dims=len(shape), variance=variance)
        assert kl.shape == batch
        kl = kl.sum()
        torch.testing.assert_close(kl, expected)
        for got, want in zip(torch.autograd.grad(kl, (loc, rho)), grads, strict=True):
            torch.testing.assert_close(got, want)
    # the caller's variance is what is summed, not σ·σ taken again
    scale = torch.nn.functional.softplus(rho).detach()
    doubled = kl_to_scalar_normal(loc, scale, m, s, event_dims=len(shape), variance=2 * scale**2)
    torch.testing.assert_close(doubled.sum() - expected, scale.square().sum() / (2 * s * s))


def test_diagonal_normal_kl_declines_what_it_does_not_cover():
    q = dist.Normal(torch.zeros(3), 1.0).to_event(1)
    assert diagonal_normal_kl(q, ScaleMixture().expand((3,)).to_event(1)) is None
    assert diagonal_normal_kl(q, dist.Normal(torch.zeros(3), 1.0)) is None  # event dims differ
    assert diagonal_normal_kl(dist.Laplace(torch.zeros(3), 1.0).to_event(1), q) is None


def test_diagonal_normal_kl_keeps_a_learnable_prior_scale_in_the_graph():
    log_scale = torch.zeros((), requires_grad=True)
    q = dist.Normal(torch.ones(4), 0.5).to_event(1)
    p = dist.Normal(0.0, log_scale.exp()).expand((4,)).to_event(1)
    (grad,) = torch.autograd.grad(diagonal_normal_kl(q, p), log_scale)
    # d/ds KL at s = 1: n - (Σσ² + Σμ²) = 4 - (4·0.25 + 4) = -1
    assert grad.item() == pytest.approx(-1.0)


def _dense(q):
    """A Gaussian over (d,) as a dense MultivariateNormal."""
    if isinstance(q, torch.distributions.LowRankMultivariateNormal):
        return torch.distributions.MultivariateNormal(q.loc, q.covariance_matrix)
    return torch.distributions.MultivariateNormal(
        q.base_dist.loc, torch.diag_embed(q.base_dist.variance)
    )


@pytest.mark.parametrize("batch", [(), (4, 1)])
def test_diagonal_against_low_rank_kl_equals_the_dense_gaussian_kl(batch):
    g = torch.Generator().manual_seed(0)
    d, r = 9, 3
    p = dist.LowRankMultivariateNormal(
        torch.randn(d, generator=g, dtype=torch.float64),
        torch.randn(d, r, generator=g, dtype=torch.float64),
        torch.rand(d, generator=g, dtype=torch.float64) + 0.1,
    )
    q = dist.Normal(
        torch.randn(*batch, d, generator=g, dtype=torch.float64),
        torch.rand(*batch, d, generator=g, dtype=torch.float64) + 0.1,
    ).to_event(1)
    expected = kl_divergence(_dense(q), _dense(p))
    assert kl_diagonal_low_rank(q, p).shape == batch
    assert torch.allclose(kl_diagonal_low_rank(q, p), expected, rtol=1e-10)
    assert torch.allclose(kl_divergence(q, p), expected, rtol=1e-10)  # what dispatch picks


@pytest.mark.parametrize("batch", [(), (4, 1)])
def test_low_rank_against_low_rank_kl_equals_the_dense_kl_and_torchs_rule(batch):
    g = torch.Generator().manual_seed(1)
    d = 8

    def low_rank(rank, batch=()):
        return dist.LowRankMultivariateNormal(
            torch.randn(*batch, d, generator=g, dtype=torch.float64),
            torch.randn(d, rank, generator=g, dtype=torch.float64),
            torch.rand(d, generator=g, dtype=torch.float64) + 0.1,
        )

    q, p = low_rank(2, batch), low_rank(3)
    expected = kl_divergence(_dense(q), _dense(p))
    assert kl_divergence(q, p).shape == batch
    assert torch.allclose(kl_low_rank_low_rank(q, p), expected, rtol=1e-10)
    assert torch.allclose(kl_divergence(q, p), expected, rtol=1e-10)  # what dispatch picks
    torch_rule = torch.distributions.kl._kl_lowrankmultivariatenormal_lowrankmultivariatenormal
    assert torch.allclose(kl_divergence(q, p), torch_rule(q, p), rtol=1e-10)


def test_a_low_rank_priors_inverse_is_computed_once_and_not_for_a_learnable_one():
    g = torch.Generator().manual_seed(2)
    d = 6
    q = dist.Normal(torch.randn(d, generator=g), torch.rand(d, generator=g) + 0.1).to_event(1)
    p = dist.LowRankMultivariateNormal(
        torch.zeros(d), torch.randn(d, 2, generator=g), torch.ones(d)
    )
    first = kl_diagonal_low_rank(q, p)
    assert p in _LOW_RANK_PARTS
    assert torch.equal(kl_diagonal_low_rank(q, p), first)
    factor = torch.randn(d, 2, generator=g, requires_grad=True)
    learnable = dist.LowRankMultivariateNormal(torch.zeros(d), factor, torch.ones(d))
    kl_diagonal_low_rank(q, learnable).backward()
    assert learnable not in _LOW_RANK_PARTS and factor.grad is not None
