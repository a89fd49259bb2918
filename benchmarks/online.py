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
(one thread), ratios within one run. ``pyro_bbb.bench.online`` holds the protocol; the parts
live in the modules named for what they measure: ``_online_exact.py`` (exact),
``_online_cost.py`` (jacobian, large), ``_online_streams.py`` (regression, digits, deep) and
``_online_drift.py`` (drift).

    python benchmarks/online.py [--parts exact regression ...] [--seeds 5] [--out online_results]
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from _common import machine, save_report, script_parser
from _online_cost import part_jacobian, part_large
from _online_drift import part_drift
from _online_exact import part_exact
from _online_streams import part_deep, part_digits, part_regression

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
    parser = script_parser(__doc__)
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
        save_report(out, part, text, result)
        sections.append(text)
        print(text, flush=True)
    (out / "online.md").write_text("\n\n".join(sections))


if __name__ == "__main__":
    main()
