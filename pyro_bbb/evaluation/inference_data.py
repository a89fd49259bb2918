r"""ArviZ export for VI and NUTS with one schema, and the weight draws it is made from.

:func:`to_inference_data` turns a trained guide (``S`` draws) or a
:class:`~pyro_bbb.infer.mcmc.NUTSResult` into ArviZ ``InferenceData`` through one code path
(``az.from_dict``): the weight draws are replayed through the model, vectorised over draws
(:func:`posterior_draws`), to give the pointwise log-likelihood and posterior predictive on
the data given. This module draws no figures; ArviZ (which imports matplotlib) is imported
on first use, so ``import pyro_bbb`` stays light.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample

from .._validation import check_int
from ..infer import Ensemble
from ..infer.mcmc import NUTSResult, replay_nuts
from ..infer.sites import model_in_plates
from ..training import ConvergenceWarning

if TYPE_CHECKING:
    import arviz as az

__all__ = ["Draws", "posterior_draws", "site_dims", "to_inference_data"]

#: Name of the plate over draws (placed left of the model's plates).
_DRAWS_PLATE = "_draws"
#: Chains a guide's independent draws are split into by default.
VI_CHAINS = 4


#: The guides already warned that their fit stopped on the predictive (each is warned once).
_WARNED: weakref.WeakSet = weakref.WeakSet()


def warn_if_stopped_on_predictive(posterior: Any, where: str) -> None:
    """Warn once per guide whose last fit stopped on the predictive, not on convergence.

    :func:`~pyro_bbb.fit` leaves ``guide.fit_until`` (its ``History.until``): ``"predictive"``
    for its default automatic run, which ends when further steps stop paying on the
    predictive, while the posterior's sds may still be far from their optimum; the
    ``ConvergenceWarning`` names ``until="converged"``, the run to use before the posterior
    itself is read. A NUTS result, a guide never fitted, a fixed-length fit (``None``) or a
    strict one is not warned.

    Args:
        posterior: A guide or a NUTS result.
        where: The function that reads the posterior, for the message.
    """
    if getattr(posterior, "fit_until", None) != "predictive":
        return
    try:
        if posterior in _WARNED:
            return
        _WARNED.add(posterior)
    except TypeError:  # a guide that takes no weak reference is warned every time
        pass
    warnings.warn(
        f"{where} reads the posterior of a guide whose fit stopped on the predictive "
        '(fit\'s default, until="predictive"; History.until): further steps had stopped '
        "paying on the predictive, but the posterior's sds may still be far from their "
        "optimum (up to 1.6 times too wide on conjugate regressions at fit's defaults). "
        'Train with fit(..., until="converged") before exporting the posterior or comparing '
        "it with NUTS",
        ConvergenceWarning,
        stacklevel=3,
    )


@dataclass(frozen=True)
class Draws:
    r"""Weight draws of a posterior, replayed through a model.

    Attributes:
        values: ``{site: (num_chains, num_draws, *site shape)}`` of the sampled sites.
        obs_fn: The observation site's distribution under every draw, batch shape
            ``(num_chains * num_draws, batch)``.
        log_prior: :math:`\log p(w)` per draw, ``(num_chains, num_draws)``.
        log_q: :math:`\log q(w)` per draw for a guide, else ``None`` (for an ensemble, the
            density of the mixture of its members).
        draws_first: Whether ``obs_fn``'s batch runs over ``(draws, chains)`` (an ensemble)
            rather than ``(chains · draws)``.
    """

    values: dict[str, torch.Tensor]
    obs_fn: dist.TorchDistribution
    log_prior: torch.Tensor
    log_q: torch.Tensor | None
    draws_first: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        """``(num_chains, num_draws)``."""
        return tuple(self.log_prior.shape)

    def per_chain(self, t: torch.Tensor, event_dims: int = 0) -> torch.Tensor:
        """A tensor whose leading dims run over every draw, as ``(chains, draws, ...)``.

        Draws come chain-major, or draw-major (``draws_first``: an ensemble's draws of each
        member, ``(draws, members, ...)``).
        """
        chains, draws = self.shape
        rest = t.shape[t.dim() - event_dims :] if event_dims else ()
        if self.draws_first:
            return t.reshape(draws, chains, *rest).transpose(0, 1)
        return t.reshape(chains, draws, *rest)

    def pointwise_log_likelihood(self, y: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(y_i \mid w_s)` per draw and point, ``(num_chains, num_draws, batch)``."""
        y = y.to(self.obs_fn.mean.dtype) if not torch.is_floating_point(y) else y
        if isinstance(self.obs_fn, dist.Categorical):
            y = y.long()
        log_p = self.obs_fn.log_prob(y)
        return self.per_chain(log_p, 1)


@torch.no_grad()
def posterior_draws(
    model: Callable[..., Any],
    posterior: Callable[..., Any] | NUTSResult,
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    *,
    num_samples: int = 125,
    num_chains: int | None = None,
) -> Draws:
    """Draw weights from a guide (or take a NUTS result's) and replay them through the model.

    Vectorised over draws: one ``pyro.plate`` of all draws left of the model's plates. A
    guide's draws are independent, so splitting them into chains is only a reshape; it lets
    ArviZ's R̂ and ESS, which need at least two chains, read them as they read MCMC's.

    Args:
        model: The model, e.g. a :class:`~pyro_bbb.BNN`.
        posterior: A trained guide or a :class:`~pyro_bbb.infer.mcmc.NUTSResult`.
        x: Inputs ``(batch, *features)``.
        y: Targets, or ``None``; only passed on to the model (which checks them).
        num_samples: Draws per chain from a guide (per member, for an ensemble); a NUTS
            result uses all its draws.
        num_chains: Chains of a guide's draws (``None``: 4). An ensemble's chains are its
            members and a NUTS result's its own: ``None`` or their number.

    Returns:
        :class:`Draws` with ``num_chains`` chains of ``num_samples`` draws for a guide, one
        chain per member for an :class:`~pyro_bbb.infer.Ensemble`, the result's chains for
        NUTS.

    Raises:
        ValueError: If ``num_samples`` or ``num_chains`` is not a positive int, or
            ``num_chains`` differs from an ensemble's members or a NUTS result's chains.
    """
    observed = getattr(model, "observation_site", "obs")
    ensemble = isinstance(posterior, Ensemble)
    check_int("num_chains", num_chains, optional=True)
    if isinstance(posterior, NUTSResult):
        chains, draws = posterior.num_chains, posterior.num_samples
        _check_chains(num_chains, chains, "the NUTS result's chains")
        replayed_model, guide = replay_nuts(model, posterior)
        log_q = None
    else:
        draws = check_int("num_samples", num_samples)
        if ensemble:
            chains = _check_chains(num_chains, posterior.num_members, "the ensemble's members")
        else:
            chains = VI_CHAINS if num_chains is None else num_chains
        guide, replayed_model = posterior, model
    replayed_model, nesting = model_in_plates(replayed_model, guide)
    nesting = nesting or 1
    # an ensemble's members are its chains, drawn by its own plate right of the draws'
    size = draws if ensemble else chains * draws
    plate = pyro.plate(_DRAWS_PLATE, size, dim=-(nesting + 1))
    # The model checks y against its likelihood, but refuses more rows than num_data (a
    # minibatch of the training set); a larger test set is run without y and checked here.
    num_data = getattr(model, "num_data", None)
    y_model = None if num_data is not None and x.shape[0] > num_data else y
    guide_trace = poutine.trace(plate(guide)).get_trace(x, y_model)
    model_trace = poutine.trace(poutine.replay(plate(replayed_model), trace=guide_trace)).get_trace(
        x, y_model
    )
    shaped = Draws({}, None, torch.empty(chains, draws), None, draws_first=ensemble)
    if ensemble:
        log_q = shaped.per_chain(posterior.mixture_log_prob(guide_trace))
    elif not isinstance(posterior, NUTSResult):
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
        values[name] = shaped.per_chain(value, event)
        log_prior = log_prior + _per_draw(site["fn"].log_prob(value), chains * draws)
    if isinstance(posterior, NUTSResult) and posterior.noise == "prior":
        values[posterior.noise_site] = posterior.samples[posterior.noise_site]
    obs_fn = model_trace.nodes[observed]["fn"]
    expected = obs_fn.batch_shape[-1:] + obs_fn.event_shape
    if y is not None and y.shape != expected:
        raise ValueError(f"y must have shape {tuple(expected)} for x, got {tuple(y.shape)}")
    log_prior = shaped.per_chain(torch.as_tensor(log_prior))
    return Draws(values, obs_fn, log_prior, log_q, draws_first=ensemble)


def _check_chains(num_chains: int | None, chains: int, what: str) -> int:
    """``chains``, after checking that ``num_chains`` is ``None`` or equal to it."""
    if num_chains is not None and num_chains != chains:
        raise ValueError(
            f"num_chains={num_chains} but the chains are {what} ({chains}); pass "
            f"num_chains=None or {chains}"
        )
    return chains


def _per_draw(log_prob: torch.Tensor, num: int) -> torch.Tensor:
    """A log-density of shape ``(S, 1, ...)`` summed to ``(S,)``."""
    return log_prob.reshape(num, -1).sum(-1)


def site_dims(name: str, shape: torch.Size) -> list[str]:
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


def numpy_of(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def to_inference_data(
    model: Callable[..., Any],
    posterior: Callable[..., Any] | NUTSResult,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    num_samples: int = 125,
    num_chains: int | None = None,
    seed: int | None = None,
) -> az.InferenceData:
    r"""ArviZ ``InferenceData`` of a guide or a NUTS result, one schema for both.

    Groups (``C`` chains, ``S`` draws; a guide's independent draws are split into
    ``num_chains`` chains (4 by default) of ``num_samples`` draws, an
    :class:`~pyro_bbb.infer.Ensemble` is one chain of ``num_samples`` draws per member):

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

    With at least two chains, ``az.summary``, ``az.ess`` and ``az.rhat`` run on a guide's
    export as on NUTS's. For a guide R̂ is 1 up to the noise of the split (its draws are
    independent; every chain has the same distribution) and the ESS is about the number of
    draws: they check the export, not the fit. For an ensemble R̂ compares the members: well
    above 1 means the members found different posteriors (modes), which is what an ensemble
    is for.

    Args:
        model: The model, e.g. a :class:`~pyro_bbb.BNN`.
        posterior: A trained guide or a :class:`~pyro_bbb.infer.mcmc.NUTSResult`.
        x: Inputs ``(batch, *features)``: the training set or any other, e.g. a test set.
        y: Targets ``(batch[, dim])``.
        num_samples: Draws per chain from a guide, per member from an ensemble (ignored
            for NUTS, which uses all its draws).
        num_chains: Chains of a guide's draws; ``None`` takes 4. An ensemble's chains are
            its members and a NUTS result's its own: ``None`` or their number.
        seed: Seed for the guide draws and predictive draws.

    Returns:
        An ``arviz.InferenceData``.

    Warns:
        ConvergenceWarning: Once per guide, when its fit stopped on the predictive
            (``fit``'s default ``until="predictive"``): its sds may be far from the
            posterior's; ``until="converged"`` is the run to export.

    Raises:
        ValueError: As :func:`posterior_draws`.
    """
    warn_if_stopped_on_predictive(posterior, "to_inference_data")
    if seed is not None:
        pyro.set_rng_seed(seed)
    draws = posterior_draws(model, posterior, x, y, num_samples=num_samples, num_chains=num_chains)
    observed = getattr(model, "observation_site", "obs")
    dims = {name: site_dims(name, value.shape[2:]) for name, value in draws.values.items()}
    with torch.no_grad():
        predictive = draws.obs_fn.sample()
    predictive = draws.per_chain(predictive, y.dim())
    data_dims = ["data"] + (["obs_dim"] if y.dim() > 1 else [])
    dims[observed] = data_dims
    dims["x"] = ["data"] + [f"x_dim_{i}" for i in range(x.dim() - 1)]
    if isinstance(posterior, NUTSResult):
        stats = {k: numpy_of(v) for k, v in posterior.sample_stats.items()}
    else:
        lp = draws.log_prior + draws.pointwise_log_likelihood(y).sum(-1)
        stats = {"lp": numpy_of(lp), "log_q": numpy_of(draws.log_q)}
    import arviz as az

    return az.from_dict(
        posterior={k: numpy_of(v) for k, v in draws.values.items()},
        posterior_predictive={observed: numpy_of(predictive)},
        log_likelihood={observed: numpy_of(draws.pointwise_log_likelihood(y))},
        observed_data={observed: numpy_of(y)},
        constant_data={"x": numpy_of(x)},
        sample_stats=stats,
        dims=dims,
    )
