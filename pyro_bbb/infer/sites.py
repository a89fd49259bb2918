"""What inference reads off a model's and a guide's sample sites, in one place.

Guides annotate their sites through Pyro's ``infer`` dict; the ELBO and the estimators read
those annotations. The keys live here, not in either side's module, so that a guide, the
ELBO and the estimators can each import them without importing one another. It also hands on
:func:`base_support` and :func:`is_real_valued`, the real-support check that guides and NUTS
share (defined on the model side, which needs it too), and :func:`model_in_plates`, by which
the ELBO, the predictive, the evaluation and saving run a model inside a guide's own plate (an
ensemble's members; defined below every side, which all need it), and :func:`prior_trace`,
the one trace of a model from its priors by which the export, the collapse check, ``fit``'s
likelihood-scale check, continual learning and the online filters read its sites.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample

from .._plates import model_in_plates
from .._random_state import kept_random_state
from .._support import base_support, independent_base, is_real_valued
from ..nn.draws import kept_buffers

__all__ = [
    "BLOCK_KEY",
    "JOINT_KEY",
    "base_support",
    "is_point_mass",
    "is_real_valued",
    "model_in_plates",
    "prior_latent_sites",
    "prior_trace",
]

#: ``infer`` key by which an auxiliary guide site declares that its value is the
#: concatenation of the (flattened) values of these model sites, in order, and that the
#: guide's own sites of those names are ``Delta`` slices of it. The ELBO then computes the KL
#: of the whole group in closed form against the product of the sites' priors where possible.
JOINT_KEY = "pyro_bbb_joint_of"

#: ``infer`` key of a model site drawn as a slice of a block: ``(block site, start, stop)``.
#: Local reparameterisation and flipout read it to find the block's distribution.
BLOCK_KEY = "pyro_bbb_block"


def is_point_mass(fn: object) -> bool:
    """Whether a site's distribution is a (reinterpreted) ``Delta``.

    That is a point estimate, or a guide's slice of a block drawn at another site: it draws
    nothing and has no density of its own.
    """
    return isinstance(independent_base(fn), dist.Delta)


def prior_trace(model: Callable[..., Any], *data: torch.Tensor) -> poutine.Trace:
    """One trace of ``model`` on ``data``, its latent sites drawn from their priors.

    Nothing is left behind: the random states (torch's, CUDA's on the devices of ``data``,
    Python's and NumPy's), the model's buffers (BatchNorm's running statistics) and Pyro's
    param store are as they were, and no gradient is recorded.

    Args:
        model: The model, e.g. a :class:`~pyro_bbb.BNN`.
        data: Its arguments (``x``, or ``x, y``): a few rows are enough (BatchNorm in
            training mode needs more than one).
    """
    buffers = kept_buffers(model) if isinstance(model, torch.nn.Module) else nullcontext()
    with kept_random_state(*data), torch.no_grad(), poutine.block(), buffers:
        return poutine.trace(model).get_trace(*data)


def prior_latent_sites(model: Callable[..., Any], *data: torch.Tensor) -> dict[str, dict]:
    """The model's global latent sites, from one :func:`prior_trace`: ``{name: site}``.

    In the model's order, the sites outside every plate that are neither observed nor a
    plate's subsample: the weights (and a sampled noise scale), what a guide approximates.

    Args:
        model: The model, e.g. a :class:`~pyro_bbb.BNN`.
        data: Its arguments (``x``, or ``x, y``), a few rows.
    """
    observed = getattr(model, "observation_site", "obs")
    return {
        name: site
        for name, site in prior_trace(model, *data).iter_stochastic_nodes()
        if name != observed
        and not site["is_observed"]
        and not site["cond_indep_stack"]
        and not site_is_subsample(site)
    }
