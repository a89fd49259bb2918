"""Mean-field VI, low-rank VI and NUTS on the same BNN: the gap data, side by side.

Fits a small tanh network to 1-D data with a gap in the middle of its inputs, three ways:
a mean-field guide, a low-rank guide (one block over the whole network) and NUTS, all on
the same model with the noise fixed at its true 0.1. It prints the epistemic std in the gap
and near the data, the `compare` tables of each guide against NUTS, and saves one PNG with
the three predictive bands. Mean-field VI is known to miss the "in-between" uncertainty
in the gap (Foong et al. 2019, https://arxiv.org/abs/1906.11537); NUTS shows it.

    python examples/vi_vs_nuts.py --out vi_vs_nuts.png

NUTS dominates the cost: about 7 to 11 minutes on two busy cores with the defaults (every
draw runs into the tree-depth cap of 8); docs/vi_vs_nuts.md says why and shows the output.
"""

from __future__ import annotations

import argparse
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pyro
import torch

import pyro_bbb as bbb

NOISE = 0.1


def gap_test_set(num: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Test points half in the data's regions, half in the gap (-1, 1), noisy like training."""
    data = bbb.data.gap_regression(num // 2, noise=NOISE, seed=seed)
    g = torch.Generator().manual_seed(seed)
    x_gap = torch.rand(num - num // 2, 1, generator=g) * 2 - 1
    y_gap = bbb.data.gap_function(x_gap).squeeze(-1) + NOISE * torch.randn(
        num - num // 2, generator=g
    )
    return torch.cat([data.x, x_gap]), torch.cat([data.y, y_gap])


def region_std(prediction, x: torch.Tensor) -> dict[str, float]:
    """Mean epistemic std of a prediction over the gap and over the data's regions."""
    x = x.squeeze(-1)
    std = prediction.epistemic_std
    out = {}
    for region, intervals in bbb.data.gap_regions().items():
        inside = torch.zeros_like(x, dtype=torch.bool)
        for low, high in intervals:
            inside |= (x >= low) & (x <= high)
        out[region] = float(std[inside].mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-data", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=3000)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--max-tree-depth", type=int, default=8)
    parser.add_argument("--out", default="vi_vs_nuts.png")
    args = parser.parse_args()
    torch.set_num_threads(1)  # small nets run fastest on one thread
    pyro.clear_param_store()

    data = bbb.data.gap_regression(args.num_data, noise=NOISE, seed=0)
    x, y = data.x, data.y
    x_test, y_test = gap_test_set(200, seed=1)
    net = bbb.mlp([1, args.hidden, 1], activation="tanh", prior=bbb.priors.Gaussian(1.0))
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(scale=NOISE), num_data=len(x))
    print(f"{args.num_data} points, 1-{args.hidden}-1 tanh net, noise fixed at {NOISE}")

    guides = {
        "mean-field": bbb.MeanFieldGuide(model, init_scale=0.05, name="mean_field"),
        "low-rank": bbb.LowRankGuide(
            model, rank=10, blocks="network", init_scale=0.01, name="low_rank"
        ),
    }
    histories = {}
    for name, guide in guides.items():
        histories[name] = bbb.fit(
            model, guide, x, y, epochs=args.epochs, lr=0.01, num_particles=8, seed=0,
            progress=False,
        )  # fmt: skip
        print(f"{name}: {args.epochs} epochs in {sum(histories[name].seconds):.1f} s")

    nuts = bbb.run_nuts(
        model, x, y, num_samples=args.samples, warmup_steps=args.warmup,
        num_chains=args.chains, seed=0, max_tree_depth=args.max_tree_depth,
    )  # fmt: skip
    stats = nuts.sample_stats
    print(
        f"NUTS: {args.chains} chains x ({args.warmup} warm-up + {args.samples}) in "
        f"{nuts.wall_time:.0f} s; step size {nuts.warmup_stats['step_size'].tolist()}, "
        f"mean tree depth {stats['tree_depth'].float().mean():.1f}, "
        f"mean leapfrog steps {stats['n_steps'].float().mean():.0f}, "
        f"divergences {nuts.num_divergences}"
    )
    rhat = torch.cat([v.reshape(-1) for v in bbb.evaluation.r_hat(nuts).values()])
    ess = torch.cat([v.reshape(-1) for v in bbb.evaluation.effective_sample_size(nuts).values()])
    print(
        f"NUTS: bulk ESS min {ess.min():.0f} median {ess.median():.0f}, R-hat max {rhat.max():.2f}"
    )

    x_grid = torch.linspace(-7, 7, 300).unsqueeze(-1)
    predictions = {
        name: bbb.predict(model, g, x_grid, num_samples=1000, seed=0) for name, g in guides.items()
    }
    predictions["NUTS"] = nuts.predict(model, x_grid, seed=0)
    print("\nmean epistemic std by region (gap (-1, 1), data, extrapolation)")
    for name, prediction in predictions.items():
        std = region_std(prediction, x_grid)
        print(f"  {name:<10} gap {std['gap']:.3f}  data {std['data']:.3f}  "
              f"extrapolation {std['extrapolation']:.3f}")  # fmt: skip

    for name, guide in guides.items():
        report = bbb.compare(
            model, (guide, histories[name]), nuts, x_test, y_test, names=(name, "NUTS"),
            x_train=x, y_train=y,
        )  # fmt: skip
        print(f"\n{name} against NUTS on 200 test points (half in the gap)\n{report}")

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True, layout="constrained")
    xs = x_grid.squeeze(-1)
    for ax, (name, prediction) in zip(axes, predictions.items(), strict=True):
        mean, epistemic, total = prediction.mean, prediction.epistemic_std, prediction.std
        ax.axvspan(-1, 1, color="0.5", alpha=0.12, lw=0, label="gap")
        ax.fill_between(xs, mean - 2 * total, mean + 2 * total, color="C0", alpha=0.18, lw=0,
                        label="±2σ total")  # fmt: skip
        ax.fill_between(xs, mean - 2 * epistemic, mean + 2 * epistemic, color="C0", alpha=0.4,
                        lw=0, label="±2σ epistemic")  # fmt: skip
        ax.plot(xs, mean, color="C0", lw=2, label="predictive mean")
        ax.plot(xs, torch.sin(xs), "--", color="C1", lw=1.2, label="sin x")
        ax.scatter(x.squeeze(-1), y, s=10, color="k", zorder=3, label="training data")
        ax.set_title(name)
        ax.set_xlabel("x")
        ax.set_ylim(-3, 3)
    axes[0].set_ylabel("y")
    axes[0].legend(loc="lower left", fontsize="small")
    figure.savefig(args.out, dpi=110)
    print(f"\nsaved {args.out}")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - start:.0f} s")
