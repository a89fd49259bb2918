"""``benchmarks/small_data.py``'s scores: what a trained guide is judged by, and NUTS's.

The β = 1 ELBO it reaches, the predictive's train and test RMSE and test log-likelihood, the
epistemic std at probe inputs over that at the training inputs, the fraction of weights at
their prior (:func:`score`); the same predictive figures under NumPyro's NUTS on the same
network (:func:`nuts_reference`).
"""

from __future__ import annotations

import itertools
import math
import time

import pyro.distributions as dist
import pyro.poutine as poutine
import torch

import pyro_bbb as bbb
from pyro_bbb.infer import AnnealedELBO

KL_THRESHOLD = 0.05


# ------------------------------------------------------------------------------- scoring
@torch.no_grad()
def beta1_loss(model, guide, x, y, particles=64):
    """The β = 1 loss and its parts; of an ensemble, the mean over its members."""
    terms = AnnealedELBO(1.0, num_particles=particles).terms(model, guide, x, y)
    k = getattr(guide, "num_members", 1)
    return terms.loss.item() / k, terms.nll.item() / k, terms.kl.item() / k


@torch.no_grad()
def collapsed_fraction(model, guide, x, threshold=KL_THRESHOLD):
    prior_trace = poutine.trace(model).get_trace(x[:1])
    kls = []
    members = getattr(guide, "members", guide)  # an ensemble's: every member's weights
    for name, (loc, scale) in members._marginals().items():
        p = prior_trace.nodes[name]["fn"].base_dist
        q = dist.Normal(loc, scale)
        kls.append(
            torch.distributions.kl_divergence(
                q, dist.Normal(p.loc.expand_as(loc), p.scale.expand_as(loc))
            ).reshape(-1)
        )
    kls = torch.cat(kls)
    return (kls < threshold).double().mean().item()


@torch.no_grad()
def score(problem, model, guide):
    seed = 0
    draws = 200 // getattr(guide, "num_members", 1)  # an ensemble's: of each member
    train = bbb.predict(model, guide, problem.x, num_samples=draws, seed=seed)
    test = bbb.predict(model, guide, problem.x_test, num_samples=draws, seed=seed)
    probe = bbb.predict(model, guide, problem.x_probe, num_samples=draws, seed=seed)
    loss, nll, kl = beta1_loss(model, guide, problem.x, problem.y)
    ep_train = train.epistemic_std.mean().item()
    return {
        "loss1": loss,
        "nll": nll,
        "kl": kl,
        "rmse_train": bbb.metrics.rmse(train.mean, problem.y),
        "rmse_test": bbb.metrics.rmse(test.mean, problem.y_test),
        "ll_test": test.log_likelihood(problem.y_test),
        "noise": train.aleatoric_std.mean().item(),
        "ep_train": ep_train,
        "ep_probe": probe.epistemic_std.mean().item(),
        "gap_ratio": probe.epistemic_std.mean().item() / ep_train,
        "collapsed": collapsed_fraction(model, guide, problem.x),
    }


# ---------------------------------------------------------------------------------- NUTS
def nuts_reference(problem, num_samples=500, warmup=500, chains=2, seed=0):
    """NumPyro NUTS on the same network and prior; the noise under a HalfNormal(1) prior."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as ndist
    from numpyro.infer import MCMC, NUTS, init_to_median

    jax.config.update("jax_enable_x64", True)
    act = jnp.tanh if problem.activation == "tanh" else jax.nn.relu
    sizes = problem.sizes

    def forward(params, x):
        h = x
        for i in range(len(sizes) - 1):
            h = h @ params[f"w{i}"].T + params[f"b{i}"]
            if i < len(sizes) - 2:
                h = act(h)
        return h[..., 0]

    def model(x, y):
        params = {}
        for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
            params[f"w{i}"] = numpyro.sample(
                f"w{i}", ndist.Normal(0, 1).expand([n_out, n_in]).to_event(2)
            )
            params[f"b{i}"] = numpyro.sample(
                f"b{i}", ndist.Normal(0, 1).expand([n_out]).to_event(1)
            )
        noise = numpyro.sample("noise", ndist.HalfNormal(1.0))
        numpyro.sample("y", ndist.Normal(forward(params, x), noise), obs=y)

    as_np = lambda t: jnp.asarray(t.double().numpy())  # noqa: E731
    x, y = as_np(problem.x), as_np(problem.y)
    mcmc = MCMC(
        NUTS(model, init_strategy=init_to_median),
        num_warmup=warmup,
        num_samples=num_samples,
        num_chains=chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    start = time.perf_counter()
    mcmc.run(jax.random.PRNGKey(seed), x, y)
    seconds = time.perf_counter() - start
    samples = mcmc.get_samples()
    batched = jax.vmap(forward, in_axes=(0, None))
    f_train = batched(samples, x)
    f_test = batched(samples, as_np(problem.x_test))
    f_probe = batched(samples, as_np(problem.x_probe))
    noise = samples["noise"][:, None]
    y_test = as_np(problem.y_test)
    log_p = jax.scipy.stats.norm.logpdf(y_test, f_test, noise)
    ll = float(jnp.mean(jax.scipy.special.logsumexp(log_p, 0) - math.log(log_p.shape[0])))
    ep_train = float(f_train.std(0).mean())
    return {
        "rmse_train": float(jnp.sqrt(jnp.mean((f_train.mean(0) - y) ** 2))),
        "rmse_test": float(jnp.sqrt(jnp.mean((f_test.mean(0) - y_test) ** 2))),
        "ll_test": ll,
        "noise": float(samples["noise"].mean()),
        "ep_train": ep_train,
        "ep_probe": float(f_probe.std(0).mean()),
        "gap_ratio": float(f_probe.std(0).mean()) / ep_train,
        "divergences": int(mcmc.get_extra_fields()["diverging"].sum()),
        "seconds": seconds,
    }
