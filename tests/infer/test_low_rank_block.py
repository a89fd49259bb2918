"""LowRankBlock: a low-rank block's shared draw and closed-form KL, and their hand-written backward.

The values are checked against torch's dense distributions (a ``d x d`` covariance and the
KL divergence ``torch.distributions`` computes), the gradients against finite differences
in float64: for one draw and for several, one prior group and several, prior means of zero
or not, constant and learned prior parameters.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence

from pyro_bbb.infer import _low_rank_block
from pyro_bbb.infer._low_rank_block import LowRankBlock

F64 = torch.float64


def _inputs(sample, sizes, rank=3, prior="given", learned=True):
    d = sum(sizes)
    g = torch.Generator().manual_seed(0)
    kw = {"dtype": F64, "generator": g}
    loc = torch.randn(d, **kw).requires_grad_()
    scale = (torch.rand(d, **kw) + 0.3).requires_grad_()
    factor_t = torch.randn(rank, d, **kw).requires_grad_()
    eps = torch.randn(*sample, rank, **kw)
    locs = (
        None if prior == "zero" else (0.5 * torch.randn(len(sizes), **kw)).requires_grad_(learned)
    )
    coefs = (torch.rand(len(sizes), **kw) + 0.5).requires_grad_(learned)
    return loc, scale, factor_t, eps, locs, coefs


@pytest.mark.parametrize("sample", [(), (3, 1)])
@pytest.mark.parametrize("sizes", [(7,), (4, 2, 5)])
@pytest.mark.parametrize("prior", ["zero", "given"])
def test_values_are_the_draw_and_twice_the_kl_of_the_dense_distributions(sample, sizes, prior):
    loc, scale, factor_t, eps, locs, coefs = _inputs(sample, sizes, prior=prior)
    shared, twice_kl = LowRankBlock.apply(loc, scale, factor_t, eps, locs, coefs, sizes)

    mu, sigma, v = loc.detach(), scale.detach(), factor_t.detach().mT
    torch.testing.assert_close(shared, mu + (v @ eps.unsqueeze(-1)).squeeze(-1))
    q = MultivariateNormal(mu, torch.diag(sigma.square()) + v @ v.mT)
    means = torch.zeros(len(sizes), dtype=F64) if locs is None else locs.detach()
    stds = coefs.detach().rsqrt()
    p_loc = torch.cat([m.expand(n) for m, n in zip(means, sizes, strict=True)])
    p_scale = torch.cat([s.expand(n) for s, n in zip(stds, sizes, strict=True)])
    kl = kl_divergence(q, MultivariateNormal(p_loc, torch.diag(p_scale.square())))
    constants = sum(n * math.log(s**2) for n, s in zip(sizes, stds.tolist(), strict=True))
    torch.testing.assert_close(0.5 * (twice_kl - sum(sizes) + constants), kl)


@pytest.mark.parametrize("sample", [(), (3, 1)])
@pytest.mark.parametrize("sizes", [(7,), (4, 2, 5)])
@pytest.mark.parametrize(("prior", "learned"), [("zero", False), ("given", False), ("given", True)])
def test_gradients_match_finite_differences(sample, sizes, prior, learned):
    loc, scale, factor_t, eps, locs, coefs = _inputs(sample, sizes, prior=prior, learned=learned)

    def terms(loc, scale, factor_t, locs, coefs):
        return LowRankBlock.apply(loc, scale, factor_t, eps, locs, coefs, sizes)

    assert torch.autograd.gradcheck(terms, (loc, scale, factor_t, locs, coefs))


@pytest.mark.parametrize("used", ["draw", "kl"])
def test_an_unused_output_contributes_no_gradient(used):
    loc, scale, factor_t, eps, locs, coefs = _inputs((), (6,), prior="zero", learned=False)
    shared, twice_kl = LowRankBlock.apply(loc, scale, factor_t, eps, locs, coefs, (6,))
    out = shared.square().sum() if used == "draw" else twice_kl
    grads = torch.autograd.grad(out, (loc, scale, factor_t), allow_unused=True)

    m, s, u = (t.detach().requires_grad_() for t in (loc, scale, factor_t))
    if used == "draw":
        expected_out = (m + eps @ u).square().sum()
    else:
        capacitance = torch.eye(3, dtype=F64) + (u / s) @ (u / s).mT
        norms = s.square().sum() + m.square().sum() + u.square().sum()
        expected_out = coefs[0] * norms - 2 * s.log().sum() - torch.logdet(capacitance)
    expected = torch.autograd.grad(expected_out, (m, s, u), allow_unused=True)
    for got, want in zip(grads, expected, strict=True):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want)


def test_the_capacitance_is_whitened_a_chunk_at_a_time(monkeypatch):
    loc, scale, factor_t, eps, locs, coefs = _inputs((), (10, 9))
    whole = LowRankBlock.apply(loc, scale, factor_t, eps, locs, coefs, (10, 9))[1]
    monkeypatch.setattr(_low_rank_block, "_CHUNK_NUMBERS", 3 * 4)  # chunks of 4 columns, and 3
    chunked = LowRankBlock.apply(loc, scale, factor_t, eps, locs, coefs, (10, 9))[1]
    torch.testing.assert_close(chunked, whole)


def test_backward_keeps_no_copy_of_a_parameter():
    loc, scale, factor_t, eps, locs, coefs = _inputs((), (50,), rank=4)
    _, twice_kl = LowRankBlock.apply(loc, scale, factor_t, eps, locs, coefs, (50,))
    parameters = {t.data_ptr() for t in (loc, scale, factor_t)}
    for saved in twice_kl.grad_fn.saved_tensors:
        if saved is not None and saved.numel() >= 50:
            assert saved.data_ptr() in parameters


def test_the_capacitance_is_inverted_without_reading_back_as_torch_does(monkeypatch):
    """The triangular products taken on CUDA (no error code read back) give C^-1 too."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 5, 5, generator=g, dtype=torch.float64)
    capacitance = torch.eye(5, dtype=torch.float64) + a @ a.mT
    tril = _low_rank_block.cholesky(capacitance)
    assert torch.equal(tril, torch.linalg.cholesky(capacitance))
    on_cpu = _low_rank_block.inverse_from_cholesky(tril)
    monkeypatch.setattr(_low_rank_block, "_CHOLESKY_INVERSE_DEVICES", ())  # CUDA's path
    as_on_cuda = _low_rank_block.inverse_from_cholesky(tril)
    torch.testing.assert_close(as_on_cuda, on_cpu, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(as_on_cuda, torch.linalg.inv(capacitance), rtol=1e-10, atol=1e-12)
