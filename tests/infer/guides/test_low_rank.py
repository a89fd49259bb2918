"""The low-rank-plus-diagonal guide: closed-form KL, full-covariance recovery, bad ranks."""

from __future__ import annotations

import functools

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoIAFNormal, AutoLowRankMultivariateNormal, AutoNormal

import pyro_bbb as bbb
from pyro_bbb.infer import AnnealedELBO
from pyro_bbb.infer.kl import kl_low_rank_diagonal
from pyro_bbb.priors import Gaussian, ScaleMixture

from ...problems import conjugate_problem, linear_bnn


def test_determinant_lemma_kl_equals_the_dense_gaussian_kl():
    g = torch.Generator().manual_seed(0)
    d, r = 7, 3
    loc = torch.randn(d, generator=g, dtype=torch.float64)
    factor = torch.randn(d, r, generator=g, dtype=torch.float64)
    diag = torch.rand(d, generator=g, dtype=torch.float64) + 0.1
    prior_loc = torch.randn(d, generator=g, dtype=torch.float64)
    prior_scale = torch.rand(d, generator=g, dtype=torch.float64) + 0.5
    q = dist.LowRankMultivariateNormal(loc, factor, diag)
    p = dist.Normal(prior_loc, prior_scale).to_event(1)
    dense = torch.distributions.kl_divergence(
        torch.distributions.MultivariateNormal(loc, factor @ factor.T + torch.diag(diag)),
        torch.distributions.MultivariateNormal(prior_loc, torch.diag(prior_scale**2)),
    )
    assert torch.allclose(kl_low_rank_diagonal(q, p), dense, rtol=1e-10)
    # and it is what kl_divergence dispatches to
    assert torch.allclose(dist.kl.kl_divergence(q, p), dense, rtol=1e-10)


def small_problem(prior):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 3, generator=g), torch.randn(20, generator=g)
    model = bbb.BNN(bbb.mlp([3, 5, 1], prior=prior), bbb.likelihoods.Gaussian(), num_data=20)
    return model, x, y


def test_low_rank_elbo_uses_the_closed_form_block_kl_against_a_gaussian_prior():
    model, x, y = small_problem(Gaussian(0.8))
    guide = bbb.LowRankGuide(model, rank=2)
    analytic = AnnealedELBO().terms(model, guide, x, y)
    assert set(analytic.sites) == {"obs", "_LowRankGuide.0", "_LowRankGuide.2"}
    with torch.no_grad():
        mc = AnnealedELBO(num_particles=40_000, analytic_kl=False).terms(model, guide, x, y)
    assert abs(mc.kl.item() - analytic.kl.item()) < 0.02 * analytic.kl.item()
    # the analytic value does not depend on the draw
    again = AnnealedELBO().terms(model, guide, x, y)
    assert torch.equal(again.kl, analytic.kl)


def test_low_rank_elbo_falls_back_to_monte_carlo_for_the_scale_mixture():
    model, x, y = small_problem(ScaleMixture(0.5, 1.0, 0.05))
    guide = bbb.LowRankGuide(model, rank=2)
    terms = AnnealedELBO().terms(model, guide, x, y)
    # MC terms: log q of each block, then -log p of every site
    assert {"0.weight", "0.bias", "2.weight", "2.bias"} <= set(terms.sites)


def fit_conjugate(guide, x, y, model):
    bbb.fit(model, guide, x, y, epochs=800, lr=0.03, num_particles=64, seed=0, progress=False)
    bbb.fit(model, guide, x, y, epochs=400, lr=0.003, num_particles=64, seed=1, progress=False)


def test_full_rank_network_block_recovers_the_exact_posterior_covariance():
    x, y, mean, covariance, _ = conjugate_problem()
    model = linear_bnn(x)
    d = covariance.shape[0]
    guide = bbb.LowRankGuide(model, rank=d - 1, blocks="network", init_scale=0.1)
    fit_conjugate(guide, x, y, model)
    (block,) = guide.block_names
    fitted = guide.covariance(block)  # order: weight (row-major), then bias, as in `mean`
    loc = guide.posterior()[block].mean
    sd = covariance.diagonal().sqrt()
    assert torch.all((loc - mean).abs() < 0.1 * sd), (loc, mean)
    fitted_sd = fitted.diagonal().sqrt()
    correlation = fitted / torch.outer(fitted_sd, fitted_sd)
    exact = covariance / torch.outer(sd, sd)
    relative_error = torch.linalg.matrix_norm(fitted - covariance) / torch.linalg.matrix_norm(
        covariance
    )
    assert relative_error < 0.15, (fitted, covariance)
    assert torch.allclose(fitted.diagonal(), covariance.diagonal(), rtol=0.15)
    assert (correlation - exact).abs().max() < 0.1, (correlation, exact)
    # the exact posterior has strong correlations, which a mean-field guide cannot express
    assert (exact - torch.eye(d, dtype=exact.dtype)).abs().max() > 0.5


def test_layer_blocks_join_each_layers_weight_and_bias():
    model, x, y = small_problem(Gaussian())
    guide = bbb.LowRankGuide(model, rank=3)
    guide(x, y)
    assert guide.block_names == ["0", "2"]
    sizes = {name: fn.event_shape[0] for name, fn in guide.posterior().items()}
    assert sizes == {"0": 5 * 3 + 5, "2": 5 + 1}
    assert guide.factors_t.get_parameter("0").shape == (3, 20)  # V^T
    median = guide.median()
    assert median["0.weight"].shape == (5, 3) and median["2.bias"].shape == (1,)
    q = guide.quantiles([0.5], x, y)
    assert torch.allclose(q["0.weight"][0], median["0.weight"])


@pytest.mark.parametrize("members", [None, 3])
def test_each_weights_marginal_is_its_block_distributions_mean_and_sd(members):
    model, x, y = small_problem(Gaussian())
    if members is None:
        guide = bbb.LowRankGuide(model, rank=2)
    else:
        guide = bbb.Ensemble(model, functools.partial(bbb.LowRankGuide, rank=2), k=members)
    guide(x, y)
    low_rank = guide if members is None else guide.members
    with torch.no_grad():  # away from the initial 3:1 split of the variance
        for param in low_rank.parameters():
            param.add_(0.3 * torch.randn_like(param))
    marginals = low_rank._marginals()
    for block in low_rank._blocks:
        fn = low_rank.block_distribution(block)
        for piece in block.slices:
            shape = (*low_rank.member_shape, *piece.shape)
            part = slice(piece.start, piece.stop)
            loc, sd = (t[..., part].reshape(shape) for t in (fn.mean, fn.stddev))
            assert torch.equal(marginals[piece.site][0], loc)
            assert torch.equal(marginals[piece.site][1], sd)


def test_low_rank_means_start_from_the_networks_own_initialisation():
    model, x, y = small_problem(Gaussian())
    guide = bbb.LowRankGuide(model, rank=1)
    guide(x, y)
    init = bbb.nn.initial_values(model)
    assert torch.equal(guide.median()["0.weight"], init["0.weight"])


@pytest.mark.parametrize("rank", [-1, 1.5, True, False, "2"])
def test_a_negative_or_non_integer_rank_is_refused(rank):
    model, _, _ = small_problem(Gaussian())
    with pytest.raises(ValueError, match=rf"rank must be a positive int, got {rank!r}$"):
        bbb.LowRankGuide(model, rank=rank)


def test_rank_zero_is_refused_pointing_to_the_mean_field_guide():
    model, _, _ = small_problem(Gaussian())
    with pytest.raises(ValueError, match=r"rank must be a positive int, got 0: .*MeanFieldGuide"):
        bbb.LowRankGuide(model, rank=0)


def test_a_rank_larger_than_a_block_is_refused_naming_the_block():
    model, x, y = small_problem(Gaussian())
    guide = bbb.LowRankGuide(model, rank=7)  # block "2" has 5 + 1 = 6 entries
    with pytest.raises(ValueError, match=r"rank=7 exceeds the size 6 of block '2'"):
        guide(x, y)


def test_unknown_blocks_option_is_refused():
    model, _, _ = small_problem(Gaussian())
    with pytest.raises(ValueError, match="blocks"):
        bbb.LowRankGuide(model, blocks="row")


@pytest.mark.parametrize("autoguide", [AutoNormal, AutoLowRankMultivariateNormal, AutoIAFNormal])
def test_any_pyro_autoguide_fits_the_same_bnn(autoguide):
    model, x, y = small_problem(Gaussian())
    pyro.set_rng_seed(0)
    history = bbb.fit(model, autoguide(model), x, y, epochs=150, lr=0.01, progress=False)
    first, last = sum(history.plain_loss[:10]) / 10, sum(history.plain_loss[-10:]) / 10
    assert last < first, (first, last)
