"""Training: :func:`fit` and the :class:`Callback` hooks.

``fit`` is a plain loop over :class:`~pyro_bbb.infer.elbo.AnnealedELBO` estimates with one
``torch.optim`` optimiser over every parameter of the model and guide (Pyro's ``PyroOptim``
builds one optimiser per parameter, which costs more than the network on small models). It
is ``pyro.infer.SVI``'s ``step`` written out, so that β can change per step, the ELBO's parts
are recorded, and hooks can act between the backward pass and the update. Data-parallel
training (:mod:`~pyro_bbb.infer.distributed`) and checkpoints
(:mod:`~pyro_bbb.infer.checkpoint`) live in their own modules; ``fit`` calls them at marked
points.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from torch.utils.data import DataLoader

from .._validation import check_int, check_positive_number
from .checkpoint import Checkpointing, FitState
from .collapse import FRACTION_THRESHOLD as COLLAPSE_FRACTION
from .collapse import CollapseMonitor, diagnose_collapse, warn_if_collapsed
from .devices import cuda_devices, device_of
from .distributed import data_parallel
from .elbo import AnnealedELBO, ELBOTerms
from .history import History
from .minibatches import check_likelihood_scale, make_batches
from .reparam import estimator, warn_mixed_estimators
from .schedules import ScheduleLike, as_schedule, delayed_warmup

__all__ = ["Callback", "fit"]


class Callback:
    """Hooks into :func:`fit`. Override the ones you need; all default to doing nothing."""

    def on_fit_start(self, params: Sequence[torch.Tensor], history: History) -> None:
        """Called once, after the guide is set up and before the first step."""

    def on_after_backward(self, params: Sequence[torch.Tensor], step: int) -> None:
        """Called between ``loss.backward()`` and ``optimizer.step()`` (e.g. to clip).

        In a data-parallel fit the gradients are already averaged over processes here.
        """

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
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    resume: str | os.PathLike | None = None,
) -> History:
    r"""Train a guide (and the model's point-estimated parameters) by maximising the ELBO.

    Each step draws a minibatch of ``B`` of the ``N`` points, estimates
    :math:`-\mathcal{L}_\beta = \frac{N}{B}\sum_{i \in \text{batch}} -\log p(y_i|w)
    + \beta\,\mathrm{KL}(q\|p)` with :class:`~pyro_bbb.infer.elbo.AnnealedELBO`, and takes one
    optimiser step. β comes from ``beta(t)`` with ``t`` in epochs, fractional within an
    epoch.

    **Data-parallel.** When ``torch.distributed`` is initialised (the script called
    ``torch.distributed.init_process_group()`` and was launched by ``torchrun``), ``fit``
    trains on ``W`` processes with no other change: each takes its share of the tensor data
    as ``DistributedSampler`` would (one permutation per epoch, rank-strided), ``batch_size``
    is the batch *per process* (the DDP convention), parameters start as rank 0's, gradients
    are averaged every step, and the objective is the single-process one with a batch of
    ``W·batch_size``. Initialisation is shared; Monte Carlo noise is seeded ``seed + rank``.
    The History is averaged over processes and recorded on each; only rank 0 shows progress
    and writes checkpoints. :mod:`pyro_bbb.infer.distributed` has the details.

    **Checkpoints.** ``checkpoint=PATH`` writes, atomically, every ``checkpoint_every``
    epochs and at the end, what a bit-identical resume needs: parameters, optimiser state,
    History and every random state. ``resume=PATH`` continues such a fit up to ``epochs``
    in total; ``resume`` and ``checkpoint`` may name the same file.

    Args:
        model: A :class:`~pyro_bbb.BNN` (or any Pyro model ``model(x, y)`` with a data plate
            of size ``num_data``).
        guide: A guide for ``model``: :class:`~pyro_bbb.MeanFieldGuide` or any
            reparameterised Pyro guide, e.g. ``AutoNormal(model)``.
        x: Features ``(N, *features)``, or a ``DataLoader`` yielding ``(x, y)`` batches (then
            ``y`` must be ``None`` and ``batch_size``/``shuffle`` are the loader's).
        y: Targets ``(N,)`` or ``(N, dim)``.
        epochs: Passes over the data.
        batch_size: Minibatch size ``B`` per process; ``None`` for the full batch (the
            process's whole share of the data).
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
            started wide from settling at the prior on small data. It is drawn over
            ``epochs``: a fit resumed with other ``epochs`` follows another schedule, so pass
            one explicitly to extend a run. Pass ``beta=1.0`` for the plain ELBO
            throughout, e.g. to continue a fit.
        num_particles: Weight samples per step, vectorised.
        reparam: Gradient estimator: ``None`` (sample the weights), ``"local"`` or
            ``"flipout"`` (see :mod:`pyro_bbb.infer.reparam`). It applies to the affine
            layers (Linear, ConvNd, ConvTransposeNd); any other Bayesian layer is drawn by
            weight sampling, and a warning lists them (``model.summary(reparam=...)`` too).
        device: Move model, guide and data here (e.g. ``"cuda"``); ``None`` keeps the
            model's device.
        seed: Seed for Pyro, torch and the minibatch order (on ``W`` processes: the set-up
            and the order use ``seed``, the noise of rank ``r`` uses ``seed + r``; ``None``
            draws one on rank 0). When resuming, the checkpoint's random states continue.
        progress: Show a tqdm bar; ``None`` shows it when stderr is a terminal.
        callbacks: :class:`Callback` objects.
        shuffle: Reshuffle the data every epoch (tensor input).
        checkpoint: File to write checkpoints to (its folder must exist), or ``None``.
        checkpoint_every: Epochs between checkpoints, a positive int (default 1); the last
            epoch is always written.
        resume: A checkpoint to continue from: parameters, optimiser (including its learning
            rate), History, β's position and random states come from it. ``model`` and
            ``guide`` are built as for the interrupted fit; the guide need not be set up.

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
            minibatch's log-likelihood by ``N / B``, or on bad options; a ``resume`` file
            that is not a checkpoint, is from another model, or has done more than
            ``epochs`` epochs.
        FileNotFoundError: If ``resume`` names no file.
        FloatingPointError: When the loss becomes NaN or inf, naming the epoch, step and
            the sites whose terms are not finite.
    """
    check_int("epochs", epochs)
    check_int("batch_size", batch_size, optional=True)
    check_positive_number("lr", lr)
    schedule = delayed_warmup(epochs) if beta is None else as_schedule(beta)
    handler = estimator(reparam)
    warn_mixed_estimators(model, reparam)
    parallel = data_parallel()  # a world of one unless torch.distributed is initialised
    saving = Checkpointing(
        checkpoint, checkpoint_every, resume, epochs=epochs, world_size=parallel.world_size
    )
    device = parallel.device(device)
    if device is not None:
        _move(model, device)
        _move(guide, device)
    data_device = device if device is not None else device_of(model)
    seed = parallel.shared_seed(seed, data_device)
    if seed is not None:
        pyro.set_rng_seed(seed)
    batches = make_batches(
        model, x, y, batch_size, shuffle, data_device,
        seed=saving.order_seed(seed), rank=parallel.rank, world_size=parallel.world_size,
    )  # fmt: skip

    elbo = AnnealedELBO(schedule(0.0), num_particles=num_particles)
    first = next(iter(batches()))
    check_likelihood_scale(model, first, batches.num_data)
    # Find the parameters (creating the guide's) without using up random numbers: the first
    # step then draws what SVI's first step would draw from the same seed.
    with (
        torch.random.fork_rng(devices=cuda_devices(model, guide)),
        handler(),
        poutine.trace(param_only=True) as capture,
        torch.no_grad(),
    ):
        elbo.terms(model, guide, *first)
    named = {name: site["value"].unconstrained() for name, site in capture.trace.nodes.items()}
    params = [p for p in _unique(named.values()) if p.requires_grad]
    if not params:
        raise ValueError("the model and guide have no trainable parameters")
    optim = _make_optimizer(optimizer, params, lr)
    parallel.broadcast_(params)  # every process starts from rank 0's parameters
    history = History(num_data=batches.num_data)
    state = FitState(model, guide, named, params, optim, history, batches.seed, first)
    if saving.resumed is not None:
        saving.restore(state, parallel.rank)  # parameters, optimiser, History, random states
    else:
        parallel.seed_noise(seed)  # shared initialisation, Monte Carlo noise per process
    monitor = CollapseMonitor(model, guide, *first)

    callbacks = list(callbacks)
    for callback in callbacks:
        callback.on_fit_start(params, history)
    show = (sys.stderr.isatty() if progress is None else progress) and parallel.is_main
    bar = _progress(epochs, show, initial=len(history))
    step = history.steps[-1] if history.steps else 0
    for epoch in range(len(history), epochs):
        start = time.perf_counter()
        parts: list[torch.Tensor] = []  # (loss, nll, kl) of each step, summed at epoch end
        betas = 0.0
        num_steps = len(batches)
        for i, batch in enumerate(batches(epoch)):
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
            parallel.average_gradients_(params)  # before the callbacks: they see the mean
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
        loss, nll, kl = parallel.mean(means).tolist()  # the same History on every process
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
        stop = any(callback.on_epoch_end(epoch, history) for callback in callbacks)
        saving.after_epoch(state, parallel, final=stop or epoch == epochs - 1)
        if stop:
            break
    if bar is not None:
        bar.close()
    if parallel.is_main and history.collapsed and history.collapsed[-1] >= COLLAPSE_FRACTION:
        warn_if_collapsed(diagnose_collapse(model, guide, *batches.sample(2048)))
    return history


# ----------------------------------------------------------------------------- helpers
def _move(module: object, device: torch.device) -> None:
    if isinstance(module, torch.nn.Module):
        module.to(device)


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


def _progress(epochs: int, show: bool, initial: int = 0):
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=epochs, initial=initial, desc="fit", unit="epoch", dynamic_ncols=True)


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
