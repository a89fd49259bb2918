"""The step-time benchmark's hand-written steps: what ``fit``'s step is measured against.

Plain PyTorch Bayes by Backprop over a stack of Linear/Conv layers (``Reference``, with local
reparameterisation, and captured in one CUDA graph), a network's deterministic training step
(``Deterministic``), Bayes by Backprop over every parameter of any network through
``torch.func.functional_call`` (``EveryParameterBBB``), bayesian-torch's ``dnn_to_bnn`` when it
is installed (``BayesianTorch``) and the least Pyro program of the same semantics
(``BarePyro``). Each has ``step(x, y)``.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
import torch.nn.functional as F
from _steptime_problems import INIT_SCALE, LR, Net, default_adam, log_likelihood, update
from torch import nn


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
        log_lik = log_likelihood(self.net, h, y)
        loss = -log_lik * (self.net.num_data / len(x)) + kl
        return update(self.optim, loss)


class Deterministic:
    """The deterministic network's training step: the same loss, weights as point estimates."""

    def __init__(self, net: Net, device: torch.device, fused: bool) -> None:
        self.net, self.module = net, net.module().to(device)
        self.optim = default_adam(list(self.module.parameters()), fused)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        h = self.module(x)
        log_lik = log_likelihood(self.net, h, y)
        loss = -log_lik * (self.net.num_data / len(x))
        return update(self.optim, loss)


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
        loss = -log_likelihood(self.net, h, y) * (self.net.num_data / len(x)) + kl
        return update(self.optim, loss)


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
        loss = -log_likelihood(self.net, h, y) * (self.net.num_data / len(x))
        loss = loss + self.kl(self.module)
        return update(self.optim, loss)


def has_bayesian_torch() -> bool:
    """Whether bayesian-torch is installed (its rows are left out otherwise)."""
    try:
        import bayesian_torch  # noqa: F401
    except ImportError:
        return False
    return True


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
