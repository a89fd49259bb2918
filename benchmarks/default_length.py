"""fit's default length on networks: what a first call costs and buys, against fixed lengths.

Each row is one ``fit`` with nothing but the data (and ``batch_size`` where the problem has
one), against the same model, seed and data at fixed lengths:

* ``gap``: 1-D regression with a gap, 600 points of ``sin(x) + N(0, 0.1²)`` on
  ``[-4, -1] ∪ [1, 4]`` (:func:`pyro_bbb.data.gap_regression`, seed ``s``), a 1-50-50-1 tanh
  MLP, learned noise, full batch; test log-likelihood on 2,000 fresh points of the same
  distribution; fixed 1,000, 3,000 and 10,000 epochs beside it.
* ``mnist``: 4,000 training images of an MNIST-format folder (``--mnist DIR`` holding the
  four idx files; on Debian, ``apt install dataset-fashion-mnist`` puts Fashion-MNIST in
  ``/usr/share/datasets/fashion-mnist``), 784-400-400-10, batch 128; test error and NLL on
  2,000 test images; a fixed 40 epochs beside it.
* ``mnist60k``: all 60,000 training images at ``batch_size`` 64 and 128 (a run at
  MNIST's size must train, never fail at set-up); test error on 2,000 test images.
* ``mnist1k``: 1,000 training images (seed ``s``), 784-100-10, batch 128; test error and
  NLL on 2,000 test images; the default alone.
* ``digits``: scikit-learn's 8x8 digits (:func:`pyro_bbb.data.digits`: 1,347 training and
  450 test images, the split of seed 0), 64-100-10, batch 128; test error and NLL; a fixed
  600 epochs beside it.
* ``uci:NAME``: the UCI protocol of :mod:`pyro_bbb.bench.uci` (one hidden layer, local
  reparameterisation, learned noise) on ``--uci DIR/NAME``'s splits, against its 2,000
  full-batch epochs.

Every run appends one JSON line to ``--out`` (runs already there are skipped, so the script
resumes); ``--table`` prints the tables. CPU seconds are the process's (one thread).

    python benchmarks/default_length.py --out default_length.jsonl --problems gap mnist \\
        uci:boston --seeds 0 1 --mnist /usr/share/datasets/fashion-mnist --uci ../shared/data/uci
    python benchmarks/default_length.py --out default_length.jsonl --table
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path

import pyro
from _common import (
    UCI_FOLDER,
    Timed,
    add_run_arguments,
    grouped,
    markdown_table,
    run_missing,
    script_parser,
    stage_starts,
)

import pyro_bbb as bbb
from pyro_bbb.bench.uci import UCIConfig, fit_split
from pyro_bbb.data import FASHION_MNIST, digits, gap_regression, image_split, load_uci_folder

FIXED = {
    "gap": (1000, 3000, 10000), "mnist": (40,), "mnist60k": (), "mnist1k": (), "digits": (600,),
    "uci": (2000,),
}  # fmt: skip


def _fit(model, guide, x, y, epochs, **options) -> dict:
    with Timed() as timed:
        history = bbb.fit(model, guide, x, y, epochs=epochs, progress=False, **options)
    return {
        "cpu": timed.seconds,
        "epochs": len(history),
        "steps": history.steps[-1],
        "stages": stage_starts(history),
        "stopped": history.stopped,
        "warned": timed.warnings,
    }


def run(problem: str, protocol: str, seed: int, args: argparse.Namespace) -> dict:
    """One fit of ``problem`` at ``protocol`` (``"auto"`` or a number of epochs)."""
    epochs = None if protocol == "auto" or protocol.startswith("b") else int(protocol)
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    row = {"problem": problem, "protocol": protocol, "seed": seed}
    if problem == "gap":
        train, test = gap_regression(600, 0.1, seed), gap_regression(2000, 0.1, 1000 + seed)
        model = bbb.BNN(
            bbb.mlp([1, 50, 50, 1], activation="tanh"), bbb.likelihoods.Gaussian(), num_data=600
        )
        guide = bbb.MeanFieldGuide(model)
        row |= _fit(model, guide, train.x, train.y, epochs, seed=seed)
        pred = bbb.predict(model, guide, test.x, num_samples=200, seed=0)
        row["test_ll"] = pred.log_likelihood(test.y)
    elif problem.startswith("mnist") or problem == "digits":
        full = problem == "mnist60k"
        if problem == "digits":
            split = digits(seed=0)
            x, y, xt, yt = split.x_train, split.y_train, split.x_test, split.y_test
        else:  # the same subsets as before the loader was public: train then test, one generator
            size = {"mnist60k": 60000, "mnist1k": 1000}.get(problem, 4000)
            x, y, xt, yt = image_split(args.mnist, num_train=size, num_test=2000, seed=seed)
        batch = int(protocol.split("b")[1]) if full else 128
        sizes = {"digits": [64, 100, 10], "mnist1k": [784, 100, 10]}.get(problem)
        model = bbb.BNN(
            bbb.mlp(sizes or [784, 400, 400, 10]), bbb.likelihoods.Categorical(), num_data=len(x)
        )
        guide = bbb.MeanFieldGuide(model)
        row |= _fit(model, guide, x, y, epochs, batch_size=batch, seed=seed)
        pred = bbb.predict(model, guide, xt, num_samples=100, seed=0)
        row["test_error"] = float((pred.predicted != yt).float().mean())
        row["test_nll"] = -pred.log_likelihood(yt)
    else:
        name = problem.split(":")[1]
        data = load_uci_folder(args.uci / name, num_splits=seed + 1)
        config = UCIConfig(epochs=epochs)
        with Timed() as timed:
            result = fit_split(
                "bnn", data[seed], dataset=name, n_hidden=data.n_hidden or 50, config=config
            )
        row |= {
            "cpu": timed.seconds,
            "test_ll": result.log_likelihood,
            "rmse": result.rmse,
            "warned": timed.warnings,
        }
    return row


def table(rows: list[dict]) -> str:
    """Markdown: per problem and protocol, medians over seeds (splits for UCI)."""
    header = (
        "problem", "protocol", "seeds", "test LL (mean)", "test error", "test NLL",
        "epochs (median)", "CPU s (median)", "warned",
    )  # fmt: skip

    def mean(group, key, fmt):
        values = [r[key] for r in group if key in r]
        return fmt.format(statistics.fmean(values)) if values else ""

    lines = []
    for (problem, protocol), group in sorted(grouped(rows, ("problem", "protocol")).items()):
        epochs = [r["epochs"] for r in group if "epochs" in r]
        lines.append((
            problem, protocol, len(group), mean(group, "test_ll", "{:.3f}"),
            mean(group, "test_error", "{:.2%}"), mean(group, "test_nll", "{:.3f}"),
            statistics.median(epochs) if epochs else "",
            f"{statistics.median(r['cpu'] for r in group):.1f}",
            f"{sum(bool(r['warned']) for r in group)}/{len(group)}",
        ))  # fmt: skip
    return markdown_table(header, lines, align="ll" + "r" * 7)


def main(argv: list[str] | None = None) -> None:
    parser = script_parser(__doc__)
    add_run_arguments(parser, "default_length.jsonl")
    parser.add_argument("--problems", nargs="+", default=["gap"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--mnist", type=Path, default=FASHION_MNIST)
    parser.add_argument("--uci", type=Path, default=UCI_FOLDER)
    parser.add_argument("--protocols", nargs="+", help="only these (auto, b128, an epoch count)")
    args = parser.parse_args(argv)

    def runs():
        for problem in args.problems:
            kind = problem.split(":")[0]
            fixed = map(str, FIXED[kind])
            protocols = ["b64", "b128"] if kind == "mnist60k" else ["auto", *fixed]
            if args.protocols:
                protocols = [p for p in protocols if p in args.protocols]
            for seed in args.seeds:
                for protocol in protocols:
                    key = {"problem": problem, "protocol": protocol, "seed": seed}
                    yield key, functools.partial(run, problem, protocol, seed, args)

    def describe(row):
        return json.dumps({k: v for k, v in row.items() if k != "stopped"})

    run_missing(args, runs(), table=table, describe=describe)


if __name__ == "__main__":
    main()
