"""How long :func:`~pyro_bbb.fit` runs: a fixed number of epochs, or until it has converged.

``fit(epochs=E)`` runs ``E`` epochs (:class:`FixedEpochs`) with β's warm-up and the learning
rate's decay drawn over them, as ``fit`` always has; ``fit(epochs=None)`` runs the stages of
:class:`~pyro_bbb.training.auto_epochs.AutoEpochs` until the convergence check passes.
:func:`run_length` gives ``fit`` the one it asked for with the schedules that go with it.
Nothing here trains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from .._validation import check_int
from ..infer.schedules import ScheduleLike, as_schedule, delayed_warmup
from .auto_epochs import MAX_STEPS, AutoEpochs
from .convergence import Convergence, check_convergence
from .history import History
from .lr_schedules import InverseTimeDecay, LRScheduleLike

__all__ = ["FixedEpochs", "RunLength", "check_automatic", "run_length"]


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

    def convergence(self, history: History) -> Convergence:
        """The convergence check of the finished run (:func:`check_convergence`)."""
        return check_convergence(history)


RunLength = FixedEpochs | AutoEpochs
"""How long a fit runs: a fixed number of epochs, or until it converges."""


def check_automatic(
    epochs: int | None,
    max_steps: int | None,
    beta: ScheduleLike | None,
    lr_schedule: LRScheduleLike | None,
) -> None:
    """Check that ``max_steps``, ``beta`` and ``lr_schedule`` suit the run's length.

    Raises:
        ValueError: ``max_steps`` with a fixed number of epochs, or not a positive int; an
            automatic run (``epochs=None``) with a ``beta`` or ``lr_schedule`` that is a
            schedule rather than ``None`` or a number (it places the warm-up and the decay
            itself).
    """
    if epochs is not None:
        if max_steps is not None:
            raise ValueError(
                f"max_steps={max_steps!r} caps a run of epochs=None; with epochs={epochs} "
                "the run's length is fixed"
            )
        return
    check_int("max_steps", max_steps, optional=True)
    for name, value in (("beta", beta), ("lr_schedule", lr_schedule)):
        if value is not None and not _is_number(value):
            raise ValueError(
                f"epochs=None places beta's warm-up and the rate's decay where the run is, "
                f"so {name} must be None or a number; got {value!r}. Pass epochs= to train "
                f"on your own {name} schedule"
            )


def run_length(
    epochs: int | None,
    max_steps: int | None,
    steps_per_epoch: int,
    beta: ScheduleLike | None,
    lr_schedule: LRScheduleLike | None,
) -> tuple[RunLength, Callable[[float], float], LRScheduleLike]:
    """The run's length, β's schedule and the learning-rate schedule of a fit.

    A fixed run takes ``delayed_warmup(epochs)`` and ``InverseTimeDecay(epochs)`` for
    ``None``; an automatic one its stages' (a number stays a constant).

    Returns:
        ``(length, beta schedule, lr schedule)``.
    """
    if epochs is not None:
        schedule = delayed_warmup(epochs) if beta is None else as_schedule(beta)
        rates = InverseTimeDecay(epochs) if lr_schedule is None else lr_schedule
        return FixedEpochs(epochs), schedule, rates
    constant = None if beta is None else as_schedule(beta)(0.0)
    length = AutoEpochs(
        steps_per_epoch,
        MAX_STEPS if max_steps is None else max_steps,
        beta=constant,
        decay=lr_schedule is None,
    )
    return length, length.beta, length.rate if lr_schedule is None else lr_schedule


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
