r"""A network's posterior in one table: a row per site or layer, from the guide's parameters.

:func:`posterior_summary` reads a Gaussian guide's marginals in closed form (no draws), so it
takes a second or less at half a million weights, where ``az.summary`` of draws of them
takes hours. A row per site (or layer, or the whole network) gives its number of weights,
the marginal posterior standard deviations :math:`\sigma_i` (their mean and quantiles), the
signal-to-noise ratios :math:`|\mu_i| / \sigma_i` (quantiles; the quantity weight pruning
ranks by, Blundell et al. 2015, https://arxiv.org/abs/1505.05424), the KL divergence to the
prior, and the share of weights whose posterior is their prior: the collapse check's
definition, :math:`\mathrm{KL}(q(w_i) \| p(w_i))` below
:data:`~pyro_bbb.infer.collapse.KL_THRESHOLD` nats (:func:`~pyro_bbb.infer.weight_kl`, which
this module reads rather than computes again).

It is the posterior's counterpart of :func:`~pyro_bbb.nn.summary` (``model.summary()``),
which lists what each parameter *is* (its shape, prior, estimator); this one says what the
guide *learned*. :func:`~pyro_bbb.plots.plot_posterior_summary` draws the table. pandas (a
dependency of ArviZ) is imported on the first call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._validation import check_choice
from ..infer import Ensemble, LowRankGuide, MeanFieldGuide, weight_kl
from ..infer.collapse import KL_THRESHOLD
from ..online import LowRankPrecisionGuide

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GROUPINGS", "posterior_summary"]

#: What a row of :func:`posterior_summary` holds: a site, a layer (its sites together), or
#: every weight of the network.
GROUPINGS = ("site", "layer", "network")


def _quantile_label(level: float) -> str:
    return f"{100 * level:g}%"


def _gaussian_family(guide: object) -> object:
    """The guide whose marginals are read: the members of an ensemble, else the guide."""
    family = guide.members if isinstance(guide, Ensemble) else guide
    if not isinstance(family, (MeanFieldGuide, LowRankGuide, LowRankPrecisionGuide)):
        raise TypeError(
            "posterior_summary reads a Gaussian guide's marginals in closed form: a "
            "MeanFieldGuide, a LowRankGuide, an Ensemble of either, or an online filter's "
            f"LowRankPrecisionGuide; got {type(family).__name__}. A point estimate "
            "(DeltaGuide) has no spread to summarise; for any other guide (Pyro's "
            "autoguides, a flow) export draws of a few sites and summarise those: "
            "to_inference_data(model, guide, x, y, var_names=[...], log_likelihood=False, "
            "posterior_predictive=False), then az.summary"
        )
    return family


@torch.no_grad()
def posterior_summary(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    *,
    by: str = "site",
    quantiles: Sequence[float] = (0.05, 0.5, 0.95),
) -> pd.DataFrame:
    r"""One row per site (or layer, or the whole network) of a Gaussian guide's posterior.

    Columns:

    * ``layer`` (rows by site): the module path the site belongs to;
    * ``weights``: the number of weights;
    * ``sigma_mean`` and ``sigma_<q>%``: the mean and quantiles of the marginal posterior
      standard deviations :math:`\sigma_i` (weight units);
    * ``snr_<q>%``: quantiles of the signal-to-noise ratio :math:`|\mu_i| / \sigma_i`; a
      weight with a ratio well below 1 is indistinguishable from 0 under its posterior;
    * ``kl``: :math:`\sum_i \mathrm{KL}(q(w_i) \| p(w_i))` over the row's weights (nats), in
      closed form against a Gaussian prior, by 16 draws a weight against another (a scale
      mixture); for a mean-field guide the row's KL itself, for a low-rank one (and an
      online filter's belief) the sum of its marginals' KLs, below the block's KL by the
      draws' total correlation;
    * ``at_prior``: the share of weights whose marginal KL to the prior is below
      :data:`~pyro_bbb.infer.collapse.KL_THRESHOLD` nats, the collapse check's definition
      of a weight at its prior (:class:`~pyro_bbb.PosteriorCollapseWarning`).

    Read from the guide's parameters (:meth:`~pyro_bbb.MeanFieldGuide.marginals`), never
    from draws: about a second for the 478,410 weights of a 784-400-400-10 network.

    Args:
        model: The model, e.g. a :class:`~pyro_bbb.BNN`; it runs once on ``x`` for its
            priors (the random state and its buffers are restored).
        guide: A :class:`~pyro_bbb.MeanFieldGuide` or :class:`~pyro_bbb.LowRankGuide` (its
            marginals), an :class:`~pyro_bbb.infer.Ensemble` of either (a row per member
            and site, indexed ``(member, site)``), or an online filter's belief
            (:class:`~pyro_bbb.LowRankPrecisionGuide`, ``updater.guide``), set up (called
            or fitted once).
        x: A few rows of inputs the model takes, ``(rows, *features)``.
        y: Their targets, for a model that needs them.
        by: ``"site"``, ``"layer"`` (a layer's weight and bias together) or ``"network"``.
        quantiles: Levels in ``(0, 1)`` of the ``sigma_`` and ``snr_`` columns.

    Returns:
        A ``pandas.DataFrame`` indexed by site, layer or ``"network"`` (and member).

    Raises:
        TypeError: For a guide whose marginals are not Gaussian in closed form (a point
            estimate, Pyro's autoguides, a flow): the message
            names the way to summarise its draws instead.
        ValueError: On an unknown ``by`` or a level outside ``(0, 1)``.
    """
    import pandas as pd

    check_choice("by", by, GROUPINGS)
    levels = [float(q) for q in quantiles]
    if any(not 0 < q < 1 for q in levels):
        raise ValueError(f"quantiles must lie in (0, 1), got {levels}")
    family = _gaussian_family(guide)
    marginals = guide.marginals(x) if y is None else guide.marginals(x, y)
    kls = weight_kl(model, family, x, y)
    members = guide.num_members if isinstance(guide, Ensemble) else 1
    groups: dict[str, list[str]] = {}
    for site in marginals:
        key = {"site": site, "layer": site.rpartition(".")[0] or site, "network": "network"}[by]
        groups.setdefault(key, []).append(site)
    locs = {site: loc for site, (loc, _) in marginals.items()}
    scales = {site: scale for site, (_, scale) in marginals.items()}
    rows, index = [], []
    for member in range(members):
        for key, sites in groups.items():
            loc, scale, kl = (
                np.concatenate([_member(t[site], member, members) for site in sites])
                for t in (locs, scales, kls)
            )
            row: dict[str, Any] = {"layer": key.rpartition(".")[0]} if by == "site" else {}
            row["weights"] = scale.size
            row["sigma_mean"] = float(scale.mean(dtype=np.float64))
            for level, value in zip(levels, np.quantile(scale, levels), strict=True):
                row[f"sigma_{_quantile_label(level)}"] = float(value)
            snr = np.abs(loc) / scale
            for level, value in zip(levels, np.quantile(snr, levels), strict=True):
                row[f"snr_{_quantile_label(level)}"] = float(value)
            row["kl"] = float(kl.sum(dtype=np.float64))
            row["at_prior"] = float((kl < KL_THRESHOLD).mean())
            rows.append(row)
            index.append((member, key) if members > 1 else key)
    if members > 1:
        return pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index, names=["member", by]))
    return pd.DataFrame(rows, index=pd.Index(index, name=by))


def _member(t: torch.Tensor, member: int, members: int) -> np.ndarray:
    """One member's values of a site, flat (an ensemble's carry the members in front)."""
    if members > 1:
        t = t.reshape(members, -1)[member]
    return t.detach().cpu().reshape(-1).numpy()
