"""A user's view of fit's step: whole epochs of ``fit`` against the same network's own loop.

A second harness beside ``benchmarks/steptime.py``, written apart from it: it shares only the
networks (``_steptime_problems.NETS``, the same sizes), and times what a user's program pays
per step rather than the step alone. Both sides train on the same data, ``--steps`` minibatches
of the net's batch size an epoch, shuffled every epoch:

reference
    For a network with a forward of its own (``resnet``, ``lstm``), its own training loop as
    a user writes it: an epoch's permutation, each batch indexed, ``zero_grad``, forward, the
    loss (mean cross-entropy, or the Gaussian negative log-likelihood at scale 0.1),
    ``backward``, ``torch.optim.Adam(lr=1e-3)`` (``--adam``: ``fused``, as ``fit`` builds it,
    or ``default``, torch's own choice). For an MLP (``small``, ``large``), mean-field Bayes by
    Backprop written by hand in the same loop: μ and ρ per layer, one draw a step, the
    closed-form KL to N(0, 1), the log-likelihood scaled by N/B, the same Adam.
fit
    ``pyro_bbb.fit(model, MeanFieldGuide(model), x, y, epochs=E, batch_size=B, lr=1e-3,
    num_particles=1)`` on a ``BNN`` of the same network (``bayesianize``: every parameter
    Bayesian, N(0, 1) prior), or ``LowRankGuide(rank=4)`` with ``--guide lowrank``.

Each is timed by whole epochs, from one epoch's end to the next (a ``Callback`` for ``fit``,
which stops it after ``--epochs`` epochs): the steps and everything a fit does between them
(the order, the indexing, the epoch's record and bookkeeping). The first epoch of every
``fit`` call, which holds its set-up and first steps, is not counted; its cost is reported
apart, per call. Rounds alternate the two, so load from elsewhere falls on both alike;
process CPU seconds, one thread, medians over every timed epoch, divided by its steps.
``--steps 1`` is a full-batch run: one step an epoch, every epoch's bookkeeping on it.

The allocator is left as a user's program leaves it unless ``--keep-heap`` (then
``PYRO_BBB_KEEP_HEAP=1`` and the deterministic loop runs under the same ``kept_heap``).

    python benchmarks/step_ratio.py [--nets resnet,lstm] [--guide meanfield|lowrank]
        [--steps 20] [--epochs 4] [--rounds 5] [--adam fused|default] [--keep-heap]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import os
import statistics
import time
import warnings

import pyro
import torch
import torch.nn.functional as F
from _steptime_problems import NETS, Net

import pyro_bbb
from pyro_bbb._heap import ENVIRONMENT_VARIABLE, kept_heap

LR = 1e-3
INIT_SCALE = 0.05


def dataset(net: Net, steps: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` batches of random inputs and targets of the net's shapes."""
    generator = torch.Generator().manual_seed(seed)
    rows = steps * net.batch
    x = torch.rand(rows, *net.input_shape, generator=generator)
    if net.task == "regression":
        return x, torch.randn(rows, generator=generator)
    return x, torch.randint(0, 10, (rows,), generator=generator)


def user_loss(net: Net, output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss a user's loop takes: mean cross-entropy, or the mean Gaussian NLL at 0.1."""
    if net.task == "regression":
        return 0.5 * ((output.squeeze(-1) - y) / 0.1).square().mean() + math.log(0.1)
    return F.cross_entropy(output, y)


class DeterministicLoop:
    """The network's own training loop, epoch by epoch, timed from epoch end to epoch end."""

    def __init__(self, net: Net, x, y, adam: str, keep_heap: bool) -> None:
        self.net, self.x, self.y, self.keep_heap = net, x, y, keep_heap
        self.module = net.module()
        fused = True if adam == "fused" else None
        self.optim = torch.optim.Adam(self.module.parameters(), lr=LR, fused=fused)
        self.step = self._step

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.optim.zero_grad(set_to_none=True)
        user_loss(self.net, self.module(x), y).backward()
        self.optim.step()

    def __call__(self, epochs: int) -> list[float]:
        seconds = []
        with kept_heap(self.keep_heap):
            last = time.process_time()
            for _ in range(epochs):
                for rows in torch.randperm(len(self.x)).split(self.net.batch):
                    self.step(self.x[rows], self.y[rows])
                now = time.process_time()
                seconds.append(now - last)
                last = now
        return seconds


class HandWrittenLoop(DeterministicLoop):
    """Mean-field Bayes by Backprop written by hand for a stack of Linear layers (an MLP).

    Per layer μ and ρ (σ = softplus(ρ)), one weight draw a step, the closed-form KL to
    N(0, 1), the minibatch log-likelihood scaled by N/B, Adam over every tensor.
    """

    def __init__(self, net: Net, x, y, adam: str, keep_heap: bool) -> None:
        super().__init__(net, x, y, adam, keep_heap)
        rho = math.log(math.expm1(INIT_SCALE))  # softplus(rho) = INIT_SCALE
        self.layers = [
            (p.detach().clone().requires_grad_(), torch.full_like(p, rho).requires_grad_())
            for layer in self.module
            if isinstance(layer, torch.nn.Linear)
            for p in (layer.weight, layer.bias)
        ]
        fused = True if adam == "fused" else None
        params = [t for pair in self.layers for t in pair]
        self.optim = torch.optim.Adam(params, lr=LR, fused=fused)
        self.step = self._bbb_step

    def _bbb_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.optim.zero_grad(set_to_none=True)
        h, kl = x, 0.0
        draws = []
        for mu, rho in self.layers:
            sigma = F.softplus(rho)
            draws.append(mu + sigma * torch.randn_like(mu))
            kl = kl + 0.5 * (sigma.square() + mu.square()).sum() - sigma.log().sum()
        for k in range(0, len(draws), 2):
            h = F.linear(h, draws[k], draws[k + 1])
            if k + 2 < len(draws):
                h = F.relu(h)
        scale = len(self.x) / len(x)
        loss = user_loss(self.net, h, y) * len(x) * scale + kl  # a sum over the data set
        loss.backward()
        self.optim.step()


class _EpochClock(pyro_bbb.Callback):
    """Process CPU time at every epoch's end; stops the fit after ``epochs`` epochs."""

    def __init__(self, epochs: int) -> None:
        self.epochs, self.stamps = epochs, []

    def on_epoch_end(self, epoch, history) -> bool:
        self.stamps.append(time.process_time())
        return len(self.stamps) >= self.epochs


class FitLoop:
    """``pyro_bbb.fit`` on a BNN of the same network, one call a turn, timed by epochs."""

    def __init__(self, net: Net, x, y, guide: str) -> None:
        self.net, self.x, self.y = net, x, y
        likelihood = (
            pyro_bbb.likelihoods.Gaussian(scale=0.1)
            if net.task == "regression"
            else pyro_bbb.likelihoods.Categorical()
        )
        network = pyro_bbb.bayesianize(net.module())
        self.model = pyro_bbb.BNN(network, likelihood, num_data=len(x))
        if guide == "lowrank":
            self.guide = pyro_bbb.LowRankGuide(self.model, rank=4, init_scale=INIT_SCALE)
        else:
            self.guide = pyro_bbb.MeanFieldGuide(self.model, init_scale=INIT_SCALE)
        #: CPU seconds of each call outside its timed epochs (set-up, first epoch, the end).
        self.overhead: list[float] = []

    def __call__(self, epochs: int) -> list[float]:
        clock = _EpochClock(epochs + 1)
        start = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a timing: the convergence check will complain
            pyro_bbb.fit(
                self.model, self.guide, self.x, self.y, epochs=epochs + 1,
                batch_size=self.net.batch, lr=LR, num_particles=1, progress=False,
                callbacks=[clock],
            )  # fmt: skip
        end = time.process_time()
        stamps = clock.stamps
        timed = [b - a for a, b in itertools.pairwise(stamps)]
        self.overhead.append(end - start - sum(timed))
        return timed


def ratio_row(net: Net, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per step of each side, interleaved over ``args.rounds`` rounds."""
    pyro.clear_param_store()
    pyro.set_rng_seed(args.seed)
    x, y = dataset(net, args.steps, args.seed)
    reference = DeterministicLoop if net.user_written else HandWrittenLoop
    sides = {
        "reference": reference(net, x, y, args.adam, args.keep_heap),
        "fit": FitLoop(net, x, y, args.guide),
    }
    for run in sides.values():
        run(1)  # warm-up: the optimisers' state, the allocator, first-call costs
    per_step: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, run in sides.items():
            per_step[name] += [s / args.steps for s in run(args.epochs)]
    row = {name: statistics.median(values) for name, values in per_step.items()}
    row["ratio"] = row["fit"] / row["reference"]
    row["overhead"] = statistics.median(sides["fit"].overhead[1:])
    return row


def reference_name(net: Net) -> str:
    return "deterministic" if net.user_written else "hand-written BBB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default="resnet,lstm", help="comma-separated, of steptime's")
    parser.add_argument("--guide", choices=["meanfield", "lowrank"], default="meanfield")
    parser.add_argument("--steps", type=int, default=20, help="minibatches an epoch")
    parser.add_argument("--epochs", type=int, default=4, help="timed epochs a turn")
    parser.add_argument("--rounds", type=int, default=5, help="turns of each side")
    parser.add_argument("--adam", choices=["fused", "default"], default="fused")
    parser.add_argument("--keep-heap", action="store_true", help="glibc keeps freed memory")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.keep_heap:
        os.environ[ENVIRONMENT_VARIABLE] = "1"
    else:
        os.environ.pop(ENVIRONMENT_VARIABLE, None)
    print(
        f"# fit's step against the network's own loop ({args.guide} guide)\n\n"
        f"median over {args.rounds} rounds of {args.epochs} epochs of {args.steps} steps "
        f"(process CPU time, {args.threads} thread(s)); reference Adam: {args.adam}; "
        f"heap: {'kept' if args.keep_heap else 'the allocator defaults'}; "
        f"torch {torch.__version__}, pyro {pyro.__version__}\n"
    )
    print("| net | batch | reference | its ms | fit ms | ratio | fit's set-up a call, ms |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for name in args.nets.split(","):
        net = NETS[name]
        row = ratio_row(net, args)
        print(
            f"| {net.label} | {net.batch} | {reference_name(net)} | {1e3 * row['reference']:.2f} "
            f"| {1e3 * row['fit']:.2f} | {row['ratio']:.2f}× | {1e3 * row['overhead']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
