"""The demo: a BNN on 1-D data with a gap, its uncertainty by region, and a figure.

``python -m pyro_bbb demo`` (or ``pyro-bbb demo``) runs :func:`demo`: it fits a Bayesian MLP
to points of ``sin(x) + N(0, 0.1²)`` on ``[-4, -1] ∪ [1, 4]``, prints the epistemic and
total predictive std in the gap, near the data and in extrapolation, and saves the predictive
bands. The core package never imports this module.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["REGIONS", "GapDemo", "demo", "fit_gap_demo", "uncertainty_by_region"]


@dataclass
class GapDemo:
    """The trained pieces of the gap demo."""

    data: object  # pyro_bbb.data.ToyData
    model: object  # BNN
    guide: object  # MeanFieldGuide
    history: object  # History


def fit_gap_demo(
    *, epochs: int = 3000, seed: int = 0, reparam: str | None = None, progress: bool | None = None
) -> GapDemo:
    """Fit the demo's BNN: a 1-20-20-1 ReLU MLP on 500 points of ``sin(x) + N(0, 0.1²)``.

    The data lie on ``[-4, -1] ∪ [1, 4]``. The guide starts wide (σ = 0.2): a mean-field
    guide started narrow tends to stay narrow where no data constrain it, which is exactly
    the gap (Foong et al. 2019, https://arxiv.org/abs/1906.11537). β follows
    :func:`~pyro_bbb.fit`'s default, the likelihood first: 0 for the first quarter of the
    epochs, then linear to 1 by half-way. Started wide with β rising from the first epoch,
    the guide can settle where the learned noise explains the data (``docs/small_data.md``).

    Args:
        epochs: Full-batch epochs (one step each).
        seed: Seed of the data and of training.
        reparam: Gradient estimator, ``None``, ``"local"`` or ``"flipout"``.
        progress: Show a progress bar (``None``: when attached to a terminal).

    Returns:
        The data, model, guide and training history.
    """
    import pyro

    import pyro_bbb as bbb
    from pyro_bbb.data import gap_regression

    data = gap_regression(num_data=500, noise=0.1, seed=seed)
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = bbb.mlp([1, 20, 20, 1], activation="relu")
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=len(data.x))
    guide = bbb.MeanFieldGuide(model, init_scale=0.2)
    history = bbb.fit(
        model,
        guide,
        data.x,
        data.y,
        epochs=epochs,
        lr=1e-2,
        num_particles=4,
        reparam=reparam,
        seed=seed,
        progress=progress,
    )
    return GapDemo(data, model, guide, history)


#: Regions of the demo's input axis, by distance ``|x|`` from the origin.
REGIONS = {"gap": (0.0, 1.0), "data": (1.25, 3.75), "extrapolation": (5.0, 7.0)}


def uncertainty_by_region(pred, x: torch.Tensor) -> dict[str, dict[str, float]]:
    """Mean epistemic and total predictive std in each of :data:`REGIONS`.

    Args:
        pred: A :class:`~pyro_bbb.RegressionPrediction` at ``x``.
        x: Inputs ``(batch, 1)``.

    Returns:
        ``{region: {"epistemic": std, "total": std}}`` in target units.
    """
    distance = x[:, 0].abs()
    summary = {}
    for name, (low, high) in REGIONS.items():
        mask = (distance >= low) & (distance <= high)
        summary[name] = {
            "epistemic": pred.epistemic_std[mask].mean().item(),
            "total": pred.std[mask].mean().item(),
        }
    return summary


def demo(
    *,
    out: str | Path = "pyro_bbb_demo.png",
    epochs: int = 3000,
    seed: int = 0,
    reparam: str | None = None,
    progress: bool | None = None,
) -> dict[str, dict[str, float]]:
    """Fit a BNN to 1-D data with a gap, print its uncertainty by region, save a figure.

    Args:
        out: Where to save the PNG figure.
        epochs: Training epochs, see :func:`fit_gap_demo`.
        seed: Random seed (data and training).
        reparam: Gradient estimator, ``None``, ``"local"`` or ``"flipout"``.
        progress: Show a progress bar (``None``: when attached to a terminal).

    Returns:
        The summary of :func:`uncertainty_by_region`.
    """
    import pyro_bbb as bbb
    from pyro_bbb.data import gap_function
    from pyro_bbb.plots import plot_regression_bands

    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 1-20-20-1 net runs fastest on one thread
    try:
        fitted = fit_gap_demo(epochs=epochs, seed=seed, reparam=reparam, progress=progress)
        x_test = torch.linspace(-7, 7, 561).unsqueeze(-1)
        pred = bbb.predict(fitted.model, fitted.guide, x_test, num_samples=200, seed=seed)
    finally:
        torch.set_num_threads(threads)
    summary = uncertainty_by_region(pred, x_test)
    print(f"Trained {fitted.history}")
    print(f"Learned noise std: {pred.aleatoric_std.mean():.3f} (true 0.1)")
    print(f"{'region':<15}{'|x|':>12}{'epistemic std':>15}{'total std':>12}")
    for name, (low, high) in REGIONS.items():
        row = summary[name]
        span = f"{low:g}-{high:g}"
        print(f"{name:<15}{span:>12}{row['epistemic']:>15.3f}{row['total']:>12.3f}")
    ratio = summary["gap"]["epistemic"] / summary["data"]["epistemic"]
    print(f"Epistemic std in the gap is {ratio:.1f}x that near the data.")
    plot_regression_bands(
        fitted.data.x,
        fitted.data.y,
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
