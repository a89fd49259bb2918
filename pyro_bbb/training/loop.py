"""Training: :func:`fit`, a short loop over the named parts of a run.

``fit`` is a plain loop over optimiser steps on :class:`~pyro_bbb.infer.elbo.AnnealedELBO`
estimates (:class:`~pyro_bbb.training.steps.Steps`, ``pyro.infer.SVI``'s ``step`` written
out) with one ``torch.optim`` optimiser over every parameter of the model and guide
(:mod:`~pyro_bbb.training.optimizers`), its rate moved by a schedule
(:mod:`~pyro_bbb.training.lr_schedules`). Each concern of a run is a part with a name, read
and tested on its own: the minibatches (:mod:`~pyro_bbb.training.minibatches`), the process
group (:mod:`~pyro_bbb.training.distributed`), checkpoints and resuming
(:mod:`~pyro_bbb.training.checkpoint`), the hooks (:mod:`~pyro_bbb.training.callbacks`),
the run's length (:mod:`~pyro_bbb.training.run_length`), the convergence check
(:mod:`~pyro_bbb.training.convergence`) and the collapse check
(:mod:`~pyro_bbb.infer.collapse`); this module sets them up in order and runs the epochs.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader

from .._heap import kept_heap
from ..infer.collapse import CollapseMonitor
from ..infer.schedules import ScheduleLike
from .arguments import check_options, rows_of
from .callbacks import Callback
from .captured import static_steps
from .checkpoint import Checkpointing, FitState, fit_options
from .continuation import continued_from, fit_end, rate_factor, resume_rates
from .convergence import ConvergenceWarning
from .distributed import DataParallel, data_parallel
from .end_of_run import check_collapse, stamp, stopped
from .held_out import held_out_split, resolve_validation
from .history import History
from .lr_schedules import LRSchedule, LRScheduleLike
from .minibatches import Batches, make_batches
from .objective import build_objective
from .optimizers import OptimizerSpec
from .placement import place
from .progress import Progress, show_progress
from .rates import fit_optimizer, rate_is_fits
from .run_length import RunLength, run_length
from .scoring import SAMPLE_ROWS, SampleFit, Scores, held_out_score, score_every
from .steps import Steps

__all__ = ["fit"]


def fit(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    x: torch.Tensor | DataLoader,
    y: torch.Tensor | None = None,
    *,
    epochs: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    optimizer: OptimizerSpec | None = None,
    lr_schedule: LRScheduleLike | None = None,
    beta: ScheduleLike | None = None,
    num_particles: int | None = None,
    reparam: str | None = None,
    device: str | torch.device | None = None,
    seed: int | None = None,
    progress: bool | None = None,
    callbacks: Iterable[Callback] = (),
    shuffle: bool = True,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    resume: str | os.PathLike | None = None,
    max_steps: int | None = None,
    until: str | None = None,
    validation: float | tuple[torch.Tensor, torch.Tensor] | None = None,
    cuda_graph: bool | None = None,
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
    and writes checkpoints. :mod:`pyro_bbb.training.distributed` has the details.

    **What a step costs.** The data are checked once, and Pyro's validation (when enabled,
    as by ``pyro.enable_validation(True)``) checks the distributions of the first step once,
    before training; the steps then do only the arithmetic. For a :class:`~pyro_bbb.BNN`
    under :class:`~pyro_bbb.MeanFieldGuide` or :class:`~pyro_bbb.LowRankGuide` a step
    evaluates the same ELBO, with the same random draws, without tracing the two programs
    (:mod:`~pyro_bbb.infer.fused`); every other model, guide or handler is traced. On the
    CPU a low-rank block of 65,536 numbers or more is drawn, and its KL taken, by two loops
    compiled with ``torch.compile`` (built once, then loaded from its disk cache in seconds;
    ``PYRO_BBB_COMPILE=0`` keeps the eager arithmetic, as where compiling fails, which one
    warning says). Nothing is read back from the device until an epoch's end (its losses,
    once); on CUDA the fused step is captured as one CUDA graph and replayed (``cuda_graph``).

    **Memory on the CPU.** With the environment variable ``PYRO_BBB_KEEP_HEAP=1`` (off by
    default), ``fit`` has glibc's malloc keep the memory a step frees for the next step while
    its epochs run on the CPU, instead of returning it to the OS and taking a page fault per
    4 KiB to map it again: on large full batches the kernel's time fell from 55-180 % of the
    step's own to 3-6 %. Results are unchanged; the heap holds what the largest step held
    and, through fragmentation, up to as much again. The settings are the process's, not the
    fit's: on return the free memory is handed back and glibc's thresholds are left fixed
    where its own adjustment would end (mmap threshold 32 MiB, trim threshold 64 MiB), no
    longer adjusting; a process forked during the fit starts with those. Nothing is done on
    other C libraries or when glibc's malloc is configured through the environment
    (``docs/performance.md`` has what changes, exactly, and the figures).

    **How long.** ``epochs=None`` (the default) trains until more training stops paying
    (:mod:`~pyro_bbb.training.auto_epochs`, :mod:`~pyro_bbb.training.stopping`): β = 0
    while fitting the likelihood still lowers the β = 1 loss, a warm-up over half that
    time, the full rate while the fit to the data (or the held-out rows' log-likelihood)
    still improves, then, where ``fit`` chose the rate, the rate halved (from the best
    average so far) while halving still pays, then the rate's decay over three sevenths of
    the run before it. Its
    scores are read every few epochs from the average of the recent iterates
    (:mod:`~pyro_bbb.training.scoring`), without touching the steps' random numbers.
    ``History.stage`` records each epoch's stage and ``History.stopped`` why the run ended.
    ``until="converged"`` asks the strict question instead: the full rate until the
    posterior has stopped moving (the convergence check), for a posterior compared with
    NUTS or carried to the next task as a prior; on a network that can take tens of
    thousands of steps. ``epochs=E`` runs ``E`` epochs with β's warm-up and the rate's decay
    drawn over them, as before. Every fit ends with the convergence check
    (:mod:`~pyro_bbb.training.convergence`: the β = 1 loss no longer falls and its KL part
    no longer moves where the rate was at its height), recorded as ``History.convergence``;
    a fixed run and a strict one warn when it fails, a default run only when its budget
    ended it.

    **A fitted guide continues.** Given a guide a fit has trained (its ``guide.fit_end``,
    which :func:`~pyro_bbb.save` keeps), ``fit`` goes on from where that fit ended: β at its
    final value, the rate where it left it, an automatic run's full-rate stage and decay
    only (:mod:`~pyro_bbb.training.continuation`; ``History.continues``). ``beta``, ``lr``
    and ``lr_schedule`` given are followed as given; a new guide starts over.

    **Checkpoints.** ``checkpoint=PATH`` writes, atomically, every ``checkpoint_every``
    epochs and at the end, what a bit-identical resume needs: parameters, optimiser state,
    History and every random state. ``resume=PATH`` continues such a fit up to ``epochs``
    in total (an automatic run, ``epochs=None``, continues its stages); ``resume`` and
    ``checkpoint`` may name the same file.

    Args:
        model: A :class:`~pyro_bbb.BNN` (or any Pyro model ``model(x, y)`` with a data plate
            of size ``num_data``).
        guide: A guide for ``model``: :class:`~pyro_bbb.MeanFieldGuide` or any
            reparameterised Pyro guide, e.g. ``AutoNormal(model)``.
        x: Features ``(N, *features)``, or a ``DataLoader`` yielding ``(x, y)`` batches (then
            ``y`` must be ``None`` and ``batch_size``/``shuffle`` are the loader's).
        y: Targets ``(N,)`` or ``(N, dim)``.
        epochs: Passes over the data; ``None`` (the default) trains until more training
            stops paying (``until``), within ``max_steps``: on a small network a few
            thousand full-batch epochs (seconds), on 4,000 images in minibatches of 128 about
            fifty epochs; the table in ``docs/concepts.md`` has what it cost and bought.
        batch_size: Minibatch size ``B`` per process; ``None`` for the full batch (the
            process's whole share of the data).
        lr: Learning rate of the default Adam optimiser (or of an ``optimizer`` class), one
            for every parameter, followed as given. ``None`` (the default) lets ``fit`` give
            each tensor its own (:mod:`~pyro_bbb.training.rates`; Adam moves every weight by
            about the rate a step): a layer's means and ρ a sixteenth of its weights' root
            mean square, at most 0.01, a learned noise 0.01; an automatic run halves them
            together, from its best average, where its full-rate stage stops paying and
            while halving pays (:mod:`~pyro_bbb.training.auto_epochs`). Only for optimisers
            whose step the rate bounds (Adam's kin, RMSprop, Adagrad): SGD needs ``lr``.
        optimizer: A ``torch.optim.Optimizer`` class (built with ``lr``) or a function from the
            parameter list to an optimiser. Defaults to ``torch.optim.Adam`` with its fused
            implementation (same algorithm, one kernel over all tensors) where the
            parameters allow it: floating point, on one CPU or CUDA device.
        lr_schedule: How the learning rate moves over the fit: a callable of the epoch
            (fractional within an epoch, as for ``beta``) returning a factor of each
            parameter group's initial rate, set before every step; a number, a constant
            factor (``1.0``: a constant rate); or a ``torch.optim.lr_scheduler`` class, or a
            ``functools.partial`` of one with its options, built on the optimiser and stepped
            at the end of every epoch. ``None`` (the default) keeps ``lr`` for the first 70 %
            of the epochs, then decays it as the inverse of the steps to 1 % of it at the
            last epoch (:class:`~pyro_bbb.training.lr_schedules.InverseTimeDecay`): with one
            weight sample per step the posterior's scales settle only once the rate falls.
            Like ``beta`` it is drawn over ``epochs``; with ``epochs=None`` the decay starts
            where the full-rate stage ends, and a schedule of your own is followed as given
            throughout instead. The rate of each epoch is in ``History.lr``.
        beta: KL weight: a number, a :mod:`~pyro_bbb.infer.schedules` schedule
            (``LinearWarmup(20)``, ``SigmoidWarmup(...)``, ``CyclicalAnnealing(...)``) or any
            callable of the epoch. ``None`` (the default) fits the likelihood first:
            β = 0 for the first quarter of the epochs, linear to 1 by half-way, then the
            plain ELBO (:func:`~pyro_bbb.infer.schedules.delayed_warmup`); it keeps a guide
            started wide from settling at the prior on small data. It is drawn over
            ``epochs``: a fit resumed with other ``epochs`` follows another schedule, so pass
            one explicitly to extend a run; with ``epochs=None`` the warm-up is placed where
            the run is, and a number or a schedule of your own (``LinearWarmup(20)``) is
            followed as given from the first epoch. Pass ``beta=1.0`` for the plain ELBO
            throughout; a fitted guide's next fit keeps β at its final value.
        num_particles: Weight samples per step, vectorised over a leading dim. ``None``
            (the default) takes as many as keep a step's drawn weights times minibatch rows,
            over all samples, within 262,144, between 1 and 8
            (:func:`~pyro_bbb.training.particles.default_num_particles`; all members of an
            ensemble counted together, and 1 for a point estimate): 8 for a linear
            regression on 150 rows, 2 for a 1-50-50-1 MLP on 40, 1 for most networks and
            minibatches. Where it takes more than one, the extra samples cost little
            (8 samples 5–18 % more per step than one, on CPU) and they are what brings
            the fitted scales to their optimum: the gradient noise of one sample, not the
            schedule, is what a fit leaves in them. The number taken is
            ``History.num_particles``; pass ``num_particles=1`` for Pyro's ``Trace_ELBO``
            default.
        reparam: Gradient estimator: ``None`` (sample the weights), ``"local"`` or
            ``"flipout"`` (see :mod:`pyro_bbb.infer.reparam`). It applies to the affine
            layers (Linear, ConvNd, ConvTransposeNd); any other Bayesian layer is drawn by
            weight sampling, and a warning lists them (``model.summary(reparam=...)`` too).
        device: Move model, guide and data here (e.g. ``"cuda"``); ``None`` keeps the
            model's device.
        seed: Seed for Pyro, torch and the minibatch order (on ``W`` processes: the set-up
            and the order use ``seed``, the noise of rank ``r`` uses ``seed + r``; ``None``
            draws one on rank 0). When resuming, the checkpoint's random states continue.
            A network's weights are initialised when it is built, before ``fit``: to
            reproduce a run from its start, also seed before building the network
            (``pyro.set_rng_seed``), as a guide started from those weights depends on them.
        progress: Show a tqdm bar; ``None`` shows it when stderr is a terminal or in a Jupyter
            notebook (a widget there, :mod:`~pyro_bbb.training.progress`).
        callbacks: :class:`Callback` objects.
        shuffle: Reshuffle the data every epoch (tensor input).
        checkpoint: File to write checkpoints to (its folder must exist), or ``None``.
        checkpoint_every: Epochs between checkpoints, a positive int (default 1); the last
            epoch is always written.
        resume: A checkpoint to continue from: parameters, optimiser (including its learning
            rate and a torch scheduler's state), History, β's position and random states
            come from it. ``model`` and ``guide`` are built as for the interrupted fit; the
            guide need not be set up. ``batch_size``, ``shuffle``, ``num_particles``,
            ``reparam``, ``lr``, ``lr_schedule`` and the kind of ``optimizer`` must be the
            interrupted fit's, and ``epochs`` ``None`` again for an automatic run, with its
            ``until``, ``max_steps`` and ``validation`` (a pair of the same rows: the
            checkpoint records its fingerprint). A checkpoint of the release before, which
            recorded no rate, resumes at its optimiser's rate, never halved.
        cuda_graph: Run the fused step as one captured CUDA graph, replayed every step (the
            batch copied into static buffers, β and the learning rate device tensors
            written in place; the smaller last minibatch of an epoch runs eagerly).
            ``None`` (the default) does so on CUDA whenever the step is fused, the
            optimiser is the default (fused) Adam, no callback overrides
            ``on_after_backward`` and the fit runs on one process; where the capture fails
            (a forward that reads a value back to the host), the fit goes on with the
            eager fused step and says why in one warning. ``False`` never; ``True`` asks
            for it and raises when it cannot (on the CPU it runs the same step on static
            buffers, uncaptured: slower, there to be checked). The first three steps run
            eagerly while the graph is set up. Before each replay the tensors the graph
            was captured on are checked to be still those in use: a callback that replaces
            them (reloads the param store or the optimiser's state, sets gradients to
            ``None``) makes the fit capture again once, then go eager, with a warning each
            time; copying values in place (``tensor.copy_``) keeps the graph
            (:mod:`~pyro_bbb.training.captured`).
        max_steps: The budget of an automatic run (``epochs=None``), in optimiser steps
            (in whole epochs, at least one); ``None`` for the larger of 50,000 steps and 100
            epochs, so that a large data set gets as many passes as a small one gets steps.
            A hard budget: the stages' least lengths shrink to fit it, and held-out rows are
            given back only where an epoch over every row still fits. A run the budget ends
            says so once (``ConvergenceWarning``), naming what was still moving and the
            ``max_steps`` to pass.
        until: When an automatic run (``epochs=None``) is done: ``"predictive"`` (the
            default, ``None``) when further steps stop improving the fit to the data (or
            the held-out rows' log-likelihood, see ``validation``); ``"converged"`` when
            the posterior has stopped moving: the strict convergence check, the question
            for a posterior compared with NUTS or carried forward as a prior
            (:mod:`~pyro_bbb.training.stopping`).
        validation: What an automatic run's full-rate stage reads: ``None`` (the default)
            the fit to a fixed sample of the training rows; a fraction in (0, 0.5] of the
            rows (tensor data of a :class:`~pyro_bbb.BNN`) held out of the steps and scored
            by their log predictive density (in evaluation mode, as a validation pass),
            then given back for the decay, so the
            returned guide has seen every row; or a pair ``(x_val, y_val)`` of your own,
            scored the same way (nothing held out; the only kind a ``DataLoader`` takes).
            A fraction that holds out fewer than 10 rows holds none, with a warning. Only
            the default rule reads it: with ``until="converged"`` it is refused.

    Returns:
        The :class:`History` of the fit.

    Warns:
        ConvergenceWarning: When a fixed run, or one of ``until="converged"``, ends before
            the convergence check passes (a run too short), or when a budget ends an
            automatic run; the message says what still moved, by how much, over which
            epochs, and what to change. ``History.converged`` is ``False`` then.
        PosteriorCollapseWarning: When training ends with most weights at their prior and the
            predictive mean missing structure in the data (up to 2,048 training points; see
            :mod:`pyro_bbb.infer.collapse`); the message gives the measurements and what to
            try.

    Raises:
        ValueError: On bad data (shapes, dtypes, NaN/inf, labels out of range, a data set
            whose size is not the model's ``num_data``), on a model that does not scale a
            minibatch's log-likelihood by ``N / B``, on a call inside ``with flipout()`` or
            ``with local_reparameterization()`` (``reparam=`` is fit's way), or on bad
            options (a ``device`` this
            process cannot use, such as ``"cuda"`` where torch has no CUDA; ``max_steps``,
            ``until`` or ``validation`` with ``epochs``; an ``until`` that is neither
            ``"predictive"`` nor ``"converged"``; ``validation`` with
            ``until="converged"``, a fraction outside [0, 0.5], a fraction of a
            ``DataLoader``'s rows, or any ``validation`` for a model whose predictive cannot
            be scored); a
            ``resume`` file that is not a checkpoint, is from another model, was written with
            another ``batch_size``, ``shuffle``, ``num_particles``, ``reparam``, ``lr``,
            ``lr_schedule``, ``max_steps`` or kind of optimiser (the error names both
            values), by a fixed run resumed with ``epochs=None`` or the other way
            round, with another ``until`` or ``validation`` pair (or with one where it had
            none, or none where it had one), or has done more than ``epochs`` epochs;
            ``cuda_graph=True`` on a fit whose step cannot be captured (the message says
            why); ``lr=None`` with an optimiser class whose step the rate does not bound.
        FileNotFoundError: If ``resume`` names no file.
        TypeError: If ``cuda_graph`` is not a bool or ``None``, ``guide`` cannot be called
            (an online updater's posterior is its ``.guide``), or a ``DataLoader`` does not
            yield ``(x, y)`` pairs of tensors (dicts, triples).
        FloatingPointError: When the loss becomes NaN or inf, at the end of that epoch (the
            losses are read once an epoch), naming the epoch, the first step whose loss
            was not finite and the sites whose terms were not finite there.
    """
    # set-up: the options, the rows, the run's length, the objective, where the fit starts
    until = check_options(epochs, batch_size, num_particles, lr, max_steps, until, optimizer)
    held = resolve_validation(validation, model, x, epochs, until)  # read here alone
    parallel = data_parallel()  # a world of one unless torch.distributed is initialised
    options = fit_options(
        x, batch_size=batch_size, shuffle=shuffle, num_particles=num_particles, reparam=reparam,
        epochs=epochs, until=until, validation=held.fraction, pair=held.pair, lr=lr,
        optimizer=optimizer, lr_schedule=lr_schedule, max_steps=max_steps,
    )  # fmt: skip
    saving = Checkpointing(
        checkpoint, checkpoint_every, resume, epochs=epochs, world_size=parallel.world_size,
        options=options,
    )  # fmt: skip
    data_device, seed = place(model, guide, device, seed, parallel)
    rows, held_rows, order_seed = held_out_split(rows_of(x), held.fraction, saving.order_seed(seed))
    batches = make_batches(
        model, x, y, batch_size, shuffle, data_device,
        seed=order_seed, rank=parallel.rank, world_size=parallel.world_size, rows=rows,
    )  # fmt: skip
    held_out = held_out_score(x, y, held_rows, held.pair, order_seed, data_device)
    origin, chosen = continued_from(guide, saving.resumed), rate_is_fits(lr, optimizer)
    length, schedule, lr_schedule = run_length(
        epochs, max_steps, len(batches), beta, lr_schedule,
        until=until, scored=held_out is not None, every=score_every(len(batches)),
        gives_back=rows is not None, halves=saving.halves, continues=origin,
        rate_from=rate_factor(origin, chosen),
        steps_given_back=len(batches.every_row) if batches.every_row is not None else None,
    )  # fmt: skip
    with saving.setting_up():  # a resumed fit's values come from its checkpoint
        objective = build_objective(model, guide, schedule, num_particles, reparam, batches)
    elbo, first, params = objective.elbo, objective.first, objective.params
    optim = fit_optimizer(optimizer, lr, saving.own_rates, model, guide, objective)
    rates = LRSchedule(lr_schedule, resume_rates(optim, origin, chosen))  # continued: as before
    parallel.broadcast_(params)  # every process starts from rank 0's parameters
    history = History(
        num_data=batches.num_data, num_particles=elbo.num_particles, draws=objective.draws,
        held_out=0 if held_out is None else len(held_out),
        until=None if epochs is not None else until, continues=origin,
    )  # fmt: skip
    scores = Scores(params, _sample_fit(batches, epochs, order_seed), held_out)
    state = FitState(
        model, guide, objective.named, params, optim, history, batches.seed, first, rates,
        scores.average, run=length,
    )  # fmt: skip
    _resume_or_seed(state, saving, parallel, seed)
    monitor = CollapseMonitor(model, guide, *first)

    # the epochs
    callbacks = list(callbacks)
    for callback in callbacks:
        callback.on_fit_start(params, history)
    bar = Progress(length.total, show_progress(progress, parallel.is_main), initial=len(history))
    runner = static_steps(
        cuda_graph, objective.fused, optim, rates, params, callbacks, parallel, data_device
    )  # after the resume: the optimiser's rates become tensors there
    steps = Steps(
        model, guide, elbo, objective.handler, optim, params, parallel, callbacks, rates,
        step=history.steps[-1] if history.steps else 0, fused=objective.fused, runner=runner,
    )  # fmt: skip
    every_row, stop = batches.every_row or batches, False
    with kept_heap(data_device.type == "cpu"):  # a step reuses what the last one freed
        for epoch in length.run(len(history)):
            record = steps.epoch(batches if length.holds_out(epoch) else every_row, epoch, schedule)
            read = _scored(scores, length, model, guide, epoch, elbo.beta)
            history.append_epoch(record, monitor.fraction(), length.stage(epoch), read)
            length.after_epoch(history, optim)
            if length.restores_best(len(history)):
                scores.average.restore_best()  # the next phase starts from the stage's best
            bar.update(record, elbo.beta, length, read)
            stop = any(callback.on_epoch_end(epoch, history) for callback in callbacks)
            saving.after_epoch(state, parallel, final=stop or length.finished)
            if stop:
                break

    # the end: why it ended, the convergence check, the warnings
    history.stopped = stopped(length, history, stop)
    bar.close(history.stopped)
    history.convergence = length.convergence(history)
    stamp(guide, fit_end(history, elbo.beta, beta is None and origin is None, rates))
    if parallel.is_main:
        message = length.warning(history)
        if message is not None:
            warnings.warn(message, ConvergenceWarning, stacklevel=2)
        check_collapse(model, guide, history, every_row, done=message is None and not stop)
    return history


# ----------------------------------------------------------------------------- the parts
def _sample_fit(batches: Batches, epochs: int | None, seed: int | None) -> SampleFit | None:
    """What an automatic run scores the fit on: a fixed sample of training rows.

    ``None`` in a fixed run, which reads no rows for it.
    """
    if epochs is not None:
        return None
    return SampleFit(*batches.sample(SAMPLE_ROWS), num_data=batches.num_data, seed=seed or 0)


def _scored(
    scores: Scores,
    length: RunLength,
    model: Callable[..., Any],
    guide: Callable[..., Any],
    epoch: int,
    beta: float,
) -> tuple[float, float, float]:
    """Average epoch ``epoch`` in and read what the run reads after it (``nan``: nothing)."""
    if not length.averages(epoch):
        return math.nan, math.nan, math.nan
    return scores.after_epoch(
        model, guide, length.stage(epoch), length.reads(epoch), beta, phase=length.phase(epoch)
    )


def _resume_or_seed(
    state: FitState,
    saving: Checkpointing,
    parallel: DataParallel,
    seed: int | None,
) -> None:
    """Continue a checkpoint (parameters, optimiser, History, random states), or seed the noise.

    A resumed run's stages and halvings follow its History (checked against the record). A
    fresh fit seeds each process's Monte Carlo noise with ``seed + rank`` after the shared
    initialisation.
    """
    if saving.resumed is not None:
        saving.restore(state, parallel.rank)
    else:
        parallel.seed_noise(seed)
    state.run.restore(state.history)
    saving.check_halvings(getattr(state.run, "halvings", []))
