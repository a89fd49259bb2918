"""A heteroscedastic Gaussian at ``fit``'s defaults: the noise it learns, and what covers.

The problems, fixed before any remedy was tried: ``n`` points with inputs uniform on
:math:`[-3, 3]^d`, targets :math:`f(x) + \\sigma(x_1)\\,\\varepsilon`, where
:math:`f(x) = \\sin x_1 + 0.3 x_1 + 0.5 \\sum_{j \\ge 2} \\cos(x_j + j)`, and 4,000 test
points of the same distribution; the noise shapes, along the first input:

* ``linear``: :math:`\\sigma` rising from 0.05 to 0.35 across the inputs;
* ``bump``: 0.05 at the edges, 0.40 in the middle (:math:`0.05 + 0.35 e^{-x_1^2}`);
* ``step``: 0.05 left of 0, 0.30 right of it.

The remedies were compared on the tuning problems ``T1``-``T4`` and measured once on the
held-out ``H1``-``H5`` (``PROBLEMS``). A 1-50-50-2 tanh MLP (``d``-50-50-2; ``mlp``'s
default ``Gaussian(1.0)`` prior), ``Gaussian(heteroscedastic=True)``, ``MeanFieldGuide`` and
``fit`` with nothing but the data (``default``), or one change (``--variants``):

* ``true_noise``: the network's scale output replaced by the true noise, so the ELBO fits
  the mean and the guide with the noise known (an oracle: what a perfect noise gives);
* ``predictive_mean``: the noise fitted to the residuals of the predictive mean rather than
  by the ELBO: two weight draws a step, the gradient in each draw's scale that of
  :math:`-(y-\\mu_s)(y-\\mu_t)/(2\\sigma_s^2) - \\log\\sigma_s` (:math:`t` the other draw),
  whose expectation has :math:`(y - \\mathbb{E}_q f)^2` where the ELBO has
  :math:`\\mathbb{E}_q (y - f)^2`; the mean's gradient and the loss's value the ELBO's;
* ``beta0.2`` (a tempered posterior), ``beta1`` (no likelihood-only stage or warm-up),
  ``width20`` (a d-20-20-2 net), ``init0.01`` (the guide's initial scale), ``mixture`` (a
  scale-mixture prior), ``fanin`` (a fan-in Gaussian prior), ``converged``
  (``until="converged"``).

Each row: the coverage of the 90 % predictive intervals (all test points, and those with
:math:`x_1 < -2`); the learned aleatoric std over the true one, as medians over the test
points of six equal bins of :math:`x_1` in :math:`[-2.5, 2.5]` with every input in
:math:`[-2.5, 2.5]` (the dense region; the lowest and highest bin medians are shown), and
over :math:`x_1 < -2` and :math:`x_1 > 2`; the epistemic std over the true noise and the
predictive mean's root mean square error over it in the dense region (medians of bins); the
same coverage and ratios with the aleatoric variance taken as :math:`\\mathbb{E}_s\\sigma_s^2 -
\\mathrm{Var}_s\\,\\mu_s` (floored at ``min_scale``², the predictive corrected by the ELBO's
optimum identity, from the same fit); the test log-likelihood, epochs and CPU seconds. A row
*meets* the target when its coverage is within 87-93 % and every bin ratio within 0.8-1.2.

``uci:NAME`` problems (with ``--uci DIR``) run the UCI protocol of
:mod:`pyro_bbb.bench.uci` (one hidden layer, a learned homoscedastic noise, local
reparameterisation; the split as seed) at ``default`` (one draw a step, as the protocol),
``elbo2`` (two draws, the ELBO's noise) and ``predictive_mean`` (two draws).

Every run appends one JSON line to ``--out`` (runs already there are skipped); ``--table``
prints the table.

    python benchmarks/heteroscedastic.py --out heteroscedastic.jsonl
    python benchmarks/heteroscedastic.py --out heteroscedastic.jsonl --problems T1 T2 \\
        --variants true_noise predictive_mean --seeds 0
    python benchmarks/heteroscedastic.py --out heteroscedastic.jsonl --problems uci:boston \\
        uci:wine --variants default elbo2 predictive_mean --seeds 0 1 2
    python benchmarks/heteroscedastic.py --out heteroscedastic.jsonl --table
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import statistics
import time
import warnings
from pathlib import Path
from unittest import mock

import pyro
import pyro.distributions as dist
import torch
from _common import (
    UCI_FOLDER,
    add_run_arguments,
    grouped,
    markdown_table,
    run_missing,
    script_parser,
)
from pyro.nn import PyroModule

import pyro_bbb as bbb

#: name: (noise shape, input dims, training points, data seed), chosen before any remedy
PROBLEMS = {
    "T1": ("linear", 1, 800, 0), "T2": ("bump", 1, 300, 1), "T3": ("step", 1, 2000, 2),
    "T4": ("linear", 3, 1000, 3),
    "H1": ("linear", 1, 4000, 10), "H2": ("bump", 1, 800, 11), "H3": ("step", 1, 300, 12),
    "H4": ("bump", 4, 2000, 13), "H5": ("step", 2, 800, 14),
}  # fmt: skip
SHAPES = {
    "linear": lambda s: 0.05 + 0.3 * (s + 3) / 6,
    "bump": lambda s: 0.05 + 0.35 * torch.exp(-(s**2)),
    "step": lambda s: torch.where(s < 0, torch.tensor(0.05), torch.tensor(0.3)),
}
VARIANTS = (
    "default", "true_noise", "predictive_mean", "beta0.2", "beta1", "width20", "init0.01",
    "mixture", "fanin", "converged",
)  # fmt: skip
UCI_VARIANTS = ("default", "elbo2", "predictive_mean")
#: The runs made by default: (problem, variant, seed).
DEFAULT_RUNS = (
    *((p, "default", k) for p in PROBLEMS for k in (0, 1, 2)),
    *((p, v, 0) for v in ("true_noise", "predictive_mean") for p in PROBLEMS),
)
EDGES = torch.linspace(-2.5, 2.5, 7)
LEVEL = 0.9


def _mean_fn(x: torch.Tensor) -> torch.Tensor:
    f = torch.sin(x[:, 0]) + 0.3 * x[:, 0]
    for j in range(1, x.shape[1]):
        f = f + 0.5 * torch.cos(x[:, j] + j)
    return f


def _data(shape: str, d: int, n: int, generator: torch.Generator):
    x = torch.rand(n, d, generator=generator) * 6 - 3
    noise = SHAPES[shape](x[:, 0])
    return x, _mean_fn(x) + noise * torch.randn(n, generator=generator), _mean_fn(x), noise


class _PredictiveMeanNormal(dist.Normal):
    """A Normal whose log-density, over a leading dim of two or more independent draws, has
    the gradient that fits the scale to the residuals of the other draws' mean."""

    def log_prob(self, value):
        log_density = super().log_prob(value)
        if self.loc.dim() < 2 or self.loc.shape[0] < 2:
            return log_density
        loc, scale = torch.broadcast_tensors(self.loc, self.scale)
        residual = value - loc
        held = residual.detach()
        others = (held.sum(0, keepdim=True) - held) / (loc.shape[0] - 1)
        surrogate = -(residual**2) / (2 * scale.detach() ** 2) - held * others / (2 * scale**2)
        surrogate = surrogate - scale.log()
        return log_density.detach() + (surrogate - surrogate.detach())


class _NoiseAtPredictiveMean(bbb.likelihoods.Gaussian):
    """``Gaussian`` with its noise fitted at the predictive mean (the traced ELBO, whose
    particle plate is the leading dim; a subclass is not taken by the fused step). Without
    gradients (prediction) its distribution is ``Gaussian``'s."""

    def forward(self, output):
        if not torch.is_grad_enabled():
            return super().forward(output)
        loc, scale, width = self._loc_scale(output)
        normal = _PredictiveMeanNormal(loc, scale)
        return normal if width == 1 else normal.to_event(1)


class _KnownNoise(PyroModule):
    """The mean from a Bayesian MLP, the raw scale from the true noise: ``(..., batch, 2)``."""

    def __init__(self, body: PyroModule, shape: str, min_scale: float) -> None:
        super().__init__()
        self.body, self.shape, self.min_scale = body, shape, min_scale

    def forward(self, x):
        mean = self.body(x)
        scale = SHAPES[self.shape](x[:, 0]) - self.min_scale
        raw = (scale + torch.log(-torch.expm1(-scale))).unsqueeze(-1)  # softplus⁻¹
        return torch.cat([mean, raw.expand_as(mean)], -1)


def _fit_options(variant: str) -> dict:
    return {
        "beta0.2": {"beta": 0.2}, "beta1": {"beta": 1.0}, "converged": {"until": "converged"},
        "predictive_mean": {"num_particles": 2},
    }.get(variant, {})  # fmt: skip


def _run(problem: str, variant: str, seed: int) -> dict:
    shape, d, n, data_seed = PROBLEMS[problem]
    g = torch.Generator().manual_seed(1000 + data_seed)
    x, y, _, _ = _data(shape, d, n, g)
    x_test, y_test, f_test, noise = _data(shape, d, 4000, g)
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    prior = {
        "mixture": bbb.priors.ScaleMixture(pi=0.5, sigma1=1.0, sigma2=0.0025),
        "fanin": bbb.priors.FanInGaussian(1.0),
    }.get(variant)
    width = 20 if variant == "width20" else 50
    family = _NoiseAtPredictiveMean if variant == "predictive_mean" else bbb.likelihoods.Gaussian
    likelihood = family(heteroscedastic=True)
    if variant == "true_noise":
        body = bbb.mlp([d, width, width, 1], activation="tanh", prior=prior)
        net = _KnownNoise(body, shape, likelihood.min_scale)
    else:
        net = bbb.mlp([d, width, width, 2], activation="tanh", prior=prior)
    model = bbb.BNN(net, likelihood, num_data=n)
    guide = bbb.MeanFieldGuide(model, **({"init_scale": 0.01} if variant == "init0.01" else {}))
    start = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = bbb.fit(model, guide, x, y, seed=seed, progress=False, **_fit_options(variant))
    seconds = time.process_time() - start
    pred = bbb.predict(model, guide, x_test, num_samples=200, seed=0)
    row = {"problem": problem, "variant": variant, "seed": seed, "n": n, "d": d, "shape": shape}
    row |= _scores(pred, x_test, y_test, f_test, noise)
    # the predictive corrected by the ELBO's optimum identity, from the same fit
    aleatoric = (pred.aleatoric_std**2 - pred.epistemic_std**2).clamp_min(likelihood.min_scale**2)
    factor = (aleatoric / pred.aleatoric_std**2).sqrt()
    corrected = dataclasses.replace(pred, scale_samples=pred.scale_samples * factor)
    subtracted = _scores(corrected, x_test, y_test, f_test, noise)
    row |= {f"subtracted_{k}": subtracted[k] for k in ("coverage", "ratio_bins", "log_likelihood")}
    row |= {"epochs": len(history), "seconds": round(seconds, 1), "stopped": history.stopped}
    return row


def _scores(pred, x_test, y_test, f_test, noise) -> dict:
    lower, upper = pred.interval(LEVEL)
    inside = ((y_test >= lower) & (y_test <= upper)).float()
    s = x_test[:, 0]
    dense = (x_test.abs() <= 2.5).all(1)
    ratio, epistemic = pred.aleatoric_std / noise, pred.epistemic_std / noise
    error = (pred.mean - f_test) / noise
    bins = [dense & (s >= a) & (s < b) for a, b in itertools.pairwise(EDGES)]

    def med(values, mask):
        return round(float(values[mask].median()), 3)

    def rms(values, mask):
        return float(values[mask].pow(2).mean().sqrt())

    return {
        "coverage": round(float(inside.mean()), 4),
        "coverage_low": round(float(inside[s < -2].mean()), 4),
        "ratio_bins": [med(ratio, m) for m in bins],
        "ratio_low": med(ratio, s < -2),
        "ratio_high": med(ratio, s > 2),
        "epistemic": round(statistics.median(med(epistemic, m) for m in bins), 3),
        "mean_error": round(statistics.median(rms(error, m) for m in bins), 3),
        "log_likelihood": round(pred.log_likelihood(y_test), 4),
    }


def _run_uci(name: str, variant: str, split: int, folder: Path) -> dict:
    from pyro_bbb.bench import uci
    from pyro_bbb.data import load_uci_folder

    data = load_uci_folder(folder / name, num_splits=split + 1)
    config = uci.UCIConfig(num_particles=1 if variant == "default" else 2)
    likelihood = _NoiseAtPredictiveMean if variant == "predictive_mean" else uci.Gaussian
    with warnings.catch_warnings(), mock.patch.object(uci, "Gaussian", likelihood):
        warnings.simplefilter("ignore")
        result = uci.fit_split(
            "bnn", data[split], dataset=name, n_hidden=data.n_hidden or 50, config=config
        )
    return {
        "problem": f"uci:{name}", "variant": variant, "seed": split,
        "log_likelihood": round(result.log_likelihood, 4), "rmse": round(result.rmse, 4),
        "noise": round(result.noise_std, 4), "seconds": round(result.cpu_seconds, 1),
    }  # fmt: skip


def _meets(row: dict, prefix: str = "") -> bool:
    coverage, ratios = row[prefix + "coverage"], row[prefix + "ratio_bins"]
    return 0.87 <= coverage <= 0.93 and all(0.8 <= r <= 1.2 for r in ratios)


def _table(rows: list[dict]) -> str:
    synthetic = [r for r in rows if not r["problem"].startswith("uci:")]
    lines = []
    for (problem, variant), group in sorted(grouped(synthetic, ("problem", "variant")).items()):

        def mean(key, group=group):
            return statistics.fmean(r[key] for r in group)

        lines.append((
            problem, variant, len(group), f"{100 * mean('coverage'):.1f}",
            f"{100 * mean('coverage_low'):.1f}",
            f"{min(min(r['ratio_bins']) for r in group):.2f}-"
            f"{max(max(r['ratio_bins']) for r in group):.2f}",
            f"{mean('ratio_low'):.2f} / {mean('ratio_high'):.2f}",
            f"{mean('epistemic'):.2f} / {mean('mean_error'):.2f}",
            f"{100 * mean('subtracted_coverage'):.1f}",
            f"{min(min(r['subtracted_ratio_bins']) for r in group):.2f}-"
            f"{max(max(r['subtracted_ratio_bins']) for r in group):.2f}",
            f"{mean('log_likelihood'):.3f}", f"{sum(_meets(r) for r in group)}/{len(group)}",
            f"{statistics.median(r['epochs'] for r in group):,.0f}",
            f"{statistics.median(r['seconds'] for r in group):g}",
        ))  # fmt: skip
    header = (
        "problem", "run", "seeds", "90 % covers %", "x1 < -2", "learned / true noise, bins",
        "x1 < -2 / > 2", "epistemic / mean's error (÷ noise)", "corrected: covers %",
        "bins", "test LL", "meets", "epochs", "CPU s",
    )  # fmt: skip
    text = markdown_table(header, lines, align="ll" + "r" * 12)
    uci_rows = [r for r in rows if r["problem"].startswith("uci:")]
    if uci_rows:
        uci_lines = [
            (problem, variant, len(g), _mean_se(g, "log_likelihood"), _mean_se(g, "rmse"),
             f"{statistics.fmean(r['noise'] for r in g):.3f}")
            for (problem, variant), g in sorted(grouped(uci_rows, ("problem", "variant")).items())
        ]  # fmt: skip
        header = ("data set", "run", "splits", "test LL", "RMSE", "noise std")
        text += "\n\n" + markdown_table(header, uci_lines, align="ll" + "r" * 4)
    return text


def _mean_se(group: list[dict], key: str) -> str:
    values = [r[key] for r in group]
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {se:.3f}"


def main() -> None:
    parser = script_parser(__doc__)
    add_run_arguments(parser, "heteroscedastic.jsonl")
    parser.add_argument("--problems", nargs="+")
    parser.add_argument("--variants", nargs="+", choices=sorted({*VARIANTS, *UCI_VARIANTS}))
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--uci", type=Path, default=UCI_FOLDER)
    args = parser.parse_args()
    if args.problems or args.variants or args.seeds:
        chosen = [
            (problem, variant, seed)
            for problem in args.problems or list(PROBLEMS)
            for variant in args.variants or ["default"]
            for seed in args.seeds or [0]
        ]
    else:
        chosen = list(DEFAULT_RUNS)
    for problem, variant, _ in chosen:
        valid = UCI_VARIANTS if problem.startswith("uci:") else VARIANTS
        if (problem not in PROBLEMS and not problem.startswith("uci:")) or variant not in valid:
            parser.error(f"no run {variant!r} of problem {problem!r}")
    runs = [
        (
            {"problem": p, "variant": v, "seed": k},
            functools.partial(_run_uci, p[4:], v, k, args.uci)
            if p.startswith("uci:")
            else functools.partial(_run, p, v, k),
        )
        for p, v, k in chosen
    ]
    run_missing(
        args, runs, table=_table,
        describe=lambda row: f"{row['problem']} {row['variant']} seed {row['seed']}: "
        + (f"test LL {row['log_likelihood']:.3f}" if row["problem"].startswith("uci:") else
           f"covers {row['coverage']:.3f}, learned/true {min(row['ratio_bins']):.2f}-"
           f"{max(row['ratio_bins']):.2f}"),
    )  # fmt: skip


if __name__ == "__main__":
    main()
