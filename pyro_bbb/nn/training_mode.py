"""Whether a network is a function of its weights alone: the modules that depend on its mode.

In training mode dropout draws new masks at every call and batch or instance normalisation
uses (and updates) the batch's statistics, so the network's output is random or depends on
the rest of the batch. What samples or linearises the network as one function of its weights
(NUTS's potential, the online filters) refuses it in that mode, naming the module by
:func:`module_in_training_mode`. What scores a fit as it goes (the held-out rows, the
collapse check) runs it in evaluation mode for the while, :func:`in_evaluation_mode`, and
gives every module its mode back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

__all__ = [
    "batch_norm_in_training_mode",
    "in_evaluation_mode",
    "module_class_name",
    "module_in_training_mode",
]

#: Modules whose forward depends on training mode: random (dropout) or on the batch.
_TRAINING_MODE = (
    nn.modules.dropout._DropoutNd,
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
)


def module_class_name(module: nn.Module) -> str:
    """``Dropout`` for Pyro's ``PyroDropout``: the first class in the MRO that is not Pyro's."""
    cls = next(c for c in type(module).__mro__ if not c.__module__.startswith("pyro."))
    return cls.__name__


def module_in_training_mode(model: nn.Module) -> str | None:
    """The first dropout or normalisation module in training mode, as ``'name' (Class)``.

    In training mode dropout draws new masks at every call and batch normalisation uses (and
    updates) batch statistics, so the network is not a function of its weights alone.

    Returns:
        ``"'net.2' (Dropout)"``, or ``None`` when every such module is in evaluation mode,
        or when ``model`` is not a module (a model function: what it calls is not seen).
    """
    if not isinstance(model, nn.Module):
        return None
    return _first_in_training_mode(model, _TRAINING_MODE)


def batch_norm_in_training_mode(model: nn.Module) -> str | None:
    """The first batch normalisation in training mode, as ``'name' (Class)``, or ``None``.

    In training mode it normalises a batch by the batch's own statistics and updates its
    running ones in place: what a prediction gives then depends on the rows it is computed
    with, and the prediction changes the network.
    """
    return _first_in_training_mode(model, nn.modules.batchnorm._BatchNorm)


def _first_in_training_mode(model: nn.Module, kinds: type | tuple[type, ...]) -> str | None:
    """The first module of ``kinds`` in training mode, as ``'name' (Class)``, or ``None``."""
    for name, module in model.named_modules():
        if module.training and isinstance(module, kinds):
            return f"{name!r} ({module_class_name(module)})"
    return None


@contextlib.contextmanager
def in_evaluation_mode(model: object) -> Iterator[None]:
    """Run ``model`` in evaluation mode inside the block, then give each module its mode back.

    A validation pass, as Keras' ``fit(validation_data=...)`` and Lightning's validation
    loop run it: dropout off, batch normalisation by its running statistics, so a score is
    a function of the weights alone and does not depend on how its rows are split. A model
    that is not a module (a model function) is left as it is.
    """
    if not isinstance(model, nn.Module):
        yield
        return
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
