"""Training: :func:`fit`, its :class:`History` and the :class:`Callback` hooks.

``fit`` is a plain loop over :class:`~pyro_bbb.elbo.AnnealedELBO` estimates with one
``torch.optim`` optimiser over every parameter of the model and guide (Pyro's ``PyroOptim``
builds one optimiser per parameter, which costs more than the network on small models). It
is ``pyro.infer.SVI``'s ``step`` written out, so that β can change per step, the ELBO's parts
are recorded, and hooks can act between the backward pass and the update: a data-parallel
wrapper is a :class:`Callback` whose ``on_after_backward`` all-reduces the gradients (each
worker's minibatch loss is already an unbiased estimate of the whole-data loss, so the
average over workers is too).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from torch.utils.data import DataLoader

from .elbo import AnnealedELBO, ScheduleLike, as_schedule
from .reparam import estimator

__all__ = ["Callback", "History", "fit"]


@dataclass
class History:
    r"""Per-epoch record of a fit; every list has one entry per epoch.

    Losses are whole-data-set quantities: the mean over the epoch's steps of the minibatch
    estimates, each of which is unbiased for the full-batch value.

    Attributes:
        loss: Negative β-annealed ELBO, :math:`\\text{nll} + \\beta\\,\\text{kl}` (nats).
        loss_per_datum: ``loss / num_data`` (nats per data point).
        nll: Expected negative log-likelihood of the training set (nats).
        kl: :math:`\\mathrm{KL}(q \\| p)` (nats), not weighted by β.
        beta: Mean β over the epoch.
        seconds: Wall-clock seconds per epoch.
        steps: Optimiser steps taken by the end of each epoch (cumulative).
        num_data: Number of training points ``N``.
    """

    num_data: int
    loss: list[float] = field(default_factory=list)
    loss_per_datum: list[float] = field(default_factory=list)
    nll: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    beta: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.loss)

    @property
    def elbo(self) -> list[float]:
        """The β-annealed ELBO per epoch, ``-loss``."""
        return [-v for v in self.loss]

    def as_dict(self) -> dict[str, list[float] | list[int]]:
        """The per-epoch lists by name (e.g. for a ``pandas.DataFrame``)."""
        names = ("loss", "loss_per_datum", "nll", "kl", "beta", "seconds", "steps")
        return {name: list(getattr(self, name)) for name in names}

    def __repr__(self) -> str:
        if not self.loss:
            return "History(empty)"
        return (
            f"History({len(self)} epochs, {self.steps[-1]} steps, "
            f"{sum(self.seconds):.1f} s; last: loss={self.loss[-1]:.4g} "
            f"({self.loss_per_datum[-1]:.4g}/datum), nll={self.nll[-1]:.4g}, "
            f"kl={self.kl[-1]:.4g}, beta={self.beta[-1]:.3g})"
        )


class Callback:
    """Hooks into :func:`fit`. Override the ones you need; all default to doing nothing."""

    def on_fit_start(self, params: Sequence[torch.Tensor], history: History) -> None:
        """Called once, after the guide is set up and before the first step."""

    def on_after_backward(self, params: Sequence[torch.Tensor], step: int) -> None:
        """Called between ``loss.backward()`` and ``optimizer.step()`` (e.g. all-reduce)."""

    def on_epoch_end(self, epoch: int, history: History) -> bool | None:
        """Called after each epoch's record is appended; return ``True`` to stop training."""
        return None


OptimizerSpec = type[torch.optim.Optimizer] | Callable[[list[torch.Tensor]], torch.optim.Optimizer]


def fit(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    x: torch.Tensor | DataLoader,
    y: torch.Tensor | None = None,
    *,
    epochs: int = 100,
    batch_size: int | None = None,
    lr: float = 1e-2,
    optimizer: OptimizerSpec | None = None,
    beta: ScheduleLike = 1.0,
    num_particles: int = 1,
    reparam: str | None = None,
    device: str | torch.device | None = None,
    seed: int | None = None,
    progress: bool | None = None,
    callbacks: Iterable[Callback] = (),
    shuffle: bool = True,
) -> History:
    r"""Train a guide (and the model's point-estimated parameters) by maximising the ELBO.

    Each step draws a minibatch of ``B`` of the ``N`` points, estimates
    :math:`-\mathcal{L}_\beta = \frac{N}{B}\sum_{i \in \text{batch}} -\log p(y_i|w)
    + \beta\,\mathrm{KL}(q\|p)` with :class:`~pyro_bbb.elbo.AnnealedELBO`, and takes one
    optimiser step. β comes from ``beta(t)`` with ``t`` in epochs, fractional within an
    epoch.

    Args:
        model: A :class:`~pyro_bbb.BNN` (or any Pyro model ``model(x, y)`` with a data plate
            of size ``num_data``).
        guide: A guide for ``model``: :class:`~pyro_bbb.MeanFieldGuide` or any
            reparameterised Pyro guide, e.g. ``AutoNormal(model)``.
        x: Features ``(N, *features)``, or a ``DataLoader`` yielding ``(x, y)`` batches (then
            ``y`` must be ``None`` and ``batch_size``/``shuffle`` are the loader's).
        y: Targets ``(N,)`` or ``(N, dim)``.
        epochs: Passes over the data.
        batch_size: Minibatch size ``B``; ``None`` for full batch.
        lr: Learning rate of the default Adam optimiser.
        optimizer: A ``torch.optim.Optimizer`` class (built with ``lr``) or a function from the
            parameter list to an optimiser. Defaults to ``torch.optim.Adam`` with its fused
            implementation (same algorithm, one kernel over all tensors) where the
            parameters allow it: floating point, on one CPU or CUDA device.
        beta: KL weight: a number, a :mod:`~pyro_bbb.elbo` schedule (``Linear(20)``,
            ``Sigmoid(...)``, ``Cyclical(...)``) or any callable of the epoch.
        num_particles: Weight samples per step, vectorised.
        reparam: Gradient estimator: ``None`` (sample the weights), ``"local"`` or
            ``"flipout"`` (see :mod:`pyro_bbb.reparam`).
        device: Move model, guide and data here (e.g. ``"cuda"``); ``None`` keeps the
            model's device.
        seed: Seed for Pyro, torch and the minibatch order.
        progress: Show a tqdm bar; ``None`` shows it when stderr is a terminal.
        callbacks: :class:`Callback` objects.
        shuffle: Reshuffle the data every epoch (tensor input).

    Returns:
        The :class:`History` of the fit.

    Raises:
        ValueError: On bad data (shapes, dtypes, NaN/inf, labels out of range, a data set
            whose size is not the model's ``num_data``) or bad options.
        FloatingPointError: When the loss becomes NaN or inf, naming the epoch, step and
            the sites whose terms are not finite.
    """
    _check_positive_int("epochs", epochs)
    if batch_size is not None:
        _check_positive_int("batch_size", batch_size)
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    schedule = as_schedule(beta)
    handler = estimator(reparam)
    if seed is not None:
        pyro.set_rng_seed(seed)
    if device is not None:
        device = torch.device(device)
        _move(model, device)
        _move(guide, device)
    data_device = device if device is not None else _device_of(model)
    batches = _batches(model, x, y, batch_size, shuffle, data_device)

    elbo = AnnealedELBO(schedule(0.0), num_particles=num_particles)
    first = next(iter(batches()))
    # Find the parameters (creating the guide's) without using up random numbers: the first
    # step then draws what SVI's first step would draw from the same seed.
    with (
        torch.random.fork_rng(devices=_cuda_devices(model, guide)),
        pyro.validation_enabled(False),
        handler(),
        poutine.trace(param_only=True) as capture,
        torch.no_grad(),
    ):
        elbo.terms(model, guide, *first)
    params = _unique(site["value"].unconstrained() for site in capture.trace.nodes.values())
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("the model and guide have no trainable parameters")
    optim = _make_optimizer(optimizer, params, lr)

    callbacks = list(callbacks)
    history = History(num_data=batches.num_data)
    for callback in callbacks:
        callback.on_fit_start(params, history)
    show = sys.stderr.isatty() if progress is None else progress
    bar = _progress(epochs, show)
    step = 0
    for epoch in range(epochs):
        start = time.perf_counter()
        parts: list[torch.Tensor] = []  # (loss, nll, kl) of each step, summed at epoch end
        betas = 0.0
        num_steps = len(batches)
        for i, batch in enumerate(batches()):
            elbo.beta = schedule(epoch + i / num_steps)
            with pyro.validation_enabled(False), handler():
                terms = elbo.terms(model, guide, *batch)
            if not torch.isfinite(terms.loss):
                raise _non_finite(terms, epoch, i, step)
            optim.zero_grad(set_to_none=True)
            terms.loss.backward()
            for callback in callbacks:
                callback.on_after_backward(params, step)
            optim.step()
            parts += (terms.loss.detach(), terms.nll.detach(), terms.kl.detach())
            betas += terms.beta
            step += 1
        steps_done = len(parts) // 3
        if not steps_done:
            raise ValueError(f"epoch {epoch}: the data yielded no minibatch")
        means = torch.stack(parts).to(torch.float64).reshape(steps_done, 3).mean(0)
        loss, nll, kl = means.tolist()
        history.loss.append(loss)
        history.loss_per_datum.append(loss / history.num_data)
        history.nll.append(nll)
        history.kl.append(kl)
        history.beta.append(betas / steps_done)
        history.seconds.append(time.perf_counter() - start)
        history.steps.append(step)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                loss=f"{loss:.4g}", nll=f"{nll:.4g}", kl=f"{kl:.4g}", beta=f"{elbo.beta:.2g}"
            )
        if any(callback.on_epoch_end(epoch, history) for callback in callbacks):
            break
    if bar is not None:
        bar.close()
    return history


# ----------------------------------------------------------------------------- helpers
def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _move(module: object, device: torch.device) -> None:
    if isinstance(module, torch.nn.Module):
        module.to(device)


def _device_of(model: object) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    if isinstance(model, torch.nn.Module):
        for tensor in (*model.parameters(), *model.buffers()):
            return tensor.device
    return torch.device("cpu")


def _cuda_devices(*modules: object) -> list[torch.device]:
    devices = {
        t.device
        for module in modules
        if isinstance(module, torch.nn.Module)
        for t in (*module.parameters(), *module.buffers())
        if t.device.type == "cuda"
    }
    return sorted(devices, key=lambda d: d.index or 0)


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for t in tensors:
        seen.setdefault(id(t), t)
    return list(seen.values())


_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _make_optimizer(
    spec: OptimizerSpec | None, params: list[torch.Tensor], lr: float
) -> torch.optim.Optimizer:
    if spec is None:
        # The fused kernel is the same algorithm in one pass over every tensor: on a small
        # network Adam's per-tensor loop costs as much as the network itself.
        fused = (
            all(p.dtype in _FUSED_DTYPES and p.device.type in ("cpu", "cuda") for p in params)
            and len({p.device for p in params}) == 1
        )
        return torch.optim.Adam(params, lr=lr, fused=fused or None)
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        return spec(params, lr=lr)
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


def _progress(epochs: int, show: bool):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=epochs, desc="fit", unit="epoch", dynamic_ncols=True)


def _non_finite(terms, epoch: int, step_in_epoch: int, step: int) -> FloatingPointError:
    bad = [name for name, value in terms.sites.items() if not torch.isfinite(value).all()]
    where = f"site(s) {bad}" if bad else "no single site (the sum overflowed)"
    return FloatingPointError(
        f"the loss is {terms.loss.item()} at epoch {epoch}, step {step_in_epoch} (step {step} "
        f"overall); non-finite terms at {where}. Lower lr, check the data, or use a smaller "
        "init_scale."
    )


class _Batches:
    """Re-iterable minibatches of tensors already on the training device, or a loader."""

    def __init__(self, make: Callable[[], Iterable], num_steps: int, num_data: int) -> None:
        self._make, self._num_steps, self.num_data = make, num_steps, num_data

    def __call__(self) -> Iterable:
        return self._make()

    def __len__(self) -> int:
        return self._num_steps


def _batches(model, x, y, batch_size, shuffle, device) -> _Batches:
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

        return _Batches(loader_batches, len(x), num_data or size or 1)

    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError(
            "x and y must be tensors (or x a DataLoader and y None), got "
            f"{type(x).__name__} and {type(y).__name__}"
        )
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

    return _Batches(tensor_batches, num_steps, num_data or n)


def _check_data(model, x: torch.Tensor, y: torch.Tensor, widths: dict | None = None) -> None:
    """Validate data by reading its values (dtype, NaN/inf, shapes, labels).

    ``widths`` caches the network's output width across the batches of a loader, so the
    network runs once per fit for this check, not once per batch.
    """
    if not torch.is_floating_point(x):
        raise ValueError(f"x must be floating point (e.g. x.float()), got dtype {x.dtype}")
    if not torch.isfinite(x).all():
        bad = (~torch.isfinite(x)).nonzero()[0].tolist()
        raise ValueError(f"x contains NaN or inf (first at index {bad})")
    if x.shape[:1] != y.shape[:1]:
        raise ValueError(
            f"x and y must have the same number of rows, got x {tuple(x.shape)} and "
            f"y {tuple(y.shape)}"
        )
    likelihood = getattr(model, "likelihood", None)
    net = getattr(model, "net", None)
    if likelihood is not None and net is not None:
        widths = {} if widths is None else widths
        if "out" not in widths:
            with torch.no_grad(), poutine.block():
                widths["out"] = net(x[:1]).shape[-1]
        likelihood.check_target(y, widths["out"])
