"""Tests of pyro_bbb.training.steps: SVI's step written out, an epoch's record, bad losses."""

from __future__ import annotations

from collections.abc import Callable

import pyro
import pyro.optim
import pytest
import torch
from pyro.infer import SVI
from torch.utils._python_dispatch import TorchDispatchMode

from pyro_bbb import BNN, Callback, LowRankGuide, MeanFieldGuide, likelihoods, mlp
from pyro_bbb.infer import AnnealedELBO, LinearWarmup
from pyro_bbb.infer.fused import fused_elbo
from pyro_bbb.infer.reparam import estimator
from pyro_bbb.training.captured import static_steps
from pyro_bbb.training.distributed import data_parallel
from pyro_bbb.training.lr_schedules import InverseTimeDecay, LRSchedule
from pyro_bbb.training.minibatches import Batches, make_batches
from pyro_bbb.training.optimizers import make_optimizer
from pyro_bbb.training.steps import Steps

N = 24


def _problem(scale: float = 0.5):
    """A model, its guide with parameters created, data and the trainable parameters."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, N).unsqueeze(-1)
    y = torch.sin(2 * x.squeeze(-1))
    model = BNN(mlp([1, 8, 1]), likelihoods.Gaussian(scale=scale), num_data=N)
    guide = MeanFieldGuide(model, init_scale=0.1)
    with torch.no_grad():
        guide(x, y)
    params = [p.unconstrained() for p in pyro.get_param_store().values()]
    return model, guide, x, y, params


def _steps(model, guide, params, optimizer, callbacks=(), *, beta=1.0, step=0) -> Steps:
    return Steps(
        model, guide, AnnealedELBO(beta), estimator(None), optimizer, params, data_parallel(),
        list(callbacks), LRSchedule(1.0, optimizer), step=step,
    )  # fmt: skip


def _store() -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in pyro.get_param_store().items()}


def test_steps_are_the_steps_of_pyro_svi_with_the_same_optimiser():
    model, guide, x, y, _ = _problem()
    pyro.set_rng_seed(3)
    svi = SVI(model, guide, pyro.optim.SGD({"lr": 1e-3}), AnnealedELBO(0.5))
    svi_losses = [svi.step(x, y) for _ in range(3)]
    after_svi = _store()

    model, guide, x, y, params = _problem()
    steps = _steps(model, guide, params, torch.optim.SGD(params, lr=1e-3), beta=0.5)
    pyro.set_rng_seed(3)
    losses = [steps.step((x, y), 0, i).loss.item() for i in range(3)]
    assert steps.count == 3
    assert losses == svi_losses
    after = _store()
    assert after.keys() == after_svi.keys()
    for name, value in after.items():
        assert torch.equal(value, after_svi[name]), name


def test_callbacks_act_between_the_backward_pass_and_the_update():
    model, guide, x, y, params = _problem()

    class ZeroGradients(Callback):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def on_after_backward(self, params, step):
            assert all(p.grad is not None for p in params)
            self.steps.append(step)
            for p in params:
                p.grad.zero_()

    before = _store()
    zero = ZeroGradients()
    steps = _steps(model, guide, params, torch.optim.SGD(params, lr=0.1), [zero], step=5)
    steps.step((x, y), 0, 0)
    steps.step((x, y), 0, 1)
    assert zero.steps == [5, 6] and steps.count == 7
    for name, value in _store().items():  # zeroed gradients: SGD left every parameter alone
        assert torch.equal(value, before[name]), name


def test_an_epoch_records_the_means_of_its_steps_and_beta_at_the_fractional_epoch():
    model, guide, x, y, params = _problem()
    batches = make_batches(model, x, y, 6, False, torch.device("cpu"), seed=0)
    assert len(batches) == 4
    steps = _steps(model, guide, params, torch.optim.SGD(params, lr=0.0))  # nothing moves
    betas = []
    record = steps.epoch(batches, 2, lambda t: betas.append(t) or t - 2)
    assert betas == [2.0, 2.25, 2.5, 2.75]
    assert record.beta == pytest.approx((0 + 0.25 + 0.5 + 0.75) / 4)
    assert record.steps == steps.count == 4 and record.seconds > 0

    # with lr = 0 every step sees the same parameters: replay the four batches by hand
    pyro.set_rng_seed(0)
    steps.elbo.beta = 1.0
    record = steps.epoch(batches, 0, lambda t: 1.0)
    pyro.set_rng_seed(0)
    terms = [steps.elbo.terms(model, guide, *batch) for batch in batches(0)]
    mean = torch.stack([t.loss for t in terms]).double().mean().item()
    assert record.loss == pytest.approx(mean, rel=1e-6)
    nll = torch.stack([t.nll for t in terms]).double().mean().item()
    kl = torch.stack([t.kl for t in terms]).double().mean().item()
    assert record.nll == pytest.approx(nll, rel=1e-6) and record.kl == pytest.approx(kl, rel=1e-6)
    assert record.loss == pytest.approx(record.nll + record.kl, rel=1e-6)  # β = 1


def test_data_that_yield_no_minibatch_are_refused_naming_the_epoch():
    model, guide, _, _, params = _problem()
    empty = Batches(lambda epoch: [], num_steps=0, num_data=N, seed=None)
    steps = _steps(model, guide, params, torch.optim.SGD(params, lr=0.1))
    with pytest.raises(ValueError, match=r"epoch 3: the data yielded no minibatch"):
        steps.epoch(empty, 3, lambda t: 1.0)


def test_a_non_finite_loss_names_the_epoch_the_step_and_the_site():
    model, guide, x, _, params = _problem(scale=0.1)
    y = torch.full((N,), 1e20)  # finite, but its squared residual overflows float32
    before = _store()
    steps = _steps(model, guide, params, torch.optim.SGD(params, lr=0.1), step=11)
    with pytest.raises(
        FloatingPointError, match=r"at epoch 4, step 2 \(step 11 overall\).*site\(s\) \['obs'\]"
    ):
        steps.step((x, y), 4, 2)
    assert steps.count == 11
    for name, value in _store().items():  # no update was taken
        assert torch.equal(value, before[name]), name


# --- no reads from the device inside an epoch -------------------------------------------------


class _Reads(TorchDispatchMode):
    """Records reads of tensor values to the host below Python (``item``, ``bool``, ...)."""

    def __init__(self, during: Callable[[], bool]) -> None:
        super().__init__()
        self.during, self.seen = during, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("_local_scalar_dense", "item", "is_nonzero"):
            self.seen.append((str(func), self.during()))
        return func(*args, **(kwargs or {}))


def _fused_steps(guide: str, static: bool):
    """Steps of the fused ELBO on the CPU (eager, or on static buffers), and minibatches of 5."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, N).unsqueeze(-1)
    y = torch.sin(2 * x.squeeze(-1))
    model = BNN(mlp([1, 8, 1]), likelihoods.Gaussian(), num_data=N)
    g = MeanFieldGuide(model) if guide == "meanfield" else LowRankGuide(model, rank=2)
    elbo = AnnealedELBO(1.0)
    with torch.no_grad():
        elbo.terms(model, g, x, y)
    params = [p.unconstrained() for p in pyro.get_param_store().values()]
    optim = make_optimizer(None, params, 1e-2)
    rates = LRSchedule(InverseTimeDecay(3), optim)
    fused = fused_elbo(model, g, elbo, None)
    runner = static_steps(static, fused, optim, rates, params, [], data_parallel(),
                          torch.device("cpu"))  # fmt: skip
    steps = Steps(model, g, elbo, estimator(None), optim, params, data_parallel(), [], rates,
                  fused=fused, runner=runner)  # fmt: skip
    return steps, make_batches(model, x, y, 5, True, torch.device("cpu"), seed=0)


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("guide", ["meanfield", "lowrank"])
def test_an_epoch_of_the_fused_step_reads_nothing_from_the_device_until_its_end(
    guide, static, monkeypatch
):
    """No Tensor.item, .cpu, .tolist, bool() or float() of a tensor until the last step is done.

    Each would make a GPU wait for every queued kernel. Reads are counted in Python (the
    methods patched) and below it (a dispatch mode sees C++ reads of a value too); the epoch's
    one read of its means comes after the steps.
    """
    steps, batches = _fused_steps(guide, static)
    steps.epoch(batches, 0, LinearWarmup(2))  # the first epoch fills the caches
    during = True
    calls: list[tuple[str, bool]] = []

    def counted(name):
        original = getattr(torch.Tensor, name)

        def method(self, *args, **kwargs):
            calls.append((name, during))
            return original(self, *args, **kwargs)

        return method

    for name in ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, counted(name))

    def epoch_batches(epoch):
        nonlocal during
        yield from batches(epoch)
        during = False  # the steps are done: the epoch's end may read

    with _Reads(lambda: during) as reads:
        record = steps.epoch(
            Batches(epoch_batches, len(batches), N, batches.seed), 1, lambda t: 1.0
        )
    assert record.steps == 2 * len(batches)
    assert [name for name, in_steps in calls if in_steps] == []
    assert [op for op, in_steps in reads.seen if in_steps] == []
    assert ("tolist", False) in calls  # the epoch's one read, after its steps
    with _Reads(lambda: True) as probe:
        bool(torch.ones(()))
    assert probe.seen  # the dispatch mode sees a read


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_a_non_finite_loss_found_at_the_epochs_end_names_the_first_step_it_appeared_in(static):
    steps, _ = _fused_steps("meanfield", static)
    x = torch.linspace(-2, 2, N).unsqueeze(-1)
    y = torch.sin(2 * x.squeeze(-1))
    y[12] = 1e20  # finite, but its squared residual overflows float32: the third batch of 5
    batches = make_batches(steps.model, x, y, 5, False, torch.device("cpu"))
    steps.count = 7
    message = (
        r"at epoch 3, step 2 \(step 9 overall\); non-finite terms at site\(s\) \['obs'\].*"
        r"The loss is checked once an epoch"
    )
    with pytest.raises(FloatingPointError, match=message):
        steps.epoch(batches, 3, lambda t: 1.0)
