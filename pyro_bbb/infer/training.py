"""Training: :func:`fit` and the :class:`Callback` hooks.

``fit`` is a plain loop over :class:`~pyro_bbb.infer.elbo.AnnealedELBO` estimates with one
``torch.optim`` optimiser over every parameter of the model and guide (Pyro's ``PyroOptim``
builds one optimiser per parameter, which costs more than the network on small models). It
is ``pyro.infer.SVI``'s ``step`` written out, so that β can change per step, the ELBO's parts
are recorded, and hooks can act between the backward pass and the update: a data-parallel
wrapper is a :class:`Callback` whose ``on_after_backward`` all-reduces the gradients (each
worker's minibatch loss is already an unbiased estimate of the whole-data loss, so the
average over workers is too).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from torch.utils.data import DataLoader

from .._validation import check_int, check_positive_number
from .collapse import FRACTION_THRESHOLD as COLLAPSE_FRACTION
from .collapse import CollapseMonitor, diagnose_collapse, warn_if_collapsed
from .elbo import AnnealedELBO, ELBOTerms
from .history import History
from .minibatches import check_likelihood_scale, make_batches
from .reparam import estimator
from .schedules import ScheduleLike, as_schedule, delayed_warmup

__all__ = ["Callback", "fit"]


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
    beta: ScheduleLike | None = None,
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
    + \beta\,\mathrm{KL}(q\|p)` with :class:`~pyro_bbb.infer.elbo.AnnealedELBO`, and takes one
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
        beta: KL weight: a number, a :mod:`~pyro_bbb.infer.schedules` schedule
            (``LinearWarmup(20)``, ``SigmoidWarmup(...)``, ``CyclicalAnnealing(...)``) or any
            callable of the epoch. ``None`` (the default) fits the likelihood first:
            β = 0 for the first quarter of the epochs, linear to 1 by half-way, then the
            plain ELBO (:func:`~pyro_bbb.infer.schedules.delayed_warmup`); it keeps a guide
            started wide from settling at the prior on small data. Pass ``beta=1.0`` for
            the plain ELBO throughout, e.g. to continue a fit.
        num_particles: Weight samples per step, vectorised.
        reparam: Gradient estimator: ``None`` (sample the weights), ``"local"`` or
            ``"flipout"`` (see :mod:`pyro_bbb.infer.reparam`).
        device: Move model, guide and data here (e.g. ``"cuda"``); ``None`` keeps the
            model's device.
        seed: Seed for Pyro, torch and the minibatch order.
        progress: Show a tqdm bar; ``None`` shows it when stderr is a terminal.
        callbacks: :class:`Callback` objects.
        shuffle: Reshuffle the data every epoch (tensor input).

    Returns:
        The :class:`History` of the fit.

    Warns:
        PosteriorCollapseWarning: When training ends with most weights at their prior and the
            predictive mean missing structure in the data (up to 2,048 training points; see
            :mod:`pyro_bbb.infer.collapse`); the message gives the measurements and what to
            try.

    Raises:
        ValueError: On bad data (shapes, dtypes, NaN/inf, labels out of range, a data set
            whose size is not the model's ``num_data``), on a model that does not scale a
            minibatch's log-likelihood by ``N / B``, or on bad options.
        FloatingPointError: When the loss becomes NaN or inf, naming the epoch, step and
            the sites whose terms are not finite.
    """
    check_int("epochs", epochs)
    check_int("batch_size", batch_size, optional=True)
    check_positive_number("lr", lr)
    schedule = delayed_warmup(epochs) if beta is None else as_schedule(beta)
    handler = estimator(reparam)
    if seed is not None:
        pyro.set_rng_seed(seed)
    if device is not None:
        device = torch.device(device)
        _move(model, device)
        _move(guide, device)
    data_device = device if device is not None else _device_of(model)
    batches = make_batches(model, x, y, batch_size, shuffle, data_device)

    elbo = AnnealedELBO(schedule(0.0), num_particles=num_particles)
    first = next(iter(batches()))
    check_likelihood_scale(model, first, batches.num_data)
    # Find the parameters (creating the guide's) without using up random numbers: the first
    # step then draws what SVI's first step would draw from the same seed.
    with (
        torch.random.fork_rng(devices=_cuda_devices(model, guide)),
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
    monitor = CollapseMonitor(model, guide, first[0])

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
            try:
                with handler():
                    terms = elbo.terms(model, guide, *batch)
            except ValueError as error:  # Pyro's validation found a NaN or bad parameter
                unvalidated = _unvalidated_terms(elbo, model, guide, handler, batch)
                if unvalidated is None:
                    raise
                raise _non_finite(unvalidated, epoch, i, step) from error
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
        history.collapsed.append(monitor.fraction())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(
                loss=f"{loss:.4g}", nll=f"{nll:.4g}", kl=f"{kl:.4g}", beta=f"{elbo.beta:.2g}"
            )
        if any(callback.on_epoch_end(epoch, history) for callback in callbacks):
            break
    if bar is not None:
        bar.close()
    if history.collapsed and history.collapsed[-1] >= COLLAPSE_FRACTION:
        warn_if_collapsed(diagnose_collapse(model, guide, *batches.sample(2048)))
    return history


# ----------------------------------------------------------------------------- helpers
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


def _unvalidated_terms(elbo, model, guide, handler, batch) -> ELBOTerms | None:
    """A step's ELBO terms without Pyro's validation, if they show a non-finite term.

    Mid-training, a validation error almost always means that a parameter went NaN or left
    its support; evaluating the step again without validation names the sites whose terms
    are not finite. ``None`` when that evaluation fails too or finds every term finite: the
    original error is then the better report.
    """
    try:
        with pyro.validation_enabled(False), torch.no_grad(), handler():
            terms = elbo.terms(model, guide, *batch)
    except Exception:
        return None
    if torch.isfinite(terms.loss) and all(torch.isfinite(v).all() for v in terms.sites.values()):
        return None
    return terms


def _non_finite(terms, epoch: int, step_in_epoch: int, step: int) -> FloatingPointError:
    bad = [name for name, value in terms.sites.items() if not torch.isfinite(value).all()]
    where = f"site(s) {bad}" if bad else "no single site (the sum overflowed)"
    return FloatingPointError(
        f"the loss is {terms.loss.item()} at epoch {epoch}, step {step_in_epoch} (step {step} "
        f"overall); non-finite terms at {where}. Lower lr, check the data, or use a smaller "
        "init_scale."
    )
