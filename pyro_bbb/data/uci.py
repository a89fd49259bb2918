"""UCI regression data sets in the split-folder format: read a split, find folders, write one.

The layout is the one of Hernández-Lobato and Adams, *Probabilistic Backpropagation*, ICML
2015 (https://arxiv.org/abs/1502.05336), also used by Gal and Ghahramani's dropout
benchmarks: ``data.txt`` is a whitespace-separated matrix, ``index_features.txt`` and
``index_target.txt`` name its columns, and each split ``K`` has ``index_train_K.txt`` and
``index_test_K.txt`` (one 0-based row index per line). :func:`load_uci` reads one split raw,
:func:`write_uci_folder` writes a folder from your own data, and
:func:`~pyro_bbb.data.uci_folder.load_uci_folder` reads every split, each standardised on its
training rows only. Nothing is downloaded; the benchmark protocol itself is
:mod:`pyro_bbb.bench.uci`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch

from .._validation import check_finite_tensor, check_int, check_open_unit_interval
from .classification import Split

__all__ = [
    "find_uci_folders",
    "load_uci",
    "read_split_rows",
    "read_uci_table",
    "uci_num_splits",
    "write_uci_folder",
]

_TRAIN_INDEX_FILE = re.compile(r"index_train_(\d+)\.txt")


def _uci_file(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(f"UCI folder {str(folder)!r} has no file {name!r}")
    return path


def _read_indices(folder: Path, name: str) -> np.ndarray:
    """Read one 0-based index per line; accepts integers written as floats, like ``"3.0"``."""
    values = np.loadtxt(_uci_file(folder, name), dtype=np.float64, ndmin=1)
    if values.size and not np.all(values == np.round(values)):
        raise ValueError(f"{name!r} in UCI folder {str(folder)!r} must hold integer indices")
    return values.astype(np.int64)


def _check_index_range(indices: np.ndarray, size: int, name: str, folder: Path) -> None:
    if indices.size == 0:
        raise ValueError(f"{name!r} in UCI folder {str(folder)!r} holds no indices")
    if indices.min() < 0 or indices.max() >= size:
        raise ValueError(
            f"{name!r} in UCI folder {str(folder)!r} must hold indices in [0, {size}), "
            f"got [{indices.min()}, {indices.max()}]"
        )


def uci_num_splits(folder: str | os.PathLike[str]) -> int:
    """Number of train/test splits in a UCI split folder.

    Reads ``n_splits.txt`` if the folder has one; otherwise counts the ``index_train_K.txt``
    files.

    Args:
        folder: Path of the data set's folder (e.g. ``.../uci/boston``).

    Returns:
        The number of splits; split indices run from 0 to this minus one.

    Raises:
        FileNotFoundError: If the folder does not exist, or has neither ``n_splits.txt`` nor any
            ``index_train_K.txt`` file.
    """
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"UCI folder {str(root)!r} does not exist")
    n_splits_file = root / "n_splits.txt"
    if n_splits_file.is_file():
        return int(float(n_splits_file.read_text().split()[0]))
    count = sum(1 for path in root.iterdir() if _TRAIN_INDEX_FILE.fullmatch(path.name))
    if count == 0:
        raise FileNotFoundError(
            f"UCI folder {str(root)!r} has no file 'n_splits.txt' and no 'index_train_K.txt' files"
        )
    return count


def load_uci(folder: str | os.PathLike[str], split: int = 0) -> Split:
    """Load one train/test split of a UCI regression data set stored in split-folder format.

    The folder holds ``data.txt`` (a whitespace-separated matrix, one row per point),
    ``index_features.txt`` and ``index_target.txt`` (0-based column indices), and for each split
    ``K`` the files ``index_train_K.txt`` and ``index_test_K.txt`` (0-based row indices). Index
    files hold one integer per line; integers written as floats (``"3.0"``) are accepted.

    Nothing is standardized here; fit a :class:`Standardizer` on the training part.

    Args:
        folder: Path of the data set's folder (e.g. ``.../uci/boston``).
        split: Which split to load, in ``[0, uci_num_splits(folder))``.

    Returns:
        A :class:`Split` with float32 features of shape ``(num_train, num_features)`` and
        ``(num_test, num_features)`` and float32 targets of shape ``(num_train,)`` and
        ``(num_test,)`` (``(n, num_targets)`` if ``index_target.txt`` lists several columns).

    Raises:
        FileNotFoundError: If the folder or one of the files is missing; the message names the
            file and the folder.
        ValueError: If ``split`` is out of range or an index file holds non-integer or
            out-of-range indices.
    """
    root = Path(folder)
    num_splits = uci_num_splits(root)
    if isinstance(split, bool) or not isinstance(split, int) or not 0 <= split < num_splits:
        raise ValueError(
            f"split must be an int in [0, {num_splits}) for UCI folder {str(root)!r}, got {split!r}"
        )
    x, y = read_uci_table(root)
    train, test = read_split_rows(root, split, x.shape[0])
    return Split(x_train=x[train], y_train=y[train], x_test=x[test], y_test=y[test])


def read_uci_table(root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``(rows, features)`` and targets ``(rows,)`` (or ``(rows, targets)``), float32."""
    data = np.loadtxt(_uci_file(root, "data.txt"), dtype=np.float64, ndmin=2)
    num_columns = data.shape[1]
    feature_columns = _read_indices(root, "index_features.txt")
    target_columns = _read_indices(root, "index_target.txt")
    _check_index_range(feature_columns, num_columns, "index_features.txt", root)
    _check_index_range(target_columns, num_columns, "index_target.txt", root)
    x = torch.from_numpy(data[:, feature_columns]).float()
    y = torch.from_numpy(data[:, target_columns]).float()
    if target_columns.size == 1:
        y = y.squeeze(-1)
    return x, y


def read_split_rows(root: Path, split: int, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The train and test row indices of one split, checked against the number of rows."""
    train_rows = _read_indices(root, f"index_train_{split}.txt")
    test_rows = _read_indices(root, f"index_test_{split}.txt")
    _check_index_range(train_rows, num_rows, f"index_train_{split}.txt", root)
    _check_index_range(test_rows, num_rows, f"index_test_{split}.txt", root)
    return torch.from_numpy(train_rows), torch.from_numpy(test_rows)


def find_uci_folders(path: str | os.PathLike[str]) -> list[Path]:
    """The UCI data set folders at ``path``: itself if it holds ``data.txt``, else its children.

    Args:
        path: A data set's folder, or a folder of data set folders (``.../uci``).

    Returns:
        The data set folders, sorted by name.

    Raises:
        FileNotFoundError: If ``path`` is not a folder, or neither it nor any of its
            subfolders holds a ``data.txt``.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"UCI path {str(root)!r} is not a folder")
    if (root / "data.txt").is_file():
        return [root]
    found = sorted(child for child in root.iterdir() if (child / "data.txt").is_file())
    if not found:
        raise FileNotFoundError(
            f"UCI path {str(root)!r} holds no 'data.txt', and none of its subfolders does"
        )
    return found


def write_uci_folder(
    folder: str | os.PathLike[str],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    num_splits: int = 20,
    test_fraction: float = 0.1,
    n_hidden: int = 50,
    n_epochs: int = 40,
    seed: int = 0,
) -> Path:
    """Write a regression data set in the UCI split-folder format, with random splits.

    Writes ``data.txt`` (features then the target, one row per point), ``index_features.txt``,
    ``index_target.txt``, ``n_splits.txt``, ``n_hidden.txt``, ``n_epochs.txt`` and, per split,
    ``index_train_K.txt`` / ``index_test_K.txt`` from a random permutation: the first
    ``round(test_fraction * n)`` rows of the permutation are the test rows. Use it to run
    :func:`load_uci_folder` and ``pyro-bbb bench uci`` on your own data.

    Args:
        folder: Where to write; created if needed. Existing files of these names are replaced.
        x: Features, ``(n, num_features)``.
        y: Targets, ``(n,)``.
        num_splits: Number of random splits.
        test_fraction: Fraction of rows per test part, in ``(0, 1)``; at least one row goes to
            each part.
        n_hidden: Written to ``n_hidden.txt``.
        n_epochs: Written to ``n_epochs.txt``.
        seed: Seed of the permutations.

    Returns:
        The folder.

    Raises:
        ValueError: On mismatched or malformed shapes, fewer than two rows, non-finite values,
            or an option out of range.
    """
    if x.dim() != 2 or y.dim() != 1 or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"x must be (n, num_features) and y (n,) with the same n, got {tuple(x.shape)} "
            f"and {tuple(y.shape)}"
        )
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"x and y need at least two rows, got {n}")
    check_finite_tensor("x", x)
    check_finite_tensor("y", y)
    check_open_unit_interval("test_fraction", test_fraction)
    for name, value in (("num_splits", num_splits), ("n_hidden", n_hidden), ("n_epochs", n_epochs)):
        check_int(name, value)
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    data = torch.cat([x, y.unsqueeze(-1)], dim=-1).double().numpy()
    np.savetxt(root / "data.txt", data, fmt="%.10g")
    num_features = x.shape[1]
    np.savetxt(root / "index_features.txt", np.arange(num_features), fmt="%d")
    (root / "index_target.txt").write_text(f"{num_features}\n")
    for name, value in (("n_splits", num_splits), ("n_hidden", n_hidden), ("n_epochs", n_epochs)):
        (root / f"{name}.txt").write_text(f"{value}\n")
    num_test = min(max(round(test_fraction * n), 1), n - 1)
    generator = np.random.default_rng(seed)
    for k in range(num_splits):
        order = generator.permutation(n)
        np.savetxt(root / f"index_test_{k}.txt", np.sort(order[:num_test]), fmt="%d")
        np.savetxt(root / f"index_train_{k}.txt", np.sort(order[num_test:]), fmt="%d")
    return root
