from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoDelta, init_to_value

import pyro_bbb as bbb
from pyro_bbb.bench import (
    METHODS,
    PUBLISHED,
    SplitResult,
    UCIConfig,
    UCIResults,
    fit_split,
    run_uci,
)
from pyro_bbb.cli import main
from pyro_bbb.data import load_uci_folder, write_uci_folder
from pyro_bbb.nn import initial_values

from ..support import UCI_ROOT

SMOKE_SETS = ("yacht", "boston")
HAVE_SHARED = all((UCI_ROOT / name / "data.txt").is_file() for name in SMOKE_SETS)

NOISE = 0.3  # noise std of the synthetic set


def _synthetic_folder(root: Path, name: str = "synthetic", n: int = 200, seed: int = 0) -> Path:
    """y = sin(2 x0) + x1^2 / 2 + N(0, 0.3^2), four features (two irrelevant), in split format."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 4, generator=generator) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.5 * x[:, 1] ** 2 + NOISE * torch.randn(n, generator=generator)
    return write_uci_folder(root / name, x, y, num_splits=2, test_fraction=0.2, n_hidden=20)


# --- one split, every method on one model ----------------------------------------------------


def test_fit_split_methods_beat_the_training_mean_and_the_bnn_nears_the_noise_floor(tmp_path):
    data = load_uci_folder(_synthetic_folder(tmp_path))
    split = data[0]
    config = UCIConfig(epochs=400, num_samples=30)
    results = {
        m: fit_split(m, split, dataset=data.name, n_hidden=20, config=config) for m in METHODS
    }
    baseline = float((split.y_test - split.y_scaler.mean).pow(2).mean().sqrt())
    for method, result in results.items():
        assert result.method == method and result.split == 0 and result.dataset == "synthetic"
        # the signal explains most of the variance: a fit must beat the training mean clearly
        assert result.rmse < 0.6 * baseline, method
        assert math.isfinite(result.log_likelihood) and result.noise_std > 0
    # the best possible per-point log-likelihood is that of the true noise, about -0.22
    best = -0.5 * math.log(2 * math.pi * NOISE**2) - 0.5
    for method in ("bnn", "bnn_ensemble"):
        assert results[method].log_likelihood < best + 0.3, method
        assert results[method].log_likelihood > best - 1.0, method


@pytest.mark.parametrize("reparam", ["local", "flipout"])
def test_fit_split_with_the_low_rank_guide_learns_the_signal(tmp_path, reparam):
    data = load_uci_folder(_synthetic_folder(tmp_path))
    split = data[1]
    config = UCIConfig(epochs=300, guide="lowrank", rank=2, reparam=reparam, num_samples=20)
    result = fit_split("bnn", split, dataset=data.name, n_hidden=20, config=config)
    baseline = float((split.y_test - split.y_scaler.mean).pow(2).mean().sqrt())
    assert result.split == 1 and result.rmse < 0.6 * baseline


def test_fit_split_leaves_the_callers_param_store_as_it_was(tmp_path):
    data = load_uci_folder(_synthetic_folder(tmp_path))
    pyro.param("mine", torch.tensor(3.0))
    fit_split("bnn", data[0], dataset="s", n_hidden=5, config=UCIConfig(epochs=2, num_samples=2))
    assert list(pyro.get_param_store().keys()) == ["mine"]
    assert pyro.param("mine").item() == 3.0


def test_fit_split_rejects_an_unknown_method(tmp_path):
    data = load_uci_folder(_synthetic_folder(tmp_path))
    with pytest.raises(ValueError, match=r"method must be one of .*got 'ensemble'"):
        fit_split("ensemble", data[0], dataset="s", n_hidden=5, config=UCIConfig())


def test_uci_config_names_the_bad_option():
    with pytest.raises(ValueError, match=r"guide must be 'meanfield' or 'lowrank', got 'full'"):
        UCIConfig(guide="full")
    with pytest.raises(ValueError, match=r"epochs must be a positive int, got 0"):
        UCIConfig(epochs=0)
    with pytest.raises(ValueError, match=r"dropout must be in \(0, 1\), got 1.0"):
        UCIConfig(dropout=1.0)


# --- summaries ---------------------------------------------------------------------------------


def _result(dataset: str, split: int, method: str, rmse: float, ll: float) -> SplitResult:
    return SplitResult(dataset, split, method, rmse, ll, noise_std=1.0, seconds=1.0)


def test_summary_is_the_mean_and_standard_error_over_splits():
    results = UCIResults(
        config=UCIConfig(),
        results=[
            _result("boston", 0, "bnn", 3.0, -2.5),
            _result("boston", 1, "bnn", 5.0, -2.7),
            _result("boston", 2, "bnn", 4.0, -2.3),
        ],
    )
    row = results.summary()["boston"]["bnn"]
    # sample std of (3, 5, 4) is 1, so the standard error is 1 / sqrt(3)
    assert row["rmse"] == pytest.approx((4.0, 1 / math.sqrt(3)))
    assert row["log_likelihood"] == pytest.approx((-2.5, 0.2 / math.sqrt(3)))
    assert row["splits"] == 3


def test_targets_compare_the_bnn_with_published_vi_and_pbp():
    results = UCIResults(
        config=UCIConfig(),
        results=[
            _result("boston", 0, "bnn", 4.0, -2.60),  # beats VI (4.32, -2.90), below PBP -2.57
            _result("yacht", 0, "bnn", 7.0, -1.50),  # worse RMSE than VI 6.89; LL above PBP
            _result("mine", 0, "bnn", 1.0, -1.0),  # nothing published
        ],
    )
    targets = results.targets()
    assert targets["boston"] == {
        "rmse_beats_vi": True,
        "ll_beats_vi": True,
        "ll_at_least_pbp": False,
    }
    assert targets["yacht"] == {
        "rmse_beats_vi": False,
        "ll_beats_vi": True,
        "ll_at_least_pbp": True,
    }
    assert set(targets["mine"].values()) == {None}


def test_markdown_puts_the_published_figures_beside_ours():
    results = UCIResults(
        config=UCIConfig(),
        results=[_result("energy", 0, "bnn", 0.5, -1.0), _result("energy", 0, "mc_dropout", 1, -2)],
    )
    markdown = results.to_markdown()
    (rmse_row,) = [line for line in markdown.splitlines() if line.startswith("| energy |")][:1]
    vi, pbp = PUBLISHED["rmse"]["energy"]["VI"], PUBLISHED["rmse"]["energy"]["PBP"]
    assert rmse_row.startswith("| energy | 1 | 0.50 ± 0.00 | 1.00 ± 0.00 |")
    assert f"{vi[0]:.2f} ± {vi[1]:.2f}" in rmse_row and f"{pbp[0]:.2f} ± {pbp[1]:.2f}" in rmse_row
    assert "deterministic" not in markdown  # only the methods that ran get a column


# --- the command, end to end --------------------------------------------------------------------


def _smoke_root(tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    """The shared UCI folder if present, else two generated sets in the same format."""
    if HAVE_SHARED:
        return UCI_ROOT, SMOKE_SETS
    root = tmp_path / "uci"
    _synthetic_folder(root, "first", seed=1)
    _synthetic_folder(root, "second", seed=2)
    return root, ("first", "second")


def test_bench_uci_command_smoke_run_on_two_splits_of_two_sets(tmp_path, capsys):
    root, names = _smoke_root(tmp_path)
    out = tmp_path / "out"
    argv = ["bench", "uci", str(root), "--splits", "2", "--epochs", "300", "--out", str(out)]
    assert main([*argv, "--datasets", *names]) == 0
    printed = capsys.readouterr().out
    assert "Test RMSE" in printed and "Test log-likelihood" in printed
    report = json.loads((out / "uci.json").read_text())
    assert (out / "uci.md").read_text().startswith("Test RMSE")
    assert (out / "uci.png").read_bytes().startswith(b"\x89PNG")  # the figure of the LLs
    assert f"and {out / 'uci.png'}" in printed
    assert report["config"]["num_particles"] == 1  # the BNN's samples a step, as published
    splits = report["splits"]
    assert len(splits) == 2 * 2 * len(METHODS)
    assert {(r["dataset"], r["split"], r["method"]) for r in splits} == {
        (d, k, m) for d in names for k in (0, 1) for m in METHODS
    }
    summary = report["summary"]
    for name in names:
        y = load_uci_folder(root / name).y
        scale = float(y.std())
        for method in METHODS:
            rmse, _ = summary[name][method]["rmse"]
            ll, _ = summary[name][method]["log_likelihood"]
            # loose but real: far better than predicting the mean (rmse = std of y), and a
            # log-likelihood above that of N(mean, std^2), -log(std) - 1.42 (a point estimate
            # overfits its noise scale, so only the BNN must clear it by a margin)
            assert rmse < 0.6 * scale, (name, method, rmse, scale)
            margin = 0.4 if method == "bnn" else 0.0
            assert ll > -math.log(scale) - 1.42 + margin, (name, method, ll)
        if HAVE_SHARED:  # after 300 full-batch epochs the BNN already beats published VI
            vi_rmse = PUBLISHED["rmse"][name]["VI"][0]
            vi_ll = PUBLISHED["log_likelihood"][name]["VI"][0]
            assert summary[name]["bnn"]["rmse"][0] < vi_rmse
            assert summary[name]["bnn"]["log_likelihood"][0] > vi_ll


def test_run_uci_names_a_data_set_it_cannot_find(tmp_path):
    root = tmp_path / "uci"
    _synthetic_folder(root, "first")
    with pytest.raises(
        ValueError, match=r"datasets must name folders found .*\['first'\].*'boston'"
    ):
        run_uci(root, datasets=["boston"])


def test_mlp_dropout_gives_mc_dropout_samples_in_train_mode_and_none_in_eval_mode():
    net = bbb.mlp([3, 20, 1], dropout=0.5)
    assert sorted(initial_values(net)) == ["0.bias", "0.weight", "3.bias", "3.weight"]
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=8)
    guide = AutoDelta(model, init_loc_fn=init_to_value(values=initial_values(model)))
    x = torch.randn(8, 3)
    guide(x)
    masks = bbb.predict(model, guide, x, num_samples=50, seed=0).loc_samples  # (50, 8)
    assert (masks.std(0) > 1e-3).all()  # fixed weights, yet every point varies by its masks
    net.eval()
    fixed = bbb.predict(model, guide, x, num_samples=50, seed=0).loc_samples
    assert torch.equal(fixed, fixed[:1].expand_as(fixed))
    torch.testing.assert_close(fixed[0], masks.mean(0), atol=0.5, rtol=0)  # E[mask] = 1
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\), got 1"):
        bbb.mlp([3, 20, 1], dropout=1)


def test_run_uci_in_worker_processes_gives_the_serial_numbers(tmp_path):
    root = tmp_path / "uci"
    _synthetic_folder(root, "first")
    config = UCIConfig(epochs=20, num_samples=5)
    kwargs = {"num_splits": 2, "methods": ["bnn", "deterministic"], "config": config}
    serial = run_uci(root, jobs=1, progress=False, **kwargs)
    parallel = run_uci(root, jobs=2, progress=False, **kwargs)
    assert parallel.jobs == 2 and len(parallel.results) == 4
    for a, b in zip(serial.results, parallel.results, strict=True):
        assert (a.dataset, a.split, a.method) == (b.dataset, b.split, b.method)
        assert a.rmse == pytest.approx(b.rmse, rel=1e-6)
        assert a.log_likelihood == pytest.approx(b.log_likelihood, rel=1e-6)


def test_parallel_splits_run_from_a_script_without_a_main_guard(tmp_path):
    # spawned workers import the parent's __main__: an unguarded script would run again in
    # each and fail to start workers of its own. run_uci starts them without the script.
    folder = _synthetic_folder(tmp_path, n=60)
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from pyro_bbb.bench import UCIConfig, run_uci\n"
        "print('script ran', flush=True)\n"
        f"results = run_uci({str(folder)!r}, methods=['deterministic'], "
        "config=UCIConfig(epochs=20, num_samples=2), jobs=2)\n"
        "print('splits', len(results.results))\n"
    )
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("script ran") == 1  # not again in a worker
    assert "splits 2" in run.stdout


def test_bench_uci_help_says_auto_is_fit_s_default_length_not_convergence(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "uci", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "auto: fit's default length, until more training stops improving the predictive" in text
    assert "convergence check passes" not in text
