"""A real network's posterior exported, summarised and predicted: time and peak memory.

The 784-400-400-10 Fashion-MNIST BNN (478,410 weights, MeanFieldGuide) fitted for
``--epochs`` epochs at batch 128, then, each in a fresh process (so that its peak memory is
its own): one layer exported to ArviZ at 4 x 125 draws (posterior only, in memory and into
a file with ``path=``, and with the data groups on 1,000 test images); the network's summary
by site; the whole network's export at the defaults on the 10,000 test images (refused above
1 GB before anything is drawn; into a file with ``path=``; with ``--whole`` also built in
memory, ``max_bytes=None``) and on 1,000 (under the limit: built);
``az.summary`` of a few units and of the output layer; and ``predict`` at 50 draws with a
LeNet-5 BNN (``bayesianize`` of the LeNet-5 of ``benchmarks/images.py``) on 500 to 10,000
test images.

CPU seconds are the process's (``time.process_time``); memory is the peak resident set
above what the process held just before the call (``/proc/self/status`` VmHWM, reset by
``/proc/self/clear_refs``), in MB. One thread (``OMP_NUM_THREADS=1``).

    python benchmarks/export.py                    # about 2 CPU minutes
    python benchmarks/export.py --epochs 0         # the guide at its initial parameters
    python benchmarks/export.py --whole            # and the whole export: 3 CPU minutes
    python benchmarks/export.py --cases layer,layer_file   # only these
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pyro
import torch
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.data.idx import FASHION_MNIST, image_folder

LAYER = "2"  # 400 x 400 + 400 = 160,400 weights
SMALL_LAYER = "4"  # 400 x 10 + 10 = 4,010 weights


def memory_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measured(call):
    """``call()``'s result, CPU and wall seconds, and its peak memory above the start (MB)."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = memory_mb("VmRSS")
    cpu, wall = time.process_time(), time.perf_counter()
    result = call()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return result, {"cpu_s": cpu, "wall_s": wall, "peak_mb": memory_mb("VmHWM") - before}


def mlp_model():
    model = bbb.BNN(bbb.mlp([784, 400, 400, 10]), bbb.likelihoods.Categorical(), num_data=60000)
    return model, bbb.MeanFieldGuide(model)


def lenet5() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
    )  # fmt: skip


def fitted_state(args, path: Path) -> None:
    """Fit the MLP BNN for ``--epochs`` epochs (or not at all) and save it."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model, guide = mlp_model()
    train = image_folder(args.data, "train")
    if args.epochs:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bbb.fit(model, guide, train.x, train.y, epochs=args.epochs, batch_size=128,
                    seed=0, progress=False)  # fmt: skip
    else:
        guide(train.x[:2], train.y[:2])
    bbb.save(path, model, guide)


def child(case: str, args) -> dict:
    """One measurement, in this (fresh) process."""
    import arviz as az

    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    test = image_folder(args.data, "test", flatten=not case.startswith("predict"))
    if case.startswith("predict"):
        n = int(case.split("_")[1])
        model = bbb.BNN(bbb.bayesianize(lenet5(), bbb.priors.Gaussian(1.0)),
                        bbb.likelihoods.Categorical(), num_data=60000)  # fmt: skip
        guide = bbb.MeanFieldGuide(model)
        guide(test.x[:2], test.y[:2])
        x = test.x[:n]
        pred, stats = measured(lambda: bbb.predict(model, guide, x, num_samples=50, seed=0))
        error = 1 - bbb.metrics.accuracy(pred.probs, test.y[:n])
        return stats | {"note": f"{n:,} images, 50 draws, test error {error:.3f} (untrained)"}
    model, guide = mlp_model()
    bbb.load(args.state, model, guide)
    guide.fit_until = None  # the warning about the run's end is not what is measured here
    x, y = test.x, test.y
    off = {"log_likelihood": False, "posterior_predictive": False}
    if case == "layer":
        data, stats = measured(lambda: bbb.to_inference_data(
            model, guide, x, y, var_names=LAYER, seed=0, **off))  # fmt: skip
        return stats | {"note": f"var_names={LAYER!r}: {_shape(data)}, posterior only"}
    if case == "layer_file":
        path = Path(args.state).with_name("layer.nc")
        data, stats = measured(lambda: bbb.to_inference_data(
            model, guide, x, y, var_names=LAYER, seed=0, path=path, **off))  # fmt: skip
        size = path.stat().st_size / 1e6
        return stats | {"note": f"var_names={LAYER!r}, path=: {_shape(data)}, a {size:.0f} MB file"}
    if case == "small_layer":
        data, stats = measured(lambda: bbb.to_inference_data(
            model, guide, x, y, var_names=SMALL_LAYER, seed=0, **off))  # fmt: skip
        return stats | {"note": f"var_names={SMALL_LAYER!r}: {_shape(data)}, posterior only"}
    if case == "small_layer_data":
        data, stats = measured(lambda: bbb.to_inference_data(
            model, guide, x[:1000], y[:1000], var_names=SMALL_LAYER, seed=0))  # fmt: skip
        groups = ", ".join(g for g in data.groups() if g != "posterior")
        return stats | {"note": f"var_names={SMALL_LAYER!r} and {groups} on 1,000 rows"}
    if case == "summary":
        table, stats = measured(lambda: bbb.posterior_summary(model, guide, x[:8]))
        print(table.to_string(float_format=lambda v: f"{v:.4g}"), file=sys.stderr)
        return stats | {"note": f"{len(table)} rows, {int(table['weights'].sum()):,} weights"}
    if case == "whole_default":

        def refused():
            try:
                bbb.to_inference_data(model, guide, x, y)
            except ValueError as error:
                return str(error)

        message, stats = measured(refused)
        return stats | {"note": "defaults, 10,000 rows: " + message[: message.index("(")].strip()}
    if case == "whole_1000":
        data, stats = measured(lambda: bbb.to_inference_data(model, guide, x[:1000], y[:1000]))
        return stats | {"note": f"defaults, 1,000 rows: {_shape(data)} and the data groups"}
    if case == "whole":
        data, stats = measured(lambda: bbb.to_inference_data(model, guide, x, y, max_bytes=None))
        return stats | {"note": f"max_bytes=None, 10,000 rows: {_shape(data)}, data groups"}
    if case == "whole_file":
        path = Path(args.state).with_name("whole.nc")
        data, stats = measured(lambda: bbb.to_inference_data(model, guide, x, y, path=path))
        size = path.stat().st_size / 1e6
        return stats | {
            "note": f"defaults, path=, 10,000 rows: {_shape(data)}, a {size:.0f} MB file"
        }
    if case == "az_summary_units":
        data = bbb.to_inference_data(model, guide, x, y, var_names=LAYER,
                                     coords={f"{LAYER}.out": [0, 1]}, seed=0, **off)  # fmt: skip
        table, stats = measured(lambda: az.summary(data))
        return stats | {"note": f"az.summary of 2 units of layer {LAYER!r}: {len(table)} rows"}
    if case == "az_summary_stats":
        data = bbb.to_inference_data(model, guide, x, y, var_names=SMALL_LAYER, seed=0, **off)
        table, stats = measured(lambda: az.summary(data, kind="stats"))
        note = f"az.summary(kind='stats') of layer {SMALL_LAYER!r}: {len(table)} rows"
        return stats | {"note": note}
    if case == "az_summary_layer":
        data = bbb.to_inference_data(model, guide, x, y, var_names=SMALL_LAYER, seed=0, **off)
        table, stats = measured(lambda: az.summary(data))
        return stats | {"note": f"az.summary of layer {SMALL_LAYER!r}: {len(table)} rows"}
    raise ValueError(f"unknown case {case!r}")


def _shape(data) -> str:
    sizes = {k: v for k, v in data.posterior.sizes.items() if k in ("chain", "draw")}
    values = sum(v.size for v in data.posterior.data_vars.values())
    return f"{sizes['chain']} x {sizes['draw']} draws, {values * 4 / 1e6:.0f} MB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=FASHION_MNIST, help="Fashion-MNIST idx folder")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the fit (0: none)")
    parser.add_argument("--whole", action="store_true", help="also build the whole export")
    parser.add_argument("--images", default="500,1000,2000,10000", help="predict's images")
    parser.add_argument("--cases", help="only these cases (comma-separated)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    cases = ["small_layer", "layer", "layer_file", "small_layer_data", "summary"]
    cases += ["whole_default", "whole_1000", "whole_file"] + ["whole"] * args.whole
    cases += ["az_summary_units", "az_summary_stats", "az_summary_layer"]
    cases += [f"predict_{n}" for n in args.images.split(",") if n]
    if args.cases:
        cases = [case for case in cases if case in args.cases.split(",")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryDirectory() as folder:
        state = Path(folder) / "mlp.pt"
        start = time.process_time()
        fitted_state(args, state)
        print(f"784-400-400-10 MeanFieldGuide, {args.epochs} epochs of fit "
              f"({time.process_time() - start:.0f} CPU s); torch {torch.__version__}, "
              f"pyro {pyro.__version__}, 1 thread\n")  # fmt: skip
        print("| case | CPU s | wall s | peak MB above | what |")
        print("| --- | ---: | ---: | ---: | --- |")
        for case in cases:
            command = [sys.executable, __file__, "--child", case, "--state", str(state),
                       "--data", str(args.data)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode:
                print(f"| {case} | | | | failed: {done.stderr.strip().splitlines()[-1]} |")
                continue
            if case == "summary":
                print(done.stderr, file=sys.stderr)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"| {case} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} | {r['peak_mb']:.0f} | "
                  f"{r['note']} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
