"""A heteroscedastic Gaussian at ``fit``'s defaults: the noise it learns, and what covers.

Data: ``n`` points of :math:`\\sin x + 0.3x` plus noise of std :math:`\\sigma(x)` on
:math:`x \\in [-3, 3]`, and 4,000 test points of the same distribution; the noise shapes:

* ``linear``: :math:`\\sigma` rising from 0.05 to 0.35 across the inputs;
* ``bump``: 0.05 at the edges, 0.40 in the middle (:math:`0.05 + 0.35 e^{-x^2}`);
* ``step``: 0.05 left of 0, 0.30 right of it.

A 1-50-50-2 tanh MLP (``mlp``'s default ``Gaussian(1.0)`` prior), ``Gaussian(
heteroscedastic=True)``, ``MeanFieldGuide`` and ``fit`` with nothing but the data, or one
change (``--variants``): ``n2000`` / ``n4000`` (more points), ``width20`` (1-20-20-2),
``beta0.2`` (a tempered posterior), ``beta1`` (no likelihood-only stage or warm-up),
``init0.01`` (the guide's initial scale), ``mixture`` (a scale-mixture prior), ``fanin``
(a fan-in Gaussian prior), ``converged`` (``until="converged"``).

Each row: the learned aleatoric std over the true one (median over test points with
:math:`x < -2` and :math:`x > 2`), the epistemic std there, the share of test points inside
the 90 % predictive interval, the test log-likelihood, epochs and CPU seconds. Every run
appends one JSON line to ``--out`` (runs already there are skipped); ``--table`` prints it.

    python benchmarks/heteroscedastic.py --out heteroscedastic.jsonl
    python benchmarks/heteroscedastic.py --out heteroscedastic.jsonl --table
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings

import pyro
import torch
from _common import add_run_arguments, markdown_table, run_missing

import pyro_bbb as bbb

SHAPES = {
    "linear": lambda x: 0.05 + 0.3 * (x + 3) / 6,
    "bump": lambda x: 0.05 + 0.35 * torch.exp(-(x**2)),
    "step": lambda x: torch.where(x < 0, torch.tensor(0.05), torch.tensor(0.3)),
}
VARIANTS = (
    "base", "n2000", "n4000", "width20", "beta0.2", "beta1", "init0.01", "mixture", "fanin",
    "converged",
)  # fmt: skip
#: The runs made by default: (shape, variant, seed).
DEFAULT_RUNS = (
    *(("linear", v, 0) for v in VARIANTS if v != "converged"),
    ("bump", "base", 1),
    ("step", "base", 2),
    ("bump", "beta0.2", 1),
)


def _data(shape: str, n: int, generator: torch.Generator):
    x = torch.rand(n, 1, generator=generator) * 6 - 3
    noise = SHAPES[shape](x).squeeze(-1)
    y = torch.sin(x).squeeze(-1) + 0.3 * x.squeeze(-1) + noise * torch.randn(n, generator=generator)
    return x, y, noise


def _run(shape: str, variant: str, seed: int) -> dict:
    n = {"n2000": 2000, "n4000": 4000}.get(variant, 800)
    g = torch.Generator().manual_seed(1000 + seed)
    x, y, _ = _data(shape, n, g)
    x_test, y_test, noise = _data(shape, 4000, g)
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    prior = {
        "mixture": bbb.priors.ScaleMixture(pi=0.5, sigma1=1.0, sigma2=0.0025),
        "fanin": bbb.priors.FanInGaussian(1.0),
    }.get(variant)
    width = 20 if variant == "width20" else 50
    net = bbb.mlp([1, width, width, 2], activation="tanh", prior=prior)
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(heteroscedastic=True), num_data=n)
    guide = bbb.MeanFieldGuide(model, **({"init_scale": 0.01} if variant == "init0.01" else {}))
    options = {
        "beta0.2": {"beta": 0.2}, "beta1": {"beta": 1.0}, "converged": {"until": "converged"},
    }.get(variant, {})  # fmt: skip
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = bbb.fit(model, guide, x, y, seed=seed, progress=False, **options)
    seconds = time.process_time() - start
    pred = bbb.predict(model, guide, x_test, num_samples=200, seed=0)
    lower, upper = pred.interval(0.9)
    inside = ((y_test >= lower) & (y_test <= upper)).float()
    ratio = pred.aleatoric_std / noise
    where = x_test.squeeze(-1)
    low, high = where < -2, where > 2

    def median(values, mask):
        return round(float(values[mask].median()), 3)

    return {
        "shape": shape, "variant": variant, "seed": seed, "n": n,
        "ratio_low": median(ratio, low), "ratio_high": median(ratio, high),
        "epistemic_low": median(pred.epistemic_std, low),
        "epistemic_high": median(pred.epistemic_std, high),
        "coverage": round(float(inside.mean()), 4),
        "log_likelihood": round(pred.log_likelihood(y_test), 4),
        "epochs": len(history), "seconds": round(seconds, 1), "stopped": history.stopped,
    }  # fmt: skip


def _table(rows: list[dict]) -> str:
    lines = [
        (
            row["shape"], row["variant"], row["seed"], f"{row['n']:,}",
            f"{row['ratio_low']:.2f}", f"{row['ratio_high']:.2f}",
            f"{row['epistemic_low']:.3f}", f"{row['epistemic_high']:.3f}",
            f"{100 * row['coverage']:.1f}", f"{row['log_likelihood']:.3f}",
            f"{row['epochs']:,}", f"{row['seconds']:g}",
        )
        for row in rows
    ]  # fmt: skip
    header = (
        "noise", "run", "seed", "points", "learned / true noise, x < -2", "x > 2",
        "epistemic std, x < -2", "x > 2", "90 % interval covers %", "test LL", "epochs", "CPU s",
    )  # fmt: skip
    return markdown_table(header, lines, text=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, "heteroscedastic.jsonl")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS)
    parser.add_argument("--seeds", nargs="+", type=int)
    args = parser.parse_args()
    if args.shapes or args.variants or args.seeds:
        chosen = [
            (shape, variant, seed)
            for shape in args.shapes or ["linear"]
            for variant in args.variants or ["base"]
            for seed in args.seeds or [0]
        ]
    else:
        chosen = list(DEFAULT_RUNS)
    runs = [
        ({"shape": s, "variant": v, "seed": k}, functools.partial(_run, s, v, k))
        for s, v, k in chosen
    ]
    run_missing(
        args, runs, table=_table,
        describe=lambda row: f"{row['shape']} {row['variant']} seed {row['seed']}: learned/true "
        f"{row['ratio_low']:.2f} / {row['ratio_high']:.2f}, covers {row['coverage']:.3f}",
    )  # fmt: skip


if __name__ == "__main__":
    main()
