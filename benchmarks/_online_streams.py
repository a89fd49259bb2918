"""``benchmarks/online.py --parts regression digits deep``: what one pass over a stream learns.

Every method learns the same model from the same stream, once, in minibatches of
:data:`BATCH`; the scores are the test set's, the times CPU seconds of learning:

* ``regression``: two 1-D data sets of 1,000 points: test log-likelihood, RMSE, epistemic
  band and CPU time of every method, over seeds;
* ``digits``: scikit-learn's digits: accuracy, NLL, ECE;
* ``deep``: 600 points of the gap data into a 1-50-50-1 network, against batch fits of 2,000
  to 20,000 epochs (the test log-likelihood settles).
"""

from __future__ import annotations

import math
import warnings
from functools import partial

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pyro
import torch
from _common import spread_table

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
from pyro_bbb.priors import FanInGaussian

#: The stream's minibatch.
BATCH = 10


# ------------------------------------------------------------------------ regression
DATASETS = {
    "wave": (lambda x: torch.sin(2 * x) + 0.3 * x, 0.2),
    "growing": (lambda x: 0.5 * x * torch.sin(1.5 * x) + 0.25 * x, 0.3),
}


def section(title: str, description: str, table: str) -> str:
    """A report's section: its title, what was measured, and the table."""
    return "\n".join([f"### {title}", "", description, "", table])


def regression_data(name, seed, num_train=1000, num_test=500):
    fn, noise = DATASETS[name]
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.rand(num_train, 1, generator=g) * 8 - 4
    y = (fn(x) + noise * torch.randn(num_train, 1, generator=g)).squeeze(-1)
    x_test = torch.rand(num_test, 1, generator=g) * 8 - 4
    y_test = (fn(x_test) + noise * torch.randn(num_test, 1, generator=g)).squeeze(-1)
    return x, y, x_test, y_test


def stream_model(sizes, likelihood, *, num_data, seed, prior_scale, **options):
    """A fresh BNN to learn a stream: the param store cleared, the initialisation seeded by
    ``seed``, a ``FanInGaussian(prior_scale)`` prior, ``likelihood()`` (a class); ``options``
    go to ``bbb.mlp``."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = bbb.mlp(sizes, prior=FanInGaussian(prior_scale), **options)
    return bbb.BNN(net, likelihood(), num_data=num_data)


def learn(method, model, x, y, seed, *, num_samples):
    """Learn the stream ``(x, y)`` into ``model`` by ``method`` (a name of the tables);
    returns a function predicting at inputs (``num_samples`` draws; one for Adam's point
    estimate) and the CPU seconds of learning."""
    if method.startswith("batch fit"):
        epochs = 1000 if "1,000" in method else 100
        guide, seconds = batch_fit(model, x, y, epochs=epochs, seed=seed)
        return partial(bbb.predict, model, guide, num_samples=num_samples, seed=0), seconds
    if method.startswith("streaming VCL"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            vcl, seconds = streaming_vcl(model, x, y, batch_size=BATCH, seed=seed)
        return partial(vcl.predict, num_samples=num_samples, seed=0), seconds
    if method == "one-pass Adam":
        guide, seconds = one_pass_adam(model, x, y, batch_size=BATCH, seed=seed)
        return partial(bbb.predict, model, guide, num_samples=1, seed=0), seconds
    if method.startswith("LoFi"):
        updater = LoFi(model, rank=int(method.rsplit(" ", 1)[1]))
    elif method == "R-VGA, Monte Carlo":
        updater = RVGA(model)
    else:
        updater = RVGA(model, linearised=True)
    seconds = run_updater(updater, x, y, batch_size=BATCH)
    return partial(bbb.predict, model, updater.guide, num_samples=num_samples, seed=0), seconds


def regression_model(num_data, seed):
    """1-50-1 tanh, learned noise."""
    return stream_model(
        [1, 50, 1], bbb.likelihoods.Gaussian, num_data=num_data, seed=seed, prior_scale=2.0,
        activation="tanh",
    )  # fmt: skip


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
REGRESSION_COLUMNS = (
    ("test LL", "log_likelihood", 3),
    ("RMSE", "rmse", 3),
    ("noise σ", "noise", 3),
    ("epistemic std inside", "epistemic_inside", 3),
    ("outside", "epistemic_outside", 3),
    ("CPU s", "seconds", 2),
)


def learn_regression(method, x, y, seed):
    """Fit one method on the stream; returns a function predicting at inputs, and CPU s."""
    return learn(method, regression_model(len(x), seed), x, y, seed, num_samples=200)


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
        lines += [f"**{dataset}**", "", spread_table(
            [r for r in results if r["dataset"] == dataset], REGRESSION_METHODS, REGRESSION_COLUMNS
        ), ""]  # fmt: skip
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
    """64-100-10 ReLU, the digits' classes."""
    return stream_model(
        [64, 100, 10], bbb.likelihoods.Categorical, num_data=num_data, seed=seed,
        prior_scale=math.sqrt(2),
    )  # fmt: skip


DIGITS_METHODS = (
    "batch fit, 100 epochs (the former default)",
    "streaming VCL (fit per minibatch)",
    "one-pass Adam",
    "LoFi, rank 10",
    "LoFi, rank 30",
)


DIGITS_COLUMNS = (("accuracy", "accuracy", 3), ("NLL", "nll", 3), ("ECE", "ece", 3),
                  ("CPU s", "seconds", 1))  # fmt: skip


def learn_digits(method, x, y, split, seed):
    """Fit one method on the stream; returns its test prediction and CPU seconds."""
    predict_at, seconds = learn(method, digits_model(len(x), seed), x, y, seed, num_samples=100)
    return predict_at(split.x_test), seconds


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
    return results, section(
        "Digits streamed once in minibatches of 10",
        "1,347 training images (64-100-10 ReLU, FanInGaussian(√2) prior), 450 test images. "
        f"Mean ± sd over {seeds} seeds (stream order and initialisation); 100 predictive "
        "samples (1 for Adam's point estimate); ECE with 15 bins; CPU seconds of learning.",
        spread_table(results, DIGITS_METHODS, DIGITS_COLUMNS),
    )


# ------------------------------------------------------------------------------ deep
DEEP_METHODS = (
    "LoFi, rank 10",
    "LoFi, rank 10, sampled predictive",
    "R-VGA, Monte Carlo",
    "batch fit, 2,000 epochs",
    "batch fit, 8,000 epochs",
    "batch fit, 20,000 epochs",
)

DEEP_COLUMNS = (("test LL", "log_likelihood", 3), ("RMSE", "rmse", 3), ("CPU s", "seconds", 1))


def part_deep(seeds, _out):
    """The 1-D stream of issue 38: one pass against a batch fit run until its LL settles."""
    results = []
    for seed in range(seeds):
        data = gap_regression(600, noise=0.1, seed=seed)
        test = gap_regression(1000, noise=0.1, seed=seed + 100)
        for method in DEEP_METHODS:
            model = stream_model(
                [1, 50, 50, 1], bbb.likelihoods.Gaussian, num_data=600, seed=seed, prior_scale=2.0
            )
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
    return results, section(
        "A deeper network on a 1-D stream: 600 points in minibatches of 10, one pass",
        "The gap data (sin x on [-4, -1) and [1, 4), noise 0.1, 600 points in random order), "
        "1-50-50-1 ReLU, FanInGaussian(2) prior, learned noise; test log-likelihood on 1,000 "
        "fresh points from the same distribution (the best possible is 0.88); the batch fits "
        f"are MeanFieldGuide at fit's other defaults. Mean ± sd over {seeds} seeds; CPU "
        "seconds of learning, one thread.",
        spread_table(results, DEEP_METHODS, DEEP_COLUMNS),
    )
