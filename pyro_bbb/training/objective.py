"""The objective a fit steps on, built once before its first step.

The annealed ELBO with its number of particles, the parameters its first evaluation creates
(under a forked random state, so the first step draws what ``SVI``'s would), how weight draws
reach the network (:mod:`~pyro_bbb.nn.draws`), and the fused evaluation
(:mod:`~pyro_bbb.infer.fused`) where it covers the traced one. It does not step, schedule or
report: :mod:`~pyro_bbb.training.loop` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

import pyro.poutine as poutine
import torch

from .._devices import cuda_devices
from ..infer.elbo import AnnealedELBO, ELBOTerms
from ..infer.fused import FusedELBO, fused_elbo
from ..infer.guides._base import site_guide
from ..infer.guides._params import claim_fitted
from ..infer.reparam import estimator, warn_slower_paths
from ..nn.draws import describe_draws, settle_draws
from .minibatches import Batches, check_likelihood_scale
from .particles import default_num_particles, draw_size

__all__ = ["Objective", "build_objective"]


class Objective(NamedTuple):
    """The ELBO a fit steps on and what its first evaluation set up."""

    elbo: AnnealedELBO
    #: The first batch (the set-up evaluation's, the collapse check's and a checkpoint's).
    first: tuple[torch.Tensor, ...]
    #: Every parameter by param-store name.
    named: dict[str, torch.Tensor]
    #: The distinct trainable parameters.
    params: list[torch.Tensor]
    #: How weight draws reach the network (``History.draws``).
    draws: str
    #: The fused evaluation of the steps, or ``None`` to trace model and guide.
    fused: FusedELBO | None
    #: The estimator's handler a traced step runs under (:func:`~pyro_bbb.infer.reparam.estimator`).
    handler: Callable[[], AbstractContextManager]


def build_objective(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    schedule: Callable[[float], float],
    num_particles: int | None,
    reparam: str | None,
    batches: Batches,
) -> Objective:
    """The ELBO on ``batches``, the parameters its first evaluation creates, the draws' path.

    The number of particles ``None`` asks for is known once the guide is set up (what it
    draws); the fused step is taken where it covers that evaluation.
    """
    handler = estimator(reparam)
    elbo = AnnealedELBO(schedule(0.0), num_particles=num_particles or 1)
    first = next(iter(batches()))
    check_likelihood_scale(model, first, batches.num_data)
    named, params, first_terms = _parameters(model, guide, elbo, handler, first)
    # a guide or model built later that would take them says so, and so does this fit
    # where it trains what an earlier fit trained for another model or autoguide
    ours = site_guide(guide) is not None  # checked at set-up
    claim_fitted({n: t for n, t in named.items() if t.requires_grad}, model, guide, set_up=ours)
    if num_particles is None:  # its set-up is kept
        drawn = draw_size(guide, *first)
        elbo.set_num_particles(default_num_particles(drawn, len(first[0])))
    draws = _settle_draws(model, guide, elbo, reparam, first)
    fused = _fused(model, guide, elbo, reparam, first_terms, params)
    return Objective(elbo, first, named, params, draws, fused, handler)


def _parameters(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    elbo: AnnealedELBO,
    handler: Callable[[], AbstractContextManager],
    batch: tuple[torch.Tensor, ...],
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], ELBOTerms]:
    """Every parameter by param-store name, the distinct trainable ones, and the ELBO's terms.

    One evaluation of the ELBO on ``batch`` creates the guide's parameters; it runs under a
    forked random state, so the first step then draws what ``SVI``'s first step would draw
    from the same seed. It is also the fit's one validated evaluation: with Pyro's validation
    on, it checks the first step's distributions, and the steps then run without the checks.

    Raises:
        ValueError: If the model and guide have no trainable parameter.
    """
    with (
        torch.random.fork_rng(devices=cuda_devices(model, guide)),
        handler(),
        poutine.trace(param_only=True) as capture,
        torch.no_grad(),
    ):
        terms = elbo.terms(model, guide, *batch)
    named = {name: site["value"].unconstrained() for name, site in capture.trace.nodes.items()}
    params = [p for p in _unique(named.values()) if p.requires_grad]
    if not params:
        raise ValueError("the model and guide have no trainable parameters")
    return named, params, terms


def _settle_draws(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    elbo: AnnealedELBO,
    reparam: str | None,
    batch: tuple[torch.Tensor, ...],
) -> str:
    """Decide how the network meets the steps' weight draws; warn once of slower paths.

    Returns:
        How weight draws reach the network (:func:`~pyro_bbb.nn.draws.describe_draws`), or
        ``""`` for a model without a Bayesian network.
    """
    several = elbo.num_particles > 1 or getattr(guide, "num_members", 1) > 1
    net = getattr(model, "net", None)
    described = ""
    if isinstance(net, torch.nn.Module):
        nesting = getattr(model, "max_plate_nesting", 1)
        settle_draws(net, batch[0], plate_dim=-(nesting + 1))
        described = describe_draws(net)
    warn_slower_paths(model, reparam, several_draws=several, stacklevel=4)
    return described


def _fused(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    elbo: AnnealedELBO,
    reparam: str | None,
    first: ELBOTerms,
    params: list[torch.Tensor],
) -> FusedELBO | None:
    """The fused evaluation of the steps, or ``None`` to trace model and guide every step.

    Taken when :func:`~pyro_bbb.infer.fused.fused_elbo` recognises model, guide and
    estimator, its sites are those of the traced set-up evaluation ``first`` (a network
    whose ``forward`` issues sample statements of its own has more), and it reads only
    parameters the optimiser trains.
    """
    fused = fused_elbo(model, guide, elbo, reparam)
    trained = {id(p) for p in params}
    if (
        fused is None
        or not fused.covers(first)
        or any(id(p) not in trained for p in fused.parameters())
    ):
        return None
    return fused


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for t in tensors:
        seen.setdefault(id(t), t)
    return list(seen.values())
