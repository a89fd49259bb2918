"""Minibatches for :func:`~pyro_bbb.fit`: from tensors or a ``DataLoader``, checked once.

:func:`make_batches` turns ``(x, y)`` tensors (shuffled per epoch with torch's generator) or
a ``DataLoader`` into a re-iterable source of minibatches already on the training device, and
checks the data against the model (dtype, NaN/inf, rows, the likelihood's targets, the
model's ``num_data``) with errors that name the argument. :func:`check_likelihood_scale`
checks that the model scales a minibatch's log-likelihood by :math:`N/B`. Nothing here
trains.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample
from torch.utils.data import DataLoader

from .._validation import (
    check_dtype,
    check_finite_tensor,
    check_floating_tensor,
    check_same_rows,
    check_tensor,
)

__all__ = ["Batches", "check_likelihood_scale", "make_batches"]


class Batches:
    """Re-iterable minibatches of tensors already on the training device, or a loader."""

    def __init__(
        self,
        make: Callable[[], Iterable],
        num_steps: int,
        num_data: int,
        rows: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> None:
        self._make, self._num_steps, self.num_data = make, num_steps, num_data
        self._rows = rows

    def __call__(self) -> Iterable:
        """One epoch's minibatches, ``(x, y)`` pairs."""
        return self._make()

    def sample(self, max_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to ``max_rows`` training points, ``(x, y)``, without using the random state.

        A fixed random subset of tensor data; the first batch of a ``DataLoader``.
        """
        if self._rows is not None:
            return self._rows(max_rows)
        return next(iter(self._make()))

    def __len__(self) -> int:
        return self._num_steps


def make_batches(
    model, x, y, batch_size: int | None, shuffle: bool, device: torch.device
) -> Batches:
    """Check the data and return its minibatches on ``device``.

    Args:
        model: The model; its ``num_data``, ``net`` and ``likelihood`` are read if present.
        x: Features ``(N, *features)``, or a ``DataLoader`` of ``(x, y)`` batches.
        y: Targets ``(N[, dim])``, or ``None`` with a loader.
        batch_size: Rows per step; ``None`` for the full batch.
        shuffle: Draw a new order every epoch (tensor input).
        device: Where the batches go.

    Returns:
        :class:`Batches`: ``batches()`` iterates one epoch, ``len(batches)`` is its steps.

    Raises:
        TypeError: If ``x``/``y`` are neither tensors nor a loader and ``None``.
        ValueError: On bad data, or a data set whose size is not the model's ``num_data``.
    """
    num_data = getattr(model, "num_data", None)
    if isinstance(x, DataLoader):
        if y is not None:
            raise ValueError("y must be None when x is a DataLoader (it yields (x, y) pairs)")
        size = len(x.dataset) if hasattr(x.dataset, "__len__") else None
        if num_data is not None and size is not None and size != num_data:
            raise ValueError(
                f"the DataLoader's dataset has {size} points but model.num_data={num_data}"
            )

        widths: dict[str, int] = {}

        def loader_batches():
            for batch in x:
                xb, yb = (t.to(device, non_blocking=True) for t in batch)
                _check_data(model, xb, yb, widths)
                yield xb, yb

        return Batches(loader_batches, len(x), num_data or size or 1)

    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError(
            "x and y must be tensors (or x a DataLoader and y None), got "
            f"{type(x).__name__} and {type(y).__name__}"
        )
    check_tensor("x", x)
    check_tensor("y", y)
    x, y = x.to(device), y.to(device)
    _check_data(model, x, y)
    n = x.shape[0]
    if num_data is not None and n != num_data:
        raise ValueError(
            f"x has {n} rows but model.num_data={num_data}; num_data must be the training-set "
            "size for the KL to be weighted correctly"
        )
    size = n if batch_size is None else min(batch_size, n)
    num_steps = math.ceil(n / size)

    def tensor_batches():
        order = torch.randperm(n, device=device) if shuffle and size < n else None
        for k in range(num_steps):
            if order is None:
                yield x[k * size : (k + 1) * size], y[k * size : (k + 1) * size]
            else:
                idx = order[k * size : (k + 1) * size]
                yield x[idx], y[idx]

    def rows(max_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        if n <= max_rows:
            return x, y
        generator = torch.Generator().manual_seed(0)
        index = torch.randperm(n, generator=generator)[:max_rows].to(device)
        return x[index], y[index]

    return Batches(tensor_batches, num_steps, num_data or n, rows)


def _check_data(model, x: torch.Tensor, y: torch.Tensor, widths: dict | None = None) -> None:
    """Validate data by reading its values (dtype, NaN/inf, shapes, labels).

    ``widths`` caches the network's output width across the batches of a loader, so the
    network runs once per fit for this check, not once per batch.
    """
    check_floating_tensor("x", x)
    check_dtype("x", x, getattr(model, "dtype", None))
    check_finite_tensor("x", x)
    check_same_rows(x, y)
    likelihood = getattr(model, "likelihood", None)
    net = getattr(model, "net", None)
    if likelihood is not None and net is not None:
        widths = {} if widths is None else widths
        if "out" not in widths:
            with torch.no_grad(), poutine.block():
                widths["out"] = net(x[:1]).shape[-1]
        likelihood.check_target(y, widths["out"])


def check_likelihood_scale(model, batch: Sequence[torch.Tensor], num_data: int) -> None:
    r"""Check that the model scales a minibatch's log-likelihood by :math:`N/B`.

    The ELBO counts the KL once per step and relies on the model to weight a batch of ``B``
    of the ``N`` points by :math:`N/B`, as a subsampled ``pyro.plate("data", N,
    subsample=...)`` does (:class:`~pyro_bbb.BNN` has one). A model whose data plate is
    sized by the batch instead would silently weight the KL :math:`N/B` times too much. The
    model is traced once on ``batch``, with weights from the prior, and every observed site's
    scale is compared with :math:`N/B`; nothing is checked when ``B = N``.

    Args:
        model: The Pyro model ``model(x, y)``.
        batch: The first minibatch ``(x, y)``.
        num_data: ``N``, the size of the training set.

    Raises:
        ValueError: Naming the site, its scale and the expected :math:`N/B`.
    """
    size = batch[0].shape[0]
    if size == num_data:
        return
    expected = num_data / size
    cuda = sorted({t.device for t in batch if t.device.type == "cuda"}, key=str)
    with torch.random.fork_rng(devices=cuda), torch.no_grad(), poutine.block():
        trace = poutine.trace(model).get_trace(*batch)
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or not site["is_observed"] or site_is_subsample(site):
            continue
        scale = float(site["scale"])
        if not math.isclose(scale, expected, rel_tol=1e-5):
            raise ValueError(
                f"the model's observed site {name!r} has its log-likelihood scaled by "
                f"{scale:g} on a minibatch of {size} of the {num_data} training points, but "
                f"by N/B = {expected:g} is needed, or the KL is weighted {expected / scale:g} "
                f"times too much. Put the site in pyro.plate('data', {num_data}, "
                "subsample=...) sized by the whole training set (as pyro_bbb.BNN does), or "
                "train full batch (batch_size=None); to temper, use beta= instead"
            )
