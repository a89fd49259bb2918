r"""An automatic run, ``fit(epochs=None)``: trained until more training stops paying.

A fit of fixed length draws β's warm-up and the learning rate's decay over its epochs
(:mod:`~pyro_bbb.training.run_length`). :class:`AutoEpochs` places them where the run
actually is, in four stages, each ended by what the record shows:

1. ``"fit"``: β = 0, the likelihood alone, until the stage is done by the run's rule.
2. ``"warmup"``: β rises linearly from 0 to 1 over half as many epochs as ``"fit"`` took
   (at least a tested stage's least length).
3. ``"train"``: β = 1 at the full rate until the stage is done by the run's rule. Where
   ``fit`` chose the rate (``lr`` not given, :mod:`~pyro_bbb.training.rates`) and the rule
   reads scores, the stage does not end there the first time: it **halves the rate** and
   goes on from its best average, and halves again each time a halved rate's phase beat the
   best before it by the rule's tolerance, up to :data:`MAX_HALVINGS` times (Welandawe et
   al. 2022, "Robust, Automated, and Accurate Black-box Variational Inference", halve the
   rate where the iterates are stationary). A rate too high for a network to hold its fit
   loses the fit here; a lower one is the remedy, not the end of the run.
4. ``"decay"``: the rate falls as :math:`1/(1 + t/t_0)`
   (:class:`~pyro_bbb.training.lr_schedules.InverseTimeDecay`) from where the halvings
   left it, to the rule's floor of ``lr``, over a length the rule sets, then the run ends.

The rule (:mod:`~pyro_bbb.training.stopping`, ``fit(until=...)``) asks either whether
further steps still pay (``"predictive"``, the default; it reads scores of the recent
iterates' average, :mod:`~pyro_bbb.training.scoring`, every few epochs of the tested
stages) or whether the posterior has stopped moving (``"converged"``, the strict
convergence check, which also zeroes Adam's moments where β reaches 1: the gradients of
the first stages, orders of magnitude larger than those near the optimum and remembered
for :math:`1/(1 - \beta_2)` = 1,000 steps, would shrink its steps for thousands of steps
more). Rows held out for ``validation=`` join the steps for the decay, so the returned
guide has seen every row.

**The budget.** The run ends by ``max_epochs`` (``fit``'s ``max_steps`` in whole epochs;
by default the larger of 50,000 steps and 100 epochs, so that a large data set gets as many
passes as a small one gets steps): ``"fit"`` may take a fifth of it, ``"train"`` ends at
70 %, and a stage the budget ends rather than its test is reported (``fit`` then warns,
saying what was still moving and what to pass). The stages' least lengths shrink to fit a
small budget: no budget is too small to run. A ``beta`` other than ``None`` (a number or
the user's own schedule, followed as given) skips the first two stages; an
``lr_schedule`` of the user's replaces the decay's rate. ``History.stage`` records each
epoch's stage and ``History.stopped`` why the run ended; every decision is a function of
the History, so a resumed run continues where the interrupted one was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from .._validation import check_int
from ..infer.schedules import LinearWarmup
from .convergence import (
    MIN_WINDOW,
    Convergence,
    check_convergence,
    check_epochs,
    convergence_warning,
)
from .history import History
from .lr_schedules import InverseTimeDecay
from .optimizers import reset_moments
from .stopping import MIN_FIT_SCORES, TOLERANCE, StopRule, StopsPaying

__all__ = ["MAX_STEPS", "MIN_EPOCHS", "STAGES", "AutoEpochs", "budget_epochs"]

#: The budget of an automatic run, in optimiser steps, when ``max_steps`` is not given ...
MAX_STEPS = 50_000
#: ... or this many epochs, when more.
MIN_EPOCHS = 100
#: The most times the full-rate stage halves its rate (to 1/16 of it).
MAX_HALVINGS = 4
#: The warm-up's length as a share of the likelihood-only stage's.
RAMP_SHARE = 0.5
#: The share of the budget the ``"fit"`` stage may take, and where ``"train"`` must end.
_FIT_CAP, _TRAIN_CAP = 0.2, 0.7
#: The History's lists of an automatic run's scores.
_SCORED = ("validation", "averaged_nll", "averaged_kl")
#: The stages of an automatic run, in order.
STAGES = ("fit", "warmup", "train", "decay")
#: What each stage is called in a message.
_STAGE_NAMES = {
    "fit": "the likelihood-only stage (beta = 0)",
    "train": "the stage at beta's final value and the full rate",
}


def budget_epochs(max_steps: int | None, steps_per_epoch: int) -> int:
    """An automatic run's budget in epochs: ``max_steps`` in whole epochs, at least one.

    ``None`` gives the larger of :data:`MAX_STEPS` steps and :data:`MIN_EPOCHS` epochs.
    """
    if max_steps is None:
        return max(MAX_STEPS // steps_per_epoch, MIN_EPOCHS)
    return max(1, max_steps // steps_per_epoch)


class AutoEpochs:
    r"""An automatic run: ``fit(epochs=None)``, in the stages of this module's description.

    It gives β and the learning-rate factor as functions of the (fractional) epoch, as
    ``fit``'s schedules are, and moves between stages at the end of an epoch, so that a
    stage's schedule is fixed before any of its steps is taken. Every decision is a function
    of the History alone, so a resumed run takes the uninterrupted one's.

    Args:
        steps_per_epoch: Optimiser steps in an epoch (of the rows the steps train on).
        max_epochs: The budget, in epochs (:func:`budget_epochs`).
        beta: ``None`` for the warm-up stages, or the user's β schedule (a callable of the
            epoch; a number is a constant), followed as given from the first epoch.
        decay: Whether the last stage decays the rate (``False``: the user's rate
            schedule runs throughout).
        rule: When a tested stage is done (:mod:`~pyro_bbb.training.stopping`).
        scored: Whether held-out rows are scored (``History.validation``); they are
            given back for the last stage.
        every: Score after every ``every``-th epoch (:mod:`~pyro_bbb.training.scoring`).
        gives_back: Whether the steps train without held-out rows until the last stage.
        steps_given_back: Optimiser steps in an epoch of every row, held-out ones given
            back (``None``: as ``steps_per_epoch``); the last stage's length keeps the run
            within its budget of steps.
    """

    def __init__(
        self,
        steps_per_epoch: int,
        max_epochs: int,
        *,
        beta: Callable[[float], float] | None,
        decay: bool,
        rule: StopRule | None = None,
        scored: bool = False,
        every: int = 1,
        gives_back: bool = False,
        steps_given_back: int | None = None,
        halves: bool = False,
    ) -> None:
        self.steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch)
        self.max_epochs = check_int("max_epochs", max_epochs)
        self.rule = StopsPaying() if rule is None else rule
        self.scored, self.every = scored, check_int("every", every)
        self.gives_back = gives_back
        self.steps_given_back = steps_given_back or steps_per_epoch
        least = math.ceil(self.rule.min_stage_steps / steps_per_epoch)
        if self.rule.reads_scores:
            least = max(least, MIN_FIT_SCORES * every)
        else:
            least = max(least, 2 * MIN_WINDOW)
        #: The fewest epochs of a tested stage: shorter when the budget is small.
        self.min_stage = max(1, min(least, max_epochs // 8))
        self.user_beta, self.decay = beta, decay
        #: The first epoch of each stage reached so far.
        self.starts: dict[str, int] = {"fit" if beta is None else "train": 0}
        #: The epoch after the last, once known.
        self.end: int | None = None
        #: The stage the budget ended rather than its test, or ``None``.
        self.forced: str | None = None
        self.finished = False
        self._warmup: LinearWarmup | None = None
        self._decay: InverseTimeDecay | None = None
        #: Whether the full-rate stage halves its rate where it stops paying.
        self.halves = halves and self.rule.reads_scores
        #: The epochs at which the full-rate stage's rate halved, in order.
        self.halvings: list[int] = []

    # ---------------------------------------------------------------- schedules
    @property
    def current(self) -> str:
        """The stage of the next epoch."""
        return max(self.starts, key=self.starts.__getitem__)

    def stage(self, epoch: int) -> str:
        """The stage epoch ``epoch`` is in."""
        return max((s for s, e in self.starts.items() if e <= epoch), key=self.starts.__getitem__)

    def beta(self, t: float) -> float:
        """β at epoch ``t``: 0 in ``"fit"``, rising in ``"warmup"``, then 1 (or the user's)."""
        if self.user_beta is not None:
            return self.user_beta(t)
        return 0.0 if self._warmup is None else self._warmup(t)

    def rate(self, t: float) -> float:
        """The learning-rate factor at epoch ``t``: 1, halved at each halving, then the decay."""
        factor = 0.5 ** sum(1 for epoch in self.halvings if epoch <= t)
        return factor if self._decay is None else factor * self._decay(t)

    def phase(self, epoch: int) -> str:
        """The stage of epoch ``epoch``, with the full-rate stage's halvings told apart.

        The scores' iterate average restarts with each phase (a new rate is a new chain).
        """
        stage = self.stage(epoch)
        if stage != "train":
            return stage
        return f"train/{2 ** sum(1 for start in self.halvings if start <= epoch)}"

    def _phase_start(self, epoch: int) -> int:
        """The first epoch of the phase (:meth:`phase`) epoch ``epoch`` is in."""
        start = self.starts[self.stage(epoch)]
        if self.stage(epoch) == "train":
            start = max([start, *(h for h in self.halvings if h <= epoch)])
        return start

    def holds_out(self, epoch: int) -> bool:
        """Whether epoch ``epoch`` trains without the held-out rows (all but the last stage)."""
        return self.gives_back and self.stage(epoch) != "decay"

    def averages(self, epoch: int) -> bool:
        """Whether the scores' iterate average takes in epoch ``epoch`` (a tested stage)."""
        return self.rule.reads_scores and self.stage(epoch) in ("fit", "train")

    def reads(self, epoch: int) -> frozenset[str]:
        """What is scored after epoch ``epoch``: ``"fit"``, ``"validation"`` or nothing.

        The likelihood-only stage reads the ELBO's parts on a sample of the training rows,
        the full-rate stage the held-out rows (the same sample where none are held out),
        every :attr:`every` epochs (:mod:`~pyro_bbb.training.scoring`).
        """
        if not self.averages(epoch) or (epoch + 1 - self._phase_start(epoch)) % self.every:
            return frozenset()
        if self.stage(epoch) == "fit" or not self.scored:
            return frozenset({"fit"})
        return frozenset({"validation"})

    # ---------------------------------------------------------------- the run
    @property
    def total(self) -> int | None:
        """The run's length in epochs, once the last stage has begun."""
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
        start = self.starts[stage]
        after = {"fit": "warmup", "warmup": "train", "train": self._last_stage()}.get(stage)
        if stage == "train":
            start = self._phase_start(done - 1)
        if after is not None and self._stage_over(history, stage, start):
            if stage == "train" and self._halving_pays(history, start):
                self.halvings.append(done)
            else:
                self._begin(after, history, optimizer)
        if done >= self.max_epochs and (self.end is None or self.end > done):
            self.forced = self.forced or self._unfinished()
            self.end = done  # the budget is spent, whatever stage the run was in
        self.finished = self.end is not None and done >= self.end

    def restores_best(self, done: int) -> bool:
        """Whether the parameters take the full-rate stage's best-scoring average now.

        After ``done`` epochs, where the rule reads scores and the run's last stage begins
        with the next epoch (:meth:`~pyro_bbb.training.scoring.IterateAverage.restore_best`):
        the decay, or the end, starts from the stage's best rather than its last iterates.
        """
        return (
            self.rule.reads_scores
            and self.forced is None
            and (self.starts.get(self._last_stage()) == done or done in self.halvings)
        )

    def _halving_pays(self, history: History, start: int) -> bool:
        """Whether the full-rate stage, whose phase began at ``start``, halves its rate now.

        Where it may (:attr:`halves`, fewer than :data:`MAX_HALVINGS` so far, the budget's
        share for the stage not spent), it halves after its first phase, and after each
        later one whose best reading of what the rule reads (the expected log-likelihood of
        the training sample, or the held-out score) beat the best before it by
        :data:`~pyro_bbb.training.stopping.TOLERANCE` or more: a halving that no longer
        paid ends the stage. Welandawe et al. (2022) halve the rate each time the iterates
        are stationary and stop where going on no longer pays; the KL, which creeps towards
        the prior for thousands of steps at any rate, is not asked.
        """
        done = len(history)
        if not self.halves or len(self.halvings) >= MAX_HALVINGS:
            return False
        if done >= _TRAIN_CAP * self.max_epochs:
            return False
        return not self.halvings or self._phase_paid(history, start, done)

    def _phase_paid(self, history: History, start: int, end: int) -> bool:
        """Whether the phase of epochs ``start`` to ``end - 1`` beat the stage's best before it."""
        fit = self._fit_scores(history)
        return _best(fit[start:end]) >= _best(fit[self.starts["train"] : start]) + TOLERANCE

    def _unpaid_phase(self, history: History, start: int) -> int:
        """The epochs of a last, halved phase (ended at ``start``) whose halving did not pay.

        0 where there was no halving, the most halvings were reached, or the last one paid.
        """
        if not self.halvings or len(self.halvings) >= MAX_HALVINGS:
            return 0
        last = self.halvings[-1]
        return 0 if self._phase_paid(history, last, start) else start - last

    def _fit_scores(self, history: History) -> list[float]:
        """What the rule reads of the full-rate stage: the held-out or the training fit."""
        return history.validation if self.scored else [-v for v in history.averaged_nll]

    def _scores(self, history: History, start: int, end: int) -> list[float]:
        """The full-rate stage's scores over epochs ``start`` to ``end - 1`` (what it keeps)."""
        if self.scored:
            return history.validation[start:end]
        nll, kl = history.averaged_nll[start:end], history.averaged_kl[start:end]
        return [-(n + k) for n, k in zip(nll, kl, strict=True)]

    def _stage_over(self, history: History, stage: str, start: int) -> bool:
        """Whether ``stage``, begun at ``start``, ends after the last epoch of ``history``."""
        done = len(history)
        if stage == "warmup":
            return done - start >= self._warmup.warmup
        cap = _FIT_CAP if stage == "fit" else _TRAIN_CAP
        return self._done(history, stage, start) or done >= cap * self.max_epochs

    def _last_stage(self) -> str:
        """``"decay"`` where the rate decays or held-out rows are given back, else ``"end"``."""
        return "decay" if self.decay or self.gives_back else "end"

    def _unfinished(self) -> str:
        """The tested stage a spent budget leaves unfinished (``"train"`` once begun)."""
        return "train" if "train" in self.starts else "fit"

    def _done(self, history: History, stage: str, start: int) -> bool:
        """Whether the rule ends the stage now: long enough, just scored, and done."""
        done = len(history)
        if done - start < self.min_stage or not self.rule.due(done - start):
            return False
        if self.rule.reads_scores and not self.reads(done - 1):
            return False
        return self.rule.judge(history, stage, start, done, self.scored).done

    def _begin(self, stage: str, history: History, optimizer: torch.optim.Optimizer | None) -> None:
        self.starts[stage] = len(history)
        self._place(stage, history)
        if optimizer is not None and stage == "train" and self.rule.resets_moments:
            reset_moments(optimizer)

    def _place(self, stage: str, history: History) -> None:
        """Fix the schedules and the end the start of ``stage`` decides.

        ``history`` holds the epochs before the stage (a resumed run passes that part).
        """
        start = self.starts[stage]
        if stage == "warmup":
            ramp = max(self.min_stage, round(RAMP_SHARE * (start - self.starts["fit"])))
            self._warmup = LinearWarmup(ramp, delay=start)
            self._note_budget(history, "fit", _FIT_CAP)
        elif stage in ("decay", "end"):
            self._note_budget(history, "train", _TRAIN_CAP)
            self.end = start
        if stage == "decay":
            length, floor = self.rule.decay_plan(history, self.starts["train"], start)
            tried = self._unpaid_phase(history, start)
            if tried:  # the halved phase that did not pay is the start of the low-rate tail
                length = max(
                    1, self.rule.decay_plan(history, self.starts["train"], start - tried)[0] - tried
                )
            steps_left = (self.max_epochs - start) * self.steps_per_epoch
            self.end = start + max(1, min(length, steps_left // self.steps_given_back))
            if self.decay:  # from the halved rate to the same floor of lr
                floor = min(1.0, floor * 2 ** len(self.halvings))
                self._decay = InverseTimeDecay(self.end, start=start / self.end, floor=floor)

    def _note_budget(self, history: History, stage: str, cap: float) -> None:
        """Record that the budget, not the rule, ended ``stage`` (at ``len(history)``)."""
        if len(history) >= cap * self.max_epochs and not self._done(
            history, stage, self.starts[stage]
        ):
            self.forced = self.forced or stage

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
        self.starts, self.halvings = {}, []
        for epoch, stage in enumerate(history.stage):
            if stage not in self.starts:
                self.starts[stage] = epoch
                self._place(stage, _first(history, epoch))
            elif self.halves and stage == "train" and _lowered(history.lr, epoch):
                self.halvings.append(epoch)  # in "train", only a halving lowers the rate
        self.after_epoch(history, None)

    # ---------------------------------------------------------------- the end
    def stopped(self, history: History) -> str:
        """Why the run ended, in a sentence or two (``History.stopped``)."""
        train = self.starts.get("train")
        after = self.starts.get("decay", self.starts.get("end"))
        if self.forced is not None:
            stage = self.forced
            start = self.starts[stage]
            end = self.starts.get("warmup" if stage == "fit" else "decay", len(history))
            moving = self.rule.judge(history, stage, start, end, self.scored).found
            steps = self.max_epochs * self.steps_per_epoch
            return (
                f"the budget of {self.max_epochs:,} epochs ({steps:,} steps) ended "
                f"{_STAGE_NAMES[stage]} before its test passed: {moving}; pass "
                f"max_steps={2 * steps:,} to give it more"
            )
        if train is None or after is None:
            return f"stopped during the {self.stage(len(history) - 1)!r} stage"
        ended = self.rule.judge(
            history, "train", self._phase_start(after - 1), after, self.scored
        ).found
        if self.halvings:
            at = ", ".join(f"{epoch:,}" for epoch in self.halvings)
            ended += (
                f" at 1/{2 ** len(self.halvings)} of the rate (halved after epochs {at}, "
                "each from the best average before it)"
            )
        best = self._best_epoch(history, self._phase_start(after - 1), after)
        if best is not None:
            ended += f"; the stage's best average (epoch {best:,}) kept"
        last = len(history) - after
        if not last:
            return f"ended when {ended}"
        rows = "on every row, the held-out ones given back" if self.gives_back else "on every row"
        rate = "the rate decayed" if self._decay is not None else "it trained on"
        epochs = "epoch" if last == 1 else "epochs"
        return f"ended when {ended}; then {rate} over {last:,} {epochs} {rows}"

    def _best_epoch(self, history: History, train: int, after: int) -> int | None:
        """The epoch whose average scored best in the full-rate stage, where it is kept."""
        if not self.rule.reads_scores:
            return None
        while train < after - 1 and history.beta[train] != history.beta[after - 1]:
            train += 1  # the average kept is the best since beta last changed
        scores = self._scores(history, train, after)
        read = [(v, e) for e, v in enumerate(scores, start=train) if not math.isnan(v)]
        return max(read, key=lambda score_epoch: score_epoch[0])[1] if read else None

    def warning(self, history: History) -> str | None:
        """What to warn of at the end, or ``None``.

        Under ``until="predictive"`` the run's own test decides when it is done, and only a
        budget that ended it first is warned of; under ``until="converged"`` the strict
        check's failure is.
        """
        if isinstance(self.rule, StopsPaying):
            return None if self.forced is None else f"fit stopped at its budget: {history.stopped}"
        if self.forced is not None:
            return f"fit did not converge: {history.stopped}"
        return convergence_warning(history.convergence)

    def convergence(self, history: History) -> Convergence:
        """The strict convergence check of the finished run.

        The last half of the ``"train"`` stage; a stage the budget ended fails with the
        budget's message; a run stopped before its ``"train"`` stage ended (a callback) is
        checked as a fixed one.
        """
        if self.forced is not None:
            return Convergence(False, None, None, None, self.stopped(history))
        train, after = self.starts.get("train"), self.starts.get("decay", self.starts.get("end"))
        if train is None or after is None or after - train < MIN_WINDOW:
            return check_convergence(history)
        first = min(after - (after - train) // 2, after - MIN_WINDOW)
        return check_epochs(history, first, after - 1)


def _lowered(rates: list[float], epoch: int) -> bool:
    """Whether epoch ``epoch``'s rate fell by more than a quarter from the epoch before."""
    return rates[epoch] < 0.75 * rates[epoch - 1]


def _best(scores: list[float]) -> float:
    """The highest of ``scores`` read (``nan``: not read), ``-inf`` if none."""
    return max((v for v in scores if not math.isnan(v)), default=-math.inf)


def _first(history: History, epochs: int) -> History:
    """The History of the first ``epochs`` epochs (what a stage's start was decided on)."""
    if len(history) == epochs:
        return history
    part = History(num_data=history.num_data, held_out=history.held_out)
    for name in (*_SCORED, "loss", "nll", "kl", "beta", "lr", "stage"):
        setattr(part, name, getattr(history, name)[:epochs])
    return part
