"""``benchmarks/small_data.py``'s runs: the problems and the candidate remedies it trains.

Each problem is a small regression data set with a network (:data:`PROBLEMS`); each candidate
(:func:`run_candidate`) trains a mean-field guide on it one way: fit's defaults, a β
schedule, a warm start, restarts, an empirical-Bayes prior.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from _common import UCI_FOLDER
from _small_data_scores import beta1_loss

import pyro_bbb as bbb
from pyro_bbb.infer import LinearWarmup

#: Where the UCI sets are (``--uci`` sets it).
SETTINGS = {"uci": UCI_FOLDER}


# ------------------------------------------------------------------------------ problems
@dataclass
class Problem:
    name: str
    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_probe: torch.Tensor
    sizes: list[int]
    activation: str = "relu"
    epochs: int = 3000


def _two_intervals(n, inner, outer, generator):
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    x = inner + (outer - inner) * u
    x[: n // 2] = -x[: n // 2]
    return x


def _one_d(name, n, inner, outer, sizes, activation="relu", seed=7):
    g = torch.Generator().manual_seed(seed)
    x = _two_intervals(n, inner, outer, g)
    x_test = _two_intervals(1000, inner, outer, g)
    y = torch.sin(x) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    y_test = torch.sin(x_test) + 0.1 * torch.randn(1000, generator=g, dtype=torch.float64)
    probe = torch.linspace(-inner, inner, 101, dtype=torch.float64)
    col = lambda t: t.float().unsqueeze(-1)  # noqa: E731
    return Problem(
        name, col(x), y.float(), col(x_test), y_test.float(), col(probe), sizes, activation
    )


def _two_d(n=400, seed=7):
    g = torch.Generator().manual_seed(seed)

    def draw(m):
        points = []
        while sum(len(p) for p in points) < m:
            p = 6 * torch.rand(2 * m, 2, generator=g, dtype=torch.float64) - 3
            points.append(p[p.norm(dim=-1) > 1.5])
        return torch.cat(points)[:m]

    f = lambda x: torch.sin(x[:, 0]) + 0.5 * torch.cos(x[:, 1])  # noqa: E731
    x, x_test = draw(n), draw(1000)
    y = f(x) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    y_test = f(x_test) + 0.1 * torch.randn(1000, generator=g, dtype=torch.float64)
    r = 1.4 * torch.rand(200, 1, generator=g, dtype=torch.float64).sqrt()
    angle = 2 * math.pi * torch.rand(200, 1, generator=g, dtype=torch.float64)
    probe = torch.cat([r * angle.cos(), r * angle.sin()], -1)
    return Problem(
        "twod", x.float(), y.float(), x_test.float(), y_test.float(), probe.float(), [2, 20, 20, 1]
    )


def _yacht():
    split = bbb.data.load_uci_folder(Path(SETTINGS["uci"]) / "yacht", num_splits=1)[0]
    y_test = split.y_scaler.transform(split.y_test)  # standardized units throughout
    return Problem(
        "yacht",
        split.x_train,
        split.y_train,
        split.x_test,
        y_test,
        split.x_test,
        [split.x_train.shape[1], 50, 1],
        epochs=2000,
    )


PROBLEMS = {
    "demo": lambda: _demo(),
    "wide": lambda: _one_d("wide", 300, 1.5, 5.0, [1, 20, 20, 1]),
    "fewer": lambda: _one_d("fewer", 100, 1.5, 5.0, [1, 20, 20, 1]),
    "twod": _two_d,
    "yacht": _yacht,
    "tiny": lambda: _one_d("tiny", 80, 1.0, 4.0, [1, 50, 50, 1], activation="tanh"),
    "tiny_smallnet": lambda: _one_d("tiny_smallnet", 80, 1.0, 4.0, [1, 10, 10, 1], "tanh"),
    "tiny_moredata": lambda: _one_d("tiny_moredata", 320, 1.0, 4.0, [1, 50, 50, 1], "tanh"),
}


def _demo():
    data = bbb.data.gap_regression(num_data=500, noise=0.1, seed=0)
    test = bbb.data.gap_regression(num_data=1000, noise=0.1, seed=1)
    probe = torch.linspace(-1, 1, 101).unsqueeze(-1)
    return Problem("demo", data.x, data.y, test.x, test.y, probe, [1, 20, 20, 1])


# ---------------------------------------------------------------------------- candidates
def build(problem, init_scale, seed, prior=None):
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = bbb.mlp(problem.sizes, activation=problem.activation, prior=prior)
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=len(problem.x))
    return model, bbb.MeanFieldGuide(model, init_scale=init_scale)


def _fit(model, guide, problem, epochs, seed, **kwargs):
    # one weight sample a step, as the published tables were made; "particles" takes fit's
    # default number now
    kwargs.setdefault("num_particles", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the collapse warning is scored here, not shown
        return bbb.fit(
            model, guide, problem.x, problem.y, epochs=epochs, seed=seed, progress=False, **kwargs
        )


def hold_then_ramp(epochs, hold, ramp):
    """β = 0 for ``hold`` of the epochs, then linear to 1 over ``ramp`` of them."""
    return LinearWarmup(ramp * epochs, delay=hold * epochs)


def run_candidate(name, problem, init_scale, seed):
    epochs = problem.epochs
    if name == "eb":  # learned (empirical-Bayes) prior scale per layer
        layers = [str(2 * i) for i in range(len(problem.sizes) - 1)]
        prior = {f"{layer}.*": LearnedGaussian(layer) for layer in layers}
        model, guide = build(problem, init_scale, seed, prior=prior)
    else:
        model, guide = build(problem, init_scale, seed)
    if name == "default":
        _fit(model, guide, problem, epochs, seed)
    elif name == "particles":  # the fixed-length default: its schedule, samples by network size
        _fit(model, guide, problem, epochs, seed, num_particles=None)
    elif name == "auto":  # fit's defaults now: epochs=None, until more training stops paying
        history = _fit(model, guide, problem, None, seed, num_particles=None)
        guide.epochs_run = len(history)  # recorded with the scores
    elif name == "const_lr":  # the default beta with a constant learning rate
        _fit(model, guide, problem, epochs, seed, lr_schedule=1.0)
    elif name == "ensemble5":  # five mean-field guides trained as one, fit's defaults
        guide = bbb.Ensemble(model, partial(bbb.MeanFieldGuide, init_scale=init_scale), k=5)
        _fit(model, guide, problem, epochs, seed)
    elif name == "beta1" or name == "eb":
        _fit(model, guide, problem, epochs, seed, beta=1.0)
    elif name == "warmup10":
        _fit(model, guide, problem, epochs, seed, beta=LinearWarmup(epochs / 10))
    elif name == "hold25":
        _fit(model, guide, problem, epochs, seed, beta=hold_then_ramp(epochs, 0.25, 0.25))
    elif name == "tempered":  # the default schedule ending at beta = 0.1
        beta = LinearWarmup(epochs / 4, end=0.1, delay=epochs / 4)
        _fit(model, guide, problem, epochs, seed, beta=beta)
    elif name == "hold33":
        _fit(model, guide, problem, epochs, seed, beta=hold_then_ramp(epochs, 1 / 3, 1 / 3))
    elif name == "map":
        map_epochs = epochs // 4
        map_warm_start(model, guide, problem.x, problem.y, map_epochs)
        _fit(model, guide, problem, epochs - map_epochs, seed, beta=1.0)
    elif name == "rho_lr":
        _fit(model, guide, problem, epochs, seed, beta=1.0, optimizer=_rho_lr(10.0))
    elif name == "restarts":
        model, guide = restarts(problem, init_scale, seed, tries=3, fraction=1 / 6)
        guide.fit_end = None  # the best restart trained on with the schedule from its start
        _fit(model, guide, problem, epochs // 2, seed, beta=1.0)
    else:
        raise ValueError(f"unknown candidate {name!r}")
    return model, guide


class LearnedGaussian:
    """N(0, s²) on every weight of a layer, with s a point estimate (type-II ML)."""

    cacheable = False

    def __init__(self, layer):
        self.layer = layer

    def site_distribution(self, shape, *, fan_in, device, dtype):
        scale = pyro.param(
            f"prior_scale.{self.layer}",
            torch.tensor(1.0, device=device, dtype=dtype),
            constraint=dist.constraints.positive,
        )
        return (
            dist.Normal(torch.zeros((), device=device, dtype=dtype), scale)
            .expand(shape)
            .to_event(len(shape))
        )


def map_warm_start(model, guide, x, y, epochs, lr=1e-2):
    """Fit the guide's means and the model's noise by MAP (the means as the weights)."""
    guide(x, y)

    def conditioned():
        locs = {name: loc for name, (loc, _) in guide._marginals().items()}
        return poutine.trace(poutine.condition(model, data=locs)).get_trace(x, y)

    names = {id(p): n for n, p in pyro.get_param_store().named_parameters()}
    with poutine.trace(param_only=True) as capture:
        conditioned()
    params = {
        id(s["value"].unconstrained()): s["value"].unconstrained()
        for s in capture.trace.nodes.values()
    }
    params = [p for p in params.values() if ".rhos." not in names.get(id(p), "")]
    optim = torch.optim.Adam(params, lr=lr)
    for _ in range(epochs):
        loss = -conditioned().log_prob_sum()
        optim.zero_grad()
        loss.backward()
        optim.step()


def _rho_lr(factor, lr=1e-2):
    def make(params):
        names = {id(p): n for n, p in pyro.get_param_store().named_parameters()}
        rho = [p for p in params if ".rhos." in names.get(id(p), "")]
        rest = [p for p in params if ".rhos." not in names.get(id(p), "")]
        return torch.optim.Adam([{"params": rest}, {"params": rho, "lr": lr * factor}], lr=lr)

    return make


def restarts(problem, init_scale, seed, tries, fraction):
    """Short β = 1 fits from ``tries`` initialisations; keep the best by the β = 1 ELBO."""
    best = None
    for k in range(tries):
        model, guide = build(problem, init_scale, 1000 * (seed + 1) + k)
        _fit(model, guide, problem, int(fraction * problem.epochs), seed, beta=1.0)
        loss = beta1_loss(model, guide, problem.x, problem.y)[0]
        if best is None or loss < best[0]:
            best = (loss, model, guide, pyro.get_param_store().get_state())
    _, model, guide, state = best
    pyro.get_param_store().set_state(state)
    return model, guide
