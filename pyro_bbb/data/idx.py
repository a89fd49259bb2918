"""Image folders in the MNIST idx format (MNIST, Fashion-MNIST, KMNIST), read from disk.

An idx file is a 4-byte magic number (two zero bytes, a dtype code, the number of dimensions),
one big-endian int32 per dimension and the values, big-endian, in C order; the files may be
gzipped. An *idx folder* holds the four files of MNIST's layout::

    train-images-idx3-ubyte[.gz]   (60000, 28, 28) uint8
    train-labels-idx1-ubyte[.gz]   (60000,) uint8
    t10k-images-idx3-ubyte[.gz]    (10000, 28, 28) uint8
    t10k-labels-idx1-ubyte[.gz]    (10000,) uint8

(``train-images.idx3-ubyte`` with a dot is read too). :func:`load_idx` reads one file as a
NumPy array; :func:`image_folder` reads one split as float32 pixels in ``[0, 1]`` and int64
labels, optionally a random subset; :func:`image_split` reads both splits as a
:class:`~pyro_bbb.data.classification.Split`. Nothing is downloaded: on Debian and Ubuntu,
``apt-get install dataset-fashion-mnist`` puts Fashion-MNIST in :data:`FASHION_MNIST`.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import torch

from .._validation import check_choice, check_int
from .classification import Split

__all__ = [
    "FASHION_MNIST",
    "FASHION_MNIST_CLASSES",
    "ImageData",
    "image_folder",
    "image_split",
    "load_idx",
]

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
"""Where Debian's package ``dataset-fashion-mnist`` installs Fashion-MNIST's idx files."""

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
"""Fashion-MNIST's ten class names, indexed by label."""

# idx dtype codes -> big-endian NumPy dtypes
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"
_SPLIT_PREFIX = {"train": "train", "test": "t10k"}


class ImageData(NamedTuple):
    """Images and their labels, one split of an idx folder.

    Attributes:
        x: Pixels scaled to ``[0, 1]`` (the file's 0 to 255 divided by 255), float32, shape
            ``(num, height * width)`` when flattened, else ``(num, 1, height, width)``
            (``(num, 784)`` or ``(num, 1, 28, 28)`` for MNIST's 28×28 images).
        y: Labels, int64, shape ``(num,)`` (``[0, 10)`` for MNIST and Fashion-MNIST).
    """

    x: torch.Tensor
    y: torch.Tensor


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when it starts with gzip's magic (whatever its name)."""
    with open(path, "rb") as f:
        raw = f.read()
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as error:
        raise ValueError(
            f"idx file {str(path)!r} is a gzip file that cannot be decompressed, expected a "
            f"whole gzip stream ({error})"
        ) from error


def load_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one file in the idx format, gzipped or plain, as a NumPy array.

    The header is checked against the file's length before any value is read: the magic
    number's first two bytes must be zero, its third a known dtype code (``0x08`` uint8,
    ``0x09`` int8, ``0x0B`` int16, ``0x0C`` int32, ``0x0D`` float32, ``0x0E`` float64), its
    fourth the number of dimensions, and the file must hold exactly the values its dimensions
    promise. A file that starts with gzip's magic bytes is decompressed, whatever its name.

    Args:
        path: The idx file (e.g. ``.../train-images-idx3-ubyte.gz``).

    Returns:
        The values in the file's shape (``(60000, 28, 28)`` for MNIST's training images,
        ``(60000,)`` for its labels), in the file's dtype in native byte order; a writable
        copy.

    Raises:
        FileNotFoundError: If ``path`` is not a file.
        ValueError: If the file is truncated (its header or its values shorter than the header
            promises), longer than its header says, not in the idx format (a nonzero first
            byte, an unknown dtype code) or a damaged gzip stream; the message names the file,
            what was expected and what was found.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no idx file at {str(path)!r}")
    data = _read_bytes(path)
    name = repr(str(path))
    if len(data) < 4:
        raise ValueError(
            f"idx file {name} is truncated: expected a 4-byte magic number, found "
            f"{len(data)} bytes in all"
        )
    if data[0] != 0 or data[1] != 0:
        raise ValueError(
            f"{name} is not an idx file: expected a magic number starting with two zero bytes, "
            f"found 0x{data[:4].hex()}"
        )
    code, ndim = data[2], data[3]
    if code not in _IDX_DTYPES:
        known = ", ".join(f"0x{c:02x}" for c in _IDX_DTYPES)
        raise ValueError(
            f"{name} is not an idx file: expected a dtype code in ({known}) as the magic "
            f"number's third byte, found 0x{code:02x}"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(
            f"idx file {name} is truncated: expected a {header}-byte header for {ndim} "
            f"dimensions, found {len(data)} bytes in all"
        )
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = _IDX_DTYPES[code]
    expected = math.prod(shape) * dtype.itemsize
    found = len(data) - header
    if found != expected:
        problem = "is truncated" if found < expected else "has trailing bytes"
        raise ValueError(
            f"idx file {name} {problem}: expected {expected} bytes of {dtype.name} values for "
            f"shape {shape}, found {found}"
        )
    values = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=header)
    return values.reshape(shape).astype(dtype.newbyteorder("="), copy=True)


def _missing_folder(folder: Path) -> FileNotFoundError:
    return FileNotFoundError(
        f"no idx image folder at {str(folder)!r}. Fashion-MNIST on Debian or Ubuntu: "
        f"`apt-get install dataset-fashion-mnist` puts it in {str(FASHION_MNIST)!r}; otherwise "
        "pass a folder holding MNIST's four files (train-images-idx3-ubyte, "
        "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each "
        "optionally .gz)"
    )


def _idx_file(folder: Path, prefix: str, kind: str, ndim: int) -> Path:
    """The folder's ``{prefix}-{kind}`` file, gzipped or plain, dash or dot before ``idx``."""
    names = [
        f"{prefix}-{kind}{sep}idx{ndim}-ubyte{suffix}"
        for sep in ("-", ".")
        for suffix in (".gz", "")
    ]
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"idx folder {str(folder)!r} has no {names[1]!r} (nor {names[0]!r}, {names[2]!r} or "
        f"{names[3]!r})"
    )


def image_folder(
    folder: str | os.PathLike[str] = FASHION_MNIST,
    split: Literal["train", "test"] = "train",
    *,
    num: int | None = None,
    seed: int | np.random.Generator = 0,
    flatten: bool = True,
) -> ImageData:
    """Read one split of an idx image folder: pixels in ``[0, 1]`` and int64 labels.

    ``split="train"`` reads ``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte``,
    ``split="test"`` the ``t10k-`` pair (each gzipped or plain; see :mod:`pyro_bbb.data.idx`).
    The images must be uint8, ``(num_images, height, width)``, and the labels one per image.

    Args:
        folder: The idx folder; by default :data:`FASHION_MNIST`, where Debian's
            ``dataset-fashion-mnist`` puts Fashion-MNIST.
        split: ``"train"`` or ``"test"``.
        num: If given, a random subset of this many images, drawn without replacement in a
            random order (``rng.permutation(num_images)[:num]``; ``num`` equal to the split's
            size shuffles it); ``None`` (the default) keeps every image in the file's order.
        seed: The subset's seed, or a ``numpy.random.Generator`` to draw it from (the same
            generator passed to the train and then the test split draws both subsets from
            one stream). Unused when ``num`` is ``None``.
        flatten: If True (the default), images as rows of ``height * width`` pixels for an
            MLP; if False, as ``(1, height, width)`` one-channel images for conv layers.

    Returns:
        An :class:`ImageData`: ``x`` float32 in ``[0, 1]``, ``(num, height * width)`` or
        ``(num, 1, height, width)``; ``y`` int64, ``(num,)``.

    Raises:
        FileNotFoundError: If ``folder`` does not exist (the message names it and Debian's
            ``dataset-fashion-mnist``) or lacks the split's files.
        ValueError: If a file is truncated or not in the idx format (see :func:`load_idx`),
            the images are not 3-D uint8, the labels are not one per image, or ``num`` exceeds
            the split's size.
    """
    check_choice("split", split, tuple(_SPLIT_PREFIX))
    check_int("num", num, optional=True)
    folder = Path(folder)
    if not folder.is_dir():
        raise _missing_folder(folder)
    prefix = _SPLIT_PREFIX[split]
    images_path = _idx_file(folder, prefix, "images", 3)
    labels_path = _idx_file(folder, prefix, "labels", 1)
    images, labels = load_idx(images_path), load_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(
            f"{str(images_path)!r}: expected uint8 images of shape (num_images, height, width), "
            f"found {images.dtype.name} values of shape {images.shape}"
        )
    if labels.ndim != 1 or labels.shape[0] != images.shape[0] or labels.dtype.kind not in "iu":
        raise ValueError(
            f"{str(labels_path)!r}: expected {images.shape[0]} integer labels, one per image of "
            f"{str(images_path)!r}, found {labels.dtype.name} values of shape {labels.shape}"
        )
    if num is not None:
        if num > len(images):
            raise ValueError(
                f"num must be at most the {split} split's {len(images)} images, got {num}"
            )
        rows = np.random.default_rng(seed).permutation(len(images))[:num]
        images, labels = images[rows], labels[rows]
    x = torch.from_numpy(images).to(torch.float32).div_(255.0)
    height, width = images.shape[1:]
    x = x.reshape(-1, height * width) if flatten else x.reshape(-1, 1, height, width)
    return ImageData(x=x, y=torch.from_numpy(labels.astype(np.int64)))


def image_split(
    folder: str | os.PathLike[str] = FASHION_MNIST,
    *,
    num_train: int | None = None,
    num_test: int | None = None,
    seed: int = 0,
    flatten: bool = True,
) -> Split:
    """Read an idx image folder's training and test splits, each optionally subsampled.

    Both subsets are drawn from one generator seeded with ``seed``, the training one first
    (see :func:`image_folder`).

    Args:
        folder: As in :func:`image_folder`.
        num_train: Training images to draw at random, or ``None`` for all in file order.
        num_test: Test images to draw at random, or ``None`` for all in file order.
        seed: Seed of both subsets.
        flatten: As in :func:`image_folder`.

    Returns:
        A :class:`~pyro_bbb.data.classification.Split`: features float32 in ``[0, 1]``,
        ``(n, height * width)`` or ``(n, 1, height, width)``; labels int64, ``(n,)``.

    Raises:
        FileNotFoundError: As in :func:`image_folder`.
        ValueError: As in :func:`image_folder`.
    """
    rng = np.random.default_rng(seed)
    train = image_folder(folder, "train", num=num_train, seed=rng, flatten=flatten)
    test = image_folder(folder, "test", num=num_test, seed=rng, flatten=flatten)
    return Split(x_train=train.x, y_train=train.y, x_test=test.x, y_test=test.y)
