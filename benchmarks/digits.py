"""Digits classification: Bayesian MLPs against a deterministic MLP and MC dropout.

scikit-learn's 8x8 digits (1,797 images; 1,347 to train, 450 to test, stratified, seed 0),
pixels in [0, 1]. Every method is the same 64-100-10 ReLU network (``pyro_bbb.mlp``), the same
``Categorical`` likelihood and N(0, 1) prior, trained with the same budget (Adam, lr 1e-2,
batch 128, ``--epochs`` epochs); they differ only in how the weights are inferred:

* ``bnn_meanfield``: mean-field guide (initial σ 0.01), local reparameterisation, β warmed up
  linearly to 1 over the first fifth of training: the plain ELBO;
* ``bnn_meanfield_tempered``: the same with β ending at 0.1 (a tempered posterior, Wenzel et
  al. 2020): at β = 1 the mean-field BNN on 1,347 images is under-confident;
* ``bnn_lowrank_tempered``: a low-rank guide (rank 4 per layer), tempered the same way;
* ``deterministic``: the MAP weights (Pyro's ``AutoDelta``), the prior as weight decay;
* ``mc_dropout``: the MAP weights with dropout (p = 0.1) after the hidden layer, kept on at
  prediction (Gal and Ghahramani 2016).

Reported on the test set: accuracy, NLL, ECE (15 bins), Brier score; and the AUROC of telling
in-distribution test images from out-of-distribution ones, scoring each image by its
predictive entropy and by the mutual information between label and weights, against two OOD
sets made from the data: uniform random-noise images and the test digits rotated by 90°.
Predictions use 100 weight (or dropout-mask) samples. A deterministic net has zero mutual
information everywhere, so its MI AUROC is 0.5 by construction.

Writes ``digits.md``, ``digits.json`` and a reliability diagram per method
(``reliability_<method>.png``) into ``--out``, plus the tempered mean-field BNN's posterior σ
histogram (``weight_sigma.png``).

    python benchmarks/digits.py [--epochs 200] [--seeds 3] [--out digits_results]
"""

from __future__ import annotations

import time
from pathlib import Path

import pyro
import torch
from _common import machine, markdown_table, mean_error, save_report, script_parser
from pyro.infer.autoguide import AutoDelta, init_to_value
from tqdm.auto import tqdm

import pyro_bbb as bbb
from pyro_bbb import metrics
from pyro_bbb.data import Split, digits
from pyro_bbb.infer import LinearWarmup
from pyro_bbb.nn import initial_values
from pyro_bbb.plots import plot_reliability, plot_weight_sigma

METHODS = (
    "bnn_meanfield",
    "bnn_meanfield_tempered",
    "bnn_lowrank_tempered",
    "deterministic",
    "mc_dropout",
)
DROPOUT = 0.1
SIZES = [64, 100, 10]


def ood_sets(split: Split, seed: int) -> dict[str, torch.Tensor]:
    """Out-of-distribution inputs, as many as test images: uniform noise, and 90° rotations."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.rand(split.x_test.shape, generator=generator)
    rotated = torch.rot90(split.x_test.reshape(-1, 8, 8), k=1, dims=(-2, -1)).reshape(-1, 64)
    return {"noise": noise, "rotated": rotated}


def train(method: str, split: Split, *, epochs: int | None, seed: int):
    """Fit one method; returns the model and guide (the param store holds the rest).

    ``epochs=None`` is fit's automatic run: every method trained until more training stops
    improving the predictive, with fit's own β warm-up (a tempered method at β = 0.1
    throughout: an automatic run warms up to 1 only) and rate decay.
    """
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    dropout = DROPOUT if method == "mc_dropout" else 0.0
    net = bbb.mlp(SIZES, dropout=dropout)
    model = bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=len(split.x_train))
    if method.startswith("bnn"):
        if "lowrank" in method:
            guide = bbb.LowRankGuide(model, rank=4, init_scale=0.01)
        else:
            guide = bbb.MeanFieldGuide(model, init_scale=0.01)
        end = 0.1 if method.endswith("tempered") else 1.0
        if epochs is None:
            beta = None if end == 1.0 else end
        else:
            beta = LinearWarmup(epochs / 5, end=end)
        reparam = "local"
    else:
        guide = AutoDelta(model, init_loc_fn=init_to_value(values=initial_values(model)))
        beta, reparam = 1.0, None
    history = bbb.fit(
        model,
        guide,
        split.x_train,
        split.y_train,
        epochs=epochs,
        batch_size=128,
        lr=1e-2,
        lr_schedule=1.0 if epochs else None,  # the published table's constant rate
        num_particles=1,  # and one sample a step, fit's default then
        beta=beta,
        reparam=reparam,
        seed=seed,
        progress=False,
    )
    return model, guide, history


def _has_dropout(model) -> bool:
    return any(isinstance(m, torch.nn.Dropout) for m in model.modules())


def evaluate(model, guide, split: Split, ood: dict[str, torch.Tensor], seed: int) -> dict:
    """Test metrics and OOD AUROCs of one fitted method."""
    # A point estimate without dropout predicts the same at every sample: one is exact, and it
    # makes the mutual information exactly 0 (100 equal samples leave rounding noise in it).
    num_samples = 1 if isinstance(guide, AutoDelta) and not _has_dropout(model) else 100
    pred = bbb.predict(model, guide, split.x_test, num_samples=num_samples, seed=seed)
    probs = pred.probs
    row = {
        "accuracy": metrics.accuracy(probs, split.y_test),
        "nll": metrics.nll(pred.log_probs, split.y_test),
        "ece": metrics.expected_calibration_error(probs, split.y_test, num_bins=15),
        "brier": metrics.brier(probs, split.y_test),
    }
    for name, x_ood in ood.items():
        out = bbb.predict(model, guide, x_ood, num_samples=num_samples, seed=seed)
        labels = torch.cat([torch.zeros(len(split.x_test)), torch.ones(len(x_ood))]).long()
        for score in ("entropy", "mutual_information"):
            scores = torch.cat([getattr(pred, score), getattr(out, score)])
            row[f"auroc_{name}_{score}"] = metrics.auroc(scores, labels)
    return row, probs


COLUMNS = (
    ("accuracy", "accuracy ↑"),
    ("nll", "NLL ↓"),
    ("ece", "ECE ↓"),
    ("brier", "Brier ↓"),
    ("auroc_noise_entropy", "AUROC noise, H ↑"),
    ("auroc_noise_mutual_information", "AUROC noise, MI ↑"),
    ("auroc_rotated_entropy", "AUROC rot90, H ↑"),
    ("auroc_rotated_mutual_information", "AUROC rot90, MI ↑"),
)


def markdown(summary: dict, seeds: int, epochs: int | None, seconds: float) -> str:
    lines = [
        f"Digits test set (450 images), mean ± s.e. over {seeds} seed(s); "
        f"{epochs or 'automatic (epochs=None)'} epochs, "
        "batch 128, Adam lr 0.01, 64-100-10 ReLU; 100 predictive samples; ECE with 15 bins.",
        "",
        markdown_table(
            ("method", *(label for _, label in COLUMNS)),
            [
                (method, *(f"{row[key][0]:.3f} ± {row[key][1]:.3f}" for key, _ in COLUMNS))
                for method, row in summary.items()
            ],
            align="l" * (len(COLUMNS) + 1),
        ),
    ]
    lines += ["", f"Wall time {seconds:.0f} s on {machine()}, one thread."]
    lengths = {m: row for m, row in summary.items() if "epochs" in row}
    if lengths:
        rows = [
            (m, f"{row['epochs'][0]:.0f}", f"{row['fit_seconds'][0]:.1f}")
            for m, row in lengths.items()
        ]
        lines += ["", markdown_table(("method", "epochs", "fit seconds"), rows, align="lrr")]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument(
        "--epochs",
        type=lambda text: None if text == "auto" else int(text),
        default=200,
        help="epochs (200); auto: fit's epochs=None, until more training stops paying",
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--out", default="digits_results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    split = digits(seed=0)
    ood = ood_sets(split, seed=0)
    start = time.perf_counter()
    rows: dict[str, list[dict]] = {m: [] for m in args.methods}
    jobs = [(seed, m) for seed in range(args.seeds) for m in args.methods]
    for seed, method in tqdm(jobs, desc="digits", unit="fit"):
        model, guide, history = train(method, split, epochs=args.epochs, seed=seed)
        row, probs = evaluate(model, guide, split, ood, seed)
        row.update(epochs=len(history), fit_seconds=sum(history.seconds))
        rows[method].append(row)
        if seed == 0:  # figures from the first seed
            plot_reliability(
                probs, split.y_test, title=method, path=out / f"reliability_{method}.png"
            )
            if method == "bnn_meanfield_tempered":
                plot_weight_sigma(
                    guide.posterior(),
                    prior_scale=1.0,
                    title="Digits, mean-field BNN (β → 0.1): posterior σ per weight",
                    path=out / "weight_sigma.png",
                )
    seconds = time.perf_counter() - start
    keys = [key for key, _ in COLUMNS] + ["epochs", "fit_seconds"]
    summary = {
        m: {key: mean_error([r[key] for r in rs], error="se") for key in keys}
        for m, rs in rows.items()
    }
    table = markdown(summary, args.seeds, args.epochs, seconds)
    print(table)
    report = {"epochs": args.epochs, "seeds": args.seeds, "summary": summary, "runs": rows}
    save_report(out, "digits", table, report)
    print(f"Saved {out / 'digits.md'}, {out / 'digits.json'} and the figures in {out}")


if __name__ == "__main__":
    main()
