"""Ensembles: K members in one vectorised step, each member's gradient its own fit's."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

import pyro_bbb as bbb
from pyro_bbb.infer import AnnealedELBO, DeltaGuide, Ensemble, LowRankGuide, MeanFieldGuide

FAMILIES = {
    "meanfield": lambda m, **kw: MeanFieldGuide(m, init_scale=0.1, **kw),
    "lowrank": lambda m, **kw: LowRankGuide(m, rank=2, init_scale=0.1, **kw),
    "delta": lambda m, **kw: DeltaGuide(m, **kw),
}


def regression(num_data=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_data, 2, generator=g, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0]) + x[:, 1] + 0.1 * torch.randn(num_data, generator=g).double()
    net = bbb.mlp([2, 6, 1], activation="tanh").double()
    return bbb.BNN(net, bbb.likelihoods.Gaussian(scale=0.2).double(), num_data=num_data), x, y


class FixedNoise(Messenger):
    """Sets each guide draw to ``loc + scale · ε`` for given ε (differentiable in the params)."""

    def __init__(self, noise):
        super().__init__()
        self.noise = noise

    def _pyro_sample(self, msg):
        if msg["is_observed"] or msg["value"] is not None or msg["name"] not in self.noise:
            return
        fn = msg["fn"]
        while isinstance(fn, torch.distributions.Independent):
            fn = fn.base_dist
        eps = self.noise[msg["name"]]
        if isinstance(fn, torch.distributions.LowRankMultivariateNormal):
            diag, factor = eps
            factor_part = (fn._unbroadcasted_cov_factor @ factor.unsqueeze(-1)).squeeze(-1)
            msg["value"] = fn.loc + factor_part + fn._unbroadcasted_cov_diag.sqrt() * diag
        else:
            msg["value"] = fn.loc + fn.scale * eps


def noise_for(guide, x, y, members):
    """ε for every reparameterised guide site, ``(K, 1, *shape)`` for ``members = K``."""
    trace = pyro.poutine.trace(guide).get_trace(x, y)
    noise = {}
    for name, site in trace.iter_stochastic_nodes():
        if site["is_observed"] or site_is_subsample(site):
            continue
        fn = site["fn"]
        event_shape = fn.event_shape
        while isinstance(fn, torch.distributions.Independent):
            fn = fn.base_dist
        if isinstance(fn, torch.distributions.LowRankMultivariateNormal):
            d, r = fn.cov_factor.shape[-2:]
            noise[name] = (torch.randn(members, 1, d).double(), torch.randn(members, 1, r).double())
        elif isinstance(fn, torch.distributions.Normal):
            noise[name] = torch.randn(members, 1, *event_shape).double()
    return noise


def _member(eps, j):
    return tuple(e[j, 0] for e in eps) if isinstance(eps, tuple) else eps[j, 0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_members_gradient_is_its_own_elbos_gradient(family):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model, x, y = regression()
    k = 3
    ensemble = Ensemble(model, lambda m: FAMILIES[family](m), k=k)
    ensemble(x, y)
    noise = noise_for(ensemble, x, y, k)
    elbo = AnnealedELBO(beta=0.7)
    with FixedNoise(noise):
        terms = elbo.terms(model, ensemble, x, y)
    terms.loss.backward()
    params = dict(ensemble.members.named_parameters())
    grads = {name: p.grad.clone() for name, p in params.items()}
    member_losses = []
    for j in range(k):
        single = FAMILIES[family](model, name=f"single{j}")
        single(x, y)
        own = dict(single.named_parameters())
        with torch.no_grad():
            for name, p in own.items():
                p.copy_(params[name][j, 0])
        # a low-rank block's site is named after its guide: "_<guide name>.<block>"
        old, new = ensemble.members._pyro_name, single._pyro_name
        own_noise = {name.replace(old, new): _member(eps, j) for name, eps in noise.items()}
        with FixedNoise(own_noise):
            single_terms = AnnealedELBO(beta=0.7).terms(model, single, x, y)
        single_terms.loss.backward()
        member_losses.append(single_terms.loss.detach())
        for name, p in own.items():
            torch.testing.assert_close(grads[name][j, 0], p.grad, rtol=1e-10, atol=1e-12)
    # the ensemble's objective is the sum of the members'
    torch.testing.assert_close(terms.loss.detach(), torch.stack(member_losses).sum())


def test_members_start_apart_member_zero_where_a_single_guide_starts():
    pyro.clear_param_store()
    model, x, y = regression()
    ensemble = Ensemble(model, MeanFieldGuide, k=4)
    ensemble(x, y)
    locs = ensemble.marginals()["0.weight"][0]
    assert locs.shape == (4, 6, 2)
    torch.testing.assert_close(locs[0], bbb.nn.initial_values(model)["0.weight"])
    bound = 1 / math.sqrt(2)  # default init of a Linear(2, 6): U(±1/√fan_in)
    assert locs.abs().max() <= bound
    distances = torch.cdist(locs.reshape(4, -1), locs.reshape(4, -1))
    assert (distances + torch.eye(4)).min() > 0.1


def test_predictive_is_the_uniform_mixture_of_the_members():
    pyro.clear_param_store()
    model, x, y = regression()
    ensemble = Ensemble(model, DeltaGuide, k=3)
    bbb.fit(model, ensemble, x, y, epochs=20, beta=1.0, seed=0, progress=False)
    pred = bbb.predict(model, ensemble, x, num_samples=2)
    assert pred.loc_samples.shape == (6, 30)
    locs = ensemble.marginals()
    outputs = []
    for j in range(3):
        net_values = {name: loc[j] for name, (loc, _) in locs.items()}
        conditioned = pyro.poutine.condition(model.net, data=net_values)
        outputs.append(conditioned(x).squeeze(-1))
    torch.testing.assert_close(pred.mean, torch.stack(outputs).mean(0))
    # the mixture's epistemic variance is the members' spread
    torch.testing.assert_close(pred.epistemic_std, torch.stack(outputs).std(0, unbiased=False))


def test_an_ensemble_of_one_trains_as_its_guide_alone():
    histories = []
    for make in (MeanFieldGuide, lambda m: Ensemble(m, MeanFieldGuide, k=1)):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)  # the same network
        model, x, y = regression()
        histories.append(bbb.fit(model, make(model), x, y, epochs=15, seed=3, progress=False))
    assert histories[0].loss == pytest.approx(histories[1].loss, rel=1e-12)


def test_mixture_log_prob_is_the_log_mean_of_the_members_densities():
    pyro.clear_param_store()
    model, x, y = regression()
    ensemble = Ensemble(model, MeanFieldGuide, k=3)
    ensemble(x, y)
    plate = pyro.plate("draws", 5, dim=-3)
    trace = pyro.poutine.trace(plate(ensemble)).get_trace(x)
    mixture = ensemble.mixture_log_prob(trace)
    assert mixture.shape == (5, 3)
    marginals = ensemble.marginals()
    for s in range(5):
        for k in range(3):
            densities = []
            for j in range(3):
                total = 0.0
                for name, (loc, scale) in marginals.items():
                    value = trace.nodes[name]["value"][s, k, 0]
                    total += dist.Normal(loc[j], scale[j]).log_prob(value).sum()
                densities.append(total)
            expected = torch.logsumexp(torch.stack(densities), 0) - math.log(3)
            torch.testing.assert_close(mixture[s, k], expected)


def test_point_mass_members_have_no_mixture_density():
    pyro.clear_param_store()
    model, x, y = regression()
    ensemble = Ensemble(model, DeltaGuide, k=2)
    ensemble(x, y)
    with pytest.raises(ValueError, match="no density"):
        bbb.psis_khat(model, ensemble, x, y, num_samples=20)


def test_inference_data_holds_the_members_as_chains():
    pytest.importorskip("arviz")
    pyro.clear_param_store()
    model, x, y = regression()
    ensemble = Ensemble(model, MeanFieldGuide, k=3)
    bbb.fit(model, ensemble, x, y, epochs=10, seed=0, progress=False)
    idata = bbb.to_inference_data(model, ensemble, x, y, num_samples=400, seed=0)
    weights = torch.as_tensor(idata.posterior["0.weight"].values)
    assert weights.shape == (3, 400, 6, 2)
    locs, scales = ensemble.marginals()["0.weight"]
    # each chain is one member: its draws have that member's mean, within 5 standard errors
    torch.testing.assert_close(weights.mean(1), locs, atol=5 * float(scales.max()) / 20, rtol=0)
    assert idata.log_likelihood["obs"].shape == (3, 400, 30)
    assert idata.posterior_predictive["obs"].shape == (3, 400, 30)


def test_psis_khat_and_compare_accept_an_ensemble():
    pytest.importorskip("arviz")
    pyro.clear_param_store()
    model, x, y = regression()
    ensemble = Ensemble(model, MeanFieldGuide, k=2)
    history = bbb.fit(model, ensemble, x, y, epochs=30, seed=0, progress=False)
    khat = bbb.psis_khat(model, ensemble, x, y, num_samples=200, seed=0)
    assert math.isfinite(khat)
    table = bbb.compare(
        model, (ensemble, history), ensemble, x, y, x_train=x, y_train=y, num_samples=100
    )
    assert table.columns["w2_mean"][0] == 0.0  # the same posterior, common random numbers
    assert table.columns["psis_khat"][0] == pytest.approx(table.columns["psis_khat"][1])


def test_bad_members_are_refused():
    pyro.clear_param_store()
    model, x, y = regression()
    with pytest.raises(ValueError, match="k must be a positive int"):
        Ensemble(model, MeanFieldGuide, k=0)
    with pytest.raises(TypeError, match="must return a MeanFieldGuide"):
        Ensemble(model, pyro.infer.autoguide.AutoNormal, k=2)
    used = MeanFieldGuide(model)
    used(x, y)
    with pytest.raises(TypeError, match="not been called"):
        Ensemble(model, lambda m: used, k=2)


def test_a_list_of_guides_in_place_of_the_model_is_refused_saying_how_to_build_one():
    # the guess a user makes first; it used to fail on the list's missing max_plate_nesting
    pyro.clear_param_store()
    model, _, _ = regression()
    guides = [bbb.LowRankGuide(model, rank=2, name=f"g{i}") for i in range(2)]
    with pytest.raises(TypeError, match=r"Ensemble\(model, guide, k=K\).*a list of 2 LowRankGuide"):
        Ensemble(guides)
    with pytest.raises(TypeError, match="got a MeanFieldGuide"):
        Ensemble(MeanFieldGuide(model))


def test_a_guide_already_made_in_place_of_the_family_is_refused_saying_what_to_pass():
    # it used to be called with the model as its inputs: "x must be a torch.Tensor, got BNN"
    pyro.clear_param_store()
    model, _, _ = regression()
    made = bbb.LowRankGuide(model, rank=2)
    with pytest.raises(TypeError, match=r"Ensemble\(model, LowRankGuide, k=3\).*already made"):
        Ensemble(model, made, k=3)


def test_ensembles_are_named_after_their_members_guide_in_the_param_store():
    pyro.clear_param_store()
    model, x, y = regression()
    small = Ensemble(model, lambda m: MeanFieldGuide(m, name="small"), k=2)
    large = Ensemble(model, lambda m: MeanFieldGuide(m, name="large"), k=3)
    small(x, y)
    large(x, y)
    store = pyro.get_param_store()
    assert store["small.members.locs.0.weight"].shape == (2, 1, 6, 2)
    assert store["large.members.locs.0.weight"].shape == (3, 1, 6, 2)


def test_a_saved_ensemble_loads_into_a_fresh_one(tmp_path):
    pyro.clear_param_store()
    model, x, y = regression()
    ensemble = Ensemble(model, lambda m: LowRankGuide(m, rank=2), k=3)
    bbb.fit(model, ensemble, x, y, epochs=5, seed=0, progress=False)
    bbb.save(tmp_path / "ensemble.pt", model, ensemble)
    saved = {name: loc.clone() for name, (loc, _) in ensemble.marginals().items()}
    pyro.clear_param_store()
    fresh = Ensemble(model, lambda m: LowRankGuide(m, rank=2), k=3)
    bbb.load(tmp_path / "ensemble.pt", model, fresh)
    for name, (loc, _) in fresh.marginals().items():
        assert torch.equal(loc, saved[name]), name


def _function_model():
    """A model function of one's own over a bayesianized network (no max_plate_nesting)."""
    net = bbb.bayesianize(torch.nn.Sequential(torch.nn.Linear(2, 6), torch.nn.Tanh(),
                                              torch.nn.Linear(6, 1)))  # fmt: skip

    def model(x, y=None):
        loc = net(x).squeeze(-1)
        with pyro.plate("data", 40, subsample_size=len(x)):
            return pyro.sample("obs", dist.Normal(loc, 0.1), obs=y)

    return model


def test_an_ensemble_of_a_model_function_asks_its_plate_depth_and_its_members_start_apart():
    # before: "max_plate_nesting must be an int >= 0, got None", then with it given,
    # "'function' object has no attribute 'modules'" at the members' first means; the
    # layers the function ran are found, so the members start as a BNN's do
    pyro.clear_param_store()
    model = _function_model()
    x, y = torch.randn(40, 2), torch.randn(40)
    with pytest.raises(ValueError, match=r"declares no max_plate_nesting.*pass max_plate_nes"):
        Ensemble(model, MeanFieldGuide, k=3)
    ensemble = Ensemble(model, MeanFieldGuide, k=3, max_plate_nesting=1)
    ensemble(x, y)
    locs = ensemble.marginals()["0.weight"][0].detach()
    assert locs.abs().max() <= 1 / math.sqrt(2)  # torch's init of a Linear(2, 6)
    flat = locs.reshape(3, -1)
    assert (torch.cdist(flat, flat) + torch.eye(3)).min() > 0.1
    bbb.fit(model, ensemble, x, y, epochs=2, batch_size=20, progress=False)


def test_a_guide_of_a_model_function_starts_at_the_networks_own_weights():
    # a guide sees a function's sites, not its layers: they are found on its first run of
    # the model (before, its means started at draws from the N(0, 1) priors)
    pyro.clear_param_store()
    net = bbb.bayesianize(torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(),
                                              torch.nn.Linear(5, 1)))  # fmt: skip

    def model(x, y=None):
        loc = net(x).squeeze(-1)  # the weights outside the data plate
        with pyro.plate("data", len(x)):
            return pyro.sample("obs", dist.Normal(loc, 0.1), obs=y)

    guide = MeanFieldGuide(model)
    guide(torch.randn(4, 3), torch.randn(4))
    means = {name: loc for name, (loc, _) in guide.marginals().items()}
    expected = bbb.nn.initial_values(net)
    assert set(means) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(means[name].detach(), value)


def test_layers_that_run_lists_each_layer_once_in_the_order_they_first_ran():
    from pyro_bbb.nn.layers import layers_that_run

    net = bbb.bayesianize(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)))
    with layers_that_run() as outer:
        net(torch.randn(4, 2))
        with layers_that_run() as inner:
            net[1](torch.randn(4, 3))
        net(torch.randn(4, 2))
    assert outer == [net[0], net[1]] and inner == [net[1]]
    net(torch.randn(4, 2))  # nothing listens: nothing noted
    assert len(outer) == 2
