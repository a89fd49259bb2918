"""The step-time benchmark's problems and what all its rows share.

The networks and their data (``Net``, ``NETS``: the MLPs, the ConvNet, torchvision's ResNet-18
narrowed, an LSTM read at its last step), the loss every hand-written step takes, its optimiser
and update, and the clock the rows are timed by (``CLOCK``, set once by the script that
runs them). ``benchmarks/steptime.py`` and ``benchmarks/step_ratio.py`` build their rows on these.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from _common import repository_root
from torch import nn

sys.path.insert(0, str(repository_root() / "examples"))  # networks as users write them
from user_networks import Recurrent, ResNet

INIT_SCALE = 0.05
LR = 1e-3


@dataclass
class Clock:
    """What every row is timed by: ``now()`` (process CPU or wall seconds), after ``sync()``."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    now: Callable[[], float] = time.process_time

    def sync(self) -> None:
        """Wait for the device's queued work (CUDA), so that ``now()`` sees it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()


#: The clock of this process's rows, set by the script's ``main``.
CLOCK = Clock()


@dataclass(frozen=True)
class Net:
    """One benchmark problem: an architecture, a task and the data sizes."""

    label: str
    task: str  # "regression" | "classification"
    num_data: int
    batch: int
    input_shape: tuple[int, ...]

    @property
    def user_written(self) -> bool:
        """A network with a forward of its own (no hand-written BBB reference covers it)."""
        return self.label in ("resnet", "lstm")

    def module(self) -> nn.Module:
        """A fresh deterministic network; both sides build theirs from it."""
        if self.label == "resnet":
            return ResNet18(num_classes=10)
        if self.label == "lstm":
            return Recurrent(nn.LSTM, features=self.input_shape[-1], hidden=32)
        if self.label == "conv":
            return nn.Sequential(
                nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                nn.Flatten(-3), nn.Linear(32 * 5 * 5, 10),
            )  # fmt: skip
        sizes = [int(s) for s in self.label.split("-")]
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
            layers.append(nn.Linear(n_in, n_out))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    def data(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Random inputs and targets of the full data set, on ``device``."""
        generator = torch.Generator().manual_seed(0)
        x = torch.rand(self.num_data, *self.input_shape, generator=generator)
        if self.task == "regression":
            y = torch.randn(self.num_data, generator=generator)
        else:
            y = torch.randint(0, 10, (self.num_data,), generator=generator)
        return x.to(device), y.to(device)


class ResNet18(ResNet):
    """torchvision's ``resnet18`` (7x7 stem, max-pool, four stages of two blocks), narrowed."""

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__((2, 2), num_classes, width)
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.layer3 = self._make_layer(4 * width, 2, stride=2)
        self.layer4 = self._make_layer(8 * width, 2, stride=2)
        self.fc = nn.Linear(8 * width, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


NETS = {
    "small": Net("1-50-50-1", "regression", 1000, 100, (1,)),
    "large": Net("784-400-400-10", "classification", 60000, 128, (784,)),
    "wide": Net("784-1200-1200-10", "classification", 60000, 1024, (784,)),
    "conv": Net("conv", "classification", 60000, 256, (1, 28, 28)),
    "resnet": Net("resnet", "classification", 5120, 64, (3, 32, 32)),
    "lstm": Net("lstm", "regression", 5120, 64, (32, 8)),
}


def default_adam(params: list[torch.Tensor], fused: bool) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=LR, fused=True if fused else None)


def log_likelihood(net: Net, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The minibatch's log-likelihood: Normal(h, 0.1) for regression, else the softmax's."""
    if net.task == "regression":
        return torch.distributions.Normal(h.squeeze(-1), 0.1).log_prob(y).sum()
    return -F.cross_entropy(h, y, reduction="sum")


def update(optim: torch.optim.Optimizer, loss: torch.Tensor) -> torch.Tensor:
    """One optimiser step on ``loss``, the last step's gradients dropped first."""
    optim.zero_grad(set_to_none=True)
    loss.backward()
    optim.step()
    return loss.detach()
