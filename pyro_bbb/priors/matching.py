"""A prior per site: a specification matched against site names.

A layer's priors come from one specification: a single prior for every site, or a mapping
from ``fnmatch`` patterns (``"fc1.weight"``, ``"*.bias"``, ``"0.*"``) to priors, the first
match in the mapping's order winning. :func:`resolve_prior` picks one site's prior and says,
when none matches, which site and which patterns. A :func:`~pyro_bbb.priors.from_guide`
posterior is such a mapping, one entry per site.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping

from .families import Prior
from .posterior import PosteriorPrior

__all__ = ["PriorSpec", "resolve_prior"]

PriorSpec = Prior | Mapping[str, Prior]
"""A single prior for every site, or a mapping from ``fnmatch`` patterns to priors."""


def resolve_prior(spec: PriorSpec, site: str) -> Prior:
    """Pick the prior of one site from a specification.

    Args:
        spec: One prior for every site, or a mapping from ``fnmatch`` patterns (matched
            against the full site name, e.g. ``"fc1.weight"``, ``"*.bias"``, ``"0.*"``) to
            priors; the first matching pattern in the mapping's order wins.
        site: The full site name.

    Returns:
        The prior for ``site``.

    Raises:
        ValueError: If no pattern matches ``site``, or a value is not a prior.
    """
    if isinstance(spec, Mapping):
        for pattern, prior in spec.items():
            if fnmatch.fnmatchcase(site, pattern):
                return _check_prior(prior, f"prior[{pattern!r}]")
        if isinstance(spec, PosteriorPrior):
            raise ValueError(
                f"prior: the posterior from_guide({spec.source}) has no site {site!r}; its "
                f"sites are {list(spec)}. A new site needs its own prior, e.g. "
                "{**from_guide(guide), '*': Gaussian(1.0)}"
            )
        raise ValueError(
            f"prior: no pattern matches site {site!r}; patterns are {list(spec)}. "
            "Add a catch-all '*' entry last."
        )
    return _check_prior(spec, "prior")


def _check_prior(prior: object, where: str) -> Prior:
    # A class such as Gaussian passes the protocol check (it has the method) but is no prior.
    if isinstance(prior, type) or not isinstance(prior, Prior):
        raise ValueError(
            f"{where} must be a prior such as Gaussian(1.0) or ScaleMixture(0.5, 1.0, 0.0025) "
            f"(an object with a site_distribution method), got {prior!r}"
        )
    return prior
