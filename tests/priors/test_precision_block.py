"""The precision-form block drawn site by site: the conditionals multiply to the joint."""

from __future__ import annotations

import pytest
import torch

from pyro_bbb.priors.precision_block import PrecisionBlock, PrecisionSiteConditional

from .test_precision_normal import _belief

SITES = {"a": (2,), "b": (3, 1), "c": (2,)}


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
