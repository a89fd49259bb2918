"""Where a model, a guide or data live: the device to train on, the CUDA devices to fork.

``fit`` trains on the model's device unless told otherwise, and ``fit``, ``load`` and the
checks that trace a model "without using up random numbers" fork the random state of every
CUDA device the traced tensors live on. Both questions are answered here, once.
"""

from __future__ import annotations

import torch

__all__ = ["cuda_devices", "device_of"]


def device_of(*modules: object) -> torch.device:
    """The device of the first module that has one, else the CPU.

    A module's ``device`` attribute (as :class:`~pyro_bbb.BNN` has) is read first, then its
    first parameter or buffer.

    Args:
        *modules: Models, guides or anything else; non-modules without ``device`` are skipped.

    Returns:
        A ``torch.device``.
    """
    for module in modules:
        device = getattr(module, "device", None)
        if isinstance(device, torch.device):
            return device
        if isinstance(module, torch.nn.Module):
            for tensor in (*module.parameters(), *module.buffers()):
                return tensor.device
    return torch.device("cpu")


def cuda_devices(*things: object) -> list[torch.device]:
    """The CUDA devices of tensors and of modules' parameters and buffers, in index order.

    What ``torch.random.fork_rng(devices=...)`` needs to keep those devices' random states.

    Args:
        *things: Tensors and modules; anything else is skipped.

    Returns:
        The distinct CUDA devices, sorted by index; empty on a CPU-only run.
    """
    tensors = []
    for thing in things:
        if isinstance(thing, torch.Tensor):
            tensors.append(thing)
        elif isinstance(thing, torch.nn.Module):
            tensors += [*thing.parameters(), *thing.buffers()]
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    return sorted(devices, key=lambda d: d.index or 0)
