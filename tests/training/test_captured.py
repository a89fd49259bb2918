"""Tests of pyro_bbb.training.captured: the fused step on static buffers, captured on CUDA.

Every test runs on the CPU, where nothing is captured and the static step must equal the
eager fused step bit for bit, and again on CUDA (marked ``cuda``), where the step is
captured as a CUDA graph after its warm-up and must equal the same step taken eagerly.
"""

from __future__ import annotations

import collections
import itertools
import math

import pyro
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pyro_bbb as bbb
from pyro_bbb.infer import AnnealedELBO, LinearWarmup, _low_rank_block
from pyro_bbb.infer.fused import fused_elbo
from pyro_bbb.infer.reparam import estimator
from pyro_bbb.training.captured import StaticStep, StaticSteps
from pyro_bbb.training.distributed import data_parallel
from pyro_bbb.training.lr_schedules import LRSchedule
from pyro_bbb.training.optimizers import make_optimizer
from pyro_bbb.training.steps import Steps

from ..support import requires_cuda

N, BATCH = 20, 6  # three steps of 6 and a last one of 2

DEVICES = ["cpu", pytest.param("cuda", marks=[requires_cuda, pytest.mark.cuda])]


def _data(device: str = "cpu", n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    y = torch.sin(x.sum(-1)) + 0.1 * torch.randn(n, generator=g)
    return x.to(device), y.to(device)


def _problem(guide: str, device: str = "cpu", reparam: str | None = None):
    """A model, its guide set up on a first batch, and the trained parameters."""
    pyro.clear_param_store()
    torch.manual_seed(1)
    model = bbb.BNN(bbb.mlp([3, 8, 8, 1]), bbb.likelihoods.Gaussian(), num_data=N).to(device)
    if guide == "lowrank":
        g = bbb.LowRankGuide(model, rank=2)
    elif guide == "ensemble":
        g = bbb.Ensemble(model, bbb.MeanFieldGuide, k=3)
    else:
        g = bbb.MeanFieldGuide(model)
    x, y = _data(device)
    with torch.no_grad(), estimator(reparam)():
        AnnealedELBO(1.0).terms(model, g, x[:BATCH], y[:BATCH])
    params = list(
        {id(p): p for p in (v.unconstrained() for v in pyro.get_param_store().values())}.values()
    )
    return model, g, params


def _values() -> dict[str, torch.Tensor]:
    return {name: v.detach().clone() for name, v in pyro.get_param_store().items()}


def _restore(values: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, v in pyro.get_param_store().items():
            v.unconstrained().copy_(values[name])


def _assert_equal(a: torch.Tensor, b: torch.Tensor, device: str, what: str) -> None:
    if device == "cpu":
        assert torch.equal(a, b), what
    else:  # the same kernels, replayed: equal up to the libraries' own rounding
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=what)


# The schedules the steps follow: β and the learning rate change at every step.
BETAS = [0.0, 0.2, 0.5, 0.9, 1.0, 1.0, 0.7]
FACTORS = [1.0, 0.8, 0.5, 1.2, 0.3, 0.9, 0.6]
SIZES = [BATCH, BATCH, BATCH, BATCH, 2, BATCH, BATCH]  # a smaller batch after the capture


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("guide", ["meanfield", "lowrank", "ensemble"])
def test_the_static_step_equals_the_eager_fused_step(guide, device):
    """Loss, NLL, KL, every site's term and every gradient, with the same noise, each step."""
    model, g, params = _problem(guide, device)
    x, y = _data(device)
    start = _values()
    elbo = AnnealedELBO(1.0)
    fused = fused_elbo(model, g, elbo, None)
    assert fused is not None

    def run(static: bool):
        _restore(start)
        optim = make_optimizer(None, params, 1e-2)
        rates = LRSchedule(lambda t: FACTORS[round(t)], optim)
        rates.hold_in_tensors()  # both alike: on CUDA the fused kernel reads a float32 rate
        if static:
            runner = StaticSteps(StaticStep(fused, optim, params), capture=device == "cuda")
        else:
            steps = Steps(
                model, g, elbo, estimator(None), optim, params, data_parallel(), [], rates,
                fused=fused,
            )  # fmt: skip
        pyro.set_rng_seed(5)
        seen = []
        for i, (beta, size) in enumerate(zip(BETAS, SIZES, strict=True)):
            rates.before_step(float(i))
            batch = (x[:size], y[:size])
            if static:
                row, names = runner(batch, beta), runner.site_names
            else:
                elbo.beta = beta
                terms = steps.step(batch, 0, i)
                row = torch.stack([terms.loss, terms.nll, terms.kl, *terms.sites.values()])
                names = tuple(terms.sites)
            grads = [p.grad.clone() for p in params]
            seen.append((row.detach().clone(), names, grads, _values()))
        return seen, (runner.captured if static else None)

    eager, _ = run(static=False)
    static, captured = run(static=True)
    assert captured == (device == "cuda")
    for i, (a, b) in enumerate(zip(eager, static, strict=True)):
        assert a[1] == b[1]
        _assert_equal(a[0], b[0], device, f"step {i}: loss, nll, kl, sites {a[1]}")
        for k, (ga, gb) in enumerate(zip(a[2], b[2], strict=True)):
            _assert_equal(ga, gb, device, f"step {i}: gradient {k}")
        for name in a[3]:
            _assert_equal(a[3][name], b[3][name], device, f"step {i}: {name} after the update")


def _fit(device: str, guide: str = "meanfield", epochs: int = 3, **options):
    model, g, _ = _problem(guide, device)
    x, y = _data(device)
    history = bbb.fit(
        model, g, x, y, epochs=epochs, batch_size=BATCH, beta=LinearWarmup(2), seed=2,
        progress=False, **options,
    )  # fmt: skip
    return history, _values()


def _assert_same_fit(a, b, device: str) -> None:
    (ha, pa), (hb, pb) = a, b
    for name in ("loss", "nll", "kl", "beta", "lr", "steps"):
        if device == "cpu":
            assert getattr(ha, name) == getattr(hb, name), name
        else:
            assert getattr(ha, name) == pytest.approx(getattr(hb, name), rel=1e-4), name
    for name in pa:
        if device == "cpu":
            assert torch.equal(pa[name], pb[name]), name
        else:  # the eager fit's rate is a double, the captured kernel's a float32
            torch.testing.assert_close(pa[name], pb[name], rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("guide", ["meanfield", "lowrank", "ensemble"])
def test_a_static_fit_with_a_smaller_last_batch_equals_the_eager_fit(guide, device):
    # schedules change at every step: the default rate decay, β's warm-up
    static = _fit(device, guide, cuda_graph=None if device == "cuda" else True)
    eager = _fit(device, guide, cuda_graph=False)
    _assert_same_fit(static, eager, device)


@pytest.mark.parametrize("device", DEVICES)
def test_resuming_a_static_fit_from_its_checkpoint_equals_the_uninterrupted_fit(device, tmp_path):
    path = tmp_path / "fit.pt"

    class StopAfter(bbb.Callback):
        def on_epoch_end(self, epoch, history):
            return epoch == 1

    uninterrupted = _fit(device, epochs=4, cuda_graph=True)
    _fit(device, epochs=4, cuda_graph=True, checkpoint=path, callbacks=[StopAfter()])
    resumed = _fit(device, epochs=4, cuda_graph=True, resume=path)
    # the same steps and rates (on CUDA, three eager steps after the resume where the
    # uninterrupted fit replays its graph: equal but for the libraries' rounding)
    _assert_same_fit(resumed, uninterrupted, device)
    # the checkpoint holds the rates as numbers: an eager fit resumes from it too
    eager_resumed = _fit(device, epochs=4, cuda_graph=False, resume=path)
    eager = _fit(device, epochs=4, cuda_graph=False)
    assert eager_resumed[0].loss[2:] == pytest.approx(eager[0].loss[2:], rel=1e-4)


# --- when the step cannot be static -----------------------------------------------------------


class _Clip(bbb.Callback):
    def on_after_backward(self, params, step):
        torch.nn.utils.clip_grad_norm_(params, 1.0)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"guide": "autonormal"}, "the steps are traced, not fused"),
        ({"optimizer": torch.optim.SGD}, r"the optimiser is SGD \(fused=None\)"),
        ({"callbacks": [_Clip()]}, "the callback _Clip acts between the backward pass"),
    ],
)
def test_cuda_graph_true_says_why_the_step_cannot_be_static(options, message):
    model, g, _ = _problem("meanfield")
    if options.pop("guide", None) == "autonormal":
        g = pyro.infer.autoguide.AutoNormal(model)
    x, y = _data()
    with pytest.raises(ValueError, match=f"cuda_graph=True, but {message}"):
        bbb.fit(model, g, x, y, epochs=1, cuda_graph=True, progress=False, **options)


def test_cuda_graph_takes_a_bool_or_none():
    model, g, _ = _problem("meanfield")
    x, y = _data()
    with pytest.raises(TypeError, match="cuda_graph must be True, False or None, got 'yes'"):
        bbb.fit(model, g, x, y, epochs=1, cuda_graph="yes", progress=False)


def test_a_fit_that_cannot_be_static_runs_eagerly_by_default():
    model, g, _ = _problem("meanfield")
    x, y = _data()
    history = bbb.fit(model, g, x, y, epochs=2, callbacks=[_Clip()], progress=False)
    assert all(math.isfinite(v) for v in history.loss)


# --- what a captured step must not contain ----------------------------------------------------


class _CaptureHazards(TorchDispatchMode):
    """Counts the operations a CUDA graph cannot hold: reads to the host, host-made tensors."""

    READS = frozenset({"_local_scalar_dense", "item", "is_nonzero", "nonzero", "equal", "allclose"})
    # kernels that read an error code back on CUDA (not on the CPU, where this test runs)
    CHECKED = frozenset({"_linalg_check_errors", "cholesky_inverse", "linalg_inv", "inverse"})

    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in self.READS or name in self.CHECKED or name.startswith("lift_fresh"):
            self.seen[str(func)] += 1
        elif name == "_to_copy" and "device" in kwargs and kwargs["device"] != args[0].device:
            self.seen[f"{func} to {kwargs['device']}"] += 1
        return func(*args, **kwargs)


_GUIDES = ["meanfield", "lowrank", "ensemble-meanfield", "ensemble-lowrank"]
#: every guide with every estimator and likelihood, and each guide with three particles
_HAZARD_CASES = [
    *itertools.product(_GUIDES, [None, "local", "flipout"], ["gaussian", "categorical"], [1]),
    *((guide, None, "gaussian", 3) for guide in _GUIDES),
]


@pytest.mark.parametrize("guide, reparam, likelihood, particles", _HAZARD_CASES)
def test_the_static_step_neither_reads_from_nor_copies_from_the_host(
    guide, reparam, likelihood, particles, monkeypatch
):
    """What would stop a capture on CUDA, looked for on the CPU once the step is warm.

    Where the step takes another path on CUDA (the inverse of a low-rank block's
    capacitance), the CUDA path is taken here.
    """
    monkeypatch.setattr(_low_rank_block, "_CHOLESKY_INVERSE_DEVICES", ())
    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(N, 3)
    if likelihood == "gaussian":
        model = bbb.BNN(bbb.mlp([3, 8, 1]), bbb.likelihoods.Gaussian(), num_data=N)
        y = torch.randn(N)
    else:
        model = bbb.BNN(bbb.mlp([3, 8, 4]), bbb.likelihoods.Categorical(), num_data=N)
        y = torch.randint(0, 4, (N,))
    family = {"meanfield": bbb.MeanFieldGuide, "lowrank": lambda m: bbb.LowRankGuide(m, rank=2)}
    if guide.startswith("ensemble"):
        g = bbb.Ensemble(model, family[guide.split("-")[1]], k=2)
    else:
        g = family[guide](model)
    elbo = AnnealedELBO(0.5, num_particles=particles)
    with torch.no_grad(), estimator(reparam)():
        elbo.terms(model, g, x[:BATCH], y[:BATCH])
    fused = fused_elbo(model, g, elbo, reparam)
    assert fused is not None
    params = [v.unconstrained() for v in pyro.get_param_store().values()]
    optim = make_optimizer(None, params, 1e-2)
    LRSchedule(1.0, optim).hold_in_tensors()
    runner = StaticSteps(StaticStep(fused, optim, params), capture=False)
    runner((x[:BATCH], y[:BATCH]), 0.5)  # caches (priors, constants) fill, as in the warm-up
    with _CaptureHazards() as hazards:
        runner.step(x[:BATCH], y[:BATCH])  # the step a capture records
    assert not hazards.seen, dict(hazards.seen)
