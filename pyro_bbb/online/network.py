r"""A :class:`~pyro_bbb.BNN`'s network as a function of one flat weight vector.

An online filter keeps a Gaussian belief over all Bayesian weights of the network as one
vector :math:`\theta \in \mathbb{R}^d` and needs the network's outputs and their Jacobian
:math:`J = \partial f(x; \theta) / \partial \theta` at given weights. This module holds:

* :class:`WeightLayout`: where each site lives in :math:`\theta` (the model's site names,
  in the order the model draws them), and the Gaussian prior of every value;
* :func:`weight_layout`: reads both from one trace of the model on one row of data
  (:func:`layout_of_trace` from a trace at hand, a guide's prototype trace);
* :func:`network_function`: :math:`f(\theta, x)`, the network run at given weights without
  any sample statement, checked once to cover every site;
* :func:`outputs_and_jacobian`: the outputs and their Jacobian by :mod:`torch.func`.

The Jacobian is reverse-mode, one row of data at a time: ``vmap`` over the rows of
``jacrev`` of the network on one row. Measured against ``jacrev`` of the whole batch (its
cotangents run the whole batch backward for each output of each row) and forward mode
(``jacfwd``, one pass per weight) in ``benchmarks/online.py``; the per-row reverse mode was
the fastest on every network tried but the smallest (``docs/online.md`` has the table).
Nothing here knows of guides or filters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample
from torch.func import vjp, vmap

from .._support import independent_base
from ..infer.sites import prior_trace
from ..model import BNN

__all__ = [
    "WeightLayout",
    "gaussian_prior",
    "layout_of_trace",
    "network_function",
    "outputs_and_jacobian",
    "pull_back_rows",
    "weight_layout",
]

NetworkFunction = Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor]
"""``f(weights, x)``: ``{site: tensor}`` and inputs ``(batch, *features)`` to ``(batch, C)``."""


@dataclass(frozen=True)
class WeightLayout:
    r"""The network's Bayesian weights as one flat vector, and their Gaussian prior.

    Attributes:
        sites: ``{site name: shape}`` in the order the values are concatenated.
        prior_loc: Prior mean of every value, ``(d,)``.
        prior_variance: Prior variance of every value, ``(d,)``.
    """

    sites: dict[str, torch.Size]
    prior_loc: torch.Tensor
    prior_variance: torch.Tensor

    @property
    def size(self) -> int:
        """``d``, the number of Bayesian weights."""
        return int(self.prior_loc.shape[0])

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split ``theta`` ``(*batch, d)`` into ``{site: (*batch, *site shape)}`` views."""
        values, start = {}, 0
        lead = theta.shape[:-1]
        for name, shape in self.sites.items():
            stop = start + shape.numel()
            values[name] = theta[..., start:stop].reshape(*lead, *shape)
            start = stop
        return values

    def flatten(self, values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Concatenate ``{site: tensor of the site's shape}`` into ``(d,)``.

        Raises:
            ValueError: If a site is missing or has another shape.
        """
        parts = []
        for name, shape in self.sites.items():
            if name not in values:
                raise ValueError(f"no value for site {name!r}; sites are {list(self.sites)}")
            value = values[name]
            if value.shape != shape:
                raise ValueError(
                    f"site {name!r} must have shape {tuple(shape)}, got {tuple(value.shape)}"
                )
            parts.append(value.reshape(-1))
        return torch.cat(parts)


def weight_layout(model: BNN, x: torch.Tensor) -> WeightLayout:
    """Read the network's Bayesian sites and their priors from one trace of the model.

    The model runs once on the first row of ``x``, drawing from the prior, without gradients
    and with the caller's random streams and the network's buffers left as they were.

    Args:
        model: A :class:`~pyro_bbb.BNN`.
        x: Inputs ``(batch, *features)``; one row is used.

    Returns:
        The layout, on the model's device and in its dtype.

    Raises:
        ValueError: If a site's prior is not a Gaussian with independent values (a scale
            mixture, a carried joint block), or the model has no latent site.
    """
    return layout_of_trace(prior_trace(model, x[:1]), model.observation_site)


def layout_of_trace(trace: poutine.Trace, observation_site: str) -> WeightLayout:
    """The layout of the latent sites of a model's trace (a guide's prototype trace too).

    Args:
        trace: A trace of the model.
        observation_site: The observed site's name, left out.

    Raises:
        ValueError: As :func:`weight_layout`.
    """
    sites, locs, variances = {}, [], []
    for name, site in trace.iter_stochastic_nodes():
        if name == observation_site or site_is_subsample(site) or site["is_observed"]:
            continue
        loc, scale = gaussian_prior(name, site["fn"], site["value"].shape)
        sites[name] = site["value"].shape
        locs.append(loc.reshape(-1))
        variances.append(scale.square().reshape(-1))
    if not sites:
        raise ValueError("the model has no Bayesian weight (latent sample site) to update")
    return WeightLayout(sites, torch.cat(locs), torch.cat(variances))


def gaussian_prior(
    name: str, fn: torch.distributions.Distribution, shape: torch.Size
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and standard deviation of each value of a site under its Gaussian prior.

    Args:
        name: The site's name, for the error message.
        fn: Its prior, a ``Normal`` (possibly ``.to_event``-ed).
        shape: The site's shape.

    Returns:
        ``(loc, scale)``, each of the site's shape.

    Raises:
        ValueError: If the prior is not a Normal with independent values.
    """
    base = independent_base(fn)
    if not isinstance(base, torch.distributions.Normal):
        raise ValueError(
            f"site {name!r} has a {type(base).__name__} prior; the online updaters start from "
            "a Gaussian prior with independent weights (e.g. priors.Gaussian, "
            "priors.FanInGaussian, or from_guide of a mean-field guide)"
        )
    return base.loc.expand(shape), base.scale.expand(shape)


def network_function(model: BNN, layout: WeightLayout, x: torch.Tensor) -> NetworkFunction:
    """``f(weights, x)``: the network at given weights, checked once on ``x`` to draw nothing.

    Args:
        model: The model whose network runs.
        layout: Its weights' layout (:func:`weight_layout`).
        x: Inputs ``(batch, *features)`` for the check; one row is used.

    Returns:
        A function of weights ``{site: tensor}`` (:meth:`WeightLayout.unflatten`) and inputs
        ``(batch, *features)`` returning outputs ``(batch, C)``, differentiable in the
        weights and usable under :mod:`torch.func`.

    Raises:
        ValueError: If the network issues a sample statement of its own given all of the
            layout's sites (a latent site outside them).
    """

    def f(weights: Mapping[str, torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
        return model.network_at(weights, inputs)

    with torch.no_grad(), poutine.trace() as tracer:
        f(layout.unflatten(layout.prior_loc), x[:1])
    drawn = [name for name, site in tracer.trace.nodes.items() if site["type"] == "sample"]
    if drawn:
        raise ValueError(
            f"the network draws site(s) {drawn} that the online updater does not cover; "
            "every latent site must be a weight of the network's Bayesian layers"
        )
    return f


Cotangents = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(output row (C,), target row) -> (C, K)``: the cotangents to pull back for one row."""


def pull_back_rows(
    f: NetworkFunction,
    layout: WeightLayout,
    theta: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    cotangents: Cotangents,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The outputs, and cotangents chosen from them pulled back to the weights, row by row.

    For each row :math:`n` the network runs forward once; ``cotangents`` maps its output
    :math:`f_n` (and target :math:`y_n`) to :math:`K` vectors :math:`u_{nk} \in \mathbb{R}^C`,
    and reverse mode returns :math:`J_n^\top u_{nk}`, with :math:`J_n = \partial
    f(x_n;\theta)/\partial\theta`. With the identity as cotangents this is the Jacobian
    (:func:`outputs_and_jacobian`); with the root of the likelihood's curvature and its
    gradient it is what a Gauss-Newton update needs, without forming :math:`J`. Rows are
    ``vmap``-ed; the Jacobian is taken with respect to each site's tensor and concatenated
    once (through the flat vector, every site's slice would scatter into a zero tensor of
    all ``d`` weights for each cotangent of each row).

    Args:
        f: The network function (:func:`network_function`).
        layout: The weights' layout.
        theta: Weights ``(*samples, d)``: one weight vector, or several (vectorised).
        x: Inputs ``(batch, *features)``.
        y: Targets ``(batch, ...)``, handed row by row to ``cotangents``.
        cotangents: Maps one row's output ``(C,)`` and target to ``(C, K)``; traced under
            ``vmap``, so it must be a pure tensor function.

    Returns:
        ``(outputs, pulled)``: ``(*samples, batch, C)`` and ``(K, *samples, batch, d)`` (the
        cotangents lead, so a slice of them is contiguous).
    """

    def row(
        weights: dict[str, torch.Tensor], inputs: torch.Tensor, target: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out, pull = vjp(lambda w: f(w, inputs.unsqueeze(0)).squeeze(0), weights)
        pulled = vmap(pull, in_dims=1)(cotangents(out, target))[0]
        return out, pulled

    per_row = vmap(row, in_dims=(None, 0, 0))
    for _ in range(theta.dim() - 1):
        per_row = vmap(per_row, in_dims=(0, None, None))
    outputs, pulled = per_row(layout.unflatten(theta), x, y)
    lead = outputs.shape[:-1]  # (*samples, batch)
    flat = [
        pulled[name].reshape(*lead, -1, shape.numel()).movedim(-2, 0)
        for name, shape in layout.sites.items()
    ]
    return outputs, torch.cat(flat, -1)


def outputs_and_jacobian(
    f: NetworkFunction, layout: WeightLayout, theta: torch.Tensor, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The network's outputs and their Jacobian in the weights.

    Args:
        f: The network function (:func:`network_function`).
        layout: The weights' layout.
        theta: Weights ``(*samples, d)``.
        x: Inputs ``(batch, *features)``.

    Returns:
        ``(outputs, jacobian)``: ``(*samples, batch, C)`` and ``(*samples, batch, C, d)``,
        :math:`J_{ncj} = \partial f_c(x_n; \theta) / \partial \theta_j`.
    """
    rows = torch.zeros(x.shape[0], dtype=theta.dtype, device=theta.device)

    def identity(out: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
        return torch.eye(out.shape[-1], dtype=out.dtype, device=out.device)

    outputs, pulled = pull_back_rows(f, layout, theta, x, rows, identity)
    return outputs, pulled.movedim(0, -2)
