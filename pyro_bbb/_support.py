"""Where a distribution's values live: its support, and itself, without ``independent`` wrappers.

Guides, NUTS and :func:`~pyro_bbb.priors.from_guide` all need to know whether a site is
real-valued (a Gaussian can approximate it as it stands); the check lives here, on the model
side, so that each of them can import it.
"""

from __future__ import annotations

import torch
from torch.distributions import constraints

__all__ = ["base_support", "independent_base", "is_real_valued"]


def independent_base(fn: torch.distributions.Distribution) -> torch.distributions.Distribution:
    """The distribution under ``fn``'s ``Independent`` wrappers; ``fn`` itself without any.

    ``Normal`` for a ``Normal(...).to_event(k)``.
    """
    while isinstance(fn, torch.distributions.Independent):
        fn = fn.base_dist
    return fn


def base_support(fn: torch.distributions.Distribution) -> constraints.Constraint:
    """A distribution's support without its ``independent`` wrappers.

    ``real`` for a ``Normal(...).to_event(k)``.
    """
    support = fn.support
    while hasattr(support, "base_constraint"):
        support = support.base_constraint
    return support


def is_real_valued(fn: torch.distributions.Distribution) -> bool:
    """Whether a distribution's support is the whole real line in every coordinate."""
    return base_support(fn) is constraints.real
