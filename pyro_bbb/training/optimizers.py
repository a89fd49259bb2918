"""The optimiser of :func:`~pyro_bbb.fit`: one ``torch.optim`` optimiser over every parameter.

Pyro's ``PyroOptim`` builds one optimiser per parameter, which costs more than the network
on small models; ``fit`` builds one over all of them, by default ``torch.optim.Adam`` with
its fused implementation where the parameters allow it; :func:`reset_moments` makes it
forget its running statistics (an automatic run does where β reaches 1), in place; and
:func:`why_not_capturable` says whether a step can be captured with it (what
:mod:`~pyro_bbb.training.captured` asks of an optimiser). Nothing here trains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "BOUNDED_STEP",
    "OptimizerSpec",
    "make_optimizer",
    "reset_moments",
    "why_not_capturable",
]

#: Optimisers whose step the rate bounds, for which ``fit`` chooses rates: Adam and its
#: kin, RMSprop and Adagrad (subclasses too).
BOUNDED_STEP: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.RMSprop,
    torch.optim.Adagrad,
)

OptimizerSpec = type[torch.optim.Optimizer] | Callable[[list[torch.Tensor]], torch.optim.Optimizer]
"""A ``torch.optim.Optimizer`` class (built with ``lr``) or a function params -> optimiser."""

_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def make_optimizer(
    spec: OptimizerSpec | None,
    params: list[torch.Tensor],
    lr: float,
    *,
    groups: list[dict[str, Any]] | None = None,
) -> torch.optim.Optimizer:
    """Build the optimiser over ``params``.

    Args:
        spec: ``None`` for Adam (fused: the same algorithm in one kernel over all tensors,
            where every parameter is floating point on one CPU or CUDA device), an
            optimiser class, built as ``spec(params, lr=lr)``, or a function from the
            parameter list to an optimiser.
        params: The parameters to optimise, in the optimiser's order.
        lr: The learning rate of the default or of an optimiser class (unused by a function).
        groups: ``params`` in parameter groups with a rate each (``[{"params": [...],
            "lr": rate}]``, :func:`~pyro_bbb.training.rates.rate_groups`), given to the
            default or to an optimiser class in their place; a function is given
            ``params``.

    Returns:
        The optimiser.

    Raises:
        TypeError: If ``spec`` is neither, or the function returns no ``torch.optim.Optimizer``.
    """
    if spec is None:
        # The fused kernel is the same algorithm in one pass over every tensor: on a small
        # network Adam's per-tensor loop costs as much as the network itself.
        fused = (
            all(p.dtype in _FUSED_DTYPES and p.device.type in ("cpu", "cuda") for p in params)
            and len({p.device for p in params}) == 1
        )
        return torch.optim.Adam(groups or params, lr=lr, fused=fused or None)
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        return spec(groups or params, lr=lr)
    if callable(spec):
        optim = spec(params)
        if not isinstance(optim, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer(params) must return a torch.optim.Optimizer, got {type(optim).__name__}"
            )
        return optim
    raise TypeError(
        "optimizer must be a torch.optim.Optimizer class or a function params -> optimizer, "
        f"got {spec!r}"
    )


def why_not_capturable(optimizer: torch.optim.Optimizer) -> str | None:
    """Why a step of ``optimizer`` cannot be captured in a CUDA graph, or ``None`` if it can.

    A captured step needs one fused kernel over every parameter that reads its learning rate
    from a tensor on the device: ``torch.optim.Adam`` or ``AdamW`` with ``fused=True``
    (:func:`make_optimizer`'s default where the parameters allow it).
    """
    if type(optimizer) in (torch.optim.Adam, torch.optim.AdamW) and all(
        group.get("fused") for group in optimizer.param_groups
    ):
        return None
    return (
        f"the optimiser is {type(optimizer).__name__} "
        f"(fused={optimizer.param_groups[0].get('fused')}); a static step needs Adam or "
        "AdamW with fused=True (fit's default optimiser)"
    )


def reset_moments(optimizer: torch.optim.Optimizer) -> None:
    """Zero an optimiser's running moments and step counts in place, as if it had just begun.

    For Adam and its kin (AdamW, Adamax, NAdam, RAdam), RMSprop, Adagrad and SGD with
    momentum every state tensor is a running statistic or a count that starts at zero, and
    the next step re-starts the bias correction. The tensors keep their identity (a captured
    CUDA graph still reads them); other optimisers' state is left as it is.
    """
    if not isinstance(optimizer, _RESETTABLE):
        return
    with torch.no_grad():
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    value.zero_()
                elif isinstance(value, (int, float)):
                    state[key] = type(value)(0)


#: Optimisers whose state is tensors and step counts only, zeroed in place: those whose step
#: the rate bounds (Adam and its kin, RMSprop, Adagrad) and SGD.
_RESETTABLE = (*BOUNDED_STEP, torch.optim.SGD)
