r"""Data-parallel training on ``torch.distributed``: the process group as ``fit`` sees it.

When a script has called ``torch.distributed.init_process_group()`` (under ``torchrun``,
which sets the rank, world size and rendezvous in the environment), :func:`data_parallel`
returns a :class:`DataParallel` for this process and ``fit`` trains data-parallel:

* parameters start identical on every process: :meth:`DataParallel.broadcast_` copies rank
  0's after the guide's lazy set-up;
* the gradients are averaged over processes after every backward pass
  (:meth:`DataParallel.average_gradients_`). Each process's loss is
  :math:`\frac{N}{B}\sum_{i \in b_r} -\log p(y_i|w) + \beta\,\mathrm{KL}`, so the average
  over ``W`` processes is :math:`\frac{N}{WB}\sum_{i \in \cup_r b_r} -\log p(y_i|w) +
  \beta\,\mathrm{KL}`: the likelihood scaled by ``N`` over the global batch and the KL
  counted once, the single-process objective with a batch of ``W·B``;
* the initialisation is shared (one seed for the set-up) while the Monte Carlo noise is
  seeded per process (:meth:`DataParallel.seed_noise`);
* the epoch's losses are averaged over processes (:meth:`DataParallel.mean`), so every
  process records the same ``History``.

The gradients are all-reduced by hand, one flat buffer per dtype and device, rather than by
wrapping the model in ``torch.nn.parallel.DistributedDataParallel``: a Pyro fit's parameters
belong to two modules and Pyro's param store, the guide creates its own only on its first
call, and the loss comes from traces of both, none of which DDP's one-module ``forward``
expects. DDP's advantage, overlapping communication with the backward pass in buckets, is
small for the networks this package trains on CPUs; one all-reduce per step is what DDP
does when everything fits in one bucket.

Where no process group is initialised, :func:`data_parallel` returns a world of one and every
method does nothing. Nothing here trains or reads data.

**Teardown.** A script ends with ``dist.barrier()`` then ``dist.destroy_process_group()``,
which frees the group and stops gloo's threads while the interpreter is whole. That needs
``import pyro_bbb`` before ``init_process_group()``: importing this module then imports
``torch.distributed.nn.functional``, whose functions bind the default group into their
default arguments when first imported. Left to torch, it is first imported with
``torch._dynamo``, by the first ``torch.optim`` optimiser, ``fit``'s, after the group exists:
those defaults kept the group alive past ``destroy_process_group()``, and gloo's threads ran
on into the interpreter's exit, where a process aborted now and then ("terminate called
without an active exception", SIGABRT).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import pyro
import torch
import torch.distributed as dist

if dist.is_available():  # before any group exists: see "Teardown" above
    import torch.distributed.nn.functional

__all__ = ["DataParallel", "data_parallel"]


@dataclass(frozen=True)
class DataParallel:
    """This process's place in a data-parallel fit.

    Attributes:
        rank: This process's rank, ``0 ≤ rank < world_size``.
        world_size: The number of processes, ``W``.
        local_rank: The rank on this machine (``LOCAL_RANK``, set by ``torchrun``), which
            picks the GPU.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        """Whether more than one process trains."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the process that shows progress and writes files."""
        return self.rank == 0

    def device(self, device: str | torch.device | None) -> torch.device | None:
        """The training device: a bare ``"cuda"`` becomes this process's GPU.

        Under ``torchrun`` every process on a machine would otherwise train on GPU 0;
        ``"cuda"`` is read as ``cuda:LOCAL_RANK``. A CUDA device of a data-parallel fit is
        made the current device, as NCCL's collectives need. The CPU or ``None`` pass
        through.
        """
        if device is None:
            return None
        device = torch.device(device)
        if self.active and device.type == "cuda":
            if device.index is None:
                device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(device)
        return device

    def shared_seed(self, seed: int | None, device: torch.device) -> int | None:
        """``seed``, or, with several processes and no seed, one drawn on rank 0 for all.

        The order of the data and the initialisation must agree between processes, so a
        data-parallel fit always has a seed.
        """
        if not self.active or seed is not None:
            return seed
        drawn = torch.randint(0, 2**31 - 1, (), dtype=torch.int64, device=device)
        dist.broadcast(drawn, src=0)
        return int(drawn)

    def seed_noise(self, seed: int | None) -> None:
        """Seed this process's Monte Carlo noise with ``seed + rank`` (several processes)."""
        if self.active and seed is not None:
            pyro.set_rng_seed(seed + self.rank)

    @torch.no_grad()
    def broadcast_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Overwrite ``tensors`` in place with rank 0's values."""
        if not self.active:
            return
        for group in _by_dtype_and_device(tensors):
            flat = torch.cat([t.reshape(-1) for t in group])
            dist.broadcast(flat, src=0)
            _copy_back(flat, group)

    @torch.no_grad()
    def average_gradients_(self, params: Sequence[torch.Tensor]) -> None:
        """Replace every parameter's gradient by its mean over processes, in place.

        One all-reduce per dtype and device of all gradients flattened together. A missing
        gradient counts as zeros, so that every process sends the same number of values.
        """
        if not self.active:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        for group in _by_dtype_and_device(grads):
            flat = torch.cat([g.reshape(-1) for g in group])
            dist.all_reduce(flat)
            flat.div_(self.world_size)
            _copy_back(flat, group)

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """The mean of ``values`` over processes (a new tensor; ``values`` itself if alone)."""
        if not self.active:
            return values
        total = values.clone()
        dist.all_reduce(total)
        return total / self.world_size

    def barrier(self) -> None:
        """Wait for every process (e.g. until rank 0 has written a file)."""
        if self.active:
            dist.barrier()

    def gather(self, obj: object) -> list[object]:
        """``obj`` of every process, by rank (a list of one when alone)."""
        if not self.active:
            return [obj]
        gathered: list[object] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered


def data_parallel() -> DataParallel:
    """This process's :class:`DataParallel`: from the initialised process group, else alone."""
    if not (dist.is_available() and dist.is_initialized()):
        return DataParallel()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    return DataParallel(rank=rank, world_size=world_size, local_rank=local_rank)


def _by_dtype_and_device(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    return list(groups.values())


def _copy_back(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    for t, chunk in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
        t.copy_(chunk.view_as(t))
