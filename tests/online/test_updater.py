"""What every updater does: check its inputs, start where it is told, show a current belief."""

from __future__ import annotations

import pytest
import torch
from pyro.infer.autoguide import AutoNormal

import pyro_bbb as bbb
from pyro_bbb.online import RVGA, LoFi

from ..problems import conjugate_problem, linear_bnn


@pytest.fixture
def stream():
    x, y, *_ = conjugate_problem(num_data=30)
    return x, y, linear_bnn(x)


@pytest.mark.parametrize("make", [LoFi, RVGA], ids=["lofi", "rvga"])
def test_the_guide_is_the_belief_after_every_update(stream, make):
    x, y, model = stream
    updater = make(model)
    guide = updater.guide
    for start in range(0, 30, 10):
        updater.update(x[start : start + 10], y[start : start + 10])
        fn = guide.distribution()
        torch.testing.assert_close(fn.loc, updater.state.mean)
        if make is RVGA:
            root = updater.state.covariance_root
            torch.testing.assert_close(fn.covariance_matrix, root @ root.T)
        else:
            torch.testing.assert_close(fn.precision_factor, updater.state.precision_factor)
    assert updater.num_seen == 30 and updater.num_updates == 3


def test_before_any_update_the_guide_predicts_from_the_prior(stream):
    x, _, model = stream
    updater = LoFi(model, rank=2)
    prediction = bbb.predict(model, updater.guide, x, num_samples=10)
    assert prediction.mean.shape == (30,)
    torch.testing.assert_close(updater.guide.precision_diag, torch.ones(4, dtype=torch.float64))


def test_update_returns_the_updater_so_updates_chain(stream):
    x, y, model = stream
    updater = LoFi(model, rank=2)
    assert updater.update(x[:3], y[:3]).update(x[3:5], y[3:5]) is updater


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (torch.zeros(3, 3), torch.zeros(3).double(), "dtype torch.float32"),
        (torch.zeros(3).double(), torch.zeros(3).double(), r"\(batch, \*features\)"),
        (torch.zeros(3, 3).double(), torch.zeros(2).double(), "same number of rows"),
        (torch.full((3, 3), float("nan")).double(), torch.zeros(3).double(), "NaN"),
        (torch.zeros(3, 3).double(), torch.zeros(3, 2).double(), "shape"),
        (torch.zeros(3, 3).double(), [0.0, 1.0, 2.0], "torch.Tensor"),
    ],
)
def test_bad_minibatches_are_refused_naming_the_argument(stream, x, y, message):
    _, _, model = stream
    updater = LoFi(model, rank=2)
    with pytest.raises((ValueError, TypeError), match=message):
        updater.update(x, y)


def test_labels_outside_the_classes_are_refused():
    model = bbb.BNN(bbb.mlp([2, 3]), bbb.likelihoods.Categorical(), num_data=10)
    updater = LoFi(model, rank=2)
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        updater.update(torch.zeros(2, 2), torch.tensor([0, 5]))


def test_what_cannot_start_an_updater_is_refused(stream):
    x, _, model = stream
    with pytest.raises(TypeError, match=r"pyro_bbb\.BNN"):
        LoFi(lambda x, y=None: None)
    with pytest.raises(TypeError, match="AutoNormal"):
        LoFi(model, AutoNormal(model))
    with pytest.raises(ValueError, match="no parameters yet"):
        LoFi(model, bbb.MeanFieldGuide(model))
    other = linear_bnn(x)
    with pytest.raises(ValueError, match="another model"):
        LoFi(model, bbb.LowRankPrecisionGuide(other, rank=10))
    with pytest.raises(ValueError, match="rank"):
        LoFi(model, rank=-1)


def test_a_heteroscedastic_likelihood_is_refused():
    model = bbb.BNN(bbb.mlp([2, 2]), bbb.likelihoods.Gaussian(heteroscedastic=True), num_data=10)
    with pytest.raises(NotImplementedError, match="heteroscedastic"):
        LoFi(model)


def test_a_diverging_step_is_refused_and_leaves_the_belief_as_it_was():
    # the digits stream under an N(0, 1) prior overshoots to NaN after 33 minibatches (a
    # 64-100-10 network, docs/online.md); here a target beyond float64's range does it at once
    model = bbb.BNN(bbb.mlp([1, 1]).double(), bbb.likelihoods.Gaussian(1e-30).double(), 10)
    updater = LoFi(model, rank=1)
    updater.update(torch.ones(1, 1).double(), torch.ones(1).double())
    before = updater.state
    with pytest.raises(FloatingPointError, match=r"update 2 .*FanInGaussian"):
        updater.update(torch.ones(1, 1).double(), torch.tensor([1e300], dtype=torch.float64))
    assert updater.state is before and updater.num_updates == 1


@pytest.mark.parametrize("make", [LoFi, RVGA], ids=["lofi", "rvga"])
def test_a_learned_noise_that_would_overflow_is_refused_and_leaves_everything_as_it_was(make):
    # targets of 1e30 are finite in float32 but their squares are not: the noise estimate
    # would become inf, and the next ordinary minibatch would fail far from the cause
    g = torch.Generator().manual_seed(0)
    net = bbb.mlp([1, 8, 1], activation="tanh", prior=bbb.priors.FanInGaussian(2.0))
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=30)
    x = torch.randn(30, 1, generator=g)
    y = torch.sin(x[:, 0])
    updater = make(model)
    updater.update(x[:10], y[:10])
    before, scale = updater.state, updater.noise_scale.clone()
    message = r"update 2 .*squared one-step-ahead errors.*inf.*1e\+30.*standardise"
    with pytest.raises(FloatingPointError, match=message):
        updater.update(x[10:20], torch.full((10,), 1e30))
    assert updater.state is before and updater.num_updates == 1
    torch.testing.assert_close(updater.noise_scale, scale)
    updater.update(x[20:], y[20:])  # the stream goes on
    assert bool(torch.isfinite(updater.noise_scale)) and updater.num_updates == 2


@pytest.mark.parametrize("make", [LoFi, RVGA], ids=["lofi", "rvga"])
def test_a_network_in_training_mode_is_refused_naming_the_module(make):
    x, y, *_ = conjugate_problem(num_data=10)
    net = bbb.mlp([3, 4, 1], activation="tanh", dropout=0.3).double()
    model = bbb.BNN(net, bbb.likelihoods.Gaussian(0.5).double(), num_data=10)
    updater = make(model)
    with pytest.raises(ValueError, match=r"evaluation mode.*'net.2' \(Dropout\).*model.eval\(\)"):
        updater.update(x, y)
    model.eval()
    updater.update(x, y)
    assert updater.num_updates == 1
