r"""When a stage of an automatic run is done: two rules, read off the :class:`~pyro_bbb.History`.

An automatic run (``fit(epochs=None)``, :mod:`~pyro_bbb.training.auto_epochs`) trains in
stages and asks, at the end of its epochs, whether the current one is done. Two questions
can be asked, and ``fit(until=...)`` picks one:

* ``"predictive"`` (the default), :class:`StopsPaying`: **do further steps still pay?** It
  reads the scores of the recent iterates' average (:mod:`~pyro_bbb.training.scoring`),
  and asks what the last half of a stage bought, so that the patience grows with the stage
  and the rule is the same on ten points or sixty thousand (early stopping with a relative
  patience: Prechelt 1998, "Early stopping — but when?"; a cost-aware end in the spirit of
  Welandawe et al. 2022, "Robust, Automated, and Accurate Black-box Variational
  Inference": going on as long again would double the stage's cost for at most as
  little).

  - The likelihood-only stage (β = 0) is done when its last half lowered the β = 1 loss by
    less than :data:`FIT_TOLERANCE` (0.02) nats a data point: fitting the likelihood
    further no longer pays for the KL it costs, the objective that follows. Held longer,
    the scales shrink below the posterior's and the warm-up must undo the overfit.
  - The full-rate stage (β = 1) is done when its last half raised the expected
    log-likelihood of the training rows (or, with ``validation=``, the held-out rows' log
    predictive density) by less than :data:`TOLERANCE` (0.01) nats a row: on a network the
    KL goes on creeping towards the prior for thousands of steps while the fit to the data
    stops improving, or falls (the drift that costs a mean-field posterior its in-between
    uncertainty, and a network of many weights on little data its accuracy).
  - The rate then decays over :data:`DECAY_SHARE` of the run before it (a fixed run's 30 %
    of the whole), to 1 % of ``lr``.

* ``"converged"``, :class:`Converges`: **has the posterior stopped moving?** The strict
  convergence check (:mod:`~pyro_bbb.training.convergence`): the β = 1 loss no longer falls
  and its KL part no longer moves, read off the per-epoch record; it is the question to ask
  of a posterior compared with NUTS or carried to the next task as a prior, and on a
  network it can take tens of thousands of steps. The decay then follows the wander of the
  KL (:meth:`Converges.decay_plan`).

Each rule is a pure function of the History, so a resumed run decides as the
uninterrupted one did. Nothing here trains.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .convergence import (
    LOSS_TOLERANCE,
    MIN_WINDOW,
    autocorrelation_time,
    check_epochs,
    trend,
)
from .history import History

__all__ = [
    "DECAY_SHARE",
    "MIN_FIT_SCORES",
    "MIN_SCORES",
    "TOLERANCE",
    "Converges",
    "StopRule",
    "StopsPaying",
    "Verdict",
    "fit_scores",
]

#: Nats a row (or a data point) the last half of the full-rate stage must gain to go on.
TOLERANCE = 0.01
#: Scores the full-rate stage reads at least before it may end (half of them in each half).
MIN_SCORES = 8
#: Scores the likelihood-only stage reads at least before it may end.
MIN_FIT_SCORES = 4
#: The likelihood-only stage ends when the last half of it lowered the β = 1 loss by less
#: than this many nats a data point.
FIT_TOLERANCE = 0.02
#: The decay's length as a share of the run before it: a fixed run's 30 % of the whole.
DECAY_SHARE = 3 / 7
#: The rate's factor at the end of the predictive rule's decay (a fixed run's floor).
DECAY_FLOOR = 0.01
#: The factor of ``lr`` the strict rule's decay falls to, when the run allows.
STRICT_DECAY_FLOOR = 0.003


class Verdict(NamedTuple):
    """A rule's reading of a stage: whether it is done, and what was found, in words."""

    done: bool
    found: str


class StopRule:
    """When a stage of an automatic run is done, and how its decay runs (see the module)."""

    #: Whether the rule reads the scores of :mod:`~pyro_bbb.training.scoring`.
    reads_scores = False
    #: Whether Adam's moments are zeroed where β reaches its final value.
    resets_moments = True
    #: Each tested stage runs at least this many steps, when the budget allows.
    min_stage_steps = 200

    def judge(self, history: History, stage: str, start: int, end: int, scored: bool) -> Verdict:
        """Read the stage of epochs ``start`` to ``end - 1``: done, and what was found.

        Args:
            history: The run, at least ``end`` epochs.
            stage: ``"fit"`` (β = 0, the likelihood alone) or ``"train"`` (β at its final
                value, the full rate).
            start: The stage's first epoch.
            end: The epoch after the last one read.
            scored: Whether the run scores held-out rows (``History.validation``).
        """
        raise NotImplementedError

    def due(self, length: int) -> bool:
        """Whether a stage ``length`` epochs long is judged now (not every epoch, when long)."""
        return length % max(1, length // self.checks) == 0

    #: About how many times a long stage is judged.
    checks = 100

    def decay_plan(self, history: History, train: int, start: int) -> tuple[int, float]:
        """The decay's length in epochs and its floor (a factor of ``lr``).

        Args:
            history: The run so far.
            train: The first epoch of the stage at β's final value and the full rate.
            start: The decay's first epoch.
        """
        raise NotImplementedError


class StopsPaying(StopRule):
    """``until="predictive"``: done when further steps stop paying (see the module)."""

    reads_scores = True
    resets_moments = False
    min_stage_steps = 400

    def judge(self, history: History, stage: str, start: int, end: int, scored: bool) -> Verdict:  # noqa: D102
        if stage == "fit":
            return _fit_paid_off(history, start, end)
        if scored:
            what, values = "the held-out log-likelihood", history.validation[start:end]
            unit = f"nats a row ({history.held_out} rows, the recent iterates' average)"
        else:
            what, values = (
                "the expected log-likelihood",
                [-v for v in history.averaged_nll[start:end]],
            )
            unit = "nats a data point (training rows, the recent iterates' average)"
        values = [v for v in values if not math.isnan(v)]
        where = f"epochs {start:,}-{end - 1:,}"
        if len(values) < MIN_SCORES:
            return Verdict(False, f"{what} was read {len(values)} time(s) over {where}")
        gain = _change(values[len(values) // 2 :])
        verb = "gained" if gain < TOLERANCE else "was still rising:"
        found = f"{what} {verb} {gain:+.3g} {unit} over the last half of {where}"
        if gain < TOLERANCE:
            return Verdict(True, f"{found}, less than {TOLERANCE:g}")
        return Verdict(False, found)

    def decay_plan(self, history: History, train: int, start: int) -> tuple[int, float]:  # noqa: D102
        return max(1, math.ceil(DECAY_SHARE * start)), DECAY_FLOOR


class Converges(StopRule):
    """``until="converged"``: done when the β = 1 loss and its KL part stopped moving."""

    checks = 20
    #: The decay's longest length, in multiples of the run before it.
    max_decay_multiple = 4

    def judge(self, history: History, stage: str, start: int, end: int, scored: bool) -> Verdict:  # noqa: D102
        length = end - start
        if length < 2 * MIN_WINDOW:
            return Verdict(False, f"epochs {start:,}-{end - 1:,} were too few to check")
        if stage == "fit":
            return _loss_stopped_falling(history, start, end)
        check = check_epochs(history, end - length // 2, end - 1)
        return Verdict(check.converged, check.message)

    def decay_plan(self, history: History, train: int, start: int) -> tuple[int, float]:
        r"""The decay's length and floor, from how slowly the full-rate stage wandered.

        The rate :math:`1/(1 + t/t_0)` lets the parameters follow it down, each rate long
        enough for them to settle there, when :math:`t_0` is at least the time they take to
        forget where they were: the autocorrelation time :math:`\tau` of the KL over the last
        half of the full-rate stage. Falling to :data:`STRICT_DECAY_FLOOR` (0.3 %) then takes
        :math:`332\tau`; faster, they freeze wherever the fall finds them. The decay takes
        that long, at most :attr:`max_decay_multiple` (4) times as many epochs as the run so far,
        and when shorter it stops at the floor :math:`\tau/(\tau + \text{length})`, which
        keeps :math:`t_0 = \tau`.

        The cap was once the run so far: on conjugate regressions whose full-rate stage was
        short (a few hundred epochs, :math:`\tau` of 4-7) it stopped the rate at 0.7-1.1 %
        of ``lr``, where a ``LowRankGuide``'s sds still wander by several per cent (its
        factor :math:`V` moves in Adam's steps of about ``lr``, absolute, against sds of
        :math:`\sigma/\sqrt N`; at the full rate they wander by about 25 %, a mean-field
        guide's, on the log scale, by 6 %): up to 5.1 % off the exact sds. At four times
        the run so far the decay reaches the floor there, and both guides come within 3 %
        (``tests/training/test_stopping.py``).
        """
        window = history.kl[start - (start - train) // 2 : start]
        tau = autocorrelation_time(window) if len(window) >= MIN_WINDOW else 1.0
        cap = math.ceil(self.max_decay_multiple * start)
        length = max(1, min(math.ceil(tau * (1 / STRICT_DECAY_FLOOR - 1)), cap))
        return length, max(STRICT_DECAY_FLOOR, tau / (tau + length))


def fit_scores(history: History, scored: bool) -> list[float]:
    """What the full-rate stage's fit reads per epoch: the held-out or the training fit.

    The held-out rows' score, or the expected log-likelihood of the training sample
    (``-averaged_nll``): a halving is judged by the fit alone, not by the KL, which creeps
    towards the prior for thousands of steps at any rate.
    """
    return history.validation if scored else [-v for v in history.averaged_nll]


def _fit_paid_off(history: History, start: int, end: int) -> Verdict:
    """Whether the averaged β = 1 loss fell by less than :data:`FIT_TOLERANCE` a data point.

    Read over the last half of the likelihood-only stage, from its least-squares line.
    """
    values = [
        n + k
        for n, k in zip(
            history.averaged_nll[start:end], history.averaged_kl[start:end], strict=True
        )
        if not math.isnan(n)
    ]
    where = f"epochs {start:,}-{end - 1:,}"
    if len(values) < MIN_FIT_SCORES:
        return Verdict(False, f"the beta = 1 loss was read {len(values)} time(s) over {where}")
    fall = -_change(values[len(values) // 2 :])
    found = (
        f"the beta = 1 loss of the recent iterates' average fell by {fall:.3g} nats a data "
        f"point over the last half of {where}, against {values[0] - min(values):.3g} since "
        "the stage began"
    )
    if fall < FIT_TOLERANCE:
        return Verdict(True, f"{found}: less than {FIT_TOLERANCE:g}, fitting the likelihood "
                       "alone had stopped paying")  # fmt: skip
    return Verdict(False, found)


def _loss_stopped_falling(history: History, start: int, end: int) -> Verdict:
    """Whether the β = 1 loss is known to fall by less than 0.01 nats a data point.

    Asked of the upper 95 % bound of its fall over the stage's last half (the strict
    check's question: is it known to have stopped).
    """
    half = history.plain_loss[start + (end - start) // 2 : end]
    tolerance = LOSS_TOLERANCE * history.num_data
    where = f"over epochs {end - len(half):,}-{end - 1:,}"
    if len(half) < MIN_WINDOW:
        return Verdict(False, f"the beta = 1 loss was read too few times {where} to judge")
    fall = trend(half).fall_bound()
    found = (
        f"the beta = 1 loss (History.plain_loss) fell by at most {fall:.3g} nats {where}, "
        f"against {tolerance:.3g} (0.01 a data point)"
    )
    return Verdict(fall < tolerance, found)


def _change(values: list[float]) -> float:
    """What the stretch of ``values`` bought: their least-squares slope times their number.

    Each reading closes one scoring interval, so ``n`` readings span ``n`` intervals of the
    stage (the first of them opened by the reading before the stretch): readings
    ``0, 1, 2, 3`` of a line rising by 1 an interval are a stretch over which it rose by 4.
    A rule reads the last half of a stage with it, the change over that half's length.
    """
    v = np.asarray(values, dtype=np.float64)
    t = np.arange(len(v)) - (len(v) - 1) / 2
    return float(t @ (v - v.mean()) / (t @ t)) * len(v)
