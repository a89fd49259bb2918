"""Data-parallel fit on CPUs (gloo): examples per second on 1 and 2 processes, and what a
checkpoint every epoch costs.

Each configuration runs ``pyro_bbb.fit`` in fresh processes on the 784-400-400-10 MLP
(``MeanFieldGuide``, Categorical likelihood, synthetic MNIST-shaped data), batch 128 per
process, ``--steps`` steps per epoch on every process (so ``N = 128 · W · steps``):

single
    ``fit`` in one plain process (no process group), one thread: the reference.
single, 2 threads
    The same with two intra-op threads: the other way to use two cores.
torchrun, W processes
    ``torchrun --standalone --nproc_per_node=W``, one thread each; ``fit`` trains
    data-parallel (gradients all-reduced every step).
single + checkpoint
    The reference with ``checkpoint_every=1``: the epoch's time includes writing the
    checkpoint (parameters, Adam's moments, History, random states; fsync'd).

Throughput is ``N`` over the median epoch's seconds, the first epoch left out (warm-up);
the time between the ends of consecutive epochs (checkpoint writes included) gives the
checkpoint's cost per epoch and per step. Configurations take turns ``--rounds`` times and
each row is the median over rounds, so load from elsewhere hits them alike.

    python benchmarks/ddp.py [--steps 20] [--epochs 4] [--rounds 3] [--processes 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from _common import in_fresh_process, machine, markdown_table, script_parser

BATCH = 128
SIZES = [784, 400, 400, 10]


def worker(args: argparse.Namespace) -> None:
    """One process of one configuration: fit, then rank 0 prints its result (JSON)."""
    import pyro
    import torch
    import torch.distributed as dist

    import pyro_bbb as bbb

    if "RANK" in os.environ:
        dist.init_process_group(backend="gloo")
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.set_num_threads(args.threads)
    num_data = BATCH * world_size * args.steps
    g = torch.Generator().manual_seed(0)
    x = torch.randn(num_data, SIZES[0], generator=g)
    y = torch.randint(0, SIZES[-1], (num_data,), generator=g)

    class EpochEnds(bbb.Callback):
        def on_fit_start(self, params, history):
            self.times = [time.perf_counter()]

        def on_epoch_end(self, epoch, history):
            self.times.append(time.perf_counter())

    pyro.clear_param_store()
    torch.manual_seed(0)
    model = bbb.BNN(bbb.mlp(SIZES), bbb.likelihoods.Categorical(), num_data=num_data)
    guide = bbb.MeanFieldGuide(model)
    ends = EpochEnds()
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = os.path.join(folder, "fit.pt") if args.checkpoint else None
        history = bbb.fit(
            model, guide, x, y, epochs=args.epochs, batch_size=BATCH, seed=0, progress=False,
            callbacks=[ends], checkpoint=checkpoint,
        )  # fmt: skip
        size = os.path.getsize(checkpoint) if checkpoint else 0
    if rank == 0:
        # between the ends of epochs k - 1 and k: epoch k and the checkpoint of epoch k - 1
        # (a callback runs before its epoch's checkpoint is written)
        intervals = [b - a for a, b in zip(ends.times[1:], ends.times[2:], strict=False)]
        result = {
            "world_size": world_size,
            "num_data": num_data,
            "epoch_seconds": statistics.median(history.seconds[1:]),
            "interval_seconds": statistics.median(intervals),
            "checkpoint_bytes": size,
        }
        print(json.dumps(result), flush=True)
    if dist.is_initialized():
        dist.barrier()  # tear down together, as examples/ddp.py explains
        dist.destroy_process_group()


def launch(args: argparse.Namespace, processes: int | None, *extra: str) -> dict:
    """Run one configuration in fresh processes; ``processes=None`` runs it without torchrun."""
    options = ["--worker", "--steps", str(args.steps), "--epochs", str(args.epochs), *extra]
    prefix = [sys.executable]
    if processes is not None:
        prefix += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return in_fresh_process([*prefix, __file__, *options], env=env, timeout=1800)


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch and process")
    parser.add_argument("--epochs", type=int, default=4, help="epochs; the first is warm-up")
    parser.add_argument("--rounds", type=int, default=3, help="turns of every configuration")
    parser.add_argument("--processes", default="1,2", help="torchrun sizes, comma-separated")
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first is warm-up)")

    configs = {"single": (None, ()), "single, 2 threads": (None, ("--threads", "2"))}
    for k in (int(p) for p in args.processes.split(",")):
        configs[f"torchrun, {k} process{'es' if k > 1 else ''}"] = (k, ())
    configs["single + checkpoint every epoch"] = (None, ("--checkpoint",))
    results: dict[str, list[dict]] = {name: [] for name in configs}
    for round_ in range(args.rounds):
        for name, (processes, extra) in configs.items():
            results[name].append(launch(args, processes, *extra))
            print(f"round {round_ + 1}/{args.rounds}: {name} done", file=sys.stderr, flush=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    reference = median("single", "num_data") / median("single", "epoch_seconds")
    print(f"\n{machine()}, {os.cpu_count()} CPUs; {'-'.join(map(str, SIZES))} MLP, MeanFieldGuide")
    print(f"batch {BATCH} per process, {args.steps} steps per epoch and process, median of")
    print(f"epochs 2..{args.epochs} and of {args.rounds} round(s)\n")
    rates = {
        name: median(name, "num_data") / median(name, "epoch_seconds")
        for name in configs
        if "checkpoint" not in name
    }
    lines = [(name, f"{rate:,.0f}", f"{rate / reference:.2f}x") for name, rate in rates.items()]
    print(markdown_table(("configuration", "examples/s", "vs single"), lines, align="lrr"))
    plain = median("single", "interval_seconds")
    saved = median("single + checkpoint every epoch", "interval_seconds")
    size = median("single + checkpoint every epoch", "checkpoint_bytes")
    print(
        f"\ncheckpoint every epoch ({size / 2**20:.1f} MiB): {1e3 * (saved - plain):.0f} ms per "
        f"epoch, {1e3 * (saved - plain) / args.steps:.2f} ms per step "
        f"({100 * (saved / plain - 1):+.1f}% of an epoch of {args.steps} steps)"
    )


if __name__ == "__main__":
    main()
