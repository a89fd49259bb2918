r"""Learning-rate schedules for :func:`~pyro_bbb.fit`: a factor of the epoch, or torch's own.

A schedule is either

* a callable of the epoch ``t`` (fractional within an epoch, as β's schedules are) returning
  a factor that multiplies each parameter group's initial learning rate, applied before every
  step; a number is a constant factor; :class:`InverseTimeDecay` (the default) and
  :class:`CosineDecay` hold the rate, then decay it; or
* a ``torch.optim.lr_scheduler.LRScheduler`` class, or a ``functools.partial`` of one with its
  options (``partial(StepLR, step_size=100)``), built on fit's optimiser and stepped at the
  end of every epoch, as torch's schedulers expect.

:class:`LRSchedule` drives either kind through one fit and carries its state into a
checkpoint. Why the default decays: with one Monte Carlo sample per step, a constant
learning rate leaves the variational parameters jittering around their optimum by an amount
that grows with the rate (Adam's steps do not shrink as the gradient's mean does), and the
posterior standard deviations read off the last iterate are off by tens of percent on a
conjugate problem; decaying the rate over the last half of the run, once β has reached 1,
lets them settle (``docs/concepts.md`` has the measurements).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from .._validation import check_nonnegative_number, check_positive_number

__all__ = ["CosineDecay", "InverseTimeDecay", "LRSchedule", "LRScheduleLike"]

LRScheduleLike = (
    float | Callable[[float], float] | type[LRScheduler] | functools.partial[LRScheduler]
)
"""What ``fit(lr_schedule=...)`` takes: a factor, a callable of the epoch, or a torch
scheduler class (or a ``functools.partial`` of one)."""


@dataclass(frozen=True)
class _DelayedDecay:
    """Factor 1 for the first ``start`` of the epochs, then a decay to ``floor``.

    A subclass gives the decay as a function of the fraction ``u`` in [0, 1] of the
    remaining epochs done (``_decay``).
    """

    epochs: float
    start: float
    floor: float

    def __post_init__(self) -> None:
        _check_decay(self.epochs, self.start, self.floor)

    def __call__(self, epoch: float) -> float:
        """The factor at epoch ``epoch`` (fractional)."""
        begin = self.start * self.epochs
        if epoch <= begin:
            return 1.0
        return self._decay(min((epoch - begin) / (self.epochs - begin), 1.0))

    def _decay(self, u: float) -> float:
        raise NotImplementedError


@dataclass(frozen=True)
class CosineDecay(_DelayedDecay):
    r"""Factor 1, then a half cosine down to ``floor`` over the last part of the epochs.

    .. math::

        f(t) = \begin{cases} 1 & t < sE \\ \phi + (1 - \phi)\,\tfrac12\big(1 + \cos \pi
            \tfrac{t - sE}{(1 - s)E}\big) & t \ge sE \end{cases}

    with ``start`` :math:`s`, ``floor`` :math:`\phi` and ``epochs`` :math:`E` (Loshchilov and
    Hutter 2017, https://arxiv.org/abs/1608.03983, without restarts).

    Args:
        epochs: :math:`E`, the length of the fit.
        start: Fraction of the epochs at the full rate before the decay begins.
        floor: The factor reached at the last epoch.
    """

    epochs: float
    start: float = 0.5
    floor: float = 0.01

    def _decay(self, u: float) -> float:
        return self.floor + (1 - self.floor) * 0.5 * (1 + math.cos(math.pi * u))


@dataclass(frozen=True)
class InverseTimeDecay(_DelayedDecay):
    r"""Factor 1, then :math:`1/(1 + a u)` down to ``floor`` over the last part of the epochs.

    .. math::

        f(t) = \begin{cases} 1 & t < sE \\ \dfrac{1}{1 + (1/\phi - 1)\,u} &
            u = \dfrac{t - sE}{(1 - s)E} \in [0, 1] \end{cases}

    with ``start`` :math:`s`, ``floor`` :math:`\phi` and ``epochs`` :math:`E`. A rate that
    falls as the inverse of the steps taken is the classical stochastic-approximation
    schedule (Robbins and Monro 1951): it averages the gradient noise away at the rate the
    noise allows, where a cosine spends its last steps at rates too small to move the
    parameters. ``fit``'s default, ``start=0.7``: under ``fit``'s default β, which reaches 1
    half-way, the scales need a few hundred steps at the full rate to move from where the
    β < 1 phase left them before the rate falls.

    Args:
        epochs: :math:`E`, the length of the fit.
        start: Fraction of the epochs at the full rate before the decay begins.
        floor: The factor reached at the last epoch.
    """

    epochs: float
    start: float = 0.7
    floor: float = 0.01

    def _decay(self, u: float) -> float:
        return 1.0 / (1.0 + (1.0 / self.floor - 1.0) * u)


def _check_decay(epochs: float, start: float, floor: float) -> None:
    check_positive_number("epochs", epochs)
    if not 0 <= start < 1:
        raise ValueError(f"start must be in [0, 1), got {start!r}")
    if not 0 < floor <= 1:
        raise ValueError(f"floor must be in (0, 1], got {floor!r}")


def _is_scheduler_class(spec: object) -> bool:
    target = spec.func if isinstance(spec, functools.partial) else spec
    return isinstance(target, type) and issubclass(target, LRScheduler)


class LRSchedule:
    """One fit's learning-rate schedule over its optimiser.

    Args:
        spec: A factor, a callable of the epoch returning a factor, or a torch scheduler
            class (or a ``functools.partial`` of one).
        optimizer: The fit's optimiser; its groups' ``initial_lr`` is set to their ``lr``.

    Raises:
        TypeError: If ``spec`` is none of these, or a callable's factor is not a number.
        ValueError: If a factor is negative or not finite.
    """

    def __init__(self, spec: LRScheduleLike, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            rate = group["lr"]  # a number; a tensor is written in place, so not kept as it
            group.setdefault("initial_lr", float(rate) if isinstance(rate, torch.Tensor) else rate)
        self.scheduler: LRScheduler | None = None
        self.factor: Callable[[float], float] | None = None
        self._lr = float(optimizer.param_groups[0]["lr"])  # the rate, while it is a tensor
        if _is_scheduler_class(spec):
            self.scheduler = spec(optimizer)
        elif isinstance(spec, (int, float)) and not isinstance(spec, bool):
            value = check_nonnegative_number("lr_schedule", spec)
            self.factor = lambda epoch: value
        elif callable(spec):
            self.factor = spec
            self._check_factor(0.0)
        else:
            raise TypeError(
                "lr_schedule must be a number, a callable of the epoch returning a factor of "
                "lr, or a torch.optim.lr_scheduler class (or functools.partial of one); got "
                f"{spec!r}"
            )

    def _check_factor(self, epoch: float) -> float:
        try:
            value = self.factor(epoch)
        except Exception as error:
            raise TypeError(
                f"lr_schedule({epoch}) failed: a callable lr_schedule takes the epoch and "
                "returns a factor of lr (pass a torch scheduler as its class, or a "
                "functools.partial of it)"
            ) from error
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"lr_schedule({epoch}) must return a number (a factor of lr), got {value!r}"
            )
        return check_nonnegative_number(f"lr_schedule({epoch})", value)

    def before_step(self, epoch: float) -> None:
        """Set every group's rate for the step at ``epoch`` (a callable schedule)."""
        if self.factor is None:
            return
        factor = self.factor(epoch)
        for group in self.optimizer.param_groups:
            rate = group["initial_lr"] * factor
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(rate)  # in place: a captured step reads it there
            else:
                group["lr"] = rate
        self._lr = self.optimizer.param_groups[0]["initial_lr"] * factor

    def after_epoch(self) -> None:
        """Step a torch scheduler at the end of an epoch."""
        if self.scheduler is not None:
            self.scheduler.step()
            self._lr = float(self.optimizer.param_groups[0]["lr"])  # one read an epoch

    @property
    def lr(self) -> float:
        """The current learning rate of the first parameter group (read from the host)."""
        rate = self.optimizer.param_groups[0]["lr"]
        return self._lr if isinstance(rate, torch.Tensor) else float(rate)

    @property
    def holds_in_tensors(self) -> bool:
        """Whether every group's rate is a tensor set in place (:meth:`hold_in_tensors`).

        False again after the optimiser's state was loaded (``load_state_dict`` gives the
        rates back as numbers).
        """
        return all(isinstance(group["lr"], torch.Tensor) for group in self.optimizer.param_groups)

    def hold_in_tensors(self) -> None:
        """Keep every group's rate in a tensor on its parameters' device, set in place.

        What a step captured as a CUDA graph needs: the rate is read on the device when the
        graph is replayed, so the schedule moves it by writing into the tensor (a torch
        scheduler does too). On CUDA the tensor is float32 (what the fused Adam kernel
        reads) and the group is marked ``capturable``; on the CPU it is float64, the rate
        exactly. The optimiser's ``state_dict`` keeps giving the rates as numbers, so a
        checkpoint resumes with any optimiser set-up.
        """
        groups = self.optimizer.param_groups
        if self.holds_in_tensors:
            return
        capturable = [group.get("capturable") for group in groups]
        for group in groups:
            device = group["params"][0].device
            dtype = torch.float32 if device.type == "cuda" else torch.float64
            group["lr"] = torch.tensor(float(group["lr"]), dtype=dtype, device=device)
            if device.type == "cuda" and "capturable" in group:
                group["capturable"] = True
        self._lr = float(groups[0]["lr"])

        def as_numbers(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
            for group, flag in zip(state["param_groups"], capturable, strict=True):
                group["lr"] = float(group["lr"])
                if flag is not None:
                    group["capturable"] = flag
            return state

        self.optimizer.register_state_dict_post_hook(as_numbers)

    def state_dict(self) -> dict[str, Any]:
        """A torch scheduler's state (a callable schedule has none: the epoch decides).

        Rates held in tensors (:meth:`hold_in_tensors`) are written as numbers.
        """
        if self.scheduler is None:
            return {}
        state = self.scheduler.state_dict()
        if "_last_lr" in state:
            state["_last_lr"] = [float(rate) for rate in state["_last_lr"]]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave."""
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state)
