"""Blundell et al. 2015's Table 1 in shape, on Fashion-MNIST at full size: what fit's default costs.

Every row trains on ``--num-train`` training images (all 60,000 by default) of an MNIST-format
idx folder (``--data``; on Debian and Ubuntu, ``apt-get install dataset-fashion-mnist`` puts
Fashion-MNIST in ``/usr/share/datasets/fashion-mnist``) and is scored on ``--num-test`` test
images (all 10,000 by default), pixels in [0, 1]:

* ``mlp``: a deterministic 784-400-400-10 ReLU MLP, plain torch, Adam lr 1e-3, batch 128,
  ``--epochs`` epochs (10);
* ``dropout``: the same with dropout (``--dropout``, 0.2) after each hidden activation, kept on
  at prediction, 100 masks (MC dropout, Gal and Ghahramani 2016);
* ``bbb_gauss400``: a 784-400-400-10 BNN (``pyro_bbb.mlp``), N(0, 1) prior, mean-field guide;
* ``bbb_mix400``, ``bbb_mix1200``: the same with Blundell et al.'s scale-mixture prior
  (π = 0.5, σ₁ = 1, σ₂ = e⁻⁶), 400 and 1,200 units per hidden layer;
* ``ensemble400``: an ``Ensemble`` of ``--members`` (5) mean-field BNNs of the Gaussian row's
  shape, trained as one;
* ``lenet``: a deterministic LeNet-5-shaped ConvNet (conv 6@5×5 pad 2, max-pool 2, conv
  16@5×5, max-pool 2, 120, 84, 10; ReLU), trained as ``mlp``;
* ``lenet_bnn``: the same network made Bayesian whole with ``bayesianize`` (N(0, 1) prior,
  mean-field guide);
* ``ivon400``, ``ivon_lenet``: the MLP and LeNet-5 trained by IVON (Shen et al. 2024), a
  mean-field posterior learned by a drop-in optimiser, with its own recipe (``ess`` the
  number of training images, one weight sample a step, cosine decay, weight decay 1e-4,
  ``hess_init`` 0.1, ``--ivon-epochs`` 20 epochs, 50 test draws: ``_images_peers.py``).
  An optional peer: ``pip install --no-deps ivon-opt``; without it these rows are skipped
  with a message.

Each BNN row runs at two protocols: ``default``, ``fit(model, guide, x, y, batch_size=128)``
with every other argument at its default (run length, rate, β, estimator), and ``lr1e-3``, the
same with ``lr=1e-3`` set by hand, so the table shows what the default costs. IVON needs a
rate from its user: its rows run at two, ``lr0.1`` (its README's) and ``lr0.2``
(``--ivon-protocols``). The deterministic rows run once (``adam1e-3``). Columns: test error,
NLL (nats per image), ECE (15 bins), training CPU seconds (``time.process_time``, every
thread's; ``--threads`` sets ``torch.set_num_threads``, 1 by default) and epochs. BNNs predict
with 100 weight samples (20 per member for the ensemble). The published anchors are printed
beside the table.

Every run appends one JSON line to ``--out`` (runs already there are skipped, so the script
resumes; a run's key holds its row, protocol, seed, ``--num-train`` and ``--max-steps``);
``--table`` prints the table of what is there. ``--max-steps`` caps every row (``fit``'s
budget, in whole epochs; the other rows' steps) for a quick end-to-end check:

    python benchmarks/images.py --out images.jsonl                         # the full table
    python benchmarks/images.py --out images.jsonl --rows mlp bbb_gauss400 --seeds 0 1
    python benchmarks/images.py --out images.jsonl --rows bbb_gauss400 ivon400 \\
        --protocols default                         # fit's default beside IVON's two rates
    python benchmarks/images.py --out /tmp/check.jsonl --num-train 1000 --num-test 500 \\
        --max-steps 16 --epochs 1                                          # a check, seconds
    python benchmarks/images.py --out images.jsonl --table
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from pathlib import Path

import pyro
import torch
from _common import append_row, machine, read_rows, stage_starts
from _images_nets import lenet5, scores
from _images_peers import IVON_PROTOCOLS, has_ivon, run_deterministic, run_ivon

import pyro_bbb as bbb
from pyro_bbb.data import FASHION_MNIST, Split, image_split
from pyro_bbb.training.convergence import ConvergenceWarning

DETERMINISTIC = ("mlp", "dropout", "lenet")
BAYESIAN = ("bbb_gauss400", "bbb_mix400", "bbb_mix1200", "ensemble400", "lenet_bnn")
IVON = ("ivon400", "ivon_lenet")
ROWS = ("mlp", "dropout", "bbb_gauss400", "bbb_mix400", "bbb_mix1200", "ensemble400", "ivon400")
ROWS += ("lenet", "lenet_bnn", "ivon_lenet")
PROTOCOLS = ("default", "lr1e-3")
CONV = ("lenet", "lenet_bnn", "ivon_lenet")

ANCHORS = """\
Published anchors (not this benchmark's data or protocol; for shape):
  Blundell et al. 2015, Table 1, MNIST test error (a different data set):
    BBB, scale mixture prior: 1.36 % (400 units), 1.34 % (800), 1.32 % (1,200);
    plain SGD about 1.8 %; dropout about 1.3 %.
  uncertainty-baselines, LeNet-5 on Fashion-MNIST (NLL / accuracy):
    deterministic 0.321 / 91.0 %; VI 0.292 / 89.5 %; refined VI 0.259 / 90.6 %;
    an ensemble of 10: 0.200 / 93.2 %."""


def bayesian_model(name: str, num_data: int, members: int):
    """The row's model and guide (the param store is cleared and seeded by the caller)."""
    if name == "lenet_bnn":
        net = bbb.bayesianize(lenet5(), bbb.priors.Gaussian(1.0))
    else:
        width = 1200 if name.endswith("1200") else 400
        mixture = bbb.priors.ScaleMixture(pi=0.5, sigma1=1.0, sigma2=math.exp(-6))
        net = bbb.mlp([784, width, width, 10], prior=mixture if "mix" in name else None)
    model = bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=num_data)
    if name.startswith("ensemble"):
        return model, bbb.Ensemble(model, bbb.MeanFieldGuide, k=members)
    return model, bbb.MeanFieldGuide(model)


def run_bayesian(
    name: str, protocol: str, data: Split, seed: int, args: argparse.Namespace
) -> dict:
    """One ``fit`` at the row's protocol, then a 100-sample predictive on the test images."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    model, guide = bayesian_model(name, len(data.x_train), args.members)
    options = {"lr": 1e-3} if protocol == "lr1e-3" else {}
    start = time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        history = bbb.fit(
            model, guide, data.x_train, data.y_train, batch_size=128, seed=seed,
            max_steps=args.max_steps, progress=args.progress, **options,
        )  # fmt: skip
    cpu = time.process_time() - start
    samples = 100 // args.members if name.startswith("ensemble") else 100
    pred = bbb.predict(model, guide, data.x_test, num_samples=samples, batch_size=250, seed=0)
    return {
        "cpu": cpu,
        "epochs": len(history),
        "steps": history.steps[-1],
        "stages": stage_starts(history),
        "warned": [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)],
    } | scores(pred.log_probs, data.y_test)


def table(rows: list[dict]) -> str:
    """Markdown: per row and protocol, means over seeds (CPU s and epochs: medians)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        key = (row["row"], row["protocol"], row["num_train"], row["max_steps"])
        groups.setdefault(key, []).append(row)
    lines = [
        "| row | protocol | train images | seeds | test error | NLL | ECE | CPU s | epochs "
        "| warned |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    order = {name: i for i, name in enumerate(ROWS)}
    for key in sorted(groups, key=lambda k: (order.get(k[0], 99), k[1], k[2], k[3] or 0)):
        group = groups[key]
        name, protocol, num_train, max_steps = key
        budget = f" (max_steps {max_steps})" if max_steps else ""

        def mean(column: str, group: list[dict] = group) -> float:
            return statistics.fmean(r[column] for r in group)

        lines.append(
            f"| {name} | {protocol}{budget} | {num_train} | {len(group)} "
            f"| {mean('test_error'):.2%} | {mean('test_nll'):.3f} | {mean('test_ece'):.2%} "
            f"| {statistics.median(r['cpu'] for r in group):.0f} "
            f"| {statistics.median(r['epochs'] for r in group):g} "
            f"| {sum(bool(r.get('warned')) for r in group)}/{len(group)} |"
        )
    return "\n".join(lines)


def protocols_of(name: str, args: argparse.Namespace) -> list[str]:
    """The protocols a row runs at: its rates for IVON, one for the deterministic rows."""
    if name in DETERMINISTIC:
        return ["adam1e-3"]
    if name in IVON:
        return list(args.ivon_protocols)
    return list(args.protocols)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("images.jsonl"))
    parser.add_argument("--data", type=Path, default=FASHION_MNIST, help="an idx folder")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--num-train", type=int, default=60000, help="a random subset")
    parser.add_argument("--num-test", type=int, default=10000, help="a random subset")
    parser.add_argument("--max-steps", type=int, default=None, help="every row's budget")
    parser.add_argument("--epochs", type=int, default=10, help="the deterministic rows'")
    parser.add_argument("--dropout", type=float, default=0.2, help="MC dropout's rate")
    parser.add_argument("--members", type=int, default=5, help="the ensemble's BNNs")
    parser.add_argument(
        "--ivon-protocols", nargs="+", choices=IVON_PROTOCOLS, default=list(IVON_PROTOCOLS)
    )
    parser.add_argument("--ivon-epochs", type=int, default=20, help="IVON's run length")
    parser.add_argument("--ivon-hess-init", type=float, default=0.1, help="IVON's hess_init")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--progress", action="store_true", help="fit's progress bar")
    parser.add_argument("--table", action="store_true", help="print the table and exit")
    args = parser.parse_args(argv)
    done = read_rows(args.out)
    if args.table:
        print(table(done), ANCHORS, sep="\n\n")
        return
    torch.set_num_threads(args.threads)
    keys = {(r["row"], r["protocol"], r["seed"], r["num_train"], r["max_steps"]) for r in done}
    rows = list(args.rows)
    if not has_ivon() and any(name in IVON for name in rows):
        print("IVON rows skipped: ivon is not installed (pip install --no-deps ivon-opt)")
        rows = [name for name in rows if name not in IVON]
    for seed in args.seeds:
        data = {}  # flat and image-shaped, loaded once per seed when a row needs them
        for name in rows:
            for protocol in protocols_of(name, args):
                key = (name, protocol, seed, args.num_train, args.max_steps)
                if key in keys:
                    continue
                flat = name not in CONV
                if flat not in data:
                    data[flat] = image_split(
                        args.data, num_train=args.num_train, num_test=args.num_test, seed=seed,
                        flatten=flat,
                    )  # fmt: skip
                if name in DETERMINISTIC:
                    result = run_deterministic(name, data[flat], seed, args)
                elif name in IVON:
                    result = run_ivon(name, protocol, data[flat], seed, args)
                else:
                    result = run_bayesian(name, protocol, data[flat], seed, args)
                row = {
                    "row": name, "protocol": protocol, "seed": seed,
                    "num_train": args.num_train, "num_test": args.num_test,
                    "max_steps": args.max_steps, "threads": args.threads,
                    "machine": machine(),
                } | result  # fmt: skip
                append_row(args.out, row)
                print(json.dumps({k: v for k, v in row.items() if k != "warned"}), flush=True)
    print(table(read_rows(args.out)), ANCHORS, sep="\n\n")


if __name__ == "__main__":
    main()
