"""How long :func:`~pyro_bbb.fit` runs: a fixed number of epochs, or until it is done.

``fit(epochs=E)`` runs ``E`` epochs (:class:`FixedEpochs`) with β's warm-up and the learning
rate's decay drawn over them, as ``fit`` always has; ``fit(epochs=None)`` runs the stages of
:class:`~pyro_bbb.training.auto_epochs.AutoEpochs` until more training stops paying (or,
``until="converged"``, until the convergence check passes). A fit that continues a fitted
guide (:mod:`~pyro_bbb.training.continuation`) keeps β at its final value and the rate
where that fit left it, either way.
:func:`run_length` gives ``fit`` the one it asked for with the schedules that go with it.
Nothing here trains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from .._validation import check_int
from ..infer.schedules import ScheduleLike, as_schedule, delayed_warmup
from .auto_epochs import AutoEpochs, budget_epochs
from .continuation import ContinuedRate, FitEnd
from .convergence import Convergence, check_convergence, convergence_warning
from .history import History
from .lr_schedules import InverseTimeDecay, LRScheduleLike
from .stopping import Converges, StopsPaying

__all__ = ["UNTIL", "FixedEpochs", "RunLength", "check_automatic", "run_length"]


class FixedEpochs:
    """A run of ``epochs`` epochs: ``fit(epochs=E)``.

    Args:
        epochs: The run's total length; a resumed fit continues up to it.
    """

    #: A fixed run has no stages.
    current = ""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs
        #: Set once the last epoch has been run.
        self.finished = False
        #: The run's length in epochs.
        self.total: int | None = epochs

    def run(self, start: int) -> Iterator[int]:
        """The epochs to run, from ``start`` (the epochs already done)."""
        for epoch in range(start, self.epochs):
            self.finished = epoch == self.epochs - 1
            yield epoch

    def stage(self, epoch: int) -> str:
        """``""``: a fixed run has no stages."""
        return ""

    def after_epoch(self, history: History, optimizer: torch.optim.Optimizer) -> None:
        """Nothing to decide."""

    def restore(self, history: History) -> None:
        """Nothing to restore: the schedules are functions of the epoch."""

    def holds_out(self, epoch: int) -> bool:
        """``False``: a fixed run trains on every row."""
        return False

    def averages(self, epoch: int) -> bool:
        """``False``: a fixed run scores nothing."""
        return False

    def restores_best(self, done: int) -> bool:
        """``False``: a fixed run keeps its last iterate."""
        return False

    def stopped(self, history: History) -> str:
        """Why the run ended: its epochs were done."""
        return f"ran the {self.epochs:,} epochs asked for"

    def warning(self, history: History) -> str | None:
        """What to warn of at the end: the convergence check's failure, if it failed."""
        return convergence_warning(history.convergence)

    def convergence(self, history: History) -> Convergence:
        """The convergence check of the finished run (:func:`check_convergence`)."""
        return check_convergence(history)


RunLength = FixedEpochs | AutoEpochs
"""How long a fit runs: a fixed number of epochs, or the stages of an automatic run."""


UNTIL = ("predictive", "converged")
"""What ``fit(until=...)`` takes: when an automatic run is done (:mod:`.stopping`)."""


def check_automatic(epochs: int | None, max_steps: int | None, until: str | None) -> str:
    """Check that ``max_steps`` and ``until`` suit the run's length; return the rule's name.

    Returns:
        ``until``, with ``None`` read as ``"predictive"``.

    Raises:
        ValueError: ``max_steps`` or ``until`` with a fixed number of epochs, ``max_steps``
            not a positive int, or ``until`` not one of :data:`UNTIL`.
    """
    if epochs is not None:
        for name, value in (("max_steps", max_steps), ("until", until)):
            if value is not None:
                raise ValueError(
                    f"{name}={value!r} applies to a run of epochs=None; with epochs={epochs} "
                    "the run's length is fixed"
                )
        return "predictive"
    check_int("max_steps", max_steps, optional=True)
    if until is None:
        return "predictive"
    if until not in UNTIL:
        raise ValueError(f"until must be one of {UNTIL}, got {until!r}")
    return until


def run_length(
    epochs: int | None,
    max_steps: int | None,
    steps_per_epoch: int,
    beta: ScheduleLike | None,
    lr_schedule: LRScheduleLike | None,
    *,
    until: str = "predictive",
    scored: bool = False,
    every: int = 1,
    gives_back: bool = False,
    steps_given_back: int | None = None,
    halves: bool = False,
    continues: FitEnd | None = None,
    rate_from: float = 1.0,
) -> tuple[RunLength, Callable[[float], float], LRScheduleLike]:
    """The run's length, β's schedule and the learning-rate schedule of a fit.

    A fixed run takes ``delayed_warmup(epochs)`` and ``InverseTimeDecay(epochs)`` for
    ``None``; an automatic one its stages' (a user's schedule is followed as given). A fit
    that continues another (``continues``) takes, for ``None``, β constant at that fit's
    final value and the rate from ``rate_from``: a fixed run
    :class:`~pyro_bbb.training.continuation.ContinuedRate`, an automatic one its full-rate
    stage and decay from there (:class:`AutoEpochs`).

    Args:
        epochs: A fixed run's length, or ``None`` for an automatic run.
        max_steps: An automatic run's budget in steps, or ``None`` for the default.
        steps_per_epoch: Optimiser steps in an epoch of the rows the steps train on.
        beta: ``fit``'s ``beta``.
        lr_schedule: ``fit``'s ``lr_schedule``.
        until: An automatic run's rule (:data:`UNTIL`).
        scored: Whether an automatic run scores held-out rows.
        every: Score after every ``every``-th epoch.
        gives_back: Whether rows are held out of the steps until the last stage.
        steps_given_back: Steps in an epoch of every row, held-out ones included.
        halves: Whether an automatic run's full-rate stage halves its rate where it stops
            paying (``fit``'s ``lr`` left to it).
        continues: The end of the fit this one continues
            (:class:`~pyro_bbb.training.continuation.FitEnd`), or ``None``.
        rate_from: The rate's factor a continued fit starts from
            (:func:`~pyro_bbb.training.continuation.rate_factor`).

    Returns:
        ``(length, beta schedule, lr schedule)``.
    """
    if continues is not None and beta is None:
        beta = continues["beta"]  # constant at the value the fit it continues ended on
    if epochs is not None:
        schedule = delayed_warmup(epochs) if beta is None else as_schedule(beta)
        rates = InverseTimeDecay(epochs) if continues is None else ContinuedRate(epochs, rate_from)
        return FixedEpochs(epochs), schedule, rates if lr_schedule is None else lr_schedule
    length = AutoEpochs(
        steps_per_epoch,
        budget_epochs(max_steps, steps_per_epoch),
        beta=None if beta is None else as_schedule(beta),
        decay=lr_schedule is None,
        rule=Converges() if until == "converged" else StopsPaying(),
        scored=scored,
        every=every,
        gives_back=gives_back,
        steps_given_back=steps_given_back,
        halves=halves and lr_schedule is None,
        rate_from=None if continues is None else rate_from,
    )
    return length, length.beta, length.rate if lr_schedule is None else lr_schedule
