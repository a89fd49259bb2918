"""Local reparameterisation and flipout: same marginals as weight sampling, less variance."""

from __future__ import annotations

import math

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer.autoguide import AutoIAFNormal, AutoNormal
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.infer import AnnealedELBO
from pyro_bbb.infer.reparam import estimator
from pyro_bbb.priors import Gaussian

from ..support import scaled

DRAWS = scaled(20_000, 100_000)


def linear_net():
    return bbb.mlp([4, 3], prior=Gaussian(1.0))


def conv_net():
    layers = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, stride=2), nn.Flatten(-3))
    return bbb.bayesianize(layers, Gaussian(1.0))


def conv1d_net():
    layers = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1, groups=2, dilation=1), nn.Flatten(-2))
    return bbb.bayesianize(layers, Gaussian(1.0))


def conv3d_net():
    return bbb.bayesianize(nn.Sequential(nn.Conv3d(2, 2, 2), nn.Flatten(-4)), Gaussian(1.0))


def conv_transpose2d_net():
    layers = nn.Sequential(
        nn.ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1, groups=2),
        nn.Flatten(-3),
    )
    return bbb.bayesianize(layers, Gaussian(1.0))


def layer_norm_then_linear_net():
    # the LayerNorm is drawn by weight sampling, the Linear by the estimator under test
    return bbb.bayesianize(nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 3)), Gaussian(1.0))


def make(net_fn, guide_kind, inputs):
    net = net_fn()
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(scale=1.0), num_data=100)
    if guide_kind == "mean_field":
        guide = bbb.MeanFieldGuide(model, init_scale=0.3)
    else:
        guide = bbb.LowRankGuide(model, rank=2, init_scale=0.3)
    guide(inputs)
    with torch.no_grad():  # non-trivial, unequal means and scales
        for p in guide.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model, guide


def outputs(model, guide, x, reparam, draws=DRAWS):
    """Network outputs under ``draws`` vectorised weight draws: ``(draws, batch, units)``."""
    plate = pyro.plate("draws", draws, dim=-2)
    with torch.no_grad(), estimator(reparam)():
        guide_trace = poutine.trace(plate(guide)).get_trace(x)
        trace = poutine.trace(poutine.replay(plate(model), guide_trace)).get_trace(x)
    return trace.nodes["obs"]["fn"].base_dist.loc


CASES = [
    pytest.param(linear_net, lambda: torch.randn(5, 4), id="linear"),
    pytest.param(conv_net, lambda: torch.randn(3, 2, 5, 5), id="conv2d"),
    pytest.param(conv1d_net, lambda: torch.randn(3, 2, 4), id="conv1d"),
    pytest.param(conv3d_net, lambda: torch.randn(2, 2, 2, 3, 2), id="conv3d"),
    pytest.param(conv_transpose2d_net, lambda: torch.randn(2, 2, 2, 2), id="conv_transpose2d"),
    pytest.param(layer_norm_then_linear_net, lambda: torch.randn(5, 4), id="layer_norm_linear"),
]


@pytest.mark.parametrize("guide_kind", ["mean_field", "low_rank"])
@pytest.mark.parametrize("net_fn, data", CASES)
@pytest.mark.slow
def test_local_reparam_matches_weight_sampling_moments(net_fn, data, guide_kind):
    x = data()
    model, guide = make(net_fn, guide_kind, x)
    plain = outputs(model, guide, x, None)
    local = outputs(model, guide, x, "local")
    assert plain.shape == local.shape
    var = plain.var(0)
    # means agree within 5 standard errors; variances within 5 relative standard errors
    assert torch.all((local.mean(0) - plain.mean(0)).abs() < 5 * (2 * var / DRAWS).sqrt())
    assert torch.all((local.var(0) / var - 1).abs() < 5 * math.sqrt(4 / DRAWS))


@pytest.mark.parametrize("net_fn, data", CASES[:-1])  # the affine nets
@pytest.mark.slow
def test_local_reparam_draws_independent_noise_per_example(net_fn, data):
    """Two identical examples: perfectly correlated under shared weights, not under local."""
    x = data()
    x[1] = x[0]
    model, guide = make(net_fn, "mean_field", x)
    plain = outputs(model, guide, x, None)
    local = outputs(model, guide, x, "local")

    def correlation(out):
        a, b = out[:, 0, 0], out[:, 1, 0]
        return torch.corrcoef(torch.stack([a, b]))[0, 1].item()

    assert correlation(plain) > 0.99
    assert abs(correlation(local)) < 5 / math.sqrt(DRAWS)


@pytest.mark.slow
def test_low_rank_local_reparam_shares_the_rank_part_across_the_batch_exactly():
    """The cross-example covariance under LowRank + local is x₁ V Vᵀ x₂ᵀ, the shared part."""
    x = torch.randn(2, 4)
    model, guide = make(linear_net, "low_rank", x)
    local = outputs(model, guide, x, "local")
    fn = guide.block_distribution("0")
    factor = fn.cov_factor.detach()  # (d, r): weight (3×4) row-major, then bias (3)
    unit = 0
    rows = torch.cat([factor[unit * 4 : unit * 4 + 4], factor[12 + unit : 13 + unit]])
    features = torch.cat([x, torch.ones(2, 1)], dim=1)
    projected = features @ rows  # (2, r)
    expected = (projected[0] * projected[1]).sum()
    observed = torch.cov(torch.stack([local[:, 0, unit], local[:, 1, unit]]))[0, 1]
    scale = local[:, :, unit].var(0).prod().sqrt()
    assert abs(observed - expected) < 5 * scale / math.sqrt(DRAWS)


def ks_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample Kolmogorov–Smirnov statistic."""
    both = torch.cat([a, b]).sort().values
    cdf_a = torch.searchsorted(a.sort().values, both, right=True) / len(a)
    cdf_b = torch.searchsorted(b.sort().values, both, right=True) / len(b)
    return (cdf_a - cdf_b).abs().max().item()


@pytest.mark.parametrize("guide_kind", ["mean_field", "low_rank"])
@pytest.mark.parametrize("net_fn, data", CASES)
@pytest.mark.slow
def test_flipout_keeps_the_marginal_distribution_of_every_output(net_fn, data, guide_kind):
    x = data()
    model, guide = make(net_fn, guide_kind, x)
    plain = outputs(model, guide, x, None).flatten(1)
    flipped = outputs(model, guide, x, "flipout").flatten(1)
    # KS critical value at level 1e-3 for two samples of n: 1.95 * sqrt(2 / n)
    critical = 1.95 * math.sqrt(2 / DRAWS)
    units = range(0, plain.shape[1], max(1, plain.shape[1] // 12))
    assert max(ks_distance(plain[:, u], flipped[:, u]) for u in units) < critical


def first_layer_gradient_variance(reparam: str | None, repeats: int) -> float:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 20, generator=g)
    y = torch.randint(0, 3, (64,), generator=g)
    pyro.clear_param_store()
    model = bbb.BNN(bbb.mlp([20, 50, 3]), bbb.likelihoods.Categorical(), num_data=1000)
    guide = bbb.MeanFieldGuide(model, init_scale=0.1)
    guide(x, y)
    loc = guide.locs.get_parameter("0.weight")
    elbo = AnnealedELBO(1.0)
    grads = []
    for _ in range(repeats):
        loc.grad = None
        with estimator(reparam)():
            elbo.terms(model, guide, x, y).loss.backward()
        grads.append(loc.grad.clone())
    return torch.stack(grads).var(0).mean().item()


@pytest.mark.slow
def test_local_reparam_has_lower_gradient_variance_than_weight_sampling():
    repeats = scaled(40, 200)
    plain = first_layer_gradient_variance(None, repeats)
    local = first_layer_gradient_variance("local", repeats)
    assert local < 0.7 * plain, (local, plain)


@pytest.mark.parametrize("reparam", ["local", "flipout"])
def test_a_guide_the_handlers_cannot_use_raises_an_error_naming_it(reparam):
    x, y = torch.randn(10, 3), torch.randn(10)
    model = bbb.BNN(bbb.mlp([3, 4, 1]), bbb.likelihoods.Gaussian(), num_data=10)
    guide = AutoIAFNormal(model)
    with pytest.raises(NotImplementedError, match="AutoIAFNormal"):
        bbb.fit(model, guide, x, y, epochs=1, reparam=reparam, progress=False)


@pytest.mark.parametrize("reparam", ["local", "flipout"])
def test_autonormal_works_with_the_handlers(reparam):
    x, y = torch.randn(30, 3), torch.randn(30)
    model = bbb.BNN(bbb.mlp([3, 8, 1]), bbb.likelihoods.Gaussian(), num_data=30)
    history = bbb.fit(
        model, AutoNormal(model), x, y, epochs=80, lr=0.02, reparam=reparam, progress=False
    )
    assert history.plain_loss[-1] < history.plain_loss[0]


def test_a_weight_replaced_after_the_guide_drew_it_is_refused():
    x = torch.randn(5, 4)
    model, guide = make(linear_net, "mean_field", x)
    fixed = {"0.weight": torch.zeros(3, 4)}
    with bbb.local_reparameterization(), pytest.raises(RuntimeError, match=r"'0\.weight'"):
        guide_trace = poutine.trace(guide).get_trace(x)
        poutine.replay(poutine.condition(model, data=fixed), guide_trace)(x)


def test_unknown_estimator_name_is_refused():
    with pytest.raises(ValueError, match="reparam"):
        estimator("antithetic")


@pytest.mark.parametrize("reparam", ["local", "flipout"])
def test_fit_and_predict_accept_the_estimators(reparam):
    x, y = torch.randn(40, 3), torch.randn(40)
    model = bbb.BNN(bbb.mlp([3, 8, 1]), bbb.likelihoods.Gaussian(), num_data=40)
    guide = bbb.LowRankGuide(model, rank=2)
    history = bbb.fit(model, guide, x, y, epochs=60, lr=0.02, reparam=reparam, progress=False)
    assert history.plain_loss[-1] < history.plain_loss[0]
    pred = bbb.predict(model, guide, x, num_samples=16, reparam=reparam)
    assert pred.mean.shape == (40,) and torch.isfinite(pred.std).all()


@pytest.mark.parametrize("guide_kind", ["meanfield", "lowrank"])
def test_local_reparam_keeps_gradients_finite_when_a_pre_activation_variance_is_zero(guide_kind):
    # An all-zero input row into a layer with a deterministic bias has pre-activation
    # variance exactly 0, where the derivative of sqrt is infinite.
    torch.manual_seed(0)
    x, y = torch.randn(20, 3), torch.randn(20)
    x[0] = 0.0
    net = bbb.bayesianize(
        nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)), deterministic=["*.bias"]
    )
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=20)
    guide = bbb.MeanFieldGuide(model) if guide_kind == "meanfield" else bbb.LowRankGuide(model)
    with bbb.local_reparameterization():
        loss = AnnealedELBO().differentiable_loss(model, guide, x, y)
    loss.backward()
    params = [p for _, p in pyro.get_param_store().named_parameters()]
    grads = [p.grad for p in params if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    history = bbb.fit(model, guide, x, y, epochs=20, reparam="local", progress=False)
    assert all(math.isfinite(v) for v in history.loss)
