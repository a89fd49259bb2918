"""A UCI data set with all of its splits, each standardised on its own training rows.

:func:`load_uci_folder` reads a split folder (the format of :mod:`pyro_bbb.data.uci`) once and
returns a :class:`UCIFolder`; indexing it gives a :class:`UCISplit` whose features and target
are standardised with the statistics of that split's training rows only, so no statistic of
the test rows leaks into training.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .._validation import check_int
from .standardize import Standardizer
from .uci import read_split_rows, read_uci_table, uci_num_splits

__all__ = ["UCIFolder", "UCISplit", "load_uci_folder"]


class UCISplit(NamedTuple):
    """One split of a UCI data set, standardized with statistics of its training part only.

    Features and targets are standardized column by column with a :class:`Standardizer` fitted
    on the training rows, so no statistic of the test rows leaks into training. Report test
    metrics in original units: ``y_scaler.inverse_transform`` for means,
    ``y_scaler.inverse_scale`` for standard deviations, and subtract ``log(y_scaler.std)`` from
    a log-density per point.

    Attributes:
        index: The split's number ``K`` (from ``index_train_K.txt``).
        x_train: Standardized training features, ``(num_train, num_features)``, float32.
        y_train: Standardized training targets, ``(num_train,)``, float32.
        x_test: Test features standardized with the training statistics,
            ``(num_test, num_features)``.
        y_test: Test targets in *original* units, ``(num_test,)``: what metrics compare to.
        x_scaler: The features' standardizer, fitted on the training rows.
        y_scaler: The target's standardizer, fitted on the training rows.
    """

    index: int
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_scaler: Standardizer
    y_scaler: Standardizer


class UCIFolder:
    """A UCI regression data set in split-folder format, read once, with all of its splits.

    Made by :func:`load_uci_folder`. ``len(data)`` is the number of splits, ``data[k]`` the
    standardized :class:`UCISplit` ``k`` and iterating gives every split in order.

    Attributes:
        name: The folder's name (``"boston"``).
        path: The folder.
        x: Every row's features in original units, ``(num_rows, num_features)``, float32.
        y: Every row's target in original units, ``(num_rows,)``, float32.
        train_rows: Per split, the 0-based training row indices, int64 tensors.
        test_rows: Per split, the 0-based test row indices, int64 tensors.
        n_hidden: Hidden units of the standard protocol (``n_hidden.txt``), or ``None``.
        n_epochs: Epochs of the standard protocol (``n_epochs.txt``), or ``None``.
    """

    def __init__(
        self,
        name: str,
        path: Path,
        x: torch.Tensor,
        y: torch.Tensor,
        train_rows: Sequence[torch.Tensor],
        test_rows: Sequence[torch.Tensor],
        n_hidden: int | None,
        n_epochs: int | None,
    ) -> None:
        self.name = name
        self.path = path
        self.x = x
        self.y = y
        self.train_rows = tuple(train_rows)
        self.test_rows = tuple(test_rows)
        self.n_hidden = n_hidden
        self.n_epochs = n_epochs

    @property
    def num_features(self) -> int:
        """Number of input features."""
        return self.x.shape[1]

    def __len__(self) -> int:
        return len(self.train_rows)

    def __getitem__(self, k: int) -> UCISplit:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(self):
            raise IndexError(
                f"split must be an int in [0, {len(self)}) for {self.name!r}, got {k!r}"
            )
        train, test = self.train_rows[k], self.test_rows[k]
        x_scaler = Standardizer().fit(self.x[train])
        y_scaler = Standardizer().fit(self.y[train])
        return UCISplit(
            index=k,
            x_train=x_scaler.transform(self.x[train]),
            y_train=y_scaler.transform(self.y[train]),
            x_test=x_scaler.transform(self.x[test]),
            y_test=self.y[test],
            x_scaler=x_scaler,
            y_scaler=y_scaler,
        )

    def __iter__(self) -> Iterator[UCISplit]:
        return (self[k] for k in range(len(self)))

    def __repr__(self) -> str:
        return (
            f"UCIFolder({self.name!r}, rows={self.x.shape[0]}, features={self.num_features}, "
            f"splits={len(self)}, n_hidden={self.n_hidden}, n_epochs={self.n_epochs})"
        )


def _read_optional_int(root: Path, name: str) -> int | None:
    path = root / name
    if not path.is_file():
        return None
    text = path.read_text().split()
    value = float(text[0]) if text else math.nan
    if not (math.isfinite(value) and value == round(value) and value >= 1):
        raise ValueError(f"{name!r} in UCI folder {str(root)!r} must hold a positive integer")
    return int(value)


def load_uci_folder(path: str | os.PathLike[str], *, num_splits: int | None = None) -> UCIFolder:
    """Read a UCI regression data set in split-folder format, with every split.

    The folder holds ``data.txt``, ``index_features.txt``, ``index_target.txt`` and
    ``index_train_K.txt`` / ``index_test_K.txt`` for ``K = 0, 1, …`` (see :func:`load_uci`), and
    optionally ``n_splits.txt``, ``n_hidden.txt`` and ``n_epochs.txt`` (one integer each). The
    data are read once; indexing the result gives a :class:`UCISplit` whose features and target
    are standardized with the mean and standard deviation of that split's *training rows only*.

    Args:
        path: The data set's folder (e.g. ``.../uci/boston``); its name becomes the data set's
            name.
        num_splits: Read only the first this many splits; ``None`` reads all of them
            (``n_splits.txt``, or the number of ``index_train_K.txt`` files).

    Returns:
        A :class:`UCIFolder`: ``len`` is the number of splits read, ``folder[k]`` split ``k``.

    Raises:
        FileNotFoundError: If the folder or one of its files is missing; the message names both.
        ValueError: If ``num_splits`` is not a positive int at most the number of splits, an
            index file holds non-integer or out-of-range indices, or a split's training and test
            rows overlap.
    """
    root = Path(path)
    available = uci_num_splits(root)
    if num_splits is None:
        num_splits = available
    elif check_int("num_splits", num_splits, optional=True) > available:
        raise ValueError(
            f"num_splits must be in [1, {available}] for UCI folder {str(root)!r}, got {num_splits}"
        )
    x, y = read_uci_table(root)
    if y.dim() != 1:
        raise ValueError(
            f"load_uci_folder reads one target column; 'index_target.txt' in {str(root)!r} "
            f"lists {y.shape[1]}"
        )
    train_rows, test_rows = [], []
    for k in range(num_splits):
        train, test = read_split_rows(root, k, x.shape[0])
        overlap = np.intersect1d(train.numpy(), test.numpy())
        if overlap.size:
            raise ValueError(
                f"split {k} of UCI folder {str(root)!r} has {overlap.size} row(s) in both "
                f"'index_train_{k}.txt' and 'index_test_{k}.txt' (first: {int(overlap[0])})"
            )
        train_rows.append(train)
        test_rows.append(test)
    return UCIFolder(
        name=root.resolve().name,
        path=root,
        x=x,
        y=y,
        train_rows=train_rows,
        test_rows=test_rows,
        n_hidden=_read_optional_int(root, "n_hidden.txt"),
        n_epochs=_read_optional_int(root, "n_epochs.txt"),
    )
