r"""The fused step of :func:`~pyro_bbb.fit` on static buffers; on CUDA, one captured graph.

On a GPU a step of a small or medium BNN is bound by kernel launches and Python, not by its
arithmetic: a hand-written Bayes-by-Backprop step of a 784-400-400-10 network took 5.6 ms
eager on an H100 and 0.56 ms captured whole in one CUDA graph. The capture (PyTorch's
whole-network recipe, ``torch.cuda.graph``) records every kernel of one step, forward,
backward and optimiser update, and replays them with one launch; what a step reads must
then sit at the same addresses every time, and nothing in it may wait for the host.

:class:`StaticStep` is that step for :class:`~pyro_bbb.infer.fused.FusedELBO`: the
minibatch is copied into buffers that stay where they are, β is a 0-dim tensor written
before each step (:attr:`StaticStep.beta`), the learning rates are tensors the schedule
writes into (:meth:`~pyro_bbb.training.lr_schedules.LRSchedule.hold_in_tensors`), the
gradients are zeroed in place instead of freed, and the step's record
(:func:`~pyro_bbb.training.records.record_row`) is an output tensor. It computes exactly
the eager fused step: same noise, same loss, same gradients, same update (on the CPU bit
for bit; on CUDA the fused Adam kernel reads its rate as float32).

:class:`StaticSteps` runs a fit's steps through it. The first minibatch fixes the static
shapes; on CUDA its first :data:`WARMUP_STEPS` steps run eagerly on a side stream (they
create the optimiser's state and the gradients, and let the libraries set themselves up,
as the recipe requires), the next is captured, and every later one replays the graph. A
minibatch of another shape, the smaller last one of an epoch, runs the same step eagerly on
its own tensors. The noise comes from torch's default CUDA generator, which a capture
registers: each replay advances it as the eager step would, so a captured fit draws the
same numbers, and its checkpoints hold the generator's state as usual. On the CPU nothing
is captured; the same step runs on the buffers (slower than fit's default step: it is
there to be checked against it).

:func:`static_steps` decides whether a fit uses it: automatically on CUDA for the fused
step with fit's default optimiser, no callback between backward pass and update, and one
process; ``fit(cuda_graph=False)`` turns it off, ``cuda_graph=True`` asks for it and says
why when it cannot. Nothing here evaluates the ELBO itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyro
import torch

from ..infer.fused import FusedELBO
from .callbacks import Callback
from .distributed import DataParallel
from .lr_schedules import LRSchedule
from .records import record_row

__all__ = ["WARMUP_STEPS", "StaticStep", "StaticSteps", "static_steps"]

#: Eager steps of the static shape before the capture (PyTorch's recipe takes three).
WARMUP_STEPS = 3


class StaticStep:
    """One optimiser step of the fused ELBO whose per-step inputs are tensors kept in place.

    Args:
        fused: The fused evaluation of the model, guide, ELBO and estimator.
        optimizer: The optimiser; its rates are tensors written in place (see the module).
        params: The trained parameters (β takes the first one's dtype and device).
    """

    def __init__(
        self, fused: FusedELBO, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]
    ) -> None:
        self.fused, self.optimizer = fused, optimizer
        like = params[0]
        #: β, written before each step; the step reads it on the device.
        self.beta = torch.zeros((), dtype=like.dtype, device=like.device)
        #: The sites of the record's rows, after the first three (loss, NLL, KL).
        self.site_names: tuple[str, ...] = ()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Take the step on ``x``, ``y``: forward, backward, update.

        Returns:
            The step's record row, ``(loss, nll, kl, *site terms)`` before the update.
        """
        # zeroed in place: a captured step writes the same gradient buffers every replay
        self.optimizer.zero_grad(set_to_none=False)
        with pyro.validation_enabled(False):
            terms = self.fused.terms(x, y, beta=self.beta)
        terms.loss.backward()
        self.optimizer.step()
        self.site_names = tuple(terms.sites)
        return record_row(terms)


class StaticSteps:
    """A fit's steps through a :class:`StaticStep`: buffers, warm-up, capture and replay.

    Args:
        step: The step.
        capture: Capture it as a CUDA graph after the warm-up (CUDA only).
        warmup: Eager steps of the static shape before the capture.
    """

    def __init__(self, step: StaticStep, *, capture: bool, warmup: int = WARMUP_STEPS) -> None:
        self.step, self.capture, self.warmup = step, capture, warmup
        self._inputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._graph: torch.cuda.CUDAGraph | None = None
        self._output: torch.Tensor | None = None
        self._stream: torch.cuda.Stream | None = None
        self._warm = 0

    @property
    def site_names(self) -> tuple[str, ...]:
        """The sites of the rows returned, after the first three (loss, NLL, KL)."""
        return self.step.site_names

    @property
    def captured(self) -> bool:
        """Whether the step has been captured (and is now replayed)."""
        return self._graph is not None

    def __call__(self, batch: Sequence[torch.Tensor], beta: float) -> torch.Tensor:
        """One step on ``batch`` with β = ``beta``; its record row (see :class:`StaticStep`)."""
        x, y = batch
        self.step.beta.fill_(beta)
        if self._inputs is None:
            self._inputs = (torch.empty_like(x), torch.empty_like(y))
        static_x, static_y = self._inputs
        if x.shape != static_x.shape or y.shape != static_y.shape:
            return self.step(x, y)  # the smaller last minibatch: eager, on its own tensors
        static_x.copy_(x)
        static_y.copy_(y)
        if self._graph is None:
            if not self.capture or self._warm < self.warmup:
                self._warm += 1
                return self._eager(static_x, static_y)
            self._graph, self._output = _capture(self.step, static_x, static_y)
        self._graph.replay()
        return self._output.clone()

    def _eager(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The step, eagerly: on CUDA before a capture on a side stream, as the recipe asks."""
        if not self.capture:
            return self.step(x, y)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=x.device)
        current = torch.cuda.current_stream(x.device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            row = self.step(x, y)
        current.wait_stream(self._stream)
        row.record_stream(current)  # read on the current stream at the epoch's end
        return row


def _capture(
    step: StaticStep, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Capture one step on the buffers ``x``, ``y``: the graph and its output row."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            output = step(x, y)
    except RuntimeError as error:
        raise RuntimeError(
            f"fit could not capture its step as a CUDA graph ({error}); pass "
            "cuda_graph=False to train with the eager step (a network whose forward reads "
            "a value back to the host, or branches on one, cannot be captured)"
        ) from error
    return graph, output


def static_steps(
    cuda_graph: bool | None,
    fused: FusedELBO | None,
    optimizer: torch.optim.Optimizer,
    rates: LRSchedule,
    params: Sequence[torch.Tensor],
    callbacks: Sequence[Callback],
    parallel: DataParallel,
    device: torch.device,
) -> StaticSteps | None:
    """The static steps a fit takes, or ``None`` for its eager steps.

    Args:
        cuda_graph: ``None``: on CUDA when the step allows it (below); ``False``: never;
            ``True``: always (on the CPU uncaptured, for checking), or an error saying why
            not.
        fused: The fused evaluation, ``None`` when the fit traces its steps.
        optimizer: The fit's optimiser.
        rates: Its learning-rate schedule; its rates become tensors when the static steps
            are taken.
        params: The trained parameters.
        callbacks: The fit's callbacks.
        parallel: The process group.
        device: The device the fit trains on.

    Returns:
        The :class:`StaticSteps`, or ``None``.

    Raises:
        TypeError: If ``cuda_graph`` is not a bool or ``None``.
        ValueError: For ``cuda_graph=True`` on a fit whose step cannot be static: traced,
            not fit's default optimiser, a callback acting between backward pass and
            update, or several processes.
    """
    if cuda_graph is not None and not isinstance(cuda_graph, bool):
        raise TypeError(f"cuda_graph must be True, False or None, got {cuda_graph!r}")
    if cuda_graph is False or (cuda_graph is None and device.type != "cuda"):
        return None
    reason = _why_not_static(fused, optimizer, callbacks, parallel)
    if reason is not None:
        if cuda_graph:
            raise ValueError(f"cuda_graph=True, but {reason}; pass cuda_graph=False or None")
        return None
    rates.hold_in_tensors()
    step = StaticStep(fused, optimizer, params)
    return StaticSteps(step, capture=device.type == "cuda")


def _why_not_static(
    fused: FusedELBO | None,
    optimizer: torch.optim.Optimizer,
    callbacks: Sequence[Callback],
    parallel: DataParallel,
) -> str | None:
    """Why the fit's step cannot run static, or ``None`` if it can."""
    if fused is None:
        return (
            "the steps are traced, not fused (they are fused for a BNN under MeanFieldGuide, "
            "LowRankGuide or an Ensemble of either, its sample sites all in Bayesian affine "
            "layers)"
        )
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW) or not all(
        group.get("fused") for group in optimizer.param_groups
    ):
        return (
            f"the optimiser is {type(optimizer).__name__} "
            f"(fused={optimizer.param_groups[0].get('fused')}); a static step needs Adam or "
            "AdamW with fused=True (fit's default optimiser)"
        )
    for callback in callbacks:
        if type(callback).on_after_backward is not Callback.on_after_backward:
            return (
                f"the callback {type(callback).__name__} acts between the backward pass and "
                "the update (on_after_backward), which a captured step cannot call"
            )
    if parallel.world_size > 1:
        return "the fit runs on several processes, whose gradients are averaged every step"
    return None
