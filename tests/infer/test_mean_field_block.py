"""The one-pass mean-field draw and KL against the same terms left to autograd, site by site."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pyro_bbb.infer._mean_field_block import MeanFieldBlock, SiteLayout

SHAPES = [torch.Size([4, 3]), torch.Size([4]), torch.Size([2, 3, 3, 3]), torch.Size([1])]


def _sites(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    locs = [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in SHAPES]
    rhos = [(torch.randn(s, generator=g, dtype=dtype) - 2).requires_grad_() for s in SHAPES]
    return locs, rhos


def _by_autograd(layout, locs, rhos, sample=()):
    """The terms as the site-by-site path computes them: w = μ + σε, the closed-form KL."""
    values, kls = [], []
    for loc, rho, m, s in zip(locs, rhos, layout.prior_locs, layout.prior_scales, strict=True):
        scale = F.softplus(rho) + layout.min_scale
        eps = torch.empty((*sample, *loc.shape), dtype=loc.dtype).normal_()
        values.append(torch.addcmul(loc, eps, scale))
        q = torch.distributions.Normal(loc, scale)
        p = torch.distributions.Normal(torch.full_like(loc, m), torch.full_like(loc, s))
        kls.append(torch.distributions.kl_divergence(q, p).sum())
    return torch.stack(kls), values


def _tensors(numbers):
    """The prior's numbers as 0-d tensors, as they come from a prior on a GPU."""
    return [torch.tensor(v, dtype=torch.float64) for v in numbers]


@pytest.mark.parametrize("sample", [(), (3, 1)], ids=["one draw", "three particles"])
@pytest.mark.parametrize("numbers", [float, _tensors], ids=["floats", "0-d tensors"])
@pytest.mark.parametrize(
    ("prior_locs", "prior_scales"),
    [([0.0] * 4, [1.0] * 4), ([0.1, 0.0, -0.3, 0.2], [0.5, 1.0, 2.0, 0.1])],
    ids=["one N(0, 1)", "a prior per site"],
)
def test_draws_kl_and_every_gradient_equal_autograds(prior_locs, prior_scales, numbers, sample):
    if numbers is float:
        layout = SiteLayout(SHAPES, prior_locs, prior_scales, 1e-6)
    else:
        layout = SiteLayout(SHAPES, _tensors(prior_locs), _tensors(prior_scales), 1e-6)
    locs, rhos = _sites()
    torch.manual_seed(3)
    total, kl, *values = MeanFieldBlock.apply(layout, sample, *locs, *rhos)
    torch.manual_seed(3)
    expected_kl, expected_values = _by_autograd(
        SiteLayout(SHAPES, prior_locs, prior_scales, 1e-6), locs, rhos, sample
    )

    for value, expected in zip(values, expected_values, strict=True):
        assert torch.equal(value, expected)  # the same noise, drawn site by site
    torch.testing.assert_close(kl, expected_kl)
    torch.testing.assert_close(total, expected_kl.sum())
    assert not kl.requires_grad  # the per-site terms are for records

    # an objective that reads some draws (not the third) and weighs the KL
    g = torch.Generator().manual_seed(4)
    weights = [torch.randn((*sample, *s), generator=g, dtype=torch.float64) for s in SHAPES]

    def objective(total, values):
        pairs = enumerate(zip(values, weights, strict=True))
        used = [(v * w).sum() for k, (v, w) in pairs if k != 2]
        return 0.7 * total + sum(used)

    params = [*locs, *rhos]
    grads = torch.autograd.grad(objective(total, values), params)
    expected = torch.autograd.grad(objective(expected_kl.sum(), expected_values), params)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_large_rho_keeps_softplus_threshold():
    """Above softplus's threshold σ = ρ and dσ/dρ = 1, as ``F.softplus`` has it."""
    layout = SiteLayout([torch.Size([3])], [0.0], [1.0], 0.0)
    loc = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    rho = torch.tensor([25.0, 30.0, -1.0], dtype=torch.float64, requires_grad=True)
    total, _, _ = MeanFieldBlock.apply(layout, (), loc, rho)
    (grad,) = torch.autograd.grad(total, rho)
    scale = F.softplus(rho.detach())
    sigmoid = torch.sigmoid(rho.detach())
    expected = (scale - 1 / scale) * torch.where(rho.detach() > 20, 1.0, sigmoid)
    torch.testing.assert_close(grad, expected)
    assert math.isfinite(total.item())
