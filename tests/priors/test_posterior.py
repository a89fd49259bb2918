"""from_guide: a trained guide's posterior as a prior, wherever a prior goes."""

from __future__ import annotations

import pickle
from operator import attrgetter

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer.autoguide import AutoIAFNormal, AutoNormal
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.infer import AnnealedELBO
from pyro_bbb.priors import Gaussian, PosteriorPrior, from_guide
from pyro_bbb.priors.posterior import BlockPosterior, NormalPosterior

from ..problems import (
    NOISE,
    PRIOR_SCALE,
    conjugate_problem,
    exact_guide,
    linear_bnn,
    linear_posterior,
)
from ..support import requires_cuda, scaled


def small_model(prior=None, sizes=(3, 4, 1), name=""):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, sizes[0], generator=g), torch.randn(12, generator=g)
    net = bbb.mlp(list(sizes), prior=prior)
    return bbb.BNN(net, bbb.likelihoods.Gaussian(scale=0.5), num_data=12, name=name), x, y


def trained(guide, model, x, y, epochs=5):
    bbb.fit(model, guide, x, y, epochs=epochs, seed=0, progress=False)
    return guide


def model_log_prior(model, values, x):
    """Sum of the model's log densities of the weights at ``values`` (a conditioned run)."""
    trace = poutine.trace(poutine.condition(model, values)).get_trace(x)
    return sum(trace.nodes[name]["fn"].log_prob(trace.nodes[name]["value"]) for name in values)


def test_a_mean_field_posterior_becomes_independent_normals_with_its_means_and_scales():
    model, x, y = small_model(Gaussian(1.0))
    guide = trained(bbb.MeanFieldGuide(model, init_scale=0.1), model, x, y)
    prior = from_guide(guide)
    assert isinstance(prior, PosteriorPrior)
    assert list(prior) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    posterior = guide.posterior()
    for site, fn in posterior.items():
        carried = prior[site]
        assert isinstance(carried, NormalPosterior)
        assert torch.equal(carried.loc, fn.mean) and torch.equal(carried.scale, fn.stddev)
        assert not carried.loc.requires_grad
    # detached copies: training the guide further leaves the prior as it was
    before = prior["0.weight"].loc.clone()
    trained(guide, model, x, y)
    assert torch.equal(prior["0.weight"].loc, before)
    assert not torch.equal(guide.median()["0.weight"], before)


def test_a_network_built_with_the_prior_draws_each_site_from_its_posterior():
    model, x, y = small_model(Gaussian(1.0))
    guide = trained(bbb.MeanFieldGuide(model, init_scale=0.1), model, x, y)
    carried, _, _ = small_model(from_guide(guide), name="next")  # a name prefixes the sites
    trace = poutine.trace(carried).get_trace(x)
    for site, fn in guide.posterior().items():
        prior = trace.nodes[f"next.{site}"]["fn"]
        assert torch.equal(prior.mean, fn.mean) and torch.equal(prior.stddev, fn.stddev)


def test_the_model_under_a_low_rank_prior_has_the_blocks_exact_log_density():
    model, x, y = small_model(Gaussian(1.0))
    guide = trained(bbb.LowRankGuide(model, rank=2), model, x, y)
    prior = from_guide(guide)
    assert all(isinstance(p, BlockPosterior) for p in prior.values())
    assert prior["0.weight"].block is prior["0.bias"].block
    assert prior["0.weight"].block is not prior["2.weight"].block
    carried, _, _ = small_model(prior)
    with torch.no_grad():
        draw = poutine.trace(guide).get_trace(x, y)
        values = {name: draw.nodes[name]["value"] for name in prior}
        expected = sum(
            site["fn"].log_prob(site["value"])
            for name, site in draw.nodes.items()
            if site["type"] == "sample" and site["infer"].get("is_auxiliary")
        )
        assert torch.allclose(model_log_prior(carried, values, x), expected, rtol=1e-5)


def test_an_auto_normal_posterior_becomes_independent_normals():
    model, x, y = small_model(Gaussian(1.0))
    guide = AutoNormal(model)
    trained(guide, model, x, y)
    prior = from_guide(guide)
    assert set(prior) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert torch.allclose(prior["0.bias"].loc, attrgetter("0.bias")(guide.locs))
    assert torch.allclose(prior["0.bias"].scale, attrgetter("0.bias")(guide.scales))


@pytest.mark.parametrize("kind", ["mean_field", "low_rank"])
def test_a_new_guide_starts_at_the_posterior_means_with_its_own_small_scale(kind):
    model, x, y = small_model(Gaussian(1.0))
    make = bbb.MeanFieldGuide if kind == "mean_field" else bbb.LowRankGuide
    guide = trained(make(model, init_scale=0.3, name="old"), model, x, y)
    prior = from_guide(guide)
    carried, _, _ = small_model(prior)
    new = make(carried, init_scale=0.01, name="new")
    new(x, y)
    for site, mean in prior.means().items():
        assert torch.allclose(new.median()[site], mean)
    spread = new.quantiles([0.8413447])["0.weight"][0] - new.median()["0.weight"]
    if kind == "mean_field":
        assert torch.allclose(spread, torch.full_like(spread, 0.01), rtol=1e-3)
    else:  # 3:1 in variance between the diagonal and a random factor of that size
        assert (spread > 0.008).all() and (spread < 0.02).all()


def test_a_new_head_keeps_its_own_prior_beside_the_carried_body():
    model, x, y = small_model(Gaussian(1.0))
    guide = trained(bbb.MeanFieldGuide(model), model, x, y)
    body = {k: v for k, v in from_guide(guide).items() if k.startswith("0.")}
    net = bbb.mlp([3, 4, 1], prior={**body, "*": Gaussian(0.3)})
    assert net[0].priors["weight"] is body["0.weight"]
    assert isinstance(net[2].priors["weight"], Gaussian) and net[2].priors["weight"].scale == 0.3


def test_a_guide_without_parameters_is_refused():
    model, _, _ = small_model(Gaussian(1.0))
    for guide in (bbb.MeanFieldGuide(model), bbb.LowRankGuide(model), AutoNormal(model)):
        with pytest.raises(ValueError, match="has no parameters yet"):
            from_guide(guide)


def test_a_site_missing_from_the_posterior_is_named():
    model, x, y = small_model(Gaussian(1.0))
    guide = trained(bbb.MeanFieldGuide(model), model, x, y)
    with pytest.raises(ValueError, match=r"has no site '4.weight'.*'\*': Gaussian"):
        bbb.mlp([3, 4, 1, 1], prior=from_guide(guide))


def test_a_block_prior_on_another_site_is_refused_by_name():
    model, x, y = small_model(Gaussian(1.0))
    guide = trained(bbb.LowRankGuide(model, rank=2), model, x, y)
    net = bbb.mlp([3, 4, 1], prior={**from_guide(guide), "2.bias": Gaussian()})
    net[2].priors["bias"] = from_guide(guide)["0.bias"]
    with pytest.raises(ValueError, match=r"site '2\.bias' has the prior of site '0\.bias'"):
        net(x)


@pytest.mark.parametrize("kind", ["mean_field", "low_rank"])
def test_a_carried_prior_names_the_networks_sites_whatever_the_models_names(kind):
    model, x, y = small_model(Gaussian(1.0), name="first")
    make = bbb.MeanFieldGuide if kind == "mean_field" else bbb.LowRankGuide
    guide = trained(make(model), model, x, y)
    prior = from_guide(guide)
    assert list(prior) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    carried, _, _ = small_model(prior, name="next")
    trace = poutine.trace(carried).get_trace(x)
    bias = trace.nodes["next.0.bias"]["fn"]
    if kind == "low_rank":  # the block stays joint under the new model's names
        assert bias.given == ("0.weight",)
    assert torch.allclose(prior.means()["0.bias"], guide.median()["first.0.bias"])


@pytest.mark.parametrize("kind", ["mean_field", "low_rank"])
def test_a_site_with_another_shape_is_named_with_both_shapes(kind):
    model, x, y = small_model(Gaussian(1.0))
    make = bbb.MeanFieldGuide if kind == "mean_field" else bbb.LowRankGuide
    guide = trained(make(model), model, x, y)
    with pytest.raises(ValueError, match=r"site '0.weight' has shape \(4, 3\) .* but \(5, 3\)"):
        bbb.mlp([3, 5, 1], prior=from_guide(guide))
    # a prior assigned to a layer later is checked when the model runs
    net = bbb.mlp([3, 4, 1])
    net[2].priors["bias"] = from_guide(guide)["2.weight"]
    message = {
        "mean_field": r"site '2.weight' has shape \(1, 4\) .* but \(1,\)",
        "low_rank": "site '2.bias' has the prior of site '2.weight'",
    }
    with pytest.raises(ValueError, match=message[kind]):
        net(x)


def test_a_guide_without_gaussian_posteriors_is_refused():
    model, x, y = small_model(Gaussian(1.0))
    guide = AutoIAFNormal(model)
    guide(x, y)
    with pytest.raises(TypeError, match="AutoIAFNormal"):
        from_guide(guide)


def test_a_constrained_site_of_an_auto_normal_is_refused_by_name():
    def model():
        pyro.sample("rate", dist.Gamma(2.0, 1.0))
        pyro.sample("w", dist.Normal(0.0, 1.0))

    guide = AutoNormal(model)
    guide()
    with pytest.raises(ValueError, match="site 'rate' has support"):
        from_guide(guide)


def test_a_network_under_a_carried_prior_pickles():
    model, x, y = small_model(Gaussian(1.0))
    guide = trained(bbb.LowRankGuide(model, rank=2), model, x, y)
    net = bbb.mlp([3, 4, 1], prior=from_guide(guide))
    copy = pickle.loads(pickle.dumps(net))
    values = {name: t for name, t in guide.median().items()}
    log_p = model_log_prior(bbb.BNN(net, bbb.likelihoods.Gaussian(), 12), values, x)
    log_p_copy = model_log_prior(bbb.BNN(copy, bbb.likelihoods.Gaussian(), 12), values, x)
    assert torch.allclose(log_p, log_p_copy)


def test_the_nuts_potential_under_a_carried_block_is_the_exact_log_joint():
    x, y, mean, covariance, _ = conjugate_problem()
    half = len(x) // 2
    model_a = linear_bnn(x[:half])
    guide_a = exact_guide(model_a, x[:half], y[:half], mean, covariance)
    net = bbb.mlp([3, 1], prior=from_guide(guide_a)).double()
    model_b = bbb.BNN(net, bbb.likelihoods.Gaussian(scale=0.5).double(), num_data=len(x) - half)
    from pyro_bbb.infer.mcmc.potential import Potential, flat_layout

    xb, yb = x[half:], y[half:]
    sites, _, _ = flat_layout(model_b, xb, yb, None)
    potential = Potential(model_b, xb, yb, sites, None, None, jit=True)
    theta = mean + 0.1
    prior = dist.MultivariateNormal(mean, covariance)
    design = torch.cat([xb, torch.ones(len(xb), 1, dtype=xb.dtype)], 1)
    log_lik = dist.Normal(design @ theta, 0.5).log_prob(yb).sum()
    expected = prior.log_prob(theta) + log_lik
    assert torch.allclose(-potential({"theta": theta}), expected, rtol=1e-10)


@requires_cuda
def test_a_carried_prior_follows_the_model_to_the_gpu():
    model, x, y = small_model(Gaussian(1.0))
    guide = trained(bbb.LowRankGuide(model, rank=2), model, x, y)
    net = bbb.mlp([3, 4, 1], prior=from_guide(guide)).to("cuda")
    out = net(x.cuda())
    assert out.device.type == "cuda"


@pytest.mark.slow
def test_multi_head_networks_take_a_carried_body_and_fresh_heads():
    body = nn.Sequential(nn.Linear(3, 4), nn.Tanh())
    net = bbb.bayesianize(bbb.nn.MultiHead(body, [nn.Linear(4, 1), nn.Linear(4, 1)]))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 3, generator=g), torch.randn(10, generator=g)
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(scale=0.5), num_data=10)
    guide = trained(bbb.MeanFieldGuide(model), model, x, y)
    prior = {**from_guide(guide), "heads.*": Gaussian(1.0)}
    fresh = bbb.bayesianize(bbb.nn.MultiHead(body, [nn.Linear(4, 1), nn.Linear(4, 1)]), prior)
    assert isinstance(fresh.body[0].priors["weight"], NormalPosterior)
    # the posterior of head 0 came first in the mapping, so head 0 keeps it
    assert isinstance(fresh.heads[0].priors["weight"], NormalPosterior)
    assert isinstance(fresh.heads[1].priors["weight"], Gaussian)


# --- the recursion is exact in the conjugate case --------------------------------------------


def halves():
    """The conjugate linear regression in two halves A and B, and the exact posteriors."""
    x, y, mean, covariance, precision = conjugate_problem(num_data=60)
    a, b = slice(0, 30), slice(30, 60)
    dim = mean.shape[0]
    prior_precision = torch.eye(dim, dtype=x.dtype) / PRIOR_SCALE**2
    mean_a, covariance_a, precision_a = linear_posterior(
        x[a], y[a], torch.zeros(dim, dtype=x.dtype), prior_precision
    )
    return (
        (x[a], y[a]),
        (x[b], y[b]),
        (mean_a, covariance_a, precision_a),
        (mean, covariance, precision),
    )


def carried_linear_bnn(x, prior):
    net = bbb.mlp([x.shape[1], 1], prior=prior).double()
    return bbb.BNN(net, bbb.likelihoods.Gaussian(scale=NOISE).double(), num_data=len(x))


def fit_closely(model, guide, x, y):
    """Two Adam phases with many particles at β = 1: close to the plain ELBO's optimum."""
    epochs = scaled(300, 800)
    options = {"num_particles": 256, "beta": 1.0, "progress": False}
    bbb.fit(model, guide, x, y, epochs=epochs, lr=0.03, seed=0, **options)
    bbb.fit(model, guide, x, y, epochs=epochs // 2, lr=0.003, seed=1, **options)


def flat(guide):
    """Means and marginal variances of [w, b] from a guide."""
    median = guide.median()
    upper = guide.quantiles([0.8413447])
    loc = torch.cat([median["0.weight"].reshape(-1), median["0.bias"]])
    sd = torch.cat(
        [
            (upper["0.weight"][0] - median["0.weight"]).reshape(-1),
            upper["0.bias"][0] - median["0.bias"],
        ]
    )
    return loc, sd.pow(2)


def test_the_carried_block_gives_the_closed_form_kl_between_the_exact_posteriors():
    (xa, ya), (xb, yb), (mean_a, cov_a, _), (mean, cov, _) = halves()
    guide_a = exact_guide(linear_bnn(xa), xa, ya, mean_a, cov_a, name="exact_a")
    model = carried_linear_bnn(xb, from_guide(guide_a))
    guide = exact_guide(model, xb, yb, mean, cov, name="exact_ab")
    kl = AnnealedELBO().terms(model, guide, xb, yb).kl
    expected = torch.distributions.kl_divergence(
        dist.MultivariateNormal(mean, cov), dist.MultivariateNormal(mean_a, cov_a)
    )
    assert torch.allclose(kl, expected, rtol=1e-8)


@pytest.mark.slow
def test_low_rank_recursion_over_two_halves_recovers_the_exact_joint_posterior():
    # A full-rank low-rank guide holds the exact posterior, so fitting A, then B under
    # from_guide(guide_A), is Bayes' rule: the result is the posterior given A and B. The
    # tolerances are the optimiser's (Monte Carlo gradients), which the test of one fit on
    # all the data (tests/infer/guides) shows too.
    (xa, ya), (xb, yb), _, (mean, cov, _) = halves()
    model_a = carried_linear_bnn(xa, Gaussian(PRIOR_SCALE))
    guide_a = bbb.LowRankGuide(model_a, rank=3, init_scale=0.1, name="a")
    fit_closely(model_a, guide_a, xa, ya)
    model_b = carried_linear_bnn(xb, from_guide(guide_a))
    guide_b = bbb.LowRankGuide(model_b, rank=3, init_scale=0.1, name="b")
    fit_closely(model_b, guide_b, xb, yb)
    loc, _ = flat(guide_b)
    fitted = guide_b.covariance("0")
    sd = cov.diagonal().sqrt()
    assert ((loc - mean).abs() / sd).max() < 0.2, (loc, mean)
    assert torch.linalg.matrix_norm(fitted - cov) / torch.linalg.matrix_norm(cov) < 0.15
    assert torch.allclose(fitted.diagonal(), cov.diagonal(), rtol=0.15)


@pytest.mark.slow
def test_mean_field_recursion_has_the_joint_mean_field_variances_and_nearby_means():
    # A mean-field q_A keeps A's precisions on the diagonal and drops their correlations, so
    # the recursion's optimum is the mean-field posterior under the prior N(m_A, diag(Λ_A)⁻¹):
    # its variances 1/(Λ_A,ii + Λ_B,ii) are the joint mean-field variances 1/Λ_ii exactly, and
    # its means are the exact joint means up to what the dropped correlations carried (here
    # at most 0.69 joint posterior sd; the features are strongly correlated).
    (xa, ya), (xb, yb), (mean_a, _, precision_a), (mean, cov, precision) = halves()
    model_a = carried_linear_bnn(xa, Gaussian(PRIOR_SCALE))
    guide_a = bbb.MeanFieldGuide(model_a, init_scale=0.1, name="a")
    fit_closely(model_a, guide_a, xa, ya)
    model_b = carried_linear_bnn(xb, from_guide(guide_a))
    guide_b = bbb.MeanFieldGuide(model_b, init_scale=0.1, name="b")
    fit_closely(model_b, guide_b, xb, yb)
    loc, variance = flat(guide_b)
    diagonal_a = torch.diag(precision_a.diagonal())
    recursive, _, recursive_precision = linear_posterior(xb, yb, mean_a, diagonal_a)
    assert torch.allclose(recursive_precision.diagonal(), precision.diagonal())
    mean_field_sd = precision.diagonal().rsqrt()
    assert ((loc - recursive).abs() / mean_field_sd).max() < 0.2, (loc, recursive)
    assert torch.allclose(variance, 1 / precision.diagonal(), rtol=0.1), variance
    assert ((loc - mean).abs() / cov.diagonal().sqrt()).max() < 0.75, (loc, mean)


@pytest.mark.parametrize("reparam", [None, "local", "flipout"])
@pytest.mark.parametrize("kind", ["mean_field", "low_rank"])
def test_every_estimator_trains_under_a_carried_block_with_its_kl_in_closed_form(kind, reparam):
    model, x, y = small_model(Gaussian(1.0))
    old = trained(bbb.LowRankGuide(model, rank=2, name="old"), model, x, y)
    carried, _, _ = small_model(from_guide(old))
    make = bbb.MeanFieldGuide if kind == "mean_field" else bbb.LowRankGuide
    guide = make(carried, name="new")
    options = {"epochs": 3, "num_particles": 2, "reparam": reparam, "progress": False}
    history = bbb.fit(carried, guide, x, y, **options)
    assert all(torch.isfinite(torch.tensor(history.loss)))
    terms = AnnealedELBO(num_particles=2).terms(carried, guide, x, y)
    assert not {"0.bias", "2.bias"} & set(terms.sites)  # each block is one closed-form term
    pred = bbb.predict(carried, guide, x, num_samples=4, reparam=reparam)
    assert pred.samples.shape == (4, 12)
