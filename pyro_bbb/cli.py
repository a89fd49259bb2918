"""The ``pyro-bbb`` command (also ``python -m pyro_bbb``).

``pyro-bbb demo`` fits a Bayesian MLP to 1-D data with a gap, prints the predictive
uncertainty in the gap, near the data and in extrapolation, and saves a figure (``--nuts``:
with NUTS's band beside it).
``pyro-bbb bench uci PATH`` runs the standard UCI regression protocol on every data set
folder under ``PATH`` (see :mod:`pyro_bbb.bench.uci`) and writes a Markdown table and a JSON file.
The core package never imports this module.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .demo import demo

if TYPE_CHECKING:
    from .bench import UCIResults

__all__ = ["bench_uci", "main"]


def bench_uci(
    path: str | Path,
    *,
    out: str | Path = "uci_results",
    num_splits: int | None = None,
    datasets: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    jobs: int = 1,
    progress: bool | None = None,
    **options: Any,
) -> UCIResults:
    """Run the UCI protocol on every data set under ``path``; print and save the tables.

    Args:
        path: A data set folder in split format, or a folder of them.
        out: Folder for ``uci.md``, ``uci.json`` and ``uci.png`` (the test log-likelihoods
            beside the published ones, one panel per data set).
        num_splits: First splits to use per data set (``None``: all).
        datasets: Names of the data set folders to run (``None``: all found).
        methods: Subset of :data:`pyro_bbb.bench.METHODS` (``None``: all).
        jobs: Worker processes.
        progress: Show the progress bar (``None``: when attached to a terminal).
        **options: Fields of :class:`pyro_bbb.bench.UCIConfig` (``epochs=``, ``guide=``, ...).

    Returns:
        The :class:`pyro_bbb.bench.UCIResults`.
    """
    from pyro_bbb.bench import METHODS, UCIConfig, run_uci

    config = UCIConfig(**options)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one hidden layer of 50 units runs fastest on one thread
    try:
        results = run_uci(
            path,
            num_splits=num_splits,
            datasets=datasets,
            methods=METHODS if methods is None else methods,
            config=config,
            jobs=jobs,
            progress=progress,
        )
    finally:
        torch.set_num_threads(threads)
    print(results.to_markdown())
    md, js = results.save(out)
    from pyro_bbb.plots import plot_scores

    figure = Path(out) / "uci.png"
    plot_scores(*results.scores("log_likelihood"), path=figure)
    print(f"Saved {md}, {js} and {figure}")
    return results


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text}")
    return value


def _positive_int_or_auto(text: str) -> int | None:
    """A positive int, or ``None`` for ``"auto"``."""
    return None if text == "auto" else _positive_int(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pyro-bbb`` command; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="pyro-bbb", description=__doc__.splitlines()[0].replace("``", "")
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("demo", help="fit a BNN to 1-D gap data and plot its uncertainty")
    run.add_argument("--out", default="pyro_bbb_demo.png", help="figure path (PNG)")
    run.add_argument(
        "--epochs",
        type=_positive_int,
        default=None,
        help="a fixed number of epochs (fit's default length: until more training stops paying)",
    )
    run.add_argument(
        "--max-steps", type=_positive_int, default=None, help="the default length's budget"
    )
    run.add_argument("--seed", type=int, default=0, help="seed of the data, the fit and its draws")
    run.add_argument(
        "--reparam",
        choices=["local", "flipout"],
        default=None,
        help="gradient estimator of the affine layers (plain weight sampling)",
    )
    run.add_argument(
        "--nuts",
        action="store_true",
        help='also sample the model with NUTS and draw its band (pip install "pyro-bbb[numpyro]")',
    )
    run.add_argument(
        "--nuts-draws", type=_positive_int, default=200, help="NUTS warm-up and draws per chain"
    )

    bench = commands.add_parser("bench", help="benchmarks against published results")
    suites = bench.add_subparsers(dest="suite", required=True)
    uci = suites.add_parser(
        "uci",
        help="UCI regression: BNN, ensembles, deterministic net, MC dropout, beside published "
        "figures",
        description="Run the standard UCI protocol on every data set folder under PATH "
        "(a folder holding data.txt and index_*.txt files, or a folder of such folders).",
    )
    uci.add_argument("path", metavar="PATH", help="data set folder, or a folder of them")
    uci.add_argument("--splits", type=_positive_int, default=None, help="first K splits (all)")
    uci.add_argument("--datasets", nargs="+", help="data set folder names to run (all)")
    uci.add_argument(
        "--guide", choices=["meanfield", "lowrank"], default="meanfield", help="the BNN's guide"
    )
    uci.add_argument("--rank", type=_positive_int, default=2, help="low-rank guide's rank")
    uci.add_argument(
        "--reparam",
        choices=["local", "flipout", "none"],
        default="local",
        help="the BNN's gradient estimator (none: sample the weights)",
    )
    uci.add_argument(
        "--epochs",
        type=_positive_int_or_auto,
        default=2000,
        help=(
            "training epochs (2000); auto: fit's default length, until more training stops "
            "improving the predictive"
        ),
    )
    uci.add_argument(
        "--batch-size", type=_positive_int, default=None, help="minibatch rows (the full batch)"
    )
    uci.add_argument(
        "--lr", type=float, default=None, help="Adam learning rate (fit's own, a rate per layer)"
    )
    uci.add_argument(
        "--hold",
        type=float,
        default=None,
        help="fraction of the epochs at beta = 0 before the warm-up (0.25)",
    )
    uci.add_argument(
        "--methods",
        nargs="+",
        choices=["bnn", "bnn_ensemble", "deterministic", "deep_ensemble", "mc_dropout"],
        help="the methods to run (all)",
    )
    uci.add_argument("--members", type=_positive_int, default=None, help="ensemble size (5)")
    uci.add_argument(
        "--num-particles",
        type=_positive_int_or_auto,
        default=1,
        help="the BNN's weight samples per step (1); auto: fit's default for the network",
    )
    uci.add_argument("--jobs", type=_positive_int, default=1, help="worker processes")
    uci.add_argument("--seed", type=int, default=0, help="seed of every fit")
    uci.add_argument("--out", default="uci_results", help="folder for uci.md, uci.json and uci.png")
    uci.add_argument(
        "--progress",
        action="store_true",
        help="show the progress bar even when stderr is not a terminal (e.g. a log file)",
    )
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo(
            out=args.out, epochs=args.epochs, max_steps=args.max_steps, seed=args.seed,
            reparam=args.reparam, nuts=args.nuts, nuts_draws=args.nuts_draws,
        )  # fmt: skip
    elif args.command == "bench" and args.suite == "uci":
        options = {
            "guide": args.guide,
            "rank": args.rank,
            "reparam": None if args.reparam == "none" else args.reparam,
            "num_particles": args.num_particles,
            "seed": args.seed,
        }
        options["epochs"] = args.epochs
        for name in ("batch_size", "lr", "hold", "members"):
            if getattr(args, name) is not None:
                options[name] = getattr(args, name)
        bench_uci(
            args.path,
            out=args.out,
            num_splits=args.splits,
            datasets=args.datasets,
            methods=args.methods,
            jobs=args.jobs,
            progress=True if args.progress else None,
            **options,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
