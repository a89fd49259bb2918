"""End to end: the demo's gap uncertainty, digits classification, the command line."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pyro
import pytest
import torch
from torch import nn

import pyro_bbb as bbb
from pyro_bbb import metrics
from pyro_bbb.demo import fit_gap_demo, uncertainty_by_region
from pyro_bbb.infer import LinearWarmup

from .support import requires_numpyro, scaled


@pytest.mark.slow
def test_demo_gap_uncertainty_is_at_least_twice_that_near_the_data():
    with warnings.catch_warnings():
        warnings.simplefilter("error", bbb.PosteriorCollapseWarning)  # the demo fits
        fitted = fit_gap_demo(seed=0, progress=False)
    x = torch.linspace(-7, 7, 561).unsqueeze(-1)
    pred = bbb.predict(fitted.model, fitted.guide, x, num_samples=300, seed=0)
    summary = uncertainty_by_region(pred, x)
    gap, data = summary["gap"]["epistemic"], summary["data"]["epistemic"]
    assert gap >= 2 * data, summary
    assert summary["extrapolation"]["epistemic"] > gap
    # and the learned noise is near the truth (0.1): the fit is not bought by underfitting
    assert 0.08 < pred.aleatoric_std.mean().item() < 0.13


def digits_split():
    pytest.importorskip("sklearn")
    from pyro_bbb.data import digits

    return digits(seed=0)


def deterministic_mlp(split, epochs, seed):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 10))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    n = len(split.x_train)
    for _ in range(epochs):
        order = torch.randperm(n)
        for i in range(0, n, 128):
            idx = order[i : i + 128]
            loss = nn.functional.cross_entropy(net(split.x_train[idx]), split.y_train[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        return net(split.x_test).softmax(-1)


def tempered_bnn(split, epochs, seed):
    pyro.clear_param_store()
    torch.manual_seed(seed)
    model = bbb.BNN(bbb.mlp([64, 100, 10]), bbb.likelihoods.Categorical(), len(split.x_train))
    guide = bbb.MeanFieldGuide(model, init_scale=0.01)
    bbb.fit(
        model,
        guide,
        split.x_train,
        split.y_train,
        epochs=epochs,
        batch_size=128,
        beta=LinearWarmup(epochs / 5, end=0.1),
        lr=0.01,  # as benchmarks/digits.py: the constant rate docs/benchmarks.md used
        lr_schedule=1.0,
        reparam="local",
        seed=seed,
        progress=False,
    )
    return bbb.predict(model, guide, split.x_test, num_samples=100, seed=seed)


@pytest.mark.slow
def test_tempered_bayesian_mlp_on_digits_is_as_accurate_and_better_calibrated_than_an_mlp():
    """The same 64-100-10 net and budget (200 epochs of batch 128), means over three seeds.

    The short form runs the first seed only; ``PYRO_BBB_FULL=1`` runs all three.

    The KL weight ends at β = 0.1 (a tempered, "cold" posterior, Wenzel et al. 2020): at
    β = 1 the mean-field BNN is underconfident on these 1,347 points (measured: ECE
    0.045-0.051, mean confidence 0.93, against the MLP's 0.021-0.025).
    """
    split = digits_split()
    epochs, seeds = 200, (0, 1, 2)[: scaled(1, 3)]
    acc_bnn, acc_det, ece_bnn, ece_det = [], [], [], []
    for seed in seeds:
        probs_det = deterministic_mlp(split, epochs, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("error", bbb.PosteriorCollapseWarning)  # digits fit
            pred = tempered_bnn(split, epochs, seed)
        acc_det.append(metrics.accuracy(probs_det, split.y_test))
        ece_det.append(metrics.ece(probs_det, split.y_test))
        acc_bnn.append(metrics.accuracy(pred.probs, split.y_test))
        ece_bnn.append(metrics.ece(pred.probs, split.y_test))
        # epistemic uncertainty is higher on the points it gets wrong
        wrong = pred.predicted != split.y_test
        assert pred.mutual_information[wrong].mean() > pred.mutual_information[~wrong].mean()
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    assert mean(acc_bnn) >= mean(acc_det) - 0.01, (acc_bnn, acc_det)
    assert mean(ece_bnn) < mean(ece_det), (ece_bnn, ece_det)


@pytest.mark.slow
def test_tempered_bayesian_mlp_on_digits_at_fits_own_length_and_rates_is_as_accurate():
    """The same tempered BNN with fit's own length and rates (no lr, no epochs).

    Measured, seeds 0-2: 89-92 epochs, accuracy 0.980-0.982 against the MLP's 0.964-0.978,
    but ECE 0.038-0.041 against its 0.021-0.025: a run that ends where its fit stops paying
    is as accurate, not better calibrated, which is why the test above keeps the published
    budget. The short form runs seed 0.
    """
    split = digits_split()
    for seed in (0, 1, 2)[: scaled(1, 3)]:
        probs_det = deterministic_mlp(split, 200, seed)
        pyro.clear_param_store()
        torch.manual_seed(seed)
        model = bbb.BNN(bbb.mlp([64, 100, 10]), bbb.likelihoods.Categorical(), len(split.x_train))
        guide = bbb.MeanFieldGuide(model, init_scale=0.01)
        with warnings.catch_warnings():
            warnings.simplefilter("error", bbb.PosteriorCollapseWarning)
            bbb.fit(model, guide, split.x_train, split.y_train, batch_size=128,
                    beta=LinearWarmup(40, end=0.1), reparam="local", seed=seed,
                    progress=False)  # fmt: skip
        pred = bbb.predict(model, guide, split.x_test, num_samples=100, seed=seed)
        accuracy = metrics.accuracy(pred.probs, split.y_test)
        assert accuracy >= metrics.accuracy(probs_det, split.y_test) - 0.01


def test_command_line_demo_runs_and_saves_its_figure(tmp_path):
    out = tmp_path / "demo.png"
    result = subprocess.run(
        [sys.executable, "-m", "pyro_bbb", "demo", "--max-steps", "60", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 10_000
    for word in ("gap", "data", "extrapolation", str(out)):
        assert word in result.stdout
    assert "Stopped: the budget of 60 epochs" in result.stdout  # fit's default length, capped


@requires_numpyro
def test_command_line_demo_with_nuts_draws_its_band_and_reports_convergence(tmp_path):
    out = tmp_path / "demo.png"
    command = ["demo", "--epochs", "30", "--nuts", "--nuts-draws", "3", "--out", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "pyro_bbb", *command], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert out.stat().st_size > 10_000
    for words in ("NUTS (NumPyro, noise held at VI's", "function-space bulk ESS", "NUTS epistemic"):
        assert words in result.stdout


def test_command_line_rejects_an_unknown_command():
    result = subprocess.run(
        [sys.executable, "-m", "pyro_bbb", "train"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_command_line_help_reads_as_plain_text():
    result = subprocess.run(
        [sys.executable, "-m", "pyro_bbb", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0
    assert "The pyro-bbb command (also python -m pyro_bbb)." in result.stdout
    assert "``" not in result.stdout  # the docstring's reStructuredText marks stay in the docs


def test_importing_the_package_does_not_import_matplotlib():
    code = "import sys, pyro_bbb; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_model_and_guide_pickle_for_checkpoints_and_spawned_workers(tmp_path):
    import pickle

    x, y = torch.randn(20, 2), torch.randn(20)
    model = bbb.BNN(
        bbb.mlp([2, 4, 1], prior=bbb.priors.ScaleMixture()), bbb.likelihoods.Gaussian(), 20
    )
    guide = bbb.MeanFieldGuide(model)
    bbb.fit(model, guide, x, y, epochs=3, progress=False)
    restored_model, restored_guide = pickle.loads(pickle.dumps((model, guide)))
    pyro.clear_param_store()
    a = bbb.predict(model, guide, x, num_samples=5, seed=1).mean
    pyro.clear_param_store()
    b = bbb.predict(restored_model, restored_guide, x, num_samples=5, seed=1).mean
    assert torch.allclose(a, b)
