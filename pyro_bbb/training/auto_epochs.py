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

**The state machine.** The stages and what follows each are data, :data:`STAGE_TABLE`;
where the run is, a :class:`RunState` value. After every epoch :meth:`AutoEpochs.after_epoch`
decides the next state from the current one and the History (a pure function: the stage
ends, halves its rate, or goes on; the budget may end the run) and applies it, the one place
the state changes; a resumed run folds the same transitions over its History.

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
70 %. A ``"fit"`` stage its fifth ends is said in ``History.stopped`` and the run goes on
(the stage readies the scales for β = 1; the stages after it end by their own tests); a
stage the budget ends the run in rather than its test is reported (``fit`` then warns,
saying what was still moving and what to pass). The stages' least lengths shrink to fit a
small budget: no budget is too small to run. A ``beta`` other than ``None`` (a number or
the user's own schedule, followed as given) skips the first two stages; an
``lr_schedule`` of the user's replaces the decay's rate.

**A continued run** (a fitted guide given to ``fit`` again,
:mod:`~pyro_bbb.training.continuation`) starts in ``"train"``, β constant at the value the
fit it continues ended on, the rate at the factor ``rate_from`` where that fit left it: it
trains there while further steps pay, then decays from there to the same floor of ``lr``.
A rate already within :data:`~pyro_bbb.training.continuation.DECAYED` of that floor (a run
that ended with its decay) is neither halved nor decayed again: the run ends with its
full-rate stage, which confirms that going on no longer pays, or finds what it still
buys. ``History.stage`` records each
epoch's stage and ``History.stopped`` why the run ended; every decision is a function of
the History, so a resumed run continues where the interrupted one was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch

from .._validation import check_int
from ..infer.schedules import LinearWarmup
from .continuation import DECAYED
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
from .scoring import best_epoch
from .stopping import MIN_FIT_SCORES, TOLERANCE, StopRule, StopsPaying, fit_scores

__all__ = [
    "MAX_STEPS",
    "MIN_EPOCHS",
    "STAGES",
    "STAGE_TABLE",
    "AutoEpochs",
    "RunState",
    "Stage",
    "budget_epochs",
]

#: The budget of an automatic run, in optimiser steps, when ``max_steps`` is not given ...
MAX_STEPS = 50_000
#: ... or this many epochs, when more.
MIN_EPOCHS = 100
#: The most times the full-rate stage halves its rate (to 1/16 of it).
MAX_HALVINGS = 4
#: The warm-up's length as a share of the likelihood-only stage's.
RAMP_SHARE = 0.5
#: The History's lists of an automatic run's scores.
_SCORED = ("validation", "averaged_nll", "averaged_kl")


class Stage(NamedTuple):
    """A stage of an automatic run, as data: what ends it and what follows it."""

    #: The stage that follows (``"decay"`` is ``"end"`` where nothing decays and no rows
    #: are given back); ``None`` for the last, which ends at :attr:`RunState.end`.
    then: str | None
    #: Whether the run's rule ends it (else its length, fixed where it begins).
    judged: bool
    #: The share of the budget by which it ends at the latest, its test passed or not.
    cap: float
    #: What a message calls it.
    called: str


#: The stages of an automatic run, in order: the state machine's table.
STAGE_TABLE: Mapping[str, Stage] = {
    "fit": Stage("warmup", True, 0.2, "the likelihood-only stage (beta = 0)"),
    "warmup": Stage("train", False, 1.0, "the warm-up"),
    "train": Stage("decay", True, 0.7, "the stage at beta's final value and the full rate"),
    "decay": Stage(None, False, 1.0, "the decay"),
}
#: The stages of an automatic run, in order.
STAGES = tuple(STAGE_TABLE)


def budget_epochs(max_steps: int | None, steps_per_epoch: int) -> int:
    """An automatic run's budget in epochs: ``max_steps`` in whole epochs, at least one.

    ``None`` gives the larger of :data:`MAX_STEPS` steps and :data:`MIN_EPOCHS` epochs.
    """
    if max_steps is None:
        return max(MAX_STEPS // steps_per_epoch, MIN_EPOCHS)
    return max(1, max_steps // steps_per_epoch)


@dataclass(frozen=True)
class RunState:
    """Where an automatic run is: what every decision so far fixed, and nothing else.

    A value: a transition (:meth:`AutoEpochs.after_epoch`) makes a new one, and
    :class:`AutoEpochs` holds the current one.
    """

    #: The first epoch of each stage reached so far (``"end"``: the run ends there).
    starts: Mapping[str, int]
    #: The epochs at which the full-rate stage's rate halved, in order.
    halvings: tuple[int, ...] = ()
    #: The epoch after the last, once known.
    end: int | None = None
    #: The stage the budget ended rather than its test, or ``None``.
    forced: str | None = None
    #: Whether its share of the budget (a fifth) ended the likelihood-only stage before its
    #: test passed and the run went on: said in ``History.stopped``, not warned of (the
    #: stage readies the scales for β = 1; the stages after it end by their own tests).
    fit_capped: bool = False
    #: The epochs decided on so far.
    done: int = 0
    #: β's warm-up, fixed where the warm-up begins.
    warmup: LinearWarmup | None = field(default=None, compare=False)
    #: The rate's decay, fixed where the decay begins.
    decay: InverseTimeDecay | None = field(default=None, compare=False)

    @property
    def current(self) -> str:
        """The stage of the next epoch."""
        return max(self.starts, key=self.starts.__getitem__)

    @property
    def finished(self) -> bool:
        """Whether the run's last epoch has been run."""
        return self.end is not None and self.done >= self.end

    def stage(self, epoch: int) -> str:
        """The stage epoch ``epoch`` is in."""
        return max((s for s, e in self.starts.items() if e <= epoch), key=self.starts.__getitem__)

    def halved(self, epoch: int) -> int:
        """How many times the rate had halved by epoch ``epoch``."""
        return sum(1 for start in self.halvings if start <= epoch)

    def phase_start(self, epoch: int) -> int:
        """The first epoch of the phase (:meth:`AutoEpochs.phase`) epoch ``epoch`` is in."""
        start = self.starts[self.stage(epoch)]
        if self.stage(epoch) == "train":
            start = max([start, *(h for h in self.halvings if h <= epoch)])
        return start

    def unfinished(self) -> str:
        """The tested stage a spent budget leaves unfinished (``"train"`` once begun)."""
        return "train" if "train" in self.starts else "fit"

    def after(self) -> int | None:
        """The first epoch of the run's last stage, once begun (the decay's, or the end)."""
        return self.starts.get("decay", self.starts.get("end"))


class AutoEpochs:
    r"""An automatic run: ``fit(epochs=None)``, in the stages of this module's description.

    A small state machine: the stages and what follows each are :data:`STAGE_TABLE`; where
    the run is, a :class:`RunState`; after every epoch :meth:`after_epoch` reads the
    History, decides the next state (a pure function of the two) and applies it, the one
    place the state changes. It gives β and the learning-rate factor as functions of the
    (fractional) epoch, as ``fit``'s schedules are, and moves between stages at the end of
    an epoch, so that a stage's schedule is fixed before any of its steps is taken. Every
    decision is a function of the History alone, so a resumed run takes the uninterrupted
    one's.

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
        halves: Whether the full-rate stage halves its rate where it stops paying.
        rate_from: A continued run's (:mod:`~pyro_bbb.training.continuation`): the rate's
            factor where the fit it continues left it; the run starts in ``"train"`` (with
            ``beta`` the value that fit ended on) at this factor, halved and decayed from
            it, neither where it is within
            :data:`~pyro_bbb.training.continuation.DECAYED` of the decay's floor.
            ``None`` for a run from the start.
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
        rate_from: float | None = None,
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
        #: The rate's factor the run starts from (a continued run's; 1 from the start).
        self.rate_from = 1.0 if rate_from is None else float(rate_from)
        decayed = rate_from is not None and self.rate_from <= DECAYED
        self.user_beta, self.decay = beta, decay and not decayed
        #: Whether the full-rate stage halves its rate where it stops paying.
        self.halves = halves and self.rule.reads_scores and not decayed
        #: Where the run is; changed by :meth:`_apply` alone.
        self.state = RunState({"fit" if beta is None else "train": 0})

    # ---------------------------------------------------------------- the state, read
    @property
    def starts(self) -> dict[str, int]:
        """The first epoch of each stage reached so far."""
        return dict(self.state.starts)

    @property
    def halvings(self) -> list[int]:
        """The epochs at which the full-rate stage's rate halved, in order."""
        return list(self.state.halvings)

    @property
    def forced(self) -> str | None:
        """The stage the budget ended rather than its test, or ``None``."""
        return self.state.forced

    @property
    def finished(self) -> bool:
        """Whether the run's last epoch has been run."""
        return self.state.finished

    @property
    def current(self) -> str:
        """The stage of the next epoch."""
        return self.state.current

    @property
    def total(self) -> int | None:
        """The run's length in epochs, once the last stage has begun."""
        return self.state.end

    def stage(self, epoch: int) -> str:
        """The stage epoch ``epoch`` is in."""
        return self.state.stage(epoch)

    # ---------------------------------------------------------------- schedules
    def beta(self, t: float) -> float:
        """β at epoch ``t``: 0 in ``"fit"``, rising in ``"warmup"``, then 1 (or the user's)."""
        if self.user_beta is not None:
            return self.user_beta(t)
        warmup = self.state.warmup
        return 0.0 if warmup is None else warmup(t)

    def rate(self, t: float) -> float:
        """The learning-rate factor at epoch ``t``: 1, halved at each halving, then the decay."""
        state = self.state
        factor = self.rate_from * 0.5 ** sum(1 for epoch in state.halvings if epoch <= t)
        return factor if state.decay is None else factor * state.decay(t)

    def phase(self, epoch: int) -> str:
        """The stage of epoch ``epoch``, with the full-rate stage's halvings told apart.

        The scores' iterate average restarts with each phase (a new rate is a new chain).
        """
        stage = self.state.stage(epoch)
        return stage if stage != "train" else f"train/{2 ** self.state.halved(epoch)}"

    def holds_out(self, epoch: int) -> bool:
        """Whether epoch ``epoch`` trains without the held-out rows (all but the last stage)."""
        return self.gives_back and self.state.stage(epoch) != "decay"

    def averages(self, epoch: int) -> bool:
        """Whether the scores' iterate average takes in epoch ``epoch`` (a tested stage)."""
        return self.rule.reads_scores and STAGE_TABLE[self.state.stage(epoch)].judged

    def reads(self, epoch: int) -> frozenset[str]:
        """What is scored after epoch ``epoch``: ``"fit"``, ``"validation"`` or nothing.

        The likelihood-only stage reads the ELBO's parts on a sample of the training rows,
        the full-rate stage the held-out rows (the same sample where none are held out),
        every :attr:`every` epochs (:mod:`~pyro_bbb.training.scoring`).
        """
        return self._reads(self.state, epoch)

    def _reads(self, state: RunState, epoch: int) -> frozenset[str]:
        stage = state.stage(epoch)
        if not (self.rule.reads_scores and STAGE_TABLE[stage].judged):
            return frozenset()
        if (epoch + 1 - state.phase_start(epoch)) % self.every:
            return frozenset()
        return frozenset({"fit" if stage == "fit" or not self.scored else "validation"})

    # ---------------------------------------------------------------- the run
    def run(self, start: int) -> Iterator[int]:
        """The epochs to run from ``start``, until the last stage ends."""
        epoch = start
        while not self.finished:
            yield epoch
            epoch += 1

    def after_epoch(self, history: History, optimizer: torch.optim.Optimizer | None) -> None:
        """Decide, from the History so far, where the next epoch is, and go there.

        ``optimizer`` is ``None`` when a resumed run replays the decision after its last
        epoch (the checkpoint was written after it, and after its optimiser's reset).
        """
        self._apply(self._next(self.state, history), optimizer)

    def _apply(self, state: RunState, optimizer: torch.optim.Optimizer | None) -> None:
        """Go to ``state``: the one place the run's state changes.

        Where the full-rate stage begins, a rule that asks for it zeroes Adam's moments.
        """
        begins_train = "train" in state.starts and "train" not in self.state.starts
        self.state = state
        if optimizer is not None and begins_train and self.rule.resets_moments:
            reset_moments(optimizer)

    def _next(self, state: RunState, history: History) -> RunState:
        """The state after the last epoch of ``history``: a pure function of the two.

        The current stage, its test passed or its share of the budget spent, halves its
        rate (the full-rate stage, while halving pays) or hands over to the stage that
        follows it (:data:`STAGE_TABLE`); a spent budget ends the run in any stage.
        """
        done = len(history)
        stage = state.current
        after = self._successor(stage)
        if after is not None and self._stage_over(state, history, stage):
            if stage == "train" and self._halving_pays(state, history):
                state = replace(state, halvings=(*state.halvings, done))
            else:
                state = self._begin(state, after, history)
        if done >= self.max_epochs and (state.end is None or state.end > done):
            # the budget is spent, whatever stage the run was in
            state = replace(state, forced=state.forced or state.unfinished(), end=done)
        return replace(state, done=done)

    def _successor(self, stage: str) -> str | None:
        """The stage after ``stage``: :data:`STAGE_TABLE`'s, ``"end"`` where none decays."""
        after = STAGE_TABLE[stage].then if stage in STAGE_TABLE else None
        if after == "decay" and not (self.decay or self.gives_back):
            return "end"
        return after

    def _stage_over(self, state: RunState, history: History, stage: str) -> bool:
        """Whether ``stage`` ends after the last epoch of ``history``."""
        done = len(history)
        start = state.phase_start(done - 1) if stage == "train" else state.starts[stage]
        if not STAGE_TABLE[stage].judged:  # the warm-up: its ramp's length
            return done - start >= state.warmup.warmup
        return self._done(state, history, stage, start) or self._capped(history, stage)

    def _capped(self, history: History, stage: str) -> bool:
        """Whether ``stage`` has spent its share of the budget (:data:`STAGE_TABLE`)."""
        return len(history) >= STAGE_TABLE[stage].cap * self.max_epochs

    def _done(self, state: RunState, history: History, stage: str, start: int) -> bool:
        """Whether the rule ends the stage now: long enough, just scored, and done."""
        done = len(history)
        if done - start < self.min_stage or not self.rule.due(done - start):
            return False
        if self.rule.reads_scores and not self._reads(state, done - 1):
            return False
        return self.rule.judge(history, stage, start, done, self.scored).done

    def _halving_pays(self, state: RunState, history: History) -> bool:
        """Whether the full-rate stage halves its rate now rather than end.

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
        if not self.halves or len(state.halvings) >= MAX_HALVINGS:
            return False
        if self._capped(history, "train"):
            return False
        start = state.phase_start(done - 1)
        return not state.halvings or self._phase_paid(state, history, start, done)

    def _phase_paid(self, state: RunState, history: History, start: int, end: int) -> bool:
        """Whether the phase of epochs ``start`` to ``end - 1`` beat the stage's best before it."""
        fit = fit_scores(history, self.scored)
        return _best(fit[start:end]) >= _best(fit[state.starts["train"] : start]) + TOLERANCE

    def _unpaid_phase(self, state: RunState, history: History, start: int) -> int:
        """The epochs of a last, halved phase (ended at ``start``) whose halving did not pay.

        0 where there was no halving, the most halvings were reached, or the last one paid.
        """
        if not state.halvings or len(state.halvings) >= MAX_HALVINGS:
            return 0
        last = state.halvings[-1]
        return 0 if self._phase_paid(state, history, last, start) else start - last

    def _begin(self, state: RunState, stage: str, history: History) -> RunState:
        """The state where ``stage`` begins after ``history``, with what its start fixes.

        The warm-up's ramp; the run's end and the decay's schedule; and whether the budget,
        not the rule, ended the stage before. ``history`` holds the epochs before the stage
        (a resumed run passes that part).
        """
        start = len(history)
        if stage == "decay" and not self._room(start):
            stage = "end"  # max_steps is a hard budget: no room for an epoch over every row
        state = replace(state, starts={**state.starts, stage: start})
        if stage == "warmup":
            ramp = max(self.min_stage, round(RAMP_SHARE * (start - state.starts["fit"])))
            warmup = LinearWarmup(ramp, delay=start)
            fit_capped = self._cut(state, history, "fit")
            return replace(state, warmup=warmup, fit_capped=fit_capped)
        if stage not in ("decay", "end"):
            return state
        state = replace(state, forced=self._forced(state, history, "train"), end=start)
        if stage == "end":
            return state
        length, floor = self.rule.decay_plan(history, state.starts["train"], start)
        tried = self._unpaid_phase(state, history, start)
        if tried:  # the halved phase that did not pay is the start of the low-rate tail
            planned = self.rule.decay_plan(history, state.starts["train"], start - tried)[0]
            length = max(1, planned - tried)
        end = start + min(max(1, length), self._room(start))
        decay = None
        if self.decay:  # from the halved (or continued) rate to the same floor of lr
            floor = min(1.0, floor * 2 ** len(state.halvings) / self.rate_from)
            decay = InverseTimeDecay(end, start=start / end, floor=floor)
        return replace(state, end=end, decay=decay)

    def _room(self, start: int) -> int:
        """The epochs over every row the budget has room for after ``start`` epochs."""
        return (self.max_epochs - start) * self.steps_per_epoch // self.steps_given_back

    def _forced(self, state: RunState, history: History, stage: str) -> str | None:
        """The run's forced stage, ``stage`` where the budget, not the rule, ended it."""
        return (state.forced or stage) if self._cut(state, history, stage) else state.forced

    def _cut(self, state: RunState, history: History, stage: str) -> bool:
        """Whether its share of the budget, not its test, ended ``stage`` (now ending)."""
        return self._capped(history, stage) and not self._done(
            state, history, stage, state.starts[stage]
        )

    def restores_best(self, done: int) -> bool:
        """Whether the parameters take the full-rate stage's best-scoring average now.

        After ``done`` epochs, where the rule reads scores and the run's last stage begins
        with the next epoch (:meth:`~pyro_bbb.training.scoring.IterateAverage.restore_best`),
        or a halved phase does: it starts from the stage's best rather than its last iterates.
        """
        state = self.state
        return (
            self.rule.reads_scores
            and state.forced is None
            and (state.starts.get(self._successor("train")) == done or done in state.halvings)
        )

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
        state = RunState({})
        for epoch, stage in enumerate(history.stage):
            if stage not in state.starts:
                state = self._begin(state, stage, _first(history, epoch))
            elif self.halves and stage == "train" and _lowered(history.lr, epoch):
                state = replace(state, halvings=(*state.halvings, epoch))  # only a halving
        self._apply(self._next(state, history), None)

    # ---------------------------------------------------------------- the end
    def stopped(self, history: History) -> str:
        """Why the run ended, in a sentence or two (``History.stopped``)."""
        ended = self._ended(history)
        if self.state.fit_capped and self.state.forced is None:
            share = f"{STAGE_TABLE['fit'].cap:.0%}"
            ended += (
                f"; the likelihood-only stage (beta = 0) had ended at its share of the budget "
                f"({share}, {self.state.starts['warmup']:,} epochs) before its test passed"
            )
        return ended

    def _ended(self, history: History) -> str:
        """Why the run ended, the likelihood-only stage's cap aside."""
        state = self.state
        train, after = state.starts.get("train"), state.after()
        if state.forced is not None:
            stage = state.forced
            start = state.starts[stage]
            end = state.starts.get(STAGE_TABLE[stage].then, len(history))
            moving = self.rule.judge(history, stage, start, end, self.scored).found
            steps = self.max_epochs * self.steps_per_epoch
            kept = self.gives_back and "decay" not in state.starts
            return (
                f"the budget of {self.max_epochs:,} epochs ({steps:,} steps) ended "
                f"{STAGE_TABLE[stage].called} before its test passed: {moving}; pass "
                f"max_steps={2 * steps:,} to give it more"
                + ("; the held-out rows were not given back" if kept else "")
            )
        if train is None or after is None:
            return f"stopped during the {state.stage(len(history) - 1)!r} stage"
        phase = state.phase_start(after - 1)
        ended = self.rule.judge(history, "train", phase, after, self.scored).found
        if state.halvings:
            at = ", ".join(f"{epoch:,}" for epoch in state.halvings)
            ended += (
                f" at 1/{2 ** len(state.halvings)} of the rate (halved after epochs {at}, "
                "each from the best average before it)"
            )
        best = best_epoch(history, phase, after, self.scored) if self.rule.reads_scores else None
        if best is not None:
            ended += f"; the stage's best average (epoch {best:,}) kept"
        last = len(history) - after
        if not last and self._successor("train") == "decay":
            what = "the held-out rows were not given back" if self.gives_back else "no decay"
            return f"ended when {ended}; the budget left no room for an epoch more ({what})"
        if not last:
            return f"ended when {ended}"
        rows = "on every row, the held-out ones given back" if self.gives_back else "on every row"
        rate = "the rate decayed" if state.decay is not None else "it trained on"
        epochs = "epoch" if last == 1 else "epochs"
        return f"ended when {ended}; then {rate} over {last:,} {epochs} {rows}"

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
        train, after = self.state.starts.get("train"), self.state.after()
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
