r"""Whether a fit has converged, read from its :class:`~pyro_bbb.History`: the convergence check.

A fit has converged when the β = 1 objective has stopped falling and the posterior has
stopped moving. Both are read off the per-epoch record, where the learning rate was at its
height: a rate that has since decayed freezes the parameters wherever it finds them, so a run
that is still flat at its end says nothing about whether it had arrived.

* **The objective**, ``History.plain_loss`` (:math:`\text{nll} + \text{kl}`, the negative
  β = 1 ELBO, whatever β trained it), must have stopped falling: with 95 % confidence its
  fitted trend falls by less than :data:`LOSS_TOLERANCE` (0.01) nats per data point across
  the window. A short window or a noisy loss cannot show that, so a fit cut short is caught
  even when its loss looks flat in the noise.
* **Its KL part**, ``History.kl``, must not move either way, significantly and by more
  than three times its epoch-to-epoch scatter (a drift smaller than the wander about it is
  not worth training on for). Near the optimum the objective is flat to first order (its
  gradient vanishes) while its two parts still trade off linearly: scales that are 30 %
  too wide cost the β = 1 ELBO a fraction of a nat on a linear regression, below what one
  Monte Carlo estimate resolves, but move the KL by nats. The KL of this package's guides
  is in closed form, free of Monte Carlo noise, so its drift is seen long before the
  objective's.

A trend is a least-squares line whose standard error allows for the autocorrelation of the
epochs (the residuals' integrated autocorrelation time; Geyer 1992): parameters that wander at
a constant rate make neighbouring epochs alike, and a test that took them as independent
would find trends in the wander. The check needs at least :data:`MIN_WINDOW` epochs; a
shorter run is reported as not converged.

:func:`check_convergence` runs it on any History; :func:`~pyro_bbb.fit` runs it at the end
of every fit, records the result as ``History.convergence`` and warns with
:class:`ConvergenceWarning` when it fails. Nothing here trains.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .history import History

__all__ = [
    "LOSS_TOLERANCE",
    "MIN_WINDOW",
    "Convergence",
    "ConvergenceWarning",
    "Trend",
    "autocorrelation_time",
    "check_convergence",
    "check_epochs",
    "convergence_warning",
    "trend",
    "warn_if_not_converged",
]

#: The fewest epochs a trend is fitted to.
MIN_WINDOW = 10
# Student's t quantiles by degrees of freedom (the largest tabulated at or below the
# effective number): the two-sided 95 % test (a part that must not move either way) and
# the one-sided 95 % one (an objective that must not fall); None stands for infinity.
_T_QUANTILES = (
    (1, 12.706, 6.314), (2, 4.303, 2.920), (3, 3.182, 2.353), (4, 2.776, 2.132),
    (5, 2.571, 2.015), (6, 2.447, 1.943), (8, 2.306, 1.860), (10, 2.228, 1.812),
    (15, 2.131, 1.753), (20, 2.086, 1.725), (30, 2.042, 1.697), (60, 2.000, 1.671),
    (None, 1.960, 1.645),
)  # fmt: skip
#: A KL trend matters when it moves the KL by more than this many times its scatter: a
#: drift smaller than the wander about it is not worth training on for. It also guards the
#: test when the autocorrelation time is long against the window (its estimate is then low).
_MATERIAL = 3.0
#: The β = 1 loss has stopped falling when its fall across the window is, with 95 %
#: confidence, less than this many nats per data point.
LOSS_TOLERANCE = 0.01
#: The window's rate must be at least this fraction of the highest rate at the final β.
_FULL_RATE = 0.5


class ConvergenceWarning(UserWarning):
    """A fit ended before the β = 1 objective stopped improving (as scikit-learn warns).

    The message says what moved, by how much, over which epochs, and what to change.
    """


class Trend(NamedTuple):
    r"""The fitted linear trend of one per-epoch quantity over a window.

    Attributes:
        change: The trend's change across the window, slope × epochs (nats).
        se: Its standard error, allowing for the autocorrelation of the epochs (nats).
        scatter: The standard deviation of the epochs about the line (nats): how far one
            epoch's value strays.
        epochs: Epochs in the window.
        dof: The effective degrees of freedom of the residuals, epochs over their
            autocorrelation time, less two.
    """

    change: float
    se: float
    scatter: float
    epochs: int
    dof: float

    def fall_bound(self) -> float:
        """The upper 95 % confidence bound of its fall across the window (nats).

        Negative when it rises significantly; large when the window is short against its
        noise, however flat it looks: a small bound is evidence that it has stopped falling,
        not merely the absence of evidence that it falls.
        """
        return -self.change + _quantile(self.dof, one_sided=True) * self.se

    def moving(self) -> bool:
        """Whether it moves significantly (two-sided 95 %) and by more than 3 times its scatter."""
        bound = max(_quantile(self.dof, one_sided=False) * self.se, _MATERIAL * self.scatter)
        return abs(self.change) > bound


def _quantile(dof: float, *, one_sided: bool) -> float:
    value = _T_QUANTILES[0]
    for row in _T_QUANTILES:
        if row[0] is None or row[0] <= dof:
            value = row
    return value[2] if one_sided else value[1]


def trend(values: Sequence[float]) -> Trend:
    r"""The least-squares line through ``values`` (one per epoch), with an honest error.

    The slope :math:`b` of the line through :math:`(t, v_t)` has standard error
    :math:`\sqrt{\tau s^2 / \sum_t (t - \bar t)^2}`, where :math:`s^2` is the residuals'
    variance and :math:`\tau` their integrated autocorrelation time
    (:func:`autocorrelation_time`): parameters wandering at a constant rate make
    neighbouring epochs alike, and a test that took them as independent would find trends
    in the wander. The degrees of freedom are :math:`n/\tau - 2`.

    Args:
        values: At least :data:`MIN_WINDOW` finite numbers, one per epoch.

    Returns:
        The :class:`Trend`.

    Raises:
        ValueError: If there are fewer than :data:`MIN_WINDOW` values, or one is not finite.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or len(v) < MIN_WINDOW:
        raise ValueError(f"a trend needs at least {MIN_WINDOW} epochs, got {len(v)}")
    if not np.isfinite(v).all():
        raise ValueError("a trend needs finite values")
    n = len(v)
    t = np.arange(n) - (n - 1) / 2
    slope = float(t @ (v - v.mean()) / (t @ t))
    residuals = v - v.mean() - slope * t
    scatter = float(np.sqrt(residuals @ residuals / (n - 2)))
    tau = autocorrelation_time(residuals)
    se = scatter * math.sqrt(tau / float(t @ t))
    return Trend(slope * n, se * n, scatter, n, n / tau - 2)


def autocorrelation_time(values: Sequence[float]) -> float:
    r"""The integrated autocorrelation time of ``values``, in epochs (at least 1).

    :math:`\tau = 1 + 2\sum_{k \ge 1} \rho_k`, summed over Geyer's (1992) initial positive
    sequence (pairs :math:`\rho_{2m} + \rho_{2m+1}` while they are positive), from the
    sample autocorrelations of the series. For the KL of a fit at a constant rate it is the
    time the parameters take to forget where they were: how slowly they wander.

    Args:
        values: At least :data:`MIN_WINDOW` finite numbers, one per epoch.

    Returns:
        :math:`\tau`; 1 for a constant series.
    """
    v = np.asarray(values, dtype=np.float64)
    if len(v) < MIN_WINDOW:
        raise ValueError(
            f"an autocorrelation time needs at least {MIN_WINDOW} epochs, got {len(v)}"
        )
    v = v - v.mean()
    n = len(v)
    spectrum = np.fft.rfft(v, 2 * n)
    acov = np.fft.irfft(spectrum * np.conj(spectrum))[:n]
    if acov[0] <= 0:
        return 1.0
    rho = acov / acov[0]
    total = 0.0
    for k in range(0, n - 1, 2):
        pair = rho[k] + rho[k + 1]
        if pair <= 0:
            break
        total += pair
    return max(1.0, 2 * total - 1)


@dataclass(frozen=True)
class Convergence:
    """The convergence check of one fit (``History.convergence``).

    Attributes:
        converged: Whether the β = 1 objective had stopped falling and its KL part had
            stopped moving over the window.
        window: The first and last epoch read (0-based, inclusive); ``None`` when the run
            was too short to read.
        loss: The trend of ``History.plain_loss`` over the window.
        kl: The trend of ``History.kl`` over the window.
        message: What was found, in a sentence or two, with what to change when it failed.
    """

    converged: bool
    window: tuple[int, int] | None
    loss: Trend | None
    kl: Trend | None
    message: str


def check_convergence(history: History, *, advice: str | None = None) -> Convergence:
    """Check a fit's History for convergence of the β = 1 objective.

    The window is the last half of the epochs trained at the final β with the learning
    rate at least half its highest value there (``History.lr``): with ``fit``'s default
    schedules, the stretch at the plain ELBO before the rate decays. When that half holds
    fewer than :data:`MIN_WINDOW` epochs the whole stretch is read, then every epoch at the
    final β, and a run with fewer is not converged.

    Args:
        history: The record of a fit, at least one epoch.
        advice: What to change, appended to the message of a failed check; ``None`` for
            :func:`~pyro_bbb.fit`'s own advice.

    Returns:
        The :class:`Convergence`.

    Raises:
        ValueError: If ``history`` holds no epoch.
    """
    if not len(history):
        raise ValueError("history holds no epoch to check")
    first, last = _window(history)
    advice = _ADVICE if advice is None else advice
    if last - first + 1 < MIN_WINDOW:
        final = len(history) - _final_beta_start(history)
        return Convergence(
            False, None, None, None,
            f"the fit has {final} epoch(s) at its final beta, too few to tell whether it "
            f"converged (the check reads at least {MIN_WINDOW}); {advice}",
        )  # fmt: skip
    return check_epochs(history, first, last, advice=advice)


def check_epochs(history: History, first: int, last: int, *, advice: str = "") -> Convergence:
    """The convergence check on epochs ``first`` to ``last`` (inclusive) of ``history``.

    Converged when the β = 1 loss has stopped falling, its fall across the window being
    below :data:`LOSS_TOLERANCE` nats per data point with 95 % confidence
    (:meth:`Trend.fall_bound`), and the KL does not move (:meth:`Trend.moving`).

    Args:
        history: The record of a fit.
        first: The first epoch read (0-based).
        last: The last epoch read; at least :data:`MIN_WINDOW` epochs in all.
        advice: What to change, appended to the message of a failed check.

    Returns:
        The :class:`Convergence`.
    """
    loss = trend(history.plain_loss[first : last + 1])
    kl = trend(history.kl[first : last + 1])
    tolerance = LOSS_TOLERANCE * history.num_data
    where = f"over epochs {first:,}-{last:,}"
    if loss.fall_bound() >= tolerance:
        found = (
            f"the beta = 1 loss (History.plain_loss) may still have been falling {where}: it "
            f"changed by {loss.change:+.3g} nats (s.e. {loss.se:.2g}), and a fall of "
            f"{LOSS_TOLERANCE:g} nats a data point ({tolerance:.3g}) is not ruled out"
        )
    elif kl.moving():
        found = (
            f"the KL was still {'rising' if kl.change > 0 else 'falling'} {where}: by "
            f"{abs(kl.change):.3g} nats (s.e. {kl.se:.2g}, scatter {kl.scatter:.2g}), "
            "so the posterior was still moving while the beta = 1 loss looked flat"
        )
    else:
        message = (
            f"converged: {where} the beta = 1 loss changed by {loss.change:+.3g} nats "
            f"(s.e. {loss.se:.2g}) and the KL by {kl.change:+.3g} (s.e. {kl.se:.2g})"
        )
        return Convergence(True, (first, last), loss, kl, message)
    return Convergence(False, (first, last), loss, kl, f"{found}; {advice}" if advice else found)


_ADVICE = (
    "train longer: more epochs (fit's default beta warm-up and rate decay are drawn over "
    'them), or epochs=None with until="converged", which trains until this check passes '
    "(epochs=None alone stops once more training stops improving the predictive)"
)


def convergence_warning(convergence: Convergence) -> str | None:
    """The message to warn with when the check failed, else ``None``."""
    return None if convergence.converged else f"fit did not converge: {convergence.message}"


def warn_if_not_converged(convergence: Convergence, *, stacklevel: int = 2) -> None:
    """Warn with :class:`ConvergenceWarning` and the check's message if it failed."""
    message = convergence_warning(convergence)
    if message is not None:
        warnings.warn(message, ConvergenceWarning, stacklevel=stacklevel + 1)


def _final_beta_start(history: History) -> int:
    """The first epoch of the run's last stretch at its final β."""
    final = history.beta[-1]
    start = len(history) - 1
    while start > 0 and math.isclose(history.beta[start - 1], final, rel_tol=1e-9, abs_tol=1e-12):
        start -= 1
    return start


def _window(history: History) -> tuple[int, int]:
    """The epochs the check reads, ``(first, last)`` inclusive (see :func:`check_convergence`)."""
    start = _final_beta_start(history)
    rates = np.asarray(history.lr[start:], dtype=np.float64)
    rates = np.where(np.isfinite(rates), rates, 1.0)  # checkpoints of old versions: no rates
    full = np.flatnonzero(rates >= _FULL_RATE * rates.max())
    end = start + int(full[-1])  # the last epoch at the full rate
    half = (end - start + 1) // 2
    for first, last in ((end - half + 1, end), (start, end), (start, len(history) - 1)):
        if last - first + 1 >= MIN_WINDOW:
            return first, last
    return start, len(history) - 1
