"""A Bayesian 1-D ConvNet that tells noisy sine waves from noisy square waves.

Shows: ``bayesianize`` on ``nn.Conv1d`` (local reparameterisation and flipout apply to every
ConvNd), ``model.summary()`` listing every parameter, and the predictive entropy rising on
sequences unlike either class (white noise).

Each sequence is 32 steps of ``sin`` or ``sign(sin)`` at a random frequency and phase, plus
Gaussian noise of standard deviation 0.3; the label says which. The network reads
``(batch, 1, 32)``: two convolutions, a global average over time, a linear read-out.

    python examples/conv1d_sequences.py [--num 600] [--max-steps N]
"""

import argparse

import pyro
import torch
from torch import nn

import pyro_bbb

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--num", type=int, default=600, help="training sequences")
parser.add_argument("--max-steps", type=int, default=None, help="fit's budget (its default)")
args = parser.parse_args()
torch.set_num_threads(1)
pyro.set_rng_seed(0)


def waves(num: int, length: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """``x (num, 1, length)``, ``y (num,)``: 0 for a sine, 1 for a square wave."""
    t = torch.arange(length)
    freq = 0.1 + 0.3 * torch.rand(num, 1)
    phase = 6.3 * torch.rand(num, 1)
    clean = torch.sin(freq * t + phase)
    y = torch.randint(0, 2, (num,))
    x = torch.where(y[:, None] == 1, torch.sign(clean), clean) + 0.3 * torch.randn(num, length)
    return x[:, None, :], y


class MeanOverTime(nn.Module):
    """Average the last (time) dim: ``(*S, B, C, T) -> (*S, B, C)``."""

    def forward(self, x):
        return x.mean(-1)


x, y = waves(args.num)
x_test, y_test = waves(500)
net = nn.Sequential(
    nn.Conv1d(1, 8, 5, padding=2), nn.ReLU(),
    nn.Conv1d(8, 8, 5, padding=2), nn.ReLU(),
    MeanOverTime(), nn.Linear(8, 2),
)  # fmt: skip
model = pyro_bbb.BNN(pyro_bbb.bayesianize(net), pyro_bbb.likelihoods.Categorical(), len(x))
print(model.summary(reparam="flipout"))
guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.01)
history = pyro_bbb.fit(
    model, guide, x, y, batch_size=100, lr=1e-2, reparam="flipout", seed=0, progress=False,
    max_steps=args.max_steps,
)  # fmt: skip
pred = pyro_bbb.predict(model, guide, x_test, num_samples=100, seed=0)
noise = pyro_bbb.predict(model, guide, torch.randn(500, 1, 32), num_samples=100, seed=0)
accuracy = pyro_bbb.metrics.accuracy(pred.probs, y_test)
print(f"fit: {len(history)} epochs in {sum(history.seconds):.1f} s; test accuracy {accuracy:.3f}")
print(
    f"mean predictive entropy (nats): waves {pred.entropy.mean():.3f}, "
    f"white noise {noise.entropy.mean():.3f}"
)
