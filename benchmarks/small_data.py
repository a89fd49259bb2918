"""Small data: which training remedy reaches the fitted optimum of the ELBO from any start.

Mean-field Bayes by Backprop on a few hundred points can settle where the weights sit at their
prior and a large learned noise explains the targets, although the β = 1 ELBO prefers a fitted
solution; whether it does depends on the guide's initial σ. This script trains every
candidate remedy on several problems, initial σ and seeds, and scores each run by

* the β = 1 ELBO it reaches (64-particle estimate of ``nll + kl`` at the end, nats; lower
  ``loss1`` is better), the objective every candidate is judged by;
* train and test RMSE of the predictive mean and the test log-likelihood per point (the
  Gaussian mixture over 200 weight samples);
* the epistemic std at probe inputs (the gap, a hole, the test set) over that at the
  training inputs, beside the same ratio under NUTS on the same model (NumPyro, the noise
  scale sampled under a HalfNormal(1) prior);
* the fraction of weights whose KL to the prior is below 0.05 nats.

Problems (data seed fixed, training seeds 0, 1, 2):

* ``demo``: the README demo's data, 500 points of sin(x) + N(0, 0.1²) on [-4,-1] ∪ [1,4],
  1-20-20-1 ReLU;
* ``wide``: 300 points on [-5,-1.5] ∪ [1.5,5], 1-20-20-1 ReLU (the case that collapsed);
* ``fewer``: 100 points on that range, 1-20-20-1 ReLU;
* ``twod``: 400 points of sin(x₁) + ½cos(x₂) + N(0, 0.1²) on [-3,3]² outside the disc of
  radius 1.5 (the probe), 2-20-20-1 ReLU;
* ``yacht``: UCI yacht, split 0 (standardized units), 6-50-1 ReLU, 2,000 epochs;
* ``tiny``: 80 points on [-4,-1] ∪ [1,4], 1-50-50-1 tanh: where the mean-field optimum is
  the prior (for the collapse warning and its remedies; not used to choose the default),
  with ``tiny_smallnet`` (1-10-10-1) and ``tiny_moredata`` (320 points) beside it.

Every run appends one JSON line to ``--out`` (runs already there are skipped, so the script
resumes); ``--table`` prints the markdown tables of ``docs/small_data.md`` from that file.

    python benchmarks/small_data.py --out small_data.jsonl [--problems wide demo] \
        [--candidates default beta1] [--init-scales 0.01 0.2] [--seeds 0 1 2]
    python benchmarks/small_data.py --out small_data.jsonl --nuts      # the NUTS references
    python benchmarks/small_data.py --out small_data.jsonl --table
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

from _common import add_run_arguments, markdown_table, run_missing, script_parser
from _small_data_runs import PROBLEMS, SETTINGS, run_candidate
from _small_data_scores import nuts_reference, score


def main(argv=None):
    parser = script_parser(__doc__)
    add_run_arguments(parser, "small_data.jsonl")
    parser.add_argument("--problems", nargs="+", default=["demo", "wide", "fewer", "twod", "yacht"])
    parser.add_argument("--candidates", nargs="+", default=["default"])
    parser.add_argument("--init-scales", nargs="+", type=float, default=[0.01, 0.2])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--uci", type=Path, default=SETTINGS["uci"], help="folder of the UCI sets")
    parser.add_argument("--epochs", type=int, help="override every problem's epochs (smoke test)")
    parser.add_argument("--nuts", action="store_true", help="run the NUTS references")
    args = parser.parse_args(argv)
    SETTINGS["uci"] = args.uci

    @functools.cache
    def problem(name):
        made = PROBLEMS[name]()
        if args.epochs:
            made.epochs = args.epochs
        return made

    def nuts(name):
        return {"key": [name, "nuts", None, None], **nuts_reference(problem(name))}

    def candidate(name, candidate, init_scale, seed):
        start = time.perf_counter()
        model, guide = run_candidate(candidate, problem(name), init_scale, seed)
        return {
            "key": [name, candidate, init_scale, seed],
            **score(problem(name), model, guide),
            "seconds": time.perf_counter() - start,
            "epochs": getattr(guide, "epochs_run", problem(name).epochs),
        }

    def runs():
        for name in args.problems:
            if args.nuts:
                yield {"key": [name, "nuts", None, None]}, functools.partial(nuts, name)
                continue
            for what in itertools.product(args.candidates, args.init_scales, args.seeds):
                run = functools.partial(candidate, name, *what)
                yield {"key": [name, *what]}, run

    run_missing(args, runs(), table=table, describe=json.dumps)


# ---------------------------------------------------------------------------------- table
def table(records: list[dict]) -> str:
    """The markdown tables: every (problem, candidate, σ₀) over its seeds, and NUTS."""
    runs: dict = {}
    nuts = {}
    for r in records:
        problem, candidate, init_scale, _ = r["key"]
        if candidate == "nuts":
            nuts[problem] = r
        else:
            runs.setdefault((problem, candidate, init_scale), []).append(r)
    best = {}
    for (problem, _, _), rs in runs.items():
        best[problem] = min([best.get(problem, math.inf)] + [r["rmse_train"] for r in rs])
    mean = statistics.fmean
    lines = []
    for (problem, candidate, init_scale), rs in sorted(runs.items()):
        losses = [r["loss1"] for r in rs]
        fitted = sum(r["rmse_train"] <= 2 * best[problem] for r in rs)
        lines.append((
            problem, candidate, f"{init_scale:g}", f"{fitted}/{len(rs)}",
            f"{statistics.median(losses):.0f} [{min(losses):.0f}, {max(losses):.0f}]",
            f"{mean(r['rmse_train'] for r in rs):.3f}", f"{mean(r['rmse_test'] for r in rs):.3f}",
            f"{mean(r['ll_test'] for r in rs):.2f}", f"{mean(r['gap_ratio'] for r in rs):.2f}",
            f"{mean(r['collapsed'] for r in rs):.2f}",
        ))  # fmt: skip
    header = ("problem", "candidate", "σ₀", "fitted", "β = 1 loss, median [range]",
              "train RMSE", "test RMSE", "test LL", "gap ratio", "at prior")  # fmt: skip
    text = markdown_table(header, lines, align="ll" + "r" * 8)
    if nuts:
        header = ("problem", "NUTS train RMSE", "test RMSE", "test LL", "noise", "gap ratio",
                  "divergences", "seconds")  # fmt: skip
        lines = [
            (problem, f"{r['rmse_train']:.3f}", f"{r['rmse_test']:.3f}", f"{r['ll_test']:.2f}",
             f"{r['noise']:.3f}", f"{r['gap_ratio']:.1f}", r["divergences"], f"{r['seconds']:.0f}")
            for problem, r in sorted(nuts.items())
        ]  # fmt: skip
        text += "\n\n" + markdown_table(header, lines, align="l" + "r" * 7)
    return text


if __name__ == "__main__":
    sys.exit(main())
