"""Our files on disk: written atomically, read safely, marked with their kind and layout.

:func:`write_atomic` writes with ``torch.save`` to a temporary file in the target's folder,
fsyncs it and renames it over the target (``os.replace``), so a reader (or a process killed
mid-write) sees the old file or the new one, never half of one. :func:`read_file` reads with
``torch.load(weights_only=True)``, which rebuilds tensors and plain containers only, so a file
from elsewhere cannot run code, and checks that the file is ours, whole, of a layout this
version reads, and of the kind asked for. What the files hold is
:mod:`~pyro_bbb.io.serialization`'s and :mod:`~pyro_bbb.training.checkpoint`'s business.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHECKPOINT", "MODEL", "read_file", "write_atomic"]

#: The key that marks a file as ours; its value is the kind of file.
FORMAT_KEY = "pyro_bbb"
#: The kinds: a trained model (:func:`save`) and a fit checkpoint (a superset of it).
MODEL, CHECKPOINT = "model", "checkpoint"
#: The version of the layout, raised when it changes incompatibly.
VERSION = 1

#: What each kind of file holds at least.
_REQUIRED = {
    MODEL: {"sites", "params", "buffers", "inputs"},
    CHECKPOINT: {"sites", "params", "buffers", "inputs", "trainable", "optimizer_class",
                 "optimizer", "history", "order_seed", "world_size", "rng"},
}  # fmt: skip

PathLike = str | os.PathLike


def write_atomic(path: PathLike, kind: str, payload: Mapping[str, Any]) -> None:
    """``torch.save`` ``payload``, marked as ``kind``, so that a reader sees old or new.

    Writes a temporary file in the same folder, flushes and fsyncs it, renames it over
    ``path`` with ``os.replace`` (atomic on POSIX and Windows), then fsyncs the folder so
    that the rename survives a power cut. On any error the temporary file is removed.

    Raises:
        FileNotFoundError: If the folder of ``path`` does not exist.
    """
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(
            f"cannot write {str(path)!r}: folder {str(folder)!r} does not exist"
        )
    temporary = folder / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        with open(temporary, "xb") as file:
            torch.save({FORMAT_KEY: kind, "version": VERSION, **payload}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    if os.name == "posix":  # a folder cannot be opened for fsync on Windows
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def read_file(path: PathLike, *, argument: str, kind: str | None = None) -> dict[str, Any]:
    """Read one of our files whole and check its format; tensors come to the CPU.

    Args:
        path: The file.
        argument: The user's argument that named it, for errors (``"path"``, ``"resume"``).
        kind: ``"checkpoint"`` to accept checkpoints only; ``None`` for either kind.

    Raises:
        FileNotFoundError: If there is no file at ``path``.
        ValueError: If it is not ours, is truncated, is of a newer layout, or of the wrong
            kind.
    """
    name = f"{argument}={os.fspath(path)!r}"
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{name}: no such file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        text = str(error).strip()
        reason = text.splitlines()[0].split(". ")[0][:200] if text else ""
        raise ValueError(
            f"{name} cannot be read: it is not a file written by pyro_bbb.save or "
            f"fit(checkpoint=...), or it is truncated ({type(error).__name__}: {reason})"
        ) from error
    if not isinstance(payload, dict) or payload.get(FORMAT_KEY) not in (MODEL, CHECKPOINT):
        held = (
            f"a dict with keys {sorted(map(str, payload))[:8]}"
            if isinstance(payload, dict)
            else f"a {type(payload).__name__}"
        )
        raise ValueError(
            f"{name} is not a pyro_bbb file (it holds {held}); pyro_bbb reads files written "
            "by pyro_bbb.save or fit(checkpoint=...)"
        )
    if not isinstance(payload.get("version"), int) or payload["version"] > VERSION:
        raise ValueError(
            f"{name} has layout version {payload.get('version')!r}; this pyro_bbb reads "
            f"version {VERSION} and older: upgrade pyro_bbb"
        )
    required = _REQUIRED[payload[FORMAT_KEY]]
    if not required <= payload.keys() or not all(
        isinstance(entry, dict) for entry in payload["sites"].values()
    ):
        raise ValueError(f"{name} is damaged: it lacks {sorted(required - payload.keys())}")
    if kind is not None and payload[FORMAT_KEY] != kind:
        raise ValueError(
            f"{name} holds a saved model (pyro_bbb.save), not a checkpoint of fit; "
            "pyro_bbb.load fills a model and guide from it"
        )
    return payload
