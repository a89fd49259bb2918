"""``benchmarks/online.py --parts drift``: following a stream whose distribution moves.

The digits rotated by an angle growing along the stream (0 to 180 degrees): accuracy on test
images at the current angle as the stream goes, for LoFi with and without dynamics noise and
for one-pass Adam at two rate schedules.
"""

from __future__ import annotations

import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from _common import markdown_table, plus_minus
from _online_streams import BATCH, digits_model

import pyro_bbb as bbb
from pyro_bbb.bench.online import run_updater
from pyro_bbb.data import digits
from pyro_bbb.online import LoFi
from pyro_bbb.training import Callback

MAX_ANGLE = 180.0


def rotate(images, degrees):
    """Rotate (N, 64) 8x8 images by ``degrees`` (bilinear, zero outside)."""
    angle = torch.as_tensor(degrees, dtype=torch.float32).reshape(-1)
    angle = torch.deg2rad(angle).expand(len(images))
    cos, sin = angle.cos(), angle.sin()
    zeros = torch.zeros_like(cos)
    theta = torch.stack(
        [torch.stack([cos, -sin, zeros], -1), torch.stack([sin, cos, zeros], -1)], 1
    )
    grid = F.affine_grid(theta, (len(images), 1, 8, 8), align_corners=False)
    rotated = F.grid_sample(images.reshape(-1, 1, 8, 8), grid, align_corners=False)
    return rotated.reshape(-1, 64)


DRIFT_METHODS = {
    "LoFi, no dynamics noise": 0.0,
    "LoFi, q = 1e-4": 1e-4,
    "LoFi, q = 1e-3": 1e-3,
    "LoFi, q = 1e-2": 1e-2,
}


#: One-pass Adam at fit's default rate schedule (constant, then decaying over the last 30 % of
#: the stream) and at a constant rate, which can keep following a drift.
ADAM_SCHEDULES = {"one-pass Adam (fit's lr schedule)": None, "one-pass Adam, constant lr": 1.0}


class _Evaluate(Callback):
    """Accuracy at the current angle every ``every`` steps of one-pass Adam."""

    def __init__(self, model, guide, split, every, num_train, curve):
        self.model, self.guide, self.split = model, guide, split
        self.every, self.num_train, self.curve = every, num_train, curve

    def on_after_backward(self, params, step):
        if step and step % self.every == 0:
            seen = step * BATCH
            self.curve.append(
                (seen, drift_accuracy(self.model, self.guide, self.split, seen, self.num_train, 1))
            )


def drift_accuracy(model, guide, split, seen, num_train, num_samples):
    angle = MAX_ANGLE * seen / num_train
    prediction = bbb.predict(
        model, guide, rotate(split.x_test, angle), num_samples=num_samples, seed=0
    )
    return float((prediction.predicted == split.y_test).double().mean())


def part_drift(seeds, out):
    split = digits(seed=0)
    num = len(split.x_train)
    every = 10  # minibatches between evaluations
    curves = {name: [] for name in (*DRIFT_METHODS, *ADAM_SCHEDULES)}
    for seed in range(seeds):
        order = torch.randperm(num, generator=torch.Generator().manual_seed(seed))
        angles = MAX_ANGLE * torch.arange(num) / num
        x = rotate(split.x_train[order], angles)
        y = split.y_train[order]
        for name, q in DRIFT_METHODS.items():
            model = digits_model(num, seed)
            updater = LoFi(model, rank=10, dynamics_noise=q)
            curve = []
            run_updater(
                updater,
                x,
                y,
                batch_size=BATCH,
                every=every,
                callback=lambda seen, m=model, u=updater, c=curve: c.append(
                    (seen, drift_accuracy(m, u.guide, split, seen, num, 30))
                ),
            )
            curves[name].append(curve)
            print(f"  drift seed {seed} {name}: final {curve[-1][1]:.3f}", flush=True)
        for name, schedule in ADAM_SCHEDULES.items():
            model = digits_model(num, seed)
            curve = []
            guide = bbb.DeltaGuide(model, name=f"adam{seed}")
            bbb.fit(
                model,
                guide,
                x,
                y,
                epochs=1,
                batch_size=BATCH,
                shuffle=False,
                progress=False,
                seed=seed,
                lr_schedule=schedule,
                callbacks=[_Evaluate(model, guide, split, every, num, curve)],
            )
            curve.append((num, drift_accuracy(model, guide, split, num, num, 1)))
            curves[name].append(curve)
            print(f"  drift seed {seed} {name}: final {curve[-1][1]:.3f}", flush=True)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    summary = []
    for index, (name, runs) in enumerate(curves.items()):
        seen = [p[0] for p in runs[0]]
        accuracy = torch.tensor([[p[1] for p in run] for run in runs])
        ax.plot(
            [MAX_ANGLE * s / num for s in seen], accuracy.mean(0), label=name, color=f"C{index}"
        )
        second_half = [[a for s, a in run if s > num / 2] for run in runs]
        summary.append(
            {
                "method": name,
                "second_half": [statistics.fmean(r) for r in second_half],
                "final": [run[-1][1] for run in runs],
            }
        )
    ax.set_xlabel("current angle (degrees); the stream's position")
    ax.set_ylabel("test accuracy at the current angle")
    ax.set_title("Digits rotated along the stream, minibatches of 10, LoFi rank 10")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "online_drift.png", dpi=110)
    plt.close(fig)
    lines = [
        "### A drifting stream: digits rotated by an angle growing from 0 to 180 degrees",
        "",
        "The 1,347 training images, each rotated by the angle of its place in the stream; every "
        "10 minibatches, accuracy on the 450 test images rotated by the current angle (30 "
        f"predictive samples). Mean ± sd over {seeds} seeds: accuracy averaged over the second "
        "half of the stream (90 to 180 degrees) and at its end.",
        "",
        markdown_table(
            ("method", "accuracy, second half", "accuracy at the end"),
            [(r["method"], plus_minus(r["second_half"]), plus_minus(r["final"])) for r in summary],
            align="lll",
        ),
    ]
    return {"curves": curves, "summary": summary}, "\n".join(lines)
