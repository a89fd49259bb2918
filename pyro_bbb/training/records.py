"""The record of an epoch's steps, kept on the device and read once, at the epoch's end.

Every step of :func:`~pyro_bbb.fit` adds one row to :class:`StepRecords`: its loss, NLL, KL
and each site's term (:class:`~pyro_bbb.infer.elbo.ELBOTerms`), stacked into one tensor on
the step's device (:func:`record_row`). Nothing is read back while the epoch runs: on a GPU
a read waits for every kernel queued before it, and a check of each step's loss would make
every step wait for the last. At the end, :meth:`StepRecords.means` reads the epoch's means
(over processes too) in one transfer; the mean loss is finite exactly when every step's
was, and if not, the rows name the first step whose loss was NaN or infinite and the sites
whose terms were not finite there. Nothing here trains.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..infer.elbo import ELBOTerms
from .distributed import DataParallel

__all__ = ["StepRecords", "non_finite_error", "record_row"]


def record_row(terms: ELBOTerms) -> torch.Tensor:
    """``(loss, nll, kl, *site terms)`` of one step as one tensor ``(3 + sites,)``, detached.

    One stack, whatever the number of sites (terms of several dtypes take the widest); terms
    on another device than the loss (a model mixing devices) are moved to the loss's.
    """
    values = (terms.loss, terms.nll, terms.kl, *terms.sites.values())
    try:
        return torch.stack(values).detach()
    except RuntimeError:
        return torch.stack([v.to(terms.loss.device) for v in values]).detach()


class StepRecords:
    """The rows of one epoch's steps (see :func:`record_row`), on the device.

    Args:
        first_step: Optimiser steps taken before the epoch, to number a step overall.
    """

    def __init__(self, first_step: int) -> None:
        self.first_step = first_step
        self._rows: list[torch.Tensor] = []
        self._names: tuple[str, ...] | None = None
        self._all_names: list[tuple[str, ...]] = []  # per row, once two steps differ

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, row: torch.Tensor, names: Sequence[str]) -> None:
        """Append a step's row; ``names`` are its sites, in the row's order after the first 3."""
        names = tuple(names)
        if self._names is None:
            self._names = names
        elif names != self._names and not self._all_names:
            self._all_names = [self._names] * len(self._rows)
        if self._all_names:
            self._all_names.append(names)
        self._rows.append(row)

    def means(self, parallel: DataParallel, epoch: int) -> tuple[float, float, float]:
        """The epoch's mean loss, NLL and KL (over steps, then processes): one read.

        The mean loss, taken in float64, is finite exactly when every step's loss was (on
        every process), so it is also the check.

        Raises:
            FloatingPointError: If a step's loss was NaN or infinite here (naming the first
                such step and its non-finite sites) or on another process.
        """
        table = self._table()
        loss, nll, kl = parallel.mean(table[:, :3].double().mean(0)).tolist()  # the one read
        if not math.isfinite(loss):
            raise self._error(table, epoch)
        return loss, nll, kl

    def _table(self) -> torch.Tensor:
        if not self._all_names:
            return torch.stack(self._rows)
        return torch.stack([row[:3] for row in self._rows])  # sites differ: only the sums

    def _error(self, table: torch.Tensor, epoch: int) -> FloatingPointError:
        bad = (~torch.isfinite(table[:, 0])).nonzero()
        if not len(bad):
            return FloatingPointError(
                f"the loss is not finite at epoch {epoch} on another process; lower lr, check "
                "the data, or use a smaller init_scale"
            )
        i = int(bad[0])
        row = self._rows[i]
        names = self._all_names[i] if self._all_names else self._names
        sites = {name: value for name, value in zip(names, row[3:], strict=True)}
        error = non_finite_error(row[0], sites, epoch, i, self.first_step + i)
        return FloatingPointError(
            f"{error} The loss is checked once an epoch: the epoch's later steps were taken, "
            "so the parameters may no longer be finite (fit(checkpoint=...) keeps the last "
            "finished epoch)."
        )


def non_finite_error(
    loss: torch.Tensor, sites: dict[str, torch.Tensor], epoch: int, step_in_epoch: int, step: int
) -> FloatingPointError:
    """The error for a loss that is NaN or infinite: its value, the step and the bad sites."""
    bad = [name for name, value in sites.items() if not torch.isfinite(value).all()]
    where = f"site(s) {bad}" if bad else "no single site (the sum overflowed)"
    return FloatingPointError(
        f"the loss is {loss.item()} at epoch {epoch}, step {step_in_epoch} (step {step} "
        f"overall); non-finite terms at {where}. Lower lr, check the data, or use a smaller "
        "init_scale."
    )
