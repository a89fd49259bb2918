r"""ArviZ export for VI and NUTS with one schema, PSIS k̂ for VI, and ESS / R̂ for NUTS.

:func:`to_inference_data` turns a trained guide (``S`` draws) or a
:class:`~pyro_bbb.mcmc.NUTSResult` into ArviZ ``InferenceData`` through one code path
(``az.from_dict``): the weight draws are replayed through the model, vectorised over draws,
to give the pointwise log-likelihood and posterior predictive on the data given.
:func:`psis_khat` is the Pareto-smoothed importance sampling diagnostic of a variational
posterior (Yao, Vehtari, Simpson & Gelman 2018, https://arxiv.org/abs/1802.02538): the
shape :math:`\hat k` of a generalised Pareto fit to the largest importance ratios
:math:`p(y, w_s) / q(w_s)`. :func:`effective_sample_size` and :func:`r_hat` are ArviZ's
rank-normalised bulk ESS and split R̂ (Vehtari et al. 2021) of a NUTS result, by site.
This module draws no figures; ArviZ (which imports matplotlib) is imported on first use,
so ``import pyro_bbb`` stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample

from .mcmc import NUTSResult, replay_nuts

if TYPE_CHECKING:
    import arviz as az

__all__ = ["effective_sample_size", "psis_khat", "r_hat", "to_inference_data"]

#: Name of the plate over draws (placed left of the model's plates).
_DRAWS_PLATE = "_draws"


@dataclass(frozen=True)
class Draws:
    r"""Weight draws of a posterior, replayed through a model.

    Attributes:
        values: ``{site: (num_chains, num_draws, *site shape)}`` of the sampled sites.
        obs_fn: The observation site's distribution under every draw, batch shape
            ``(num_chains * num_draws, batch)``.
        log_prior: :math:`\log p(w)` per draw, ``(num_chains, num_draws)``.
        log_q: :math:`\log q(w)` per draw for a guide, else ``None``.
    """

    values: dict[str, torch.Tensor]
    obs_fn: dist.TorchDistribution
    log_prior: torch.Tensor
    log_q: torch.Tensor | None

    @property
    def shape(self) -> tuple[int, int]:
        """``(num_chains, num_draws)``."""
        return tuple(self.log_prior.shape)

    def pointwise_log_likelihood(self, y: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(y_i \mid w_s)` per draw and point, ``(num_chains, num_draws, batch)``."""
        y = y.to(self.obs_fn.mean.dtype) if not torch.is_floating_point(y) else y
        if isinstance(self.obs_fn, dist.Categorical):
            y = y.long()
        log_p = self.obs_fn.log_prob(y)
        return log_p.reshape(*self.shape, -1)


def _num_draws_arg(num_samples: object) -> int:
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    return num_samples


@torch.no_grad()
def posterior_draws(
    model, posterior, x: torch.Tensor, y: torch.Tensor | None = None, *, num_samples: int = 500
) -> Draws:
    """Draw weights from a guide (or take a NUTS result's) and replay them through the model.

    Vectorised over draws: one ``pyro.plate`` of ``S`` draws left of the model's plates.

    Args:
        model: The model, e.g. a :class:`~pyro_bbb.BNN`.
        posterior: A trained guide or a :class:`~pyro_bbb.mcmc.NUTSResult`.
        x: Inputs ``(batch, *features)``.
        y: Targets, or ``None``; only passed on to the model (which checks them).
        num_samples: ``S`` for a guide; a NUTS result uses all its draws.

    Returns:
        :class:`Draws` with one chain for a guide, the result's chains for NUTS.
    """
    nesting = getattr(model, "max_plate_nesting", 1)
    observed = getattr(model, "observation_site", "obs")
    if isinstance(posterior, NUTSResult):
        chains, draws = posterior.num_chains, posterior.num_samples
        replayed_model, guide = replay_nuts(model, posterior)
        log_q = None
    else:
        chains, draws = 1, _num_draws_arg(num_samples)
        guide, replayed_model = posterior, model
    plate = pyro.plate(_DRAWS_PLATE, chains * draws, dim=-(nesting + 1))
    # The model checks y against its likelihood, but refuses more rows than num_data (a
    # minibatch of the training set); a larger test set is run without y and checked here.
    num_data = getattr(model, "num_data", None)
    y_model = None if num_data is not None and x.shape[0] > num_data else y
    with pyro.validation_enabled(False):
        guide_trace = poutine.trace(plate(guide)).get_trace(x, y_model)
        model_trace = poutine.trace(
            poutine.replay(plate(replayed_model), trace=guide_trace)
        ).get_trace(x, y_model)
    if not isinstance(posterior, NUTSResult):
        log_q = torch.zeros(chains * draws, dtype=x.dtype, device=x.device)
        for site in guide_trace.nodes.values():
            if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site):
                log_q = log_q + _per_draw(site["fn"].log_prob(site["value"]), chains * draws)
        log_q = log_q.reshape(chains, draws)
    values, log_prior = {}, 0.0
    for name, site in model_trace.iter_stochastic_nodes():
        if name == observed or site_is_subsample(site) or site["is_observed"]:
            continue
        value = site["value"]
        event = site["fn"].event_dim
        values[name] = value.reshape(chains, draws, *value.shape[value.dim() - event :])
        log_prior = log_prior + _per_draw(site["fn"].log_prob(value), chains * draws)
    if isinstance(posterior, NUTSResult) and posterior.noise == "prior":
        values[posterior.noise_site] = posterior.samples[posterior.noise_site]
    obs_fn = model_trace.nodes[observed]["fn"]
    expected = obs_fn.batch_shape[-1:] + obs_fn.event_shape
    if y is not None and y.shape != expected:
        raise ValueError(f"y must have shape {tuple(expected)} for x, got {tuple(y.shape)}")
    return Draws(values, obs_fn, torch.as_tensor(log_prior).reshape(chains, draws), log_q)


def _per_draw(log_prob: torch.Tensor, num: int) -> torch.Tensor:
    """A log-density of shape ``(S, 1, ...)`` summed to ``(S,)``."""
    return log_prob.reshape(num, -1).sum(-1)


def _site_dims(name: str, shape: torch.Size) -> list[str]:
    """Named dims of a site.

    A layer's weight ``(out, in[, kh, kw])`` and bias ``(out,)`` share ``"<layer>.out"``;
    other sites get ``"<site>_dim_<i>"``.
    """
    layer, _, param = name.rpartition(".")
    prefix = f"{layer}." if layer else ""
    if param == "weight" and len(shape) in (2, 4):
        return [f"{prefix}out", f"{prefix}in", f"{prefix}kh", f"{prefix}kw"][: len(shape)]
    if param == "bias" and len(shape) == 1:
        return [f"{prefix}out"]
    return [f"{name}_dim_{i}" for i in range(len(shape))]


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def to_inference_data(
    model,
    posterior,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    num_samples: int = 500,
    seed: int | None = None,
) -> az.InferenceData:
    r"""ArviZ ``InferenceData`` of a guide or a NUTS result, one schema for both.

    Groups (``C`` chains, ``S`` draws; a guide is one chain of ``num_samples`` draws):

    * ``posterior``: every sampled site by its name (``"0.weight"`` ``(C, S, out, in)``
      with dims ``("0.out", "0.in")``; a layer's weight and bias share ``"<layer>.out"``);
      a noise scale NUTS sampled appears as ``"likelihood.scale"``.
    * ``posterior_predictive``: ``"obs"`` ``(C, S, data[, obs_dim])`` drawn from the
      likelihood under each draw at ``x``.
    * ``log_likelihood``: ``"obs"`` ``(C, S, data)``, :math:`\log p(y_i \mid w_s)` on the
      data given (what ``az.loo`` and ``az.waic`` read).
    * ``observed_data``: ``"obs"`` = ``y``; ``constant_data``: ``"x"``.
    * ``sample_stats``: for NUTS the sampler's ``lp``, ``diverging``, ``tree_depth``,
      ``n_steps``, ``step_size``, ``acceptance_rate`` (on its training data); for a guide
      ``lp`` = :math:`\log p(y, w_s)` on the data given and ``log_q`` =
      :math:`\log q(w_s)`.

    Args:
        model: The model, e.g. a :class:`~pyro_bbb.BNN`.
        posterior: A trained guide or a :class:`~pyro_bbb.mcmc.NUTSResult`.
        x: Inputs ``(batch, *features)``: the training set or any other, e.g. a test set.
        y: Targets ``(batch[, dim])``.
        num_samples: Draws from a guide (ignored for NUTS, which uses all its draws).
        seed: Seed for the guide draws and predictive draws.

    Returns:
        An ``arviz.InferenceData``.
    """
    if seed is not None:
        pyro.set_rng_seed(seed)
    draws = posterior_draws(model, posterior, x, y, num_samples=num_samples)
    chains, num = draws.shape
    observed = getattr(model, "observation_site", "obs")
    dims = {name: _site_dims(name, value.shape[2:]) for name, value in draws.values.items()}
    with torch.no_grad():
        predictive = draws.obs_fn.sample()
    predictive = predictive.reshape(chains, num, *predictive.shape[predictive.dim() - y.dim() :])
    data_dims = ["data"] + (["obs_dim"] if y.dim() > 1 else [])
    dims[observed] = data_dims
    dims["x"] = ["data"] + [f"x_dim_{i}" for i in range(x.dim() - 1)]
    if isinstance(posterior, NUTSResult):
        stats = {k: _numpy(v) for k, v in posterior.sample_stats.items()}
    else:
        lp = draws.log_prior + draws.pointwise_log_likelihood(y).sum(-1)
        stats = {"lp": _numpy(lp), "log_q": _numpy(draws.log_q)}
    import arviz as az

    return az.from_dict(
        posterior={k: _numpy(v) for k, v in draws.values.items()},
        posterior_predictive={observed: _numpy(predictive)},
        log_likelihood={observed: _numpy(draws.pointwise_log_likelihood(y))},
        observed_data={observed: _numpy(y)},
        constant_data={"x": _numpy(x)},
        sample_stats=stats,
        dims=dims,
    )


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
    if _num_draws_arg(num_samples) < 10:
        raise ValueError(f"num_samples must be at least 10, got {num_samples}")
    if seed is not None:
        pyro.set_rng_seed(seed)
    draws = posterior_draws(model, guide, x, y, num_samples=num_samples)
    log_joint = draws.log_prior + draws.pointwise_log_likelihood(y).sum(-1)
    log_ratio = (log_joint - draws.log_q).reshape(-1).double()
    if not torch.isfinite(log_ratio).all():
        raise ValueError("log p(y, w) - log q(w) is not finite for some draws")
    import arviz as az

    _, khat = az.psislw(_numpy(log_ratio))
    return float(khat)


def _posterior_dataset(result: NUTSResult):
    import arviz as az

    return az.from_dict(
        posterior={k: _numpy(v) for k, v in result.samples.items()},
        dims={k: _site_dims(k, v.shape[2:]) for k, v in result.samples.items()},
    ).posterior


def effective_sample_size(result: NUTSResult) -> dict[str, torch.Tensor]:
    """ArviZ's rank-normalised bulk ESS of every scalar in a NUTS result.

    Args:
        result: A :class:`~pyro_bbb.mcmc.NUTSResult`.

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
        result: A :class:`~pyro_bbb.mcmc.NUTSResult`.

    Returns:
        ``{site: R̂ of the site's shape}``.
    """
    import arviz as az

    rhat = az.rhat(_posterior_dataset(result))
    return {k: torch.as_tensor(rhat[k].values) for k in result.samples}
