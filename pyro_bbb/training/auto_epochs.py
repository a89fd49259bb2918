r"""An automatic run, ``fit(epochs=None)``: trained until it has converged.

A fit of fixed length draws β's warm-up and the learning rate's decay over its epochs
(:mod:`~pyro_bbb.training.run_length`). :class:`AutoEpochs` places them where the run
actually is, in four stages, each ended by what the per-epoch record shows:

1. ``"fit"``: β = 0, the likelihood alone, until the β = 1 loss (``History.plain_loss``)
   stops falling over the last half of the stage: the likelihood is fitted, and the scales,
   which nothing holds at β = 0, start to shrink below the posterior's.
2. ``"warmup"``: β rises linearly from 0 to 1 over half as many epochs as ``"fit"`` took.
3. ``"train"``: β = 1 at the full rate until the convergence check
   (:mod:`~pyro_bbb.training.convergence`) passes on the last half of the stage: the β = 1
   loss no longer falls and its KL part no longer moves.
4. ``"decay"``: the rate falls as :math:`1/(1 + t/t_0)`
   (:class:`~pyro_bbb.training.lr_schedules.InverseTimeDecay`), :math:`t_0` the
   autocorrelation time of the KL in ``"train"``, towards 0.3 % of ``lr`` (:math:`332 t_0`
   epochs, at most as many as the run so far), then the run ends.

Where β reaches 1 the optimiser's running moments are zeroed
(:func:`~pyro_bbb.training.optimizers.reset_moments`). Adam normalises each step by a
running mean of squared gradients that forgets with a time constant of
:math:`1/(1 - \beta_2)` = 1,000 steps; the gradients of the first stages are orders of
magnitude larger than those near the optimum, and remembered, they shrink the steps for
thousands of steps more. On a linear regression of 8 features and 1,000 points the
mean-field scales were still 11 % from their optimum 2,500 full-rate epochs after β reached
1; with the moments zeroed there, 6 % after 250 (``docs/concepts.md``).

The stages are capped so that the run ends by ``max_steps``: ``"fit"`` may take a fifth of
them, ``"train"`` ends at 70 %, and a stage ended by the cap rather than by its test is
reported (``fit`` then warns). A constant ``beta`` skips the first two stages; a constant
``lr_schedule`` skips the decay (the run ends when ``"train"`` does). ``History.stage``
records each epoch's stage, and every decision is a function of the History, so a resumed
run continues where the interrupted one was.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from .._validation import check_int
from ..infer.schedules import LinearWarmup
from .convergence import (
    LOSS_TOLERANCE,
    MIN_WINDOW,
    Convergence,
    autocorrelation_time,
    check_convergence,
    check_epochs,
    trend,
)
from .history import History
from .lr_schedules import InverseTimeDecay
from .optimizers import reset_moments

__all__ = ["MAX_STEPS", "STAGES", "AutoEpochs"]

#: The cap of an automatic run, in optimiser steps, when ``max_steps`` is not given.
MAX_STEPS = 50_000
#: Each tested stage runs at least this many steps (and twice :data:`MIN_WINDOW` epochs).
MIN_STAGE_STEPS = 200
#: The warm-up's length as a share of the likelihood-only stage's.
RAMP_SHARE = 0.5
#: The factor of ``lr`` the decay falls to, when the epochs before it allow (higher if not).
DECAY_FLOOR = 0.003
#: The share of ``max_steps`` the ``"fit"`` stage may take, and where ``"train"`` must end.
_FIT_CAP, _TRAIN_CAP = 0.2, 0.7
#: The stages of an automatic run, in order.
STAGES = ("fit", "warmup", "train", "decay")


class AutoEpochs:
    r"""An automatic run: ``fit(epochs=None)``, in the stages of this module's description.

    It gives β and the learning-rate factor as functions of the (fractional) epoch, as
    ``fit``'s schedules are, and moves between stages at the end of an epoch, so that a
    stage's schedule is fixed before any of its steps is taken. Every decision is a function
    of the History alone, so a resumed run takes the uninterrupted one's.

    Args:
        steps_per_epoch: Optimiser steps in an epoch.
        max_steps: The cap on the run's steps.
        beta: ``None`` for the warm-up stages, or a constant β (no warm-up).
        decay: Whether the run ends with the rate's decay.

    Raises:
        ValueError: If ``max_steps`` is too small for the stages' minimum lengths.
    """

    def __init__(
        self, steps_per_epoch: int, max_steps: int, *, beta: float | None, decay: bool
    ) -> None:
        self.steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch)
        self.max_steps = check_int("max_steps", max_steps)
        #: The fewest epochs of a tested stage.
        self.min_stage = max(2 * MIN_WINDOW, math.ceil(MIN_STAGE_STEPS / steps_per_epoch))
        self.max_epochs = max_steps // steps_per_epoch
        smallest = (4 if beta is None else 2) * self.min_stage
        if self.max_epochs < smallest:
            raise ValueError(
                f"max_steps={max_steps} allows {self.max_epochs} epoch(s) of {steps_per_epoch} "
                f"step(s); an automatic run needs at least {smallest * steps_per_epoch} steps "
                f"({smallest} epochs, {self.min_stage} a stage)"
            )
        self.constant_beta, self.decay = beta, decay
        #: The first epoch of each stage reached so far.
        self.starts: dict[str, int] = {"fit" if beta is None else "train": 0}
        #: The epoch after the last, once known.
        self.end: int | None = None
        #: The stage the cap ended rather than its test, or ``None``.
        self.forced: str | None = None
        self.finished = False
        self._warmup: LinearWarmup | None = None
        self._decay: InverseTimeDecay | None = None

    # ---------------------------------------------------------------- schedules
    @property
    def current(self) -> str:
        """The stage of the next epoch."""
        return max(self.starts, key=self.starts.__getitem__)

    def stage(self, epoch: int) -> str:
        """The stage epoch ``epoch`` is in."""
        return max((s for s, e in self.starts.items() if e <= epoch), key=self.starts.__getitem__)

    def beta(self, t: float) -> float:
        """β at epoch ``t``: 0 in ``"fit"``, rising in ``"warmup"``, then 1 (or the constant)."""
        if self.constant_beta is not None:
            return self.constant_beta
        return 0.0 if self._warmup is None else self._warmup(t)

    def rate(self, t: float) -> float:
        """The learning-rate factor at epoch ``t``: 1, then the decay (:meth:`_decay_plan`)."""
        return 1.0 if self._decay is None else self._decay(t)

    # ---------------------------------------------------------------- the run
    @property
    def total(self) -> int | None:
        """The run's length in epochs, once the decay has begun (or the run has ended)."""
        return self.end

    def run(self, start: int) -> Iterator[int]:
        """The epochs to run from ``start``, until the last stage ends."""
        epoch = start
        while not self.finished:
            yield epoch
            epoch += 1

    def after_epoch(self, history: History, optimizer: torch.optim.Optimizer | None) -> None:
        """Decide, from the History so far, whether the next epoch begins a new stage.

        ``optimizer`` is ``None`` when a resumed run replays the decision after its last
        epoch (the checkpoint was written after it, and after its optimiser's reset).
        """
        done = len(history)
        stage = self.current
        length = done - self.starts[stage]
        if stage == "fit":
            capped = done >= _FIT_CAP * self.max_epochs
            if capped or (_due(length, self.min_stage) and _settled_fit(history, done, length)):
                self._begin("warmup", history, optimizer)
        elif stage == "warmup":
            if length >= self._warmup.warmup:
                self._begin("train", history, optimizer)
        elif stage == "train":
            capped = done >= _TRAIN_CAP * self.max_epochs
            if capped or (_due(length, self.min_stage) and _settled(history, done, length)):
                self._begin("decay" if self.decay else "end", history, optimizer)
        self.finished = self.end is not None and done >= self.end

    def _begin(self, stage: str, history: History, optimizer: torch.optim.Optimizer | None) -> None:
        self.starts[stage] = len(history)
        self._place(stage, history)
        if optimizer is not None and stage == "train":
            reset_moments(optimizer)

    def _place(self, stage: str, history: History) -> None:
        """Fix the schedules and the end the start of ``stage`` decides."""
        start = self.starts[stage]
        if stage == "warmup":
            ramp = max(self.min_stage, round(RAMP_SHARE * (start - self.starts["fit"])))
            self._warmup = LinearWarmup(ramp, delay=start)
            if start >= _FIT_CAP * self.max_epochs:
                self.forced = self.forced or "the likelihood-only stage (beta = 0)"
        elif stage in ("decay", "end"):
            if start >= _TRAIN_CAP * self.max_epochs:
                self.forced = self.forced or "the stage at beta's final value and the full rate"
            self.end = start
        if stage == "decay":
            length, floor = self._decay_plan(start, history)
            self.end = min(start + length, max(self.max_epochs, start + 1))
            self._decay = InverseTimeDecay(self.end, start=start / self.end, floor=floor)

    def _decay_plan(self, start: int, history: History) -> tuple[int, float]:
        r"""The decay's length and floor, from how slowly the full-rate stage wandered.

        The rate :math:`1/(1 + t/t_0)` lets the parameters follow it down, each rate long
        enough for them to settle there, when :math:`t_0` is at least the time they take to
        forget where they were: the autocorrelation time :math:`\tau` of the KL over the last
        half of ``"train"``. Falling to :data:`DECAY_FLOOR` (0.3 %) then takes
        :math:`332\tau`; faster, they freeze wherever the fall finds them (the error a decay
        that is too short leaves). The decay takes that long, at most as many epochs as the
        run so far, and when shorter it stops at the floor :math:`\tau/(\tau +
        \text{length})`, which keeps :math:`t_0 = \tau`.
        """
        train = self.starts["train"]
        window = history.kl[start - (start - train) // 2 : start]
        tau = autocorrelation_time(window) if len(window) >= MIN_WINDOW else 1.0
        length = max(self.min_stage, min(math.ceil(tau * (1 / DECAY_FLOOR - 1)), start))
        return length, max(DECAY_FLOOR, tau / (tau + length))

    # ---------------------------------------------------------------- resuming
    def restore(self, history: History) -> None:
        """Continue from a resumed History: its stages, then the decision after its last epoch.

        Raises:
            ValueError: If ``history`` was not written by an automatic run.
        """
        if not len(history):
            return
        if any(stage not in STAGES for stage in history.stage):
            raise ValueError(
                "the checkpoint was written by a fit with a fixed number of epochs; resume "
                "it with epochs= the total to reach"
            )
        self.starts = {}
        for epoch, stage in enumerate(history.stage):
            if stage not in self.starts:
                self.starts[stage] = epoch
                self._place(stage, history)
        self.after_epoch(history, None)

    def convergence(self, history: History) -> Convergence:
        """The convergence check of the finished run.

        The last half of the ``"train"`` stage, as its test read it; a stage ended by the
        cap fails with what to change. A run stopped before its ``"train"`` stage ended (a
        callback) is checked as a fixed one.
        """
        if self.forced is not None:
            return Convergence(
                False, None, None, None,
                f"max_steps={self.max_steps:,} ended {self.forced} before its test passed; "
                "raise max_steps, or lr if the loss was still falling steadily",
            )  # fmt: skip
        train, after = self.starts.get("train"), self.starts.get("decay", self.starts.get("end"))
        if train is None or after is None:
            return check_convergence(history)
        return check_epochs(history, after - (after - train) // 2, after - 1)


def _due(length: int, min_stage: int) -> bool:
    """Whether a stage of ``length`` epochs is tested: once long enough, then every 5 %."""
    return length >= min_stage and length % max(1, length // 20) == 0


def _settled_fit(history: History, done: int, length: int) -> bool:
    """Whether the β = 1 loss stopped falling over the last half of the likelihood-only stage."""
    fall = trend(history.plain_loss[done - length // 2 : done]).fall_bound()
    return fall < LOSS_TOLERANCE * history.num_data


def _settled(history: History, done: int, length: int) -> bool:
    """Whether the convergence check passes on the last half of the stage."""
    return check_epochs(history, done - length // 2, done - 1).converged
