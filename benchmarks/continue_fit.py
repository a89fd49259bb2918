"""A fitted guide given to ``fit`` again: what the second fit does and buys, three ways.

Each row is one problem and seed: a first ``fit`` at its defaults, then a second ``fit`` of
the same model on the same data, one of

* ``continue``: the fitted guide itself, at ``fit``'s defaults: it continues (β at its
  final value, the rate where the first fit left it; ``pyro_bbb.training.continuation``);
* ``full-rate``: the fitted guide with ``lr=`` the rate of the first fit's last full-rate
  epoch, followed as given: it trains at that rate while it pays, then decays;
* ``restart``: a new guide on the fitted values (the same name, Pyro's param store not
  cleared): the whole automatic run again from its start, as ``fit`` did on a fitted
  guide before it continued;
* ``epochs10``: the fitted guide, ``fit(epochs=10, beta=1.0)``: ten more epochs.

Test NLL in nats a point (and RMSE or the test error) after each fit; epochs, the second
fit's first rate and stages; CPU seconds of the process (one thread). The problems:

* ``regression``: 400 points of :math:`\\sin x_1 + 0.5 x_2 x_3 - 0.3 x_4 + N(0, 0.2^2)`,
  4-16-1 ReLU MLP, learned noise, full batch; 2,000 test points.
* ``breast-cancer``: scikit-learn's breast cancer data (the ``examples`` extra), 400 rows to
  train and 169 to test (standardised), 30-32-2 ReLU MLP, full batch.
* ``fashion-mnist``: 5,000 training and 5,000 test images (``pyro_bbb.data.image_split``,
  ``--images DIR``), 784-200-10 ReLU MLP, batch 128.

Every run appends one JSON line to ``--out`` (runs already there are skipped);
``--table`` prints the table.

    python benchmarks/continue_fit.py --out continue_fit.jsonl --seeds 0 1 2
    python benchmarks/continue_fit.py --out continue_fit.jsonl --table
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings

import pyro
import torch
from _common import add_run_arguments, markdown_table, run_missing

import pyro_bbb as bbb
from pyro_bbb.data import image_split

PROBLEMS = ("regression", "breast-cancer", "fashion-mnist")
SECONDS = ("continue", "full-rate", "restart", "epochs10")


def _problem(name: str, seed: int, images: str):
    """``(x, y, x_test, y_test, sizes, likelihood, batch_size)`` of a problem."""
    g = torch.Generator().manual_seed(seed)
    if name == "regression":

        def draw(m):
            x = torch.randn(m, 4, generator=g)
            f = torch.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] - 0.3 * x[:, 3]
            return x, f + 0.2 * torch.randn(m, generator=g)

        return *draw(400), *draw(2000), [4, 16, 1], bbb.likelihoods.Gaussian(), None
    if name == "breast-cancer":
        from sklearn.datasets import load_breast_cancer

        data = load_breast_cancer()
        x = torch.tensor(data.data, dtype=torch.float32)
        y = torch.tensor(data.target)
        order = torch.randperm(len(x), generator=g)
        train, test = order[:400], order[400:]
        mean, std = x[train].mean(0), x[train].std(0)
        x, likelihood = (x - mean) / std, bbb.likelihoods.Categorical()
        return x[train], y[train], x[test], y[test], [30, 32, 2], likelihood, None
    split = image_split(images, num_train=5000, num_test=5000, seed=seed)
    return (
        split.x_train, split.y_train, split.x_test, split.y_test, [784, 200, 10],
        bbb.likelihoods.Categorical(), 128,
    )  # fmt: skip


def _score(model, guide, x, y, regression: bool) -> dict:
    pred = bbb.predict(model, guide, x, num_samples=100, seed=0)
    row = {"nll": round(-pred.log_likelihood(y), 4)}
    if regression:
        row["rmse"] = round(float((pred.mean - y).pow(2).mean().sqrt()), 4)
    else:
        row["error"] = round(100 * float((pred.predicted != y).float().mean()), 2)
    return row


def _run(problem: str, seed: int, second: str, images: str) -> dict:
    x, y, x_test, y_test, sizes, likelihood, batch_size = _problem(problem, seed, images)
    regression = problem == "regression"
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    model = bbb.BNN(bbb.mlp(sizes), likelihood, num_data=len(x))
    guide = bbb.MeanFieldGuide(model)
    row = {"problem": problem, "seed": seed, "second": second}
    start = time.process_time()
    first = bbb.fit(model, guide, x, y, batch_size=batch_size, seed=seed, progress=False)
    row["first"] = {
        **_score(model, guide, x_test, y_test, regression), "epochs": len(first),
        "seconds": round(time.process_time() - start, 1),
    }  # fmt: skip
    options = {}
    if second == "full-rate":
        options["lr"] = [r for r, s in zip(first.lr, first.stage, strict=True) if s == "train"][-1]
    elif second == "restart":
        with warnings.catch_warnings():  # the new guide takes the fitted values, and says so
            warnings.simplefilter("ignore")
            guide = bbb.MeanFieldGuide(model)
    elif second == "epochs10":
        options = {"epochs": 10, "beta": 1.0}
    start = time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = bbb.fit(
            model, guide, x, y, batch_size=batch_size, seed=seed + 1, progress=False, **options
        )
    stages: list[list] = []
    for stage in history.stage:
        if not stages or stages[-1][0] != stage:
            stages.append([stage, 0])
        stages[-1][1] += 1
    row["second_fit"] = {
        **_score(model, guide, x_test, y_test, regression), "epochs": len(history),
        "seconds": round(time.process_time() - start, 1), "beta": history.beta[0],
        "lr": history.lr[0], "stages": stages, "continued": history.continues is not None,
        "warnings": [str(w.message)[:120] for w in caught],
    }  # fmt: skip
    return row


def _table(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        first, second = row["first"], row["second_fit"]
        other = "rmse" if "rmse" in first else "error"
        stages = ", ".join(f"{stage or 'fixed'} {n}" for stage, n in second["stages"])
        lines.append((
            row["problem"], row["seed"], row["second"], f"{first['nll']:.4f}",
            f"{second['nll']:.4f}", f"{second['nll'] - first['nll']:+.4f}",
            f"{first[other]:g} → {second[other]:g}", f"{first['epochs']:,}",
            f"{second['epochs']:,} ({stages})", f"{second['beta']:g}", f"{second['lr']:.3g}",
            f"{second['seconds']:g}",
        ))  # fmt: skip
    header = (
        "problem", "seed", "second fit", "first NLL", "second NLL", "change", "RMSE or error %",
        "first epochs", "second epochs (stages)", "β₀", "lr₀", "CPU s",
    )  # fmt: skip
    return markdown_table(header, lines, text=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, "continue_fit.jsonl")
    parser.add_argument("--problems", nargs="+", choices=PROBLEMS, default=list(PROBLEMS))
    parser.add_argument("--seconds", nargs="+", choices=SECONDS, default=list(SECONDS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--images", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    runs = [
        (
            {"problem": problem, "seed": seed, "second": second},
            functools.partial(_run, problem, seed, second, args.images),
        )
        for problem in args.problems
        for second in args.seconds
        for seed in args.seeds
    ]
    run_missing(
        args, runs, table=_table,
        describe=lambda row: f"{row['problem']} seed {row['seed']} {row['second']}: "
        f"{row['first']['nll']:.4f} -> {row['second_fit']['nll']:.4f}",
    )  # fmt: skip


if __name__ == "__main__":
    main()
