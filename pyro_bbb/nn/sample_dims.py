"""Reshapes that skip the leading sample dims which weight draws give activations.

Weight draws (several ELBO particles, ``predict``, an ensemble) give a Bayesian layer's output
leading sample dims, ``(*sample, batch, *features)``. A reshape that counts dims from the
front, such as the default ``nn.Flatten()`` (``start_dim=1``), would then merge the batch into
the features. During a forward of a network from :func:`~pyro_bbb.nn.builders.bayesianize`,
the number of sample dims seen so far is held in a :class:`contextvars.ContextVar`: the
network's root sets it to 0 when it is entered and restores the previous value when it is
left (also when its forward raises), so no count outlives the call that made it; each
Bayesian layer raises it to the sample dims of its output (:func:`note_sample_dims`).
:class:`SampleDimsFlatten` and :class:`SampleDimsUnflatten`, which ``bayesianize`` puts in
place of ``nn.Flatten`` and ``nn.Unflatten`` (by class swap: names, arguments and
``state_dict`` unchanged), shift a non-negative dim by that count, so each draw sees the
reshape the plain network applies. A negative dim counts from the end and is left as it is.

The count is a running maximum over the layers run so far in the call: a reshape applied to a
tensor that bypassed the Bayesian layers (the raw input, in a network whose forward uses it
again after them) must count its dims from the end.
"""

from __future__ import annotations

import contextvars
from typing import Any

import torch
from torch import nn

__all__ = [
    "SampleDimsFlatten",
    "SampleDimsUnflatten",
    "current_sample_dims",
    "note_sample_dims",
    "track_sample_dims",
]

#: Sample dims of the activations in the running forward; ``None`` outside any network.
_SAMPLE_DIMS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "pyro_bbb_sample_dims", default=None
)
_TOKENS = "_sample_dims_tokens"


def current_sample_dims() -> int:
    """Leading sample dims of the activations so far in this forward (0 outside one)."""
    return _SAMPLE_DIMS.get() or 0


def note_sample_dims(ndims: int) -> None:
    """Record that a layer's output carries ``ndims`` leading sample dims.

    Outside the forward of a network from ``bayesianize`` (a layer called on its own) nothing
    is recorded.
    """
    current = _SAMPLE_DIMS.get()
    if current is not None and ndims > current:
        _SAMPLE_DIMS.set(ndims)


def _enter(module: nn.Module, args: Any) -> None:
    # A network called inside another one's forward keeps the outer count: its input may
    # carry the outer draws' sample dims.
    start = _SAMPLE_DIMS.get()
    module.__dict__.setdefault(_TOKENS, []).append(_SAMPLE_DIMS.set(start or 0))


def _leave(module: nn.Module, args: Any, output: Any) -> None:
    tokens = module.__dict__.get(_TOKENS)
    if tokens:
        _SAMPLE_DIMS.reset(tokens.pop())


def track_sample_dims(root: nn.Module) -> None:
    """Count the sample dims of activations during each forward of ``root`` (hooks on it)."""
    root.register_forward_pre_hook(_enter)
    root.register_forward_hook(_leave, always_call=True)


def _shifted(dim: int) -> int:
    return dim + current_sample_dims() if dim >= 0 else dim


class SampleDimsFlatten(nn.Flatten):
    """``nn.Flatten`` for inputs ``(*sample, batch, ...)``.

    Non-negative dims skip the sample dims, so ``nn.Flatten()`` flattens each draw's
    features, not the batch.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return input.flatten(_shifted(self.start_dim), _shifted(self.end_dim))


class SampleDimsUnflatten(nn.Unflatten):
    """``nn.Unflatten`` for inputs ``(*sample, batch, ...)``: a non-negative ``dim`` skips them."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return input.unflatten(_shifted(self.dim), self.unflattened_size)


#: The reshapes and their versions that skip sample dims (module-level classes: they pickle).
SAMPLE_AWARE: dict[type[nn.Module], type[nn.Module]] = {
    nn.Flatten: SampleDimsFlatten,
    nn.Unflatten: SampleDimsUnflatten,
}
