"""Tests of pyro_bbb.nn.draws.per_draw: weight draws go around a network's forward, not through it.

The networks are written as users write them, for activations ``(batch, ...)``
(``examples/user_networks.py``). Each must fit at the defaults, predict and train as an
ensemble, and every draw of the predictive must be what the plain network computes with
that draw's weights.
"""

from __future__ import annotations

import copy
import pickle
from types import SimpleNamespace

import pyro
import pyro.poutine as poutine
import pytest
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule
from torch import nn
from torch.func import functional_call

import pyro_bbb as bbb
from pyro_bbb.nn import bayesianize
from pyro_bbb.nn.draws import (
    DrawPath,
    PerDrawPath,
    describe_draws,
    draw_path,
    is_vmap_limitation,
    per_draw_forward,
)
from pyro_bbb.priors import Gaussian

from ...support import user_networks

ConvView, Recurrent = user_networks.ConvView, user_networks.Recurrent
ResNet, TokenTransformer = user_networks.ResNet, user_networks.TokenTransformer

S = 4  # predictive draws compared with the plain network


def _regression(rows, *shape):
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, *shape, generator=g), torch.randn(rows, generator=g)


def _classification(rows, classes, *shape, tokens=None):
    g = torch.Generator().manual_seed(1)
    if tokens is not None:
        x = torch.randint(0, tokens, (rows, *shape), generator=g)
    else:
        x = torch.randn(rows, *shape, generator=g)
    return x, torch.randint(0, classes, (rows,), generator=g)


#: name -> (plain network, data (x, y), likelihood, its draw path in training mode)
CASES = {
    "resnet": (
        lambda: ResNet(),
        lambda: _classification(32, 10, 3, 16, 16),
        lambda: bbb.likelihoods.Categorical(10),
        DrawPath.LOOP,  # BatchNorm updates its running statistics in training mode
    ),
    "lstm": (
        lambda: Recurrent(nn.LSTM),
        lambda: _regression(32, 6, 3),
        lambda: bbb.likelihoods.Gaussian(),
        DrawPath.LOOP,
    ),
    "gru": (
        lambda: Recurrent(nn.GRU),
        lambda: _regression(32, 6, 3),
        lambda: bbb.likelihoods.Gaussian(),
        DrawPath.LOOP,
    ),
    "conv_view": (
        lambda: ConvView(),
        lambda: _classification(32, 3, 1, 8, 8),
        lambda: bbb.likelihoods.Categorical(3),
        DrawPath.VMAP,
    ),
    "transformer": (
        lambda: TokenTransformer(),
        lambda: _classification(32, 3, 5, tokens=20),
        lambda: bbb.likelihoods.Categorical(3),
        DrawPath.VMAP,
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def fitted(request):
    """A network of each kind fitted at the defaults (two epochs, to stay quick)."""
    make, data, likelihood, path = CASES[request.param]
    pyro.clear_param_store()
    torch.manual_seed(0)
    plain = make()
    x, y = data()
    model = bbb.BNN(bayesianize(plain, Gaussian(1.0)), likelihood(), num_data=len(x))
    guide = bbb.MeanFieldGuide(model)
    history = bbb.fit(model, guide, x, y, epochs=2, progress=False, seed=0)
    return SimpleNamespace(
        plain=plain, model=model, guide=guide, x=x, y=y, history=history, path=path
    )


@pytest.mark.filterwarnings("ignore::pyro_bbb.infer.predictive.TrainingModeWarning")
def test_fit_predict_and_an_ensemble_run_on_networks_written_for_batches(fitted):
    model, guide, x, y = fitted.model, fitted.guide, fitted.x, fitted.y
    assert all(torch.isfinite(torch.tensor(fitted.history.loss)))
    assert draw_path(model.net).path is fitted.path
    assert fitted.history.draws == describe_draws(model.net)
    pred = bbb.predict(model, guide, x[:8], num_samples=5, seed=0)
    assert pred.samples.shape[:2] == (5, 8)
    ensemble = bbb.Ensemble(model, bbb.MeanFieldGuide, k=2)
    bbb.fit(model, ensemble, x, y, epochs=1, progress=False, seed=0)
    pred = bbb.predict(model, ensemble, x[:8], num_samples=3, seed=0)
    assert pred.samples.shape[:2] == (6, 8)


@pytest.mark.filterwarnings("ignore::pyro_bbb.infer.predictive.TrainingModeWarning")
def test_each_predictive_draw_is_the_plain_network_called_with_that_draw(fitted):
    model, guide, x = fitted.model, fitted.guide, fitted.x[:8]
    pred = bbb.predict(model, guide, x, num_samples=S, seed=3)
    # predict draws the guide first, S times in one plate: the same draws again
    pyro.set_rng_seed(3)
    with torch.no_grad():
        trace = poutine.trace(pyro.plate("draws", S, dim=-2)(guide)).get_trace(x)
    draws = {site: trace.nodes[site]["value"] for site in guide.median()}
    reference = copy.deepcopy(fitted.plain).train(model.net.training)
    with torch.no_grad():
        outputs = torch.stack(
            [
                functional_call(
                    reference, {n: d[s].reshape(d.shape[2:]) for n, d in draws.items()}, (x,)
                )
                for s in range(S)
            ]
        )
    if model.likelihood.task == "regression":
        torch.testing.assert_close(pred.loc_samples, outputs.squeeze(-1), rtol=1e-4, atol=1e-5)
    else:
        torch.testing.assert_close(
            torch.log_softmax(pred.logits_samples, -1),
            torch.log_softmax(outputs, -1),
            rtol=1e-4,
            atol=1e-5,
        )


class TwoLayers(nn.Module):
    """Linear layers under a forward of one's own (so it runs once per draw)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 8), nn.Linear(8, 1)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        return self.fc2(h.view(h.size(0), -1))


@pytest.mark.parametrize("reparam", ["local", "flipout"])
def test_estimators_run_per_draw_with_independent_noise_and_the_marginals_of_weight_sampling(
    reparam,
):
    # Both estimators keep each point's predictive marginal of weight sampling on Linear
    # layers; in a per-draw pass each draw must get its own noise (vmap's randomness).
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, _ = _regression(6, 3)
    model = bbb.BNN(bayesianize(TwoLayers()), bbb.likelihoods.Gaussian(), num_data=16)
    guide = bbb.MeanFieldGuide(model, init_scale=0.3)
    guide(x)
    estimated = bbb.predict(model, guide, x, num_samples=4000, reparam=reparam, seed=0)
    sampled = bbb.predict(model, guide, x, num_samples=4000, seed=1)
    assert draw_path(model.net).path is DrawPath.VMAP
    assert estimated.loc_samples.std(0).min() > 0.05  # not one noise draw for all
    # 4000 draws: the standard error of a mean is 1.6 % of the sd, of an sd about 1.1 %
    sd = sampled.loc_samples.std(0)
    assert ((estimated.loc_samples.mean(0) - sampled.loc_samples.mean(0)).abs() < 0.08 * sd).all()
    torch.testing.assert_close(estimated.loc_samples.std(0), sd, rtol=0.06, atol=0.0)


def test_the_path_is_decided_per_training_mode_and_a_network_of_ones_own_error_surfaces():
    net = bayesianize(ResNet(width=4))
    model = bbb.BNN(net, bbb.likelihoods.Categorical(10), num_data=8)
    x = torch.randn(4, 3, 16, 16)
    with pyro.plate("draws", 2, dim=-2):
        model(x)
    known = draw_path(net)
    assert known.path is DrawPath.LOOP and "BatchNorm2d" in known.reason
    assert "one draw after another" in describe_draws(net)
    net.eval()
    with pyro.plate("draws", 2, dim=-2):
        model(x)
    assert draw_path(net).path is DrawPath.VMAP

    class WrongReshape(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 2)

        def forward(self, x):
            return self.fc(x.reshape(x.shape[0], 4))  # a bug of the network's own

    bad = bbb.BNN(bayesianize(WrongReshape()), bbb.likelihoods.Categorical(2), num_data=8)
    with pytest.raises(RuntimeError, match="shape") as caught, pyro.plate("d", 3, dim=-2):
        bad(torch.randn(4, 6))
    assert not is_vmap_limitation(caught.value)
    assert draw_path(bad.net) is None  # an error of its own decides nothing


def test_a_network_called_directly_in_a_pyro_model_runs_per_draw_and_pickles():
    plain = ConvView()
    net = bayesianize(plain)
    x = torch.randn(5, 1, 8, 8)
    draws = {name: torch.randn(3, *p.shape) for name, p in plain.named_parameters()}
    out = poutine.condition(net, data=draws)(x)
    loop = torch.stack(
        [functional_call(plain, {n: w[k] for n, w in draws.items()}, (x,)) for k in range(3)]
    )
    torch.testing.assert_close(out, loop)
    for other in (pickle.loads(pickle.dumps(net)), copy.deepcopy(net)):
        assert per_draw_forward(other).module is other
        torch.testing.assert_close(poutine.condition(other, data=draws)(x), loop)
    # a failing draw leaves the run's values as drawn: a later call is unaffected
    with pytest.raises(RuntimeError):
        poutine.condition(net, data={**draws, "fc.weight": torch.randn(3, 3, 7)})(x)
    torch.testing.assert_close(poutine.condition(net, data=draws)(x), loop)


@pytest.mark.filterwarnings("ignore::pyro_bbb.infer.predictive.TrainingModeWarning")
def test_set_up_and_checks_never_run_a_network_on_one_row():
    # BatchNorm after pooling to 1x1 raises on a single row in training mode
    plain = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.AdaptiveAvgPool2d(1),
        nn.BatchNorm2d(4),
        nn.Flatten(),
        nn.Linear(4, 2),
    )
    x, y = _classification(12, 2, 3, 6, 6)
    model = bbb.BNN(bayesianize(plain), bbb.likelihoods.Categorical(2), num_data=12)
    norm = model.net[2].module  # the BatchNorm2d, wrapped to draw its weight and bias
    before = norm.running_mean.clone()
    guide = bbb.MeanFieldGuide(model)
    bbb.fit(model, guide, x, y, epochs=1, batch_size=6, num_particles=2, progress=False)
    assert bbb.predict(model, guide, x, num_samples=3).probs.shape == (12, 2)
    # the running statistics moved with the training steps only
    assert not torch.equal(norm.running_mean, before)
    assert "BatchNorm2d" in repr(model)  # a wrapped module prints


def test_a_moved_recurrent_network_runs_on_its_draws_not_on_weights_it_cached():
    # .to() makes nn.LSTM / nn.GRU re-read the weights they cache; they must keep taking the
    # drawn ones, which the wrapper hands over by setattr
    plain = Recurrent(nn.GRU).double()
    net = bayesianize(plain).to(torch.float64)
    x = torch.randn(5, 4, 3, dtype=torch.float64)
    draws = {
        name: torch.randn(3, *p.shape, dtype=torch.float64) for name, p in plain.named_parameters()
    }
    out = poutine.condition(net, data=draws)(x)
    loop = torch.stack(
        [functional_call(plain, {n: w[k] for n, w in draws.items()}, (x,)) for k in range(3)]
    )
    torch.testing.assert_close(out, loop)
    assert "GRU(3, 8, batch_first=True)" in repr(net)


# ----------------------------------------------------------------------------- beyond the five
class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.mix = nn.Linear(6, 6)

    def forward(self, t):
        h = torch.tanh(self.mix(self.embed(t).mean(1)))
        return F.linear(h, self.embed.weight)  # weight tying


class Skip(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv1d(2, 3, 3, padding="same")
        self.g = nn.GroupNorm(1, 5)
        self.head = nn.Linear(5 * 8, 2)

    def forward(self, x):
        h = torch.cat([x, torch.relu(self.a(x))], dim=1)
        return self.head(self.g(h).flatten(1))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(4, 2, batch_first=True)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        h, _ = self.att(x, x, x)
        return self.out(h.mean(dim=1))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:  # data-dependent branch: vmap has no rule
            return h
        return -h


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.scale = nn.Parameter(torch.ones(2))

    def forward(self, x):
        return self.fc(x) * self.scale + x[:, :2]


@pytest.mark.parametrize(
    "make, x, path",
    [
        (Tied, torch.randint(0, 10, (5, 4)), DrawPath.VMAP),  # an embedding's weight reused
        (Skip, torch.randn(5, 2, 8), DrawPath.VMAP),  # torch.cat skip, GroupNorm, flatten(1)
        (Attention, torch.randn(5, 6, 4), DrawPath.VMAP),  # nn.MultiheadAttention itself
        (Branchy, torch.randn(5, 3), DrawPath.LOOP),  # a data-dependent branch
        (TwoInputs, torch.randn(5, 3), DrawPath.VMAP),  # a parameter of its own, and x again
    ],
    ids=["weight_tying", "skip_groupnorm", "attention", "branch", "parameter_beside"],
)
def test_networks_beyond_the_five_run_each_draw_as_the_plain_network(make, x, path):
    plain = make()
    net = bayesianize(plain)
    draws = {n: p.detach() + 0.3 * torch.randn(3, *p.shape) for n, p in plain.named_parameters()}
    out = poutine.condition(net, data=draws)(x)
    loop = torch.stack(
        [functional_call(plain, {n: w[k] for n, w in draws.items()}, (x,)) for k in range(3)]
    )
    torch.testing.assert_close(out, loop)
    assert draw_path(net).path is path


# ----------------------------------------------------------------------------- outputs, backward
class Outputs(nn.Module):
    """A network returning a tensor beside ``None``, a number and a dict, as some do.

    ``path``: ``"vmap"`` (a convolution), ``"loop"`` (BatchNorm updating its statistics,
    which vmap cannot batch), ``"broadcast"`` (Linear layers and a Pyro statement of its own:
    its draws flow through the activations).
    """

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        if path == "broadcast":
            self.body = nn.Linear(3, 4)
        else:
            self.body = nn.Sequential(
                nn.Unflatten(1, (1, 3)),
                nn.Conv1d(1, 2, 3, padding=1),
                nn.BatchNorm1d(2, affine=False) if path == "loop" else nn.Identity(),
                nn.Flatten(1),
                nn.Linear(6, 4),
            )
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        hidden = torch.tanh(self.body(x))
        if self.path == "broadcast":
            pyro.deterministic("hidden", hidden)
        return self.head(hidden).squeeze(-1), None, {"count": 3, "hidden": hidden}


class OutputsModel(PyroModule):
    """A Pyro model of one's own around such a network: a BNN reads one tensor."""

    max_plate_nesting = 1

    def __init__(self, net, num_data: int) -> None:
        super().__init__()
        self.net, self.num_data = net, num_data

    def forward(self, x, y=None):
        mean, nothing, extra = self.net(x)
        assert nothing is None and extra["count"] == 3
        assert extra["hidden"].shape[:-1] == mean.shape  # the draws' dims on every tensor
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", pyro.distributions.Normal(mean, 0.5), obs=y)


PATHS = {"vmap": DrawPath.VMAP, "loop": DrawPath.LOOP, "broadcast": DrawPath.BROADCAST}


@pytest.mark.filterwarnings("ignore::pyro_bbb.infer.predictive.TrainingModeWarning")
@pytest.mark.filterwarnings("ignore:each step's weight draws run through the network one after")
@pytest.mark.parametrize("path", list(PATHS))
def test_outputs_with_none_and_other_leaves_run_on_every_path(path):
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = _regression(12, 3)
    plain = Outputs(path)
    net = bayesianize(plain)
    model = OutputsModel(net, num_data=12)
    guide = bbb.MeanFieldGuide(model)
    history = bbb.fit(model, guide, x, y, epochs=2, num_particles=2, progress=False, seed=0)
    assert all(torch.isfinite(torch.tensor(history.loss)))
    assert draw_path(net).path is PATHS[path]
    assert bbb.predict(model, guide, x, num_samples=3).samples.shape == (3, 12)
    ensemble = bbb.Ensemble(model, bbb.MeanFieldGuide, k=2)
    bbb.fit(model, ensemble, x, y, epochs=1, progress=False, seed=0)
    assert bbb.predict(model, ensemble, x, num_samples=2).samples.shape == (4, 12)
    if path != "broadcast":  # each draw is the plain network's, leaves as it returns them
        plain = Outputs(path)
        draws = {
            n: p.detach() + 0.3 * torch.randn(3, *p.shape) for n, p in plain.named_parameters()
        }
        out = poutine.condition(bayesianize(plain), data=draws)(x)
        assert out[1] is None and out[2]["count"] == 3
        for k in range(3):
            mean, _, extra = functional_call(plain, {n: w[k] for n, w in draws.items()}, (x,))
            torch.testing.assert_close(out[0][k], mean)
            torch.testing.assert_close(out[2]["hidden"][k], extra["hidden"])


def test_a_bnn_says_when_its_network_returns_more_than_a_tensor():
    model = bbb.BNN(bayesianize(Outputs("vmap")), bbb.likelihoods.Gaussian(), num_data=12)
    x, y = _regression(12, 3)
    with pytest.raises(TypeError, match="the network returned a tuple, but a BNN's likelihood"):
        bbb.fit(model, bbb.MeanFieldGuide(model), x, y, epochs=1, progress=False)


class _BranchingBackward(torch.autograd.Function):
    """The identity whose backward branches on the gradient: vmap batches its forward only."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad if bool(grad.abs().max() < 1e6) else grad.clamp(-1e6, 1e6)


class BackwardBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 2, 3, padding=1)
        self.fc = nn.Linear(6, 1)

    def forward(self, x):
        h = torch.relu(self.conv(x.unsqueeze(1))).flatten(1)
        return self.fc(_BranchingBackward.apply(h))


def _backward_branch():
    """A BNN of :class:`BackwardBranch`, its guide and data."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = _regression(12, 3)
    model = bbb.BNN(bayesianize(BackwardBranch()), bbb.likelihoods.Gaussian(), num_data=12)
    return model, bbb.MeanFieldGuide(model), x, y


@pytest.mark.filterwarnings("ignore:each step's weight draws run through the network one after")
def test_a_backward_pass_vmap_cannot_batch_is_found_at_set_up_and_takes_the_loop():
    model, guide, x, y = _backward_branch()
    history = bbb.fit(model, guide, x, y, epochs=2, num_particles=2, progress=False, seed=0)
    assert all(torch.isfinite(torch.tensor(history.loss)))
    known = draw_path(model.net)
    assert known.path is DrawPath.LOOP and "the network's backward pass" in known.reason
    assert "data-dependent control flow" in known.reason


def test_a_path_decided_without_gradients_is_checked_again_with_them():
    model, guide, x, y = _backward_branch()
    with torch.no_grad(), pyro.plate("draws", 2, dim=-2):
        model(x)  # a prediction first: vmap's forward passes
    assert draw_path(model.net) == PerDrawPath(DrawPath.VMAP, backward=False)
    elbo = bbb.infer.AnnealedELBO(1.0, num_particles=2)
    elbo.terms(model, guide, x, y).loss.backward()  # the first step: checked, and looped
    assert draw_path(model.net).path is DrawPath.LOOP
    assert all(p.grad is not None for p in guide.parameters())
