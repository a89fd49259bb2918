"""FactorTerms: the low-rank block's shared draw and factor terms, and their hand-written backward.

The values are checked against the dense formulas (a ``d x d`` covariance and its
log-determinant), the gradients against finite differences in float64, for one draw and for
several, one prior group and several, constant and learned prior coefficients.
"""

from __future__ import annotations

import pytest
import torch

from pyro_bbb.infer import _factor_terms
from pyro_bbb.infer._factor_terms import FactorTerms


def _inputs(sample, sizes, rank=3, coefs_grad=True):
    d = sum(sizes)
    g = torch.Generator().manual_seed(0)
    kw = {"dtype": torch.float64, "generator": g}
    loc = torch.randn(d, **kw).requires_grad_()
    scale = (torch.rand(d, **kw) + 0.3).requires_grad_()
    factor_t = torch.randn(rank, d, **kw).requires_grad_()
    eps = torch.randn(*sample, rank, **kw)
    coefs = (torch.rand(len(sizes), **kw) + 0.5).requires_grad_(coefs_grad)
    return loc, scale, factor_t, eps, coefs


@pytest.mark.parametrize("sample", [(), (3, 1)])
@pytest.mark.parametrize("sizes", [(7,), (4, 2, 5)])
def test_values_are_the_dense_formulas(sample, sizes):
    loc, scale, factor_t, eps, coefs = _inputs(sample, sizes)
    shared, f = FactorTerms.apply(loc, scale, factor_t, eps, coefs, sizes)

    v = factor_t.detach().mT
    torch.testing.assert_close(shared, loc + (v @ eps.unsqueeze(-1)).squeeze(-1))
    covariance = torch.diag(scale.detach().square()) + v @ v.mT
    # log det(I + V^T D^-1 V) = log det(D + V V^T) - log det D
    log_det = torch.logdet(covariance) - 2 * scale.detach().log().sum()
    trace = sum(
        c * rows.square().sum()
        for c, rows in zip(coefs.detach(), v.mT.split(sizes, -1), strict=True)
    )
    torch.testing.assert_close(f, trace - log_det)


@pytest.mark.parametrize("sample", [(), (3, 1)])
@pytest.mark.parametrize("sizes", [(7,), (4, 2, 5)])
@pytest.mark.parametrize("coefs_grad", [True, False])
def test_gradients_match_finite_differences(sample, sizes, coefs_grad):
    loc, scale, factor_t, eps, coefs = _inputs(sample, sizes, coefs_grad=coefs_grad)

    def terms(loc, scale, factor_t, coefs):
        return FactorTerms.apply(loc, scale, factor_t, eps, coefs, sizes)

    assert torch.autograd.gradcheck(terms, (loc, scale, factor_t, coefs))


@pytest.mark.parametrize("used", ["draw", "kl"])
def test_an_unused_output_contributes_no_gradient(used):
    loc, scale, factor_t, eps, coefs = _inputs((), (6,))
    shared, f = FactorTerms.apply(loc, scale, factor_t, eps, coefs, (6,))
    out = shared.square().sum() if used == "draw" else f
    grads = torch.autograd.grad(out, (loc, scale, factor_t), allow_unused=True)

    v = factor_t.detach().requires_grad_()
    s = scale.detach().requires_grad_()
    m = loc.detach().requires_grad_()
    if used == "draw":
        expected_out = (m + eps @ v).square().sum()
    else:
        cap = torch.eye(3, dtype=v.dtype) + (v / s) @ (v / s).mT
        expected_out = coefs.detach()[0] * v.square().sum() - torch.logdet(cap)
    expected = torch.autograd.grad(expected_out, (m, s, v), allow_unused=True)
    for got, want in zip(grads, expected, strict=True):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want)


def test_the_capacitance_is_whitened_a_chunk_at_a_time(monkeypatch):
    loc, scale, factor_t, eps, coefs = _inputs((), (10, 9))
    whole = FactorTerms.apply(loc, scale, factor_t, eps, coefs, (10, 9))[1]
    monkeypatch.setattr(_factor_terms, "_CHUNK_NUMBERS", 3 * 4)  # chunks of 4 columns, and 3
    torch.testing.assert_close(
        FactorTerms.apply(loc, scale, factor_t, eps, coefs, (10, 9))[1], whole
    )


def test_backward_keeps_no_copy_of_the_factor():
    loc, scale, factor_t, eps, coefs = _inputs((), (50,), rank=4)
    _, f = FactorTerms.apply(loc, scale, factor_t, eps, coefs, (50,))
    saved = f.grad_fn.saved_tensors
    big = [t for t in saved if t.numel() >= factor_t.numel()]
    assert len(big) == 1 and big[0].data_ptr() == factor_t.data_ptr()
    assert all(t.numel() <= 50 for t in saved if t is not big[0])
