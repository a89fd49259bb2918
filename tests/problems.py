r"""Problems with known answers, shared by the tests: conjugate Bayesian linear regression.

With :math:`y = \tilde X w + \varepsilon`, :math:`\varepsilon \sim \mathcal{N}(0, \sigma^2)`
known, and prior :math:`w \sim \mathcal{N}(0, s^2 I)` (weights and bias), the posterior is
:math:`\mathcal{N}(m, \Lambda^{-1})` with :math:`\Lambda = \tilde X^\top \tilde X/\sigma^2 +
I/s^2` and :math:`m = \Lambda^{-1}\tilde X^\top y/\sigma^2`. The mean-field optimum has the
exact means ``m`` and variances :math:`1/\Lambda_{ii}` (Bishop 2006, §10.1.2).
:func:`linear_posterior` gives the posterior under any Gaussian prior, for the recursion
:math:`p(w \mid A \cup B) \propto p(B \mid w)\, p(w \mid A)`.
"""

from __future__ import annotations

import pyro
import torch

import pyro_bbb as bbb
from pyro_bbb.priors import Gaussian

NOISE, PRIOR_SCALE = 0.5, 1.0


def conjugate_problem(num_data=30, dim=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_data, dim, generator=g, dtype=torch.float64)
    x[:, 1] += 0.8 * x[:, 0]  # correlated features: a posterior with real correlations
    w = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    y = x @ w + 0.3 + NOISE * torch.randn(num_data, generator=g, dtype=torch.float64)
    design = torch.cat([x, torch.ones(num_data, 1, dtype=torch.float64)], dim=1)
    precision = (
        design.T @ design / NOISE**2 + torch.eye(dim + 1, dtype=torch.float64) / PRIOR_SCALE**2
    )
    covariance = torch.linalg.inv(precision)
    mean = covariance @ design.T @ y / NOISE**2
    return x, y, mean, covariance, precision


def random_conjugate_problem(num_data, dim, seed=0):
    """A conjugate linear regression with random true weights: ``(x, y, mean, cov, precision)``.

    ``dim`` standard normal features (the second correlated with the first, as in
    :func:`conjugate_problem`), true weights and bias drawn from N(0, 1), noise ``NOISE``, prior
    N(0, ``PRIOR_SCALE``²) on weights and bias: the problems of 2-8 features and 60-1,000
    points the defaults of ``fit`` are measured on (``benchmarks/convergence.py``).
    """
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(num_data, dim, generator=g, dtype=torch.float64)
    if dim > 1:
        x[:, 1] += 0.8 * x[:, 0]
    w = torch.randn(dim, generator=g, dtype=torch.float64)
    b = torch.randn((), generator=g, dtype=torch.float64)
    y = x @ w + b + NOISE * torch.randn(num_data, generator=g, dtype=torch.float64)
    prior_precision = torch.eye(dim + 1, dtype=torch.float64) / PRIOR_SCALE**2
    mean, covariance, precision = linear_posterior(
        x, y, torch.zeros(dim + 1, dtype=torch.float64), prior_precision
    )
    return x, y, mean, covariance, precision


def design(x):
    """``[x, 1]``: the features and the bias column, ``(N, dim + 1)``."""
    return torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)


def linear_posterior(x, y, prior_mean, prior_precision):
    """Mean, covariance and precision of [w, b] given (x, y) under N(prior_mean, precision⁻¹)."""
    features = design(x)
    precision = prior_precision + features.T @ features / NOISE**2
    covariance = torch.linalg.inv(precision)
    mean = covariance @ (prior_precision @ prior_mean + features.T @ y / NOISE**2)
    return mean, covariance, precision


def linear_bnn(x):
    net = bbb.mlp([x.shape[1], 1], prior=Gaussian(PRIOR_SCALE)).double()
    return bbb.BNN(net, bbb.likelihoods.Gaussian(scale=NOISE).double(), num_data=len(x))


def flat_posterior(guide):
    """Means and variances of [w_1..w_d, b] from a guide's per-site posteriors."""
    post = guide.posterior()
    loc = torch.cat([post["0.weight"].mean.reshape(-1), post["0.bias"].mean.reshape(-1)])
    var = torch.cat([post["0.weight"].variance.reshape(-1), post["0.bias"].variance.reshape(-1)])
    return loc, var


def exact_guide(model, x, y, mean, covariance, shrink=1.0, name=None):
    """A network-block LowRankGuide whose q is N(mean, shrink² · covariance) exactly."""
    name = f"exact_{shrink}" if name is None else name
    guide = bbb.LowRankGuide(model, rank=len(mean), blocks="network", name=name)
    guide(x, y)
    floor = 0.5 * float(torch.linalg.eigvalsh(covariance).min())
    identity = torch.eye(len(mean), dtype=covariance.dtype)
    with torch.no_grad():
        guide.locs.network.copy_(mean)
        sd = torch.full_like(mean, floor).sqrt() * shrink - guide.min_scale
        guide.rhos.network.copy_(torch.log(torch.expm1(sd)))
        factor = torch.linalg.cholesky(covariance - floor * identity) * shrink
        guide.factors_t.network.copy_(factor.mT)
    assert torch.allclose(guide.covariance("network"), shrink**2 * covariance)
    return guide


def optimal_mean_field(model, x, y, mean, precision):
    """A MeanFieldGuide at mean-field's optimum: the exact means, variances 1 / diag(precision)."""
    dim = x.shape[1]
    init = {"0.weight": mean[:dim].reshape(1, dim), "0.bias": mean[dim:]}
    guide = bbb.MeanFieldGuide(model, init_loc=init)
    guide(x, y)
    sd = precision.diagonal().rsqrt() - guide.min_scale
    rho = torch.log(torch.expm1(sd))  # softplus(rho) + min_scale = sd + min_scale
    store = pyro.get_param_store()
    with torch.no_grad():
        store["MeanFieldGuide.rhos.0.weight"].copy_(rho[:dim].reshape(1, dim))
        store["MeanFieldGuide.rhos.0.bias"].copy_(rho[dim:])
    loc, var = flat_posterior(guide)
    assert torch.allclose(loc, mean) and torch.allclose(var, 1 / precision.diagonal())
    return guide


def wide_conjugate_problem(num_data=60, dim=11, seed=0):
    """:func:`conjugate_problem` with ``dim`` correlated features (``dim + 1`` weights)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_data, dim, generator=g, dtype=torch.float64)
    x[:, 1:] += 0.7 * x[:, :-1]  # neighbouring features correlate: a posterior with structure
    w = torch.randn(dim, generator=g, dtype=torch.float64)
    y = x @ w + 0.3 + NOISE * torch.randn(num_data, generator=g, dtype=torch.float64)
    prior_precision = torch.eye(dim + 1, dtype=torch.float64) / PRIOR_SCALE**2
    prior_mean = torch.zeros(dim + 1, dtype=torch.float64)
    mean, covariance, precision = linear_posterior(x, y, prior_mean, prior_precision)
    return x, y, mean, covariance, precision
