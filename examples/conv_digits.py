"""A Bayesian ConvNet on scikit-learn's 8x8 digits, trained with flipout.

Shows: ``bayesianize`` on a network with Conv2d and pooling layers, ``fit(...,
reparam="flipout")`` (or ``--reparam local`` / ``none``), and the predictive's accuracy, NLL,
calibration (ECE) and entropy on right and wrong predictions. Saves a reliability diagram.

Flipout is exact for conv layers. Local reparameterisation draws the noise of every output
position independently although the weights are shared across positions, an approximation
there (see docs/estimators.md).

Weights drawn for several predictive samples at once carry leading sample dims, so a conv
layer's output is ``(samples, batch, channels, height, width)``: ``bayesianize`` lets
``nn.MaxPool2d`` take that, and ``nn.Flatten()`` flatten each sample's image dims only.

    python examples/conv_digits.py [--reparam flipout|local|none] [--max-steps N] \
        [--figure conv_digits_reliability.png]
"""

import argparse

import pyro
import torch
from torch import nn

import pyro_bbb
from pyro_bbb.data import digits
from pyro_bbb.plots import plot_reliability

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--reparam", choices=("flipout", "local", "none"), default="flipout")
parser.add_argument("--max-steps", type=int, default=None, help="fit's budget (its default)")
parser.add_argument("--threads", type=int, default=1, help="one is fastest for this net")
parser.add_argument("--figure", default="conv_digits_reliability.png", help="PNG path")
args = parser.parse_args()
torch.set_num_threads(args.threads)
reparam = None if args.reparam == "none" else args.reparam
pyro.set_rng_seed(0)  # the network's initialisation is the guide's initial mean

data = digits(images=True)  # x (n, 1, 8, 8) in [0, 1], y (n,) in [0, 10)
net = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
    nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
    nn.MaxPool2d(2),  # (*S, B, 16, 8, 8) -> (*S, B, 16, 4, 4)
    nn.Flatten(),  # (*S, B, 256): bayesianize makes it keep the sample dims
    nn.Linear(16 * 4 * 4, 64), nn.ReLU(),
    nn.Linear(64, 10),
)  # fmt: skip

pyro.clear_param_store()
bnn = pyro_bbb.bayesianize(net, pyro_bbb.priors.Gaussian(1.0))  # sites "0.weight", ...
model = pyro_bbb.BNN(bnn, pyro_bbb.likelihoods.Categorical(), num_data=len(data.x_train))
guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.01)
history = pyro_bbb.fit(
    model, guide, data.x_train, data.y_train, batch_size=64, lr=1e-2, reparam=reparam, seed=0,
    max_steps=args.max_steps,
)  # fmt: skip
print(
    f"fit: reparam={reparam!r}, {len(history)} epochs, {sum(history.seconds):.1f} s; last "
    f"epoch: loss {history.loss[-1]:.0f}, nll {history.nll[-1]:.0f}, kl {history.kl[-1]:.0f}"
)

# Joint function samples (plain weight sampling) for the predictive.
pred = pyro_bbb.predict(model, guide, data.x_test, num_samples=100, seed=0)
y = data.y_test
correct = pred.predicted == y
accuracy = pyro_bbb.metrics.accuracy(pred.probs, y)
nll = pyro_bbb.metrics.nll(pred.log_probs, y)
confidence = pred.probs.max(-1).values.mean()
print(
    f"test ({len(y)} images): accuracy {accuracy:.3f}  NLL {nll:.3f}  "
    f"ECE {pyro_bbb.metrics.ece(pred.probs, y):.3f}  mean confidence {confidence:.3f} "
    f"({'under' if confidence < accuracy else 'over'}confident)"
)
print(
    f"mean predictive entropy (nats): correct {pred.entropy[correct].mean():.3f} "
    f"({int(correct.sum())}), wrong {pred.entropy[~correct].mean():.3f} ({int((~correct).sum())})"
)
print(
    f"mean mutual information (epistemic): correct {pred.mutual_information[correct].mean():.3f}"
    f", wrong {pred.mutual_information[~correct].mean():.3f}"
)
plot_reliability(pred.probs, y, title="Bayesian ConvNet, digits", path=args.figure)
print(f"saved {args.figure}")
