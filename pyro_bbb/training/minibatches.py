"""Minibatches for :func:`~pyro_bbb.fit`: from tensors or a ``DataLoader``, checked once.

:func:`make_batches` turns ``(x, y)`` tensors or a ``DataLoader`` into a re-iterable source
of minibatches already on the training device, and checks the data against the model
(dtype, NaN/inf, rows, the likelihood's targets, the model's ``num_data``) with errors that
name the argument. The order of tensor data is :func:`epoch_order`: a function of a seed and
the epoch only, drawn as ``torch.utils.data.DistributedSampler`` draws it, so that every
process of a data-parallel fit agrees on it, a resumed fit continues it, and Monte Carlo
noise never shifts it. :func:`check_likelihood_scale` checks that the model scales a
minibatch's log-likelihood by :math:`N/B`. :func:`warn_if_targets_unscaled` warns, once
before training, when regression targets are far from unit scale. Nothing here trains.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from pyro.poutine.util import site_is_subsample
from torch.utils.data import DataLoader, DistributedSampler

from .._validation import (
    check_features,
    check_finite_tensor,
    check_has_values,
    check_same_rows,
    conversion_hint,
)
from ..infer.sites import prior_trace
from ..model import checked_network_output

__all__ = [
    "TARGET_MEAN_LIMIT",
    "TARGET_STD_RANGE",
    "Batches",
    "TargetScaleWarning",
    "check_likelihood_scale",
    "epoch_order",
    "make_batches",
    "warn_if_targets_unscaled",
]


class Batches:
    """Re-iterable minibatches of tensors already on the training device, or a loader."""

    def __init__(
        self,
        make: Callable[[int], Iterable],
        num_steps: int,
        num_data: int,
        seed: int | None,
        rows: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> None:
        self._make, self._num_steps, self.num_data = make, num_steps, num_data
        #: The seed of the order (tensor input), ``None`` for a loader.
        self.seed = seed
        self._rows = rows
        #: The minibatches of every row, when these hold some out (``make_batches(rows=)``).
        self.every_row: Batches | None = None

    def __call__(self, epoch: int = 0) -> Iterable:
        """Epoch ``epoch``'s minibatches, ``(x, y)`` pairs."""
        return self._make(epoch)

    def sample(self, max_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to ``max_rows`` training points, ``(x, y)``, without using the random state.

        A fixed random subset of tensor data; the first batch of a ``DataLoader``.
        """
        if self._rows is not None:
            return self._rows(max_rows)
        return next(iter(self._make(0)))

    def __len__(self) -> int:
        return self._num_steps


def epoch_order(
    num_data: int,
    epoch: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    rank: int = 0,
    world_size: int = 1,
) -> torch.Tensor:
    """The indices one process visits in one epoch, as ``DistributedSampler`` draws them.

    The permutation of ``range(num_data)`` comes from a generator seeded with
    ``seed + epoch`` (the same on every process); it is padded by repeating its start to a
    multiple of ``world_size``, and process ``rank`` takes every ``world_size``-th index from
    ``rank`` on. Minibatch ``k`` of ``B`` rows on every process together is then the slice
    ``[k·world_size·B, (k+1)·world_size·B)`` of the permutation: the minibatch of one
    process with ``world_size·B`` rows.

    Args:
        num_data: ``N``, the number of data points.
        epoch: The epoch, from 0.
        seed: The seed of the order.
        shuffle: Permute; ``False`` keeps ``range(N)`` (then padded and strided).
        rank: This process's rank.
        world_size: The number of processes.

    Returns:
        ``(ceil(N / world_size),)`` int64 indices, on the CPU.
    """
    if shuffle:
        generator = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(num_data, generator=generator)
    else:
        order = torch.arange(num_data)
    total = math.ceil(num_data / world_size) * world_size
    if total > num_data:
        order = order.repeat(math.ceil(total / num_data))[:total]
    return order[rank:total:world_size]


def make_batches(
    model: Callable[..., Any],
    x: torch.Tensor | DataLoader,
    y: torch.Tensor | None,
    batch_size: int | None,
    shuffle: bool,
    device: torch.device,
    *,
    seed: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    rows: torch.Tensor | None = None,
) -> Batches:
    """Check the data and return its minibatches on ``device``.

    Args:
        model: The model; its ``num_data``, ``net`` and ``likelihood`` are read if present.
        x: Features ``(N, *features)``, or a ``DataLoader`` of ``(x, y)`` batches.
        y: Targets ``(N[, dim])``, or ``None`` with a loader.
        batch_size: Rows per step and process; ``None`` for the process's whole shard.
        shuffle: Draw a new order every epoch (tensor input).
        device: Where the batches go.
        seed: Seed of the order of tensor data (:func:`epoch_order`); ``None`` draws one
            from torch's global generator.
        rank: This process's rank in a data-parallel fit.
        world_size: The number of processes; tensor data is split between them.
        rows: The indices of the rows the minibatches draw from (tensor data; the others
            are held out), or ``None`` for every row. A minibatch of ``B`` of them still
            stands for the whole data set: the model scales it by ``N / B``.

    Returns:
        :class:`Batches`: ``batches(epoch)`` iterates one epoch, ``len(batches)`` is its
        steps.

    Raises:
        TypeError: If ``x``/``y`` are neither tensors nor a loader and ``None``, or (when
            its batches are read) the loader does not yield ``(x, y)`` pairs of tensors.
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
        sampler = getattr(x.batch_sampler, "sampler", None) or x.sampler
        if world_size > 1 and not isinstance(sampler, DistributedSampler):
            warnings.warn(
                f"fit runs on {world_size} processes but the DataLoader's sampler is a "
                f"{type(sampler).__name__}: every process iterates the whole data set. Give "
                "it sampler=torch.utils.data.DistributedSampler(dataset).",
                stacklevel=3,
            )
        set_epoch = getattr(sampler, "set_epoch", None)
        widths: dict[str, int] = {}

        def loader_batches(epoch: int):
            if set_epoch is not None:  # a DistributedSampler reshuffles only when told
                set_epoch(epoch)
            for batch in x:
                xb, yb = (t.to(device, non_blocking=True) for t in _pair(batch))
                if not widths:  # the first batch: the targets' scale, from it alone
                    warn_if_targets_unscaled(model, yb)
                _check_data(model, xb, yb, widths)
                yield xb, yb

        return Batches(loader_batches, len(x), num_data or size or 1, None)

    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        dtype = getattr(model, "dtype", None)
        dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
        labels = getattr(getattr(model, "likelihood", None), "task", "") == "classification"
        fixes = [
            conversion_hint(value, name, None if name == "y" and labels else dtype)
            for name, value in (("x", x), ("y", y))
            if not isinstance(value, torch.Tensor)
        ]
        fix = " and ".join(f for f in fixes if f)
        raise TypeError(
            "x and y must be tensors (or x a DataLoader and y None), got "
            f"{type(x).__name__} and {type(y).__name__}" + (f"; convert with {fix}" if fix else "")
        )
    check_has_values("x", x)
    check_has_values("y", y)
    x, y = x.to(device), y.to(device)
    total = x.shape[0]
    shard = math.ceil((total if rows is None else len(rows)) / world_size)
    _check_data(model, x, y, rows=shard if batch_size is None else min(batch_size, shard))
    warn_if_targets_unscaled(model, y)
    if num_data is not None and total != num_data:
        raise ValueError(
            f"x has {total} rows but model.num_data={num_data}; num_data must be the "
            "training-set size for the KL to be weighted correctly"
        )
    options = dict(
        batch_size=batch_size, shuffle=shuffle, device=device, rank=rank, world_size=world_size,
        num_data=num_data or total,
    )  # fmt: skip
    if rows is None:
        return _tensor_batches(x, y, seed=seed, **options)
    batches = _tensor_batches(x[rows.to(device)], y[rows.to(device)], seed=seed, **options)
    batches.every_row = _tensor_batches(x, y, seed=seed, **options)
    return batches


def _pair(batch: Any) -> Sequence[torch.Tensor]:
    """A loader's batch as the ``(x, y)`` pair fit reads, or an error saying what came."""
    if isinstance(batch, Mapping):
        raise TypeError(
            f"the DataLoader yields dicts (keys {list(batch)}), but fit reads (x, y) pairs: "
            "have the Dataset's __getitem__ return (x, y), or give the DataLoader a "
            "collate_fn that returns them"
        )
    if (
        not isinstance(batch, Sequence)
        or len(batch) != 2
        or not all(isinstance(t, torch.Tensor) for t in batch)
    ):
        what = f"{len(batch)} items" if isinstance(batch, Sequence) else type(batch).__name__
        raise TypeError(
            f"the DataLoader yields {what} a batch, but fit reads (x, y) pairs of tensors: "
            "have the Dataset return (x, y) (a TensorDataset(x, y) does)"
        )
    return batch


def _tensor_batches(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int | None,
    shuffle: bool,
    device: torch.device,
    seed: int | None,
    rank: int,
    world_size: int,
    num_data: int,
) -> Batches:
    """The minibatches of checked tensors ``x``, ``y`` already on ``device``."""
    n = x.shape[0]
    shard = math.ceil(n / world_size)
    size = shard if batch_size is None else min(batch_size, shard)
    num_steps = math.ceil(shard / size)
    # One process that visits every row in one step needs no order: the sum is the same.
    ordered = world_size > 1 or (shuffle and size < n)
    if seed is None and ordered and shuffle:
        seed = int(torch.randint(0, 2**31 - 1, ()))

    def tensor_batches(epoch: int):
        if not ordered:
            for k in range(num_steps):
                yield x[k * size : (k + 1) * size], y[k * size : (k + 1) * size]
            return
        order = epoch_order(
            n, epoch, seed=seed or 0, shuffle=shuffle, rank=rank, world_size=world_size
        ).to(device)
        for k in range(num_steps):
            idx = order[k * size : (k + 1) * size]
            # index_select gathers the rows as x[idx] does, at a quarter of its cost a call
            # (7 against 30 us for 128 images of 784 pixels on one CPU thread)
            yield x.index_select(0, idx), y.index_select(0, idx)

    def sample(max_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        if n <= max_rows:
            return x, y
        generator = torch.Generator().manual_seed(0)
        index = torch.randperm(n, generator=generator)[:max_rows].to(device)
        return x.index_select(0, index), y.index_select(0, index)

    return Batches(tensor_batches, num_steps, num_data, seed, sample)


def _check_data(
    model, x: torch.Tensor, y: torch.Tensor, widths: dict | None = None, rows: int | None = None
) -> None:
    """Validate data by reading its values (dtype, NaN/inf, shapes, labels).

    The network runs once, on a minibatch's worth of rows (``rows``, all of ``x`` by
    default; BatchNorm needs more than one), to learn its output width; its buffers are
    left as they were. ``widths`` caches that width across the batches of a loader, so the
    network runs once per fit for this check, not once per batch.
    """
    tokens = getattr(model, "accepts_token_ids", False)
    check_features("x", x, getattr(model, "dtype", None), tokens=tokens)
    if x.is_floating_point():
        check_finite_tensor("x", x)
    check_same_rows(x, y)
    likelihood = getattr(model, "likelihood", None)
    net = getattr(model, "net", None)
    if likelihood is not None and net is not None:
        widths = {} if widths is None else widths
        if "out" not in widths:
            out = checked_network_output(net, x if rows is None else x[:rows])
            if out is None:
                return  # not one tensor: the model says so when it runs (BNN.forward)
            widths["out"] = out.shape[-1]
        likelihood.check_target(y, widths["out"])


class TargetScaleWarning(UserWarning):
    """Regression targets far from unit scale, which a network of unit-scale priors fits badly."""


#: Targets count as of unit scale when every column's standard deviation is within these ...
TARGET_STD_RANGE = (0.1, 10.0)
#: ... and its mean within this of 0.
TARGET_MEAN_LIMIT = 10.0


def warn_if_targets_unscaled(model: object, y: torch.Tensor) -> None:
    r"""Warn (:class:`TargetScaleWarning`) when regression targets are far from unit scale.

    A network with priors of unit scale on its weights (``mlp``'s and ``bayesianize``'s
    default :math:`\mathcal N(0, 1)`) draws functions of order one, and a learned noise
    starts at 1. Targets whose standard deviation is outside :data:`TARGET_STD_RANGE`, or
    whose mean is beyond :data:`TARGET_MEAN_LIMIT`, make the posterior pay a large KL for
    the weights the scale needs: measured at ``fit``'s defaults on 300 points of
    :math:`s(\sin 2x + \mathcal N(0, 0.1^2))` (1-32-32-1), the predictive mean's error over
    ``s`` was 0.05 at ``s = 1``, 0.17 at ``s = 100``, and at ``s = 0.01`` and
    :math:`10^5` (or ``s = 1`` shifted by 100) the posterior stayed at the prior and the
    noise took in the targets. Standardising them
    (:class:`~pyro_bbb.data.Standardizer`, then
    :meth:`~pyro_bbb.infer.predictive.RegressionPrediction.unstandardize` on the
    predictions) removes it. Only a model whose likelihood is a regression's is read;
    labels are not.

    Args:
        model: The model; its ``likelihood.task`` says whether the targets are a regression's.
        y: The targets ``(N[, dim])``, or a first minibatch of them.
    """
    likelihood = getattr(model, "likelihood", None)
    if getattr(likelihood, "task", None) != "regression" or not y.is_floating_point():
        return
    if y.shape[0] < 2:
        return
    columns = y.detach().reshape(y.shape[0], -1).double()
    std, mean = columns.std(0), columns.mean(0)
    low, high = TARGET_STD_RANGE
    bad = (std > high) | ((std < low) & (std > 0)) | (mean.abs() > TARGET_MEAN_LIMIT)
    if not bad.any():
        return
    k = int(bad.nonzero()[0, 0])
    where = f" (column {k})" if columns.shape[1] > 1 else ""
    warnings.warn(
        f"y{where} has mean {mean[k].item():.3g} and standard deviation {std[k].item():.3g}: "
        "a network whose weights have priors of unit scale draws functions of order one, so "
        "targets far from unit scale fit badly, or not at all (the posterior stays at the "
        "prior and the learned noise takes in the targets). Standardise them: "
        "scaler = pyro_bbb.data.Standardizer().fit(y), fit on scaler.transform(y), and read "
        "predictions in y's units with prediction.unstandardize(scaler.mean, scaler.std)",
        TargetScaleWarning,
        stacklevel=4,
    )


def check_likelihood_scale(
    model: Callable[..., Any], batch: Sequence[torch.Tensor], num_data: int
) -> None:
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
    for name, site in prior_trace(model, *batch).nodes.items():
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
