"""Checkpoints of :func:`~pyro_bbb.fit` and resuming from one, bit for bit.

``fit(..., checkpoint=PATH, checkpoint_every=k)`` writes, every ``k`` epochs and when it
stops, everything a resumed fit needs to take exactly the steps the uninterrupted one would
have taken:

* what :func:`~pyro_bbb.save` writes: the guide's parameters and the model's point
  estimates by name, buffers, site and input shapes (so :func:`~pyro_bbb.load` reads a
  checkpoint too);
* the optimiser's state (moments, step counts, hyperparameters) and a torch learning-rate
  scheduler's;
* the :class:`~pyro_bbb.History` so far, whose length is the number of epochs done (β's
  schedule is a function of the epoch, so it continues where it stopped), and what an
  automatic run's held-out scores read (the recent iterates' average);
* every random state: torch's (and CUDA's), Python's and NumPy's of each process, and the
  seed of the minibatch order (:func:`~pyro_bbb.training.minibatches.epoch_order`);
* the options that decide which steps are taken (:func:`fit_options`: ``batch_size``,
  ``shuffle``, ``num_particles``, ``reparam``; of an automatic run also its rule, the share
  of rows it holds out and a fingerprint of a ``validation=(x_val, y_val)`` pair, whose
  scores end its stages). A resume with another value of one of them is refused, naming
  both values: it would train on silently, but could no longer give the uninterrupted
  fit's result.

The file is written atomically by rank 0 (:func:`~pyro_bbb.io.files.write_atomic`);
every process reads it to resume. Nothing here trains.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from .._fitted import replacing_values
from .._validation import check_int
from ..io.files import CHECKPOINT, read_file, write_atomic
from ..io.serialization import capture, match
from .distributed import DataParallel
from .history import History
from .lr_schedules import LRSchedule
from .rates import rate_is_fits

__all__ = [
    "Checkpointing",
    "FitState",
    "fit_options",
    "get_rng_state",
    "pair_fingerprint",
    "schedule_record",
    "set_rng_state",
]


def fit_options(
    x: Any,
    *,
    batch_size: int | None,
    shuffle: bool,
    num_particles: int,
    reparam: str | None,
    epochs: int | None,
    until: str = "predictive",
    validation: float = 0.0,
    pair: tuple[torch.Tensor, torch.Tensor] | None = None,
    lr: float | None = None,
    optimizer: object = None,
    lr_schedule: object = None,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """The options of :func:`~pyro_bbb.fit` that a resume must repeat to be bit-identical.

    Each changes the steps taken: the minibatches (``batch_size``, ``shuffle``), the Monte
    Carlo draws (``num_particles``), the gradient estimator (``reparam``), the rates
    (``lr`` as given, ``own_rate``, whether ``fit`` chose them, a rate per tensor that an
    automatic run halves, and ``lr_schedule``, :func:`schedule_record`) or who decides the
    run's length (``automatic``, the rule of a run of ``epochs=None``, whose stages a fixed
    run cannot follow, ``max_steps``, its budget, which caps the stages and the decay,
    ``validation``, the share of rows it holds out, and ``validation_pair``, the
    :func:`pair_fingerprint` of a ``validation=(x_val, y_val)`` pair, whose scores end its
    stages). For a ``DataLoader`` the batch size is the loader's, and its order is its own
    (``shuffle`` is ``None``).

    Args:
        x: ``fit``'s features or ``DataLoader``.
        batch_size: ``fit``'s ``batch_size``.
        shuffle: ``fit``'s ``shuffle``.
        num_particles: ``fit``'s ``num_particles``, as requested.
        reparam: ``fit``'s ``reparam``.
        epochs: ``fit``'s ``epochs``.
        until: An automatic run's rule.
        validation: The share of rows an automatic run holds out.
        pair: ``fit``'s ``validation`` when it is a pair ``(x_val, y_val)``, else ``None``.
        lr: ``fit``'s ``lr``, as given.
        optimizer: ``fit``'s ``optimizer``: with ``lr``, whether ``fit`` chose the rates
            (``own_rate``: no ``lr`` and no optimiser function,
            :func:`~pyro_bbb.training.rates.rate_is_fits`).
        lr_schedule: ``fit``'s ``lr_schedule``.
        max_steps: ``fit``'s ``max_steps``.

    Returns:
        ``{option: value}``, stored in every checkpoint and compared on resuming.
    """
    if isinstance(x, DataLoader):
        batch_size, shuffle = x.batch_size, None
    options = {
        "batch_size": batch_size,
        "shuffle": shuffle,
        "num_particles": num_particles,
        "reparam": reparam,
        "lr": lr,
        "own_rate": rate_is_fits(lr, optimizer),
        "lr_schedule": schedule_record(lr_schedule),
    }
    if epochs is None:  # a fixed run's checkpoint is as it was before automatic runs
        options["automatic"] = until
        options["max_steps"] = max_steps
        options["validation"] = validation
        options["validation_pair"] = None if pair is None else pair_fingerprint(pair)
    return options


def schedule_record(spec: object) -> str | float | None:
    """What a checkpoint records of an ``lr_schedule``: the same text for the same schedule.

    ``None``; a number; a schedule whose ``repr`` names its settings (this package's
    decays, a ``functools.partial`` of a torch scheduler with its options); else the
    qualified name of the class or function (a ``repr`` with an address would differ
    between processes).
    """
    if spec is None or (isinstance(spec, (int, float)) and not isinstance(spec, bool)):
        return spec
    if isinstance(spec, functools.partial):
        settings = [repr(a) for a in spec.args]
        settings += [f"{k}={v!r}" for k, v in sorted(spec.keywords.items())]
        return f"partial({schedule_record(spec.func)}, {', '.join(settings)})"
    text = repr(spec)
    if " at 0x" not in text and not text.startswith("<"):
        return text
    named = (
        spec
        if isinstance(spec, type) or (callable(spec) and hasattr(spec, "__qualname__"))
        else type(spec)
    )
    return f"{getattr(named, '__module__', '')}.{named.__qualname__}"


def pair_fingerprint(pair: tuple[torch.Tensor, torch.Tensor]) -> str:
    """What identifies a ``validation=(x_val, y_val)`` pair: its rows, shapes and contents.

    The SHA-256 of both tensors' bytes (on the CPU, contiguous), with their shapes and
    dtypes: the same data give the same fingerprint on any device and process.
    """
    digest = hashlib.sha256()
    for tensor in pair:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{tuple(tensor.shape)} {tensor.dtype};".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return f"{pair[0].shape[0]} rows, sha256 {digest.hexdigest()[:16]}"


@dataclass
class FitState:
    """What a checkpoint holds of a running fit, gathered by :func:`~pyro_bbb.fit`.

    Attributes:
        model: The model.
        guide: The guide.
        named: Every parameter of model and guide, ``{param store name: unconstrained}``.
        params: The optimiser's parameters, in its order.
        optimizer: The optimiser.
        history: The fit's History (its length is the number of epochs done).
        order_seed: The seed of the minibatch order (``None`` for a ``DataLoader``).
        inputs: One minibatch ``(x, y)``, whose shapes :func:`~pyro_bbb.load` rebuilds.
        lr_schedule: The learning-rate schedule (a torch scheduler's state is saved).
        average: What an automatic run's scores read, the recent iterates' average
            (:class:`~pyro_bbb.training.scoring.IterateAverage`), or ``None``.
        run: The run's length (:mod:`~pyro_bbb.training.run_length`), whose halvings so
            far a checkpoint records.
    """

    model: Any
    guide: Any
    named: dict[str, torch.Tensor]
    params: list[torch.Tensor]
    optimizer: torch.optim.Optimizer
    history: History
    order_seed: int | None
    inputs: tuple
    lr_schedule: LRSchedule | None = None
    average: Any = None
    run: Any = None

    def trainable_names(self) -> list[str]:
        """The names of the optimiser's parameters, in its order."""
        names = {}
        for name, value in self.named.items():
            names.setdefault(id(value), name)
        return [names[id(p)] for p in self.params]


class Checkpointing:
    """The checkpoint options of one :func:`~pyro_bbb.fit` call, checked at once.

    Args:
        checkpoint: File to write, or ``None``.
        every: Write every this many epochs (``None``: every epoch); needs ``checkpoint``.
        resume: Checkpoint to continue from, or ``None``; read here, on every process.
        epochs: The fit's total number of epochs; ``None`` for an automatic run.
        world_size: The number of processes of this fit.
        options: This fit's :func:`fit_options`, written into checkpoints and compared with
            the ``resume`` file's.

    Raises:
        ValueError: ``checkpoint_every`` not a positive int or without ``checkpoint``; a
            ``checkpoint`` folder that does not exist; a ``resume`` file that is not a
            checkpoint, was written by another number of processes or with another value
            of one of the :func:`fit_options`, or has done more epochs than ``epochs``.
        FileNotFoundError: If ``resume`` names no file.
    """

    def __init__(
        self,
        checkpoint: str | os.PathLike | None,
        every: int | None,
        resume: str | os.PathLike | None,
        *,
        epochs: int | None,
        world_size: int,
        options: dict[str, Any] | None = None,
    ) -> None:
        if checkpoint is None and every is not None:
            raise ValueError(f"checkpoint_every={every!r} needs checkpoint=PATH, the file to write")
        self.every = check_int("checkpoint_every", 1 if every is None else every)
        if checkpoint is not None:
            folder = os.path.dirname(os.path.abspath(checkpoint))
            if not os.path.isdir(folder):
                raise ValueError(
                    f"checkpoint={os.fspath(checkpoint)!r}: folder {folder!r} does not exist"
                )
        self.path = checkpoint
        self.options = {} if options is None else dict(options)
        self.resumed: dict[str, Any] | None = None
        if resume is None:
            return
        self._where = f"resume={os.fspath(resume)!r}"
        payload = read_file(resume, argument="resume", kind=CHECKPOINT)
        done = len(payload["history"]["loss"])
        if epochs is not None and epochs < done:
            raise ValueError(
                f"epochs={epochs} is fewer than the {done} epochs already done in "
                f"{self._where}; epochs is the total to reach, not the number to add"
            )
        if payload["world_size"] != world_size:
            raise ValueError(
                f"{self._where} was written by a fit on {payload['world_size']} process(es); "
                f"this one runs on {world_size}. Resume with the same number of processes"
            )
        self._check_options(payload.get("options", {}))  # none in checkpoints of old versions
        self.resumed = payload

    def _check_options(self, written: dict[str, Any]) -> None:
        for name, value in written.items():
            if name == "automatic":
                self._check_automatic("converged" if value is True else value)  # True: strict
                continue
            if name == "validation_pair":
                self._check_pair(value)
                continue
            if name == "own_rate" and self.options.get(name, value) != value:
                chose, other = ("chose its rates (lr=None)", "an optimizer function's own rate")
                raise ValueError(
                    f"{self._where} was written by a fit that "
                    + (
                        f"{chose}; this one follows {other}"
                        if value
                        else f"followed {other}; this one {chose}"
                    )
                    + ": the resumed fit would halve its rate where the uninterrupted one "
                    "did not, or the other way round. Resume with the same optimizer="
                )
            if name in self.options and self.options[name] != value:
                raise ValueError(
                    f"{self._where} was written by a fit with {name}={value!r}; this one has "
                    f"{name}={self.options[name]!r}. Resume with {name}={value!r}: with "
                    f"another {name} the resumed fit takes other steps and can no longer "
                    f"give the uninterrupted fit's result"
                )

    def _check_automatic(self, written: str | bool) -> None:
        """Refuse a fixed run's checkpoint to an automatic one, or another ``until``."""
        mine = self.options.get("automatic", False)
        if bool(mine) != bool(written):
            kind, resume = (
                ("epochs=None (an automatic run)", "epochs=None")
                if written
                else ("a fixed number of epochs", "epochs= the total to reach")
            )
            raise ValueError(
                f"{self._where} was written by a fit with {kind}; resume it with {resume}"
            )
        if mine != written:
            raise ValueError(
                f"{self._where} was written by an automatic run with until={written!r}; this "
                f"one has until={mine!r}. Resume it with until={written!r}"
            )

    def _check_pair(self, written: str | None) -> None:
        """Refuse a resume whose ``validation`` pair is not the one the checkpoint recorded."""
        mine = self.options.get("validation_pair")
        if mine == written:
            return
        recorded = (
            "no validation pair" if written is None else f"validation=(x_val, y_val) of {written}"
        )
        given = "none" if mine is None else f"validation=(x_val, y_val) of {mine}"
        advice = (
            "Resume without validation= (or with the fraction it was written with)"
            if written is None
            else "Resume with the same validation=(x_val, y_val)"
        )
        raise ValueError(
            f"{self._where} was written by an automatic run with {recorded}; this one has "
            f"{given}. {advice}: scored on other rows, the resumed run's stages would end "
            "where the uninterrupted run's would not"
        )

    @property
    def legacy(self) -> bool:
        """Whether the checkpoint resumed was written before a checkpoint recorded its rates.

        Such a checkpoint (of the release whose default rate was 0.01 for every tensor)
        resumes as that release would have: one rate, its optimiser's, halved only where its
        History shows it was (:meth:`halves`).
        """
        return self.resumed is not None and "own_rate" not in self.resumed.get("options", {})

    @property
    def own_rates(self) -> bool:
        """Whether this fit gives each tensor a rate of ``fit``'s (``lr`` not given).

        Not when it resumes a :attr:`legacy` checkpoint, whose optimiser has one rate.
        """
        return bool(self.options.get("own_rate")) and not self.legacy

    @property
    def halves(self) -> bool:
        """Whether an automatic run halves its rate where it stops paying.

        Where ``fit`` chose the rate (``own_rate``, recorded and compared in the
        checkpoint); a :attr:`legacy` checkpoint halves where its History shows a halving
        already (written by a version that halved), never otherwise.
        """
        if not self.legacy:
            return bool(self.options.get("own_rate"))
        history = self.resumed["history"]
        stages, rates = history.get("stage", []), history.get("lr", [])
        return any(
            stages[e] == stages[e - 1] == "train" and rates[e] < 0.75 * rates[e - 1]
            for e in range(1, min(len(stages), len(rates)))
        )

    def check_halvings(self, halvings: list[int]) -> None:
        """Refuse a resumed run whose halvings so far are not the ones the checkpoint recorded.

        Raises:
            ValueError: Naming both lists.
        """
        recorded = None if self.resumed is None else self.resumed.get("halvings")
        if recorded is not None and list(recorded) != list(halvings):
            raise ValueError(
                f"{self._where} recorded the rate halved after epochs {list(recorded)}; "
                f"this fit reads {list(halvings)} from its History: resume with the options "
                "the checkpoint was written with"
            )

    def setting_up(self) -> contextlib.AbstractContextManager:
        """The section in which a fit sets up its model and guide.

        When resuming, the values a guide or model takes from Pyro's param store there are
        replaced by the checkpoint's, so taking them warns of nothing
        (:func:`~pyro_bbb._fitted.replacing_values`).
        """
        return contextlib.nullcontext() if self.resumed is None else replacing_values()

    def order_seed(self, seed: int | None) -> int | None:
        """The seed of the minibatch order: the checkpoint's when resuming, else ``seed``."""
        return seed if self.resumed is None else self.resumed["order_seed"]

    def restore(self, state: FitState, rank: int) -> None:
        """Put the checkpoint's parameters, optimiser, History and random states in place.

        Raises:
            ValueError: If the checkpoint is from another model, guide, optimiser or data
                set size (before anything is changed).
        """
        payload, where = self.resumed, self._where
        num_data = payload["history"]["num_data"]
        if num_data != state.history.num_data:
            raise ValueError(
                f"{where} was written for a data set of {num_data} points; this fit has "
                f"{state.history.num_data}"
            )
        pairs = match(payload, state.model, state.guide, state.named, where)
        if payload["trainable"] != state.trainable_names():
            raise ValueError(
                f"{where} trained the parameters {payload['trainable']}; this fit trains "
                f"{state.trainable_names()}"
            )
        kind = type(state.optimizer).__name__
        if payload["optimizer_class"] != kind:
            raise ValueError(
                f"{where} was written with the optimiser {payload['optimizer_class']}; this "
                f"fit uses {kind}"
            )
        with torch.no_grad():
            for target, value in pairs:
                target.copy_(value)
        state.optimizer.load_state_dict(payload["optimizer"])
        if state.lr_schedule is not None:
            state.lr_schedule.load_state_dict(payload.get("lr_schedule", {}))
        if state.average is not None:
            state.average.load_state_dict(payload.get("iterate_average", {}))
        for name, values in payload["history"].items():
            if name != "num_data":
                setattr(state.history, name, list(values))
        missing = len(state.history.loss) - len(state.history.lr)  # written before History.lr
        state.history.lr[:0] = [math.nan] * missing
        missing = len(state.history.loss) - len(state.history.stage)  # before History.stage
        state.history.stage[:0] = [""] * missing
        for name in ("validation", "averaged_nll", "averaged_kl"):  # before runs were scored
            values = getattr(state.history, name)
            values[:0] = [math.nan] * (len(state.history.loss) - len(values))
        set_rng_state(payload["rng"][rank])

    def after_epoch(self, state: FitState, parallel: DataParallel, *, final: bool) -> None:
        """Write a checkpoint if this epoch is due (every ``every``-th, and the last).

        Every process takes part (their random states are gathered); rank 0 writes, and
        the others wait for it.
        """
        if self.path is None or not (final or len(state.history) % self.every == 0):
            return
        rng = parallel.gather(get_rng_state())
        if parallel.is_main:
            self._write(state, parallel.world_size, rng)
        parallel.barrier()  # once fit returns, every process can read the file

    def _write(self, state: FitState, world_size: int, rng: list) -> None:
        history = {"num_data": state.history.num_data, **state.history.as_dict()}
        payload = {
            **capture(state.model, state.guide, state.named, state.inputs, {}),
            "trainable": state.trainable_names(),
            "optimizer_class": type(state.optimizer).__name__,
            "optimizer": state.optimizer.state_dict(),
            "lr_schedule": {} if state.lr_schedule is None else state.lr_schedule.state_dict(),
            "iterate_average": {} if state.average is None else state.average.state_dict(),
            "history": history,
            "order_seed": state.order_seed,
            "world_size": world_size,
            "options": self.options,
            "halvings": list(getattr(state.run, "halvings", ())),
            "rng": rng,
        }
        write_atomic(self.path, CHECKPOINT, payload)


def get_rng_state() -> dict[str, Any]:
    """Every random state a fit draws from: torch (CPU and CUDA), Python, NumPy.

    NumPy's key is stored as a tensor, so that the state loads with
    ``torch.load(weights_only=True)``.
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "random": random.getstate(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["random"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    np.random.set_state(
        (
            numpy["name"],
            numpy["keys"].numpy().astype(np.uint32),
            numpy["pos"],
            numpy["has_gauss"],
            numpy["cached_gaussian"],
        )
    )
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
