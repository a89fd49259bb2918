"""A Bayesian MLP on Fashion-MNIST at full size, at fit's defaults, beside a deterministic twin.

Shows: :func:`pyro_bbb.data.image_split` reading an MNIST-format idx folder (on Debian and
Ubuntu, ``apt-get install dataset-fashion-mnist`` puts Fashion-MNIST in
``/usr/share/datasets/fashion-mnist``); a 784-400-400-10 ReLU BNN (``pyro_bbb.mlp``, N(0, 1)
prior, mean-field guide) trained by ``fit(model, guide, x, y, batch_size=128)`` with every
other argument at its default, so the run length and rate are ``fit``'s own; and the test
error, NLL, ECE and CPU seconds of the BNN beside a plain network of the same shape trained
with Adam (lr 1e-3, ``--twin-epochs`` epochs, batch 128). ``benchmarks/images.py`` sets these
rows beside MC dropout, scale-mixture priors, ensembles and a convolutional BNN.

At full size (60,000 training images, all 10,000 test images) the BNN takes minutes of CPU;
``--num-train`` and ``--max-steps`` (``fit``'s budget, in whole epochs) make a short form.

    python examples/fashion_mnist.py [--data /usr/share/datasets/fashion-mnist] \
        [--num-train N] [--num-test N] [--max-steps N] [--twin-epochs 10] [--threads 1]
"""

import argparse
import time

import pyro
import torch
from torch import nn

import pyro_bbb
from pyro_bbb import metrics
from pyro_bbb.data import FASHION_MNIST, image_split

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--data", default=str(FASHION_MNIST), help="an MNIST-format idx folder")
parser.add_argument("--num-train", type=int, default=None, help="a random subset (all: 60,000)")
parser.add_argument("--num-test", type=int, default=None, help="a random subset (all: 10,000)")
parser.add_argument("--max-steps", type=int, default=None, help="fit's budget (its default)")
parser.add_argument("--twin-epochs", type=int, default=10, help="the plain net's; 0: none")
parser.add_argument("--threads", type=int, default=1, help="CPU threads (CPU s counts all)")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
torch.set_num_threads(args.threads)

try:  # x (n, 784) float32 in [0, 1], y (n,) int64 in [0, 10)
    data = image_split(args.data, num_train=args.num_train, num_test=args.num_test, seed=args.seed)
except FileNotFoundError as error:
    raise SystemExit(f"fashion_mnist.py: {error}") from None
print(f"Fashion-MNIST: {len(data.x_train)} training images, {len(data.x_test)} test images")


def report(name: str, log_probs: torch.Tensor, cpu: float, detail: str) -> None:
    """One line of test scores from ``(num_test, 10)`` log-probabilities."""
    probs, y = log_probs.exp(), data.y_test
    error = 1 - metrics.accuracy(probs, y)
    print(
        f"{name}: test error {error:.2%}  NLL {metrics.nll(log_probs, y):.3f}  "
        f"ECE {metrics.ece(probs, y):.2%}  {cpu:.0f} CPU s ({detail})"
    )


# The BNN at fit's defaults: nothing set but the batch size.
pyro.clear_param_store()
pyro.set_rng_seed(args.seed)  # the network's initialisation is the guide's initial mean
net = pyro_bbb.mlp([784, 400, 400, 10])  # N(0, 1) prior on every weight and bias
model = pyro_bbb.BNN(net, pyro_bbb.likelihoods.Categorical(), num_data=len(data.x_train))
guide = pyro_bbb.MeanFieldGuide(model)
start = time.process_time()
history = pyro_bbb.fit(
    model, guide, data.x_train, data.y_train, batch_size=128, seed=args.seed,
    max_steps=args.max_steps,
)  # fmt: skip
cpu = time.process_time() - start
pred = pyro_bbb.predict(model, guide, data.x_test, num_samples=100, batch_size=500, seed=0)
report("BNN", pred.log_probs, cpu, f"{len(history)} epochs, {history.steps[-1]} steps")

# The deterministic twin: the same shape, Adam at lr 1e-3, a fixed number of epochs.
if args.twin_epochs > 0:
    torch.manual_seed(args.seed)
    twin = nn.Sequential(
        nn.Linear(784, 400), nn.ReLU(), nn.Linear(400, 400), nn.ReLU(), nn.Linear(400, 10)
    )
    optimizer = torch.optim.Adam(twin.parameters(), lr=1e-3)
    start = time.process_time()
    for _ in range(args.twin_epochs):
        for rows in torch.randperm(len(data.x_train)).split(128):
            loss = nn.functional.cross_entropy(twin(data.x_train[rows]), data.y_train[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    cpu = time.process_time() - start
    with torch.no_grad():
        log_probs = twin(data.x_test).log_softmax(-1)
    report("deterministic", log_probs, cpu, f"{args.twin_epochs} epochs at lr 1e-3")
