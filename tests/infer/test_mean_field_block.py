"""The one-pass mean-field draw and KL against the same terms left to autograd, site by site.

The packed block (every site's parameters in two buffers) against the site-by-site block.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from pyro_bbb.infer._compiled import _warned
from pyro_bbb.infer._mean_field_block import (
    MeanFieldBlock,
    PackedMeanFieldBlock,
    SiteLayout,
    packed_block_runs,
)
from pyro_bbb.infer.guides._packed import PackedParameters

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


def _packed_sites(dtype=torch.float64):
    """The same sites as ``_sites``, packed end to end into two buffers."""
    locs, rhos = _sites(dtype)
    return locs, rhos, PackedParameters(locs).buffer, PackedParameters(rhos).buffer


@pytest.mark.parametrize("numbers", [float, _tensors], ids=["floats", "0-d tensors"])
@pytest.mark.parametrize(
    ("prior_locs", "prior_scales"),
    [([0.0] * 4, [1.0] * 4), ([0.1, 0.0, -0.3, 0.2], [0.5, 1.0, 2.0, 0.1])],
    ids=["one N(0, 1)", "a prior per site"],
)
def test_the_packed_block_equals_the_site_by_site_block(prior_locs, prior_scales, numbers):
    convert = (lambda v: v) if numbers is float else _tensors
    layout = SiteLayout(SHAPES, convert(prior_locs), convert(prior_scales), 1e-6)
    locs, rhos, loc_buffer, rho_buffer = _packed_sites()
    torch.manual_seed(3)
    total, kl, *values = PackedMeanFieldBlock.apply(layout, loc_buffer, rho_buffer, *locs, *rhos)
    torch.manual_seed(3)
    expected = MeanFieldBlock.apply(
        SiteLayout(SHAPES, prior_locs, prior_scales, 1e-6), (), *locs, *rhos
    )

    for value, want in zip(values, expected[2:], strict=True):
        assert torch.equal(value, want)  # the same noise, drawn site by site
    torch.testing.assert_close(kl, expected[1])
    torch.testing.assert_close(total, expected[0])
    assert not kl.requires_grad

    g = torch.Generator().manual_seed(4)
    weights = [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]

    def objective(total, values):  # reads some draws (not the third) and weighs the KL
        pairs = enumerate(zip(values, weights, strict=True))
        return 0.7 * total + sum((v * w).sum() for k, (v, w) in pairs if k != 2)

    params = [*locs, *rhos]
    grads = torch.autograd.grad(objective(total, values), params)
    wanted = torch.autograd.grad(objective(expected[0], expected[2:]), params)
    for got, want in zip(grads, wanted, strict=True):
        torch.testing.assert_close(got, want)


def test_the_packed_blocks_gradients_land_in_one_buffer_per_kind():
    layout = SiteLayout(SHAPES, [0.0] * 4, [1.0] * 4, 1e-6)
    locs, rhos, loc_buffer, rho_buffer = _packed_sites()
    total, _, *values = PackedMeanFieldBlock.apply(layout, loc_buffer, rho_buffer, *locs, *rhos)
    (total + sum(v.sum() for v in values)).backward()
    for params in (locs, rhos):
        start = params[0].grad.data_ptr()
        offsets = [p.grad.data_ptr() - start for p in params]
        sizes = [0] + [p.numel() * p.element_size() for p in params[:-1]]
        assert offsets == [sum(sizes[: k + 1]) for k in range(len(params))]  # no copies


def test_the_packed_block_runs_on_the_cpu_and_says_once_where_it_does_not():
    _warned.discard("packed-cuda")
    assert packed_block_runs(torch.device("cpu"))
    assert not packed_block_runs(torch.device("meta"))  # holds no values: nothing to say
    with pytest.warns(UserWarning, match="run on the CPU only; on cuda the sites are drawn"):
        assert not packed_block_runs(torch.device("cuda"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not packed_block_runs(torch.device("cuda"))  # once


@pytest.mark.parametrize("sizes", [[3, 40, 7], [70_000, 80_000, 10]], ids=["small", "large"])
def test_each_sites_sum_of_a_packed_buffer_is_its_stretchs_sum(sizes):
    # small layouts sum by one product with a 0/1 matrix, large ones a site at a time
    layout = SiteLayout([torch.Size([n]) for n in sizes], [0.0] * 3, [1.0] * 3, 1e-6)
    terms = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(0))
    expected = torch.stack([piece.double().sum() for piece in terms.split(sizes)])
    torch.testing.assert_close(layout.site_sums(terms).double(), expected, rtol=1e-5, atol=1e-3)
