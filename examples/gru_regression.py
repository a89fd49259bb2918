"""A Bayesian GRU that predicts the next value of a noisy sine wave, with error bars.

Shows: ``bayesianize`` on a network with an ``nn.GRU`` (its weights are drawn by weight
sampling, the read-out ``nn.Linear`` by local reparameterisation: ``fit`` says which layer got
which), a learned Gaussian noise, and how the predictive standard deviation splits into
epistemic and aleatoric parts. ``torch.func.vmap`` cannot batch a GRU, so several weight draws
at once (a step's particles, the predictive's samples) run through the network one after
another (``fit`` says so once, and ``History.draws``).

Each example is a window of 12 steps of ``sin(0.3 t)`` plus noise of standard deviation 0.1;
the target is the next (noisy) value.

    python examples/gru_regression.py [--num 400] [--max-steps N]
"""

import argparse
import warnings

import pyro
import torch
from torch import nn

import pyro_bbb

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--num", type=int, default=400, help="training windows")
parser.add_argument("--max-steps", type=int, default=None, help="fit's budget (its default)")
args = parser.parse_args()
torch.set_num_threads(1)
pyro.set_rng_seed(0)


def windows(num: int, length: int = 12, noise: float = 0.1):
    """``x (num, length, 1)`` windows of a noisy sine wave, ``y (num,)`` the next value."""
    start = 60 * torch.rand(num, 1)
    t = start + torch.arange(length + 1)
    series = torch.sin(0.3 * t) + noise * torch.randn(num, length + 1)
    return series[:, :-1, None], series[:, -1]


class Forecaster(nn.Module):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.rnn = nn.GRU(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[..., -1, :])


x, y = windows(args.num)
x_test, y_test = windows(300)
model = pyro_bbb.BNN(
    pyro_bbb.bayesianize(Forecaster()), pyro_bbb.likelihoods.Gaussian(), num_data=len(x)
)
guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.01)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    history = pyro_bbb.fit(
        model, guide, x, y, batch_size=50, lr=1e-2, reparam="local", seed=0, progress=False,
        max_steps=args.max_steps,
    )  # fmt: skip
    pred = pyro_bbb.predict(model, guide, x_test, num_samples=50, seed=0)
for warning in caught:
    print(f"note: {warning.message}")
rmse = pyro_bbb.metrics.rmse(pred.mean, y_test)
print(f"fit: {len(history)} epochs in {sum(history.seconds):.1f} s; test RMSE {rmse:.3f}")
print(
    f"predictive std: epistemic {pred.epistemic_std.mean():.3f}, aleatoric "
    f"{pred.aleatoric_std.mean():.3f} (the data's noise is 0.100)"
)
