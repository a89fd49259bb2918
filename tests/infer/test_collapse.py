"""Tests of pyro_bbb.infer.collapse: per-weight KL, the neighbour reference, the warning."""

from __future__ import annotations

import math
import warnings

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoDelta, AutoNormal

import pyro_bbb as bbb
from pyro_bbb.infer.collapse import (
    KL_THRESHOLD,
    CollapseDiagnosis,
    CollapseMonitor,
    diagnose_collapse,
    neighbour_residual,
    weight_kl,
)
from pyro_bbb.priors import ScaleMixture

from ..support import scaled


def _model(sizes=(1, 8, 1), n=40, prior=None, activation="tanh"):
    net = bbb.mlp(list(sizes), activation=activation, prior=prior)
    return bbb.BNN(net, bbb.likelihoods.Gaussian(), num_data=n)


def _sine(n=40, seed=0, noise=0.1, low=1.0, high=4.0):
    g = torch.Generator().manual_seed(seed)
    x = low + (high - low) * torch.rand(n, 1, generator=g)
    x[: n // 2] *= -1
    return x, torch.sin(x[:, 0]) + noise * torch.randn(n, generator=g)


def _set_marginals(guide, loc, scale):
    """Put every weight of a mean-field guide at N(loc, scale²)."""
    store = pyro.get_param_store()
    rho = math.log(math.expm1(scale - guide.min_scale))
    with torch.no_grad():
        for name, value in store.named_parameters():
            if ".locs." in name:
                value.fill_(loc)
            elif ".rhos." in name:
                value.fill_(rho)


def _at_prior(**guide_options):
    """80 sine points, a 1-50-50-1 net, and a mean-field guide with every weight at N(0, 1)."""
    x, y = _sine(n=80)
    model = _model(sizes=(1, 50, 50, 1), n=80)
    guide = bbb.MeanFieldGuide(model, **guide_options)
    guide(x, y)
    _set_marginals(guide, 0.0, 1.0)
    return x, y, model, guide


# --- weight_kl ---------------------------------------------------------------------------------


def test_weight_kl_is_the_closed_form_kl_of_every_marginal_to_a_gaussian_prior():
    x, _ = _sine()
    model = _model(prior=bbb.priors.Gaussian(0.7))
    guide = bbb.MeanFieldGuide(model, init_scale=0.3)
    guide(x)
    kls = weight_kl(model, guide, x)
    assert set(kls) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    for name, (loc, scale) in guide.marginals().items():
        expected = torch.distributions.kl_divergence(
            torch.distributions.Normal(loc, scale), torch.distributions.Normal(0.0, 0.7)
        )
        torch.testing.assert_close(kls[name], expected)


def test_weight_kl_is_zero_for_weights_at_their_prior():
    x, _ = _sine()
    model = _model()
    guide = bbb.MeanFieldGuide(model)
    guide(x)
    _set_marginals(guide, 0.0, 1.0)
    kls = torch.cat([k.reshape(-1) for k in weight_kl(model, guide, x).values()])
    assert kls.abs().max() < 1e-5
    assert CollapseMonitor(model, guide, x).fraction() == 1.0


def test_weight_kl_estimates_a_scale_mixture_prior_by_monte_carlo():
    x, _ = _sine()
    prior = ScaleMixture(pi=0.5, sigma1=1.0, sigma2=0.1)
    model = _model(prior=prior)
    guide = bbb.MeanFieldGuide(model, init_scale=0.2)
    guide(x)
    pyro.set_rng_seed(1)
    kls = weight_kl(model, guide, x)
    estimate, exact = [], []
    for name, (loc, scale) in guide.marginals().items():
        q = torch.distributions.Normal(loc, scale)
        draws = q.sample((20000,))
        exact.append((q.log_prob(draws) - prior.log_prob(draws)).mean(0).reshape(-1))
        estimate.append(kls[name].reshape(-1))
    estimate, exact = torch.cat(estimate), torch.cat(exact)
    # 16 draws per weight: unbiased, with a standard error of about 0.2 nats per weight
    assert (estimate.mean() - exact.mean()).abs() < 0.1
    assert (estimate - exact).abs().max() < 1.0


def test_weight_kl_reads_autonormal_and_gives_none_for_a_point_estimate():
    x, y = _sine()
    model = _model()
    normal = AutoNormal(model)
    normal(x, y)
    assert set(weight_kl(model, normal, x)) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    delta = AutoDelta(model)
    delta(x, y)
    assert weight_kl(model, delta, x) is None
    assert math.isnan(CollapseMonitor(model, delta, x).fraction())


def test_the_monitor_flat_path_agrees_with_the_per_site_kl():
    x, _ = _sine()
    model = _model(sizes=(1, 16, 16, 1))
    guide = bbb.LowRankGuide(model, rank=2, init_scale=0.5)
    guide(x)
    kls = torch.cat([k.reshape(-1) for k in weight_kl(model, guide, x).values()])
    expected = (kls < KL_THRESHOLD).double().mean().item()
    assert CollapseMonitor(model, guide, x).fraction() == pytest.approx(expected)


# --- the model-free reference --------------------------------------------------------------------


def test_neighbour_residual_estimates_the_noise_of_a_smooth_function():
    x, y = _sine(n=600, noise=0.2)
    # leave-one-out 5-NN: noise² (1 + 1/5) plus a small bias from the curvature
    assert neighbour_residual(x, y) == pytest.approx(0.2 * math.sqrt(1.2), rel=0.15)


def test_neighbour_residual_of_labels_is_the_leave_one_out_error_rate():
    x = torch.tensor([[0.0], [0.1], [0.2], [5.0], [5.1], [5.2], [0.15]])
    labels = torch.tensor([0, 0, 0, 1, 1, 1, 1])  # the last point sits among the zeros
    assert neighbour_residual(x, labels, k=3) == pytest.approx(1 / 7)


# --- the diagnosis and the warning ---------------------------------------------------------------


def test_a_posterior_at_its_prior_on_data_with_structure_is_diagnosed_as_collapsed():
    x, y, model, guide = _at_prior()
    diagnosis = diagnose_collapse(model, guide, x, y)
    assert diagnosis.collapsed_fraction == 1.0
    assert diagnosis.reference < 0.2 < 0.5 * diagnosis.baseline < diagnosis.residual
    assert diagnosis.collapsed
    message = diagnosis.message()
    assert "100% of the weights" in message and "learned noise std" in message
    assert "beta=" in message and "smaller network" in message and "run_nuts" in message


@pytest.mark.parametrize(
    ("fraction", "residual", "reference", "baseline", "collapsed"),
    [
        (0.97, 0.70, 0.15, 0.73, True),  # 80 points, 1-50-50-1 tanh: at the prior
        (0.78, 0.75, 0.85, 1.00, False),  # UCI wine: noisy targets, nothing to miss
        (0.77, 0.27, 0.50, 1.00, False),  # UCI boston: many pruned units, a good fit
        (0.97, 0.11, 0.11, 0.76, False),  # a fit whose units are mostly pruned
        (0.30, 0.70, 0.15, 0.73, False),  # most weights away from the prior
    ],
)
def test_collapse_needs_weights_at_the_prior_and_structure_left_unexplained(
    fraction, residual, reference, baseline, collapsed
):
    diagnosis = CollapseDiagnosis(fraction, residual, reference, baseline, noise=residual)
    assert diagnosis.collapsed is collapsed


def test_fit_warns_when_it_ends_at_the_prior_and_records_the_fraction_per_epoch():
    x, y, model, guide = _at_prior(init_scale=1.0)
    with pytest.warns(bbb.PosteriorCollapseWarning, match=r"posterior collapse: \d+% of"):
        history = bbb.fit(model, guide, x, y, epochs=3, lr=1e-4, progress=False)
    assert len(history.collapsed) == 3 and all(f > 0.9 for f in history.collapsed)
    assert issubclass(bbb.PosteriorCollapseWarning, UserWarning)


def test_a_fitted_posterior_gives_no_warning():
    x, y = _sine(n=80)
    model = _model(sizes=(1, 20, 1), n=80)
    guide = bbb.MeanFieldGuide(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", bbb.PosteriorCollapseWarning)
        history = bbb.fit(model, guide, x, y, epochs=400, lr=2e-2, seed=0, progress=False)
    assert 0 <= history.collapsed[-1] <= 1


@pytest.mark.slow
def test_eighty_points_on_a_wide_tanh_net_collapse_and_fit_says_so():
    # The mean-field ELBO's optimum is the prior here, under fit's default schedule as under
    # every other measured (docs/small_data.md): the noise explains the targets. At the rate
    # those measurements took (0.01; fit's own for this net is half of it, which reaches the
    # optimum in more epochs than this test spends)
    x, y = _sine(n=80)
    model = _model(sizes=(1, 50, 50, 1), n=80)
    guide = bbb.MeanFieldGuide(model)
    with pytest.warns(bbb.PosteriorCollapseWarning, match="posterior collapse"):
        history = bbb.fit(
            model, guide, x, y, epochs=scaled(1500, 3000), lr=0.01, seed=0, progress=False
        )
    assert history.collapsed[-1] > 0.9


def test_eighty_points_on_a_wide_tanh_net_collapse_at_fits_defaults_and_fit_says_so():
    # the same problem with nothing but the data: fit's own length and rates reach the
    # prior as well (measured 86-88 % of the weights at seeds 0-2, 1,715 epochs, 2-3 s)
    x, y = _sine(n=80)
    model = _model(sizes=(1, 50, 50, 1), n=80)
    guide = bbb.MeanFieldGuide(model)
    with pytest.warns(bbb.PosteriorCollapseWarning, match="posterior collapse"):
        history = bbb.fit(model, guide, x, y, seed=0, progress=False)
    assert history.collapsed[-1] > 0.8


def test_the_diagnosis_leaves_every_random_state_as_it_was():
    import random

    import numpy as np

    x, y, model, guide = _at_prior()
    pyro.set_rng_seed(5)
    expected = (torch.rand(3), random.random(), np.random.rand())
    pyro.set_rng_seed(5)
    assert diagnose_collapse(model, guide, x, y).collapsed
    assert weight_kl(model, guide, x) is not None
    after = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(after[0], expected[0]) and after[1:] == expected[1:]


def test_the_diagnosis_leaves_a_batch_norms_statistics_and_warns_of_nothing():
    # fit runs it at its end, in the network's own mode: it moved the running statistics and
    # gave predict's warning of a BatchNorm in training mode from inside fit
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(2, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    model = bbb.BNN(bbb.bayesianize(net), bbb.likelihoods.Gaussian(scale=0.1), num_data=40)
    guide = bbb.MeanFieldGuide(model)
    x, y = torch.randn(40, 2), torch.randn(40)
    guide(x, y)
    before = {name: b.clone() for name, b in model.named_buffers()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert diagnose_collapse(model, guide, x, y) is not None
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, before[name]), name


def test_fit_monitors_a_model_whose_targets_are_not_optional():
    class NeedsTargets(pyro.nn.PyroModule):
        def __init__(self):
            super().__init__()
            self.net = bbb.mlp([1, 8, 1])

        def forward(self, x, y):
            loc = self.net(x).squeeze(-1)
            with pyro.plate("data", x.shape[0]):
                return pyro.sample("obs", pyro.distributions.Normal(loc, 0.1), obs=y)

    x, y = _sine()
    model = NeedsTargets()
    history = bbb.fit(model, bbb.MeanFieldGuide(model), x, y, epochs=2, progress=False)
    assert len(history.collapsed) == 2 and 0 <= history.collapsed[-1] <= 1


@pytest.mark.parametrize(
    ("noise", "learned", "collapsed"),
    [
        (1.14, True, True),  # ten points of x^2 (below): the noise takes in the functions
        (0.30, True, False),  # a noise within the targets' spread
        (1.14, False, False),  # a noise the user fixed is the user's choice
    ],
)
def test_a_learned_noise_wider_than_the_targets_is_collapse_whatever_the_weights(
    noise, learned, collapsed
):
    # 21 % of the weights at their prior and a residual (0.32) near what a neighbour average
    # of ten points leaves (0.39): neither rule of the weights fires
    diagnosis = CollapseDiagnosis(0.21, 0.32, 0.39, 0.36, noise=noise, noise_learned=learned)
    assert diagnosis.collapsed is collapsed
    if collapsed:
        assert "is above the targets' own standard deviation 0.36" in diagnosis.message()


def test_fit_on_ten_points_whose_noise_outgrows_the_targets_says_so():
    # y = x^2 on ten points, a 1-32-1 network at fit's defaults: the learned noise ends at
    # 1.1-2.1 (seeds 0-5) where the targets' std is 0.36, a fifth of the weights at their
    # prior; nothing warned before
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x = torch.linspace(-1, 1, 10).unsqueeze(-1)
    y = x[:, 0] ** 2
    model = bbb.BNN(bbb.mlp([1, 32, 1]), bbb.likelihoods.Gaussian(), num_data=10)
    guide = bbb.MeanFieldGuide(model)
    with pytest.warns(bbb.PosteriorCollapseWarning, match="above the targets' own standard"):
        history = bbb.fit(model, guide, x, y, seed=0, progress=False)
    assert history.collapsed[-1] < 0.5
    assert float(model.likelihood.noise_scale().detach()) > float(y.std())


def test_a_fit_a_callback_stopped_is_not_judged_by_its_noise():
    # the ten points above, stopped after five epochs: the noise is still near its initial 1,
    # a fit not done, not a collapse
    pyro.clear_param_store()
    x = torch.linspace(-1, 1, 10).unsqueeze(-1)
    model = bbb.BNN(bbb.mlp([1, 32, 1]), bbb.likelihoods.Gaussian(), num_data=10)

    class Stop(bbb.Callback):
        def on_epoch_end(self, epoch, history):
            return epoch >= 4

    with warnings.catch_warnings():
        warnings.simplefilter("error", bbb.PosteriorCollapseWarning)
        bbb.fit(model, bbb.MeanFieldGuide(model), x, x[:, 0] ** 2, callbacks=[Stop()],
                progress=False)  # fmt: skip
