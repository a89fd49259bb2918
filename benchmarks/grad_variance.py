"""Variance of the ELBO gradient under plain weight sampling, local reparameterisation, flipout.

At FIXED guide parameters and a FIXED minibatch, the negative ELBO (``AnnealedELBO(1.0)``,
one particle) is differentiated ``R`` times under each estimator; the only randomness is the
estimator's noise. For the first layer's means (μ) and ρ we report the per-element variance
of the gradient across the ``R`` draws, averaged over elements (weight and bias together),
and its ratio to plain weight sampling. The KL term is in closed form, so it adds no
variance: all of it comes from the likelihood.

Net: 784-400-400-10 ReLU, Categorical likelihood, a batch of 128 random inputs x ~ N(0, 1)
with random labels, plate size N = 60000 (``--small``: 784-100-10, R = 20). Guides at their
defaults (means from the network's initialisation, σ = 0.05): MeanFieldGuide with every
estimator; LowRankGuide(rank=4, blocks="layer") with plain and local (for it, μ and ρ are the
first block's ``locs["0"]`` and ``rhos["0"]``, the weight and bias of layer 0).

Estimators are interleaved within each repeat, so the ms per gradient step (ELBO + backward)
is measured in the same run under the same machine load and reported as a ratio to plain.

``--per-example`` adds Kingma et al.'s middle case, a separate weight draw for every example
(a Python loop over the batch, so slow and not timed). ``--inputs uniform`` draws x ~ U(0, 1),
non-negative like MNIST pixels: with x ~ N(0, 1) the between-example covariance of the
gradient cancels in the average over elements (x_ni x_mi has random sign), so the shared
weight sample costs little and flipout, which removes only that covariance, gains little.

    python benchmarks/grad_variance.py [--repeats 50] [--threads 2] [--small] \
        [--inputs normal|uniform] [--per-example] [--seed 0]
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pyro
import torch
from _common import machine, markdown_table, script_parser

import pyro_bbb
from pyro_bbb.infer import AnnealedELBO
from pyro_bbb.infer.reparam import estimator

REFERENCE = (
    "Published reference (BENCHMARKS.md): Kingma, Salimans & Welling 2015 (MNIST): gradient "
    "variance local reparameterisation < separate weight samples per example < one weight "
    "sample per minibatch, local close to the no-noise floor. Flipout (Wen et al. 2018) "
    "reaches a similar reduction at about 2x the compute of a shared sample."
)


class _Moments:
    """Running per-element sum and sum of squares, in float64."""

    def __init__(self) -> None:
        self.n = 0
        self.sum: torch.Tensor | None = None
        self.sumsq: torch.Tensor | None = None

    def add(self, g: torch.Tensor) -> None:
        g = g.detach().double()
        if self.sum is None:
            self.sum, self.sumsq = torch.zeros_like(g), torch.zeros_like(g)
        self.sum += g
        self.sumsq += g * g
        self.n += 1

    def mean_variance(self) -> float:
        """Mean over elements of the unbiased per-element variance across draws."""
        mean = self.sum / self.n
        var = (self.sumsq - self.n * mean * mean) / (self.n - 1)
        return float(var.clamp_min(0).mean())


def _first_layer_params(guide) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The first layer's (μ, ρ) leaf tensors of a set-up guide, weight and bias together."""
    if isinstance(guide, pyro_bbb.LowRankGuide):
        return [guide.locs.get_parameter("0")], [guide.rhos.get_parameter("0")]
    locs = [guide.locs.get_parameter(f"0.{p}") for p in ("weight", "bias")]
    rhos = [guide.rhos.get_parameter(f"0.{p}") for p in ("weight", "bias")]
    return locs, rhos


def _measure(
    model, make_guide: Callable[[], object], estimators: list[str | None], x, y, repeats: int
) -> dict[str | None, tuple[float, float, float]]:
    """``{estimator: (var μ-grad, var ρ-grad, mean ms per step)}`` at fixed parameters."""
    pyro.clear_param_store()
    guide = make_guide()
    with torch.no_grad():
        guide(x, y)  # creates the parameters
    params = list(guide.parameters())
    locs, rhos = _first_layer_params(guide)
    elbo = AnnealedELBO(1.0, num_particles=1)
    moments = {name: (_Moments(), _Moments()) for name in estimators}
    seconds = {name: 0.0 for name in estimators}

    def step(name: str | None) -> None:
        for p in params:
            p.grad = None
        if name == PER_EXAMPLE:
            # A fresh weight draw for every example: the batch's likelihood, N/B-scaled, is
            # the sum of single-example terms (each N/1-scaled) divided by B; the KL once.
            for n in range(len(x)):
                with pyro.validation_enabled(False):
                    terms = elbo.terms(model, guide, x[n : n + 1], y[n : n + 1])
                (terms.nll / len(x) + (terms.kl if n == 0 else 0.0)).backward()
            return
        with pyro.validation_enabled(False), estimator(name)():
            loss = elbo.terms(model, guide, x, y).loss
        loss.backward()

    for name in estimators:  # warm-up: allocator, lazy set-up
        step(name)
    for _ in range(repeats):
        for name in estimators:
            start = time.perf_counter()
            step(name)
            seconds[name] += time.perf_counter() - start
            moments[name][0].add(torch.cat([p.grad.reshape(-1) for p in locs]))
            moments[name][1].add(torch.cat([p.grad.reshape(-1) for p in rhos]))
    return {
        name: (m[0].mean_variance(), m[1].mean_variance(), 1e3 * seconds[name] / repeats)
        for name, m in moments.items()
    }


PER_EXAMPLE = "per-example"
LABELS = {
    None: "plain: one weight sample per minibatch",
    PER_EXAMPLE: "separate weight samples per example",
    "local": "local reparameterisation",
    "flipout": "flipout",
}


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=None, help="gradient draws (default 50)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--small", action="store_true", help="784-100-10, R=20: a quick run")
    parser.add_argument(
        "--inputs",
        choices=("normal", "uniform"),
        default="normal",
        help="x ~ N(0, 1), or x ~ U(0, 1) (non-negative like MNIST pixels)",
    )
    parser.add_argument(
        "--per-example",
        action="store_true",
        help="add rows with separate weight samples per example (a slow loop over the batch)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    repeats = args.repeats or (20 if args.small else 50)
    if repeats < 2:
        parser.error(f"--repeats must be at least 2, got {repeats}")
    sizes = [784, 100, 10] if args.small else [784, 400, 400, 10]
    batch, num_data = 128, 60000

    pyro.set_rng_seed(args.seed)
    net = pyro_bbb.mlp(sizes, activation="relu")
    model = pyro_bbb.BNN(net, pyro_bbb.likelihoods.Categorical(), num_data=num_data)
    x = torch.randn(batch, sizes[0]) if args.inputs == "normal" else torch.rand(batch, sizes[0])
    y = torch.randint(0, sizes[-1], (batch,))

    extra = [PER_EXAMPLE] if args.per_example else []
    configs = [
        (
            "MeanFieldGuide",
            lambda: pyro_bbb.MeanFieldGuide(model),
            [None, *extra, "local", "flipout"],
        ),
        (
            "LowRankGuide(rank=4, blocks='layer')",
            lambda: pyro_bbb.LowRankGuide(model, rank=4, blocks="layer"),
            [None, *extra, "local"],
        ),
    ]
    inputs = "x ~ N(0, 1)" if args.inputs == "normal" else "x ~ U(0, 1)"
    print(
        f"# ELBO gradient variance, first layer, at fixed parameters\n\n"
        f"net {'-'.join(map(str, sizes))} ReLU, batch {batch}, N = {num_data}, random "
        f"{inputs} and random labels, guides at initialisation (σ = 0.05), num_particles = 1, "
        f"R = {repeats} draws per estimator; torch {torch.__version__}, pyro "
        f"{pyro.__version__}, {args.threads} thread(s), {machine()}\n"
    )
    total = time.perf_counter()
    for title, make_guide, estimators in configs:
        results = _measure(model, make_guide, estimators, x, y, repeats)
        base_loc, base_rho, base_ms = results[None]
        print(f"## {title}\n")
        header = ("estimator", "Var ∂/∂μ", "vs plain", "Var ∂/∂ρ", "vs plain", "time/step vs plain")
        lines = [
            (
                LABELS[name], f"{v_loc:.3e}", f"{v_loc / base_loc:.3g}", f"{v_rho:.3e}",
                f"{v_rho / base_rho:.3g}",
                "— (loop)" if name == PER_EXAMPLE else f"{ms / base_ms:.2f}×",
            )
            for name, (v_loc, v_rho, ms) in results.items()
        ]  # fmt: skip
        print(markdown_table(header, lines, align="l" + "r" * 5))
        print(f"\nplain: {base_ms:.1f} ms per gradient step (ELBO + backward) on this machine\n")
    print(
        "Var: mean over the first layer's weight and bias elements of the per-element "
        "variance of the gradient across draws (fixed minibatch, so the floor is 0). "
        "'separate weight samples per example' draws every weight afresh for each example "
        "(a loop over the batch; its time is not comparable).\n"
    )
    print(REFERENCE)
    print(f"\n(total {time.perf_counter() - total:.0f} s)")


if __name__ == "__main__":
    main()
