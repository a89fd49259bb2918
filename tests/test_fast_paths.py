"""The speed work must not change results: each shortcut against the general path it replaces."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pyro.infer import SVI, TraceMeanField_ELBO
from torch.distributions import kl_divergence

import pyro_bbb
from pyro_bbb._kl import diagonal_normal_kl
from pyro_bbb._shapes import broadcast_shape
from pyro_bbb.elbo import AnnealedELBO
from pyro_bbb.priors import FanInGaussian, Gaussian, ScaleMixture

# ----------------------------------------------------------------------------- KL


shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@settings(max_examples=60, deadline=None)
@given(
    shape=shapes,
    particles=st.sampled_from([None, 1, 3]),
    per_weight_prior=st.booleans(),
    prior_loc=st.floats(-1, 1),
    prior_scale=st.floats(0.05, 3),
    seed=st.integers(0, 2**16),
)
def test_diagonal_normal_kl_equals_torch(
    shape, particles, per_weight_prior, prior_loc, prior_scale, seed
):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(shape, generator=g, dtype=torch.float64)
    scale = torch.rand(shape, generator=g, dtype=torch.float64) + 0.01
    if per_weight_prior:
        p_loc = torch.randn(shape, generator=g, dtype=torch.float64)
        p_scale = torch.rand(shape, generator=g, dtype=torch.float64) + 0.1
        p = dist.Normal(p_loc, p_scale)
    else:
        p = dist.Normal(torch.tensor(prior_loc, dtype=torch.float64), prior_scale).expand(shape)
    q = dist.Normal(loc, scale).to_event(len(shape))
    p = p.to_event(len(shape))
    if particles is not None:  # as a particle plate broadcasts a global site
        q, p = q.expand((particles, 1)), p.expand((particles, 1))
    fast = diagonal_normal_kl(q, p)
    assert fast is not None
    expected = kl_divergence(q, p)
    assert fast.shape == expected.shape
    torch.testing.assert_close(fast, expected, rtol=1e-9, atol=1e-9)


def test_diagonal_normal_kl_gradients_match_torch():
    loc = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    rho = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    prior = dist.Normal(torch.tensor(0.2, dtype=torch.float64), 0.7).expand((5, 3)).to_event(2)
    grads = []
    for kl in (diagonal_normal_kl, kl_divergence):
        q = dist.Normal(loc, torch.nn.functional.softplus(rho)).to_event(2)
        grads.append(torch.autograd.grad(kl(q, prior), (loc, rho)))
    for fast, general in zip(*grads, strict=True):
        torch.testing.assert_close(fast, general)


def test_diagonal_normal_kl_declines_what_it_does_not_cover():
    q = dist.Normal(torch.zeros(3), 1.0).to_event(1)
    assert diagonal_normal_kl(q, ScaleMixture().expand((3,)).to_event(1)) is None
    assert diagonal_normal_kl(q, dist.Normal(torch.zeros(3), 1.0)) is None  # event dims differ
    assert diagonal_normal_kl(dist.Laplace(torch.zeros(3), 1.0).to_event(1), q) is None


def test_diagonal_normal_kl_keeps_a_learnable_prior_scale_in_the_graph():
    log_scale = torch.zeros((), requires_grad=True)
    q = dist.Normal(torch.ones(4), 0.5).to_event(1)
    p = dist.Normal(0.0, log_scale.exp()).expand((4,)).to_event(1)
    (grad,) = torch.autograd.grad(diagonal_normal_kl(q, p), log_scale)
    # d/ds KL at s = 1: n - (Σσ² + Σμ²) = 4 - (4·0.25 + 4) = -1
    assert grad.item() == pytest.approx(-1.0)


@settings(max_examples=50, deadline=None)
@given(st.lists(shapes, min_size=1, max_size=4))
def test_broadcast_shape_matches_torch(shape_list):
    try:
        expected = torch.broadcast_shapes(*shape_list)
    except RuntimeError:
        with pytest.raises(ValueError, match="do not broadcast"):
            broadcast_shape(*shape_list)
        return
    assert broadcast_shape(*shape_list) == expected


# ----------------------------------------------------------------------------- priors


def test_priors_are_immutable_so_layers_may_cache_them():
    prior = Gaussian(1.0)
    with pytest.raises(AttributeError, match="immutable"):
        prior.scale = 2.0
    with pytest.raises(AttributeError, match="immutable"):
        FanInGaussian(1.0).gain = 3.0


def test_layer_builds_its_prior_once_per_device_and_dtype_and_on_reassignment():
    net = pyro_bbb.mlp([2, 3, 1])
    layer = net[0]
    first = layer.prior_distribution("weight")
    assert layer.prior_distribution("weight") is first
    net.double()
    assert layer.prior_distribution("weight").base_dist.loc.dtype == torch.float64
    layer.priors["weight"] = Gaussian(0.5)
    assert torch.all(layer.prior_distribution("weight").base_dist.scale == 0.5)


def test_a_prior_with_learnable_hyperparameters_is_rebuilt_every_pass():
    scale = torch.tensor(2.0, requires_grad=True)
    prior = ScaleMixture(0.5, scale, 0.1)
    assert not prior.cacheable
    net = pyro_bbb.mlp([2, 3, 1], prior=prior)
    assert net[0].prior_distribution("weight") is not net[0].prior_distribution("weight")


# ----------------------------------------------------------------------------- guide params


def _regression(seed=0, n=20):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return x, x.sum(-1) + 0.1 * torch.randn(n, generator=g)


def _model(n=20):
    torch.manual_seed(1)
    net = pyro_bbb.mlp([2, 8, 1])
    return pyro_bbb.BNN(net, pyro_bbb.likelihoods.Gaussian(scale=0.5), num_data=n)


def test_guide_follows_the_param_store_when_it_is_replaced():
    x, y = _regression()
    model = _model()
    guide = pyro_bbb.MeanFieldGuide(model, name="mf")
    guide(x, y)
    store = pyro.get_param_store()
    state = store.get_state()
    state["params"]["mf.locs.0.weight"] = torch.full((8, 2), 3.0)
    store.set_state(state)  # e.g. loading a checkpoint replaces the store's tensors
    trace = pyro.poutine.trace(guide).get_trace(x, y)
    torch.testing.assert_close(trace.nodes["0.weight"]["fn"].base_dist.loc, torch.full((8, 2), 3.0))
    # ...and the module follows too, so state_dict() and parameters() are current.
    torch.testing.assert_close(guide.locs.get_submodule("0").weight, torch.full((8, 2), 3.0))


def test_guide_reregisters_its_parameters_after_the_store_is_cleared():
    x, y = _regression()
    model = _model()
    guide = pyro_bbb.MeanFieldGuide(model, name="mf")
    guide(x, y)
    before = guide.median()["0.weight"]
    pyro.clear_param_store()
    trace = pyro.poutine.trace(guide).get_trace(x, y)
    torch.testing.assert_close(trace.nodes["0.weight"]["fn"].base_dist.loc, before)
    assert "mf.locs.0.weight" in pyro.get_param_store()


def test_guide_parameters_are_recorded_as_param_sites_for_svi():
    x, y = _regression()
    guide = pyro_bbb.MeanFieldGuide(_model(), name="mf")
    trace = pyro.poutine.trace(guide, param_only=True).get_trace(x, y)
    names = {name for name, site in trace.nodes.items() if site["type"] == "param"}
    assert names == {
        f"mf.{kind}.{layer}.{param}"
        for kind in ("locs", "rhos")
        for layer in "02"
        for param in ("weight", "bias")
    }


def test_guide_under_module_local_params():
    x, y = _regression()
    with pyro.settings.context(module_local_params=True):
        guide = pyro_bbb.MeanFieldGuide(_model(), name="mf")
        guide(x, y)
        loss = AnnealedELBO(1.0).loss(guide.model, guide, x, y)
        params = {n for n, _ in guide.named_parameters()}
    assert math.isfinite(loss)
    assert "locs.0.weight_unconstrained" in params
    assert "mf.locs.0.weight" not in pyro.get_param_store()  # local, not global


# ----------------------------------------------------------------------------- fit = SVI


@pytest.mark.parametrize("reference_elbo", ["annealed", "pyro_trace_mean_field"])
def test_one_fit_step_equals_one_plain_svi_step(reference_elbo):
    """Same model, guide, data and seed: the same loss and the same updated parameters."""
    x, y = _regression()
    lr = 0.01

    model = _model()
    guide = pyro_bbb.MeanFieldGuide(model, name="fit")
    history = pyro_bbb.fit(model, guide, x, y, epochs=1, lr=lr, seed=3, progress=False)
    fitted = {name: p.detach().clone() for name, p in guide.named_parameters()}

    model = _model()
    guide = pyro_bbb.MeanFieldGuide(model, name="svi")
    elbo = AnnealedELBO(1.0) if reference_elbo == "annealed" else TraceMeanField_ELBO()
    svi = SVI(model, guide, pyro.optim.Adam({"lr": lr}), elbo)
    pyro.set_rng_seed(3)
    with pyro.validation_enabled(False):
        loss = svi.step(x, y)

    assert history.loss[0] == pytest.approx(loss, rel=1e-6)
    for name, p in guide.named_parameters():
        torch.testing.assert_close(fitted[name], p.detach(), rtol=1e-5, atol=1e-6)
