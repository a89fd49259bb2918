from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_bbb.data import FASHION_MNIST, image_folder, image_split, load_idx

# --- writing small idx files ------------------------------------------------------------------

_CODES = {np.dtype("u1"): 0x08, np.dtype("i1"): 0x09, np.dtype(">i2"): 0x0B, np.dtype(">i4"): 0x0C}
_CODES |= {np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


def idx_bytes(values: np.ndarray) -> bytes:
    """The idx encoding of ``values``, written by hand from the format's definition."""
    dtype = values.dtype.newbyteorder(">") if values.dtype.itemsize > 1 else values.dtype
    header = bytes([0, 0, _CODES[dtype], values.ndim])
    header += b"".join(n.to_bytes(4, "big") for n in values.shape)
    return header + values.astype(dtype).tobytes()


def write_idx(path: Path, values: np.ndarray, *, gz: bool = False) -> Path:
    data = idx_bytes(values)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def write_folder(root: Path, num_train: int = 12, num_test: int = 5, *, gz: bool = True) -> Path:
    """A tiny MNIST-layout folder of 4×3 images whose first pixel is the image's index."""
    root.mkdir(exist_ok=True)
    suffix = ".gz" if gz else ""
    for prefix, num in (("train", num_train), ("t10k", num_test)):
        images = np.zeros((num, 4, 3), np.uint8)
        images[:, 0, 0] = np.arange(num)
        images[:, 3, 2] = 255
        labels = (np.arange(num) % 10).astype(np.uint8)
        write_idx(root / f"{prefix}-images-idx3-ubyte{suffix}", images, gz=gz)
        write_idx(root / f"{prefix}-labels-idx1-ubyte{suffix}", labels, gz=gz)
    return root


# --- load_idx -----------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("dtype", ["u1", "i1", ">i2", ">i4", ">f4", ">f8"])
def test_load_idx_reads_every_dtype_and_shape_gzipped_or_plain(tmp_path, dtype, gz):
    values = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    path = write_idx(tmp_path / "values-idx3", values, gz=gz)
    read = load_idx(path)
    assert read.shape == (2, 3, 4) and read.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(read, values)
    read[0, 0, 0] = 7  # a writable copy


def test_load_idx_recognises_gzip_by_its_bytes_not_its_name(tmp_path):
    labels = np.array([3, 1, 4, 1, 5], np.uint8)
    path = write_idx(tmp_path / "labels-idx1-ubyte", labels, gz=True)  # no .gz
    np.testing.assert_array_equal(load_idx(path), labels)


def test_load_idx_names_the_file_and_the_missing_bytes_of_a_truncated_file(tmp_path):
    path = tmp_path / "cut-idx3-ubyte"
    path.write_bytes(idx_bytes(np.zeros((10, 2, 2), np.uint8))[:-3])
    with pytest.raises(ValueError, match=r"cut-idx3-ubyte.*is truncated: expected 40 bytes of "
                       r"uint8 values for shape \(10, 2, 2\), found 37"):  # fmt: skip
        load_idx(path)


def test_load_idx_names_a_header_cut_short(tmp_path):
    path = tmp_path / "header"
    path.write_bytes(idx_bytes(np.zeros((10, 2, 2), np.uint8))[:9])
    with pytest.raises(ValueError, match=r"truncated: expected a 16-byte header for 3 "
                       r"dimensions, found 9 bytes"):  # fmt: skip
        load_idx(path)
    path.write_bytes(b"\x00\x00")
    with pytest.raises(ValueError, match=r"expected a 4-byte magic number, found 2 bytes"):
        load_idx(path)


def test_load_idx_refuses_trailing_bytes(tmp_path):
    path = tmp_path / "long"
    path.write_bytes(idx_bytes(np.zeros(4, np.uint8)) + b"\x00")
    with pytest.raises(ValueError, match=r"has trailing bytes: expected 4 bytes .* found 5"):
        load_idx(path)


def test_load_idx_says_what_magic_it_expected_and_found(tmp_path):
    png = tmp_path / "image.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(20))
    with pytest.raises(ValueError, match=r"image\.png.* is not an idx file: expected a magic "
                       r"number starting with two zero bytes, found 0x89504e47"):  # fmt: skip
        load_idx(png)
    code = tmp_path / "code"
    code.write_bytes(bytes([0, 0, 0x07, 1, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"expected a dtype code in \(0x08, .*0x0e\) as the "
                       r"magic number's third byte, found 0x07"):  # fmt: skip
        load_idx(code)


def test_load_idx_names_a_damaged_gzip_file(tmp_path):
    path = tmp_path / "cut.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((50, 8), np.uint8)))[:-12])
    with pytest.raises(ValueError, match=r"cut\.gz.* a gzip file that cannot be decompressed"):
        load_idx(path)


def test_load_idx_names_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no idx file at .*nothing-here"):
        load_idx(tmp_path / "nothing-here")


# --- image_folder and image_split ---------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_image_folder_scales_pixels_to_unit_interval_in_file_order(tmp_path, gz):
    folder = write_folder(tmp_path / "idx", gz=gz)
    train = image_folder(folder, "train")
    assert train.x.shape == (12, 12) and train.x.dtype == torch.float32
    assert train.y.dtype == torch.int64 and train.y.tolist() == [*range(10), 0, 1]
    torch.testing.assert_close(train.x[:, 0], torch.arange(12.0) / 255)
    assert torch.all(train.x[:, -1] == 1.0) and float(train.x.min()) == 0.0
    test = image_folder(folder, "test", flatten=False)
    assert test.x.shape == (5, 1, 4, 3) and test.y.tolist() == [0, 1, 2, 3, 4]


def test_image_folder_subsample_is_a_seeded_subset_that_keeps_pairs(tmp_path):
    folder = write_folder(tmp_path / "idx", num_train=40)
    a = image_folder(folder, num=15, seed=3)
    b = image_folder(folder, num=15, seed=3)
    c = image_folder(folder, num=15, seed=4)
    torch.testing.assert_close(a.x, b.x)
    assert not torch.equal(a.x, c.x)
    index = (a.x[:, 0] * 255).round().long()  # the image's index in the file
    assert len(set(index.tolist())) == 15 and a.y.tolist() == (index % 10).tolist()
    assert index.tolist() == np.random.default_rng(3).permutation(40)[:15].tolist()


def test_image_split_draws_both_subsets_from_one_generator(tmp_path):
    folder = write_folder(tmp_path / "idx", num_train=30, num_test=20)
    split = image_split(folder, num_train=10, num_test=6, seed=2, flatten=False)
    rng = np.random.default_rng(2)
    train_rows, test_rows = rng.permutation(30)[:10], rng.permutation(20)[:6]
    assert split.x_train.shape == (10, 1, 4, 3) and split.x_test.shape == (6, 1, 4, 3)
    assert (split.x_train[:, 0, 0, 0] * 255).round().long().tolist() == train_rows.tolist()
    assert (split.x_test[:, 0, 0, 0] * 255).round().long().tolist() == test_rows.tolist()
    whole = image_split(folder)
    assert len(whole.x_train) == 30 and len(whole.x_test) == 20


def test_image_folder_refuses_more_images_than_the_split_holds(tmp_path):
    folder = write_folder(tmp_path / "idx", num_test=5)
    with pytest.raises(ValueError, match=r"num must be at most the test split's 5 images, got 6"):
        image_folder(folder, "test", num=6)
    with pytest.raises(ValueError, match=r"split must be 'train' or 'test', got 'val'"):
        image_folder(folder, "val")


def test_image_folder_names_the_debian_package_and_the_path_when_the_folder_is_absent(tmp_path):
    missing = tmp_path / "fashion-mnist"
    with pytest.raises(FileNotFoundError) as caught:
        image_folder(missing)
    message = str(caught.value)
    assert str(missing) in message and "apt-get install dataset-fashion-mnist" in message


def test_image_folder_names_a_missing_file_of_the_split(tmp_path):
    folder = write_folder(tmp_path / "idx")
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    assert len(image_folder(folder, "train").x) == 12  # the other split still reads
    with pytest.raises(FileNotFoundError, match=r"has no 't10k-labels-idx1-ubyte'"):
        image_folder(folder, "test")


def test_image_folder_reads_the_dotted_file_names(tmp_path):
    folder = write_folder(tmp_path / "idx", gz=False)
    for path in folder.iterdir():
        path.rename(folder / path.name.replace("-idx", ".idx"))
    assert image_folder(folder, "test").x.shape == (5, 12)


def test_image_folder_refuses_labels_that_do_not_match_the_images(tmp_path):
    folder = write_folder(tmp_path / "idx", gz=False)
    write_idx(folder / "train-labels-idx1-ubyte", np.zeros(11, np.uint8))
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte.*expected 12 integer labels"):
        image_folder(folder, "train")
    write_idx(folder / "t10k-images-idx3-ubyte", np.zeros((5, 12), np.uint8))
    with pytest.raises(ValueError, match=r"expected uint8 images of shape \(num_images, "
                       r"height, width\), found uint8 values of shape \(5, 12\)"):  # fmt: skip
        image_folder(folder, "test")


@pytest.mark.skipif(
    not FASHION_MNIST.is_dir(),
    reason=f"Fashion-MNIST not found at {FASHION_MNIST} (apt-get install dataset-fashion-mnist)",
)
def test_image_split_reads_debians_fashion_mnist_at_full_size():
    data = image_split(num_test=1000, seed=0)
    assert data.x_train.shape == (60000, 784) and data.x_test.shape == (1000, 784)
    assert data.y_train.bincount().tolist() == [6000] * 10  # balanced classes
    assert float(data.x_train.min()) == 0.0 and float(data.x_train.max()) == 1.0
    test = image_folder(split="test", flatten=False)
    assert test.x.shape == (10000, 1, 28, 28) and test.y.bincount().tolist() == [1000] * 10
