"""Where a fit runs: model and guide on the process's device, and the seed every process shares.

Under ``torch.distributed`` the device is the process's own and the seed rank 0's
(:mod:`~pyro_bbb.training.distributed`); nothing here trains.
"""

from __future__ import annotations

import pyro
import torch

from .._devices import checked_device, device_of
from .._validation import check_guide
from .distributed import DataParallel

__all__ = ["place"]


def place(
    model: object,
    guide: object,
    device: str | torch.device | None,
    seed: int | None,
    parallel: DataParallel,
) -> tuple[torch.device, int | None]:
    """Move model and guide to this process's device and seed; return the data's device.

    Under ``torch.distributed`` the device is the process's own (its local CUDA device) and
    the seed is rank 0's (drawn there when ``None``), so that every process builds the same
    initialisation. Returns the device the data go to and the seed, set in Pyro, torch,
    Python and NumPy.

    Raises:
        TypeError: If ``guide`` cannot be called (:func:`~pyro_bbb._validation.check_guide`).
        ValueError: If ``device`` is one this process cannot use
            (:func:`~pyro_bbb._devices.checked_device`).
    """
    check_guide("guide", guide)
    device = parallel.device(None if device is None else checked_device("device", device))
    if device is not None:
        _move(model, device)
        _move(guide, device)
    data_device = device if device is not None else device_of(model)
    seed = parallel.shared_seed(seed, data_device)
    if seed is not None:
        pyro.set_rng_seed(seed)
    return data_device, seed


def _move(module: object, device: torch.device) -> None:
    if isinstance(module, torch.nn.Module):
        module.to(device)
