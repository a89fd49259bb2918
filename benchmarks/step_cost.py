"""Cost of one training step: pyro_bbb against hand-written PyTorch and against Pyro's SVI.

Each row is the median time of one optimiser step (sample, loss, backward, update), as a
ratio to (a), a hand-written pure-PyTorch Bayes by Backprop step measured in the same run:

(a) mean-field Gaussian weights with σ = softplus(ρ), one weight sample per step, the
    closed-form Gaussian KL to the N(0, 1) prior, ``torch.optim.Adam``;
(b) the body of :func:`pyro_bbb.fit`'s loop: ``AnnealedELBO(1.0).terms(model, guide, x, y)``
    under the estimator's handler, backward, ``torch.optim.Adam``; with MeanFieldGuide
    (plain / local / flipout) and LowRankGuide(rank=4, blocks="layer") (plain / local), and
    ``fit()`` itself (its epoch time over its steps, MeanFieldGuide, plain);
(c) Pyro's own route: ``AutoNormal`` + ``Trace_ELBO`` + ``pyro.infer.SVI`` with
    ``pyro.optim.Adam``, with Pyro's validation on (its default) and off (as ``fit`` runs).

Two nets, ReLU, prior N(0, 1): 1-50-50-1 regression (Gaussian likelihood with a fixed noise
scale 0.1, batch 100, N = 1000) and 784-400-400-10 classification (Categorical, batch 128,
N = 60000), on random data. The configurations of a net take turns, one step each, so that
a change in machine load hits them alike; medians over ``--steps`` steps after ``--warmup``
steps each (``fit()``: the median over its epochs of ``--fit-steps`` steps of the time per
step).

    python benchmarks/step_cost.py [--steps 60] [--warmup 10] [--fit-steps 10] [--threads 2]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time
from collections.abc import Callable

import pyro
import pyro.optim
import torch
import torch.nn.functional as F
from _common import machine
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_bbb
from pyro_bbb.elbo import AnnealedELBO
from pyro_bbb.reparam import estimator

INIT_SCALE = 0.05
LR = 1e-3


# ----------------------------------------------------------------------------- (a) reference
class TorchBayesByBackprop:
    """Hand-written mean-field Bayes by Backprop MLP in plain PyTorch (the reference)."""

    def __init__(self, sizes: list[int], task: str, num_data: int) -> None:
        self.task, self.num_data = task, num_data
        rho = INIT_SCALE + math.log(-math.expm1(-INIT_SCALE))  # softplus(rho) = INIT_SCALE
        self.layers = []
        for n_in, n_out in itertools.pairwise(sizes):
            linear = torch.nn.Linear(n_in, n_out)
            self.layers.append(
                [
                    linear.weight.detach().clone().requires_grad_(),
                    torch.full_like(linear.weight, rho).requires_grad_(),
                    linear.bias.detach().clone().requires_grad_(),
                    torch.full_like(linear.bias, rho).requires_grad_(),
                ]
            )
        self.optim = torch.optim.Adam([p for layer in self.layers for p in layer], lr=LR)

    @staticmethod
    def _kl(mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        # KL(N(mu, sigma^2) || N(0, 1)), summed
        return 0.5 * (sigma.pow(2) + mu.pow(2) - 1).sum() - sigma.log().sum()

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        h, kl = x, x.new_zeros(())
        for i, (w_mu, w_rho, b_mu, b_rho) in enumerate(self.layers):
            w_sigma, b_sigma = F.softplus(w_rho), F.softplus(b_rho)
            w = w_mu + w_sigma * torch.randn_like(w_mu)
            b = b_mu + b_sigma * torch.randn_like(b_mu)
            h = F.linear(h, w, b)
            if i < len(self.layers) - 1:
                h = F.relu(h)
            kl = kl + self._kl(w_mu, w_sigma) + self._kl(b_mu, b_sigma)
        if self.task == "regression":
            log_lik = torch.distributions.Normal(h.squeeze(-1), 0.1).log_prob(y).sum()
        else:
            log_lik = -F.cross_entropy(h, y, reduction="sum")
        loss = -log_lik * (self.num_data / len(x)) + kl
        self.optim.zero_grad(set_to_none=True)
        loss.backward()
        self.optim.step()


# ----------------------------------------------------------------------------- (b), (c)
def _model(sizes: list[int], task: str, num_data: int) -> pyro_bbb.BNN:
    likelihood = (
        pyro_bbb.likelihoods.Gaussian(scale=0.1)
        if task == "regression"
        else pyro_bbb.likelihoods.Categorical()
    )
    return pyro_bbb.BNN(pyro_bbb.mlp(sizes, activation="relu"), likelihood, num_data=num_data)


def _fit_loop_step(model, guide, reparam: str | None, x, y) -> Callable[[], None]:
    """One iteration of fit()'s loop body, as a closure."""
    with torch.no_grad():
        guide(x, y)  # creates the guide's parameters
    params = [*guide.parameters(), *model.parameters()]
    optim = torch.optim.Adam(params, lr=LR)
    elbo = AnnealedELBO(1.0)
    handler = estimator(reparam)

    def step() -> None:
        with pyro.validation_enabled(False), handler():
            terms = elbo.terms(model, guide, x, y)
        if not torch.isfinite(terms.loss):
            raise FloatingPointError(f"non-finite loss {terms.loss.item()}")
        optim.zero_grad(set_to_none=True)
        terms.loss.backward()
        optim.step()

    return step


def _svi_step(model, x, y, *, validation: bool) -> Callable[[], None]:
    guide = AutoNormal(model, init_scale=INIT_SCALE)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": LR}), Trace_ELBO())

    def step() -> None:
        with pyro.validation_enabled(validation):
            svi.step(x, y)

    return step


class _FitTimer:
    """``pyro_bbb.fit`` itself: one epoch of ``num_steps`` steps; returns seconds per step."""

    def __init__(self, sizes, task, x, y, num_steps: int) -> None:
        reps = [num_steps] + [1] * (x.dim() - 1)
        self.x = x.repeat(*reps)
        self.y = y.repeat(num_steps)
        self.batch_size = len(x)
        self.num_steps = num_steps
        self.model = _model(sizes, task, len(self.x))
        self.guide = pyro_bbb.MeanFieldGuide(self.model, init_scale=INIT_SCALE, name="fit_mf")

    def __call__(self) -> float:
        history = pyro_bbb.fit(
            self.model,
            self.guide,
            self.x,
            self.y,
            epochs=1,
            batch_size=self.batch_size,
            lr=LR,
            progress=False,
        )
        return history.seconds[0] / history.steps[0]


def _configs(sizes, task, num_data, x, y, fit_steps: int) -> list[tuple[str, object]]:
    """``[(label, step closure or _FitTimer)]`` for one net; clears Pyro's param store."""
    pyro.clear_param_store()
    configs: list[tuple[str, object]] = []
    reference = TorchBayesByBackprop(sizes, task, num_data)
    configs.append(
        ("(a) hand-written PyTorch BBB (mean-field, closed-form KL)", lambda: reference.step(x, y))
    )
    for reparam in (None, "local", "flipout"):
        model = _model(sizes, task, num_data)
        guide = pyro_bbb.MeanFieldGuide(model, init_scale=INIT_SCALE, name=f"mf_{reparam}")
        label = f"(b) MeanFieldGuide, reparam={reparam!r}"
        configs.append((label, _fit_loop_step(model, guide, reparam, x, y)))
    for reparam in (None, "local"):
        model = _model(sizes, task, num_data)
        guide = pyro_bbb.LowRankGuide(
            model, rank=4, blocks="layer", init_scale=INIT_SCALE, name=f"lr_{reparam}"
        )
        label = f"(b) LowRankGuide rank 4, reparam={reparam!r}"
        configs.append((label, _fit_loop_step(model, guide, reparam, x, y)))
    configs.append(
        (
            "(b) pyro_bbb.fit() end to end, MeanFieldGuide, plain",
            _FitTimer(sizes, task, x, y, fit_steps),
        )
    )
    model = _model(sizes, task, num_data)
    configs.append(
        (
            "(c) AutoNormal + Trace_ELBO + SVI, pyro.optim.Adam",
            _svi_step(model, x, y, validation=True),
        )
    )
    configs.append(("(c) same, validation off", _svi_step(model, x, y, validation=False)))
    return configs


def _time(configs, steps: int, warmup: int, fit_every: int) -> dict[str, float]:
    """Median seconds per step of each configuration.

    Round-robin, one step of each configuration per round, so that a burst of load from
    elsewhere on the machine hits every configuration alike; ``fit()`` (an epoch of
    several steps) runs every ``fit_every`` rounds.
    """
    samples: dict[str, list[float]] = {label: [] for label, _ in configs}
    for _, run in configs:
        for _ in range(1 if isinstance(run, _FitTimer) else warmup):
            run()
    for i in range(steps):
        for label, run in configs:
            if isinstance(run, _FitTimer):
                if i % fit_every == 0:
                    samples[label].append(run())
                continue
            start = time.perf_counter()
            run()
            samples[label].append(time.perf_counter() - start)
    return {label: statistics.median(values) for label, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--fit-steps", type=int, default=10, help="steps per fit() epoch")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pyro.set_rng_seed(args.seed)

    nets = [
        ("1-50-50-1, batch 100", [1, 50, 50, 1], "regression", 1000, 100),
        ("784-400-400-10, batch 128", [784, 400, 400, 10], "classification", 60000, 128),
    ]
    columns: list[dict[str, float]] = []
    labels: list[str] = []
    start = time.perf_counter()
    for _, sizes, task, num_data, batch in nets:
        x = torch.randn(batch, sizes[0])
        y = torch.randn(batch) if task == "regression" else torch.randint(0, sizes[-1], (batch,))
        configs = _configs(sizes, task, num_data, x, y, fit_steps=args.fit_steps)
        labels = [label for label, _ in configs]
        columns.append(_time(configs, args.steps, args.warmup, fit_every=args.fit_steps))
    pyro.clear_param_store()

    print(
        f"# Time per training step, as a ratio to a hand-written PyTorch step\n\n"
        f"median of {args.steps} steps after {args.warmup} warm-up steps, configurations "
        f"interleaved step by step (fit(): median of epochs of {args.fit_steps} steps); "
        f"torch {torch.__version__}, pyro {pyro.__version__}, "
        f"{args.threads} thread(s), {machine()}\n"
    )
    print("| step | " + " | ".join(name for name, *_ in nets) + " |")
    print("| --- |" + " ---: |" * len(nets))
    for label in labels:
        ratios = [f"{column[label] / column[labels[0]]:.2f}×" for column in columns]
        print(f"| {label} | " + " | ".join(ratios) + " |")
    reference = ", ".join(
        f"{name}: {1e3 * column[labels[0]]:.2f} ms"
        for (name, *_), column in zip(nets, columns, strict=True)
    )
    print(f"\n(a) on this machine: {reference}")
    print(f"(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
