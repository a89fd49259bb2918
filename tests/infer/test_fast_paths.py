"""The speed work must not change results: the guide's parameter path and fit against SVI."""

import math

import pyro
import pytest
import torch
from pyro.infer import SVI, TraceMeanField_ELBO

import pyro_bbb
from pyro_bbb.infer import AnnealedELBO


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


@pytest.mark.parametrize("reference_elbo", ["annealed", "pyro_trace_mean_field"])
def test_one_fit_step_equals_one_plain_svi_step(reference_elbo):
    """Same model, guide, data and seed: the same loss and the same updated parameters."""
    x, y = _regression()
    lr = 0.01

    model = _model()
    guide = pyro_bbb.MeanFieldGuide(model, name="fit")
    history = pyro_bbb.fit(
        model, guide, x, y, epochs=1, lr=lr, beta=1.0, num_particles=1, seed=3, progress=False
    )
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
