"""Online learning: R-VGA and LoFi against batch fit, streaming VCL and one-pass Adam.

Parts (``--parts``, all by default), each writing ``<part>.json`` and a section of
``online.md`` into ``--out``, and figures beside them:

* ``exact``: conjugate Bayesian linear regression (known noise, Gaussian prior) streamed one
  point at a time, float64: the largest relative error of the mean and covariance against the
  closed-form posterior, for R-VGA (linearised, Monte Carlo, implicit) and LoFi at full rank;
  and LoFi's distance to the posterior as its rank grows (KL, mean and covariance errors);
* ``jacobian``: how to take the network's Jacobian (per-row reverse mode, whole-batch reverse
  mode, forward mode) on three networks, against one forward and backward pass;
* ``regression``: two 1-D data sets of 1,000 points, streamed once in minibatches of 10:
  test log-likelihood, RMSE, epistemic band and CPU time of every method, over seeds;
* ``digits``: scikit-learn's digits streamed once in minibatches of 10: accuracy, NLL, ECE;
* ``drift``: the digits rotated by an angle growing along the stream (0 to 180 degrees):
  accuracy on test images at the current angle as the stream goes, with and without
  dynamics noise;
* ``large``: one LoFi update of a 784-400-400-10 network (rank 10, minibatch 10): time and
  peak memory against one ``fit`` step, each in a fresh process;
* ``deep``: 600 points of the gap data streamed once into a 1-50-50-1 network in minibatches
  of 10, against batch fits of 2,000 to 20,000 epochs (the test log-likelihood settles).

Every method learns the same model from the same stream; times are CPU seconds of learning
(one thread), ratios within one run. ``pyro_bbb.bench.online`` holds the protocol.

    python benchmarks/online.py [--parts exact regression ...] [--seeds 5] [--out online_results]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pyro
import torch
import torch.nn.functional as F
from _common import machine
from torch.distributions import MultivariateNormal, kl_divergence
from torch.func import jacfwd, jacrev

import pyro_bbb as bbb
from pyro_bbb.bench.online import (
    batch_fit,
    classification_scores,
    one_pass_adam,
    regression_scores,
    run_updater,
    streaming_vcl,
)
from pyro_bbb.data import digits, gap_regression
from pyro_bbb.online import RVGA, LoFi
from pyro_bbb.online.network import (
    network_function,
    outputs_and_jacobian,
    weight_layout,
)
from pyro_bbb.priors import FanInGaussian, Gaussian
from pyro_bbb.training import Callback

BATCH = 10


def mean_sd(values):
    values = [float(v) for v in values]
    if len(values) < 2:
        return values[0], 0.0
    return statistics.fmean(values), statistics.stdev(values)


def fmt(values, digits=3):
    mean, sd = mean_sd(values)
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


# ----------------------------------------------------------------------------- exact
NOISE, PRIOR_SCALE = 0.5, 1.0


def conjugate(num_data, dim, seed):
    """Correlated features, y = Xw + 0.3 + N(0, 0.5²), prior N(0, I): the exact posterior."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_data, dim, generator=g, dtype=torch.float64)
    x[:, 1:] += 0.7 * x[:, :-1]
    w = torch.randn(dim, generator=g, dtype=torch.float64)
    y = x @ w + 0.3 + NOISE * torch.randn(num_data, generator=g, dtype=torch.float64)
    features = torch.cat([x, torch.ones(num_data, 1, dtype=torch.float64)], 1)
    precision = features.T @ features / NOISE**2 + torch.eye(dim + 1).double() / PRIOR_SCALE**2
    covariance = torch.linalg.inv(precision)
    return x, y, covariance @ features.T @ y / NOISE**2, covariance


def linear_model(x):
    net = bbb.mlp([x.shape[1], 1], prior=Gaussian(PRIOR_SCALE)).double()
    return bbb.BNN(net, bbb.likelihoods.Gaussian(scale=NOISE).double(), num_data=len(x))


def stream_linear(make, x, y):
    pyro.clear_param_store()
    model = linear_model(x)
    zeros = {"0.weight": torch.zeros(1, x.shape[1]).double(), "0.bias": torch.zeros(1).double()}
    updater = make(model, zeros)
    run_updater(updater, x, y, batch_size=1)
    return updater.guide.distribution()


def relative(a, b):
    return float((a - b).abs().max() / b.abs().max())


def part_exact(seeds, _out):
    methods = {
        "R-VGA, linearised": lambda m, z: RVGA(m, linearised=True, init_loc=z),
        "R-VGA, Monte Carlo (10 mirrored)": lambda m, z: RVGA(m, init_loc=z),
        "R-VGA, implicit (3 Gauss-Newton steps)": lambda m, z: RVGA(
            m, num_iterations=3, init_loc=z
        ),
    }
    exact_rows, rank_rows = [], []
    for num_data, dim in ((30, 3), (60, 11), (100, 20)):
        d = dim + 1
        rows = dict(methods)
        rows[f"LoFi, rank d = {d}"] = lambda m, z, d=d: LoFi(m, rank=d, init_loc=z)
        rows[f"LoFi, rank d + 5 = {d + 5}"] = lambda m, z, d=d: LoFi(m, rank=d + 5, init_loc=z)
        for name, make in rows.items():
            errors = []
            for seed in range(seeds):
                pyro.set_rng_seed(seed)
                x, y, mean, covariance = conjugate(num_data, dim, seed)
                fn = stream_linear(make, x, y)
                errors.append((relative(fn.loc, mean), relative(fn.covariance_matrix, covariance)))
            exact_rows.append(
                {
                    "method": name,
                    "d": d,
                    "points": num_data,
                    "mean_error": max(e[0] for e in errors),
                    "covariance_error": max(e[1] for e in errors),
                }
            )
        if d == 4:
            continue
        ranks = sorted({0, 1, 2, 4, 8, d // 2, d - 2, d})
        for rank in ranks:
            kls, means, covs, low, high = [], [], [], [], []
            for seed in range(seeds):
                x, y, mean, covariance = conjugate(num_data, dim, seed)
                fn = stream_linear(lambda m, z, r=rank: LoFi(m, rank=r, init_loc=z), x, y)
                q = MultivariateNormal(fn.loc, fn.covariance_matrix)
                kls.append(float(kl_divergence(q, MultivariateNormal(mean, covariance))))
                means.append(relative(fn.loc, mean))
                covs.append(
                    float(
                        torch.linalg.norm(fn.covariance_matrix - covariance)
                        / torch.linalg.norm(covariance)
                    )
                )
                ratio = fn.variance / covariance.diagonal()
                low.append(float(ratio.min()))
                high.append(float(ratio.max()))
            rank_rows.append(
                {
                    "d": d,
                    "rank": rank,
                    "kl": kls,
                    "mean_error": means,
                    "covariance_error": covs,
                    "variance_ratio": [min(low), max(high)],
                }
            )
    lines = [
        "### Exactness: conjugate linear regression streamed one point at a time (float64)",
        "",
        f"Largest relative error over {seeds} seeds (max |error| / max |exact|), against the "
        "closed-form posterior; prior N(0, I), known noise σ = 0.5, correlated features.",
        "",
        "| method | weights d | points | mean | covariance |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in exact_rows:
        lines.append(
            f"| {row['method']} | {row['d']} | {row['points']} | {row['mean_error']:.1e} | "
            f"{row['covariance_error']:.1e} |"
        )
    lines += [
        "",
        "### LoFi below full rank: distance to the exact posterior",
        "",
        f"Mean ± sd over {seeds} seeds. KL(q ‖ exact) in nats; mean error as above; covariance "
        "error in Frobenius norm, relative; the range of q's marginal variances over the "
        "exact ones.",
        "",
        "| d | rank | KL | mean error | covariance error | variance ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rank_rows:
        lines.append(
            f"| {row['d']} | {row['rank']} | {fmt(row['kl'], 3)} | {fmt(row['mean_error'], 3)} "
            f"| {fmt(row['covariance_error'], 3)} | {row['variance_ratio'][0]:.2f} to "
            f"{row['variance_ratio'][1]:.2f} |"
        )
    return {"exact": exact_rows, "rank": rank_rows}, "\n".join(lines)


# -------------------------------------------------------------------------- jacobian
def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def jacobian_row(sizes, likelihood):
    """Times of each way to the Jacobian of one network on a minibatch."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = bbb.BNN(bbb.mlp(sizes), likelihood, num_data=1000)
    x = torch.rand(BATCH, sizes[0])
    layout = weight_layout(model, x)
    f = network_function(model, layout, x)
    theta = layout.prior_loc + 0.05 * torch.randn(layout.size)
    repeats = 3 if layout.size > 100_000 else 20

    def forward_backward():
        weights = theta.clone().requires_grad_()
        f(layout.unflatten(weights), x).sum().backward()

    def whole(transform):
        return lambda: transform(lambda t: f(layout.unflatten(t), x))(theta)

    row = {
        "network": "-".join(map(str, sizes)),
        "d": layout.size,
        "outputs": BATCH * sizes[-1],
        "forward_backward_ms": timed(forward_backward, repeats),
        "per_row_reverse_ms": timed(lambda: outputs_and_jacobian(f, layout, theta, x), repeats),
        "batch_reverse_ms": timed(whole(jacrev), repeats),
    }
    if layout.size < 20_000:
        row["forward_mode_ms"] = timed(whole(jacfwd), 3)
    return row


def part_jacobian(_seeds, _out):
    rows = [
        jacobian_row(sizes, likelihood)
        for sizes, likelihood in (
            ([1, 50, 50, 1], bbb.likelihoods.Gaussian(0.1)),
            ([64, 100, 10], bbb.likelihoods.Categorical()),
            ([784, 400, 400, 10], bbb.likelihoods.Categorical()),
        )
    ]
    lines = [
        "### The network's Jacobian, minibatch of 10 (median ms, one thread)",
        "",
        "| network | weights | outputs | forward + backward | per-row reverse (used) | "
        "whole-batch reverse | forward mode |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        forward = f"{r['forward_mode_ms']:.1f}" if "forward_mode_ms" in r else "—"
        lines.append(
            f"| {r['network']} | {r['d']:,} | {r['outputs']} | {r['forward_backward_ms']:.1f} | "
            f"{r['per_row_reverse_ms']:.1f} | {r['batch_reverse_ms']:.1f} | {forward} |"
        )
    return rows, "\n".join(lines)


# ------------------------------------------------------------------------ regression
DATASETS = {
    "wave": (lambda x: torch.sin(2 * x) + 0.3 * x, 0.2),
    "growing": (lambda x: 0.5 * x * torch.sin(1.5 * x) + 0.25 * x, 0.3),
}


def regression_data(name, seed, num_train=1000, num_test=500):
    fn, noise = DATASETS[name]
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.rand(num_train, 1, generator=g) * 8 - 4
    y = (fn(x) + noise * torch.randn(num_train, 1, generator=g)).squeeze(-1)
    x_test = torch.rand(num_test, 1, generator=g) * 8 - 4
    y_test = (fn(x_test) + noise * torch.randn(num_test, 1, generator=g)).squeeze(-1)
    return x, y, x_test, y_test


def regression_model(num_data, seed):
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = bbb.mlp([1, 50, 1], activation="tanh", prior=FanInGaussian(2.0))
    return bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=num_data)


REGRESSION_METHODS = (
    "batch fit, 100 epochs (the former default)",
    "batch fit, 1,000 epochs",
    "streaming VCL (fit per minibatch)",
    "one-pass Adam",
    "LoFi, rank 10",
    "R-VGA, Monte Carlo",
    "R-VGA, linearised",
)
GRID = torch.linspace(-6, 6, 241).unsqueeze(-1)


def learn_regression(method, x, y, seed):
    """Fit one method on the stream; returns a function predicting at inputs, and CPU s."""
    model = regression_model(len(x), seed)
    if method.startswith("batch fit"):
        epochs = 1000 if "1,000" in method else 100
        guide, seconds = batch_fit(model, x, y, epochs=epochs, seed=seed)
        return (lambda xs: bbb.predict(model, guide, xs, num_samples=200, seed=0)), seconds
    if method.startswith("streaming VCL"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            vcl, seconds = streaming_vcl(model, x, y, batch_size=BATCH, seed=seed)
        return (lambda xs: vcl.predict(xs, num_samples=200, seed=0)), seconds
    if method == "one-pass Adam":
        guide, seconds = one_pass_adam(model, x, y, batch_size=BATCH, seed=seed)
        return (lambda xs: bbb.predict(model, guide, xs, num_samples=1, seed=0)), seconds
    if method.startswith("LoFi"):
        updater = LoFi(model, rank=10)
    elif method == "R-VGA, Monte Carlo":
        updater = RVGA(model)
    else:
        updater = RVGA(model, linearised=True)
    seconds = run_updater(updater, x, y, batch_size=BATCH)
    return (lambda xs: bbb.predict(model, updater.guide, xs, num_samples=200, seed=0)), seconds


def part_regression(seeds, out):
    x, y, *_ = regression_data("wave", 99, num_train=40)
    for method in REGRESSION_METHODS:  # one-time costs (first calls, imports) out of the timings
        learn_regression(method, x, y, 99)
    results = []
    for dataset in DATASETS:
        for seed in range(seeds):
            x, y, x_test, y_test = regression_data(dataset, seed)
            for method in REGRESSION_METHODS:
                predict_at, seconds = learn_regression(method, x, y, seed)
                scores = regression_scores(predict_at(x_test), y_test)
                band = predict_at(GRID)
                outside = GRID.squeeze(-1).abs() > 4.5
                scores.update(
                    dataset=dataset,
                    seed=seed,
                    method=method,
                    seconds=seconds,
                    epistemic_inside=float(band.epistemic_std[~outside].mean()),
                    epistemic_outside=float(band.epistemic_std[outside].mean()),
                    noise=float(band.aleatoric_std.mean()),
                )
                results.append(scores)
                if seed == 0:
                    scores["band"] = {
                        "mean": band.mean.tolist(),
                        "epistemic": band.epistemic_std.tolist(),
                        "total": band.std.tolist(),
                    }
                print(
                    f"  regression {dataset} seed {seed} {method}: LL "
                    f"{scores['log_likelihood']:.3f}, {seconds:.2f} s",
                    flush=True,
                )
    figure_bands(results, out)
    lines = [
        "### Non-linear regression streams: 1,000 points in minibatches of 10, one pass",
        "",
        "Model: 1-50-1 tanh, FanInGaussian(2) prior, Gaussian likelihood with a learned "
        f"noise scale. Mean ± sd over {seeds} seeds (data and initialisation). Test "
        "log-likelihood in nats per point (500 test points from the training distribution); "
        "epistemic std averaged inside the data's range [-4, 4] and outside it (|x| > 4.5); "
        "CPU seconds of learning, one thread. Best possible test LL (the true function and "
        "noise): wave 0.19, growing -0.22.",
        "",
    ]
    for dataset in DATASETS:
        lines += [
            f"**{dataset}**",
            "",
            "| method | test LL | RMSE | noise σ | epistemic std inside | outside | CPU s |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for method in REGRESSION_METHODS:
            rows = [r for r in results if r["dataset"] == dataset and r["method"] == method]
            lines.append(
                f"| {method} | {fmt([r['log_likelihood'] for r in rows])} | "
                f"{fmt([r['rmse'] for r in rows])} | {fmt([r['noise'] for r in rows])} | "
                f"{fmt([r['epistemic_inside'] for r in rows])} | "
                f"{fmt([r['epistemic_outside'] for r in rows])} | "
                f"{fmt([r['seconds'] for r in rows], 2)} |"
            )
        lines.append("")
    return results, "\n".join(lines)


def figure_bands(results, out):
    rows = [r for r in results if r["dataset"] == "wave" and r["seed"] == 0]
    x, y, *_ = regression_data("wave", 0)
    grid = GRID.squeeze(-1).numpy()
    fig, axes = plt.subplots(2, 4, figsize=(16, 7), sharex=True, sharey=True)
    for ax, row in zip(axes.flat, rows, strict=False):
        band = row["band"]
        mean = torch.tensor(band["mean"])
        epistemic, total = torch.tensor(band["epistemic"]), torch.tensor(band["total"])
        ax.scatter(x.squeeze(-1), y, s=2, color="0.6")
        ax.fill_between(grid, mean - 2 * total, mean + 2 * total, alpha=0.2, color="C0")
        ax.fill_between(grid, mean - 2 * epistemic, mean + 2 * epistemic, alpha=0.5, color="C0")
        ax.plot(grid, mean, color="C0")
        ax.plot(grid, DATASETS["wave"][0](GRID).squeeze(-1), "k--", lw=1)
        ax.set_title(f"{row['method']}\nLL {row['log_likelihood']:.2f}, {row['seconds']:.1f} s")
        ax.set_ylim(-4, 4)
    axes.flat[-1].axis("off")
    fig.suptitle("1,000 points in minibatches of 10: mean, ±2σ epistemic (dark) and total")
    fig.tight_layout()
    fig.savefig(out / "online_regression_methods.png", dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- digits
def digits_model(num_data, seed):
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = bbb.mlp([64, 100, 10], prior=FanInGaussian(math.sqrt(2)))
    return bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=num_data)


DIGITS_METHODS = (
    "batch fit, 100 epochs (the former default)",
    "streaming VCL (fit per minibatch)",
    "one-pass Adam",
    "LoFi, rank 10",
    "LoFi, rank 30",
)


def learn_digits(method, x, y, split, seed):
    """Fit one method on the stream; returns its test prediction and CPU seconds."""
    model = digits_model(len(x), seed)
    if method.startswith("batch fit"):
        guide, seconds = batch_fit(model, x, y, epochs=100, seed=seed)
        return bbb.predict(model, guide, split.x_test, num_samples=100, seed=0), seconds
    if method.startswith("streaming VCL"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            vcl, seconds = streaming_vcl(model, x, y, batch_size=BATCH, seed=seed)
        return vcl.predict(split.x_test, num_samples=100, seed=0), seconds
    if method == "one-pass Adam":
        guide, seconds = one_pass_adam(model, x, y, batch_size=BATCH, seed=seed)
        return bbb.predict(model, guide, split.x_test, num_samples=1, seed=0), seconds
    updater = LoFi(model, rank=int(method.rsplit(" ", 1)[1]))
    seconds = run_updater(updater, x, y, batch_size=BATCH)
    return bbb.predict(model, updater.guide, split.x_test, num_samples=100, seed=0), seconds


def part_digits(seeds, _out):
    split = digits(seed=0)
    for method in DIGITS_METHODS:  # one-time costs out of the timings
        learn_digits(method, split.x_train[:40], split.y_train[:40], split, 99)
    results = []
    for seed in range(seeds):
        order = torch.randperm(len(split.x_train), generator=torch.Generator().manual_seed(seed))
        x, y = split.x_train[order], split.y_train[order]
        for method in DIGITS_METHODS:
            prediction, seconds = learn_digits(method, x, y, split, seed)
            scores = classification_scores(prediction, split.y_test)
            scores.update(seed=seed, method=method, seconds=seconds)
            results.append(scores)
            print(f"  digits seed {seed} {method}: {scores}", flush=True)
    lines = [
        "### Digits streamed once in minibatches of 10",
        "",
        "1,347 training images (64-100-10 ReLU, FanInGaussian(√2) prior), 450 test images. "
        f"Mean ± sd over {seeds} seeds (stream order and initialisation); 100 predictive "
        "samples (1 for Adam's point estimate); ECE with 15 bins; CPU seconds of learning.",
        "",
        "| method | accuracy | NLL | ECE | CPU s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for method in DIGITS_METHODS:
        rows = [r for r in results if r["method"] == method]
        lines.append(
            f"| {method} | {fmt([r['accuracy'] for r in rows])} | {fmt([r['nll'] for r in rows])}"
            f" | {fmt([r['ece'] for r in rows])} | {fmt([r['seconds'] for r in rows], 1)} |"
        )
    return results, "\n".join(lines)


# ----------------------------------------------------------------------------- drift
MAX_ANGLE = 180.0


def rotate(images, degrees):
    """Rotate (N, 64) 8x8 images by ``degrees`` (bilinear, zero outside)."""
    angle = torch.as_tensor(degrees, dtype=torch.float32).reshape(-1)
    angle = torch.deg2rad(angle).expand(len(images))
    cos, sin = angle.cos(), angle.sin()
    zeros = torch.zeros_like(cos)
    theta = torch.stack(
        [torch.stack([cos, -sin, zeros], -1), torch.stack([sin, cos, zeros], -1)], 1
    )
    grid = F.affine_grid(theta, (len(images), 1, 8, 8), align_corners=False)
    rotated = F.grid_sample(images.reshape(-1, 1, 8, 8), grid, align_corners=False)
    return rotated.reshape(-1, 64)


DRIFT_METHODS = {
    "LoFi, no dynamics noise": 0.0,
    "LoFi, q = 1e-4": 1e-4,
    "LoFi, q = 1e-3": 1e-3,
    "LoFi, q = 1e-2": 1e-2,
}


#: One-pass Adam at fit's default rate schedule (constant, then decaying over the last 30 % of
#: the stream) and at a constant rate, which can keep following a drift.
ADAM_SCHEDULES = {"one-pass Adam (fit's lr schedule)": None, "one-pass Adam, constant lr": 1.0}


class _Evaluate(Callback):
    """Accuracy at the current angle every ``every`` steps of one-pass Adam."""

    def __init__(self, model, guide, split, every, num_train, curve):
        self.model, self.guide, self.split = model, guide, split
        self.every, self.num_train, self.curve = every, num_train, curve

    def on_after_backward(self, params, step):
        if step and step % self.every == 0:
            seen = step * BATCH
            self.curve.append(
                (seen, drift_accuracy(self.model, self.guide, self.split, seen, self.num_train, 1))
            )


def drift_accuracy(model, guide, split, seen, num_train, num_samples):
    angle = MAX_ANGLE * seen / num_train
    prediction = bbb.predict(
        model, guide, rotate(split.x_test, angle), num_samples=num_samples, seed=0
    )
    return float((prediction.predicted == split.y_test).double().mean())


def part_drift(seeds, out):
    split = digits(seed=0)
    num = len(split.x_train)
    every = 10  # minibatches between evaluations
    curves = {name: [] for name in (*DRIFT_METHODS, *ADAM_SCHEDULES)}
    for seed in range(seeds):
        order = torch.randperm(num, generator=torch.Generator().manual_seed(seed))
        angles = MAX_ANGLE * torch.arange(num) / num
        x = rotate(split.x_train[order], angles)
        y = split.y_train[order]
        for name, q in DRIFT_METHODS.items():
            model = digits_model(num, seed)
            updater = LoFi(model, rank=10, dynamics_noise=q)
            curve = []
            run_updater(
                updater,
                x,
                y,
                batch_size=BATCH,
                every=every,
                callback=lambda seen, m=model, u=updater, c=curve: c.append(
                    (seen, drift_accuracy(m, u.guide, split, seen, num, 30))
                ),
            )
            curves[name].append(curve)
            print(f"  drift seed {seed} {name}: final {curve[-1][1]:.3f}", flush=True)
        for name, schedule in ADAM_SCHEDULES.items():
            model = digits_model(num, seed)
            curve = []
            guide = bbb.DeltaGuide(model, name=f"adam{seed}")
            bbb.fit(
                model,
                guide,
                x,
                y,
                epochs=1,
                batch_size=BATCH,
                shuffle=False,
                progress=False,
                seed=seed,
                lr_schedule=schedule,
                callbacks=[_Evaluate(model, guide, split, every, num, curve)],
            )
            curve.append((num, drift_accuracy(model, guide, split, num, num, 1)))
            curves[name].append(curve)
            print(f"  drift seed {seed} {name}: final {curve[-1][1]:.3f}", flush=True)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    summary = []
    for index, (name, runs) in enumerate(curves.items()):
        seen = [p[0] for p in runs[0]]
        accuracy = torch.tensor([[p[1] for p in run] for run in runs])
        ax.plot(
            [MAX_ANGLE * s / num for s in seen], accuracy.mean(0), label=name, color=f"C{index}"
        )
        second_half = [[a for s, a in run if s > num / 2] for run in runs]
        summary.append(
            {
                "method": name,
                "second_half": [statistics.fmean(r) for r in second_half],
                "final": [run[-1][1] for run in runs],
            }
        )
    ax.set_xlabel("current angle (degrees); the stream's position")
    ax.set_ylabel("test accuracy at the current angle")
    ax.set_title("Digits rotated along the stream, minibatches of 10, LoFi rank 10")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "online_drift.png", dpi=110)
    plt.close(fig)
    lines = [
        "### A drifting stream: digits rotated by an angle growing from 0 to 180 degrees",
        "",
        "The 1,347 training images, each rotated by the angle of its place in the stream; every "
        "10 minibatches, accuracy on the 450 test images rotated by the current angle (30 "
        f"predictive samples). Mean ± sd over {seeds} seeds: accuracy averaged over the second "
        "half of the stream (90 to 180 degrees) and at its end.",
        "",
        "| method | accuracy, second half | accuracy at the end |",
        "| --- | --- | --- |",
    ]
    for row in summary:
        lines.append(f"| {row['method']} | {fmt(row['second_half'])} | {fmt(row['final'])} |")
    return {"curves": curves, "summary": summary}, "\n".join(lines)


# ----------------------------------------------------------------------------- large
LARGE_SCRIPT = r"""
import json, sys, time, statistics, torch, pyro, warnings
import pyro_bbb as bbb
from pyro_bbb.online import LoFi
from pyro_bbb.priors import FanInGaussian
torch.set_num_threads(1)
kind = sys.argv[1]
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
pyro.set_rng_seed(0)
model = bbb.BNN(bbb.mlp([784, 400, 400, 10], prior=FanInGaussian(2 ** 0.5)),
                bbb.likelihoods.Categorical(), num_data=130)
g = torch.Generator().manual_seed(0)
x = torch.rand(130, 784, generator=g); y = torch.randint(0, 10, (130,), generator=g)
batches = [(x[i:i + 10], y[i:i + 10]) for i in range(0, 130, 10)]
if kind == "lofi":
    updater = LoFi(model, rank=10)
    def step(i):
        updater.update(*batches[i])
    warm = 2
else:
    guide = bbb.MeanFieldGuide(model) if kind == "fit" else bbb.DeltaGuide(model)
    class Timer(bbb.Callback):
        def __init__(self):
            self.times, self.start, self.peak = [], None, 0
        def on_after_backward(self, params, step):
            now = time.perf_counter()
            if step >= 2 and self.start is not None:
                self.times.append(now - self.start)
            if step == 2:
                open("/proc/self/clear_refs", "w").write("5")
                self.base = rss("VmRSS")
            self.start = now
    timer = Timer()
    bbb.fit(model, guide, x, y, epochs=1, batch_size=10, shuffle=False, progress=False,
            callbacks=[timer])
    print(json.dumps({"ms": statistics.median(timer.times) * 1e3,
                      "peak_mb": (rss("VmHWM") - timer.base) / 2 ** 20}))
    sys.exit()
for i in range(warm):
    step(i)
open("/proc/self/clear_refs", "w").write("5")
base = rss("VmRSS")
times = []
for i in range(warm, len(batches)):
    start = time.perf_counter(); step(i); times.append(time.perf_counter() - start)
state = sum(t.numel() * t.element_size() for t in updater.state) / 2 ** 20
print(json.dumps({"ms": statistics.median(times) * 1e3, "peak_mb": (rss("VmHWM") - base) / 2 ** 20,
                  "state_mb": state, "d": updater.layout.size}))
"""


def part_large(_seeds, _out):
    results = {}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for kind in ("fit", "adam", "lofi"):
        output = (
            subprocess.run(
                [sys.executable, "-c", LARGE_SCRIPT, kind],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        results[kind] = json.loads(output)
        print(f"  large {kind}: {results[kind]}", flush=True)
    fit_ms = results["fit"]["ms"]
    d = results["lofi"]["d"]
    lines = [
        f"### A 784-400-400-10 network (d = {d:,} weights), minibatch of 10",
        "",
        "Median wall time per step over 11 steps after 2 warm-up steps, one thread, each in a "
        "fresh process; peak memory is the rise of the process's peak resident set over the "
        "steps (Linux VmHWM, reset after the warm-up).",
        "",
        "| step | ms | × fit step | peak extra memory (MB) |",
        "| --- | --- | --- | --- |",
        f"| fit step, MeanFieldGuide | {fit_ms:.1f} | 1.0 | {results['fit']['peak_mb']:.0f} |",
        f"| fit step, DeltaGuide (Adam) | {results['adam']['ms']:.1f} | "
        f"{results['adam']['ms'] / fit_ms:.1f} | {results['adam']['peak_mb']:.0f} |",
        f"| LoFi update, rank 10 | {results['lofi']['ms']:.0f} | "
        f"{results['lofi']['ms'] / fit_ms:.0f} | {results['lofi']['peak_mb']:.0f} |",
        "",
        f"LoFi's belief holds {results['lofi']['state_mb']:.0f} MB (d × (rank + 2) floats); "
        "R-VGA's full covariance would hold d² floats, {:,.0f} GB.".format(d * d * 4 / 2**30),
    ]
    return results, "\n".join(lines)


DEEP_METHODS = (
    "LoFi, rank 10",
    "LoFi, rank 10, sampled predictive",
    "R-VGA, Monte Carlo",
    "batch fit, 2,000 epochs",
    "batch fit, 8,000 epochs",
    "batch fit, 20,000 epochs",
)


def part_deep(seeds, _out):
    """The 1-D stream of issue 38: one pass against a batch fit run until its LL settles."""
    results = []
    for seed in range(seeds):
        data = gap_regression(600, noise=0.1, seed=seed)
        test = gap_regression(1000, noise=0.1, seed=seed + 100)
        for method in DEEP_METHODS:
            pyro.clear_param_store()
            pyro.set_rng_seed(seed)
            net = bbb.mlp([1, 50, 50, 1], prior=FanInGaussian(2.0))
            model = bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=600)
            predictive = "sample" if "sampled" in method else None
            if method.startswith("batch"):
                epochs = int(method.split()[2].replace(",", ""))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    guide, seconds = batch_fit(model, data.x, data.y, epochs=epochs, seed=seed)
            else:
                updater = RVGA(model) if method.startswith("R-VGA") else LoFi(model, rank=10)
                seconds = run_updater(updater, data.x, data.y, batch_size=BATCH)
                guide = updater.guide
            prediction = bbb.predict(
                model, guide, test.x, num_samples=200, seed=0, predictive=predictive
            )
            scores = regression_scores(prediction, test.y)
            scores.update(seed=seed, method=method, seconds=seconds)
            results.append(scores)
            print(
                f"  deep seed {seed} {method}: LL {scores['log_likelihood']:.3f}, {seconds:.1f} s",
                flush=True,
            )
    lines = [
        "### A deeper network on a 1-D stream: 600 points in minibatches of 10, one pass",
        "",
        "The gap data (sin x on [-4, -1) and [1, 4), noise 0.1, 600 points in random order), "
        "1-50-50-1 ReLU, FanInGaussian(2) prior, learned noise; test log-likelihood on 1,000 "
        "fresh points from the same distribution (the best possible is 0.88); the batch fits "
        f"are MeanFieldGuide at fit's other defaults. Mean ± sd over {seeds} seeds; CPU "
        "seconds of learning, one thread.",
        "",
        "| method | test LL | RMSE | CPU s |",
        "| --- | --- | --- | --- |",
    ]
    for method in DEEP_METHODS:
        rows = [r for r in results if r["method"] == method]
        lines.append(
            f"| {method} | {fmt([r['log_likelihood'] for r in rows])} | "
            f"{fmt([r['rmse'] for r in rows])} | {fmt([r['seconds'] for r in rows], 1)} |"
        )
    return results, "\n".join(lines)


PARTS = {
    "exact": part_exact,
    "jacobian": part_jacobian,
    "regression": part_regression,
    "digits": part_digits,
    "drift": part_drift,
    "large": part_large,
    "deep": part_deep,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default="online_results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for part in args.parts:
        load = os.getloadavg()[0]
        start = time.perf_counter()
        seeds = args.seeds if part not in ("digits", "drift", "deep") else min(args.seeds, 3)
        result, text = PARTS[part](seeds, out)
        seconds = time.perf_counter() - start
        text += (
            f"\n\n({part}: {seconds:.0f} s wall on {machine()}, load average {load:.1f} at the "
            "start)\n"
        )
        (out / f"{part}.json").write_text(json.dumps(result, indent=1))
        (out / f"{part}.md").write_text(text)
        sections.append(text)
        print(text, flush=True)
    (out / "online.md").write_text("\n\n".join(sections))


if __name__ == "__main__":
    main()
