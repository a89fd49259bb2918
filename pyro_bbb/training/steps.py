r"""The optimiser steps of :func:`~pyro_bbb.fit`: ``pyro.infer.SVI``'s ``step``, written out.

One step evaluates :class:`~pyro_bbb.infer.elbo.AnnealedELBO`'s terms on a minibatch,
backpropagates :math:`-\mathcal{L}_\beta`, averages the gradients over the processes of a
data-parallel fit, calls the callbacks' ``on_after_backward`` and updates the parameters.
Written out rather than run by ``SVI`` so that β can change per step, the ELBO's parts are
recorded, and hooks can act between the backward pass and the update.

For a :class:`~pyro_bbb.BNN` under this package's guides the terms come from
:class:`~pyro_bbb.infer.fused.FusedELBO` (the same terms without tracing the two programs)
when ``fit`` passes one. Pyro's validation is off during the steps: ``fit`` checked the first
step's distributions once, before training. :class:`Steps` also takes one pass over the
minibatches and returns the epoch's means as an :class:`~.history.EpochRecord`; what ``fit``
does with them (the History, progress, checkpoints) is the loop's business.

An epoch reads nothing back from the device until its end: each step's terms go into a row
on the device (:mod:`~pyro_bbb.training.records`), and the epoch's means are read once. A
loss that is not finite stops the fit there with a :class:`FloatingPointError` that names
the epoch, the first step that had one and the sites whose terms were not finite. With a
``runner`` (:mod:`~pyro_bbb.training.captured`) the fused step runs on static buffers, and on
CUDA as one captured graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import pyro
import torch

from ..infer.elbo import AnnealedELBO, ELBOTerms
from ..infer.fused import FusedELBO
from .callbacks import Callback
from .captured import StaticSteps
from .distributed import DataParallel
from .history import EpochRecord
from .lr_schedules import LRSchedule
from .minibatches import Batches
from .records import StepRecords, non_finite_error, record_row

__all__ = ["Steps"]


class Steps:
    """Optimiser steps on the annealed ELBO of a model and guide, counted.

    Args:
        model: The model.
        guide: The guide, its parameters already created.
        elbo: The ELBO; its ``beta`` is set before each step.
        handler: The gradient estimator's effect handler (``estimator(reparam)``).
        optimizer: The optimiser over ``params``.
        params: The trainable parameters.
        parallel: The process group (a world of one outside ``torch.distributed``).
        callbacks: Their ``on_after_backward`` runs between backward pass and update.
        rates: The learning-rate schedule over ``optimizer``, set before each step and
            stepped at each epoch's end.
        step: Steps already taken (non-zero when a fit resumes).
        fused: The fused evaluation of this model, guide, ELBO and estimator, or ``None`` to
            trace them every step.
        runner: The fused step on static buffers (a CUDA graph on CUDA) that takes an
            epoch's steps instead while it is ``active`` (the eager fused step takes them
            once it gave up: a failed capture), or ``None``.
    """

    def __init__(
        self,
        model: Callable[..., Any],
        guide: Callable[..., Any],
        elbo: AnnealedELBO,
        handler: Callable[[], AbstractContextManager],
        optimizer: torch.optim.Optimizer,
        params: Sequence[torch.Tensor],
        parallel: DataParallel,
        callbacks: Sequence[Callback],
        rates: LRSchedule,
        *,
        step: int = 0,
        fused: FusedELBO | None = None,
        runner: StaticSteps | None = None,
    ) -> None:
        self.model, self.guide, self.elbo, self.handler = model, guide, elbo, handler
        self.fused, self.runner = fused, runner
        self.optimizer, self.params, self.parallel = optimizer, params, parallel
        self.callbacks, self.rates = callbacks, rates
        #: Optimiser steps taken since the start of the fit.
        self.count = step

    def epoch(
        self, batches: Batches, epoch: int, schedule: Callable[[float], float]
    ) -> EpochRecord:
        """One pass over ``batches(epoch)``, β and the rate at the fractional epoch.

        Nothing is read from the device until the pass is over (see the module's notes).

        Raises:
            ValueError: If the data yield no minibatch.
            FloatingPointError: If a step's loss was NaN or infinite, naming the epoch, the
                first such step and the sites whose terms were not finite.
        """
        start = time.perf_counter()
        records = StepRecords(self.count)
        betas = lrs = 0.0
        num_steps = len(batches)
        for i, batch in enumerate(batches(epoch)):
            beta = self.elbo.beta = schedule(epoch + i / num_steps)
            self.rates.before_step(epoch + i / num_steps)
            lrs += self.rates.lr
            if self.runner is not None and self.runner.active:
                records.add(self.runner(batch, beta), self.runner.site_names)
                self.count += 1
            else:
                terms = self._take(batch)
                records.add(record_row(terms), terms.sites)
            betas += beta
        steps_done = len(records)
        if not steps_done:
            raise ValueError(f"epoch {epoch}: the data yielded no minibatch")
        loss, nll, kl = records.means(self.parallel, epoch)  # the same on every process
        self.rates.after_epoch()
        seconds = time.perf_counter() - start
        beta, lr = betas / steps_done, lrs / steps_done
        return EpochRecord(loss, nll, kl, beta, lr, seconds, self.count)

    def step(self, batch: Sequence[torch.Tensor], epoch: int, i: int) -> ELBOTerms:
        """One optimiser step on ``batch``, the ``i``-th of epoch ``epoch``, checked at once.

        Unlike the steps of :meth:`epoch`, the loss is read before the update (a wait for
        the device), and a loss that is not finite stops before the parameters change.

        Returns:
            The step's ELBO terms (before the update).

        Raises:
            FloatingPointError: When the loss is NaN or inf, naming the epoch, the step and
                the sites whose terms are not finite.
        """
        # The last step's gradients go before the forward: kept until backward, they would
        # sit beside the forward's saved tensors at the step's peak of memory.
        self.optimizer.zero_grad(set_to_none=True)
        terms = self.terms(batch, epoch, i)
        self._update(terms)
        return terms

    def terms(self, batch: Sequence[torch.Tensor], epoch: int, i: int) -> ELBOTerms:
        """The ELBO's terms on ``batch``, or a :class:`FloatingPointError` naming bad sites.

        A parameter that turns NaN or leaves its support makes the loss non-finite, which is
        what stops the fit; Pyro's validation, which would also catch it, is off.
        """
        terms = self._evaluate(batch)
        if not torch.isfinite(terms.loss):
            raise non_finite_error(terms.loss, terms.sites, epoch, i, self.count)
        return terms

    def _take(self, batch: Sequence[torch.Tensor]) -> ELBOTerms:
        """One step of an epoch: its terms, not read here (see :class:`StepRecords`)."""
        self.optimizer.zero_grad(set_to_none=True)  # before the forward: see `step`
        terms = self._evaluate(batch)
        self._update(terms)
        return terms

    def _evaluate(self, batch: Sequence[torch.Tensor]) -> ELBOTerms:
        with pyro.validation_enabled(False):
            if self.fused is not None:
                return self.fused.terms(*batch)
            with self.handler():
                return self.elbo.terms(self.model, self.guide, *batch)

    def _update(self, terms: ELBOTerms) -> None:
        terms.loss.backward()
        self.parallel.average_gradients_(self.params)  # before the callbacks: they see the mean
        for callback in self.callbacks:
            callback.on_after_backward(self.params, self.count)
        self.optimizer.step()
        self.count += 1
