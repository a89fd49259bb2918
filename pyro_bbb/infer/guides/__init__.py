"""Guides: variational families over a Bayesian network's weights.

Each guide is a :class:`pyro.infer.autoguide.AutoGuide` that samples the model's own site
names, so ``Predictive``, ``median()`` and ``quantiles()`` work, and any Pyro autoguide can
be used in its place. :class:`DeltaGuide` is the point estimate (the deterministic network)
on the same footing.
"""

from .delta import DeltaGuide
from .low_rank import LowRankGuide
from .mean_field import MeanFieldGuide
from .moped import MOPED

__all__ = ["MOPED", "DeltaGuide", "LowRankGuide", "MeanFieldGuide"]
