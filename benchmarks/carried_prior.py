"""Step time of ``fit`` under a carried prior (``from_guide``) against a Gaussian prior.

The same 64-50-50-2 ReLU network on the first split-digits task (270 points, batch 64), with
the prior ``Gaussian(1.0)`` and with the posterior of a guide trained on that task for 5 epochs
(``priors.from_guide``): independent Normals per weight for ``MeanFieldGuide``, one low-rank
block per layer, drawn site by site, for ``LowRankGuide(rank=5)``. The two are interleaved in
each repeat, so the ratio is measured under the same machine load.

    python benchmarks/carried_prior.py [--repeats 5] [--epochs 20]
"""

from __future__ import annotations

import statistics
import time

import torch
from _common import script_parser

import pyro_bbb as bbb
from pyro_bbb.priors import Gaussian, from_guide

parser = script_parser(__doc__)
parser.add_argument("--repeats", type=int, default=5)
parser.add_argument("--epochs", type=int, default=20)
args = parser.parse_args()
torch.set_num_threads(1)
task = bbb.data.split_digits()[0]
x, y = task.x_train, task.y_train
GUIDES = {
    "MeanFieldGuide": bbb.MeanFieldGuide,
    "LowRankGuide(rank=5)": lambda model, name: bbb.LowRankGuide(model, rank=5, name=name),
}


def model_with(prior):
    torch.manual_seed(0)
    net = bbb.mlp([64, 50, 50, 2], prior=prior)
    return bbb.BNN(net, bbb.likelihoods.Categorical(2), num_data=len(x))


def ms_per_step(prior, make, name):
    model = model_with(prior)
    guide = make(model, name=name)
    bbb.fit(model, guide, x, y, epochs=2, batch_size=64, progress=False)  # set-up, warm-up
    start = time.perf_counter()
    history = bbb.fit(model, guide, x, y, epochs=args.epochs, batch_size=64, progress=False)
    return (time.perf_counter() - start) / history.steps[-1] * 1e3


print(f"{'guide':22s} {'Gaussian ms/step':>17s} {'carried ms/step':>16s} {'ratio':>6s}")
for label, make in GUIDES.items():
    trained = make(model_with(Gaussian(1.0)), name=f"trained {label}")
    bbb.fit(trained.model, trained, x, y, epochs=5, batch_size=64, progress=False)
    carried = from_guide(trained)
    gaussian, posterior = [], []
    for repeat in range(args.repeats):
        gaussian.append(ms_per_step(Gaussian(1.0), make, f"gaussian {label} {repeat}"))
        posterior.append(ms_per_step(carried, make, f"carried {label} {repeat}"))
    ratio = statistics.median(p / g for p, g in zip(posterior, gaussian, strict=True))
    print(
        f"{label:22s} {statistics.median(gaussian):17.2f} {statistics.median(posterior):16.2f} "
        f"{ratio:6.2f}"
    )
