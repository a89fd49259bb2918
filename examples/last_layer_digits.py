"""A trained ConvNet on 8x8 digits, then only its last layer made Bayesian.

Shows: starting from a trained deterministic network, ``bayesianize(trained, only="8.*")``
(a last-layer BNN; the body stays as trained, frozen), the guide's means starting at the
trained weights with MOPED scales (``MOPED(0.1)``: σ = 0.1 |w|, Krishnan et al. 2020), and
``model.summary()`` listing what is Bayesian and what is not. Prints the test accuracy, NLL
and ECE of the trained network and of its last-layer BNN.

    python examples/last_layer_digits.py [--epochs 30] [--max-steps N]
"""

import argparse
import copy

import pyro
import torch
import torch.nn.functional as F
from torch import nn

import pyro_bbb
from pyro_bbb.data import digits
from pyro_bbb.infer.guides import MOPED

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=30, help="epochs of the deterministic net")
parser.add_argument("--max-steps", type=int, default=None, help="the Bayesian head's budget")
args = parser.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)
data = digits(images=True)  # x (n, 1, 8, 8) in [0, 1], y (n,) in [0, 10)

# 1. An ordinary ConvNet, trained as usual.
trained = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
    nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
    nn.MaxPool2d(2), nn.Flatten(),
    nn.Linear(16 * 4 * 4, 64), nn.ReLU(),
    nn.Linear(64, 10),  # "8": the last layer
)  # fmt: skip
optim = torch.optim.Adam(trained.parameters(), lr=1e-2)
for _ in range(args.epochs):
    for index in torch.randperm(len(data.x_train)).split(64):
        optim.zero_grad()
        F.cross_entropy(trained(data.x_train[index]), data.y_train[index]).backward()
        optim.step()

# 2. Its last layer made Bayesian; the body is frozen (a body left trainable is learned
#    with the head as point estimates).
body = copy.deepcopy(trained)
for param in body.parameters():
    param.requires_grad_(False)
net = pyro_bbb.bayesianize(body, pyro_bbb.priors.Gaussian(1.0), only="8.*")
pyro.clear_param_store()
model = pyro_bbb.BNN(net, pyro_bbb.likelihoods.Categorical(), num_data=len(data.x_train))
print(model.summary())
guide = pyro_bbb.MeanFieldGuide(model, init_scale=MOPED(0.1))  # means = trained weights
history = pyro_bbb.fit(
    model, guide, data.x_train, data.y_train, batch_size=64, lr=1e-2, reparam="flipout", seed=0,
    progress=False, max_steps=args.max_steps,
)  # fmt: skip

print(f"last-layer BNN: {len(history)} epochs of fit's default length")

# 3. The trained network against its last-layer BNN.
y = data.y_test
with torch.no_grad():
    log_probs = F.log_softmax(trained(data.x_test), -1)
pred = pyro_bbb.predict(model, guide, data.x_test, num_samples=100, seed=0)
for name, probs, logp in (
    ("trained ConvNet", log_probs.exp(), log_probs),
    ("last-layer BNN", pred.probs, pred.log_probs),
):
    print(
        f"{name:16s} accuracy {pyro_bbb.metrics.accuracy(probs, y):.3f}  "
        f"NLL {pyro_bbb.metrics.nll(logp, y):.3f}  ECE {pyro_bbb.metrics.ece(probs, y):.3f}"
    )
