"""fit's own rate (lr not given): set from the weights' size, halved where it stops paying."""

from __future__ import annotations

import copy
import math
import warnings

import pyro
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.training import loop
from pyro_bbb.training.auto_epochs import MAX_HALVINGS, AutoEpochs, budget_epochs
from pyro_bbb.training.convergence import ConvergenceWarning
from pyro_bbb.training.rates import MAX_LR, default_lr
from pyro_bbb.training.scoring import IterateAverage
from pyro_bbb.training.stopping import DECAY_FLOOR, DECAY_SHARE, TOLERANCE, StopsPaying

from .test_auto_epochs import _record, _StopAt
from .test_default_length import _gap, _params, _starts

#: The tiny problem's start rate: high enough for its stages to take their least lengths.
_START = 0.05


def _fit(monkeypatch, **options):
    """A default fit of a 1-8-8-1 net on 200 points, the rate left to fit (from 0.05)."""
    monkeypatch.setattr(loop, "default_lr", lambda model: _START)
    monkeypatch.setattr(StopsPaying, "min_stage_steps", 100)  # short stages, quick tests
    data, model, guide = _gap()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        return bbb.fit(model, guide, data.x, data.y, seed=0, progress=False, **options)


def _halvings(history):
    return [e for e in range(1, len(history)) if history.stage[e] == "train"
            and history.lr[e] < history.lr[e - 1]]  # fmt: skip


@pytest.fixture(scope="module")
def halved():
    """One default fit whose rate is fit's own: History, final parameters, restored averages."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        restored = []
        restore = IterateAverage.restore_best

        def counted(self):
            restored.append(self.best is not None)
            return restore(self)

        monkeypatch.setattr(IterateAverage, "restore_best", counted)
        history = _fit(monkeypatch)
    return history, _params(), restored


def test_the_full_rate_stage_halves_its_rate_while_halving_pays(halved):
    history, _, restored = halved
    halvings = _halvings(history)
    train, decay = _starts(history)["train"], _starts(history)["decay"]
    assert 1 <= len(halvings) <= MAX_HALVINGS
    for k, epoch in enumerate(halvings, start=1):  # exactly halved, and held there
        assert history.lr[epoch] == pytest.approx(_START / 2**k, rel=1e-12)
    assert set(history.lr[train : halvings[0]]) == {_START}
    # each phase begins from the best average before it, as the decay does
    assert restored == [True] * (len(halvings) + 1)

    def best(start, end):  # of the expected log-likelihood, what the rule reads
        return max(-n for n in history.averaged_nll[start:end] if not math.isnan(n))

    # a halving after the first follows a phase that beat the best before it by TOLERANCE;
    # the stage ended with a phase that did not, or at the most halvings
    phases = [train, *halvings, decay]
    for k in range(1, len(phases) - 1):
        gained = best(phases[k], phases[k + 1]) - best(train, phases[k])
        assert gained >= TOLERANCE or k == len(phases) - 2
    if len(halvings) < MAX_HALVINGS:
        assert best(halvings[-1], decay) - best(train, halvings[-1]) < TOLERANCE
        # that last phase ran at a lower rate already: it is the first part of the low-rate
        # tail, three sevenths of the run before it
        tail = math.ceil(DECAY_SHARE * halvings[-1])
        assert len(history) - decay == max(1, tail - (decay - halvings[-1]))
    else:
        assert len(history) - decay == math.ceil(DECAY_SHARE * decay)
    # the decay starts at the halved rate and falls to the same floor of the start rate
    assert history.lr[decay - 1] == history.lr[halvings[-1]]
    assert history.lr[-1] == pytest.approx(DECAY_FLOOR * _START, rel=0.05)
    assert f"at 1/{2 ** len(halvings)} of the rate" in history.stopped
    assert f"halved after epochs {halvings[0]:,}" in history.stopped


def test_the_average_restarts_with_each_halving(halved):
    # each phase scores its own average: the first score after a halving is read from
    # iterates of the halved rate alone, every few epochs from the phase's start
    history, _, _ = halved
    for epoch in _halvings(history):
        read = [e for e in range(epoch, len(history)) if not math.isnan(history.averaged_nll[e])]
        assert read and (read[0] + 1 - epoch) % 10 == 0 and read[0] > epoch


@pytest.mark.parametrize("where", ["halved", "decay"])
def test_a_resumed_fit_halves_where_the_uninterrupted_one_did(tmp_path, monkeypatch, halved, where):
    # inside the first halved phase, or in the decay, whose falling rate is no halving
    whole, params, _ = halved
    decay = _starts(whole)["decay"]
    stop = _halvings(whole)[0] + 15 if where == "halved" else decay + (len(whole) - decay) // 2
    path = tmp_path / "halved.pt"
    # every 100th epoch and the stop: each write stores the whole History (writing every
    # epoch of these 3,000 cost three times the fit)
    _fit(monkeypatch, checkpoint=path, checkpoint_every=100, callbacks=[_StopAt(stop)])
    resumed = _fit(monkeypatch, resume=path)
    assert _record(resumed) == _record(whole) and resumed.stopped == whole.stopped
    assert all(torch.equal(value, params[name]) for name, value in _params().items())


def test_a_restored_run_reads_halvings_in_the_full_rate_stage_alone(halved):
    # the decay lowers the rate every epoch, by more than a quarter early on a large data
    # set's run: a resumed run must not read those falls as halvings
    whole, _, _ = halved
    history = copy.deepcopy(whole)
    decay = _starts(history)["decay"]
    for epoch in range(decay, len(history)):
        history.lr[epoch] = history.lr[decay - 1] * 0.5 ** (epoch - decay + 1)
    length = AutoEpochs(1, budget_epochs(None, 1), beta=None, decay=True, halves=True)
    length.restore(history)
    assert length.halvings == _halvings(whole)


def test_a_rate_given_is_followed_as_given(monkeypatch):
    monkeypatch.setattr(loop, "default_lr", lambda model: pytest.fail("lr was given"))
    data, model, guide = _gap()
    history = bbb.fit(model, guide, data.x, data.y, lr=0.05, seed=0, progress=False)
    decay = history.stage.index("decay")
    assert set(history.lr[:decay]) == {0.05}


def test_an_optimiser_of_the_users_own_keeps_its_rate(monkeypatch):
    # a function builds the optimiser with its own rate: fit neither sets nor halves it
    data, model, guide = _gap()
    monkeypatch.setattr(StopsPaying, "min_stage_steps", 100)
    history = bbb.fit(model, guide, data.x, data.y, seed=0, progress=False,
                      optimizer=lambda params: torch.optim.Adam(params, lr=0.05))  # fmt: skip
    decay = history.stage.index("decay")
    assert set(history.lr[:decay]) == {0.05}


def _net(sizes):
    return bbb.BNN(bbb.mlp(sizes), bbb.likelihoods.Gaussian(), num_data=10)


def test_the_default_rate_is_a_sixteenth_of_the_largest_weight_tensors_size():
    torch.manual_seed(0)
    # torch's default initialisation: U(+-1/sqrt(fan_in)), root mean square 1/sqrt(3 fan_in)
    wide = default_lr(_net([784, 400, 400, 10]))  # the 400 x 784 matrix holds most weights
    assert wide == pytest.approx(1 / (16 * math.sqrt(3 * 784)), rel=0.01)
    assert default_lr(_net([784, 1200, 1200, 10])) == pytest.approx(
        1 / (16 * math.sqrt(3 * 1200)), rel=0.01
    )
    # a network of small fan-in keeps the ceiling; 50 x 50 tanh units take half of it
    assert default_lr(_net([6, 50, 1])) == default_lr(_net([4, 100, 1])) == MAX_LR
    assert default_lr(_net([1, 50, 50, 1])) == pytest.approx(1 / (16 * math.sqrt(150)), rel=0.03)
    # trained weights of another size move the rate with them
    net = bbb.mlp([784, 400, 10])
    with torch.no_grad():
        pretrained = torch.nn.Sequential(torch.nn.Linear(784, 400), torch.nn.ReLU(),
                                         torch.nn.Linear(400, 10))  # fmt: skip
        pretrained[0].weight.mul_(0.1)
    scaled = bbb.BNN(bbb.bayesianize(pretrained), bbb.likelihoods.Gaussian(), num_data=10)
    assert default_lr(scaled) == pytest.approx(default_lr(bbb.BNN(
        net, bbb.likelihoods.Gaussian(), num_data=10)) / 10, rel=0.05)  # fmt: skip


def test_a_model_whose_weights_cannot_be_read_starts_at_the_ceiling():
    def model(x, y=None):
        w = pyro.sample("w", pyro.distributions.Normal(0.0, 1.0))
        with pyro.plate("data", len(x)):
            pyro.sample("y", pyro.distributions.Normal(w * x, 1.0), obs=y)

    assert default_lr(model) == MAX_LR
    zeros = torch.nn.Linear(784, 400)
    torch.nn.init.zeros_(zeros.weight)
    assert default_lr(bbb.BNN(bbb.bayesianize(zeros), bbb.likelihoods.Gaussian(), 10)) == MAX_LR
