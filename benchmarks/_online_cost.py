"""``benchmarks/online.py --parts jacobian large``: what an update costs.

* ``jacobian``: how to take the network's Jacobian (per-row reverse mode, whole-batch reverse
  mode, forward mode) on three networks, against one forward and backward pass;
* ``large``: one LoFi update of a 784-400-400-10 network (rank 10, minibatch 10): time and
  peak memory against one ``fit`` step, each in a fresh process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyro
import torch
from _common import in_fresh_process, markdown_table, median_time
from _online_streams import BATCH
from torch.func import jacfwd, jacrev

import pyro_bbb as bbb
from pyro_bbb.online.network import network_function, outputs_and_jacobian, weight_layout


# -------------------------------------------------------------------------- jacobian
def timed(fn, repeats):
    """The median milliseconds of ``fn`` over ``repeats`` calls, after one."""
    return median_time(fn, repeats) * 1e3


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
    table = markdown_table(
        ("network", "weights", "outputs", "forward + backward", "per-row reverse (used)",
         "whole-batch reverse", "forward mode"),
        [
            (r["network"], f"{r['d']:,}", r["outputs"], f"{r['forward_backward_ms']:.1f}",
             f"{r['per_row_reverse_ms']:.1f}", f"{r['batch_reverse_ms']:.1f}",
             f"{r['forward_mode_ms']:.1f}" if "forward_mode_ms" in r else "—")
            for r in rows
        ],
        align="l" * 7,
    )  # fmt: skip
    text = "### The network's Jacobian, minibatch of 10 (median ms, one thread)\n\n" + table
    return rows, text


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
        results[kind] = in_fresh_process([sys.executable, "-c", LARGE_SCRIPT, kind], env=env)
        print(f"  large {kind}: {results[kind]}", flush=True)
    fit_ms = results["fit"]["ms"]
    d = results["lofi"]["d"]
    table = markdown_table(
        ("step", "ms", "× fit step", "peak extra memory (MB)"),
        [
            ("fit step, MeanFieldGuide", f"{fit_ms:.1f}", "1.0",
             f"{results['fit']['peak_mb']:.0f}"),
            ("fit step, DeltaGuide (Adam)", f"{results['adam']['ms']:.1f}",
             f"{results['adam']['ms'] / fit_ms:.1f}", f"{results['adam']['peak_mb']:.0f}"),
            ("LoFi update, rank 10", f"{results['lofi']['ms']:.0f}",
             f"{results['lofi']['ms'] / fit_ms:.0f}", f"{results['lofi']['peak_mb']:.0f}"),
        ],
        align="llll",
    )  # fmt: skip
    lines = [
        f"### A 784-400-400-10 network (d = {d:,} weights), minibatch of 10",
        "",
        "Median wall time per step over 11 steps after 2 warm-up steps, one thread, each in a "
        "fresh process; peak memory is the rise of the process's peak resident set over the "
        "steps (Linux VmHWM, reset after the warm-up).",
        "",
        table,
        "",
        f"LoFi's belief holds {results['lofi']['state_mb']:.0f} MB (d × (rank + 2) floats); "
        "R-VGA's full covariance would hold d² floats, {:,.0f} GB.".format(d * d * 4 / 2**30),
    ]
    return results, "\n".join(lines)
