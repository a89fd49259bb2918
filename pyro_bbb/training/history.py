"""The per-epoch record of a fit: :class:`History`.

:func:`~pyro_bbb.fit` appends one entry per epoch to every list; nothing here trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

__all__ = ["EpochRecord", "History"]


class _Check(Protocol):
    """What a History reads of the convergence check it holds: whether the check passed.

    The check, :class:`~pyro_bbb.training.convergence.Convergence`, is made by reading a
    History; naming it here, even for type checking only, would import back a module that
    imports this one.
    """

    @property
    def converged(self) -> bool:
        """Whether the fit passed the check."""
        ...


class EpochRecord(NamedTuple):
    """One epoch of a fit, as :class:`~pyro_bbb.History` records it.

    ``loss``, ``nll`` and ``kl`` are the means over the epoch's steps (and over processes),
    ``beta`` and ``lr`` the mean β and learning rate, ``seconds`` the epoch's wall-clock time
    and ``steps`` the optimiser steps taken by its end, counted from the start of the fit.
    """

    loss: float
    nll: float
    kl: float
    beta: float
    lr: float
    seconds: float
    steps: int


@dataclass
class History:
    r"""Per-epoch record of a fit; every list has one entry per epoch.

    Losses are whole-data-set quantities: the mean over the epoch's steps of the minibatch
    estimates, each of which is unbiased for the full-batch value.

    Attributes:
        loss: Negative β-annealed ELBO, :math:`\text{nll} + \beta\,\text{kl}` (nats).
        loss_per_datum: ``loss / num_data`` (nats per data point).
        nll: Expected negative log-likelihood of the training set (nats).
        kl: :math:`\mathrm{KL}(q \| p)` (nats), not weighted by β.
        beta: Mean β over the epoch.
        lr: Mean learning rate of the optimiser's first parameter group over the epoch.
        seconds: Wall-clock seconds per epoch.
        steps: Optimiser steps taken by the end of each epoch (cumulative).
        collapsed: Fraction of weights whose posterior marginal is within 0.05 nats (KL) of
            its prior at the end of the epoch; ``nan`` for a guide whose marginals are not
            known. Most weights at the prior while the noise explains the targets is
            posterior collapse (see :class:`~pyro_bbb.PosteriorCollapseWarning`).
        stage: The stage of an automatic run (``fit(epochs=None)``) each epoch was in:
            ``"fit"`` (β = 0), ``"warmup"``, ``"train"`` (full rate) or ``"decay"``; ``""``
            in a run of fixed length.
        validation: The log predictive density of the held-out rows after each epoch, in
            nats a row, of the recent iterates' average (:mod:`~pyro_bbb.training.scoring`),
            where an automatic run scored them; ``nan`` where not.
        averaged_nll: The expected negative log-likelihood per data point of the recent
            iterates' average, on a fixed sample of the training rows, where an automatic
            run scored it (:mod:`~pyro_bbb.training.scoring`); ``nan`` where not.
        averaged_kl: Its KL per data point, read with ``averaged_nll``; their sum is the
            average's β = 1 loss per data point.
        num_data: Number of training points ``N``.
        num_particles: Weight samples per step (what ``fit``'s ``num_particles=None``
            resolved to, or the number passed).
        held_out: Rows an automatic run scores (``validation``): those of a fraction held
            out of the steps and given back for its last stage, or those of a pair
            ``(x_val, y_val)`` (nothing held out then); 0 when it scores none.
        stopped: Why the run ended, in a sentence or two (``""`` until it has).
        draws: How several weight draws reach the network: broadcast through its layers,
            or around it once per draw, vectorised by ``torch.func.vmap`` or one after
            another (see :mod:`pyro_bbb.nn.draws`); decided at the fit's set-up.
        until: The question an automatic run ended on: ``"predictive"`` (fit's default,
            further steps stopped paying on the predictive; the posterior's sds may still be
            far from their optimum) or ``"converged"`` (the strict check of the β = 1 loss
            and its KL); ``None`` for a run of fixed length. ``fit`` also leaves it on the
            guide as ``guide.fit_until``, where :func:`~pyro_bbb.to_inference_data` and
            :func:`~pyro_bbb.compare` read it.
        convergence: The convergence check of the fit's end
            (:class:`~pyro_bbb.training.convergence.Convergence`: ``converged``, the epochs
            read, the trends and a message), or ``None`` before ``fit`` has checked.
        continues: How the fit this one continued ended, where ``fit`` was given a fitted
            guide (its ``guide.fit_end``, a
            :class:`~pyro_bbb.training.continuation.FitEnd`: β, the rate, epochs, steps,
            why it stopped): this fit started from there, β at that fit's final value and
            the rate where it left it (:mod:`~pyro_bbb.training.continuation`); ``None``
            for a fit from the start. Its lists count this fit's epochs and steps alone.
    """

    num_data: int
    num_particles: int = 1
    draws: str = ""
    held_out: int = 0
    stopped: str = ""
    until: str | None = None
    loss: list[float] = field(default_factory=list)
    loss_per_datum: list[float] = field(default_factory=list)
    nll: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    beta: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    collapsed: list[float] = field(default_factory=list)
    stage: list[str] = field(default_factory=list)
    validation: list[float] = field(default_factory=list)
    averaged_nll: list[float] = field(default_factory=list)
    averaged_kl: list[float] = field(default_factory=list)
    convergence: _Check | None = None
    continues: Mapping[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.loss)

    @property
    def elbo(self) -> list[float]:
        """The β-annealed ELBO per epoch, ``-loss``."""
        return [-v for v in self.loss]

    @property
    def plain_loss(self) -> list[float]:
        """The negative plain (β = 1) ELBO per epoch, ``nll + kl``, whatever β trained it.

        The objective a posterior is judged by: compare fits (schedules, restarts, initial
        σ) by its last values, not by :attr:`loss`, which is weighted by the epoch's β.
        """
        return [n + k for n, k in zip(self.nll, self.kl, strict=True)]

    @property
    def converged(self) -> bool | None:
        """Whether the fit passed its convergence check; ``None`` before it was checked."""
        return None if self.convergence is None else self.convergence.converged

    def append_epoch(
        self, record: EpochRecord, collapsed: float, stage: str, scores: tuple[float, float, float]
    ) -> None:
        """Append one epoch to every list: its record, collapse, stage and scores read.

        Args:
            record: The epoch's means (loss, nll, kl, β, rate), seconds and steps so far.
            collapsed: The fraction of weights at their prior after it.
            stage: Its stage in an automatic run (``""`` in a fixed one).
            scores: The averaged nll and KL and the held-out log-likelihood read after it
                (``nan`` where nothing was read).
        """
        self.loss.append(record.loss)
        self.loss_per_datum.append(record.loss / self.num_data)
        self.nll.append(record.nll)
        self.kl.append(record.kl)
        self.beta.append(record.beta)
        self.lr.append(record.lr)
        self.seconds.append(record.seconds)
        self.steps.append(record.steps)
        self.collapsed.append(collapsed)
        self.stage.append(stage)
        self.averaged_nll.append(scores[0])
        self.averaged_kl.append(scores[1])
        self.validation.append(scores[2])

    def as_dict(self) -> dict[str, list[float] | list[int] | list[str]]:
        """The per-epoch lists by name (e.g. for a ``pandas.DataFrame``)."""
        names = (
            "loss", "loss_per_datum", "nll", "kl", "beta", "lr", "seconds", "steps", "collapsed",
            "stage", "validation", "averaged_nll", "averaged_kl",
        )  # fmt: skip
        return {name: list(getattr(self, name)) for name in names}

    def __repr__(self) -> str:
        if not self.loss:
            return "History(empty)"
        continued = "" if self.continues is None else ", continued"
        return (
            f"History({len(self)} epochs{continued}, {self.steps[-1]} steps, "
            f"{sum(self.seconds):.1f} s; last: loss={self.loss[-1]:.4g} "
            f"({self.loss_per_datum[-1]:.4g}/datum), nll={self.nll[-1]:.4g}, "
            f"kl={self.kl[-1]:.4g}, beta={self.beta[-1]:.3g})"
        )
