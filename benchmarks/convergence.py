"""fit's defaults on conjugate linear regressions: accuracy, length, and the convergence check.

On a linear regression with known noise and a Gaussian prior the posterior is known in closed
form, so a fit can be scored exactly: the largest relative error of the posterior standard
deviations (against the exact ones for ``LowRankGuide`` of full rank, which can represent
the posterior, and against mean-field's own optimum, variances 1 / diag(precision), for
``MeanFieldGuide``) and the largest error of the means in posterior sds. Each problem has
random true weights, the second feature correlated with the first, noise 0.5 and an N(0, 1)
prior (``tests/problems.py``: ``random_conjugate_problem``).

Protocols, each ``fit(model, guide, x, y, seed=s)`` with nothing else but:

* ``auto``: nothing else (``epochs=None``, fit's default: trains until more training
  stops paying);
* ``strict``: ``until="converged"`` (trains until the convergence check passes);
* ``3000``: ``epochs=3000``, the fixed protocol the defaults were tuned on;
* ``50``: ``epochs=50``, a fit cut short, for the convergence check;
* ``optimum``: started at the optimum (mean-field's closed form; the exact posterior for the
  low-rank guide, one block of full rank), 600 epochs at β = 1 and a constant rate: a fit
  known to be converged, for the check's false alarms.

Every run records the errors, its epochs, steps and wall time, whether the convergence check
passed and whether ``ConvergenceWarning`` was raised, as one JSON line of ``--out`` (runs
already there are skipped, so the script resumes); ``--table`` prints the tables.

    python benchmarks/convergence.py --out convergence.jsonl [--problems 8x1000 3x150] \\
        [--guides meanfield lowrank] [--protocols auto 3000 50] [--seeds 0 1 2 3]
    python benchmarks/convergence.py --out convergence.jsonl --table
"""

from __future__ import annotations

import functools
import itertools
import statistics
import sys
import time
from pathlib import Path

import pyro
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.problems, from the root

import _common as common

import pyro_bbb as bbb
from tests.problems import (
    exact_guide,
    linear_bnn,
    optimal_mean_field,
    random_conjugate_problem,
)

#: ``features x points`` of each problem.
PROBLEMS = {"2x60": (2, 60), "3x150": (3, 150), "6x300": (6, 300), "8x1000": (8, 1000)}
PROTOCOLS = {"auto": None, "strict": None, "3000": 3000, "50": 50, "optimum": 600}


def run(problem: str, guide_name: str, protocol: str, seed: int) -> dict:
    """One fit, scored against the exact posterior."""
    dim, num_data = PROBLEMS[problem]
    x, y, mean, covariance, precision = random_conjugate_problem(num_data, dim)
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)  # the network's initialisation, from which the guide starts
    model = linear_bnn(x)
    options = {}
    if protocol == "optimum":
        options = {"beta": 1.0, "lr_schedule": 1.0}
    if protocol == "strict":
        options = {"until": "converged"}
    if guide_name == "lowrank":
        guide = bbb.LowRankGuide(model, rank=dim + 1)
        if protocol == "optimum":
            guide = exact_guide(model, x, y, mean, covariance)
        target = covariance.diagonal().sqrt()
    else:
        guide = bbb.MeanFieldGuide(model)
        if protocol == "optimum":
            guide = optimal_mean_field(model, x, y, mean, precision)
        target = precision.diagonal().rsqrt()
    with common.Timed(time.perf_counter) as timed:
        history = bbb.fit(model, guide, x, y, epochs=PROTOCOLS[protocol], seed=seed, **options)
    marginals = guide.marginals(x, y)
    loc = torch.cat([marginals["0.weight"][0].reshape(-1), marginals["0.bias"][0]]).detach()
    sd = torch.cat([marginals["0.weight"][1].reshape(-1), marginals["0.bias"][1]]).detach()
    return {
        "problem": problem,
        "guide": guide_name,
        "protocol": protocol,
        "seed": seed,
        "sd_error": float((sd / target - 1).abs().max()),
        "mean_error": float(((loc - mean).abs() / target).max()),
        "epochs": len(history),
        "steps": history.steps[-1],
        "seconds": timed.seconds,
        "converged": history.converged,
        "warned": bool(timed.warnings),
        "stages": common.stage_starts(history),
        "message": history.convergence.message,
    }


def table(rows: list[dict]) -> str:
    """Markdown: per problem, guide and protocol, the largest errors and the run's length."""
    header = (
        "problem", "guide", "protocol", "seeds", "sd error, max (median)",
        "mean error (sd), max", "epochs, median [range]", "wall s, median", "converged",
        "warned",
    )  # fmt: skip
    groups = common.grouped(rows, ("problem", "guide", "protocol"))
    order = {name: i for i, name in enumerate(PROBLEMS)}
    lines = []
    for (problem, guide, protocol), group in sorted(
        groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][1], kv[0][2])
    ):
        sd = [r["sd_error"] for r in group]
        epochs = [r["epochs"] for r in group]
        lines.append((
            problem, guide, protocol, len(group),
            f"{100 * max(sd):.1f} % ({100 * statistics.median(sd):.1f} %)",
            f"{max(r['mean_error'] for r in group):.3f}",
            f"{statistics.median(epochs):,.0f} [{min(epochs):,}, {max(epochs):,}]",
            f"{statistics.median(r['seconds'] for r in group):.1f}",
            f"{sum(bool(r['converged']) for r in group)}/{len(group)}",
            f"{sum(r['warned'] for r in group)}/{len(group)}",
        ))  # fmt: skip
    return common.markdown_table(header, lines, align="lll" + "r" * 7)


def main(argv: list[str] | None = None) -> None:
    parser = common.script_parser(__doc__)
    common.add_run_arguments(parser, "convergence.jsonl")
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--guides", nargs="+", default=["meanfield", "lowrank"])
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    args = parser.parse_args(argv)

    def runs():
        every = itertools.product(args.problems, args.seeds, args.guides, args.protocols)
        for problem, seed, guide, protocol in every:
            key = {"problem": problem, "guide": guide, "protocol": protocol, "seed": seed}
            yield key, functools.partial(run, problem, guide, protocol, seed)

    def describe(row):
        return (
            f"{row['problem']} {row['guide']} {row['protocol']} seed {row['seed']}: "
            f"sd {row['sd_error']:.3f} mean {row['mean_error']:.3f} epochs {row['epochs']} "
            f"{row['seconds']:.0f} s converged {row['converged']}"
        )

    common.run_missing(args, runs(), table=table, describe=describe)


if __name__ == "__main__":
    main()
