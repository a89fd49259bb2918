r"""A fitted guide given to :func:`~pyro_bbb.fit` again: the fit goes on from where it ended.

Every fit leaves on its guide how it ended, ``guide.fit_end`` (a :class:`FitEnd`: the β and
the rate of its last step, the rate they were factors of, its length and why it stopped),
beside ``guide.fit_until`` (:mod:`~pyro_bbb.training.end_of_run`); :func:`~pyro_bbb.save`
keeps both, so a loaded guide carries them too. A fit whose guide holds one **continues**
that fit rather than starting over:

* β stays at the value the fit it continues ended on (1 after ``fit``'s default schedule,
  and after any schedule the value of its last step), constant, with no likelihood-only
  stage and no warm-up;
* the rate starts where that fit left it (the halvings and the decay included): an
  automatic run (``epochs=None``) trains at that rate while further steps pay (the
  full-rate stage, judged by the run's rule, halving where it may), then decays it to the
  decay's floor (1 % of the rate the first fit started from), unless it already is there,
  when the run ends with its full-rate stage; a fit of ``epochs=E`` holds that rate for the
  first 70 % of the epochs and decays it to the same floor over the rest (held throughout
  where it is already there).

``beta=``, ``lr=`` and ``lr_schedule=`` given by the user are followed as given (``lr=`` is
then the rate from the first step, its factor 1). The optimiser's state is not carried
(it would double what :func:`~pyro_bbb.save` writes): the continued fit starts a fresh
Adam, whose first steps move each weight by about the rate, at the rate the last fit left
(after a default run a hundredth of the rate it started from). ``History.continues`` holds the
:class:`FitEnd` a fit continued, ``None`` for a fit from the start. To start over instead,
fit a new guide (after ``pyro.clear_param_store()`` for fresh values; without it the new
guide takes the fitted values, with a warning, and only the schedule starts over), or set
``guide.fit_end = None``: the fitted guide, its schedule from the start.

While a fit runs, ``guide.fit_end`` is the end of the fit it continues (``None`` for a fit
from the start), so a checkpoint written meanwhile carries it, and ``fit(resume=...)``
rebuilds the continued run from the checkpoint's, not from the guide's; the fit replaces it
with its own end when it ends. Nothing here trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch

from .lr_schedules import InverseTimeDecay, LRSchedule
from .stopping import DECAY_FLOOR

__all__ = [
    "DECAYED",
    "ContinuedRate",
    "FitEnd",
    "continued_from",
    "fit_end",
    "rate_factor",
    "resume_rates",
]

#: A continued fit counts a rate within this factor of the decay's floor as decayed: it
#: neither halves nor decays it further.
DECAYED = 2 * DECAY_FLOOR


class FitEnd(TypedDict):
    """How a fit ended: what ``fit`` leaves on its guide as ``guide.fit_end``.

    Plain numbers and strings, so that :func:`~pyro_bbb.save` stores it as it is.
    """

    #: ``History.until``: ``"predictive"``, ``"converged"``, or ``None`` for a fixed run.
    until: str | None
    #: Epochs the fit ran (this call's, not counting a fit it continued).
    epochs: int
    #: Optimiser steps it took.
    steps: int
    #: The stage of its last epoch (``""`` in a fixed run).
    stage: str
    #: β's final value: 1 under ``fit``'s default schedule, else the value of the last step.
    beta: float
    #: The learning rate of the last step (the optimiser's first parameter group).
    lr: float
    #: The rate the schedule was a factor of (the group's initial rate): ``lr / base_lr``
    #: is where the schedule left the rate.
    base_lr: float
    #: ``History.stopped``: why it ended.
    stopped: str


def fit_end(history: Any, beta: float, default_beta: bool, rates: LRSchedule) -> FitEnd:
    """The :class:`FitEnd` of a finished fit.

    Args:
        history: Its :class:`~pyro_bbb.History`.
        beta: β at its last step.
        default_beta: Whether β followed ``fit``'s default schedule from the start
            (``beta=None``, no fit continued), which ends at 1: a run stopped during its
            warm-up continues at 1.
        rates: Its learning-rate schedule: the rate of the last step, and the rate it was a
            factor of (the first parameter group's initial rate).
    """
    return FitEnd(
        until=history.until,
        epochs=len(history),
        steps=history.steps[-1] if history.steps else 0,
        stage=history.stage[-1] if history.stage else "",
        beta=1.0 if default_beta else float(beta),
        lr=float(rates.lr),
        base_lr=float(rates.optimizer.param_groups[0]["initial_lr"]),
        stopped=history.stopped,
    )


def continued_from(guide: object, resumed: Mapping[str, Any] | None) -> FitEnd | None:
    """The end of the fit a fit of ``guide`` continues, or ``None`` to fit from the start.

    A resumed fit continues what its checkpoint's fit continued (the checkpoint's record,
    written from the guide while that fit ran); otherwise the guide's own ``fit_end``. The
    guide is left holding it while the fit runs, so that a checkpoint written meanwhile
    carries it (see the module).

    Args:
        guide: The guide given to ``fit``.
        resumed: The checkpoint ``fit(resume=...)`` read, or ``None``.

    Raises:
        ValueError: If the record found is not a :class:`FitEnd` (a ``guide.fit_end`` set
            by hand to something else).
    """
    if resumed is not None:
        record = (resumed.get("fit") or {}).get("end")
    else:
        record = getattr(guide, "fit_end", None)
    if record is not None:
        missing = [key for key in FitEnd.__annotations__ if key not in record]
        if not isinstance(record, Mapping) or missing:
            raise ValueError(
                "guide.fit_end must be the record fit leaves on a guide (keys "
                f"{list(FitEnd.__annotations__)}) or None, got {record!r}; set it to None "
                "to fit this guide from the start"
            )
        record = FitEnd(**{key: record[key] for key in FitEnd.__annotations__})
    with suppress(AttributeError, TypeError):
        guide.fit_end = record
    return record


def resume_rates(
    optimizer: torch.optim.Optimizer, origin: FitEnd | None, chosen: bool
) -> torch.optim.Optimizer:
    """Put a continued fit's base rates where the fit it continues had them.

    ``fit``'s own rates are read from the weights' sizes, which training has moved: every
    group is scaled by one factor so that the first group's (the largest tensor's) base rate
    is the continued fit's ``base_lr``, the rate its schedule was a factor of. Nothing is
    done for a fit from the start, or where the user chose the rate (``chosen`` is
    ``False``: ``lr=`` given, or an optimiser of their own), which is followed as given.

    Returns:
        ``optimizer``, its groups' rates set in place.
    """
    if origin is not None and chosen and origin["base_lr"] > 0:
        scale = origin["base_lr"] / optimizer.param_groups[0]["lr"]
        for group in optimizer.param_groups:
            group["lr"] *= scale
    return optimizer


def rate_factor(origin: FitEnd | None, chosen: bool) -> float:
    """The rate's factor a continued fit starts from: where the fit it continues left it.

    1 for a fit from the start, and where the user chose the rate (``chosen`` is
    ``False``: ``lr=`` given, or an optimiser of their own), which is followed as given.
    """
    if origin is None or not chosen or origin["base_lr"] <= 0:
        return 1.0
    return origin["lr"] / origin["base_lr"]


@dataclass(frozen=True)
class ContinuedRate:
    r"""The rate's factor over a continued fit of ``epochs`` epochs (``fit(epochs=E)``).

    ``factor`` (where the fit it continues left the rate) for the first ``start`` of the
    epochs, then :class:`~pyro_bbb.training.lr_schedules.InverseTimeDecay` from it to
    :data:`~pyro_bbb.training.stopping.DECAY_FLOOR` of the base rate; ``factor`` throughout
    where it is within :data:`DECAYED` of that floor already.

    Args:
        epochs: The fit's length.
        factor: The starting factor of the base rate.
        start: The share of the epochs before the decay begins.
    """

    epochs: float
    factor: float
    start: float = 0.7
    decay: InverseTimeDecay | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # the decay, built once: the rate is read every step
        decay = None
        if self.factor > DECAYED:
            floor = DECAY_FLOOR / self.factor
            decay = InverseTimeDecay(self.epochs, start=self.start, floor=floor)
        object.__setattr__(self, "decay", decay)

    def __call__(self, epoch: float) -> float:
        """The factor of the base rate at epoch ``epoch`` (fractional)."""
        return self.factor if self.decay is None else self.factor * self.decay(epoch)
