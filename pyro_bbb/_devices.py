"""Where a model, a guide or data live: the device to train on, the CUDA devices to fork.

``fit`` trains on the model's device unless told otherwise, and ``fit``, ``load`` and the
checks that trace a model "without using up random numbers" fork the random state of every
CUDA device the traced tensors live on. Both questions are answered here, once.
"""

from __future__ import annotations

import torch

__all__ = ["checked_device", "cuda_devices", "device_of"]


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


def checked_device(name: str, device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``, refused at once where this process cannot use it.

    A CUDA device without CUDA would otherwise fail deep inside the first ``.to(device)``
    with torch's "Torch not compiled with CUDA enabled"; the message says which argument,
    why, and what to pass instead.

    Args:
        name: The argument's name, for the message.
        device: A device or its name (``"cpu"``, ``"cuda"``, ``"cuda:1"``).

    Raises:
        ValueError: On a name torch does not read as a device, a CUDA device where torch
            has no CUDA (a CPU build) or sees no GPU, or a CUDA index it does not have.
    """
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(
            f"{name} must be a device such as 'cpu' or 'cuda', got {device!r}"
        ) from error
    if resolved.type != "cuda":
        return resolved
    if not torch.cuda.is_available():
        why = (
            f"this torch ({torch.__version__}) is a CPU build"
            if torch.version.cuda is None
            else "torch sees no CUDA device"
        )
        raise ValueError(f"{name}={str(device)!r} but {why}; pass {name}='cpu' or leave it None")
    count = torch.cuda.device_count()
    if resolved.index is not None and resolved.index >= count:
        raise ValueError(
            f"{name}={str(device)!r} but torch sees {count} CUDA device(s), cuda:0 to "
            f"cuda:{count - 1}"
        )
    return resolved


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
