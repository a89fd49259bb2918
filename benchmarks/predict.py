"""Prediction: ``pyro_bbb.predict`` (vectorised over weight samples) against loops.

For S weight samples at a batch of B inputs, each row computes the predictive's per-sample
parameters (the network's output for every sample and input):

predict
    ``pyro_bbb.predict(model, guide, x, num_samples=S)``: one guide pass under a sample
    plate draws S weights at once, one model pass evaluates them as batched products.
predict, local
    The same with ``reparam="local"``: exact per-point marginals for an MLP, and the first
    layer's products are computed once instead of S times.
loop
    S iterations of: trace the guide (one draw), replay the model on ``x``. This is what
    ``predict`` does, one sample at a time.
Predictive(parallel=False)
    Pyro's ``Predictive``, which loops over samples the same way.
matmul floor
    The bare floating-point work of the S forward passes (``torch.baddbmm`` of the drawn
    weights, ReLUs), no Pyro and no sampling: the least any implementation can cost.

Ratios are to the loop, measured in the same run (configurations take turns). The
mean-field guide is at its initialisation; its values do not change the cost.

    python benchmarks/predict.py [--nets large,small] [--samples 100] [--batch 1000]
        [--repeats 5] [--threads 1] [--device cpu|cuda]
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pyro
import pyro.poutine as poutine
import torch
from _common import interleaved, machine, markdown_table, script_parser
from pyro.infer import Predictive

import pyro_bbb

SIZES = {"large": [784, 400, 400, 10], "small": [1, 50, 50, 1]}


def build(sizes: list[int], device: torch.device):
    task_likelihood = (
        pyro_bbb.likelihoods.Categorical()
        if sizes[-1] > 1
        else pyro_bbb.likelihoods.Gaussian(scale=0.1)
    )
    model = pyro_bbb.BNN(pyro_bbb.mlp(sizes), task_likelihood, num_data=60000).to(device)
    guide = pyro_bbb.MeanFieldGuide(model, name=f"guide-{sizes[0]}")
    x = torch.rand(8, sizes[0], device=device)
    guide(x)  # create the parameters
    return model, guide


def runners(model, guide, x: torch.Tensor, samples: int) -> dict[str, Callable[[], object]]:
    def vectorised():
        return pyro_bbb.predict(model, guide, x, num_samples=samples)

    def vectorised_local():
        return pyro_bbb.predict(model, guide, x, num_samples=samples, reparam="local")

    def loop():
        outputs = []
        with pyro.validation_enabled(False), torch.no_grad():
            for _ in range(samples):
                guide_trace = poutine.trace(guide).get_trace(x)
                trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x)
                outputs.append(trace.nodes["obs"]["fn"])
        return outputs

    predictive = Predictive(model, guide=guide, num_samples=samples, return_sites=["obs"])

    def pyro_predictive():
        with pyro.validation_enabled(False), torch.no_grad():
            return predictive(x)

    weights = [
        (loc.expand(samples, *loc.shape).contiguous(), bias.expand(samples, *bias.shape))
        for loc, bias in _layer_locs(guide)
    ]

    def floor():
        with torch.no_grad():
            h = x.expand(samples, *x.shape)
            for i, (w, b) in enumerate(weights):
                h = torch.baddbmm(b.unsqueeze(1), h, w.mT)
                if i < len(weights) - 1:
                    h = h.relu()
            return h

    return {
        "loop of forward passes": loop,
        "pyro_bbb.predict": vectorised,
        "pyro_bbb.predict, reparam='local'": vectorised_local,
        "Predictive(parallel=False)": pyro_predictive,
        "matmul floor (no Pyro, no sampling)": floor,
    }


def _layer_locs(guide) -> list[tuple[torch.Tensor, torch.Tensor]]:
    medians = guide.median()
    layers = sorted({name.rsplit(".", 1)[0] for name in medians}, key=int)
    return [(medians[f"{layer}.weight"], medians[f"{layer}.bias"]) for layer in layers]


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--nets", default="large,small")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        help="cpu: the process's CPU time (default on CPU, immune to time spent descheduled "
        "on a shared machine); wall: elapsed time (default, and needed, on CUDA)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pyro.set_rng_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    args.clock = args.clock or ("wall" if device.type == "cuda" else "cpu")
    if args.clock == "cpu" and device.type == "cuda":
        parser.error("--clock cpu does not see the GPU's time; use --clock wall with cuda")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({machine()})"

    print(
        f"# Prediction with S = {args.samples} weight samples at a batch of {args.batch}\n\n"
        f"median of {args.repeats} repeats ({args.clock} time), configurations taking turns; torch "
        f"{torch.__version__}, pyro {pyro.__version__}, {where}, {args.threads} thread(s)\n"
    )
    for name in args.nets.split(","):
        sizes = SIZES[name]
        model, guide = build(sizes, device)
        x = torch.rand(args.batch, sizes[0], device=device)
        runs = runners(model, guide, x, args.samples)
        medians = interleaved(runs, args.repeats, clock=clock, sync=sync)
        loop = medians["loop of forward passes"]
        print(f"## {'-'.join(map(str, sizes))}\n")
        lines = [
            (label, f"{1e3 * seconds:.1f}", f"{loop / seconds:.1f}×")
            for label, seconds in medians.items()
        ]
        print(markdown_table(("configuration", "ms", "speed-up over the loop"), lines, align="lrr"))
        print()


if __name__ == "__main__":
    main()
