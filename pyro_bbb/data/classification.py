"""Classification data: scikit-learn's bundled 8×8 handwritten digits as a train/test split.

Nothing is downloaded (the images ship with scikit-learn, an optional dependency). Features
are float32 in ``[0, 1]``, labels int64.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .._validation import check_open_unit_interval

__all__ = ["Split", "digits"]


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
