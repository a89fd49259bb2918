"""Online learning: a BNN's posterior updated as the data arrive, one minibatch at a time.

LoFi (a low-rank extended Kalman filter) folds each minibatch of 10 points into a Gaussian
belief over the weights in closed form, in one pass; the belief is a guide at every point of
the stream, so `predict` draws the predictive bands as the stream arrives. Prints the test
log-likelihood and the learned noise scale along the way; saves online_regression.png.

    python examples/online_regression.py [--points 1000] [--out online_regression.png]
"""

import argparse

import matplotlib.pyplot as plt
import pyro
import torch

import pyro_bbb
from pyro_bbb.priors import FanInGaussian

parser = argparse.ArgumentParser(description="LoFi on a 1-D stream, bands as it arrives")
parser.add_argument("--points", type=int, default=1000)
parser.add_argument("--out", default="online_regression.png")
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)  # small nets run fastest on one thread


def truth(x):
    return torch.sin(2 * x) + 0.3 * x


x = torch.rand(args.points, 1) * 6 - 3  # the stream: inputs in [-3, 3], in random order
y = truth(x).squeeze(-1) + 0.2 * torch.randn(args.points)
x_test = torch.rand(500, 1) * 6 - 3
y_test = truth(x_test).squeeze(-1) + 0.2 * torch.randn(500)
grid = torch.linspace(-5, 5, 201).unsqueeze(-1)  # the data's range and beyond

pyro.clear_param_store()
# a prior of the network's own scale: a linearised step from a much wider one overshoots
net = pyro_bbb.mlp([1, 50, 1], activation="tanh", prior=FanInGaussian(2.0))
model = pyro_bbb.BNN(net, pyro_bbb.likelihoods.Gaussian(), num_data=args.points)  # learned σ
lofi = pyro_bbb.LoFi(model, rank=10)  # its belief: lofi.guide, a LowRankPrecisionGuide

shown = [n for n in (20, 100, 300, args.points) if n <= args.points]
fig, axes = plt.subplots(1, len(shown), figsize=(4 * len(shown), 3.6), sharey=True)
panels = iter(zip(shown, axes.flat, strict=True))
seen, ax = next(panels)
for start in range(0, args.points, 10):
    lofi.update(x[start : start + 10], y[start : start + 10])  # one minibatch, in one pass
    if lofi.num_seen < seen:
        continue
    pred = pyro_bbb.predict(model, lofi.guide, x_test, num_samples=200, seed=0)
    print(
        f"after {lofi.num_seen:4d} points: test LL {pred.log_likelihood(y_test):6.3f} nats/point,"
        f" noise σ {lofi.noise_scale.item():.3f}"
    )
    band = pyro_bbb.predict(model, lofi.guide, grid, num_samples=200, seed=0)
    g, mean = grid.squeeze(-1), band.mean
    ax.scatter(x[:seen, 0], y[:seen], s=4, color="0.5")
    ax.fill_between(g, mean - 2 * band.std, mean + 2 * band.std, alpha=0.2, color="C0")
    ax.fill_between(
        g, mean - 2 * band.epistemic_std, mean + 2 * band.epistemic_std, alpha=0.5, color="C0"
    )
    ax.plot(g, mean, color="C0")
    ax.plot(g, truth(grid).squeeze(-1), "k--", lw=1)
    ax.set_title(f"{seen} points")
    ax.set_ylim(-3, 3)
    seen, ax = next(panels, (None, None))
    if seen is None:
        break
fig.suptitle("LoFi (rank 10): mean, ±2σ epistemic (dark) and total, as the stream arrives")
fig.tight_layout()
fig.savefig(args.out, dpi=110)
print(f"saved {args.out}")
