from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from pyro_bbb.data import (
    Standardizer,
    digits,
    find_uci_folders,
    gap_function,
    gap_regions,
    gap_regression,
    load_uci,
    load_uci_folder,
    permuted_digits,
    split_digits,
    uci_num_splits,
    write_uci_folder,
)

from ..support import UCI_ROOT

BOSTON = UCI_ROOT / "boston"
needs_boston = pytest.mark.skipif(
    not (BOSTON / "data.txt").is_file(),
    reason=f"UCI boston folder not found at {BOSTON} (set PYRO_BBB_UCI)",
)


# --- gap regression ---------------------------------------------------------------------------


def test_gap_regression_has_documented_shapes_and_dtypes():
    data = gap_regression(num_data=31, noise=0.1, seed=0)
    assert data.x.shape == (31, 1) and data.y.shape == (31,)
    assert data.x.dtype == torch.float32 and data.y.dtype == torch.float32


def test_gap_regression_puts_no_input_in_the_gap_and_splits_points_evenly():
    x = gap_regression(num_data=160, seed=3).x.squeeze(-1)
    assert not ((x > -1) & (x < 1)).any()
    assert ((x >= -4) & (x <= 4)).all()
    assert int((x < 0).sum()) == 80 and int((x > 0).sum()) == 80


def test_gap_regression_targets_are_sin_x_when_noise_is_zero():
    data = gap_regression(num_data=50, noise=0.0)
    torch.testing.assert_close(data.y, torch.sin(data.x.squeeze(-1)))


def test_gap_regression_noise_has_the_requested_standard_deviation():
    data = gap_regression(num_data=4000, noise=0.3, seed=1)
    residual = data.y - gap_function(data.x.squeeze(-1))
    assert float(residual.std()) == pytest.approx(0.3, rel=0.05)


def test_gap_regression_is_reproducible_from_its_seed():
    a, b, c = gap_regression(seed=5), gap_regression(seed=5), gap_regression(seed=6)
    torch.testing.assert_close(a.x, b.x)
    torch.testing.assert_close(a.y, b.y)
    assert not torch.equal(a.x, c.x)


def test_gap_regression_rejects_too_few_points():
    with pytest.raises(ValueError, match=r"num_data must be an int >= 2, got 1"):
        gap_regression(num_data=1)


def test_gap_regions_cover_data_gap_and_extrapolation_without_overlap():
    regions = gap_regions()
    assert regions == {
        "data": [(-4.0, -1.0), (1.0, 4.0)],
        "gap": [(-1.0, 1.0)],
        "extrapolation": [(-7.0, -4.0), (4.0, 7.0)],
    }
    regions["gap"].append((9.0, 10.0))  # callers get a fresh copy
    assert gap_regions()["gap"] == [(-1.0, 1.0)]


# --- digits -----------------------------------------------------------------------------------


def test_digits_returns_a_stratified_split_of_scaled_features():
    pytest.importorskip("sklearn")
    split = digits(test_fraction=0.25, seed=0)
    num_train, num_test = split.x_train.shape[0], split.x_test.shape[0]
    assert num_train + num_test == 1797
    assert num_test == pytest.approx(0.25 * 1797, abs=1)
    assert split.x_train.shape == (num_train, 64) and split.x_test.shape == (num_test, 64)
    assert split.x_train.dtype == torch.float32 and split.y_train.dtype == torch.int64
    assert float(split.x_train.min()) == 0.0 and float(split.x_train.max()) == 1.0
    assert set(split.y_test.tolist()) == set(range(10))
    train_share = torch.bincount(split.y_train, minlength=10) / num_train
    test_share = torch.bincount(split.y_test, minlength=10) / num_test
    assert (train_share - test_share).abs().max() < 0.01


def test_digits_image_option_reshapes_to_one_channel_8x8():
    pytest.importorskip("sklearn")
    flat = digits(seed=1)
    images = digits(seed=1, images=True)
    assert images.x_train.shape == (flat.x_train.shape[0], 1, 8, 8)
    torch.testing.assert_close(images.x_test.reshape(-1, 64), flat.x_test)
    torch.testing.assert_close(images.y_test, flat.y_test)


def test_digits_rejects_a_test_fraction_outside_zero_one():
    with pytest.raises(ValueError, match=r"test_fraction must be in \(0, 1\), got 1.5"):
        digits(test_fraction=1.5)


def test_split_digits_are_five_two_class_tasks_that_partition_the_digits():
    pytest.importorskip("sklearn")
    full = digits(seed=0)
    tasks = split_digits(seed=0)
    assert len(tasks) == 5
    for t, task in enumerate(tasks):
        assert set(task.y_train.tolist()) == {0, 1} and set(task.y_test.tolist()) == {0, 1}
        digit = task.y_train + 2 * t  # the original label of every image
        expected = full.x_train[(full.y_train == 2 * t) | (full.y_train == 2 * t + 1)]
        torch.testing.assert_close(task.x_train, expected)
        torch.testing.assert_close(full.y_train[(full.y_train // 2) == t], digit)
    assert sum(len(task.x_train) + len(task.x_test) for task in tasks) == 1797


def test_permuted_digits_shuffle_every_images_pixels_alike_and_keep_the_labels():
    pytest.importorskip("sklearn")
    full = digits(seed=0)
    tasks = permuted_digits(3, seed=0)
    torch.testing.assert_close(tasks[0].x_train, full.x_train)  # task 0 is the digits
    for task in tasks[1:]:
        torch.testing.assert_close(task.y_test, full.y_test)
        # every pixel of the task is one pixel of the digits, the same in train and test
        same = (task.x_train.T[:, None] == full.x_train.T[None]).all(-1)
        same &= (task.x_test.T[:, None] == full.x_test.T[None]).all(-1)
        assert same.any(1).all()
        assert torch.equal(task.x_train.sort(-1).values, full.x_train.sort(-1).values)
        assert not torch.equal(task.x_train, full.x_train)
    assert not torch.equal(tasks[1].x_train, tasks[2].x_train)


# --- UCI --------------------------------------------------------------------------------------


@needs_boston
def test_load_uci_boston_split_zero_has_the_standard_shapes():
    split = load_uci(BOSTON, 0)
    assert split.x_train.shape == (455, 13) and split.y_train.shape == (455,)
    assert split.x_test.shape == (51, 13) and split.y_test.shape == (51,)
    assert split.x_train.dtype == torch.float32 and split.y_train.dtype == torch.float32
    # the first row of boston: CRIM 0.00632 ... MEDV 24.0; it is in one of the two parts
    all_y = torch.cat([split.y_train, split.y_test])
    assert 24.0 in all_y.tolist() and float(all_y.max()) == 50.0


@needs_boston
def test_load_uci_boston_train_and_test_rows_are_disjoint_and_cover_the_data():
    train = {int(v) for v in (BOSTON / "index_train_0.txt").read_text().split()}
    test = {int(v) for v in (BOSTON / "index_test_0.txt").read_text().split()}
    assert not train & test and len(train | test) == 506
    split = load_uci(BOSTON, 0)
    same_row = (split.x_train[:, None, :] == split.x_test[None, :, :]).all(-1)
    assert not same_row.any()


@needs_boston
def test_uci_num_splits_reads_n_splits_or_counts_train_index_files(tmp_path):
    assert uci_num_splits(BOSTON) == 20
    for name in ("index_train_0.txt", "index_train_1.txt", "index_test_0.txt"):
        shutil.copy(BOSTON / name, tmp_path / name)
    assert uci_num_splits(tmp_path) == 2


def _write_tiny_uci(folder: Path) -> None:
    (folder / "data.txt").write_text("1.0 2.0 10.0\n3.0\t4.0\t20.0\n5.0 6.0 30.0 \n")
    (folder / "index_features.txt").write_text("0\n1\n")
    (folder / "index_target.txt").write_text("2.0\n")
    (folder / "index_train_0.txt").write_text("2.0\n0.0\n")
    (folder / "index_test_0.txt").write_text("1\n")


def test_load_uci_reads_rows_and_columns_by_index_including_float_indices(tmp_path):
    _write_tiny_uci(tmp_path)
    split = load_uci(tmp_path, 0)
    torch.testing.assert_close(split.x_train, torch.tensor([[5.0, 6.0], [1.0, 2.0]]))
    torch.testing.assert_close(split.y_train, torch.tensor([30.0, 10.0]))
    torch.testing.assert_close(split.x_test, torch.tensor([[3.0, 4.0]]))
    torch.testing.assert_close(split.y_test, torch.tensor([20.0]))


def test_load_uci_names_the_missing_file_and_the_folder(tmp_path):
    _write_tiny_uci(tmp_path)
    (tmp_path / "index_target.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"index_target\.txt") as info:
        load_uci(tmp_path, 0)
    assert str(tmp_path) in str(info.value)


def test_load_uci_rejects_a_split_beyond_the_folder(tmp_path):
    _write_tiny_uci(tmp_path)
    with pytest.raises(ValueError, match=r"split must be an int in \[0, 1\).*got 3"):
        load_uci(tmp_path, 3)


def test_load_uci_rejects_row_indices_past_the_data(tmp_path):
    _write_tiny_uci(tmp_path)
    (tmp_path / "index_test_0.txt").write_text("3\n")
    with pytest.raises(ValueError, match=r"index_test_0\.txt.*must hold indices in \[0, 3\)"):
        load_uci(tmp_path, 0)


def test_uci_num_splits_names_a_missing_folder(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        uci_num_splits(missing)


# --- UCI folders: every split, standardized on its training rows ------------------------------


def _tiny_regression(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=generator) * torch.tensor([1.0, 10.0, 0.1]) + 5.0
    y = x @ torch.tensor([1.0, -0.2, 3.0]) + torch.randn(n, generator=generator)
    return x, y


def test_load_uci_folder_standardizes_each_split_with_its_training_rows_only(tmp_path):
    x, y = _tiny_regression()
    folder = write_uci_folder(tmp_path / "tiny", x, y, num_splits=3, test_fraction=0.25)
    data = load_uci_folder(folder)
    assert len(data) == 3 and data.name == "tiny" and data.num_features == 3
    for split in data:
        train, test = data.train_rows[split.index], data.test_rows[split.index]
        mean, std = x[train].mean(0), x[train].std(0, correction=0)
        # training part: exactly zero mean, unit population std
        torch.testing.assert_close(split.x_train.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
        torch.testing.assert_close(split.x_train.std(0, correction=0), torch.ones(3))
        # test part: shifted and scaled by the *training* statistics, not its own
        torch.testing.assert_close(split.x_test, (x[test] - mean) / std)
        torch.testing.assert_close(
            split.y_train, (y[train] - y[train].mean()) / y[train].std(0, correction=0)
        )
        torch.testing.assert_close(split.y_test, y[test])  # targets to score stay in original units
        torch.testing.assert_close(split.y_scaler.mean, y[train].mean())
        assert not torch.allclose(split.x_test.mean(0), torch.zeros(3), atol=1e-3)


def test_load_uci_folder_statistics_do_not_move_when_only_test_rows_change(tmp_path):
    x, y = _tiny_regression()
    folder = write_uci_folder(tmp_path / "a", x, y, num_splits=1, test_fraction=0.25)
    before = load_uci_folder(folder)[0]
    test = load_uci_folder(folder).test_rows[0]
    x_changed, y_changed = x.clone(), y.clone()
    x_changed[test] += 1000.0
    y_changed[test] -= 1000.0
    folder_changed = write_uci_folder(
        tmp_path / "b", x_changed, y_changed, num_splits=1, test_fraction=0.25
    )
    after = load_uci_folder(folder_changed)[0]
    torch.testing.assert_close(after.x_scaler.mean, before.x_scaler.mean)
    torch.testing.assert_close(after.y_scaler.std, before.y_scaler.std)
    torch.testing.assert_close(after.x_train, before.x_train)


def test_write_uci_folder_splits_are_disjoint_cover_every_row_and_differ(tmp_path):
    x, y = _tiny_regression(n=50)
    data = load_uci_folder(write_uci_folder(tmp_path, x, y, num_splits=4, test_fraction=0.1))
    tests = []
    for k in range(len(data)):
        train, test = set(data.train_rows[k].tolist()), set(data.test_rows[k].tolist())
        assert not train & test and train | test == set(range(50)) and len(test) == 5
        tests.append(frozenset(test))
    assert len(set(tests)) == 4
    assert (data.n_hidden, data.n_epochs) == (50, 40)


def test_load_uci_folder_refuses_a_split_whose_train_and_test_rows_overlap(tmp_path):
    _write_tiny_uci(tmp_path)
    (tmp_path / "index_test_0.txt").write_text("1\n0\n")  # row 0 is also a training row
    with pytest.raises(ValueError, match=r"split 0 .* 1 row\(s\) in both .*first: 0"):
        load_uci_folder(tmp_path)


def test_load_uci_folder_reads_the_first_num_splits_and_rejects_more(tmp_path):
    x, y = _tiny_regression()
    folder = write_uci_folder(tmp_path, x, y, num_splits=3)
    assert len(load_uci_folder(folder, num_splits=2)) == 2
    with pytest.raises(ValueError, match=r"num_splits must be in \[1, 3\].*got 4"):
        load_uci_folder(folder, num_splits=4)
    with pytest.raises(IndexError, match=r"split must be an int in \[0, 2\)"):
        load_uci_folder(folder, num_splits=2)[2]


def test_load_uci_folder_without_optional_files_has_no_n_hidden(tmp_path):
    _write_tiny_uci(tmp_path)
    data = load_uci_folder(tmp_path)
    assert data.n_hidden is None and data.n_epochs is None and len(data) == 1


def test_find_uci_folders_takes_a_data_set_or_a_folder_of_them(tmp_path):
    x, y = _tiny_regression()
    for name in ("b", "a"):
        write_uci_folder(tmp_path / name, x, y, num_splits=1)
    (tmp_path / "notes").mkdir()
    assert [p.name for p in find_uci_folders(tmp_path)] == ["a", "b"]
    assert find_uci_folders(tmp_path / "a") == [tmp_path / "a"]
    with pytest.raises(FileNotFoundError, match=r"holds no 'data\.txt'"):
        find_uci_folders(tmp_path / "notes")


@needs_boston
def test_load_uci_folder_boston_matches_load_uci_on_every_split():
    data = load_uci_folder(BOSTON)
    assert len(data) == 20 and data.n_hidden == 50
    for k in (0, 19):
        raw = load_uci(BOSTON, k)
        split = data[k]
        torch.testing.assert_close(
            split.x_scaler.inverse_transform(split.x_train), raw.x_train, atol=1e-4, rtol=1e-5
        )
        torch.testing.assert_close(split.y_test, raw.y_test)


# --- Standardizer -----------------------------------------------------------------------------


def test_standardizer_gives_zero_mean_unit_std_and_inverts_exactly():
    x = torch.tensor([[1.0, 10.0], [3.0, 30.0], [5.0, 20.0]])
    scaler = Standardizer().fit(x)
    z = scaler.transform(x)
    torch.testing.assert_close(z.mean(0), torch.zeros(2), atol=1e-6, rtol=0)
    torch.testing.assert_close(z.std(0, correction=0), torch.ones(2))
    torch.testing.assert_close(scaler.inverse_transform(z), x)


def test_standardizer_maps_a_constant_column_to_zero_instead_of_nan():
    x = torch.tensor([[2.0, 1.0], [2.0, 3.0]])
    z = Standardizer().fit(x).transform(x)
    assert torch.isfinite(z).all()
    torch.testing.assert_close(z[:, 0], torch.zeros(2))


def test_standardizer_inverse_scale_multiplies_by_the_target_std():
    y = torch.tensor([0.0, 2.0, 4.0, 6.0])  # population std sqrt(5)
    scaler = Standardizer().fit(y)
    torch.testing.assert_close(
        scaler.inverse_scale(torch.tensor([1.0, 0.5])), torch.tensor([1.0, 0.5]) * 5**0.5
    )


def test_standardizer_refuses_to_transform_before_fit():
    with pytest.raises(RuntimeError, match=r"not fitted"):
        Standardizer().transform(torch.zeros(3))
