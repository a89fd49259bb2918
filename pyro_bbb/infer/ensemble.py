r"""Ensembles of guides as a batch dimension: ``K`` independently initialised members, one step.

An :class:`Ensemble` holds ``K`` members of one guide family (mean-field, low-rank, or point
masses for a deep ensemble) in a single guide whose parameters carry a leading member
dimension. Its sites sit in a ``pyro.plate("ensemble", K)`` left of the model's plates, and
the model runs inside the same plate, so each member's weights meet the data in their own
slice of one batched forward pass (the Bayesian layers take weights with leading dims):

.. math::

    \sum_{k=1}^K \Big(\mathbb{E}_{q_k}\big[\log p(y \mid w)\big]
        - \beta\,\mathrm{KL}(q_k \,\|\, p)\Big),

the sum of the members' own objectives, so a member's gradient is exactly the gradient of
its own fit. The predictive is the uniform mixture :math:`\frac1K\sum_k q_k`. This is the
construction of deep ensembles (Lakshminarayanan, Pritzel and Blundell 2017,
https://arxiv.org/abs/1612.01474) with Bayesian members, as in multi-modal variational
posteriors (e.g. Wilson and Izmailov 2020, https://arxiv.org/abs/2002.08791, on the
"MultiSWAG" mixture).

The ELBO, the predictive and the evaluation run the model inside the members' plate
(:func:`~pyro_bbb.infer.sites.model_in_plates`), as Pyro's ELBOs run model and guide inside
their particle plate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from pyro.nn import PyroModule
from pyro.poutine import Trace

from .._pyro_compat import pyro_name
from .._validation import check_int
from .guides import MeanFieldGuide
from .guides._base import SiteGuide
from .sites import is_point_mass

__all__ = ["Ensemble"]

GuideFactory = Callable[[Callable[..., Any]], SiteGuide]


class Ensemble(PyroModule):
    r"""``K`` independently initialised guides of one model, trained in one vectorised step.

    ``Ensemble(model, MeanFieldGuide, k=5)`` is five mean-field posteriors; ``Ensemble(model,
    lambda m: LowRankGuide(m, rank=4), k=5)`` five low-rank ones; ``Ensemble(model,
    DeltaGuide, k=5)`` a deep ensemble of five MAP networks. Pass it as the guide to
    :func:`~pyro_bbb.fit`, :func:`~pyro_bbb.predict`, :func:`~pyro_bbb.compare`,
    :func:`~pyro_bbb.to_inference_data` (members as chains) and :func:`~pyro_bbb.psis_khat`.

    The members are one guide of the family whose parameters have the member shape
    ``(K, 1, ..., 1)`` in front (:attr:`members`; e.g. ``members.locs["0.weight"]`` is
    ``(K, 1, out, in)``), named in Pyro's param store after the guide the factory returns:
    ``"MeanFieldGuide.members.locs.0.weight"``, or ``"<name>.members..."`` for a guide given a
    ``name``. Member 0 starts where a single guide would; the others from fresh
    draws of each affine layer's default initialisation. Every site is drawn inside
    :meth:`members_plate`, and the model must run inside it too; this package's ELBO, predictive and
    evaluation do that themselves. With plain Pyro, wrap the model::

        svi = pyro.infer.SVI(ensemble.members_plate()(model), ensemble, optim, Trace_ELBO())

    The objective is the sum of the ``K`` members' ELBOs (the loss ``fit`` reports is that
    sum), so the members do not interact: each one's gradient is that of its own ELBO.

    Args:
        model: The Pyro model, e.g. a :class:`~pyro_bbb.BNN`; it must declare
            ``max_plate_nesting`` (a ``BNN`` does) unless ``max_plate_nesting`` is given.
        guide: The members' family: a guide class or a function ``model -> guide`` returning
            an unused :class:`~pyro_bbb.MeanFieldGuide`, :class:`~pyro_bbb.LowRankGuide` or
            :class:`~pyro_bbb.DeltaGuide`.
        k: ``K``, the number of members.
        max_plate_nesting: The model's plate depth; the member plate goes left of it.

    Raises:
        TypeError: If ``guide`` is a guide already made rather than a class or function, or
            ``guide(model)`` is not a (fresh) guide of this package.
        ValueError: On ``k < 1`` or a model without a declared plate depth.
    """

    #: Name of the plate over members.
    plate_name = "ensemble"

    def __init__(
        self,
        model: Callable[..., Any],
        guide: GuideFactory = MeanFieldGuide,
        *,
        k: int = 5,
        max_plate_nesting: int | None = None,
    ) -> None:
        if isinstance(model, (list, tuple, SiteGuide)) or not callable(model):
            raise TypeError(
                "Ensemble's first argument is the model, and the members are made from it: "
                "Ensemble(model, guide, k=K), guide a guide class or a function model -> "
                f"guide (e.g. lambda m: LowRankGuide(m, rank=4)); got {_called(model)}"
            )
        if isinstance(guide, SiteGuide):
            raise TypeError(
                "Ensemble's guide is the members' family, from which it makes the K members: "
                f"a guide class or a function model -> guide, e.g. Ensemble(model, "
                f"{type(guide).__name__}, k={k}) or Ensemble(model, lambda m: "
                f"{type(guide).__name__}(m, ...), k={k}) for arguments of your own; got a "
                f"{type(guide).__name__} already made"
            )
        self.num_members = check_int("k", k)
        nesting = getattr(model, "max_plate_nesting", None)
        nesting = nesting if max_plate_nesting is None else max_plate_nesting
        if nesting is None:
            raise ValueError(
                "Ensemble needs the model's plate depth, to put the members' plate left of "
                f"its plates: {type(model).__name__} declares no max_plate_nesting (a model "
                "function does not); pass max_plate_nesting= (1 for a model whose only plate "
                "is its data's)"
            )
        self.model_plate_nesting = check_int("max_plate_nesting", nesting, minimum=0)
        members = guide(model)
        if not isinstance(members, SiteGuide):
            raise TypeError(
                "guide(model) must return a MeanFieldGuide, LowRankGuide or DeltaGuide, got "
                f"{type(members).__name__}"
            )
        if members.prototype_trace is not None:
            raise TypeError("guide(model) must return a guide that has not been called yet")
        # named after the members' guide, so that ensembles of guides of different names
        # keep their parameters apart in Pyro's param store: "<name>.members.locs.<site>"
        super().__init__(name=pyro_name(members))
        members.member_shape = (self.num_members,) + (1,) * self.model_plate_nesting
        self.members = members

    @property
    def model(self) -> Callable[..., Any]:
        """The model the members approximate (outside the member plate)."""
        return self.members.model

    @property
    def prototype_trace(self) -> Trace | None:
        """The members' prototype trace, ``None`` before the first call."""
        return self.members.prototype_trace

    def legacy_parameters(self) -> dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]]:
        """The members' parameters that files of earlier versions hold otherwise.

        See :meth:`LowRankGuide.legacy_parameters <pyro_bbb.LowRankGuide.legacy_parameters>`.
        """
        legacy = getattr(self.members, "legacy_parameters", None)
        return {} if legacy is None else legacy()

    def members_plate(self) -> pyro.plate:
        """The plate over members, at dim ``-(max_plate_nesting + 1)``."""
        return pyro.plate(self.plate_name, self.num_members, dim=-(self.model_plate_nesting + 1))

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Draw every site of every member; takes the model's arguments.

        Returns:
            ``{site name: sample}``, each ``(*sample, K, 1, ..., *site shape)``.
        """
        if self.members.prototype_trace is None:
            self.members._setup_prototype(*args, **kwargs)  # outside the plate: site shapes
        with self.members_plate():
            return self.members(*args, **kwargs)

    @torch.no_grad()
    def marginals(self, *args: Any, **kwargs: Any) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Mean and standard deviation of every member's marginals, ``(K, *site shape)`` each.

        Takes the model's arguments only if the ensemble has not been called yet.
        """
        return {
            site: (loc.reshape(self.num_members, *shape), scale.reshape(self.num_members, *shape))
            for site, (loc, scale) in self.members.marginals(*args, **kwargs).items()
            for shape in [loc.shape[len(self.members.member_shape) :]]
        }

    @torch.no_grad()
    def mixture_log_prob(self, trace: Trace) -> torch.Tensor:
        r"""Log-density of the mixture :math:`\frac1K\sum_j q_j` at the draws of a trace.

        Args:
            trace: A trace of this guide (under a plate of ``S`` draws or none), e.g. from
                ``poutine.trace(plate(ensemble)).get_trace(x)``.

        Returns:
            :math:`\log \frac1K \sum_j q_j(w_{s,k})` for the draw of each member,
            ``(*sample, K)``.

        Raises:
            ValueError: For point-mass members, which have no density.
        """
        own = poutine.trace(self.members).get_trace()  # the members' q_j, unexpanded
        total = None
        for name, site in own.iter_stochastic_nodes():
            if is_point_mass(site["fn"]):
                continue  # a slice of a block, or a point mass: no density of its own
            fn, value = site["fn"], trace.nodes[name]["value"]
            # (*S, K, 1.., *event) -> (*S, K, 1, 1.., *event): every member's density at every draw
            where = value.dim() - fn.event_dim - self.model_plate_nesting
            log_q = fn.log_prob(value.unsqueeze(where))
            log_q = log_q.reshape(*log_q.shape[: log_q.dim() - self.model_plate_nesting])
            total = log_q if total is None else total + log_q
        if total is None:
            raise ValueError(
                "the members are point masses (DeltaGuide): the mixture has no density"
            )
        return torch.logsumexp(total, -1) - math.log(self.num_members)


def _called(value: object) -> str:
    """What a wrong first argument is, in words: ``"a list of 2 LowRankGuide"``."""
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(item).__name__ for item in value})
        return f"a {type(value).__name__} of {len(value)} {', '.join(kinds) or 'items'}"
    return f"a {type(value).__name__}"
