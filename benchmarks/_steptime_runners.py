"""The step-time benchmark's ``pyro_bbb`` rows, and how any step is run and timed.

``fit`` timed from the inside, step by step (``FitSteps``, a callback between backward
passes) or by whole epochs where a captured CUDA step calls no callback (``FitEpochs``); any
``step(x, y)`` over shuffled minibatches (``LoopSteps``), the hand-written steps and Pyro's
``SVI`` among them (``svi_steps``). Each is called with a number of steps and returns their
times by ``CLOCK``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import warnings
from collections.abc import Callable
from functools import partial

import pyro
import pyro.optim
import torch
from _steptime_problems import CLOCK, INIT_SCALE, LR, Net
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_bbb
from pyro_bbb.infer import AnnealedELBO, Ensemble

#: Steps in an epoch of the CUDA ``fit`` rows (timed by epochs; see FitEpochs).
EPOCH_STEPS = 50


def bnn(net: Net, device: torch.device) -> pyro_bbb.BNN:
    likelihood = (
        pyro_bbb.likelihoods.Gaussian(scale=0.1)
        if net.task == "regression"
        else pyro_bbb.likelihoods.Categorical()
    )
    model = pyro_bbb.BNN(pyro_bbb.bayesianize(net.module()), likelihood, num_data=net.num_data)
    return model.to(device)


class _EnoughStepsError(Exception):
    """Raised by the timer to leave ``fit`` after the steps it needs."""


class _StepTimer(pyro_bbb.Callback):
    """Time every step of ``fit`` from the inside; stop it after ``steps`` steps."""

    def __init__(self, steps: int, memory: Callable[[], None] | None = None) -> None:
        self.steps, self.memory = steps, memory
        self.stamps: list[float] = []

    def on_fit_start(self, params, history) -> None:
        if self.memory is not None:
            self.memory()  # reset the peak just before the first step

    def on_after_backward(self, params, step: int) -> None:
        CLOCK.sync()
        self.stamps.append(CLOCK.now())
        if len(self.stamps) > self.steps + 1:
            raise _EnoughStepsError

    def times(self) -> list[float]:
        # The first interval holds the optimiser's first step, which creates its state.
        return [b - a for a, b in itertools.pairwise(self.stamps)][1:]


class FitSteps:
    """``pyro_bbb.fit`` on one model and guide, ``steps`` steps per call."""

    def __init__(
        self, net: Net, x, y, device, guide: str, reparam: str | None, members: int = 0
    ) -> None:
        self.net, self.x, self.y, self.reparam = net, x, y, reparam
        self.model = bnn(net, device)
        name = f"{guide}-{reparam}-{members}-{id(self)}"
        if guide == "meanfield":
            family = partial(pyro_bbb.MeanFieldGuide, init_scale=INIT_SCALE, name=name)
        else:
            family = partial(
                pyro_bbb.LowRankGuide, rank=4, blocks="layer", init_scale=INIT_SCALE, name=name
            )
        self.guide = family(self.model) if not members else Ensemble(self.model, family, k=members)

    def __call__(self, steps: int, memory: Callable[[], None] | None = None) -> list[float]:
        timer = _StepTimer(steps, memory)
        with contextlib.suppress(_EnoughStepsError), warnings.catch_warnings():
            warnings.simplefilter("ignore", pyro_bbb.ConvergenceWarning)  # a timing, not a fit
            pyro_bbb.fit(
                self.model,
                self.guide,
                self.x,
                self.y,
                epochs=1,
                batch_size=self.net.batch,
                lr=LR,
                reparam=self.reparam,
                num_particles=1,  # the reference draws one sample a step
                progress=False,
                callbacks=[timer],
            )
        return timer.times()


class FitEpochs(FitSteps):
    """``pyro_bbb.fit`` timed by whole epochs, from ``History.seconds`` (for CUDA).

    A captured step cannot call ``on_after_backward``, so the steps are not timed one by
    one: each call fits two epochs of :data:`EPOCH_STEPS` steps (the data cut to that many
    batches), and the second's seconds, divided by its steps, stand for each of its steps.
    The first, which warms up and captures the step, is left out.
    """

    def __init__(self, net: Net, x, y, device, guide: str, reparam: str | None, members: int = 0,
                 *, cuda_graph: bool | None = None) -> None:  # fmt: skip
        del x, y  # its own data: EPOCH_STEPS batches
        short = dataclasses.replace(net, num_data=net.batch * EPOCH_STEPS)
        super().__init__(short, *short.data(device), device, guide, reparam, members)
        self.cuda_graph = cuda_graph

    def __call__(self, steps: int, memory: Callable[[], None] | None = None) -> list[float]:
        if memory is not None:
            memory()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pyro_bbb.ConvergenceWarning)  # a timing, not a fit
            history = pyro_bbb.fit(
                self.model, self.guide, self.x, self.y, epochs=2, batch_size=self.net.batch,
                lr=LR, reparam=self.reparam, num_particles=1, progress=False,
                cuda_graph=self.cuda_graph,
            )  # fmt: skip
        return [history.seconds[1] / EPOCH_STEPS] * EPOCH_STEPS


class LoopSteps:
    """A ``step(xb, yb)`` function over shuffled minibatches, timed step by step."""

    def __init__(self, net: Net, x, y, step: Callable) -> None:
        self.net, self.x, self.y, self.step = net, x, y, step

    def _batches(self):
        """Shuffled minibatch indices, epoch after epoch, as fit draws them."""
        while True:
            order = torch.randperm(self.net.num_data, device=self.x.device)
            yield from order.split(self.net.batch)

    def __call__(self, steps: int, memory: Callable[[], None] | None = None) -> list[float]:
        batches = self._batches()
        if memory is not None:
            memory()
        times = []
        for _, idx in zip(range(steps + 1), batches, strict=False):
            start = CLOCK.now()
            self.step(self.x[idx], self.y[idx])
            CLOCK.sync()
            times.append(CLOCK.now() - start)
        return times[1:]


def svi_steps(net: Net, x, y, device, guide: str) -> LoopSteps:
    model = bnn(net, device)
    if guide == "autonormal":
        svi = SVI(model, AutoNormal(model, init_scale=INIT_SCALE), pyro.optim.Adam({"lr": LR}),
                  Trace_ELBO())  # fmt: skip
    else:
        g = pyro_bbb.MeanFieldGuide(model, init_scale=INIT_SCALE, name=f"svi-{id(model)}")
        svi = SVI(model, g, pyro.optim.Adam({"lr": LR}), AnnealedELBO(1.0))

    def step(xb, yb):
        with pyro.validation_enabled(False):
            svi.step(xb, yb)

    return LoopSteps(net, x, y, step)
