"""A Gaussian block drawn site by site: exact conditionals, marginals and the chain rule."""

from __future__ import annotations

import itertools
import pickle

import pytest
import torch

from pyro_bbb.priors.gaussian_block import GaussianBlock, SiteConditional

CPU = torch.device("cpu")
SITES = {"fc1.weight": (2, 3), "fc1.bias": (2,), "fc2.weight": (1, 2)}


def random_block(seed=0, rank=3):
    g = torch.Generator().manual_seed(seed)
    d = 10
    loc = torch.randn(d, generator=g, dtype=torch.float64)
    factor = torch.randn(d, rank, generator=g, dtype=torch.float64)
    diag = torch.rand(d, generator=g, dtype=torch.float64) + 0.2
    block = GaussianBlock(loc, factor, diag, SITES)
    dense = torch.distributions.MultivariateNormal(loc, factor @ factor.T + torch.diag(diag))
    return block, dense


def split(flat):
    """A flat draw (..., 10) as the sites' values."""
    values, start = {}, 0
    for site, shape in SITES.items():
        size = torch.Size(shape).numel()
        values[site] = flat[..., start : start + size].reshape(*flat.shape[:-1], *shape)
        start += size
    return values


def slices(names):
    index, start = {}, 0
    for site, shape in SITES.items():
        size = torch.Size(shape).numel()
        index[site] = list(range(start, start + size))
        start += size
    return [i for name in names for i in index[name]]


@pytest.mark.parametrize("order", list(itertools.permutations(SITES)))
def test_conditionals_in_any_order_multiply_to_the_joint_density(order):
    block, dense = random_block()
    flat = dense.sample((6,))
    values = split(flat)
    drawn, log_p = {}, torch.zeros(6, dtype=torch.float64)
    for site in order:
        fn = block.conditional(site, drawn, device=CPU, dtype=torch.float64)
        log_p = log_p + fn.log_prob(values[site])
        drawn[site] = values[site]
    assert torch.allclose(log_p, dense.log_prob(flat), atol=1e-10)


def test_conditional_mean_and_covariance_are_the_gaussian_conditioning_formulas():
    block, dense = random_block(seed=1)
    flat = dense.sample((4,))
    values = split(flat)
    given = ["fc1.weight", "fc2.weight"]
    a, b = slices(given), slices(["fc1.bias"])
    cov = dense.covariance_matrix
    gain = cov[b][:, a] @ torch.linalg.inv(cov[a][:, a])
    mean = dense.loc[b] + (flat[:, a] - dense.loc[a]) @ gain.T
    covariance = cov[b][:, b] - gain @ cov[a][:, b]
    fn = block.conditional(
        "fc1.bias", {s: values[s] for s in given}, device=CPU, dtype=torch.float64
    )
    assert fn.given == ("fc1.weight", "fc2.weight")
    assert fn.batch_shape == (4,) and fn.event_shape == (2,)
    assert torch.allclose(fn.mean, mean, atol=1e-10)
    assert torch.allclose(fn.base.covariance_matrix, covariance, atol=1e-10)
    assert torch.allclose(fn.variance, covariance.diagonal().expand(4, 2), atol=1e-10)


def test_joint_of_a_subset_in_any_order_is_the_dense_marginal():
    block, dense = random_block(seed=2)
    names = ["fc2.weight", "fc1.bias"]
    index = slices(names)
    joint = block.joint(names, device=CPU, dtype=torch.float64)
    x = dense.sample((5,))[:, index]
    marginal = torch.distributions.MultivariateNormal(
        dense.loc[index], dense.covariance_matrix[index][:, index]
    )
    assert torch.allclose(joint.log_prob(x), marginal.log_prob(x), atol=1e-10)


def test_each_sites_marginals_are_the_dense_joints_means_and_standard_deviations():
    block, dense = random_block(seed=3)
    for site in SITES:
        loc, scale = block.site_marginal(site)
        index = slices([site])
        assert loc.shape == scale.shape == torch.Size(SITES[site])
        assert torch.allclose(loc.reshape(-1), dense.loc[index])
        assert torch.allclose(scale.reshape(-1), dense.covariance_matrix.diagonal()[index].sqrt())


def test_drawing_site_by_site_reproduces_the_joint_covariance():
    block, dense = random_block(seed=3)
    torch.manual_seed(0)
    drawn = {}
    for site in SITES:  # the first site is drawn 40,000 times, the others once per batch entry
        fn = block.conditional(site, drawn, device=CPU, dtype=torch.float64)
        drawn[site] = fn.rsample((40_000,) if not drawn else ())
    flat = torch.cat([drawn[s].reshape(40_000, -1) for s in SITES], dim=1)
    empirical = torch.cov(flat.T)
    assert (empirical - dense.covariance_matrix).abs().max() < 0.1 * dense.variance.max()
    assert (flat.mean(0) - dense.loc).abs().max() < 0.05 * dense.variance.max().sqrt()


def test_a_float32_conditional_matches_the_float64_one():
    block, dense = random_block(seed=4)
    values = split(dense.sample((3,)))
    drawn = {"fc1.weight": values["fc1.weight"]}
    f64 = block.conditional("fc1.bias", drawn, device=CPU, dtype=torch.float64)
    drawn32 = {"fc1.weight": values["fc1.weight"].float()}
    f32 = block.conditional("fc1.bias", drawn32, device=CPU, dtype=torch.float32)
    assert f32.mean.dtype == torch.float32
    assert torch.allclose(
        f32.log_prob(values["fc1.bias"].float()).double(),
        f64.log_prob(values["fc1.bias"]),
        atol=1e-4,
    )


def test_expand_keeps_the_block_and_broadcasts_the_shift():
    block, dense = random_block()
    first = block.conditional("fc1.weight", {}, device=CPU, dtype=torch.float64)
    assert first.batch_shape == () and first.given == ()
    expanded = first.expand((5, 1))
    assert isinstance(expanded, SiteConditional) and expanded.block is block
    assert expanded.rsample().shape == (5, 1, 2, 3)
    values = split(dense.sample((5, 1)))
    second = block.conditional("fc1.bias", values, device=CPU, dtype=torch.float64)
    assert second.batch_shape == (5, 1)
    assert second.expand((5, 1)).log_prob(values["fc1.bias"]).shape == (5, 1)


def test_a_block_pickles_and_rebuilds_its_cache():
    block, dense = random_block()
    values = split(dense.sample((2,)))
    before = block.conditional("fc1.bias", values, device=CPU, dtype=torch.float64)
    copy = pickle.loads(pickle.dumps(block))
    after = copy.conditional("fc1.bias", values, device=CPU, dtype=torch.float64)
    assert torch.allclose(before.log_prob(values["fc1.bias"]), after.log_prob(values["fc1.bias"]))


def test_unknown_sites_and_wrong_value_shapes_are_refused_by_name():
    block, _ = random_block()
    with pytest.raises(KeyError, match=r"fc3\.weight"):
        block.conditional("fc3.weight", {}, device=CPU, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"'fc1.weight' of the block must end in shape \(2, 3\)"):
        block.conditional(
            "fc1.bias", {"fc1.weight": torch.zeros(3, 2)}, device=CPU, dtype=torch.float64
        )
    with pytest.raises(ValueError, match="loc and cov_diag must be"):
        GaussianBlock(torch.zeros(9), torch.ones(9, 1), torch.ones(9), SITES)
