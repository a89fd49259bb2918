"""Data sets for examples, tests and benchmarks, returned as torch tensors.

This module holds the 1-D "gap" regression toy problem, scikit-learn's bundled digits images,
a loader for the standard UCI regression split folders (``data.txt`` plus ``index_*.txt``
files), and a tiny :class:`Standardizer`. It does not download anything, build data loaders or
train models. Features are float32; regression targets are float32 and class labels int64.

The UCI split-folder layout is the one used by Hernández-Lobato and Adams, *Probabilistic
Backpropagation*, ICML 2015 (https://arxiv.org/abs/1502.05336), and later by Gal and
Ghahramani's dropout benchmarks: ``data.txt`` is a whitespace-separated matrix, and the index
files hold one 0-based integer per line. :func:`load_uci_folder` reads every split of such a
folder and standardizes each on its training rows; :func:`write_uci_folder` writes one.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

__all__ = [
    "Split",
    "Standardizer",
    "ToyData",
    "UCIFolder",
    "UCISplit",
    "digits",
    "find_uci_folders",
    "gap_function",
    "gap_regions",
    "gap_regression",
    "load_uci",
    "load_uci_folder",
    "uci_num_splits",
    "write_uci_folder",
]

_GAP_DATA_INTERVALS: tuple[tuple[float, float], ...] = ((-4.0, -1.0), (1.0, 4.0))
_GAP_INTERVALS: tuple[tuple[float, float], ...] = ((-1.0, 1.0),)
_GAP_EXTRAPOLATION_INTERVALS: tuple[tuple[float, float], ...] = ((-7.0, -4.0), (4.0, 7.0))


class ToyData(NamedTuple):
    """A toy regression data set.

    Attributes:
        x: Inputs, shape ``(num_data, 1)``, float32.
        y: Targets, shape ``(num_data,)``, float32.
    """

    x: torch.Tensor
    y: torch.Tensor


class Split(NamedTuple):
    """A train/test split.

    Attributes:
        x_train: Training features, shape ``(num_train, ...)``, float32.
        y_train: Training targets, shape ``(num_train,)``: float32 for regression, int64 labels
            for classification.
        x_test: Test features, shape ``(num_test, ...)``, float32.
        y_test: Test targets, shape ``(num_test,)``, same dtype as ``y_train``.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


# ---------------------------------------------------------------------------------------------
# Toy regression with a gap
# ---------------------------------------------------------------------------------------------


def gap_function(x: torch.Tensor) -> torch.Tensor:
    r"""The noiseless regression function of :func:`gap_regression`, :math:`f(x) = \sin(x)`.

    Args:
        x: Inputs of any shape.

    Returns:
        :math:`\sin(x)`, same shape as ``x``.
    """
    return torch.sin(x)


def gap_regions() -> dict[str, list[tuple[float, float]]]:
    """The input intervals of the gap problem, for shading plots and scoring by region.

    Every value is a list of closed ``(low, high)`` intervals, so each region can be passed
    straight to :func:`pyro_bbb.plots.plot_regression_bands` as ``shade=``.

    Returns:
        A fresh dict with keys

        * ``"data"``: ``[(-4, -1), (1, 4)]``, where :func:`gap_regression` draws inputs;
        * ``"gap"``: ``[(-1, 1)]``, between the two clusters, where a good model's epistemic
          uncertainty should grow;
        * ``"extrapolation"``: ``[(-7, -4), (4, 7)]``, beyond the data on either side.
    """
    return {
        "data": list(_GAP_DATA_INTERVALS),
        "gap": list(_GAP_INTERVALS),
        "extrapolation": list(_GAP_EXTRAPOLATION_INTERVALS),
    }


def gap_regression(num_data: int = 160, noise: float = 0.1, seed: int = 0) -> ToyData:
    r"""Draw the 1-D regression problem with a gap in the middle of its inputs.

    Half of the inputs (rounded down) are uniform on :math:`[-4, -1)`, the rest uniform on
    :math:`[1, 4)`, so no input lies in the gap :math:`(-1, 1)`; targets are

    .. math:: y = \sin(x) + \varepsilon, \qquad \varepsilon \sim \mathcal{N}(0, \text{noise}^2).

    Points are returned in random order. A seeded ``torch.Generator`` is used, so the global
    random state is untouched and the same seed always gives the same data.

    Args:
        num_data: Number of points, at least 2 so that both sides are populated.
        noise: Standard deviation of the Gaussian observation noise, non-negative.
        seed: Seed of the generator.

    Returns:
        A :class:`ToyData` with ``x`` of shape ``(num_data, 1)`` and ``y`` of shape
        ``(num_data,)``, both float32.

    Raises:
        ValueError: If ``num_data`` is not an int >= 2 or ``noise`` is negative.
    """
    if isinstance(num_data, bool) or not isinstance(num_data, int) or num_data < 2:
        raise ValueError(f"num_data must be an int >= 2, got {num_data!r}")
    if not noise >= 0:
        raise ValueError(f"noise must be non-negative, got {noise!r}")
    generator = torch.Generator().manual_seed(seed)
    (left_low, left_high), (right_low, right_high) = _GAP_DATA_INTERVALS
    num_left = num_data // 2
    u = torch.rand(num_data, generator=generator, dtype=torch.float64)
    x = torch.cat(
        [
            left_low + (left_high - left_low) * u[:num_left],
            right_low + (right_high - right_low) * u[num_left:],
        ]
    )
    x = x[torch.randperm(num_data, generator=generator)]
    y = gap_function(x) + noise * torch.randn(num_data, generator=generator, dtype=torch.float64)
    return ToyData(x=x.float().unsqueeze(-1), y=y.float())


# ---------------------------------------------------------------------------------------------
# scikit-learn digits
# ---------------------------------------------------------------------------------------------


def digits(test_fraction: float = 0.25, seed: int = 0, *, images: bool = False) -> Split:
    """Load scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes).

    Pixel intensities (0 to 16) are divided by 16 so features lie in ``[0, 1]``. The split is
    stratified by class, so train and test have the same class proportions up to rounding.
    Nothing is downloaded: the data ship with scikit-learn.

    Args:
        test_fraction: Fraction of the points held out for testing, in ``(0, 1)``.
        seed: Seed of the shuffle before splitting.
        images: If True, return features as images of shape ``(n, 1, 8, 8)`` (for conv layers)
            instead of flat vectors of shape ``(n, 64)``.

    Returns:
        A :class:`Split` with float32 features in ``[0, 1]`` of shape ``(n, 64)`` or
        ``(n, 1, 8, 8)`` and int64 labels in ``[0, 10)`` of shape ``(n,)``.

    Raises:
        ImportError: If scikit-learn is not installed.
        ValueError: If ``test_fraction`` is not in ``(0, 1)``.
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as error:
        raise ImportError(
            "digits() needs scikit-learn, which is not installed; run `pip install scikit-learn`"
        ) from error
    bunch = load_digits()
    x = np.asarray(bunch.data, dtype=np.float32) / 16.0
    y = np.asarray(bunch.target, dtype=np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    shape = (-1, 1, 8, 8) if images else (-1, 64)
    return Split(
        x_train=torch.from_numpy(x_train).reshape(shape),
        y_train=torch.from_numpy(y_train),
        x_test=torch.from_numpy(x_test).reshape(shape),
        y_test=torch.from_numpy(y_test),
    )


# ---------------------------------------------------------------------------------------------
# UCI split folders
# ---------------------------------------------------------------------------------------------

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
    x, y = _read_uci_table(root)
    train, test = _read_split_rows(root, split, x.shape[0])
    return Split(x_train=x[train], y_train=y[train], x_test=x[test], y_test=y[test])


def _read_uci_table(root: Path) -> tuple[torch.Tensor, torch.Tensor]:
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


def _read_split_rows(root: Path, split: int, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The train and test row indices of one split, checked against the number of rows."""
    train_rows = _read_indices(root, f"index_train_{split}.txt")
    test_rows = _read_indices(root, f"index_test_{split}.txt")
    _check_index_range(train_rows, num_rows, f"index_train_{split}.txt", root)
    _check_index_range(test_rows, num_rows, f"index_test_{split}.txt", root)
    return torch.from_numpy(train_rows), torch.from_numpy(test_rows)


# ---------------------------------------------------------------------------------------------
# Standardization
# ---------------------------------------------------------------------------------------------


class Standardizer:
    r"""Shift and scale to zero mean and unit variance, with statistics fitted on training data.

    ``transform`` computes :math:`(x - \mu) / \sigma` with :math:`\mu`, :math:`\sigma` the
    per-column mean and population standard deviation of the data passed to :meth:`fit`;
    :math:`\sigma` is floored at ``min_std`` so constant columns map to 0 instead of NaN.

    Typical use on regression targets::

        y_scaler = Standardizer().fit(split.y_train)
        y_train = y_scaler.transform(split.y_train)
        ...  # predict loc, scale in standardized units
        loc = y_scaler.inverse_transform(loc)
        scale = y_scaler.inverse_scale(scale)

    Args:
        min_std: Floor on the fitted standard deviation, positive.

    Raises:
        ValueError: If ``min_std`` is not positive.

    Attributes:
        mean: Per-column mean, shape ``x.shape[1:]``; None before :meth:`fit`.
        std: Per-column floored standard deviation, shape ``x.shape[1:]``; None before
            :meth:`fit`.
    """

    def __init__(self, min_std: float = 1e-6) -> None:
        if not min_std > 0:
            raise ValueError(f"min_std must be positive, got {min_std!r}")
        self.min_std = min_std
        self.mean: torch.Tensor | None = None
        self.std: torch.Tensor | None = None

    def fit(self, x: torch.Tensor) -> Standardizer:
        """Compute the per-column mean and standard deviation of ``x`` over its first dimension.

        Args:
            x: Training data, shape ``(n,)`` or ``(n, features)``, with ``n >= 1``.

        Returns:
            This standardizer, so that ``Standardizer().fit(x)`` can be chained.

        Raises:
            ValueError: If ``x`` has no rows.
        """
        if x.dim() == 0 or x.shape[0] == 0:
            raise ValueError(f"x must have at least one row, got shape {tuple(x.shape)}")
        x = x.detach()
        self.mean = x.mean(dim=0)
        self.std = x.std(dim=0, correction=0).clamp_min(self.min_std)
        return self

    def _fitted(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mean is None or self.std is None:
            raise RuntimeError("Standardizer is not fitted; call fit(x_train) first")
        return self.mean.to(x), self.std.to(x)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        r"""Standardize: :math:`(x - \mu) / \sigma`.

        Args:
            x: Data with trailing shape matching the fitted data, e.g. ``(batch, features)``.

        Returns:
            Standardized data, same shape as ``x``.

        Raises:
            RuntimeError: If :meth:`fit` has not been called.
        """
        mean, std = self._fitted(x)
        return (x - mean) / std

    def inverse_transform(self, x: torch.Tensor) -> torch.Tensor:
        r"""Undo :meth:`transform`: :math:`x \sigma + \mu`.

        Args:
            x: Standardized data, e.g. predictive means ``(num_samples, batch)``.

        Returns:
            Data in original units, same shape as ``x``.

        Raises:
            RuntimeError: If :meth:`fit` has not been called.
        """
        mean, std = self._fitted(x)
        return x * std + mean

    def inverse_scale(self, scale: torch.Tensor) -> torch.Tensor:
        r"""Map a standard deviation from standardized to original units: :math:`s \sigma`.

        Args:
            scale: Standard deviations in standardized units, e.g. ``(num_samples, batch)``.

        Returns:
            Standard deviations in original units, same shape as ``scale``.

        Raises:
            RuntimeError: If :meth:`fit` has not been called.
        """
        _, std = self._fitted(scale)
        return scale * std


# ---------------------------------------------------------------------------------------------
# UCI benchmark folders: every split, standardized on its training part
# ---------------------------------------------------------------------------------------------


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
    elif isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    elif not 1 <= num_splits <= available:
        raise ValueError(
            f"num_splits must be in [1, {available}] for UCI folder {str(root)!r}, got {num_splits}"
        )
    x, y = _read_uci_table(root)
    if y.dim() != 1:
        raise ValueError(
            f"load_uci_folder reads one target column; 'index_target.txt' in {str(root)!r} "
            f"lists {y.shape[1]}"
        )
    train_rows, test_rows = [], []
    for k in range(num_splits):
        train, test = _read_split_rows(root, k, x.shape[0])
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
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        raise ValueError("x and y must be finite")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    for name, value in (("num_splits", num_splits), ("n_hidden", n_hidden), ("n_epochs", n_epochs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
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
