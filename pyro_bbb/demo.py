"""The demo: a BNN on 1-D data with a gap, its uncertainty by region, and a figure.

``python -m pyro_bbb demo`` (or ``pyro-bbb demo``) runs :func:`demo`: it fits a Bayesian MLP
to points of ``sin(x) + N(0, 0.1²)`` on ``[-4, -1] ∪ [1, 4]``, prints the epistemic and
total predictive std in the gap, near the data and in extrapolation, and saves the predictive
bands. With ``--nuts`` it also samples the same model with NUTS (the NumPyro backend,
``pip install "pyro-bbb[numpyro]"``) and draws NUTS's band over VI's. The core package never
imports this module.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .infer.mcmc import NUTSResult
    from .infer.predictive import RegressionPrediction

__all__ = ["REGIONS", "GapDemo", "demo", "fit_gap_demo", "nuts_gap_demo", "uncertainty_by_region"]


@dataclass
class GapDemo:
    """The trained pieces of the gap demo."""

    data: object  # pyro_bbb.data.ToyData
    model: object  # BNN
    guide: object  # MeanFieldGuide
    history: object  # History


def fit_gap_demo(
    *,
    epochs: int | None = None,
    max_steps: int | None = None,
    seed: int = 0,
    reparam: str | None = None,
    progress: bool | None = None,
) -> GapDemo:
    """Fit the demo's BNN: a 1-20-20-1 ReLU MLP on 500 points of ``sin(x) + N(0, 0.1²)``.

    The data lie on ``[-4, -1] ∪ [1, 4]``. The guide starts wide (σ = 0.2): a mean-field
    guide started narrow tends to stay narrow where no data constrain it, which is exactly
    the gap (Foong et al. 2019, https://arxiv.org/abs/1906.11537). The length, β and the
    learning rate are :func:`~pyro_bbb.fit`'s defaults: the likelihood first (β = 0) while
    fitting it still pays, β's warm-up, the full rate while the fit to the data still
    improves, then the rate's decay; at seed 0 about 4,000 full-batch epochs. Started wide
    with β rising from the first epoch, the guide can settle where the learned noise
    explains the data (``docs/small_data.md``).

    Args:
        epochs: Full-batch epochs (one step each); ``None`` (the default) for ``fit``'s
            default length, until more training stops paying.
        max_steps: The budget of the default length, in steps (``fit``'s ``max_steps``).
        seed: Seed of the data and of training.
        reparam: Gradient estimator, ``None``, ``"local"`` or ``"flipout"``.
        progress: Show a progress bar (``None``: in a terminal or a notebook).

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
        max_steps=max_steps,
        lr=1e-2,
        num_particles=4,
        reparam=reparam,
        seed=seed,
        progress=progress,
    )
    return GapDemo(data, model, guide, history)


def nuts_gap_demo(
    fitted: GapDemo, *, draws: int = 200, seed: int = 0, progress: bool | None = None
) -> NUTSResult:
    """Sample the demo's model with NUTS (NumPyro backend), the noise held at VI's value.

    Two chains of ``draws`` warm-up iterations and ``draws`` draws. This posterior (481
    weights, 500 points, noise 0.1) is stiff: step sizes near 0.001 and a thousand leapfrog
    steps a draw, so the defaults take a few minutes and are far from converged (a smallest
    function-space ESS near 10, R̂ up to 1.2); the band is a rough reference, which
    ``examples/vi_vs_nuts.py`` makes converged on a smaller net.

    Args:
        fitted: The trained demo, from :func:`fit_gap_demo`.
        draws: Warm-up iterations, and draws kept, per chain.
        seed: Seed of the chains.
        progress: Show NumPyro's progress bar (``None``: in a terminal or a notebook).

    Returns:
        The :class:`~pyro_bbb.infer.mcmc.NUTSResult`.

    Raises:
        ImportError: Without JAX and NumPyro (``pip install "pyro-bbb[numpyro]"``).
    """
    import pyro_bbb as bbb

    from ._display import show_progress

    data = fitted.data
    return bbb.run_nuts(
        fitted.model, data.x, data.y, num_samples=draws, warmup_steps=draws, num_chains=2,
        seed=seed, backend="numpyro", noise="fixed",
        progress=show_progress(progress),
    )  # fmt: skip


#: Regions of the demo's input axis, by distance ``|x|`` from the origin.
REGIONS = {"gap": (0.0, 1.0), "data": (1.25, 3.75), "extrapolation": (5.0, 7.0)}


def uncertainty_by_region(
    pred: RegressionPrediction, x: torch.Tensor
) -> dict[str, dict[str, float]]:
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
    epochs: int | None = None,
    max_steps: int | None = None,
    seed: int = 0,
    reparam: str | None = None,
    progress: bool | None = None,
    nuts: bool = False,
    nuts_draws: int = 200,
) -> dict[str, dict[str, float]]:
    """Fit a BNN to 1-D data with a gap, print its uncertainty by region, save a figure.

    Args:
        out: Where to save the PNG figure.
        epochs: Training epochs, see :func:`fit_gap_demo` (``None``: ``fit``'s default
            length).
        max_steps: The default length's budget in steps, see :func:`fit_gap_demo`.
        seed: Random seed (data and training).
        reparam: Gradient estimator, ``None``, ``"local"`` or ``"flipout"``.
        progress: Show a progress bar (``None``: in a terminal or a notebook).
        nuts: Also sample the model with NUTS (:func:`nuts_gap_demo`), print its uncertainty
            and convergence, and draw its band in the figure.
        nuts_draws: Warm-up iterations and draws per chain of NUTS.

    Returns:
        The summary of :func:`uncertainty_by_region` (VI's).

    Raises:
        ImportError: With ``nuts`` but without JAX and NumPyro.
    """
    import pyro_bbb as bbb
    from pyro_bbb.data import gap_function
    from pyro_bbb.plots import plot_regression_bands

    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 1-20-20-1 net runs fastest on one thread
    try:
        fitted = fit_gap_demo(
            epochs=epochs, max_steps=max_steps, seed=seed, reparam=reparam, progress=progress
        )
        x_test = torch.linspace(-7, 7, 561).unsqueeze(-1)
        pred = bbb.predict(fitted.model, fitted.guide, x_test, num_samples=200, seed=seed)
        reference = None
        if nuts:
            result = nuts_gap_demo(fitted, draws=nuts_draws, seed=seed, progress=progress)
            nuts_pred = result.predict(fitted.model, x_test, seed=seed)
            checks = bbb.evaluation.function_space_diagnostics(fitted.model, result, x_test)
            reference = ("NUTS", nuts_pred.mean, nuts_pred.epistemic_std)
    finally:
        torch.set_num_threads(threads)
    summary = uncertainty_by_region(pred, x_test)
    print(f"Trained {fitted.history}")
    print(f"Stopped: {fitted.history.stopped}")
    print(f"Learned noise std: {pred.aleatoric_std.mean():.3f} (true 0.1)")
    print(f"{'region':<15}{'|x|':>12}{'epistemic std':>15}{'total std':>12}")
    for name, (low, high) in REGIONS.items():
        row = summary[name]
        span = f"{low:g}-{high:g}"
        print(f"{name:<15}{span:>12}{row['epistemic']:>15.3f}{row['total']:>12.3f}")
    ratio = summary["gap"]["epistemic"] / summary["data"]["epistemic"]
    print(f"Epistemic std in the gap is {ratio:.1f}x that near the data.")
    title = "Bayes by Backprop, mean-field guide: ±2σ epistemic and total"
    if nuts:
        steps = result.sample_stats["n_steps"].float().mean()
        print(
            f"NUTS (NumPyro, noise held at VI's {result.noise_value:.3f}): "
            f"{result.num_chains} chains x ({result.warmup_steps} + {result.num_samples}) in "
            f"{result.wall_time:.0f} s, {steps:.0f} leapfrog steps a draw; {checks}"
        )
        nuts_summary = uncertainty_by_region(nuts_pred, x_test)
        print(f"{'NUTS epistemic':<15}" + "".join(
            f"  {name} {row['epistemic']:.3f}" for name, row in nuts_summary.items()
        ))  # fmt: skip
        title = (
            f"Mean-field VI (blue) against NUTS (red, {result.num_chains} chains, "
            f"function-space R̂ ≤ {float(checks.r_hat.max()):.2f}) on the same model"
        )
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
        title=title,
        reference=reference,
        path=out,
    )
    print(f"Saved the figure to {Path(out).resolve()} ({time.perf_counter() - start:.0f} s)")
    return summary
