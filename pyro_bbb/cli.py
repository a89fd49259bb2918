"""The ``pyro-bbb`` command (also ``python -m pyro_bbb``).

``pyro-bbb demo`` fits a Bayesian MLP to 1-D data with a gap, prints the predictive
uncertainty in the gap, near the data and in extrapolation, and saves a figure. The core
package never imports this module.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["demo", "main"]


def demo(
    *,
    out: str | Path = "pyro_bbb_demo.png",
    epochs: int = 3000,
    seed: int = 0,
    reparam: str | None = None,
    progress: bool | None = None,
) -> dict[str, float]:
    """Fit a BNN to ``sin(x) + noise`` on ``[-4, -1] ∪ [1, 4]`` and show its uncertainty.

    Args:
        out: Where to save the PNG figure.
        epochs: Full-batch training epochs.
        seed: Random seed (data and training).
        reparam: Gradient estimator, ``None``, ``"local"`` or ``"flipout"``.
        progress: Show a progress bar (``None``: when attached to a terminal).

    Returns:
        Mean epistemic and total predictive std per region (``"gap"``, ``"data"``,
        ``"extrapolation"``), and ``"noise"``, the learned noise std (target units).
    """
    import pyro
    import torch

    import pyro_bbb as bbb
    from pyro_bbb.datasets import gap_function, gap_regression
    from pyro_bbb.elbo import Linear
    from pyro_bbb.plots import plot_regression_bands

    start = time.perf_counter()
    data = gap_regression(num_data=160, noise=0.1, seed=seed)
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = bbb.mlp([1, 50, 50, 1], activation="relu")
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=len(data.x))
    guide = bbb.MeanFieldGuide(model, init_scale=0.01)
    history = bbb.fit(
        model,
        guide,
        data.x,
        data.y,
        epochs=epochs,
        lr=1e-2,
        beta=Linear(warmup=epochs / 10),
        num_particles=4,
        reparam=reparam,
        seed=seed,
        progress=progress,
    )
    x_test = torch.linspace(-7, 7, 561).unsqueeze(-1)
    pred = bbb.predict(model, guide, x_test, num_samples=200, seed=seed)
    distance = x_test[:, 0].abs()
    regions = {
        "gap": distance < 1,
        "data": (distance > 1.25) & (distance < 3.75),
        "extrapolation": distance > 5,
    }
    summary: dict[str, float] = {}
    print(f"Trained {history}")
    print(f"Learned noise std: {pred.aleatoric_std.mean():.3f} (true 0.1)")
    print(f"{'region':<15}{'epistemic std':>15}{'total std':>12}")
    for name, mask in regions.items():
        epistemic = pred.epistemic_std[mask].mean().item()
        total = pred.std[mask].mean().item()
        summary[name] = epistemic
        summary[f"{name}_total"] = total
        print(f"{name:<15}{epistemic:>15.3f}{total:>12.3f}")
    summary["noise"] = pred.aleatoric_std.mean().item()
    print(f"gap / data epistemic std ratio: {summary['gap'] / summary['data']:.2f}")
    plot_regression_bands(
        data.x,
        data.y,
        x_test,
        pred.mean,
        pred.epistemic_std,
        pred.std,
        true_fn=gap_function,
        shade=[(-1.0, 1.0)],
        shade_label="gap",
        title="Bayes by Backprop, mean-field guide: ±2σ epistemic and total",
        path=out,
    )
    print(f"Saved the figure to {Path(out).resolve()} ({time.perf_counter() - start:.0f} s)")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pyro-bbb`` command; returns the exit status."""
    parser = argparse.ArgumentParser(prog="pyro-bbb", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("demo", help="fit a BNN to 1-D gap data and plot its uncertainty")
    run.add_argument("--out", default="pyro_bbb_demo.png", help="figure path (PNG)")
    run.add_argument("--epochs", type=int, default=3000)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--reparam", choices=["local", "flipout"], default=None)
    args = parser.parse_args(argv)
    if args.command == "demo":
        demo(out=args.out, epochs=args.epochs, seed=args.seed, reparam=args.reparam)
    return 0


if __name__ == "__main__":
    sys.exit(main())
