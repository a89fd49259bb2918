r"""Diagnostics of a posterior: PSIS k̂ for a guide, ESS and R̂ for a NUTS run.

:func:`psis_khat` is the Pareto-smoothed importance sampling diagnostic of a variational
posterior (Yao, Vehtari, Simpson & Gelman 2018, https://arxiv.org/abs/1802.02538): the
shape :math:`\hat k` of a generalised Pareto fit to the largest importance ratios
:math:`p(y, w_s) / q(w_s)`. :func:`effective_sample_size` and :func:`r_hat` are ArviZ's
rank-normalised bulk ESS and split R̂ (Vehtari et al. 2021, https://arxiv.org/abs/1903.08008)
of a NUTS result, by site. ArviZ is imported on first use.
"""

from __future__ import annotations

import pyro
import torch

from .._validation import check_int
from ..infer.mcmc import NUTSResult
from .inference_data import numpy_of, posterior_draws, site_dims

__all__ = ["effective_sample_size", "psis_khat", "r_hat"]


def psis_khat(
    model,
    guide,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    num_samples: int = 1000,
    seed: int | None = None,
) -> float:
    r"""Pareto :math:`\hat k` of the importance ratios :math:`p(y, w) / q(w)`, :math:`w \sim q`.

    PSIS (Yao et al. 2018, https://arxiv.org/abs/1802.02538) fits a generalised Pareto
    distribution to the largest ratios :math:`\log r_s = \log p(y, w_s) - \log q(w_s)`; its
    shape :math:`\hat k` says how heavy their tail is. :math:`\hat k < 0.5`: ``q`` is close
    to the posterior, importance sampling works well. :math:`0.5 \le \hat k < 0.7`: usable
    for importance-sampling corrections, with slower convergence. :math:`\hat k \ge 0.7`: the
    ratios have (nearly) infinite variance; ``q`` is not usable for corrections, and
    expectations under ``q`` can be far from the posterior's. A guide that is too narrow
    gives a large :math:`\hat k`; one that is too wide does not.

    Args:
        model: The model, e.g. a :class:`~pyro_bbb.BNN`.
        guide: A trained guide (any Pyro guide whose sites reach the model by name).
        x: The whole training set's inputs, ``len(x) == model.num_data``.
        y: Its targets.
        num_samples: Draws ``S`` (at least a few hundred; the tail fit uses
            :math:`\min(S/5, 3\sqrt S)` of them).
        seed: Seed for the draws.

    Returns:
        :math:`\hat k` (dimensionless).

    Raises:
        ValueError: If ``x`` is not the whole training set, or ``num_samples < 10``.
    """
    if isinstance(guide, NUTSResult):
        raise TypeError("psis_khat diagnoses a guide (VI); got a NUTSResult")
    num_data = getattr(model, "num_data", None)
    if num_data is not None and x.shape[0] != num_data:
        raise ValueError(
            f"psis_khat needs the whole training set (the posterior is p(w | all data)): x has "
            f"{x.shape[0]} rows but model.num_data={num_data}"
        )
    if check_int("num_samples", num_samples) < 10:
        raise ValueError(f"num_samples must be at least 10, got {num_samples}")
    if seed is not None:
        pyro.set_rng_seed(seed)
    draws = posterior_draws(model, guide, x, y, num_samples=num_samples)
    log_joint = draws.log_prior + draws.pointwise_log_likelihood(y).sum(-1)
    log_ratio = (log_joint - draws.log_q).reshape(-1).double()
    if not torch.isfinite(log_ratio).all():
        raise ValueError("log p(y, w) - log q(w) is not finite for some draws")
    import arviz as az

    _, khat = az.psislw(numpy_of(log_ratio))
    return float(khat)


def _posterior_dataset(result: NUTSResult):
    import arviz as az

    return az.from_dict(
        posterior={k: numpy_of(v) for k, v in result.samples.items()},
        dims={k: site_dims(k, v.shape[2:]) for k, v in result.samples.items()},
    ).posterior


def effective_sample_size(result: NUTSResult) -> dict[str, torch.Tensor]:
    """ArviZ's rank-normalised bulk ESS of every scalar in a NUTS result.

    Args:
        result: A :class:`~pyro_bbb.infer.mcmc.NUTSResult`.

    Returns:
        ``{site: ESS of the site's shape}`` (draws, summed over chains).
    """
    import arviz as az

    ess = az.ess(_posterior_dataset(result), method="bulk")
    return {k: torch.as_tensor(ess[k].values) for k in result.samples}


def r_hat(result: NUTSResult) -> dict[str, torch.Tensor]:
    """ArviZ's rank-normalised split R̂ of every scalar in a NUTS result.

    1 at convergence; above 1.01 the chains disagree. It needs at least two chains to mean
    much.

    Args:
        result: A :class:`~pyro_bbb.infer.mcmc.NUTSResult`.

    Returns:
        ``{site: R̂ of the site's shape}``.
    """
    import arviz as az

    rhat = az.rhat(_posterior_dataset(result))
    return {k: torch.as_tensor(rhat[k].values) for k in result.samples}
