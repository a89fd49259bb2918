"""Digits: a trained ConvNet's last layer made Bayesian, against the full BNN and the ConvNet.

scikit-learn's 8x8 digits as images (1,347 to train, 450 to test, stratified, seed 0). One
ConvNet (Conv 1→8, Conv 8→16, 2x2 max-pool, Linear 256→64, Linear 64→10, ReLU) and four
ways of getting its weights:

* ``deterministic``: trained by cross-entropy with Adam (lr 1e-2, batch 64, ``--epochs``);
* ``last_layer``: that trained network, its body frozen, its last Linear made Bayesian
  (``bayesianize(trained, only="8.*")``, N(0, 1) prior, mean-field guide starting at the
  trained weights with MOPED scales δ = 0.1), trained ``--head-epochs`` epochs;
* ``full_moped``: every layer of the trained network Bayesian, the guide starting at the
  trained weights with MOPED scales, trained ``--head-epochs`` epochs;
* ``full_bnn``: every layer Bayesian from the network's own initialisation (initial σ 0.01),
  trained ``--epochs`` epochs.

The Bayesian fits use flipout and β warmed up linearly over the first third of their epochs.
Reported on the test set: accuracy, NLL, ECE (15 bins), the AUROC of telling test digits from
out-of-distribution images by predictive entropy (uniform noise, and the test digits rotated
by 90°), and training time (the last-layer and MOPED rows add the deterministic network's
time). Predictions use 100 weight samples; one thread; mean ± standard error over seeds.

    python benchmarks/last_layer.py [--epochs 30] [--head-epochs 10] [--seeds 3]
"""

from __future__ import annotations

import copy
import time

import pyro
import torch
import torch.nn.functional as F
from _common import machine, markdown_table, plus_minus, script_parser
from torch import nn

import pyro_bbb as bbb
from pyro_bbb import metrics
from pyro_bbb.data import digits
from pyro_bbb.infer import LinearWarmup
from pyro_bbb.infer.guides import MOPED


def convnet() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(-3),
        nn.Linear(16 * 4 * 4, 64), nn.ReLU(),
        nn.Linear(64, 10),
    )  # fmt: skip


def train_deterministic(x, y, epochs: int, seed: int) -> tuple[nn.Module, float]:
    torch.manual_seed(seed)
    net = convnet()
    optim = torch.optim.Adam(net.parameters(), lr=1e-2)
    start = time.perf_counter()
    for _ in range(epochs):
        for index in torch.randperm(len(x)).split(64):
            optim.zero_grad()
            F.cross_entropy(net(x[index]), y[index]).backward()
            optim.step()
    return net, time.perf_counter() - start


def fit_bayesian(net, data, *, epochs: int, init_scale, seed: int) -> tuple:
    pyro.clear_param_store()
    model = bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=len(data.x_train))
    guide = bbb.MeanFieldGuide(model, init_scale=init_scale)
    history = bbb.fit(
        model, guide, data.x_train, data.y_train, epochs=epochs, batch_size=64, lr=1e-2,
        beta=LinearWarmup(max(epochs / 3, 1)), reparam="flipout", seed=seed, progress=False,
        num_particles=1,  # one sample a step, as the published table was made
    )  # fmt: skip
    return model, guide, sum(history.seconds)


def scores(probs, log_probs, y, ood_entropy: dict, entropy) -> dict:
    row = {
        "accuracy": float(metrics.accuracy(probs, y)),
        "nll": float(metrics.nll(log_probs, y)),
        "ece": float(metrics.expected_calibration_error(probs, y, num_bins=15)),
    }
    for name, other in ood_entropy.items():
        labels = torch.cat([torch.zeros(len(entropy)), torch.ones(len(other))]).long()
        row[f"auroc_{name}"] = float(metrics.auroc(torch.cat([entropy, other]), labels))
    return row


def ood_sets(x_test: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    noise = torch.rand(x_test.shape, generator=torch.Generator().manual_seed(seed))
    return {"noise": noise, "rot90": torch.rot90(x_test, k=1, dims=(-2, -1))}


def evaluate_deterministic(net, data, ood) -> dict:
    def predictive(x):
        with torch.no_grad():
            log_probs = F.log_softmax(net(x), -1)
        return log_probs.exp(), log_probs, -(log_probs.exp() * log_probs).sum(-1)

    probs, log_probs, entropy = predictive(data.x_test)
    other = {name: predictive(x)[2] for name, x in ood.items()}
    return scores(probs, log_probs, data.y_test, other, entropy)


def evaluate_bayesian(model, guide, data, ood, seed: int) -> dict:
    def predictive(x):
        return bbb.predict(model, guide, x, num_samples=100, seed=seed)

    pred = predictive(data.x_test)
    other = {name: predictive(x).entropy for name, x in ood.items()}
    return scores(pred.probs, pred.log_probs, data.y_test, other, pred.entropy)


def frozen_body_last_layer(trained: nn.Module) -> nn.Module:
    body = copy.deepcopy(trained)
    for param in body.parameters():
        param.requires_grad_(False)  # the body stays as trained
    return bbb.bayesianize(body, bbb.priors.Gaussian(1.0), only="8.*")


def run(data, ood, epochs: int, head_epochs: int, seed: int) -> dict[str, tuple[dict, float]]:
    """Every method's test scores and training seconds for one seed."""
    trained, seconds = train_deterministic(data.x_train, data.y_train, epochs, seed)
    rows = {"deterministic": (evaluate_deterministic(trained, data, ood), seconds)}
    model, guide, head_seconds = fit_bayesian(
        frozen_body_last_layer(trained), data, epochs=head_epochs, init_scale=MOPED(0.1),
        seed=seed,
    )  # fmt: skip
    row = evaluate_bayesian(model, guide, data, ood, seed)
    rows["last_layer"] = (row, seconds + head_seconds)
    full = bbb.bayesianize(trained, bbb.priors.Gaussian(1.0))
    model, guide, moped_seconds = fit_bayesian(
        full, data, epochs=head_epochs, init_scale=MOPED(0.1), seed=seed
    )
    rows["full_moped"] = (evaluate_bayesian(model, guide, data, ood, seed), seconds + moped_seconds)
    torch.manual_seed(seed)
    model, guide, bnn_seconds = fit_bayesian(
        bbb.bayesianize(convnet(), bbb.priors.Gaussian(1.0)), data, epochs=epochs,
        init_scale=0.01, seed=seed,
    )  # fmt: skip
    rows["full_bnn"] = (evaluate_bayesian(model, guide, data, ood, seed), bnn_seconds)
    return rows


def mean_se(values: list[float]) -> str:
    """``"mean ± standard error"``; the bare value of one seed."""
    return plus_minus(values, error="se") if len(values) > 1 else f"{values[0]:.3f}"


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--head-epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = digits(images=True)
    ood = ood_sets(data.x_test, seed=0)
    runs = [run(data, ood, args.epochs, args.head_epochs, seed) for seed in range(args.seeds)]
    print(f"# Digits ConvNet: last layer Bayesian vs full BNN vs deterministic\n\n{machine()}")
    print(f"mean ± standard error over {args.seeds} seeds\n")
    keys = ("accuracy", "nll", "ece", "auroc_noise", "auroc_rot90")
    header = ("method", "accuracy ↑", "NLL ↓", "ECE ↓", "AUROC noise ↑", "AUROC rot90 ↑",
              "train s")  # fmt: skip
    lines = [
        (
            name,
            *(mean_se([r[name][0][k] for r in runs]) for k in keys),
            f"{sum(r[name][1] for r in runs) / len(runs):.1f}",
        )
        for name in runs[0]
    ]
    print(markdown_table(header, lines, align="l" + "r" * 6))


if __name__ == "__main__":
    main()
