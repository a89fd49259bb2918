"""The networks of ``benchmarks/images.py`` and the scores every row takes.

784-width-width-10 ReLU MLPs (with dropout after each hidden activation for MC dropout),
LeNet-5's shape on 1×28×28 images, and test error, NLL and ECE from a row's predictive
log-probabilities.
"""

from __future__ import annotations

import torch
from torch import nn

from pyro_bbb import metrics


def mlp_layers(width: int, dropout: float = 0.0) -> nn.Sequential:
    """784-width-width-10 ReLU, optionally with dropout after each hidden activation."""
    layers: list[nn.Module] = []
    for n_in, n_out in ((784, width), (width, width)):
        layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(width, 10))


def lenet5() -> nn.Sequential:
    """LeNet-5's shape on 1×28×28 images: (batch, 1, 28, 28) -> (batch, 10) logits."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),  # 6×14×14
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),  # 16×5×5
        nn.Flatten(),
        nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10),
    )  # fmt: skip


def scores(log_probs: torch.Tensor, y: torch.Tensor) -> dict:
    """Test error, NLL and ECE from ``(num_test, 10)`` log-probabilities."""
    probs = log_probs.exp()
    return {
        "test_error": 1 - metrics.accuracy(probs, y),
        "test_nll": metrics.nll(log_probs, y),
        "test_ece": metrics.ece(probs, y, num_bins=15),
    }
