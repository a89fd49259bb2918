"""What inference reads off a model's and a guide's sample sites, in one place.

Guides annotate their sites through Pyro's ``infer`` dict; the ELBO and the estimators read
those annotations. The keys live here, not in either side's module, so that a guide, the
ELBO and the estimators can each import them without importing one another. This module also
holds :func:`base_support`, the real-support check that guides and NUTS share.
"""

from __future__ import annotations

import torch
from torch.distributions import constraints

__all__ = ["BLOCK_KEY", "JOINT_KEY", "base_support", "is_real_valued"]

#: ``infer`` key by which an auxiliary guide site declares that its value is the
#: concatenation of the (flattened) values of these model sites, in order, and that the
#: guide's own sites of those names are ``Delta`` slices of it. The ELBO then computes the KL
#: of the whole group in closed form against the product of the sites' priors where possible.
JOINT_KEY = "pyro_bbb_joint_of"

#: ``infer`` key of a model site drawn as a slice of a block: ``(block site, start, stop)``.
#: Local reparameterisation and flipout read it to find the block's distribution.
BLOCK_KEY = "pyro_bbb_block"


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
