r"""A model replayed on a guide's draws a slice of its inputs at a time, sized by memory.

Running a network on ``S`` weight draws at once holds ``S`` copies of each activation: a
LeNet-5 at 50 draws holds about 2.5 MB per 28×28 image, so the 10,000 test images of
Fashion-MNIST in one pass would take 25 GB. :func:`~pyro_bbb.predict` and the ArviZ export
therefore go through their inputs in slices of rows:

* :func:`rows_per_slice`: how many rows a slice takes, so that its activations hold about
  :data:`SLICE_BYTES`. One probe pass on two rows counts what the network's modules return
  (each tensor once, for every draw; :func:`activation_bytes`), the way ``torchinfo`` sizes a
  forward pass; a network that runs once per draw in a loop counts one draw's, which is all
  it holds at a time.
* :func:`draws_per_slice`: how many weight draws a slice of draws takes, where the draws of
  every weight would not fit in one (a large network at many draws): each slice of draws is
  then replayed on every slice of rows, and the parts are put together along the draws;
* :class:`ModelReplay`: the model replayed on the guide's draws for a slice of rows, with its
  observation site left undrawn (:class:`Undrawn`): the targets are drawn afterwards, once,
  from the whole input's distribution put together by :func:`concatenate`, so that the
  numbers are those of one pass over every row (the same random draws in the same order);
  :class:`Concatenation` gathers the slices' distributions as they come.

Nothing here summarises a predictive (:mod:`~pyro_bbb.infer.predictive`) or knows of ArviZ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import prune_subsample_sites
from torch.nn.modules.module import register_module_forward_hook

from .._devices import cuda_devices
from .._support import independent_base
from ..nn.draws import current_draw, kept_buffers

__all__ = [
    "SLICE_BYTES",
    "Concatenation",
    "ModelReplay",
    "Undrawn",
    "activation_bytes",
    "concatenate",
    "draws_per_slice",
    "expanded_parameter",
    "rows_per_slice",
]

#: The memory a slice's activations may take, in bytes (256 MiB): slices of the inputs are
#: sized to it unless a ``batch_size`` is given.
SLICE_BYTES = 256 * 2**20

#: Rows of the probe pass that measures a row's activations.
_PROBE_ROWS = 2


class Undrawn(Messenger):
    """Leave sample sites undrawn: each named site gets zeros of its shape, drawn from nothing.

    The value is ``torch.zeros(())`` expanded to the site's shape (no memory, no random
    numbers); the site's distribution stays in the trace, to be drawn from later. A site
    with an observed value keeps it.

    Args:
        sites: Names of the sites to leave undrawn.
    """

    def __init__(self, sites: Collection[str]) -> None:
        super().__init__()
        self.sites = sites

    def _pyro_sample(self, msg: dict) -> None:
        if msg["name"] in self.sites and not msg["is_observed"] and msg["value"] is None:
            fn = msg["fn"]
            kind = torch.long if isinstance(independent_base(fn), dist.Categorical) else None
            zero = torch.zeros((), dtype=kind, device=_device_of(fn))
            msg["value"] = zero.expand(fn.batch_shape + fn.event_shape)


def _device_of(fn: dist.TorchDistribution) -> torch.device:
    base = independent_base(fn)
    for value in vars(base).values():
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


class ModelReplay:
    """The model on a guide's draws, one slice of rows at a time, its observation undrawn.

    Args:
        model: The model, already inside the guide's plates
            (:func:`~pyro_bbb.infer.sites.model_in_plates`).
        guide_trace: A trace of the guide under ``plate``: the draws every slice replays.
        plate: The plate over draws the guide ran in.
        observed: The observation site's name.
        module: The module whose buffers a probe pass must leave as they were (the model, if
            it is one).
    """

    def __init__(
        self,
        model: Callable[..., Any],
        guide_trace: poutine.Trace,
        plate: pyro.plate,
        observed: str,
        module: torch.nn.Module | None = None,
    ) -> None:
        self.observed = observed
        self.module = module
        # the guide's own plates (an autoguide's) hold the rows it was traced on: a slice of
        # other rows replays the draws only, as Pyro's Predictive does
        draws = prune_subsample_sites(guide_trace)
        self._run = Undrawn({observed})(poutine.replay(plate(model), trace=draws))

    def trace(self, *args: Any) -> poutine.Trace:
        """The model's trace on a slice: ``args`` are the model's, e.g. ``(x_rows[, y_rows])``."""
        return poutine.trace(self._run).get_trace(*args)

    def observation(self, *args: Any) -> dist.TorchDistribution:
        """The observation site's distribution on a slice, batch ``(*draws, rows)``."""
        return self.trace(*args).nodes[self.observed]["fn"]

    def rows_per_slice(self, x: torch.Tensor, *, factor: float = 1.0) -> int:
        """The rows a slice of ``x`` takes for its activations to hold about :data:`SLICE_BYTES`.

        Args:
            x: The inputs ``(batch, *features)``.
            factor: What a slice holds beyond the sampled pass's activations, as a multiple
                (2 for the linearised predictive, which carries a tangent beside each).

        Returns:
            Between 1 and ``len(x)``.
        """
        return rows_per_slice(lambda rows: self.trace(rows), x, self.module, factor=factor)


@contextmanager
def activation_bytes() -> Iterator[list[int]]:
    """Count the bytes of every tensor a ``torch.nn.Module`` returns while inside.

    Each tensor is counted once, whatever module returns it again (a container returns its
    last layer's output). Inside a pass run once per draw (:mod:`pyro_bbb.nn.draws`) a
    vectorised pass sees one draw's tensors and counts them for all its draws, and a loop
    counts its first draw's only: it holds one draw's activations at a time.

    Yields:
        A one-element list holding the running count, read after the block.
    """
    count = [0]
    seen: list[torch.Tensor] = []  # kept alive while counting, so that no id is reused
    ids: set[int] = set()

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        draw = current_draw()
        if draw is not None and not isinstance(draw.index, torch.Tensor) and draw.index != 0:
            return
        scale = draw.count if draw is not None and isinstance(draw.index, torch.Tensor) else 1
        for tensor in _tensors(output):
            if id(tensor) not in ids:
                ids.add(id(tensor))
                seen.append(tensor)
                count[0] += scale * _held_bytes(tensor)

    handle = register_module_forward_hook(hook)
    try:
        yield count
    finally:
        handle.remove()
        seen.clear()


def _held_bytes(tensor: torch.Tensor) -> int:
    """The bytes a tensor holds: an expanded dim (stride 0) holds one element's worth."""
    held = [size for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if stride]
    return math.prod(held) * tensor.element_size()


def _tensors(output: Any) -> Iterator[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _tensors(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _tensors(item)


def rows_per_slice(
    run: Callable[[torch.Tensor], Any],
    x: torch.Tensor,
    module: torch.nn.Module | None = None,
    *,
    factor: float = 1.0,
    budget: float | None = None,
) -> int:
    """The rows of ``x`` a slice takes for its activations to hold about ``budget`` bytes.

    ``run`` is called once on two rows of ``x`` while :func:`activation_bytes` counts; the
    random state (torch's, and every CUDA device's of ``x``) and the module's buffers are
    restored afterwards, so the probe changes nothing that follows.

    Args:
        run: One pass over some rows, e.g. the model replayed on a guide's draws.
        x: The inputs ``(batch, *features)``.
        module: A module whose buffers the probe must leave as they were.
        factor: A multiple of the counted bytes that a slice holds.
        budget: Bytes a slice may hold (``None``: :data:`SLICE_BYTES`).

    Returns:
        Between 1 and ``len(x)``; ``len(x)`` when nothing was counted (no module ran).
    """
    rows = min(_PROBE_ROWS, x.shape[0])
    buffers = kept_buffers(module) if isinstance(module, torch.nn.Module) else nullcontext()
    with torch.random.fork_rng(devices=cuda_devices(x)), buffers, activation_bytes() as count:
        run(x[:rows])
    budget = SLICE_BYTES if budget is None else budget
    per_row = factor * count[0] / max(rows, 1)
    if per_row <= 0:
        return x.shape[0]
    return int(max(1, min(x.shape[0], budget // per_row)))


def draws_per_slice(per_draw: float, total: int, budget: float) -> int:
    """How many of ``total`` weight draws a slice takes for them to hold about ``budget`` bytes.

    Args:
        per_draw: What one draw holds, in bytes (its weights, and whatever a caller keeps
            beside them).
        total: The draws asked for.
        budget: Bytes a slice of draws may hold.

    Returns:
        Between 1 and ``total``; ``total`` when a draw holds nothing.
    """
    if per_draw <= 0:
        return total
    return int(max(1, min(total, budget // per_draw)))


class Concatenation:
    """The distribution of every row, put together from the distributions of slices of rows.

    Each slice's parameters are copied, as it comes, into tensors sized for every row
    (allocated at the first slice), and the slice's own distribution is let go: what is kept
    between slices is then one block per parameter, not a small tensor per slice between the
    large ones a slice frees, which fragments the heap and grows it slice by slice.

    A slice's batch shape ends with its rows (the data plate's dim, before the event dims).
    ``Normal``, ``Categorical`` and ``Bernoulli`` (from logits), possibly ``Independent``,
    are what the package's likelihoods give. With ``along="draws"`` the parts are passes of
    weight draws over every row instead, put together along their first batch dim (the
    draws').

    Args:
        num_rows: The rows of every slice together (the draws of every pass, along draws).
        along: ``"rows"`` or ``"draws"``.
    """

    def __init__(self, num_rows: int, *, along: str = "rows") -> None:
        if along not in ("rows", "draws"):
            raise ValueError(f"along must be 'rows' or 'draws', got {along!r}")
        self.along = along
        self.num_rows = num_rows
        self._first: dist.TorchDistribution | None = None
        self._full: dict[str, torch.Tensor] = {}
        self._filled = 0

    def add(self, part: dist.TorchDistribution) -> None:
        """Copy the next slice's parameters in.

        Raises:
            NotImplementedError: For a distribution of another kind, in a slice of fewer
                rows than all.
        """
        base, event = _base_and_event(part)
        dim = 0 if self.along == "draws" else len(base.batch_shape) - 1 - event
        rows = base.batch_shape[dim]
        if self._first is None:
            self._first = part
            if rows == self.num_rows:
                return  # one slice: kept as it is
            for name in _parameters(base):
                value = expanded_parameter(base, name)
                shape = (*value.shape[:dim], self.num_rows, *value.shape[dim + 1 :])
                self._full[name] = value.new_empty(shape)
        for name, full in self._full.items():
            full.narrow(dim, self._filled, rows).copy_(expanded_parameter(base, name))
        self._filled += rows

    def result(self) -> dist.TorchDistribution:
        """The distribution over every row (the one slice's own if there was one)."""
        if self._first is None or (self._full and self._filled < self.num_rows):
            raise RuntimeError(f"{self._filled} of {self.num_rows} rows were added")
        if not self._full:
            return self._first
        return _rebuilt(self._first, self._full)


def _base_and_event(fn: dist.TorchDistribution) -> tuple[dist.TorchDistribution, int]:
    """The distribution under ``Independent`` wrappers and the batch dims they reinterpret."""
    event = 0
    while isinstance(fn, dist.Independent):
        event += fn.reinterpreted_batch_ndims
        fn = fn.base_dist
    return fn, event


def _parameters(base: dist.TorchDistribution) -> tuple[str, ...]:
    if type(base) is dist.Normal:
        return ("loc", "scale")
    if type(base) in (dist.Categorical, dist.Bernoulli):
        return ("logits",)
    raise NotImplementedError(
        "slices of an observation are put together for a Normal, Categorical or Bernoulli "
        f"likelihood (possibly Independent), got {type(base).__name__}"
    )


def expanded_parameter(base: dist.TorchDistribution, name: str) -> torch.Tensor:
    """A parameter expanded to the distribution's batch shape (and its own trailing dims)."""
    value = getattr(base, name)
    return value.expand(*base.batch_shape, *value.shape[len(base.batch_shape) :])


def _rebuilt(like: dist.TorchDistribution, full: dict[str, torch.Tensor]) -> dist.TorchDistribution:
    """A distribution of ``like``'s kind (and ``Independent`` wrappers) from ``full``."""
    if isinstance(like, dist.Independent):
        return dist.Independent(_rebuilt(like.base_dist, full), like.reinterpreted_batch_ndims)
    if type(like) is dist.Normal:
        return dist.Normal(full["loc"], full["scale"])
    return type(like)(logits=full["logits"])


def concatenate(parts: list[dist.TorchDistribution], num_rows: int) -> dist.TorchDistribution:
    """The distribution of every row from the distributions of slices of rows, in order.

    Args:
        parts: The slices' distributions.
        num_rows: Their rows together.

    Returns:
        See :class:`Concatenation`.
    """
    together = Concatenation(num_rows)
    for part in parts:
        together.add(part)
    return together.result()
