"""Classification data: scikit-learn's bundled 8×8 handwritten digits as a train/test split.

:func:`digits` is the ten-class problem; :func:`split_digits` and :func:`permuted_digits` cut
it into the task sequences of continual learning (split and permuted MNIST in Zenke et al.
2017 and Nguyen et al. 2018, at the digits' scale). Nothing is downloaded (the images ship
with scikit-learn, an optional dependency). Features are float32 in ``[0, 1]``, labels int64.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .._validation import check_int, check_open_unit_interval

__all__ = ["Split", "digits", "permuted_digits", "split_digits"]


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
    check_open_unit_interval("test_fraction", test_fraction)
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


def split_digits(test_fraction: float = 0.25, seed: int = 0) -> list[Split]:
    """The digits as five two-class tasks: 0 vs 1, 2 vs 3, 4 vs 5, 6 vs 7, 8 vs 9.

    Each task holds the images of its two digits from one :func:`digits` split, labelled 0
    for the even digit and 1 for the odd one, so a multi-head network gives every task its own
    two-way head (split MNIST of Zenke et al. 2017, as Nguyen et al. 2018 run it).

    Args:
        test_fraction: As in :func:`digits`.
        seed: As in :func:`digits`.

    Returns:
        Five :class:`Split` s with features ``(n, 64)`` and labels in ``{0, 1}``.
    """
    data = digits(test_fraction, seed)
    tasks = []
    for first in range(0, 10, 2):
        train = (data.y_train == first) | (data.y_train == first + 1)
        test = (data.y_test == first) | (data.y_test == first + 1)
        tasks.append(
            Split(
                x_train=data.x_train[train],
                y_train=data.y_train[train] - first,
                x_test=data.x_test[test],
                y_test=data.y_test[test] - first,
            )
        )
    return tasks


def permuted_digits(num_tasks: int = 5, test_fraction: float = 0.25, seed: int = 0) -> list[Split]:
    """The ten-class digits under a fixed random permutation of the 64 pixels per task.

    Task 0 keeps the images as they are; task ``t > 0`` shuffles the pixels of every image,
    train and test alike, by one permutation drawn from ``seed`` (permuted MNIST of Goodfellow
    et al. 2013, at the digits' scale). Every task has the same labels, for one shared head.

    Args:
        num_tasks: Number of tasks, at least 1.
        test_fraction: As in :func:`digits`.
        seed: Seed of the split and of the permutations.

    Returns:
        ``num_tasks`` :class:`Split` s with features ``(n, 64)`` and labels in ``[0, 10)``.
    """
    check_int("num_tasks", num_tasks)
    data = digits(test_fraction, seed)
    generator = torch.Generator().manual_seed(seed)
    tasks = []
    for t in range(num_tasks):
        order = torch.arange(64) if t == 0 else torch.randperm(64, generator=generator)
        tasks.append(
            Split(
                x_train=data.x_train[:, order],
                y_train=data.y_train,
                x_test=data.x_test[:, order],
                y_test=data.y_test,
            )
        )
    return tasks
