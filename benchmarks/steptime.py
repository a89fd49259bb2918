"""Time and memory of one training step: pyro_bbb against a hand-written PyTorch loop.

Every row is the median time of one optimiser step (draw, loss, backward, update) as a ratio
to the reference measured in the same run:

reference
    Hand-written PyTorch Bayes by Backprop: μ/ρ tensors per layer, σ = softplus(ρ), one
    weight sample per step, the closed-form Gaussian KL to the N(0, 1) prior, the
    minibatch log-likelihood scaled by N/B, one ``torch.optim.Adam`` over all tensors with
    the implementation ``pyro_bbb.fit`` picks by default (fused). Rows for the same loop
    with local reparameterisation and with Adam's default (per-tensor) implementation.
pyro_bbb fit
    ``pyro_bbb.fit`` itself on a ``BNN`` (Gaussian likelihood with a fixed noise scale 0.1,
    or Categorical) with ``MeanFieldGuide`` (plain, ``reparam="local"``, ``"flipout"``) and
    ``LowRankGuide(rank=4)``. Each step is timed from inside ``fit`` by a callback (the
    interval between consecutive backward passes, which spans exactly one step of the loop).
pyro_bbb fit, ensembles
    ``fit`` with an ``Ensemble`` of ``K`` = 1 and 5 members of those guides, one vectorised
    step for all members: the row over ``K`` is the cost per member.
pyro_bbb under SVI
    The same model and guide with ``AnnealedELBO`` under ``pyro.infer.SVI`` and
    ``pyro.optim.Adam``: Pyro semantics are kept, this is what they cost there.
Pyro AutoNormal
    ``AutoNormal`` + ``Trace_ELBO`` + ``SVI`` on the same ``BNN``, Pyro's defaults.

Configurations take turns, ``--steps`` steps at a time, so load from elsewhere on a shared
machine hits them alike. On glibc the timing process keeps the memory it frees for every
configuration (``pyro_bbb._heap.kept_heap`` around the whole timing, with
``PYRO_BBB_KEEP_HEAP=1`` so that ``fit`` keeps it too; ``--no-steady-heap`` leaves the
allocator alone, as ``fit`` does by default): otherwise a configuration whose frees happen
to land at the top of the heap pays a page fault per 4 KiB every step, a matter of the
process's history rather than of the step.

On CUDA (``--device cuda``) two more rows: the reference captured whole in one CUDA graph
(PyTorch's recipe: static input buffers, Adam with ``capturable=True`` and its rate in a
tensor, three warm-up steps on a side stream), the floor for a launch-bound step; and
``fit`` with ``cuda_graph=False``, its eager step. The other ``fit`` rows run as ``fit``
runs by default there, captured. A captured step cannot call a callback between backward
pass and update, so on CUDA the ``fit`` rows are timed from ``History.seconds``: whole
epochs (the first, which sets up the capture, left out), divided by their steps.

Memory: each configuration runs again in a fresh process, and the step's memory is the peak
resident set (CUDA: peak allocated) during its first ``--memory-steps`` steps above what the
process held just before the first step (model, data, parameters): gradients, optimiser
state, activations and temporaries. On the CPU that process runs with glibc returning freed
blocks of 64 KiB or more to the OS at once, so the resident set follows the live tensors.

Nets: ``small`` 1-50-50-1 regression (N=1000, batch 100); ``large`` 784-400-400-10
classification (N=60000, batch 128); with ``--throughput``: ``wide`` 784-1200-1200-10
(batch 1024) and ``conv``, a small ConvNet on 28x28 images (batch 256), in examples/s.
Networks as users write them (``--nets resnet,lstm``): ``resnet``, torchvision's ResNet-18
(its 7x7 stem, max-pool and four stages of two ``BasicBlock``) at 16 to 128 channels, on 32x32
images (batch 64; 703,386 parameters in 62 tensors, BatchNorm's included), and ``lstm``, an
``nn.LSTM(8, 32)`` read at ``out[:, -1]`` (batch 64 sequences of 32 steps). There the
reference is the deterministic network's own training step (the same loss with the weights
as point estimates, fused Adam). Beside it: a hand-written Bayes by Backprop step over every
parameter of the same network (μ and ρ per tensor, each drawn and passed in through
``torch.func.functional_call``, the closed-form KL to N(0, 1), fused Adam), the naive step a
user would write; bayesian-torch's ``dnn_to_bnn`` on the same network when that package is
installed (``pip install --no-deps bayesian-torch``: its convolutions, linear layers and LSTMs
made Bayesian, BatchNorm kept deterministic, ``get_kl_loss``); and the ``Ensemble(k=2)`` row,
two weight draws a step, run once per draw around the network.

    python benchmarks/steptime.py [--nets small,large] [--threads 1] [--device cpu|cuda]
        [--steps 10] [--rounds 8] [--memory/--no-memory] [--throughput] [--only LABELS]
        [--steady-heap/--no-steady-heap]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import pyro
import pyro.distributions as dist
import pyro.optim
import pyro.poutine as poutine
import torch
import torch.nn.functional as F
from _common import machine, repository_root
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from torch import nn

import pyro_bbb
from pyro_bbb._heap import ENVIRONMENT_VARIABLE, kept_heap
from pyro_bbb.infer import AnnealedELBO, Ensemble

sys.path.insert(0, str(repository_root() / "examples"))  # networks as users write them
from user_networks import Recurrent, ResNet

INIT_SCALE = 0.05
LR = 1e-3
#: Steps in an epoch of the CUDA ``fit`` rows (timed by epochs; see FitEpochs).
EPOCH_STEPS = 50
#: Members of the ensemble rows (an Ensemble of 1 is the guide alone, in the member plate).
ENSEMBLE_SIZES = (1, 5)


# ----------------------------------------------------------------------------- problems
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


# ----------------------------------------------------------------------------- reference
def _log_likelihood(net: Net, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The minibatch's log-likelihood: Normal(h, 0.1) for regression, else the softmax's."""
    if net.task == "regression":
        return torch.distributions.Normal(h.squeeze(-1), 0.1).log_prob(y).sum()
    return -F.cross_entropy(h, y, reduction="sum")


def _update(optim: torch.optim.Optimizer, loss: torch.Tensor) -> torch.Tensor:
    """One optimiser step on ``loss``, the last step's gradients dropped first."""
    optim.zero_grad(set_to_none=True)
    loss.backward()
    optim.step()
    return loss.detach()


class Reference:
    """Hand-written mean-field Bayes by Backprop in plain PyTorch, for any Linear/Conv net."""

    def __init__(self, net: Net, device: torch.device, *, local: bool, fused: bool) -> None:
        self.net, self.local = net, local
        rho = INIT_SCALE + math.log(-math.expm1(-INIT_SCALE))  # softplus(rho) = INIT_SCALE
        self.layers: list[tuple[nn.Module, list[torch.Tensor]]] = []
        for module in net.module().to(device):
            params = []
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                for p in (module.weight, module.bias):
                    params += [
                        p.detach().clone().requires_grad_(),
                        torch.full_like(p, rho).requires_grad_(),
                    ]
            self.layers.append((module, params))
        self.params = [p for _, params in self.layers for p in params]
        self.optim = default_adam(self.params, fused)

    @staticmethod
    def _apply(module: nn.Module, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
        if isinstance(module, nn.Linear):
            return F.linear(h, w, b)
        return F.conv2d(h, w, b, module.stride, module.padding)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        h, kl = x, 0.0
        for module, params in self.layers:
            if not params:
                h = module(h)
                continue
            w_mu, w_rho, b_mu, b_rho = params
            w_sigma, b_sigma = F.softplus(w_rho), F.softplus(b_rho)
            if self.local:
                mean = self._apply(module, h, w_mu, b_mu)
                var = self._apply(module, h.square(), w_sigma.square(), b_sigma.square())
                h = mean + var.sqrt() * torch.randn_like(mean)
            else:
                w = w_mu + w_sigma * torch.randn_like(w_mu)
                b = b_mu + b_sigma * torch.randn_like(b_mu)
                h = self._apply(module, h, w, b)
            for mu, sigma in ((w_mu, w_sigma), (b_mu, b_sigma)):
                kl = kl + 0.5 * (sigma.square() + mu.square() - 1).sum() - sigma.log().sum()
        log_lik = _log_likelihood(self.net, h, y)
        loss = -log_lik * (self.net.num_data / len(x)) + kl
        return _update(self.optim, loss)


class Deterministic:
    """The deterministic network's training step: the same loss, weights as point estimates."""

    def __init__(self, net: Net, device: torch.device, fused: bool) -> None:
        self.net, self.module = net, net.module().to(device)
        self.optim = default_adam(list(self.module.parameters()), fused)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        h = self.module(x)
        log_lik = _log_likelihood(self.net, h, y)
        loss = -log_lik * (self.net.num_data / len(x))
        return _update(self.optim, loss)


class CapturedReference:
    """The reference's step captured whole as one CUDA graph: the floor of a launch-bound step.

    PyTorch's whole-network recipe: the batch copied into static input tensors, Adam
    (fused) with ``capturable=True`` and its rate in a device tensor, three warm-up steps on
    a side stream, then ``torch.cuda.graph`` around one step, replayed for every step.
    """

    def __init__(self, net: Net, device: torch.device, *, local: bool = False) -> None:
        self.reference = Reference(net, device, local=local, fused=True)
        self.reference.optim = torch.optim.Adam(
            self.reference.params, lr=torch.tensor(LR, device=device), fused=True, capturable=True
        )
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: tuple[torch.Tensor, torch.Tensor] | None = None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.inputs is None:
            self.inputs = (x.clone(), y.clone())
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self.reference.step(*self.inputs)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            self.reference.optim.zero_grad(set_to_none=True)
            with torch.cuda.graph(self.graph):
                self.reference.step(*self.inputs)
        static_x, static_y = self.inputs
        static_x.copy_(x)
        static_y.copy_(y)
        self.graph.replay()


class EveryParameterBBB:
    """Hand-written Bayes by Backprop over every parameter of any network: the naive step.

    μ and ρ per parameter tensor (BatchNorm's too), each drawn and handed to the network by
    ``torch.func.functional_call``, the closed-form KL to N(0, 1), fused Adam.
    """

    def __init__(self, net: Net, device: torch.device, fused: bool) -> None:
        self.net, self.module = net, net.module().to(device)
        rho = INIT_SCALE + math.log(-math.expm1(-INIT_SCALE))
        params = dict(self.module.named_parameters())
        self.locs = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
        self.rhos = {n: torch.full_like(p, rho).requires_grad_() for n, p in params.items()}
        self.optim = default_adam([*self.locs.values(), *self.rhos.values()], fused)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        weights, kl = {}, 0.0
        for name, mu in self.locs.items():
            sigma = F.softplus(self.rhos[name])
            weights[name] = mu + sigma * torch.randn_like(mu)
            kl = kl + 0.5 * (sigma.square() + mu.square() - 1).sum() - sigma.log().sum()
        h = torch.func.functional_call(self.module, weights, (x,))
        loss = -_log_likelihood(self.net, h, y) * (self.net.num_data / len(x)) + kl
        return _update(self.optim, loss)


class BayesianTorch:
    """bayesian-torch's ``dnn_to_bnn`` on the same network (its layers, its KL), fused Adam."""

    def __init__(self, net: Net, device: torch.device, fused: bool) -> None:
        from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss

        self.net, self.module, self.kl = net, net.module(), get_kl_loss
        rho = INIT_SCALE + math.log(-math.expm1(-INIT_SCALE))
        prior = {"prior_mu": 0.0, "prior_sigma": 1.0, "posterior_mu_init": 0.0,
                 "posterior_rho_init": rho, "type": "Reparameterization",
                 "moped_enable": False}  # fmt: skip
        dnn_to_bnn(self.module, prior)
        self.module.to(device)
        self.optim = default_adam(list(self.module.parameters()), fused)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        h = self.module(x)
        loss = -_log_likelihood(self.net, h, y) * (self.net.num_data / len(x))
        loss = loss + self.kl(self.module)
        return _update(self.optim, loss)


def has_bayesian_torch() -> bool:
    """Whether bayesian-torch is installed (its rows are left out otherwise)."""
    try:
        import bayesian_torch  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- Pyro floor
class BarePyro:
    """The least Pyro program with the same semantics: the floor for any Pyro-based step.

    A guide of ``pyro.param`` and ``pyro.sample(Normal(μ, softplus(ρ)).to_event())`` per
    weight, a model of ``pyro.sample`` per weight from a prior built once, ``F.linear``
    and a subsampled data plate; traced and replayed as an ELBO does, the reference's
    closed-form KL on the guide's parameters, fused Adam. No modules, handlers or checks.
    """

    def __init__(self, net: Net, device: torch.device, fused: bool) -> None:
        self.net = net
        rho = INIT_SCALE + math.log(-math.expm1(-INIT_SCALE))
        self.sites: list[tuple[str, torch.Size]] = []
        self.params: list[torch.Tensor] = []
        for i, module in enumerate(net.module().to(device)):
            if isinstance(module, nn.Linear):
                for kind, p in (("weight", module.weight), ("bias", module.bias)):
                    name = f"bare.{i}.{kind}"
                    loc = pyro.param(f"{name}.loc", p.detach().clone())
                    scale = pyro.param(f"{name}.rho", torch.full_like(p, rho))
                    self.params += [loc.unconstrained(), scale.unconstrained()]
                    self.sites.append((name, p.shape))
        zero = torch.zeros((), device=device)
        self.priors = {
            name: dist.Normal(zero, 1.0).expand(shape).to_event(len(shape))
            for name, shape in self.sites
        }
        self.optim = default_adam(self.params, fused)
        self.subsample = torch.arange(net.batch, device=device)

    def guide(self, x, y):
        for name, shape in self.sites:
            loc, rho = pyro.param(f"{name}.loc"), pyro.param(f"{name}.rho")
            pyro.sample(name, dist.Normal(loc, F.softplus(rho)).to_event(len(shape)))

    def model(self, x, y):
        h = x
        names = [name for name, _ in self.sites]
        for k in range(0, len(names), 2):
            w = pyro.sample(names[k], self.priors[names[k]])
            b = pyro.sample(names[k + 1], self.priors[names[k + 1]])
            h = F.linear(h, w, b)
            if k + 2 < len(names):
                h = F.relu(h)
        with pyro.plate("data", self.net.num_data, subsample=self.subsample[: len(x)]):
            if self.net.task == "regression":
                pyro.sample("obs", dist.Normal(h.squeeze(-1), 0.1), obs=y)
            else:
                pyro.sample("obs", dist.Categorical(logits=h), obs=y)

    def step(self, x, y):
        with pyro.validation_enabled(False):
            self._step(x, y)

    def _step(self, x, y):
        guide_trace = poutine.trace(self.guide).get_trace(x, y)
        model_trace = poutine.trace(poutine.replay(self.model, guide_trace)).get_trace(x, y)
        obs = model_trace.nodes["obs"]
        loss = -obs["fn"].log_prob(obs["value"]).sum() * obs["scale"]
        for name, _ in self.sites:  # the reference's KL to N(0, 1), from the guide's site
            q = guide_trace.nodes[name]["fn"].base_dist
            loss = loss + 0.5 * (q.scale.square() + q.loc.square() - 1).sum() - q.scale.log().sum()
        self.optim.zero_grad(set_to_none=True)
        loss.backward()
        self.optim.step()


# ----------------------------------------------------------------------------- pyro_bbb
def bnn(net: Net, device: torch.device) -> pyro_bbb.BNN:
    likelihood = (
        pyro_bbb.likelihoods.Gaussian(scale=0.1)
        if net.task == "regression"
        else pyro_bbb.likelihoods.Categorical()
    )
    model = pyro_bbb.BNN(pyro_bbb.bayesianize(net.module()), likelihood, num_data=net.num_data)
    return model.to(device)


class _EnoughStepsError(Exception):
    """Raised by the timer to leave ``fit`` after the steps it needs."""


class _StepTimer(pyro_bbb.Callback):
    """Time every step of ``fit`` from the inside; stop it after ``steps`` steps."""

    def __init__(self, steps: int, memory: Callable[[], None] | None = None) -> None:
        self.steps, self.memory = steps, memory
        self.stamps: list[float] = []

    def on_fit_start(self, params, history) -> None:
        if self.memory is not None:
            self.memory()  # reset the peak just before the first step

    def on_after_backward(self, params, step: int) -> None:
        sync()
        self.stamps.append(clock())
        if len(self.stamps) > self.steps + 1:
            raise _EnoughStepsError

    def times(self) -> list[float]:
        # The first interval holds the optimiser's first step, which creates its state.
        return [b - a for a, b in itertools.pairwise(self.stamps)][1:]


class FitSteps:
    """``pyro_bbb.fit`` on one model and guide, ``steps`` steps per call."""

    def __init__(
        self, net: Net, x, y, device, guide: str, reparam: str | None, members: int = 0
    ) -> None:
        self.net, self.x, self.y, self.reparam = net, x, y, reparam
        self.model = bnn(net, device)
        name = f"{guide}-{reparam}-{members}-{id(self)}"
        if guide == "meanfield":
            family = partial(pyro_bbb.MeanFieldGuide, init_scale=INIT_SCALE, name=name)
        else:
            family = partial(
                pyro_bbb.LowRankGuide, rank=4, blocks="layer", init_scale=INIT_SCALE, name=name
            )
        self.guide = family(self.model) if not members else Ensemble(self.model, family, k=members)

    def __call__(self, steps: int, memory: Callable[[], None] | None = None) -> list[float]:
        timer = _StepTimer(steps, memory)
        with contextlib.suppress(_EnoughStepsError), warnings.catch_warnings():
            warnings.simplefilter("ignore", pyro_bbb.ConvergenceWarning)  # a timing, not a fit
            pyro_bbb.fit(
                self.model,
                self.guide,
                self.x,
                self.y,
                epochs=1,
                batch_size=self.net.batch,
                lr=LR,
                reparam=self.reparam,
                num_particles=1,  # the reference draws one sample a step
                progress=False,
                callbacks=[timer],
            )
        return timer.times()


class FitEpochs(FitSteps):
    """``pyro_bbb.fit`` timed by whole epochs, from ``History.seconds`` (for CUDA).

    A captured step cannot call ``on_after_backward``, so the steps are not timed one by
    one: each call fits two epochs of :data:`EPOCH_STEPS` steps (the data cut to that many
    batches), and the second's seconds, divided by its steps, stand for each of its steps.
    The first, which warms up and captures the step, is left out.
    """

    def __init__(self, net: Net, x, y, device, guide: str, reparam: str | None, members: int = 0,
                 *, cuda_graph: bool | None = None) -> None:  # fmt: skip
        del x, y  # its own data: EPOCH_STEPS batches
        short = dataclasses.replace(net, num_data=net.batch * EPOCH_STEPS)
        super().__init__(short, *short.data(device), device, guide, reparam, members)
        self.cuda_graph = cuda_graph

    def __call__(self, steps: int, memory: Callable[[], None] | None = None) -> list[float]:
        if memory is not None:
            memory()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pyro_bbb.ConvergenceWarning)  # a timing, not a fit
            history = pyro_bbb.fit(
                self.model, self.guide, self.x, self.y, epochs=2, batch_size=self.net.batch,
                lr=LR, reparam=self.reparam, num_particles=1, progress=False,
                cuda_graph=self.cuda_graph,
            )  # fmt: skip
        return [history.seconds[1] / EPOCH_STEPS] * EPOCH_STEPS


class LoopSteps:
    """A ``step(xb, yb)`` function over shuffled minibatches, timed step by step."""

    def __init__(self, net: Net, x, y, step: Callable) -> None:
        self.net, self.x, self.y, self.step = net, x, y, step

    def _batches(self):
        """Shuffled minibatch indices, epoch after epoch, as fit draws them."""
        while True:
            order = torch.randperm(self.net.num_data, device=self.x.device)
            yield from order.split(self.net.batch)

    def __call__(self, steps: int, memory: Callable[[], None] | None = None) -> list[float]:
        batches = self._batches()
        if memory is not None:
            memory()
        times = []
        for _, idx in zip(range(steps + 1), batches, strict=False):
            start = clock()
            self.step(self.x[idx], self.y[idx])
            sync()
            times.append(clock() - start)
        return times[1:]


def svi_steps(net: Net, x, y, device, guide: str) -> LoopSteps:
    model = bnn(net, device)
    if guide == "autonormal":
        svi = SVI(model, AutoNormal(model, init_scale=INIT_SCALE), pyro.optim.Adam({"lr": LR}),
                  Trace_ELBO())  # fmt: skip
    else:
        g = pyro_bbb.MeanFieldGuide(model, init_scale=INIT_SCALE, name=f"svi-{id(model)}")
        svi = SVI(model, g, pyro.optim.Adam({"lr": LR}), AnnealedELBO(1.0))

    def step(xb, yb):
        with pyro.validation_enabled(False):
            svi.step(xb, yb)

    return LoopSteps(net, x, y, step)


def configurations(net: Net, device: torch.device, x, y, fused: bool) -> dict[str, Callable]:
    """Label -> runner; the first is the reference every ratio is taken against."""
    conv = net.label == "conv"
    cuda = device.type == "cuda"
    fit_steps = FitEpochs if cuda else FitSteps  # a captured step calls no callback
    configs: dict[str, Callable] = {}
    if net.user_written:
        configs["deterministic network (its own training step)"] = LoopSteps(
            net, x, y, Deterministic(net, device, fused).step
        )
        configs["hand-written BBB of every parameter (functional_call)"] = LoopSteps(
            net, x, y, EveryParameterBBB(net, device, fused).step
        )
        if has_bayesian_torch():
            configs["bayesian-torch dnn_to_bnn (BatchNorm deterministic)"] = LoopSteps(
                net, x, y, BayesianTorch(net, device, fused).step
            )
        for reparam in (None, "local"):
            label = f"fit, MeanFieldGuide, reparam={reparam!r}"
            configs[label] = fit_steps(net, x, y, device, "meanfield", reparam)
        configs["fit, Ensemble(MeanFieldGuide, k=2), reparam=None"] = fit_steps(
            net, x, y, device, "meanfield", None, members=2
        )
        return configs
    configs["reference (hand-written PyTorch BBB)"] = LoopSteps(
        net, x, y, Reference(net, device, local=False, fused=fused).step
    )
    configs["reference + local reparameterisation"] = LoopSteps(
        net, x, y, Reference(net, device, local=True, fused=fused).step
    )
    if fused:
        configs["reference, Adam's default implementation"] = LoopSteps(
            net, x, y, Reference(net, device, local=False, fused=False).step
        )
    if cuda:
        configs["reference captured in one CUDA graph"] = LoopSteps(
            net, x, y, CapturedReference(net, device).step
        )
        configs["reference + local, captured in one CUDA graph"] = LoopSteps(
            net, x, y, CapturedReference(net, device, local=True).step
        )
    if not conv:
        configs["bare Pyro program (the floor of Pyro semantics)"] = LoopSteps(
            net, x, y, BarePyro(net, device, fused).step
        )
    if cuda:
        label = "fit, MeanFieldGuide, reparam=None, cuda_graph=False (eager)"
        configs[label] = FitEpochs(net, x, y, device, "meanfield", None, cuda_graph=False)
    for reparam in (None, "local", "flipout"):
        label = f"fit, MeanFieldGuide, reparam={reparam!r}"
        configs[label] = fit_steps(net, x, y, device, "meanfield", reparam)
    if not conv:
        for reparam in (None, "local"):
            label = f"fit, LowRankGuide(rank=4), reparam={reparam!r}"
            configs[label] = fit_steps(net, x, y, device, "lowrank", reparam)
        for k in ENSEMBLE_SIZES:
            for guide, reparam in (("meanfield", None), ("meanfield", "local"), ("lowrank", None)):
                family = "MeanFieldGuide" if guide == "meanfield" else "LowRankGuide(rank=4)"
                label = f"fit, Ensemble({family}, k={k}), reparam={reparam!r}"
                configs[label] = fit_steps(net, x, y, device, guide, reparam, members=k)
        configs["SVI + AnnealedELBO + MeanFieldGuide"] = svi_steps(net, x, y, device, "mf")
        configs["SVI + Trace_ELBO + AutoNormal (Pyro)"] = svi_steps(net, x, y, device, "autonormal")
    return configs


def only(configs: dict[str, Callable], patterns: str | None) -> dict[str, Callable]:
    """The reference and the configurations whose label contains one of ``patterns``."""
    if not patterns:
        return configs
    wanted = [p for p in patterns.split("|") if p]
    labels = list(configs)
    keep = [labels[0], *(k for k in labels[1:] if any(p in k for p in wanted))]
    return {label: configs[label] for label in keep}


# ----------------------------------------------------------------------------- measuring
DEVICE = torch.device("cpu")
clock: Callable[[], float] = time.process_time


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def fused_default(device: torch.device) -> bool:
    """Whether fit's default Adam is the fused one here (see pyro_bbb.training.optimizers)."""
    return device.type in ("cpu", "cuda")


def time_steps(configs: dict[str, Callable], steps: int, rounds: int) -> dict[str, float]:
    """Median seconds per step; configurations take turns, ``steps`` at a time."""
    samples: dict[str, list[float]] = {label: [] for label in configs}
    for run in configs.values():
        run(2)  # warm-up: parameters, optimiser state, allocator
    for _ in range(rounds):
        for label, run in configs.items():
            samples[label] += run(steps)
    return {label: statistics.median(values) for label, values in samples.items()}


class _Memory:
    """Peak memory above a baseline taken when ``reset`` is called."""

    def __init__(self) -> None:
        self.baseline = 0

    @staticmethod
    def _rss_kib(field: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
        raise RuntimeError(f"no {field} in /proc/self/status")

    def reset(self) -> None:
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.baseline = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets the peak resident set (VmHWM) to the current one
            self.baseline = self._rss_kib("VmRSS:") * 1024

    def peak_above_baseline(self) -> int:
        if DEVICE.type == "cuda":
            return torch.cuda.max_memory_allocated() - self.baseline
        return self._rss_kib("VmHWM:") * 1024 - self.baseline


def memory_of(net_name: str, label: str, steps: int) -> float:
    """MiB of one configuration's steps, in this (fresh) process."""
    net = NETS[net_name]
    x, y = net.data(DEVICE)
    configs = configurations(net, DEVICE, x, y, fused_default(DEVICE))
    # Warm the process up with a throwaway step of the same shapes, so one-time set-up
    # (autograd engine, BLAS buffers) is charged to no configuration.
    throwaway = Reference(net, DEVICE, local=False, fused=False)
    throwaway.step(x[: net.batch], y[: net.batch])
    del throwaway
    meter = _Memory()
    configs[label](steps, meter.reset)
    return meter.peak_above_baseline() / 2**20


def memory_in_subprocess(net_name: str, label: str, args) -> float:
    command = [sys.executable, __file__, "--memory-of", net_name, label,
               "--device", str(DEVICE), "--threads", str(args.threads),
               "--memory-steps", str(args.memory_steps)]  # fmt: skip
    # glibc then hands every block of 64 KiB or more back to the OS when it is freed, so the
    # resident set follows the live tensors instead of the allocator's high-water mark.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])["mib"]


# ----------------------------------------------------------------------------- report
def step_table(args) -> None:
    nets = [NETS[name] for name in args.nets.split(",")]
    fused = fused_default(DEVICE)
    results: list[tuple[Net, dict[str, float], dict[str, float]]] = []
    for net in nets:
        pyro.clear_param_store()
        pyro.set_rng_seed(args.seed)
        x, y = net.data(DEVICE)
        configs = only(configurations(net, DEVICE, x, y, fused), args.only)
        medians = time_steps(configs, args.steps, args.rounds)
        memory = {}
        if args.memory:
            name = net_name_of(net)
            memory = {label: memory_in_subprocess(name, label, args) for label in configs}
        results.append((net, medians, memory))
        del configs, x, y

    print(
        f"# Time per training step, ratio to the hand-written reference\n\n"
        f"median over {args.rounds} rounds of {args.steps} steps ({args.clock} time), "
        f"configurations taking turns; "
        f"torch {torch.__version__}, pyro {pyro.__version__}, device {describe(DEVICE)}, "
        f"{args.threads} thread(s), {args.heap}\n"
    )
    for net, medians, memory in results:
        labels = list(medians)
        ref = medians[labels[0]]
        print(f"## {net.label}, batch {net.batch}, N = {net.num_data}\n")
        header = "| step | ms | ratio |" + (" step memory (MiB) | memory ratio |" if memory else "")
        print(header)
        print("| --- | ---: | ---: |" + (" ---: | ---: |" if memory else ""))
        for label in labels:
            row = f"| {label} | {1e3 * medians[label]:.2f} | {medians[label] / ref:.2f}× |"
            if memory:
                row += f" {memory[label]:.1f} | {memory[label] / memory[labels[0]]:.2f}× |"
            print(row)
        print()


def net_name_of(net: Net) -> str:
    return next(name for name, candidate in NETS.items() if candidate is net)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({machine()})"


def throughput_table(args) -> None:
    print("# Throughput, examples per second (median step)\n")
    print("| net | batch | configuration | examples/s | ratio to reference |")
    print("| --- | ---: | --- | ---: | ---: |")
    for name in ("wide", "conv"):
        net = NETS[name]
        pyro.clear_param_store()
        x, y = net.data(DEVICE)
        configs = only(configurations(net, DEVICE, x, y, fused_default(DEVICE)), args.only)
        keep = [label for label in configs if "LowRank" not in label and "SVI" not in label]
        medians = time_steps({k: configs[k] for k in keep}, args.steps, max(2, args.rounds // 2))
        ref = medians[keep[0]]
        for label in keep:
            rate, ratio = net.batch / medians[label], ref / medians[label]
            print(f"| {net.label} | {net.batch} | {label} | {rate:,.0f} | {ratio:.2f}× |")
        del configs, x, y
    print()


def main() -> None:
    global DEVICE, clock
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nets", default="small,large", help="comma-separated: small,large,resnet,lstm"
    )
    parser.add_argument("--steps", type=int, default=10, help="steps per turn")
    parser.add_argument("--rounds", type=int, default=8, help="turns per configuration")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--memory-steps", type=int, default=5)
    parser.add_argument(
        "--only",
        help="substrings separated by |: time only the configurations whose label holds one "
        "(the reference is always kept), e.g. --only 'LowRankGuide(rank=4), reparam|bare'",
    )
    parser.add_argument("--throughput", action="store_true", help="add the wide MLP and ConvNet")
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        help="cpu: the process's CPU time (default on CPU, immune to time spent descheduled "
        "on a shared machine); wall: elapsed time (default, and needed, on CUDA)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--steady-heap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep glibc's freed memory for every configuration, fit's steps included "
        "(default; sets PYRO_BBB_KEEP_HEAP=1 unless given), so page faults that depend on the "
        "heap's layout fall on none",
    )
    parser.add_argument("--memory-of", nargs=2, metavar=("NET", "LABEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    args.clock = args.clock or ("wall" if DEVICE.type == "cuda" else "cpu")
    if args.clock == "cpu" and DEVICE.type == "cuda":
        parser.error("--clock cpu does not see the GPU's time; use --clock wall with cuda")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.memory_of:
        pyro.set_rng_seed(args.seed)
        print(json.dumps({"mib": memory_of(*args.memory_of, args.memory_steps)}))
        return
    start = time.perf_counter()
    steady = args.steady_heap and DEVICE.type == "cpu"
    if steady:
        os.environ.setdefault(ENVIRONMENT_VARIABLE, "1")  # fit's steps keep it too
    with kept_heap(steady) as held:
        args.heap = (
            "glibc heap kept for every configuration (kept_heap, PYRO_BBB_KEEP_HEAP=1)"
            if held
            else "the allocator's defaults"
        )
        step_table(args)
        if args.throughput:
            throughput_table(args)
    print(f"(total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
