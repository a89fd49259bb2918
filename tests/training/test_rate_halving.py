"""fit's own rates (lr not given): set from each tensor's size, halved where they stop paying."""

from __future__ import annotations

import copy
import math
import warnings

import pyro
import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.training import rates
from pyro_bbb.training.auto_epochs import MAX_HALVINGS, AutoEpochs, budget_epochs
from pyro_bbb.training.convergence import ConvergenceWarning
from pyro_bbb.training.rates import (
    GROUP_SPREAD,
    MAX_LR,
    TensorRate,
    rate_groups,
    tensor_rates,
)
from pyro_bbb.training.scoring import IterateAverage
from pyro_bbb.training.stopping import DECAY_FLOOR, DECAY_SHARE, TOLERANCE, StopsPaying

from .test_auto_epochs import _record, _StopAt
from .test_default_length import _gap, _params, _starts

#: The tiny problem's start rate by fit's own rule: every tensor of a 1-8-8-1 tanh net is
#: at the ceiling (fan-in 1 and 8: a sixteenth of its size is above 0.01).
_START = MAX_LR


def _fit(monkeypatch, **options):
    """A default fit of a 1-8-8-1 net on 200 points, the rates left to fit's own rule."""
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


def _legacy(path):
    """Make ``path`` a checkpoint of the release before rates were recorded: no record."""
    from pyro_bbb.io import files

    payload = files.read_file(path, argument="path")
    for option in ("lr", "own_rate", "lr_schedule", "max_steps"):
        payload["options"].pop(option, None)
    payload.pop("halvings", None)
    files.write_atomic(path, files.CHECKPOINT, payload)


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_checkpoint_of_the_release_before_resumes_as_that_release_would(
    tmp_path, monkeypatch, halved, where
):
    # that release never halved its rate: a run resumed from its checkpoint by an unchanged
    # script (lr not given) does not start halving; one whose History shows a halving was
    # written by a version that halved, and goes on halving as it did
    whole, _, _ = halved
    first = _halvings(whole)[0]
    stop = first - 5 if where == "before" else first + 15
    path = tmp_path / "old.pt"
    _fit(monkeypatch, checkpoint=path, checkpoint_every=100, callbacks=[_StopAt(stop)])
    _legacy(path)
    resumed = _fit(monkeypatch, resume=path)
    if where == "before":
        assert _halvings(resumed) == [] and "halved" not in resumed.stopped
    else:
        assert _record(resumed) == _record(whole)


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
    monkeypatch.setattr(rates, "own_groups", lambda *args: pytest.fail("lr was given"))
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
    likelihood = bbb.likelihoods.Categorical() if sizes[-1] > 1 else bbb.likelihoods.Gaussian()
    return bbb.BNN(bbb.mlp(sizes), likelihood, num_data=10)


def _rates(model, guide=None, width=None):
    """``{param-store name: rate}`` of fit's own rule for a model and guide, set up."""
    pyro.clear_param_store()
    guide = bbb.MeanFieldGuide(model) if guide is None else guide
    categorical = isinstance(model.likelihood, bbb.likelihoods.Categorical)
    guide(torch.zeros(2, width), torch.zeros(2, dtype=torch.long if categorical else None))
    store = pyro.get_param_store()
    named = {name: store.get_param(name).unconstrained() for name in store}
    return {name: rate.rate for name, rate in tensor_rates(model, guide, named).items()}


def _size_rate(fan_in):
    """A sixteenth of the root mean square of torch's default U(+-1/sqrt(fan_in))."""
    return min(MAX_LR, 1 / (16 * math.sqrt(3 * fan_in)))


def test_each_layer_takes_a_sixteenth_of_its_size_never_above_the_largest_tensors():
    torch.manual_seed(0)
    rates = _rates(_net([784, 400, 400, 10]), width=784)
    for layer in ("0", "2", "4"):
        # the 400-wide layers' own size would give 1.8e-3; no layer moves faster than the
        # 400 x 784 matrix (measured: 14.1 % test error at 60,000 images, against 10.6 %)
        for kind in ("locs", "rhos"):
            for param in ("weight", "bias"):
                name = f"MeanFieldGuide.{kind}.{layer}.{param}"
                assert rates[name] == pytest.approx(_size_rate(784), rel=0.02), name
    # its own size where that is smaller: 20 inputs' layer of 300 units (the largest) and
    # its output layer of 300 inputs; a learned noise takes the network's
    rates = _rates(_net([20, 300, 1]), width=20)
    assert rates["MeanFieldGuide.locs.0.weight"] == pytest.approx(_size_rate(20), rel=0.02)
    assert rates["MeanFieldGuide.locs.2.weight"] == pytest.approx(_size_rate(300), rel=0.1)
    assert rates["MeanFieldGuide.locs.2.bias"] == rates["MeanFieldGuide.locs.2.weight"]
    assert rates["likelihood.scale"] == rates["MeanFieldGuide.locs.0.weight"]
    # a network of small fan-in keeps the ceiling
    assert _rates(_net([6, 50, 1]), width=6)["MeanFieldGuide.locs.0.weight"] == MAX_LR
    # trained weights of another size move the rate with them
    pretrained = torch.nn.Sequential(torch.nn.Linear(784, 400), torch.nn.ReLU(),
                                     torch.nn.Linear(400, 10))  # fmt: skip
    with torch.no_grad():
        pretrained[0].weight.mul_(0.1)
    scaled = bbb.BNN(bbb.bayesianize(pretrained), bbb.likelihoods.Categorical(), num_data=10)
    assert _rates(scaled, width=784)["MeanFieldGuide.locs.0.weight"] == pytest.approx(
        _size_rate(784) / 10, rel=0.05
    )


def test_an_embedding_sets_its_own_rate_alone():
    # a transformer whose 5,000-token embedding is N(0, 1): the embedding takes the
    # ceiling, every other tensor its own size's rate
    from ..support import user_networks

    torch.manual_seed(0)
    net = user_networks.TokenTransformer(vocab=5000, d_model=32)
    model = bbb.BNN(bbb.bayesianize(net), bbb.likelihoods.Categorical(), 10)
    pyro.clear_param_store()
    guide = bbb.MeanFieldGuide(model)
    guide(torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    store = pyro.get_param_store()
    named = {name: store.get_param(name).unconstrained() for name in store}
    rates = {n: r.rate for n, r in tensor_rates(model, guide, named).items()}
    assert rates["MeanFieldGuide.locs.embed.weight"] == MAX_LR
    for layer in ("encoder.linear1", "encoder.linear2", "head"):
        weight = store.get_param(f"MeanFieldGuide.locs.{layer}.weight")
        expected = float(weight.detach().pow(2).mean().sqrt()) / 16
        assert rates[f"MeanFieldGuide.locs.{layer}.weight"] == pytest.approx(expected)
        assert expected < MAX_LR / 1.5


@pytest.mark.parametrize(("rank", "init_scale"), [(1, 0.05), (10, 0.05), (4, 0.2)])
def test_a_low_rank_factor_moves_a_sixteenth_of_its_initial_size(rank, init_scale):
    # V starts at 0.5 sigma_0 / sqrt(rank) an entry (a quarter of the initial variance over
    # rank columns), far below its layer's weights; its means keep their layer's rate
    torch.manual_seed(0)
    model = _net([1, 50, 50, 1])
    rates = _rates(model, bbb.LowRankGuide(model, rank=rank, init_scale=init_scale), width=1)
    mean_field = _rates(model, width=1)
    for block in ("0", "2", "4"):
        own = 0.5 * init_scale / math.sqrt(rank) / 16
        means = rates[f"LowRankGuide.locs.{block}"]
        assert rates[f"LowRankGuide.factors_t.{block}"] == pytest.approx(min(own, means))
        assert rates[f"LowRankGuide.rhos.{block}"] == means
        # a block's means move as the mean-field guide's of its layer: capped by the largest
        assert means == pytest.approx(mean_field[f"MeanFieldGuide.locs.{block}.weight"], rel=0.01)
    assert rates["likelihood.scale"] == pytest.approx(mean_field["likelihood.scale"], rel=0.01)


def test_a_low_rank_guide_of_rank_ten_fits_as_well_as_the_mean_field_one():
    # at its layer's rate the factor moved by more than half its size a step and its
    # noise-driven walk outgrew the posterior: a beta = 1 loss of 1.67 nats a point against
    # mean-field's 0.93, the noise learned 0.75 (truth 0.2; mean-field 0.30); at its own
    # rate 0.96 and 0.32
    g = torch.Generator().manual_seed(0)
    x = torch.rand(200, 1, generator=g) * 6 - 3
    y = torch.sin(x[:, 0]) + 0.3 * x[:, 0] + 0.2 * torch.randn(200, generator=g)
    loss, noise = {}, {}
    for rank in (0, 10):
        pyro.clear_param_store()
        torch.manual_seed(0)
        net = bbb.mlp([1, 20, 20, 1], activation="tanh")
        model = bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=len(x))
        guide = bbb.LowRankGuide(model, rank=rank) if rank else bbb.MeanFieldGuide(model)
        history = bbb.fit(model, guide, x, y, epochs=1500, seed=0, progress=False)
        loss[rank] = sum(history.plain_loss[-50:]) / 50 / len(x)
        noise[rank] = float(model.likelihood.scale)
    assert loss[10] < loss[0] + 0.3  # 0.95 against 0.93 here; 1.67 at the layer's rate
    assert noise[10] < 1.5 * noise[0]  # 0.31 against 0.30 here; 0.75 at the layer's rate


def test_a_guide_that_starts_at_zero_reads_the_models_weights_and_zeros_the_ceiling():
    from pyro.infer.autoguide import AutoNormal

    torch.manual_seed(0)
    model = _net([784, 400, 10])
    rates = _rates(model, AutoNormal(model), width=784)
    assert rates["AutoNormal.locs.0.weight"] == pytest.approx(_size_rate(784), rel=0.02)
    # its scales (a positive constraint) take their site's means' rate, as ρ does
    assert rates["AutoNormal.scales.0.weight"] == rates["AutoNormal.locs.0.weight"]
    zeros = torch.nn.Linear(784, 400)
    torch.nn.init.zeros_(zeros.weight)
    model = bbb.BNN(bbb.bayesianize(zeros), bbb.likelihoods.Categorical(), 10)
    assert _rates(model, width=784)["MeanFieldGuide.locs.weight"] == MAX_LR


def test_fit_starts_each_tensor_at_its_rate_and_records_the_largest_tensors(monkeypatch):
    built = []
    make = rates.make_optimizer
    monkeypatch.setattr(rates, "make_optimizer", lambda *a, **k: built.append(make(*a, **k))
                        or built[-1])  # fmt: skip
    torch.manual_seed(0)
    x, y = torch.randn(40, 20), torch.randn(40)
    model = bbb.BNN(bbb.mlp([20, 300, 1]), bbb.likelihoods.Gaussian(), num_data=40)
    history = bbb.fit(model, bbb.MeanFieldGuide(model), x, y, epochs=2, progress=False)
    (optimizer,) = built
    sizes = [float(w.pow(2).mean().sqrt()) for w in (model.net[0].weight_init,
                                                     model.net[2].weight_init)]  # fmt: skip
    started = sorted(group["initial_lr"] for group in optimizer.param_groups)
    assert started == pytest.approx(sorted([sizes[0] / 16, sizes[1] / 16]))
    assert history.lr[0] == pytest.approx(sizes[0] / 16)  # the 300 x 20 weights'
    # the learned noise takes the network's rate: one group with the first layer's
    noise = pyro.get_param_store().get_param("likelihood.scale").unconstrained()
    (group,) = [g for g in optimizer.param_groups if any(p is noise for p in g["params"])]
    assert group["initial_lr"] == pytest.approx(sizes[0] / 16)


def test_rates_within_the_spread_share_one_group_at_the_largest_tensors():
    a, b, c = torch.zeros(100, 10), torch.zeros(10), torch.zeros(5, 5)
    named = {"a": a, "b": b, "c": c}
    given = {
        "a": TensorRate("a", "loc", 1e-3, ""),
        "b": TensorRate("b", "scale", 1.1e-3, ""),  # within 20 %: a's group, at a's rate
        "c": TensorRate("c", "loc", 5e-3, ""),
    }
    groups = rate_groups([c, a, b], named, given)
    assert [(len(g["params"]), g["lr"]) for g in groups] == [(2, 1e-3), (1, 5e-3)]
    assert groups[0]["params"][0] is a and GROUP_SPREAD == 1.2


def test_an_optimiser_whose_step_the_rate_does_not_bound_needs_lr():
    # SGD's step is the rate times a gradient summed over every point: an Adam-sized rate
    # made it diverge (inf at epoch 68 on the gap problem); fit no longer chooses one
    data, model, guide = _gap()
    with pytest.raises(ValueError, match=r"optimizer=SGD needs lr=: fit chooses rates only"):
        bbb.fit(model, guide, data.x, data.y, optimizer=torch.optim.SGD, progress=False)
    history = bbb.fit(model, guide, data.x, data.y, optimizer=torch.optim.SGD, lr=1e-5,
                      epochs=2, progress=False)  # fmt: skip
    assert history.lr[0] == 1e-5
    for bounded in (torch.optim.AdamW, torch.optim.RMSprop):  # fit's rates hold for these
        bbb.fit(model, guide, data.x, data.y, optimizer=bounded, epochs=1, progress=False)
