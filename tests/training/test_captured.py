"""Tests of pyro_bbb.training.captured: the fused step on static buffers, captured on CUDA.

Every test runs on the CPU, where nothing is captured and the static step must equal the
eager fused step bit for bit, and again on CUDA (marked ``cuda``), where the step is
captured as a CUDA graph after its warm-up and must equal the same step taken eagerly. The
capture's flow (warm-up, capture, replay, the guard before each replay, the fallback when a
capture fails) runs on the CPU too, through :class:`_Replaying`, a stand-in whose "graph"
runs the recorded step again on the same buffers.
"""

from __future__ import annotations

import ast
import collections
import inspect
import itertools
import warnings

import pyro
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pyro_bbb as bbb
from pyro_bbb.infer import AnnealedELBO, LinearWarmup, _low_rank_block
from pyro_bbb.infer.fused import fused_elbo
from pyro_bbb.infer.reparam import estimator
from pyro_bbb.nn.draws import DrawPath, draw_path
from pyro_bbb.training import captured, loop
from pyro_bbb.training.captured import CUDAGraphCapture, StaticStep, StaticSteps
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


class _Conv(torch.nn.Module):
    """A small ConvNet on rows of 3 features: weight draws reach it once per draw (vmap)."""

    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 4, 3, padding=1)
        # BatchNorm updating its running statistics: vmap has no rule, the draws loop
        self.norm = torch.nn.BatchNorm1d(4, affine=False) if norm else torch.nn.Identity()
        self.fc = torch.nn.Linear(12, 1)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x.unsqueeze(1))))
        return self.fc(h.flatten(1))


class _ReadsBack(torch.nn.Module):
    """A network whose forward branches on a value it reads back: no CUDA graph holds it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x):
        out = self.fc(x)
        return out if bool(out.abs().sum() < 1e30) else -out


#: The networks: ``mlp`` broadcasts draws; ``conv`` takes them per draw by vmap,
#: ``conv_loop`` one after another (the per-draw paths of conv nets in the fused step);
#: ``reads`` cannot be captured.
NETS = {
    "mlp": lambda: bbb.mlp([3, 8, 8, 1]),
    "conv": lambda: bbb.bayesianize(_Conv()),
    "conv_loop": lambda: bbb.bayesianize(_Conv(norm=True)),
    "reads": lambda: bbb.bayesianize(_ReadsBack()),
}
PATHS = {"mlp": DrawPath.BROADCAST, "conv": DrawPath.VMAP, "conv_loop": DrawPath.LOOP}


def _particles(net: str) -> int:
    """Two weight draws a step for the ConvNets: a per-draw pass inside the fused step."""
    return 2 if net.startswith("conv") else 1


def _problem(
    guide: str, device: str = "cpu", reparam: str | None = None, net: str = "mlp", particles=1
):
    """A model, its guide set up on a first batch, and the trained parameters."""
    pyro.clear_param_store()
    torch.manual_seed(1)
    model = bbb.BNN(NETS[net](), bbb.likelihoods.Gaussian(), num_data=N).to(device)
    if guide == "lowrank":
        g = bbb.LowRankGuide(model, rank=2)
    elif guide == "ensemble":
        g = bbb.Ensemble(model, bbb.MeanFieldGuide, k=3)
    else:
        g = bbb.MeanFieldGuide(model)
    x, y = _data(device)
    with torch.no_grad(), estimator(reparam)():
        AnnealedELBO(1.0, num_particles=particles).terms(model, g, x[:BATCH], y[:BATCH])
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


class _Replayed:
    """A stand-in for a CUDA graph on the CPU: a replay runs the recorded step again."""

    def __init__(self, step: StaticStep, x: torch.Tensor, y: torch.Tensor) -> None:
        self.step, self.x, self.y = step, x, y
        self.output = torch.empty(0)

    def replay(self) -> None:
        row = self.step(self.x, self.y)
        self.output.resize_(row.shape).copy_(row)


class _Replaying:
    """A :class:`~pyro_bbb.training.captured.Capture` on the CPU, counting its recordings.

    ``fail``: the error its recordings raise, as a capture on CUDA can.
    """

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.records = self.warm_ups = 0

    def warm_up(self, step, x, y):
        self.warm_ups += 1
        return step(x, y)

    def record(self, step, x, y):
        self.records += 1
        if self.fail is not None:
            raise self.fail
        graph = _Replayed(step, x, y)
        return graph, graph.output


#: How the static steps run: on the CPU uncaptured, on the CPU through the capture's flow
#: (:class:`_Replaying`), and captured on CUDA.
MODES = ["cpu", "replayed", pytest.param("cuda", marks=[requires_cuda, pytest.mark.cuda])]

#: Guides and networks: the broadcast path under each guide, the per-draw paths of a
#: ConvNet (vmap, and a loop) under one guide and an ensemble.
CASES = [
    ("meanfield", "mlp"),
    ("lowrank", "mlp"),
    ("ensemble", "mlp"),
    ("meanfield", "conv"),
    ("ensemble", "conv"),
    ("meanfield", "conv_loop"),
]


def _device(mode: str) -> str:
    return "cuda" if mode == "cuda" else "cpu"


def _capture(mode: str):
    return {"cpu": None, "replayed": _Replaying(), "cuda": CUDAGraphCapture()}[mode]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("guide, net", CASES)
def test_the_static_step_equals_the_eager_fused_step(guide, net, mode):
    """Loss, NLL, KL, every site's term and every gradient, with the same noise, each step."""
    device = _device(mode)
    particles = _particles(net)
    model, g, params = _problem(guide, device, net=net, particles=particles)
    x, y = _data(device)
    start = _values()
    elbo = AnnealedELBO(1.0, num_particles=particles)
    fused = fused_elbo(model, g, elbo, None)
    assert fused is not None
    assert draw_path(model.net).path is PATHS[net]

    def run(static: bool):
        _restore(start)
        optim = make_optimizer(None, params, 1e-2)
        rates = LRSchedule(lambda t: FACTORS[round(t)], optim)
        rates.hold_in_tensors()  # both alike: on CUDA the fused kernel reads a float32 rate
        if static:
            runner = StaticSteps(StaticStep(fused, optim, rates, params), capture=_capture(mode))
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
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no guard, no fallback: the same tensors throughout
        static, captured = run(static=True)
    assert captured == (mode != "cpu")
    for i, (a, b) in enumerate(zip(eager, static, strict=True)):
        assert a[1] == b[1]
        _assert_equal(a[0], b[0], device, f"step {i}: loss, nll, kl, sites {a[1]}")
        for k, (ga, gb) in enumerate(zip(a[2], b[2], strict=True)):
            _assert_equal(ga, gb, device, f"step {i}: gradient {k}")
        for name in a[3]:
            _assert_equal(a[3][name], b[3][name], device, f"step {i}: {name} after the update")


@pytest.fixture
def runners(monkeypatch) -> list:
    """The static steps each fit takes (``None`` for the eager steps), as fit made them."""
    made: list = []

    def spied(*args, **kwargs):
        made.append(static_steps(*args, **kwargs))
        return made[-1]

    static_steps = loop.static_steps
    monkeypatch.setattr(loop, "static_steps", spied)
    return made


@pytest.fixture
def replaying(monkeypatch):
    """The CPU captures its steps through a :class:`_Replaying` (returned) by default."""
    capture = _Replaying()
    monkeypatch.setattr(captured, "_capture_for", lambda device: capture)
    return capture


def _fit(device: str, guide: str = "meanfield", epochs: int = 3, net: str = "mlp", **options):
    particles = _particles(net)
    model, g, _ = _problem(guide, device, net=net, particles=particles)
    x, y = _data(device)
    history = bbb.fit(
        model, g, x, y, epochs=epochs, batch_size=BATCH, beta=LinearWarmup(2), seed=2,
        progress=False, num_particles=particles, **options,
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


@pytest.mark.filterwarnings("ignore:each step's weight draws run through the network one after")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("guide, net", CASES)
def test_a_static_fit_with_a_smaller_last_batch_equals_the_eager_fit(
    guide, net, mode, runners, monkeypatch
):
    # schedules change at every step: the default rate decay, β's warm-up
    device = _device(mode)
    if mode == "replayed":
        monkeypatch.setattr(captured, "_capture_for", lambda device: _Replaying())
    static = _fit(device, guide, net=net, cuda_graph=None if mode != "cpu" else True)
    (runner,) = runners
    assert runner is not None and runner.captured == (mode != "cpu")
    eager = _fit(device, guide, net=net, cuda_graph=False)
    assert runners[1] is None
    _assert_same_fit(static, eager, device)


@pytest.mark.parametrize("device", DEVICES)
def test_resuming_a_static_fit_from_its_checkpoint_equals_the_uninterrupted_fit(
    device, tmp_path, runners
):
    path = tmp_path / "fit.pt"

    class StopAfter(bbb.Callback):
        def on_epoch_end(self, epoch, history):
            return epoch == 1

    uninterrupted = _fit(device, epochs=4, cuda_graph=True)
    _fit(device, epochs=4, cuda_graph=True, checkpoint=path, callbacks=[StopAfter()])
    resumed = _fit(device, epochs=4, cuda_graph=True, resume=path)
    # each static; on CUDA captured (epochs of three full steps and a smaller one)
    assert all(runner is not None and runner.captured == (device == "cuda") for runner in runners)
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
        ({"optimizer": torch.optim.SGD, "lr": 1e-3}, r"the optimiser is SGD \(fused=None\)"),
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


class _CountingClip(_Clip):
    def __init__(self) -> None:
        self.calls = 0

    def on_after_backward(self, params, step):
        self.calls += 1
        super().on_after_backward(params, step)


def test_a_fit_that_cannot_be_static_runs_eagerly_by_default(replaying, runners):
    """Where the device captures (here the CPU, through the stand-in), by default."""
    model, g, _ = _problem("meanfield")
    x, y = _data()
    bbb.fit(model, g, x, y, epochs=2, batch_size=BATCH, progress=False)
    assert runners[-1] is not None and runners[-1].captured  # it would capture...
    assert replaying.records == 1
    clip = _CountingClip()
    model, g, _ = _problem("meanfield")
    history = bbb.fit(model, g, x, y, epochs=2, batch_size=BATCH, callbacks=[clip], progress=False)
    assert runners[-1] is None and replaying.records == 1  # ...but takes the eager steps
    assert clip.calls == history.steps[-1] == 8  # the callback ran at every step


def test_cuda_graph_none_on_the_cpu_takes_the_eager_steps(runners):
    model, g, _ = _problem("meanfield")
    x, y = _data()
    bbb.fit(model, g, x, y, epochs=1, progress=False)
    assert runners == [None]


# --- a capture that fails, tensors replaced under a captured graph ---------------------------


def _fits_with_a_failing_capture(monkeypatch, **options):
    """The same fit with a capture that fails, and eagerly; the warnings of the first."""
    failing = _Replaying(fail=RuntimeError("operation not permitted when stream is capturing"))
    monkeypatch.setattr(captured, "_capture_for", lambda device: failing)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fallen = _fit("cpu", epochs=3, **options)
    assert failing.records == 1 and failing.warm_ups == captured.WARMUP_STEPS
    monkeypatch.setattr(captured, "_capture_for", lambda device: None)
    eager = _fit("cpu", epochs=3, cuda_graph=False)
    mine = [w for w in seen if "CUDA graph" in str(w.message)]
    return fallen, eager, mine


def test_a_capture_that_fails_falls_back_to_the_eager_fused_step_with_one_warning(monkeypatch):
    fallen, eager, warned = _fits_with_a_failing_capture(monkeypatch)
    (warning,) = warned
    assert str(warning.message).startswith(
        "fit could not capture its step as a CUDA graph (operation not permitted when stream is "
        "capturing); it trains with the eager fused step instead"
    )
    assert warning.filename == __file__  # pointed at the caller of fit
    # the failed capture changed nothing: the step it would have recorded is taken eagerly
    _assert_same_fit(fallen, eager, "cpu")


def test_after_a_failed_capture_the_eager_fused_step_runs_not_the_static_one(monkeypatch, runners):
    # the warning says "the eager fused step": after the warm-up and the failed capture's own
    # step, no step may run on the static buffers (StaticStep), every one on the eager path
    static_calls = []
    taken = captured.StaticStep.__call__

    def counted(self, x, y):
        static_calls.append(x.shape[0])
        return taken(self, x, y)

    monkeypatch.setattr(captured.StaticStep, "__call__", counted)
    fallen, eager, _ = _fits_with_a_failing_capture(monkeypatch)
    assert runners[0] is not None and not runners[0].active and not runners[0].capturing
    # epoch 0: the warm-up's full batches and the smaller last one; epoch 1: the failed capture
    assert N // BATCH == captured.WARMUP_STEPS and N % BATCH
    assert static_calls == [BATCH] * captured.WARMUP_STEPS + [N % BATCH, BATCH]
    assert fallen[0].steps[-1] > 2 * (captured.WARMUP_STEPS + 1)  # the rest ran eagerly
    _assert_same_fit(fallen, eager, "cpu")


def test_cuda_graph_true_raises_when_the_capture_fails(monkeypatch):
    failing = _Replaying(fail=RuntimeError("operation not permitted when stream is capturing"))
    monkeypatch.setattr(captured, "_capture_for", lambda device: failing)
    message = (
        r"fit could not capture its step as a CUDA graph \(operation not permitted when stream "
        r"is capturing\); pass cuda_graph=None to fall back"
    )
    with pytest.raises(RuntimeError, match=message):
        _fit("cpu", epochs=2, cuda_graph=True)


@requires_cuda
@pytest.mark.cuda
def test_on_cuda_a_step_that_cannot_be_captured_falls_back_to_the_eager_step(runners):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fallen = _fit("cuda", net="reads")
    (warning,) = (w for w in seen if "CUDA graph" in str(w.message))
    assert "fit could not capture its step as a CUDA graph" in str(warning.message)
    assert warning.filename == __file__
    assert not runners[0].capturing
    # the failed capture left the generator as it was: the fit draws what the eager fit draws
    eager = _fit("cuda", net="reads", cuda_graph=False)
    _assert_same_fit(fallen, eager, "cuda")
    with pytest.raises(RuntimeError, match="fit could not capture its step as a CUDA graph"):
        _fit("cuda", net="reads", cuda_graph=True)


class _Replace(bbb.Callback):
    """Replaces the parameters' storage (values kept) at the end of the given epochs."""

    def __init__(self, epochs) -> None:
        self.epochs = set(epochs)

    def on_fit_start(self, params, history):
        self.params = params

    def on_epoch_end(self, epoch, history):
        if epoch in self.epochs:
            for param in self.params:
                param.data = param.data.clone()


def test_tensors_replaced_under_the_graph_are_captured_again_once_then_run_eagerly(
    replaying, runners
):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        guarded = _fit("cpu", epochs=5, callbacks=[_Replace({1, 3})])
    first, second = (w for w in seen if "CUDA graph" in str(w.message))
    assert str(first.message).startswith(
        "a parameter that fit's captured CUDA graph reads or writes was replaced between steps"
    )
    assert "fit captures its step again" in str(first.message)
    assert "fit takes the eager fused step from here on" in str(second.message)
    assert first.filename == second.filename == __file__
    # captured in epoch 0, again in epoch 2 after a new warm-up, never after the second change
    assert replaying.records == 2 and replaying.warm_ups == 2 * captured.WARMUP_STEPS
    assert not runners[-1].captured and not runners[-1].capturing and not runners[-1].active
    eager = _fit("cpu", epochs=5, callbacks=[_Replace({1, 3})], cuda_graph=False)
    _assert_same_fit(guarded, eager, "cpu")


def _replace_gradients(model, guide, params, optim):
    for param in params:
        param.grad = None


def _reload_the_optimiser(model, guide, params, optim):
    optim.load_state_dict(optim.state_dict())


def _reload_the_param_store(model, guide, params, optim):
    store = pyro.get_param_store()
    state = store.get_state()
    store.set_state({
        "params": {name: value.detach().clone() for name, value in state["params"].items()},
        "constraints": state["constraints"],
    })  # fmt: skip
    x, y = _data()
    with torch.no_grad():  # a traced evaluation (fit's collapse check) makes the guide read them
        AnnealedELBO(1.0).terms(model, guide, x, y)


@pytest.mark.parametrize(
    "replace, named, recaptured",
    [
        (_replace_gradients, "a gradient", True),
        (_reload_the_optimiser, "the optimiser", False),  # its rates are numbers again
        (_reload_the_param_store, "a parameter the step reads", True),
    ],
)
def test_the_guard_names_what_was_replaced(replace, named, recaptured):
    model, g, params = _problem("meanfield")
    x, y = _data()
    fused = fused_elbo(model, g, AnnealedELBO(1.0), None)
    optim = make_optimizer(None, params, 1e-2)
    runner = StaticSteps(
        StaticStep(fused, optim, LRSchedule(1.0, optim), params), capture=_Replaying()
    )
    for _ in range(captured.WARMUP_STEPS + 2):
        runner((x[:BATCH], y[:BATCH]), 1.0)
    assert runner.captured
    replace(model, g, params, optim)
    with pytest.warns(UserWarning, match=f"^{named} that fit's captured CUDA graph") as seen:
        runner((x[:BATCH], y[:BATCH]), 1.0)
    (warning,) = seen
    assert ("captures its step again" in str(warning.message)) == recaptured
    assert runner.capturing == recaptured and not runner.captured


def test_static_steps_capture_where_the_device_can():
    model, g, params = _problem("meanfield")
    fused = fused_elbo(model, g, AnnealedELBO(1.0), None)
    optim = make_optimizer(None, params, 1e-2)
    cuda = torch.device("cuda")  # nothing touches the device while the steps are set up
    for cuda_graph, strict in [(None, False), (True, True)]:
        made = captured.static_steps(
            cuda_graph, fused, optim, LRSchedule(1.0, optim), params, [], data_parallel(), cuda
        )
        assert isinstance(made._capture, CUDAGraphCapture) and made.strict == strict
    cpu = torch.device("cpu")
    args = (fused, optim, LRSchedule(1.0, optim), params, [], data_parallel())
    assert captured.static_steps(None, *args, cpu) is None
    assert captured.static_steps(False, *args, cuda) is None
    assert not captured.static_steps(True, *args, cpu).capturing


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
_ESTIMATORS = [None, "local", "flipout"]
#: every guide with every estimator and likelihood, and each guide with three particles, on
#: an MLP (draws broadcast); two draws of a ConvNet's weights, by vmap and by a loop, under
#: every estimator (draws per draw inside the fused step)
_HAZARD_CASES = [
    *((*case, "mlp") for case in itertools.product(
        _GUIDES, _ESTIMATORS, ["gaussian", "categorical"], [1]
    )),
    *((guide, None, "gaussian", 3, "mlp") for guide in _GUIDES),
    *((guide, reparam, "gaussian", 2, net) for guide, reparam, net in itertools.product(
        ["meanfield", "ensemble-meanfield"], _ESTIMATORS, ["conv", "conv_loop"]
    )),
]  # fmt: skip


@pytest.mark.filterwarnings("ignore:each step's weight draws run through the network one after")
@pytest.mark.parametrize("guide, reparam, likelihood, particles, net", _HAZARD_CASES)
def test_the_static_step_neither_reads_from_nor_copies_from_the_host(
    guide, reparam, likelihood, particles, net, monkeypatch
):
    """What would stop a capture on CUDA, looked for on the CPU once the step is warm.

    Where the step takes another path on CUDA (the inverse of a low-rank block's
    capacitance), the CUDA path is taken here.
    """
    monkeypatch.setattr(_low_rank_block, "_CHOLESKY_INVERSE_DEVICES", ())
    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(N, 3)
    if net != "mlp":
        model = bbb.BNN(NETS[net](), bbb.likelihoods.Gaussian(), num_data=N)
        y = torch.randn(N)
    elif likelihood == "gaussian":
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
    assert draw_path(model.net).path is PATHS[net]
    params = [v.unconstrained() for v in pyro.get_param_store().values()]
    optim = make_optimizer(None, params, 1e-2)
    runner = StaticSteps(StaticStep(fused, optim, LRSchedule(1.0, optim), params), capture=None)
    runner((x[:BATCH], y[:BATCH]), 0.5)  # caches (priors, constants) fill, as in the warm-up
    with _CaptureHazards() as hazards:
        runner.step(x[:BATCH], y[:BATCH])  # the step a capture records
    assert not hazards.seen, dict(hazards.seen)


def test_the_static_step_reaches_what_it_captures_through_public_names_only():
    # Its contract with the evaluation, the optimiser and the schedule is their public
    # methods (the module's notes): no private attribute of anything but the step itself.
    tree = ast.parse(inspect.getsource(captured))
    private = sorted(
        f"{ast.unparse(node.value)}.{node.attr} (line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    )
    assert not private, private
