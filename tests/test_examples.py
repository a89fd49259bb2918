"""The examples of Bayesian layers beyond Linear run, in a short form, and print what they show.

The examples train at ``fit``'s default length; here a small ``--max-steps`` (``fit``'s
budget, in whole epochs) keeps each to an epoch or two.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pyro_bbb.data import FASHION_MNIST

from .support import REPO


def run_example(name: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / name), *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_conv1d_example_makes_every_convolution_bayesian_with_flipout():
    out = run_example("conv1d_sequences.py", "--max-steps", "2", "--num", "100")
    assert "| 0.weight | Conv1d | Bayesian | 8×1×5 |" in out
    assert "| 2.bias | Conv1d | Bayesian | 8 | Gaussian(scale=1, loc=0) | flipout | 8 |" in out
    assert "fit: 2 epochs in" in out  # the budget reached fit: 2 steps of the 100 sequences
    assert "test accuracy" in out and "white noise" in out


def test_the_gru_example_says_which_layer_each_estimator_served():
    out = run_example("gru_regression.py", "--max-steps", "4", "--num", "60")
    assert "applies to the affine layers ['head']; the layers ['rnn']" in out
    assert "torch.func.vmap cannot batch layer 'rnn' (GRU)" in out
    assert "fit: 2 epochs in" in out  # 4 steps of 50 of the 60 windows
    assert "test RMSE" in out and "epistemic" in out


def test_the_last_layer_example_keeps_the_trained_body_frozen():
    out = run_example("last_layer_digits.py", "--epochs", "1", "--max-steps", "1")
    assert "| 6.weight | Linear | point estimate (frozen) | 64×256 |" in out
    assert "| 8.weight | Linear | Bayesian | 10×64 |" in out
    assert "last-layer BNN: 1 epochs" in out and "last-layer BNN   accuracy" in out


def test_the_conv_digits_example_reports_calibration_and_saves_a_reliability_diagram(tmp_path):
    figure = tmp_path / "reliability.png"
    out = run_example("conv_digits.py", "--max-steps", "1", "--figure", str(figure))
    assert "fit: reparam='flipout', 1 epochs" in out  # the budget: one epoch of 64-image steps
    assert "test (450 images): accuracy" in out and "ECE" in out
    assert "mutual information (epistemic): correct" in out and figure.exists()


def test_the_any_network_example_fits_a_resnet_and_an_lstm_written_for_batches():
    out = run_example("any_network.py", "--max-steps", "1", "--num", "64")
    assert "ResNet: 1 epochs" in out and "LSTM: 1 epochs" in out
    assert "ResNet: test accuracy" in out and "vectorised by torch.func.vmap" in out
    assert "vmap cannot batch layer 'rnn' (LSTM)" in out
    assert "LSTM: test RMSE" in out and "saved any_network.png" in out


def test_the_online_example_shows_the_belief_as_the_stream_arrives(tmp_path):
    out = run_example("online_regression.py", "--points", "200", "--out", str(tmp_path / "o.png"))
    lines = [line for line in out.splitlines() if line.startswith("after")]
    assert [line.split()[1] for line in lines] == ["20", "100", "200"]
    first, last = (float(line.split("test LL")[1].split()[0]) for line in (lines[0], lines[-1]))
    assert last > first  # the test log-likelihood rises as the stream arrives
    assert (tmp_path / "o.png").exists()


@pytest.mark.skipif(
    not FASHION_MNIST.is_dir(),
    reason=f"Fashion-MNIST not found at {FASHION_MNIST} (apt-get install dataset-fashion-mnist)",
)
def test_the_fashion_mnist_example_scores_the_bnn_beside_its_deterministic_twin():
    out = run_example(
        "fashion_mnist.py", "--num-train", "2000", "--num-test", "1000", "--max-steps", "32",
        "--twin-epochs", "1",
    )  # fmt: skip
    assert "Fashion-MNIST: 2000 training images, 1000 test images" in out
    bnn = next(line for line in out.splitlines() if line.startswith("BNN: test error"))
    assert "(2 epochs, 32 steps)" in bnn  # the budget: 2 epochs of 16 steps of 128 images
    assert "NLL" in bnn and "ECE" in bnn and "CPU s" in bnn
    error = float(bnn.split("test error ")[1].split("%")[0])
    assert error < 70  # two epochs learn something: chance is 90 %
    assert "deterministic: test error" in out and "(1 epochs at lr 1e-3)" in out


def test_the_fashion_mnist_example_names_the_debian_package_when_the_folder_is_absent(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    missing = tmp_path / "fashion-mnist"
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "fashion_mnist.py"), "--data", str(missing)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert str(missing) in done.stderr and "apt-get install dataset-fashion-mnist" in done.stderr
    assert "Traceback" not in done.stderr
