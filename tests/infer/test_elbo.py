"""The annealed ELBO: closed-form KL, β on latent terms only, minibatch scaling."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoDelta

import pyro_bbb as bbb
from pyro_bbb.infer import (
    AnnealedELBO,
)
from pyro_bbb.priors import Gaussian, ScaleMixture, from_guide


def small_regression(num_data=40, prior=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_data, 3, generator=g)
    y = x.sum(-1) + 0.3 * torch.randn(num_data, generator=g)
    net = bbb.mlp([3, 8, 1], activation="tanh", prior=prior)
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(scale=0.3), num_data=num_data)
    guide = bbb.MeanFieldGuide(model, init_scale=0.2)
    guide(x, y)  # set up
    with torch.no_grad():  # move the means away from the init so the KL is not trivial
        for p in guide.locs.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model, guide, x, y


def test_closed_form_kl_equals_large_sample_monte_carlo_estimate():
    model, guide, x, y = small_regression(prior=Gaussian(0.7))
    analytic = AnnealedELBO(num_particles=1).terms(model, guide, x, y).kl
    mc_elbo = AnnealedELBO(num_particles=20_000, analytic_kl=False)
    with torch.no_grad():
        mc = mc_elbo.terms(model, guide, x, y).kl
    # the MC estimate's standard error, from per-particle log q - log p
    q = {name: d for name, d in guide.posterior().items()}
    prior = {
        name: layer.prior_distribution(param)
        for layer in model.net.modules()
        if isinstance(layer, bbb.BayesianAffine)
        for param in layer.bayesian_parameters
        for name in [f"{layer._pyro_name}.{param}"]
    }
    w = {name: d.sample((20_000,)) for name, d in q.items()}
    per_particle = sum(q[n].log_prob(w[n]) - prior[n].log_prob(w[n]) for n in q)
    stderr = per_particle.std() / math.sqrt(20_000)
    assert analytic.item() > 1.0
    assert abs(mc.item() - analytic.item()) < 4 * stderr.item()
    assert abs(per_particle.mean().item() - analytic.item()) < 4 * stderr.item()


def test_scale_mixture_prior_uses_the_monte_carlo_kl():
    prior = ScaleMixture(0.5, 1.0, math.exp(-6))
    model, guide, x, y = small_regression(prior=prior)
    elbo = AnnealedELBO(num_particles=1)
    pyro.set_rng_seed(3)
    terms = elbo.terms(model, guide, x, y)
    # the analytic path must have been refused for this pair
    assert all(v is False for v in elbo._has_closed_form.values())
    # and the single-sample KL is log q(w) - log p(w) at the sampled w
    pyro.set_rng_seed(3)
    trace = pyro.poutine.trace(guide).get_trace(x, y)
    expected = sum(
        site["fn"].log_prob(site["value"]).sum()
        - prior.expand(site["value"].shape).log_prob(site["value"]).sum()
        for site in trace.nodes.values()
        if site["type"] == "sample"
    )
    assert torch.allclose(terms.kl, expected, rtol=1e-5)


@pytest.mark.parametrize("prior", [Gaussian(1.0), ScaleMixture(0.5, 1.0, 0.01)])
def test_beta_zero_gives_the_expected_nll_alone_and_one_the_full_negative_elbo(prior):
    model, guide, x, y = small_regression(prior=prior)
    results = {}
    for beta in (0.0, 0.3, 1.0):
        pyro.set_rng_seed(1)
        results[beta] = AnnealedELBO(beta, num_particles=4).terms(model, guide, x, y)
    assert torch.equal(results[0.0].loss, results[0.0].nll)
    assert torch.allclose(results[1.0].loss, results[1.0].nll + results[1.0].kl)
    assert torch.allclose(results[0.3].loss, results[0.3].nll + 0.3 * results[0.3].kl)
    # the observed site's contribution does not change with beta
    obs = [results[b].sites["obs"] for b in (0.0, 0.3, 1.0)]
    assert torch.equal(obs[0], obs[1]) and torch.equal(obs[1], obs[2])
    # and every latent term is the same unweighted KL at every beta
    assert torch.equal(results[0.0].kl, results[1.0].kl)


def test_beta_zero_leaves_no_gradient_from_the_kl():
    model, guide, x, y = small_regression()
    rho = guide.rhos.get_parameter("0.weight")
    pyro.set_rng_seed(2)
    AnnealedELBO(0.0).terms(model, guide, x, y).loss.backward()
    grad_beta0 = rho.grad.clone()
    rho.grad = None
    pyro.set_rng_seed(2)
    terms = AnnealedELBO(0.0).terms(model, guide, x, y)
    terms.nll.backward()
    assert torch.allclose(grad_beta0, rho.grad)


def test_minibatch_losses_average_to_the_full_batch_loss_exactly_for_fixed_weights():
    model, _, x, y = small_regression(num_data=40)
    guide = AutoDelta(model)
    elbo = AnnealedELBO(1.0)
    full = elbo.terms(model, guide, x, y)
    batches = [elbo.terms(model, guide, x[i : i + 10], y[i : i + 10]) for i in range(0, 40, 10)]
    mean_loss = torch.stack([t.loss for t in batches]).mean()
    mean_nll = torch.stack([t.nll for t in batches]).mean()
    assert torch.allclose(mean_loss, full.loss, rtol=1e-5)
    assert torch.allclose(mean_nll, full.nll, rtol=1e-5)
    # the KL (here -log p(w)) enters once per step, unscaled by N/B
    assert all(torch.allclose(t.kl, full.kl) for t in batches)


def test_minibatch_losses_average_to_the_full_batch_loss_up_to_monte_carlo_error():
    model, guide, x, y = small_regression(num_data=40)
    elbo = AnnealedELBO(1.0, num_particles=4000)
    with torch.no_grad():
        full = elbo.terms(model, guide, x, y).loss
        parts = [elbo.terms(model, guide, x[i : i + 8], y[i : i + 8]).loss for i in range(0, 40, 8)]
    assert torch.allclose(torch.stack(parts).mean(), full, rtol=0.01)


def test_particles_are_drawn_in_one_vectorised_pass():
    model, guide, x, y = small_regression()
    calls = []
    handle = guide.register_forward_hook(lambda *args: calls.append(1))
    shapes = {}

    class RecordShapes(pyro.poutine.messenger.Messenger):
        def _pyro_post_sample(self, msg):
            batch_shape = getattr(msg["fn"], "batch_shape", None)
            shapes[msg["name"]] = (tuple(msg["value"].shape), batch_shape)

    with RecordShapes():
        AnnealedELBO(num_particles=7).terms(model, guide, x, y)
    handle.remove()
    assert len(calls) == 1
    assert shapes["0.weight"] == ((7, 1, 8, 3), torch.Size([7, 1]))
    assert shapes["obs"] == ((40,), torch.Size([7, 40]))


def test_annealed_elbo_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_particles"):
        AnnealedELBO(num_particles=0)
    with pytest.raises(ValueError, match="beta"):
        AnnealedELBO(-1.0)
    with pytest.raises(ValueError, match="beta"):
        AnnealedELBO(1.0).beta = float("nan")


def test_annealed_elbo_drives_pyro_svi():
    model, guide, x, y = small_regression()
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), AnnealedELBO(0.5))
    losses = [svi.step(x, y) for _ in range(150)]
    assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20


def test_guide_site_without_rsample_is_refused_with_its_name():
    def model():
        pyro.sample("k", dist.Bernoulli(0.5))

    def guide():
        pyro.sample("k", dist.Bernoulli(0.3))

    with pytest.raises(NotImplementedError, match="'k'"):
        AnnealedELBO().terms(model, guide)


# --- priors carried from a trained guide (from_guide) ---------------------------------------


def carried_problem(old_guide, new_guide, *, heads=1, seed=0):
    """A model whose body (and first head) carry ``old_guide``'s posterior; a new guide on it.

    The network is 3-5-``heads`` tanh; the old guide is trained on its first output only (a
    3-5-1 network), so with ``heads=2`` the new model's second head has a fresh N(0, 1) prior.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(30, 3, generator=g)
    y = torch.tanh(x.sum(-1)) + 0.2 * torch.randn(30, generator=g)
    old_model = bbb.BNN(bbb.mlp([3, 5, 1], "tanh"), bbb.likelihoods.Gaussian(scale=0.3), 30)
    guide = old_guide(old_model, name="old")
    bbb.fit(old_model, guide, x, y, epochs=30, seed=seed, progress=False)
    prior = {**from_guide(guide), "*": Gaussian(1.0)}
    net = bbb.mlp(
        [3, 5, heads],
        "tanh",
        prior=prior if heads == 1 else {k: v for k, v in prior.items() if not k.startswith("2.")},
    )
    y2 = y if heads == 1 else torch.stack([y, -y], -1)
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(scale=0.3), num_data=30)
    new = new_guide(model, name="new")
    new(x, y2)
    with torch.no_grad():  # move away from the prior's means so the KL is not trivial
        for name, p in new.named_parameters():
            p.add_((0.2 if "locs" in name else 0.3) * torch.randn_like(p))
    return model, new, x, y2


def monte_carlo_kl(model, guide, x, y, batches=8, particles=4000):
    """Mean and standard error of the Monte Carlo KL, from independent batches of draws."""
    elbo = AnnealedELBO(num_particles=particles, analytic_kl=False)
    with torch.no_grad():
        values = torch.stack([elbo.terms(model, guide, x, y).kl for _ in range(batches)])
    return values.mean().item(), values.std().item() / math.sqrt(batches)


MEAN_FIELD = bbb.MeanFieldGuide


def LOW_RANK(model, **kw):
    return bbb.LowRankGuide(model, rank=2, **kw)


def NETWORK_BLOCK(model, **kw):
    return bbb.LowRankGuide(model, rank=3, blocks="network", **kw)


@pytest.mark.parametrize(
    ("old", "new", "heads", "closed_form_sites"),
    [
        # mean field against independent Normals: one term per site
        (MEAN_FIELD, MEAN_FIELD, 1, {"0.weight", "0.bias", "2.weight", "2.bias"}),
        # low rank against the blocks of a low-rank posterior: one term per block
        (LOW_RANK, LOW_RANK, 1, {"_new.0", "_new.2"}),
        # mean field against the blocks of a low-rank posterior: one term per prior block,
        # recorded at the block's first site
        (LOW_RANK, MEAN_FIELD, 1, {"0.weight", "2.weight"}),
        # one guide block over two prior blocks and a fresh head: one term in all
        (LOW_RANK, NETWORK_BLOCK, 2, {"_new.network"}),
    ],
    ids=["mf-on-mf", "lr-on-lr", "mf-on-lr", "network-on-layers"],
)
def test_closed_form_kl_against_a_carried_posterior_equals_monte_carlo(
    old, new, heads, closed_form_sites
):
    model, guide, x, y = carried_problem(old, new, heads=heads)
    terms = AnnealedELBO().terms(model, guide, x, y)
    assert set(terms.sites) - {"obs"} == closed_form_sites  # no site fell back to Monte Carlo
    again = AnnealedELBO().terms(model, guide, x, y)
    assert torch.equal(again.kl, terms.kl)  # closed form: the same value for every draw
    mean, stderr = monte_carlo_kl(model, guide, x, y)
    assert terms.kl.item() > 1.0
    assert abs(mean - terms.kl.item()) < 4 * stderr + 1e-3, (mean, stderr, terms.kl.item())


def test_a_guide_block_that_splits_a_prior_block_falls_back_to_an_exact_monte_carlo_kl():
    # prior: one block over the whole network; guide: one block per layer. The KL does not
    # split into per-layer terms, so it is estimated, and the estimate is unbiased.
    model, guide, x, y = carried_problem(NETWORK_BLOCK, LOW_RANK)
    terms = AnnealedELBO().terms(model, guide, x, y)
    assert {"0.weight", "0.bias", "2.weight", "2.bias"} <= set(terms.sites)
    prior_block = model.net[0].priors["weight"].block
    p = prior_block.joint(list(prior_block.sites), device=x.device, dtype=x.dtype)
    q_blocks = [guide.block_distribution(b) for b in guide.block_names]
    q_cov = torch.block_diag(*(q.covariance_matrix for q in q_blocks)).double()
    q_loc = torch.cat([q.loc for q in q_blocks]).double()
    exact = torch.distributions.kl_divergence(
        torch.distributions.MultivariateNormal(q_loc, q_cov),
        torch.distributions.MultivariateNormal(p.loc.double(), p.covariance_matrix.double()),
    )
    mean, stderr = monte_carlo_kl(model, guide, x, y)
    assert abs(mean - exact.item()) < 4 * stderr + 1e-3, (mean, stderr, exact.item())


def test_autonormal_on_a_constrained_site_keeps_the_jacobian_of_its_transform():
    # AutoNormal draws s = exp(u) as a Delta whose log_density is -log s; Pyro's registered
    # KL(Delta || p) = -log p(s) drops it. At s = 3 that would be off by log 3.
    from pyro.infer.autoguide import AutoNormal, init_to_value

    def model(y):
        s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("obs", dist.Normal(0.0, s), obs=y)

    y = 2 * torch.randn(10)
    guide = AutoNormal(
        model, init_scale=1e-3, init_loc_fn=init_to_value(values={"s": torch.tensor(3.0)})
    )
    guide(y)
    ours = AnnealedELBO(num_particles=1000).loss(model, guide, y)
    pyros = pyro.infer.Trace_ELBO(num_particles=1000, vectorize_particles=True, max_plate_nesting=1)
    assert ours == pytest.approx(pyros.loss(model, guide, y), abs=0.05)
