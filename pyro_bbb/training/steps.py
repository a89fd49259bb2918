r"""The optimiser steps of :func:`~pyro_bbb.fit`: ``pyro.infer.SVI``'s ``step``, written out.

One step evaluates :class:`~pyro_bbb.infer.elbo.AnnealedELBO`'s terms on a minibatch,
backpropagates :math:`-\mathcal{L}_\beta`, averages the gradients over the processes of a
data-parallel fit, calls the callbacks' ``on_after_backward`` and updates the parameters.
Written out rather than run by ``SVI`` so that β can change per step, the ELBO's parts are
recorded, and hooks can act between the backward pass and the update.

For a :class:`~pyro_bbb.BNN` under this package's guides the terms come from
:class:`~pyro_bbb.infer.fused.FusedELBO` (the same terms without tracing the two programs)
when ``fit`` passes one. Pyro's validation is off during the steps: ``fit`` checked the first
step's distributions once, before training. A loss that is not finite stops the fit with a
:class:`FloatingPointError` that names the epoch, the step and the sites whose terms are not
finite. :class:`Steps` also takes one
pass over the minibatches and returns the epoch's means as an :class:`EpochRecord`; what
``fit`` does with them (the History, progress, checkpoints) is the loop's business.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

import pyro
import torch

from ..infer.elbo import AnnealedELBO, ELBOTerms
from ..infer.fused import FusedELBO
from .callbacks import Callback
from .distributed import DataParallel
from .lr_schedules import LRSchedule
from .minibatches import Batches

__all__ = ["EpochRecord", "Steps"]


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
    ) -> None:
        self.model, self.guide, self.elbo, self.handler = model, guide, elbo, handler
        self.fused = fused
        self.optimizer, self.params, self.parallel = optimizer, params, parallel
        self.callbacks, self.rates = callbacks, rates
        #: Optimiser steps taken since the start of the fit.
        self.count = step

    def epoch(
        self, batches: Batches, epoch: int, schedule: Callable[[float], float]
    ) -> EpochRecord:
        """One pass over ``batches(epoch)``, β and the rate at the fractional epoch.

        Raises:
            ValueError: If the data yield no minibatch.
            FloatingPointError: As :meth:`step`.
        """
        start = time.perf_counter()
        parts: list[torch.Tensor] = []  # (loss, nll, kl) of each step, summed at epoch end
        betas = lrs = 0.0
        num_steps = len(batches)
        for i, batch in enumerate(batches(epoch)):
            self.elbo.beta = schedule(epoch + i / num_steps)
            self.rates.before_step(epoch + i / num_steps)
            lrs += self.rates.lr
            terms = self.step(batch, epoch, i)
            parts += (terms.loss.detach(), terms.nll.detach(), terms.kl.detach())
            betas += terms.beta
        steps_done = len(parts) // 3
        if not steps_done:
            raise ValueError(f"epoch {epoch}: the data yielded no minibatch")
        self.rates.after_epoch()
        means = torch.stack(parts).to(torch.float64).reshape(steps_done, 3).mean(0)
        loss, nll, kl = self.parallel.mean(means).tolist()  # the same History on every process
        seconds = time.perf_counter() - start
        beta, lr = betas / steps_done, lrs / steps_done
        return EpochRecord(loss, nll, kl, beta, lr, seconds, self.count)

    def step(self, batch: Sequence[torch.Tensor], epoch: int, i: int) -> ELBOTerms:
        """One optimiser step on ``batch``, the ``i``-th of epoch ``epoch``.

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
        terms.loss.backward()
        self.parallel.average_gradients_(self.params)  # before the callbacks: they see the mean
        for callback in self.callbacks:
            callback.on_after_backward(self.params, self.count)
        self.optimizer.step()
        self.count += 1
        return terms

    def terms(self, batch: Sequence[torch.Tensor], epoch: int, i: int) -> ELBOTerms:
        """The ELBO's terms on ``batch``, or a :class:`FloatingPointError` naming bad sites.

        A parameter that turns NaN or leaves its support makes the loss non-finite, which is
        what stops the fit here; Pyro's validation, which would also catch it, is off.
        """
        with pyro.validation_enabled(False):
            if self.fused is not None:
                terms = self.fused.terms(*batch)
            else:
                with self.handler():
                    terms = self.elbo.terms(self.model, self.guide, *batch)
        if not torch.isfinite(terms.loss):
            raise _non_finite(terms, epoch, i, self.count)
        return terms


def _non_finite(terms: ELBOTerms, epoch: int, step_in_epoch: int, step: int) -> FloatingPointError:
    bad = [name for name, value in terms.sites.items() if not torch.isfinite(value).all()]
    where = f"site(s) {bad}" if bad else "no single site (the sum overflowed)"
    return FloatingPointError(
        f"the loss is {terms.loss.item()} at epoch {epoch}, step {step_in_epoch} (step {step} "
        f"overall); non-finite terms at {where}. Lower lr, check the data, or use a smaller "
        "init_scale."
    )
