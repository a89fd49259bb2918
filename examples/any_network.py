"""A torchvision-style ResNet and an LSTM forecaster, made Bayesian with no change to their code.

Both networks (``examples/user_networks.py``) are written for activations ``(batch, ...)``:
the ResNet normalises with ``BatchNorm2d`` and flattens with ``torch.flatten(x, 1)``, the
LSTM is read at ``out[:, -1]``. ``bayesianize`` puts a prior on every parameter; when several
weight sets are drawn at once (a step's particles, ``predict``'s samples, an ensemble's
members) each network runs once per draw, so its ``forward`` always sees the shapes it was
written for. The script fits both on synthetic data, prints how each meets the draws, the
test accuracy and RMSE, and saves the LSTM's predictive bands in ``any_network.png``.

    python examples/any_network.py [--num 512] [--max-steps N]
"""

import argparse
import math
import warnings

import torch
from user_networks import Recurrent, ResNet

import pyro_bbb as bbb
from pyro_bbb.plots import plot_regression_bands

parser = argparse.ArgumentParser()
parser.add_argument("--num", type=int, default=512, help="training examples of each task")
parser.add_argument("--max-steps", type=int, default=None, help="fit's budget (its default)")
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)


# --- images: stripes across or down, under noise, on 16x16 pixels ---------------------------
def stripes(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, 2, (n,))
    phase = torch.rand(n, 1, 1) * 2 * math.pi
    grid = torch.arange(16.0).reshape(1, 16, 1)
    across = torch.sin(grid * 0.8 + phase).expand(n, 16, 16)
    images = torch.where(labels.reshape(n, 1, 1) == 1, across.mT, across)
    images = images.unsqueeze(1).expand(n, 3, 16, 16) + 0.8 * torch.randn(n, 3, 16, 16)
    return images, labels


x, y = stripes(args.num)
x_test, y_test = stripes(256)
net = bbb.bayesianize(ResNet(num_classes=2), bbb.priors.Gaussian(1.0))
model = bbb.BNN(net, bbb.likelihoods.Categorical(2), num_data=len(x))
guide = bbb.MeanFieldGuide(model, init_scale=0.01)
history = bbb.fit(model, guide, x, y, batch_size=128, lr=3e-3, seed=0, max_steps=args.max_steps)
print(f"ResNet: {len(history)} epochs, {sum(history.seconds):.0f} s; draws go {history.draws}")
model.eval()  # BatchNorm's running statistics for prediction
pred = bbb.predict(model, guide, x_test, num_samples=20, seed=0)
accuracy = (pred.predicted == y_test).float().mean()
print(f"ResNet: test accuracy {accuracy:.3f}; in eval mode draws go {bbb.nn.describe_draws(net)}")


# --- sequences: the next value of a noisy sine wave from its last 20 ---------------------------
def windows(n: int, start: float) -> tuple[torch.Tensor, torch.Tensor]:
    t = start + 0.3 * torch.arange(n + 21.0)
    series = torch.sin(t) + 0.5 * torch.sin(0.31 * t) + 0.1 * torch.randn(n + 21)
    steps = series.unfold(0, 21, 1)[:n]  # (n, 21)
    return steps[:, :20].unsqueeze(-1), steps[:, 20]


s, t = windows(args.num, 0.0)
s_test, t_test = windows(120, 0.3 * args.num)  # later in the series
lstm = bbb.bayesianize(Recurrent(features=1, hidden=16), bbb.priors.Gaussian(1.0))
forecaster = bbb.BNN(lstm, bbb.likelihoods.Gaussian(), num_data=len(s))
guide = bbb.MeanFieldGuide(forecaster, init_scale=0.01)
with warnings.catch_warnings():  # that vmap falls back to a loop is printed below, as draws
    warnings.filterwarnings("ignore", "each step's weight draws run through", UserWarning)
    history = bbb.fit(
        forecaster, guide, s, t, batch_size=64, lr=1e-2, seed=0, max_steps=args.max_steps
    )
print(f"LSTM: {len(history)} epochs, {sum(history.seconds):.0f} s; draws go {history.draws}")
pred = bbb.predict(forecaster, guide, s_test, num_samples=50, seed=0)
rmse = (pred.mean - t_test).pow(2).mean().sqrt()
print(
    f"LSTM: test RMSE {rmse:.3f}; mean sd epistemic {pred.epistemic_std.mean():.3f}, "
    f"total {pred.std.mean():.3f}"
)
steps, steps_test = torch.arange(len(t)) * 0.3, (len(t) + torch.arange(len(t_test))) * 0.3
plot_regression_bands(
    steps[-200:], t[-200:], steps_test, pred.mean, pred.epistemic_std, pred.std,
    title="LSTM forecaster made Bayesian by bayesianize: the next value",
    path="any_network.png",
)  # fmt: skip
print("saved any_network.png")
