"""Time and memory of one training step: pyro_bbb against a hand-written PyTorch loop.

Every row is the median time of one optimiser step (draw, loss, backward, update) as a ratio
to the reference measured in the same run:

reference
    Hand-written PyTorch Bayes by Backprop: μ/ρ tensors per layer, σ = softplus(ρ), one
    weight sample per step, the closed-form Gaussian KL to the N(0, 1) prior, the
    minibatch log-likelihood scaled by N/B, one ``torch.optim.Adam`` over all tensors with
    the implementation ``pyro_bbb.fit`` picks by default (fused). Rows for the same loop
    with local reparameterisation and with Adam's default (per-tensor) implementation.
pyro_bbb fit
    ``pyro_bbb.fit`` itself on a ``BNN`` (Gaussian likelihood with a fixed noise scale 0.1,
    or Categorical) with ``MeanFieldGuide`` (plain, ``reparam="local"``, ``"flipout"``) and
    ``LowRankGuide(rank=4)``. Each step is timed from inside ``fit`` by a callback (the
    interval between consecutive backward passes, which spans exactly one step of the loop).
pyro_bbb fit, ensembles
    ``fit`` with an ``Ensemble`` of ``K`` = 1 and 5 members of those guides, one vectorised
    step for all members: the row over ``K`` is the cost per member.
pyro_bbb under SVI
    The same model and guide with ``AnnealedELBO`` under ``pyro.infer.SVI`` and
    ``pyro.optim.Adam``: Pyro semantics are kept, this is what they cost there.
Pyro AutoNormal
    ``AutoNormal`` + ``Trace_ELBO`` + ``SVI`` on the same ``BNN``, Pyro's defaults.

Configurations take turns, ``--steps`` steps at a time, so load from elsewhere on a shared
machine hits them alike. On glibc the timing process keeps the memory it frees for every
configuration (``pyro_bbb._heap.kept_heap`` around the whole timing, with
``PYRO_BBB_KEEP_HEAP=1`` so that ``fit`` keeps it too; ``--no-steady-heap`` leaves the
allocator alone, as ``fit`` does by default): otherwise a configuration whose frees happen
to land at the top of the heap pays a page fault per 4 KiB every step, a matter of the
process's history rather than of the step.

On CUDA (``--device cuda``) two more rows: the reference captured whole in one CUDA graph
(PyTorch's recipe: static input buffers, Adam with ``capturable=True`` and its rate in a
tensor, three warm-up steps on a side stream), the floor for a launch-bound step; and
``fit`` with ``cuda_graph=False``, its eager step. The other ``fit`` rows run as ``fit``
runs by default there, captured. A captured step cannot call a callback between backward
pass and update, so on CUDA the ``fit`` rows are timed from ``History.seconds``: whole
epochs (the first, which sets up the capture, left out), divided by their steps.

Memory: each configuration runs again in a fresh process, and the step's memory is the peak
resident set (CUDA: peak allocated) during its first ``--memory-steps`` steps above what the
process held just before the first step (model, data, parameters): gradients, optimiser
state, activations and temporaries. On the CPU that process runs with glibc returning freed
blocks of 64 KiB or more to the OS at once, so the resident set follows the live tensors.

Nets: ``small`` 1-50-50-1 regression (N=1000, batch 100); ``large`` 784-400-400-10
classification (N=60000, batch 128); with ``--throughput``: ``wide`` 784-1200-1200-10
(batch 1024) and ``conv``, a small ConvNet on 28x28 images (batch 256), in examples/s.
Networks as users write them (``--nets resnet,lstm``): ``resnet``, torchvision's ResNet-18
(its 7x7 stem, max-pool and four stages of two ``BasicBlock``) at 16 to 128 channels, on 32x32
images (batch 64; 703,386 parameters in 62 tensors, BatchNorm's included), and ``lstm``, an
``nn.LSTM(8, 32)`` read at ``out[:, -1]`` (batch 64 sequences of 32 steps). There the
reference is the deterministic network's own training step (the same loss with the weights
as point estimates, fused Adam). Beside it: a hand-written Bayes by Backprop step over every
parameter of the same network (μ and ρ per tensor, each drawn and passed in through
``torch.func.functional_call``, the closed-form KL to N(0, 1), fused Adam), the naive step a
user would write; bayesian-torch's ``dnn_to_bnn`` on the same network when that package is
installed (``pip install --no-deps bayesian-torch``: its convolutions, linear layers and LSTMs
made Bayesian, BatchNorm kept deterministic, ``get_kl_loss``); and the ``Ensemble(k=2)`` row,
two weight draws a step, run once per draw around the network.

    python benchmarks/steptime.py [--nets small,large] [--threads 1] [--device cpu|cuda]
        [--steps 10] [--rounds 8] [--memory/--no-memory] [--throughput] [--only LABELS]
        [--steady-heap/--no-steady-heap]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import pyro
import torch
from _common import machine
from _steptime_problems import CLOCK, NETS, Net
from _steptime_references import (
    BarePyro,
    BayesianTorch,
    CapturedReference,
    Deterministic,
    EveryParameterBBB,
    Reference,
    has_bayesian_torch,
)
from _steptime_runners import FitEpochs, FitSteps, LoopSteps, svi_steps

from pyro_bbb._heap import ENVIRONMENT_VARIABLE, kept_heap

#: Members of the ensemble rows (an Ensemble of 1 is the guide alone, in the member plate).
ENSEMBLE_SIZES = (1, 5)


def configurations(net: Net, device: torch.device, x, y, fused: bool) -> dict[str, Callable]:
    """Label -> runner; the first is the reference every ratio is taken against."""
    conv = net.label == "conv"
    cuda = device.type == "cuda"
    fit_steps = FitEpochs if cuda else FitSteps  # a captured step calls no callback
    configs: dict[str, Callable] = {}
    if net.user_written:
        configs["deterministic network (its own training step)"] = LoopSteps(
            net, x, y, Deterministic(net, device, fused).step
        )
        configs["hand-written BBB of every parameter (functional_call)"] = LoopSteps(
            net, x, y, EveryParameterBBB(net, device, fused).step
        )
        if has_bayesian_torch():
            configs["bayesian-torch dnn_to_bnn (BatchNorm deterministic)"] = LoopSteps(
                net, x, y, BayesianTorch(net, device, fused).step
            )
        for reparam in (None, "local"):
            label = f"fit, MeanFieldGuide, reparam={reparam!r}"
            configs[label] = fit_steps(net, x, y, device, "meanfield", reparam)
        configs["fit, Ensemble(MeanFieldGuide, k=2), reparam=None"] = fit_steps(
            net, x, y, device, "meanfield", None, members=2
        )
        return configs
    configs["reference (hand-written PyTorch BBB)"] = LoopSteps(
        net, x, y, Reference(net, device, local=False, fused=fused).step
    )
    configs["reference + local reparameterisation"] = LoopSteps(
        net, x, y, Reference(net, device, local=True, fused=fused).step
    )
    if fused:
        configs["reference, Adam's default implementation"] = LoopSteps(
            net, x, y, Reference(net, device, local=False, fused=False).step
        )
    if cuda:
        configs["reference captured in one CUDA graph"] = LoopSteps(
            net, x, y, CapturedReference(net, device).step
        )
        configs["reference + local, captured in one CUDA graph"] = LoopSteps(
            net, x, y, CapturedReference(net, device, local=True).step
        )
    if not conv:
        configs["bare Pyro program (the floor of Pyro semantics)"] = LoopSteps(
            net, x, y, BarePyro(net, device, fused).step
        )
    if cuda:
        label = "fit, MeanFieldGuide, reparam=None, cuda_graph=False (eager)"
        configs[label] = FitEpochs(net, x, y, device, "meanfield", None, cuda_graph=False)
    for reparam in (None, "local", "flipout"):
        label = f"fit, MeanFieldGuide, reparam={reparam!r}"
        configs[label] = fit_steps(net, x, y, device, "meanfield", reparam)
    if not conv:
        for reparam in (None, "local"):
            label = f"fit, LowRankGuide(rank=4), reparam={reparam!r}"
            configs[label] = fit_steps(net, x, y, device, "lowrank", reparam)
        for k in ENSEMBLE_SIZES:
            for guide, reparam in (("meanfield", None), ("meanfield", "local"), ("lowrank", None)):
                family = "MeanFieldGuide" if guide == "meanfield" else "LowRankGuide(rank=4)"
                label = f"fit, Ensemble({family}, k={k}), reparam={reparam!r}"
                configs[label] = fit_steps(net, x, y, device, guide, reparam, members=k)
        configs["SVI + AnnealedELBO + MeanFieldGuide"] = svi_steps(net, x, y, device, "mf")
        configs["SVI + Trace_ELBO + AutoNormal (Pyro)"] = svi_steps(net, x, y, device, "autonormal")
    return configs


def only(configs: dict[str, Callable], patterns: str | None) -> dict[str, Callable]:
    """The reference and the configurations whose label contains one of ``patterns``."""
    if not patterns:
        return configs
    wanted = [p for p in patterns.split("|") if p]
    labels = list(configs)
    keep = [labels[0], *(k for k in labels[1:] if any(p in k for p in wanted))]
    return {label: configs[label] for label in keep}


# ----------------------------------------------------------------------------- measuring
DEVICE = torch.device("cpu")


def fused_default(device: torch.device) -> bool:
    """Whether fit's default Adam is the fused one here (see pyro_bbb.training.optimizers)."""
    return device.type in ("cpu", "cuda")


def time_steps(configs: dict[str, Callable], steps: int, rounds: int) -> dict[str, float]:
    """Median seconds per step; configurations take turns, ``steps`` at a time."""
    samples: dict[str, list[float]] = {label: [] for label in configs}
    for run in configs.values():
        run(2)  # warm-up: parameters, optimiser state, allocator
    for _ in range(rounds):
        for label, run in configs.items():
            samples[label] += run(steps)
    return {label: statistics.median(values) for label, values in samples.items()}


class _Memory:
    """Peak memory above a baseline taken when ``reset`` is called."""

    def __init__(self) -> None:
        self.baseline = 0

    @staticmethod
    def _rss_kib(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
        raise RuntimeError(f"no {field} in /proc/self/status")

    def reset(self) -> None:
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.baseline = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets the peak resident set (VmHWM) to the current one
            self.baseline = self._rss_kib("VmRSS:") * 1024

    def peak_above_baseline(self) -> int:
        if DEVICE.type == "cuda":
            return torch.cuda.max_memory_allocated() - self.baseline
        return self._rss_kib("VmHWM:") * 1024 - self.baseline


def memory_of(net_name: str, label: str, steps: int) -> float:
    """MiB of one configuration's steps, in this (fresh) process."""
    net = NETS[net_name]
    x, y = net.data(DEVICE)
    configs = configurations(net, DEVICE, x, y, fused_default(DEVICE))
    # Warm the process up with a throwaway step of the same shapes, so one-time set-up
    # (autograd engine, BLAS buffers) is charged to no configuration.
    throwaway = Reference(net, DEVICE, local=False, fused=False)
    throwaway.step(x[: net.batch], y[: net.batch])
    del throwaway
    meter = _Memory()
    configs[label](steps, meter.reset)
    return meter.peak_above_baseline() / 2**20


def memory_in_subprocess(net_name: str, label: str, args) -> float:
    command = [sys.executable, __file__, "--memory-of", net_name, label,
               "--device", str(DEVICE), "--threads", str(args.threads),
               "--memory-steps", str(args.memory_steps)]  # fmt: skip
    # glibc then hands every block of 64 KiB or more back to the OS when it is freed, so the
    # resident set follows the live tensors instead of the allocator's high-water mark.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])["mib"]


# ----------------------------------------------------------------------------- report
def step_table(args) -> None:
    nets = [NETS[name] for name in args.nets.split(",")]
    fused = fused_default(DEVICE)
    results: list[tuple[Net, dict[str, float], dict[str, float]]] = []
    for net in nets:
        pyro.clear_param_store()
        pyro.set_rng_seed(args.seed)
        x, y = net.data(DEVICE)
        configs = only(configurations(net, DEVICE, x, y, fused), args.only)
        medians = time_steps(configs, args.steps, args.rounds)
        memory = {}
        if args.memory:
            name = net_name_of(net)
            memory = {label: memory_in_subprocess(name, label, args) for label in configs}
        results.append((net, medians, memory))
        del configs, x, y

    print(
        f"# Time per training step, ratio to the hand-written reference\n\n"
        f"median over {args.rounds} rounds of {args.steps} steps ({args.clock} time), "
        f"configurations taking turns; "
        f"torch {torch.__version__}, pyro {pyro.__version__}, device {describe(DEVICE)}, "
        f"{args.threads} thread(s), {args.heap}\n"
    )
    for net, medians, memory in results:
        labels = list(medians)
        ref = medians[labels[0]]
        print(f"## {net.label}, batch {net.batch}, N = {net.num_data}\n")
        header = "| step | ms | ratio |" + (" step memory (MiB) | memory ratio |" if memory else "")
        print(header)
        print("| --- | ---: | ---: |" + (" ---: | ---: |" if memory else ""))
        for label in labels:
            row = f"| {label} | {1e3 * medians[label]:.2f} | {medians[label] / ref:.2f}× |"
            if memory:
                row += f" {memory[label]:.1f} | {memory[label] / memory[labels[0]]:.2f}× |"
            print(row)
        print()


def net_name_of(net: Net) -> str:
    return next(name for name, candidate in NETS.items() if candidate is net)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({machine()})"


def throughput_table(args) -> None:
    print("# Throughput, examples per second (median step)\n")
    print("| net | batch | configuration | examples/s | ratio to reference |")
    print("| --- | ---: | --- | ---: | ---: |")
    for name in ("wide", "conv"):
        net = NETS[name]
        pyro.clear_param_store()
        x, y = net.data(DEVICE)
        configs = only(configurations(net, DEVICE, x, y, fused_default(DEVICE)), args.only)
        keep = [label for label in configs if "LowRank" not in label and "SVI" not in label]
        medians = time_steps({k: configs[k] for k in keep}, args.steps, max(2, args.rounds // 2))
        ref = medians[keep[0]]
        for label in keep:
            rate, ratio = net.batch / medians[label], ref / medians[label]
            print(f"| {net.label} | {net.batch} | {label} | {rate:,.0f} | {ratio:.2f}× |")
        del configs, x, y
    print()


def main() -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nets", default="small,large", help="comma-separated: small,large,resnet,lstm"
    )
    parser.add_argument("--steps", type=int, default=10, help="steps per turn")
    parser.add_argument("--rounds", type=int, default=8, help="turns per configuration")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--memory-steps", type=int, default=5)
    parser.add_argument(
        "--only",
        help="substrings separated by |: time only the configurations whose label holds one "
        "(the reference is always kept), e.g. --only 'LowRankGuide(rank=4), reparam|bare'",
    )
    parser.add_argument("--throughput", action="store_true", help="add the wide MLP and ConvNet")
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        help="cpu: the process's CPU time (default on CPU, immune to time spent descheduled "
        "on a shared machine); wall: elapsed time (default, and needed, on CUDA)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--steady-heap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep glibc's freed memory for every configuration, fit's steps included "
        "(default; sets PYRO_BBB_KEEP_HEAP=1 unless given), so page faults that depend on the "
        "heap's layout fall on none",
    )
    parser.add_argument("--memory-of", nargs=2, metavar=("NET", "LABEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    args.clock = args.clock or ("wall" if DEVICE.type == "cuda" else "cpu")
    if args.clock == "cpu" and DEVICE.type == "cuda":
        parser.error("--clock cpu does not see the GPU's time; use --clock wall with cuda")
    CLOCK.device = DEVICE
    CLOCK.now = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.memory_of:
        pyro.set_rng_seed(args.seed)
        print(json.dumps({"mib": memory_of(*args.memory_of, args.memory_steps)}))
        return
    start = time.perf_counter()
    steady = args.steady_heap and DEVICE.type == "cpu"
    if steady:
        os.environ.setdefault(ENVIRONMENT_VARIABLE, "1")  # fit's steps keep it too
    with kept_heap(steady) as held:
        args.heap = (
            "glibc heap kept for every configuration (kept_heap, PYRO_BBB_KEEP_HEAP=1)"
            if held
            else "the allocator's defaults"
        )
        step_table(args)
        if args.throughput:
            throughput_table(args)
    print(f"(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
