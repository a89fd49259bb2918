r"""The fused step of :func:`~pyro_bbb.fit` on static buffers; on CUDA, one captured graph.

On a GPU a step of a small or medium BNN is bound by kernel launches and Python, not by its
arithmetic: a hand-written Bayes-by-Backprop step of a 784-400-400-10 network took 5.6 ms
eager on an H100 and 0.56 ms captured whole in one CUDA graph. The capture (PyTorch's
whole-network recipe, ``torch.cuda.graph``) records every kernel of one step, forward,
backward and optimiser update, and replays them with one launch; what a step reads must
then sit at the same addresses every time, and nothing in it may wait for the host.

:class:`StaticStep` is that step: the minibatch is copied into buffers that stay where
they are, β is a 0-dim tensor written before each step (:attr:`StaticStep.beta`), the
gradients are zeroed in place instead of freed, and the step's record
(:func:`~pyro_bbb.training.records.record_row`) is an output tensor. It computes exactly
the eager fused step: same noise, same loss, same gradients, same update (on the CPU bit
for bit; on CUDA the fused Adam kernel reads its rate as float32).

**What a static step asks of the objects it captures.** This is the whole contract, each
part met by a public method of the object that owns it:

* the evaluation (:class:`StaticEvaluation`; :class:`~pyro_bbb.infer.fused.FusedELBO` is
  one): ``terms(x, y, beta=β)`` reads β from a 0-dim tensor on the device, draws its noise
  from torch's default generator and, once its caches are filled, copies nothing from the
  host; ``parameters()`` names the tensors it reads;
* the optimiser: one fused kernel over every parameter whose learning rate may be a tensor
  (Adam or AdamW with ``fused=True``, fit's default optimiser;
  :func:`~pyro_bbb.training.optimizers.why_not_capturable` says when it is not), its state
  updated, and reset by :func:`~pyro_bbb.training.optimizers.reset_moments`, in place;
* the learning-rate schedule: its rates held in tensors it writes in place
  (:meth:`~pyro_bbb.training.lr_schedules.LRSchedule.hold_in_tensors`, which the step
  calls; :attr:`~pyro_bbb.training.lr_schedules.LRSchedule.holds_in_tensors` says whether
  they still are), while the optimiser's ``state_dict`` keeps giving them as numbers;
* the fit: no callback acting between the backward pass and the update, one process.

Anything else may change between steps only in place: what the graph reads and writes is
compared before each replay (below).

:class:`StaticSteps` runs a fit's steps through it. The first minibatch fixes the static
shapes; with a :class:`Capture` (on CUDA, :class:`CUDAGraphCapture`) its first
:data:`WARMUP_STEPS` steps run eagerly (on CUDA on a side stream: they create the
optimiser's state and the gradients, and let the libraries set themselves up, as the
recipe requires), the next is captured, and every later one replays the graph. A minibatch
of another shape, the smaller last one of an epoch, runs the same step eagerly on its own
tensors. The noise comes from torch's default CUDA generator, which a capture registers:
each replay advances it as the eager step would, so a captured fit draws the same numbers,
and its checkpoints hold the generator's state as usual. On the CPU nothing is captured;
the same step runs on the buffers (slower than fit's default step: it is there to be
checked against it).

**What has never run on the hardware falls back rather than fails.** A capture that fails
(a network whose forward reads a value back to the host, a library call a graph cannot
hold) leaves the step's tensors and the generator as they were, and the fit goes on with
the eager fused step (not this step uncaptured on its buffers: :attr:`StaticSteps.active`
turns ``False``), saying why in one warning; only ``fit(cuda_graph=True)`` raises. The
capture uses ``capture_error_mode="thread_local"``, so a host allocation on another thread
(a ``DataLoader``'s pin-memory thread) does not invalidate it. Before each replay a guard
compares the addresses of what the graph reads and writes (:meth:`StaticStep.bindings`:
parameters, gradients, the optimiser's state and settings, the learning rates) with those
it was captured on: a callback that reloads the param store or the optimiser's state, or
sets the gradients to ``None``, would leave the graph training tensors nobody reads. Then
the step is captured again, once, and on a second change the fit goes on eagerly; each says
so.

:func:`static_steps` decides whether a fit uses it: automatically where the device can
capture (CUDA) for the fused step with fit's default optimiser, no callback between
backward pass and update, and one process; ``fit(cuda_graph=False)`` turns it off,
``cuda_graph=True`` asks for it and says why when it cannot. Nothing here evaluates the
ELBO itself.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from typing import Protocol

import pyro
import torch

from ..infer.elbo import ELBOTerms
from .callbacks import Callback
from .distributed import DataParallel
from .lr_schedules import LRSchedule
from .optimizers import why_not_capturable
from .records import record_row

__all__ = [
    "WARMUP_STEPS",
    "CUDAGraphCapture",
    "Capture",
    "Graph",
    "StaticEvaluation",
    "StaticStep",
    "StaticSteps",
    "static_steps",
]

#: Eager steps of the static shape before the capture (PyTorch's recipe takes three).
WARMUP_STEPS = 3

#: How often a fit captures its step again after the tensors it was captured on changed.
RECAPTURES = 1


class StaticEvaluation(Protocol):
    """What a static step evaluates: the ELBO's terms, β read on the device.

    :class:`~pyro_bbb.infer.fused.FusedELBO` is one (see the module's notes).
    """

    def terms(self, x: torch.Tensor, y: torch.Tensor, *, beta: torch.Tensor) -> ELBOTerms:
        """The terms on a minibatch, β read from the 0-dim tensor ``beta`` when the step runs."""
        ...  # pragma: no cover

    def parameters(self) -> list[torch.Tensor]:
        """The tensors the evaluation reads, besides its inputs."""
        ...  # pragma: no cover


class StaticStep:
    """One optimiser step of the fused ELBO whose per-step inputs are tensors kept in place.

    Args:
        evaluation: The fused evaluation of the model, guide, ELBO and estimator.
        optimizer: The optimiser over ``params`` (see the module's notes).
        rates: Its learning-rate schedule; the step holds its rates in tensors.
        params: The trained parameters (β takes the first one's dtype and device).
    """

    def __init__(
        self,
        evaluation: StaticEvaluation,
        optimizer: torch.optim.Optimizer,
        rates: LRSchedule,
        params: Sequence[torch.Tensor],
    ) -> None:
        self.evaluation, self.optimizer, self.rates = evaluation, optimizer, rates
        rates.hold_in_tensors()
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
            terms = self.evaluation.terms(x, y, beta=self.beta)
        terms.loss.backward()
        self.optimizer.step()
        self.site_names = tuple(terms.sites)
        return record_row(terms)

    def bindings(self) -> list[list[object]]:
        """Where the step reads and writes, as a captured graph holds it.

        The optimiser's parameter groups and state (by identity: ``load_state_dict``
        replaces both), each group's settings (a tensor, the learning rate, by address,
        anything else by value), every trained parameter's address and its gradient's
        (``0`` when it has none), the addresses of the optimiser's state, and those of the
        parameters the evaluation reads. Two calls give equal lists exactly when a
        graph captured at the first would still act on what the step uses at the second;
        :meth:`changed` names the first part that differs.
        """
        return [where for _, where in self._bindings()]

    def changed(self, bound: list[list[object]]) -> str:
        """What differs first between ``bound`` (from :meth:`bindings`) and now, in words."""
        for (what, where), before in zip(self._bindings(), bound, strict=False):
            if where != before:
                return what
        return "the optimiser's parameters"  # a group or a parameter added or removed

    def _bindings(self) -> Iterator[tuple[str, list[object]]]:
        optimizer = self.optimizer
        state = optimizer.state
        yield "the optimiser", [_Same(optimizer.param_groups), _Same(state)]
        for group in optimizer.param_groups:
            params = group["params"]
            settings = [_where(v) for key, v in group.items() if key != "params"]
            yield "the optimiser's settings (a learning rate or another)", settings
            yield "a parameter", [p.data_ptr() for p in params]
            yield "a gradient", [0 if (g := p.grad) is None else g.data_ptr() for p in params]
            moments = [_where(v) for p in params for v in state[p].values()]
            yield "the optimiser's state", moments
        yield "a parameter the step reads", [p.data_ptr() for p in self.evaluation.parameters()]


class _Same:
    """An object compared by identity (and kept alive while compared)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    __hash__ = None  # type: ignore[assignment]


def _where(value: object) -> object:
    """A tensor's address (a tensor compared by value could read it from the device)."""
    return value.data_ptr() if isinstance(value, torch.Tensor) else value


class Graph(Protocol):
    """A captured step: :meth:`replay` runs it again on the tensors it was captured on."""

    def replay(self) -> None:
        """Run the captured kernels again."""
        ...  # pragma: no cover


class Capture(Protocol):
    """How a device captures a :class:`StaticStep`: its warm-up steps, then the recording.

    :class:`CUDAGraphCapture` on CUDA; tests pass stand-ins to exercise :class:`StaticSteps`
    on the CPU.
    """

    def warm_up(self, step: StaticStep, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Take the step eagerly before the capture; its record row."""
        ...  # pragma: no cover

    def record(
        self, step: StaticStep, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[Graph, torch.Tensor]:
        """Capture one step on the buffers ``x``, ``y``: the graph and its output row.

        Raises:
            Exception: Whatever stopped the capture; the step's tensors and the random
                state are then as they were before the call.
        """
        ...  # pragma: no cover


class CUDAGraphCapture:
    """PyTorch's whole-network recipe: warm-up on a side stream, then ``torch.cuda.graph``.

    The capture is ``capture_error_mode="thread_local"``: what other threads do (a
    ``DataLoader``'s pin-memory thread allocating host memory) does not invalidate it. A
    capture that fails leaves the current stream and the device's default generator as they
    were before it (the generator's state is cloned before and put back: a failed capture
    would otherwise leave it in its capturing state).
    """

    def __init__(self) -> None:
        self._stream: torch.cuda.Stream | None = None

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        return self._stream

    def warm_up(self, step: StaticStep, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The step on a side stream, as the recipe asks before a capture."""
        side = self._side_stream(x.device)
        current = torch.cuda.current_stream(x.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            row = step(x, y)
        current.wait_stream(side)
        row.record_stream(current)  # read on the current stream at the epoch's end
        return row

    def record(
        self, step: StaticStep, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Capture one step; see :meth:`Capture.record`."""
        side = self._side_stream(x.device)
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        generator = torch.cuda.default_generators[index]
        before = generator.clone_state()
        graph = torch.cuda.CUDAGraph()
        try:
            # the outer context puts the current stream back even where the graph's does not
            with (
                torch.cuda.stream(side),
                torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"),
            ):
                output = step(x, y)
        except Exception:
            generator.graphsafe_set_state(before)
            raise
        return graph, output


class StaticSteps:
    """A fit's steps through a :class:`StaticStep`: buffers, warm-up, capture and replay.

    Args:
        step: The step.
        capture: How to capture it after the warm-up (:class:`CUDAGraphCapture` on CUDA), or
            ``None`` to run it on its buffers uncaptured.
        strict: Raise when the capture fails (``fit(cuda_graph=True)``); otherwise the fit
            takes the eager fused step from there on (:attr:`active` turns ``False``), with
            one warning that says why.
        warmup: Eager steps of the static shape before the capture.
    """

    def __init__(
        self,
        step: StaticStep,
        *,
        capture: Capture | None,
        strict: bool = False,
        warmup: int = WARMUP_STEPS,
    ) -> None:
        self.step, self.strict, self.warmup = step, strict, warmup
        self._capture = capture
        self._inputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._graph: Graph | None = None
        self._output: torch.Tensor | None = None
        self._bound: list[list[object]] = []
        self._warm = 0
        self._recaptured = 0
        self._gave_up = False

    @property
    def active(self) -> bool:
        """Whether the fit still takes its steps here.

        ``False`` once a capture failed or the captured tensors were replaced a second
        time: the fit then takes the eager fused step
        (:class:`~pyro_bbb.training.steps.Steps`), not this step on its static buffers.
        """
        return not self._gave_up

    @property
    def site_names(self) -> tuple[str, ...]:
        """The sites of the rows returned, after the first three (loss, NLL, KL)."""
        return self.step.site_names

    @property
    def captured(self) -> bool:
        """Whether the step is captured now (and replayed)."""
        return self._graph is not None

    @property
    def capturing(self) -> bool:
        """Whether the step is, or will be, captured (``False`` once the fit fell back)."""
        return self._capture is not None

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
        if self._graph is not None and self.step.bindings() != self._bound:
            self._release()
        if self._graph is None:
            if self._capture is None:
                return self.step(static_x, static_y)
            if self._warm < self.warmup:
                self._warm += 1
                return self._capture.warm_up(self.step, static_x, static_y)
            if not self._record(static_x, static_y):
                return self.step(static_x, static_y)
        self._graph.replay()
        return self._output.clone()

    def _record(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Capture the step; on failure raise (strict) or fall back, saying why."""
        try:
            self._graph, self._output = self._capture.record(self.step, x, y)
        except Exception as error:
            why = next(iter(str(error).strip().splitlines()), type(error).__name__)
            if self.strict:
                raise RuntimeError(
                    f"fit could not capture its step as a CUDA graph ({why}); pass "
                    "cuda_graph=None to fall back to the eager step when a capture fails, or "
                    "False to train with it from the start (a network whose forward reads a "
                    "value back to the host, or branches on one, cannot be captured)"
                ) from error
            self._capture = None
            self._gave_up = True
            _warn(
                f"fit could not capture its step as a CUDA graph ({why}); it trains with the "
                "eager fused step instead (the same step, uncaptured; a network whose forward "
                "reads a value back to the host, or branches on one, cannot be captured). "
                "Pass cuda_graph=False to skip the attempt."
            )
            return False
        self._bound = self.step.bindings()
        return True

    def _release(self) -> None:
        """Drop a graph whose tensors were replaced: capture again once, then go eager."""
        changed = self.step.changed(self._bound)
        self._graph = self._output = None
        self._bound = []
        self._warm = 0
        rates_in_place = self.step.rates.holds_in_tensors
        cause = (
            f"{changed} that fit's captured CUDA graph reads or writes was replaced between "
            "steps (e.g. a callback reloaded the param store or the optimiser's state, or set "
            "the gradients to None), and replaying the graph would train the old tensors"
        )
        hint = "; copy new values into the tensors in place (tensor.copy_) to keep the graph"
        if self._recaptured < RECAPTURES and rates_in_place:
            self._recaptured += 1
            _warn(f"{cause}: fit captures its step again{hint}")
        else:
            self._capture = None
            self._gave_up = True
            _warn(f"{cause}: fit takes the eager fused step from here on{hint}")


def _warn(message: str) -> None:
    """One warning, pointed at the caller of ``fit`` (through the epoch and this runner)."""
    warnings.warn(message, UserWarning, stacklevel=6)


def _capture_for(device: torch.device) -> Capture | None:
    """How steps on ``device`` are captured: a CUDA graph on CUDA, not at all elsewhere."""
    return CUDAGraphCapture() if device.type == "cuda" else None


def static_steps(
    cuda_graph: bool | None,
    fused: StaticEvaluation | None,
    optimizer: torch.optim.Optimizer,
    rates: LRSchedule,
    params: Sequence[torch.Tensor],
    callbacks: Sequence[Callback],
    parallel: DataParallel,
    device: torch.device,
) -> StaticSteps | None:
    """The static steps a fit takes, or ``None`` for its eager steps.

    Args:
        cuda_graph: ``None``: captured where the device can capture (CUDA) and the step
            allows it (below), falling back to the eager step, with a warning, if the
            capture fails; ``False``: never; ``True``: always (on the CPU uncaptured, for
            checking), or an error saying why not.
        fused: The fused evaluation, ``None`` when the fit traces its steps.
        optimizer: The fit's optimiser.
        rates: Its learning-rate schedule; its rates become tensors when the static steps
            are taken (:meth:`~pyro_bbb.training.lr_schedules.LRSchedule.hold_in_tensors`).
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
    capture = _capture_for(device)
    if cuda_graph is False or (cuda_graph is None and capture is None):
        return None
    reason = _why_not_static(fused, optimizer, callbacks, parallel)
    if reason is not None:
        if cuda_graph:
            raise ValueError(f"cuda_graph=True, but {reason}; pass cuda_graph=False or None")
        return None
    step = StaticStep(fused, optimizer, rates, params)
    return StaticSteps(step, capture=capture, strict=cuda_graph is True)


def _why_not_static(
    fused: StaticEvaluation | None,
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
    reason = why_not_capturable(optimizer)
    if reason is not None:
        return reason
    for callback in callbacks:
        if type(callback).on_after_backward is not Callback.on_after_backward:
            return (
                f"the callback {type(callback).__name__} acts between the backward pass and "
                "the update (on_after_backward), which a captured step cannot call"
            )
    if parallel.world_size > 1:
        return "the fit runs on several processes, whose gradients are averaged every step"
    return None
