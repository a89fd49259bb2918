"""Saving and loading a trained model and guide: :func:`save`, :func:`load` and their file.

A file holds, by name, every parameter the model and guide use (the guide's variational
parameters and the model's point estimates, named as in Pyro's param store, unconstrained),
the modules' buffers, the shape of every latent site, the shapes of the inputs the guide
was set up with, and how the guide's last fit ended (``guide.fit_until`` and
``guide.fit_end``, :mod:`~pyro_bbb.training.continuation`): what the warnings of the ArviZ
export and the NUTS comparison read, and where the next ``fit`` of the guide starts from.
:func:`load` rebuilds a fresh guide from those input shapes (one pass of model and guide on
zeros, under a forked random state), so the user never has to run the guide first: Pyro
creates a guide's parameters only on its first call, which is why loading a ``state_dict``
into a fresh autoguide fails with "Unexpected key(s)".

The file is written atomically and read safely by :mod:`~pyro_bbb.io.files`. Every check
(format, sites, parameters, shapes, dtypes) passes before the first value is copied: a
mismatch leaves the model and guide as they were. :mod:`~pyro_bbb.training.checkpoint` writes
the same contents plus the training state; nothing here trains.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

import pyro.poutine as poutine
import torch
from torch import nn

from .._devices import cuda_devices, device_of
from .._fitted import replacing_values
from .._plates import model_in_plates
from ..nn import initial_values
from .files import FORMAT_KEY, MODEL, read_file, write_atomic

__all__ = ["load", "save"]

PathLike = str | os.PathLike


# ------------------------------------------------------------------------- public API
def save(path: PathLike, model: Any, guide: Any) -> None:
    """Save a trained guide and the model's point estimates to ``path``, atomically.

    The file holds every parameter by its name in Pyro's param store (e.g.
    ``MeanFieldGuide.locs.fc1.weight``, ``likelihood.scale``), the modules' buffers, the
    latent sites' shapes, the input shapes the guide was set up with, and how the guide's
    last fit ended (``guide.fit_until``, ``guide.fit_end``), which :func:`load` gives back:
    a loaded guide warns where its fit stopped on the predictive as the fitted one did, and
    a ``fit`` of it continues that fit. A kill while writing leaves any previous file at
    ``path`` intact.

    Args:
        path: The file to write (its folder must exist).
        model: The model, e.g. a :class:`~pyro_bbb.BNN`.
        guide: Its guide, already set up (trained, or called once): a
            :class:`~pyro_bbb.MeanFieldGuide`, :class:`~pyro_bbb.LowRankGuide` or any Pyro
            autoguide.

    Raises:
        TypeError: If ``guide`` is not a Pyro autoguide.
        ValueError: If the guide has not been set up, or was set up with an argument
            that cannot be stored (only tensors, numbers, strings and ``None`` can).
    """
    args, kwargs = _prototype_inputs(guide)
    named = trace_params(model, guide, args, kwargs)
    write_atomic(path, MODEL, capture(model, guide, named, args, kwargs))


def load(path: PathLike, model: Any, guide: Any) -> None:
    """Fill a freshly built model and guide with what :func:`save` wrote to ``path``.

    ``model`` and ``guide`` must be built as the saved ones were (same architecture, guide
    class and options, names); the guide need not have been called. It is set up by one pass
    of model and guide on zero inputs of the saved shapes, which leaves the random state as
    it was. The guide takes the saved record of how its fit ended (``guide.fit_until``,
    ``guide.fit_end``; ``None`` from a file written before they were kept). A checkpoint
    written by ``fit(checkpoint=...)`` loads the same way, without that record (set to
    ``None``; to go on with the fit it checkpointed, resume it: ``fit(resume=...)``).

    Args:
        path: A file written by :func:`save` or ``fit(checkpoint=...)``.
        model: A fresh model of the saved architecture.
        guide: A fresh guide for it, of the saved class.

    Raises:
        FileNotFoundError: If there is no file at ``path``.
        ValueError: If the file is not ours or is truncated, or the model or guide differ
            from the saved ones (naming the first mismatched site or parameter and both
            shapes). Nothing is loaded then.
        TypeError: If ``guide`` is not a Pyro autoguide.
    """
    _require_autoguide(guide)
    payload = read_file(path, argument="path")
    where = f"path={os.fspath(path)!r}"
    _check_sites(payload["sites"], _layer_sites(model), where, complete=False)
    args, kwargs = _rebuild_inputs(payload["inputs"], device_of(model, guide))
    try:
        with replacing_values():  # the file's values replace what the set-up takes
            named = trace_params(model, guide, args, kwargs)
    except (RuntimeError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ValueError(
            f"{where}: this model and guide cannot run on the saved input shapes "
            f"{_shapes_of(args)}; were they built as the saved ones? ({first_line})"
        ) from error
    restore(payload, model, guide, named, where)
    ended = payload.get("fit", {}) if payload.get(FORMAT_KEY) == MODEL else {}
    _set_record(guide, ended.get("until"), ended.get("end"))


# ---------------------------------------------------------- what a file holds, and back
def trace_params(model, guide, args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    """Every parameter of one pass of guide and model, ``{param store name: unconstrained}``.

    The pass sets up a guide that was never called; it runs without gradients and under a
    forked random state, so it draws nothing from the caller's streams.
    """
    with (
        torch.random.fork_rng(devices=cuda_devices(model, guide)),
        torch.no_grad(),
        poutine.trace(param_only=True) as capture,
    ):
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        poutine.replay(model_in_plates(model, guide)[0], trace=guide_trace)(*args, **kwargs)
    return {name: site["value"].unconstrained() for name, site in capture.trace.nodes.items()}


def capture(model, guide, named: Mapping[str, torch.Tensor], args: tuple, kwargs: dict) -> dict:
    """The contents of a file: sites, parameters, buffers, input shapes, how the fit ended.

    The record (``"fit"``: ``guide.fit_until`` and ``guide.fit_end``) is, in a saved model,
    how the fit that trained the guide ended; in a checkpoint written while a fit runs, how
    the fit that one continues ended, which ``fit(resume=...)`` continues from again
    (:mod:`~pyro_bbb.training.continuation`).
    """
    return {
        "fit": {
            "until": getattr(guide, "fit_until", None),
            "end": _plain(getattr(guide, "fit_end", None)),
        },
        "sites": {name: _site_entry(value) for name, value in _latent_sites(guide).items()},
        "params": {name: value.detach() for name, value in named.items()},
        "buffers": {"model": _buffers(model), "guide": _buffers(guide)},
        "inputs": {
            "args": [_describe(a, f"argument {i}") for i, a in enumerate(args)],
            "kwargs": {k: _describe(v, f"argument {k!r}") for k, v in kwargs.items()},
        },
    }


def match(payload: dict, model, guide, named: Mapping[str, torch.Tensor], where: str) -> list:
    """Check a file against model and guide; the ``(target, saved value)`` pairs to copy.

    A file written by an earlier version is first brought to this version's layout, in
    place (:func:`upgrade`).

    Raises:
        ValueError: On the first mismatched site, parameter or buffer (its name and both
            shapes, or both dtypes); ``where`` (e.g. ``"path='m.pt'"``) starts the message.
    """
    upgrade(payload, guide)
    _check_sites(payload["sites"], _latent_sites(guide), where, complete=True)
    pairs = _pairs("parameter", payload["params"], named, where)
    for owner, module in (("model", model), ("guide", guide)):
        saved = payload["buffers"].get(owner, {})
        pairs += _pairs(f"{owner} buffer", saved, _buffers(module, detach=False), where)
    return pairs


def upgrade(payload: dict, guide) -> None:
    """Rename and convert, in place, the parameters an earlier version stored otherwise.

    The guide names them (``guide.legacy_parameters()``: ``{old name: (new name,
    conversion)}``, e.g. :meth:`LowRankGuide.legacy_parameters
    <pyro_bbb.LowRankGuide.legacy_parameters>`). In a checkpoint the parameter's name among
    the trained ones is renamed too, and its optimiser state converted (each tensor of the
    parameter's old shape, e.g. Adam's moments): the optimiser's state is numbered in the
    order of the trained parameters, the order in which ``fit`` hands them to it.
    """
    legacy = getattr(guide, "legacy_parameters", None)
    if legacy is None or getattr(guide, "prototype_trace", None) is None:
        return
    params = payload["params"]
    trained = payload.get("trainable", [])
    states = payload.get("optimizer", {}).get("state", {})
    for old, (new, convert) in legacy().items():
        if old not in params or new in params:
            continue
        value = params.pop(old)
        params[new] = convert(value)
        if old in trained:
            index = trained.index(old)
            trained[index] = new
            state = states.get(index, {})
            for key, saved in state.items():
                if isinstance(saved, torch.Tensor) and saved.shape == value.shape:
                    state[key] = convert(saved)


@torch.no_grad()
def restore(payload: Mapping, model, guide, named: Mapping[str, torch.Tensor], where: str) -> None:
    """Check the file against model and guide (:func:`match`), then copy its values in place.

    Raises:
        ValueError: As :func:`match`, before anything is copied.
    """
    for target, value in match(payload, model, guide, named, where):
        target.copy_(value)


# --------------------------------------------------------------------------- helpers
def _plain(record: Mapping | None) -> dict | None:
    """A record of plain values (numbers, strings, ``None``), as a file stores it."""
    if record is None:
        return None
    return {
        key: value
        for key, value in dict(record).items()
        if value is None or isinstance(value, (bool, int, float, str))
    }


def _set_record(guide, until: str | None, end: Mapping | None) -> None:
    """Give ``guide`` the record of how its fit ended (a guide that takes none is left)."""
    with suppress(AttributeError, TypeError):
        guide.fit_until, guide.fit_end = until, None if end is None else dict(end)


def _require_autoguide(guide) -> None:
    if not hasattr(guide, "prototype_trace"):
        raise TypeError(
            "guide must be a Pyro autoguide (MeanFieldGuide, LowRankGuide, AutoNormal, ...), "
            f"got {type(guide).__name__}; for a hand-written guide, save Pyro's param store "
            "with pyro.get_param_store().save(path)"
        )


def _prototype_inputs(guide) -> tuple[tuple, dict]:
    _require_autoguide(guide)
    trace = guide.prototype_trace
    if trace is None:
        raise ValueError(
            f"the {type(guide).__name__} has no parameters yet: fit it (or call it once with "
            "the model's arguments) before saving"
        )
    inputs = trace.nodes["_INPUT"]
    return tuple(inputs["args"]), dict(inputs["kwargs"])


def _latent_sites(guide) -> dict[str, torch.Tensor]:
    """The model's global latent sites, from the guide's prototype trace (their values)."""
    trace = getattr(guide, "prototype_trace", None)
    if trace is None:
        return {}
    return {
        name: site["value"]
        for name, site in trace.iter_stochastic_nodes()
        if not site["cond_indep_stack"]
    }


def _layer_sites(model) -> dict[str, torch.Tensor]:
    """The Bayesian layers' sites (their initial values), read without running the model."""
    return initial_values(model) if isinstance(model, nn.Module) else {}


def _site_entry(value: torch.Tensor) -> dict:
    return {"shape": list(value.shape), "dtype": _dtype_name(value.dtype)}


def _check_sites(
    saved: Mapping[str, dict], current: Mapping[str, torch.Tensor], where: str, *, complete: bool
) -> None:
    """The first site whose shape or dtype differs; with ``complete``, one that a side lacks."""
    for name, entry in saved.items():
        shape = tuple(entry["shape"])
        if name in current and tuple(current[name].shape) != shape:
            raise ValueError(
                f"{where} holds a different architecture: site {name!r} has shape "
                f"{shape} there and {tuple(current[name].shape)} in this model"
            )
        if name in current and _dtype_name(current[name].dtype) != entry["dtype"]:
            raise ValueError(
                f"{where}: site {name!r} is {entry['dtype']} there and "
                f"{_dtype_name(current[name].dtype)} in this model; build the model in the "
                "saved dtype (e.g. .double())"
            )
        if name not in current and complete:
            raise ValueError(
                f"{where} holds a different architecture: site {name!r} (shape "
                f"{shape}) is not in this model, whose sites are {list(current)}"
            )
    extra = [name for name in current if name not in saved]
    if extra and complete:
        raise ValueError(
            f"{where} holds a different architecture: this model's site {extra[0]!r} (shape "
            f"{tuple(current[extra[0]].shape)}) is not there; its sites are {list(saved)}"
        )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _pairs(
    what: str, saved: Mapping[str, torch.Tensor], current: Mapping[str, torch.Tensor], where: str
) -> list:
    """``(target, value)`` pairs to copy, after checking names, shapes and dtypes."""
    missing = [name for name in current if name not in saved]
    unknown = [name for name in saved if name not in current]
    if missing or unknown:
        details = []
        if missing:
            details.append(f"this model and guide have {what} {missing[0]!r}, which it lacks")
        if unknown:
            details.append(f"it has {what} {unknown[0]!r}, which this model and guide lack")
        detail = "; ".join(details)
        raise ValueError(
            f"{where} does not match this model and guide: {detail} (a different "
            "architecture, guide class, or guide or model name?)"
        )
    pairs = []
    for name, target in current.items():
        value = saved[name]
        if value.shape != target.shape:
            raise ValueError(
                f"{where} holds a different architecture: {what} {name!r} has shape "
                f"{tuple(value.shape)} there and {tuple(target.shape)} in this model"
            )
        if value.dtype != target.dtype:
            raise ValueError(
                f"{where}: {what} {name!r} is {_dtype_name(value.dtype)} there and "
                f"{_dtype_name(target.dtype)} in this model; build the model in the saved "
                "dtype (e.g. .double())"
            )
        pairs.append((target, value))
    return pairs


def _buffers(module, *, detach: bool = True) -> dict[str, torch.Tensor]:
    """A module's persistent buffers (e.g. batch-norm statistics), by name."""
    if not isinstance(module, nn.Module):
        return {}
    return {
        name: value.detach() if detach else value
        for name, value in module.state_dict(keep_vars=True).items()
        if not isinstance(value, nn.Parameter)
    }


def _describe(value: object, what: str) -> dict:
    """An input's shape and dtype (a tensor, with a batch of one row) or the value itself."""
    if isinstance(value, torch.Tensor):
        shape = [1, *value.shape[1:]] if value.dim() else []
        return {"shape": shape, "dtype": _dtype_name(value.dtype)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise ValueError(
        f"the guide was set up with {what} of type {type(value).__name__}, which cannot be "
        "stored: set it up with tensors, numbers, strings or None"
    )


def _rebuild_inputs(spec: Mapping, device: torch.device) -> tuple[tuple, dict]:
    def rebuild(entry: Mapping):
        if "value" in entry:
            return entry["value"]
        return torch.zeros(entry["shape"], dtype=getattr(torch, entry["dtype"]), device=device)

    return tuple(rebuild(e) for e in spec["args"]), {
        k: rebuild(e) for k, e in spec["kwargs"].items()
    }


def _shapes_of(args: tuple) -> list:
    return [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args]
