"""The fused ELBO evaluation equals the traced one, and is taken only where it applies.

Equality is exact in the draws: both paths consume torch's random stream in the same order,
so after the same seed the fused terms and the traced ``AnnealedELBO.terms`` see the same
weights, pre-activation noise and signs, and their losses and gradients agree to float
rounding.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule
from torch import nn

import pyro_bbb.training.objective as training
from pyro_bbb import BNN, Callback, LowRankGuide, MeanFieldGuide, bayesianize, fit, likelihoods, mlp
from pyro_bbb.infer import AnnealedELBO, Ensemble
from pyro_bbb.infer.fused import FusedELBO, fused_elbo
from pyro_bbb.infer.reparam import estimator
from pyro_bbb.priors import FanInGaussian, Gaussian, ScaleMixture, from_guide

from ..support import user_networks

N, B = 40, 10

PRIORS = {
    "gaussian": lambda: Gaussian(1.0, loc=0.1),
    "fan_in": lambda: FanInGaussian(1.5),
    "scale_mixture": lambda: ScaleMixture(0.5, 1.0, 0.05),
}
LIKELIHOODS = {  # name -> (likelihood, output width, targets of a batch)
    "gaussian_learned": (lambda: likelihoods.Gaussian(), 1, lambda g: torch.randn(B, generator=g)),
    "gaussian_fixed_2d": (
        lambda: likelihoods.Gaussian(scale=0.5),
        2,
        lambda g: torch.randn(B, 2, generator=g),
    ),
    "heteroscedastic": (
        lambda: likelihoods.Gaussian(heteroscedastic=True),
        2,
        lambda g: torch.randn(B, generator=g),
    ),
    "categorical": (
        lambda: likelihoods.Categorical(),
        3,
        lambda g: torch.randint(0, 3, (B,), generator=g),
    ),
    "bernoulli": (
        lambda: likelihoods.Bernoulli(),
        1,
        lambda g: torch.randint(0, 2, (B,), generator=g).float(),
    ),
}
GUIDES = {
    "mean_field": lambda model: MeanFieldGuide(model, init_scale=0.1),
    "low_rank": lambda model: LowRankGuide(model, rank=2, init_scale=0.1),
    "low_rank_network": lambda model: LowRankGuide(model, rank=3, blocks="network"),
}


def _problem(prior="gaussian", likelihood="gaussian_learned", net=None):
    make, width, targets = LIKELIHOODS[likelihood]
    torch.manual_seed(0)
    network = net if net is not None else mlp([3, 6, 5, width], prior=PRIORS[prior]())
    model = BNN(network, make(), num_data=N)
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(B, 3, generator=g), targets(g)


def _draw_unused_weights(guide, num_particles):
    """Draw the weights the traced mean-field guide draws and local reparameterisation ignores.

    With closed-form KL terms, the fused path under local reparameterisation does not draw
    them: drawing them here puts the random stream where the traced path's layers read it.
    """
    if isinstance(guide, Ensemble):  # the member dim leads each parameter already
        guide, sample = guide.members, (num_particles,) if num_particles > 1 else ()
    else:
        sample = (num_particles, 1) if num_particles > 1 else ()
    for loc in guide.median().values():
        torch.empty((*sample, *loc.shape)).normal_()


def _compare(model, guide, x, y, reparam, *, num_particles=1, beta=0.7):
    """Loss, parts and every gradient of the traced and the fused evaluation, same draws.

    ``guide`` is one of our guides or an ``Ensemble`` of them.
    """
    elbo = AnnealedELBO(beta, num_particles=num_particles)
    with estimator(reparam)():
        first = elbo.terms(model, guide, x, y)  # sets the guide (or the members) up
    fused = fused_elbo(model, guide, elbo, reparam)
    assert fused is not None
    assert fused.covers(first)
    params = [*guide.parameters(), *model.parameters()]
    assert {id(p) for p in fused.parameters()} <= {id(p) for p in params}

    torch.manual_seed(5)
    with estimator(reparam)():
        traced = elbo.terms(model, guide, x, y)
    traced_grads = torch.autograd.grad(traced.loss, params, allow_unused=True)
    torch.manual_seed(5)
    members = guide.members if isinstance(guide, Ensemble) else guide
    if reparam == "local" and isinstance(members, MeanFieldGuide) and not _sampled_kl(model):
        _draw_unused_weights(guide, num_particles)
    direct = fused.terms(x, y)
    direct_grads = torch.autograd.grad(direct.loss, params, allow_unused=True)

    assert set(direct.sites) == set(traced.sites)
    assert direct.beta == traced.beta
    for part in ("loss", "nll", "kl"):
        torch.testing.assert_close(
            getattr(direct, part), getattr(traced, part), rtol=1e-5, atol=1e-5
        )
    assert any(g is not None for g in traced_grads)
    for p, a, b in zip(params, traced_grads, direct_grads, strict=True):
        if a is None:
            assert b is None or not b.any(), p.shape
        else:
            assert b is not None, p.shape
            # float32 rounding of sums (over members and particles): relative to the largest
            scale = a.abs().max().clamp_min(1.0).item()
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5 * scale)
    return traced


def _sampled_kl(model):
    return any(
        isinstance(prior, ScaleMixture)
        for layer in model.net.modules()
        for prior in getattr(layer, "priors", {}).values()
    )


@pytest.mark.parametrize("guide", list(GUIDES))
@pytest.mark.parametrize("reparam", [None, "local", "flipout"])
@pytest.mark.parametrize("likelihood", list(LIKELIHOODS))
def test_fused_terms_equal_the_traced_elbo_for_every_likelihood(likelihood, reparam, guide):
    # every guide x prior x estimator the package offers: test_fused_every_pair.py
    model, x, y = _problem("gaussian", likelihood)
    _compare(model, GUIDES[guide](model), x, y, reparam)


@pytest.mark.parametrize("guide", ["mean_field", "low_rank"])
@pytest.mark.parametrize("reparam", [None, "local", "flipout"])
@pytest.mark.parametrize("prior", ["gaussian", "scale_mixture"])
def test_fused_terms_equal_the_traced_elbo_over_vectorised_particles(prior, reparam, guide):
    model, x, y = _problem(prior, "categorical")
    _compare(model, GUIDES[guide](model), x, y, reparam, num_particles=3)


@pytest.mark.parametrize("analytic_kl", [True, False])
def test_fused_terms_follow_the_elbos_choice_of_monte_carlo_kl(analytic_kl):
    model, x, y = _problem("gaussian")
    guide = MeanFieldGuide(model)
    elbo = AnnealedELBO(1.0, analytic_kl=analytic_kl)
    elbo.terms(model, guide, x, y)
    fused = fused_elbo(model, guide, elbo, None)
    torch.manual_seed(2)
    traced = elbo.terms(model, guide, x, y)
    torch.manual_seed(2)
    torch.testing.assert_close(fused.terms(x, y).kl, traced.kl)
    # the closed form has no noise: two draws give one KL only when it is analytic
    assert torch.equal(fused.terms(x, y).kl, fused.terms(x, y).kl) == analytic_kl


@pytest.mark.parametrize("reparam", [None, "local", "flipout"])
def test_fused_terms_equal_the_traced_elbo_on_a_conv_net_with_dropout(reparam):
    layers = [nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Dropout(0.2), nn.Flatten(-3), nn.Linear(48, 2)]
    net = bayesianize(nn.Sequential(*layers))
    torch.manual_seed(0)
    model = BNN(net, likelihoods.Categorical(), num_data=N)
    x, y = torch.randn(B, 1, 6, 6), torch.randint(0, 2, (B,))
    _compare(model, MeanFieldGuide(model), x, y, reparam)


def test_fused_terms_equal_the_traced_elbo_with_a_deterministic_parameter_and_full_batch():
    net = mlp([3, 6, 1], deterministic=["2.bias"])
    model = BNN(net, likelihoods.Gaussian(), num_data=B)
    x, y = torch.randn(B, 3), torch.randn(B)
    _compare(model, MeanFieldGuide(model), x, y, "local")
    _compare(model, LowRankGuide(model, rank=1), x, y, None)


def _user_network(name):
    """A network of ``examples/user_networks.py`` (modules made Bayesian whole), its data."""
    g = torch.Generator().manual_seed(2)
    if name == "resnet":  # convolutions, BatchNorm in training mode, a downsample branch
        net, x = user_networks.ResNet(width=4, num_classes=3), torch.randn(B, 3, 8, 8, generator=g)
    elif name == "lstm":
        net, x = user_networks.Recurrent(nn.LSTM, hidden=5), torch.randn(B, 4, 3, generator=g)
    elif name == "gru":
        net, x = user_networks.Recurrent(nn.GRU, hidden=5), torch.randn(B, 4, 3, generator=g)
    else:  # Embedding, LayerNorm, attention whose forward reads out_proj.weight itself
        net, x = user_networks.TokenTransformer(vocab=12, d_model=8), torch.randint(0, 12, (B, 4))
    if name in ("lstm", "gru"):
        return net, x, torch.randn(B, generator=g), likelihoods.Gaussian()
    return net, x, torch.randint(0, 3, (B,), generator=g), likelihoods.Categorical()


@pytest.mark.parametrize(
    ("name", "guide"),
    [
        *((name, guide) for name in ("resnet", "lstm", "gru") for guide in GUIDES),
        ("resnet", "ensemble"),
        ("lstm", "ensemble"),
        ("transformer", "mean_field"),
        # MultiheadAttention's own block (in_proj) beside its child's (out_proj): the own
        # one sits at "encoder.self_attn.own" (it crashed before, traced and fused alike)
        ("transformer", "low_rank"),
    ],
)
def test_fused_terms_equal_the_traced_elbo_on_networks_as_users_write_them(name, guide):
    torch.manual_seed(0)
    net, x, y, likelihood = _user_network(name)
    model = BNN(bayesianize(net), likelihood, num_data=N)
    if guide == "ensemble":
        q = Ensemble(model, lambda m: MeanFieldGuide(m, init_scale=0.1), k=2)
    else:
        q = GUIDES[guide](model)
    for particles in (1, 2):
        _compare(model, q, x, y, None, num_particles=particles)


def test_one_draw_of_the_fused_step_reaches_a_network_without_the_runner_reading_its_sites(
    monkeypatch,
):
    import pyro_bbb.nn.draws.per_draw as per_draw

    torch.manual_seed(0)
    net, x, y, likelihood = _user_network("lstm")
    model = BNN(bayesianize(net), likelihood, num_data=N)
    guide = MeanFieldGuide(model, init_scale=0.1)
    read, original = [], per_draw._draw_sites
    for particles in (1, 2):
        elbo = AnnealedELBO(1.0, num_particles=particles)
        elbo.terms(model, guide, x, y)  # sets the guide up
        fused = fused_elbo(model, guide, elbo, None)
        read.clear()
        monkeypatch.setattr(per_draw, "_draw_sites", lambda n: read.append(n) or original(n))
        fused.terms(x, y)
        monkeypatch.setattr(per_draw, "_draw_sites", original)
        assert bool(read) is (particles > 1)  # several draws: the runner reads them


@pytest.mark.parametrize("reparam", ["local", "flipout"])
def test_the_estimators_leave_a_network_with_other_bayesian_modules_to_the_traced_path(reparam):
    torch.manual_seed(0)
    net, x, y, likelihood = _user_network("lstm")
    model = BNN(bayesianize(net), likelihood, num_data=N)
    guide = MeanFieldGuide(model)
    elbo, _ = _set_up(model, guide, x, y)
    assert fused_elbo(model, guide, elbo, None) is not None
    assert fused_elbo(model, guide, elbo, reparam) is None


# --- where the fused path is not taken ------------------------------------------------------


def _set_up(model, guide, x, y, elbo=None):
    elbo = elbo or AnnealedELBO(1.0)
    return elbo, elbo.terms(model, guide, x, y)


def test_fused_path_declines_pyro_autoguides():
    model, x, y = _problem()
    guide = AutoNormal(model)
    elbo, _ = _set_up(model, guide, x, y)
    assert fused_elbo(model, guide, elbo, None) is None


def test_fused_path_declines_a_model_with_a_forward_of_its_own():
    class Tempered(BNN):
        def forward(self, x, y=None):
            with pyro.poutine.scale(scale=0.5):
                return super().forward(x, y)

    torch.manual_seed(0)
    model = Tempered(mlp([3, 4, 1]), likelihoods.Gaussian(), num_data=N)
    x, y = torch.randn(B, 3), torch.randn(B)
    guide = MeanFieldGuide(model)
    elbo, _ = _set_up(model, guide, x, y)
    assert fused_elbo(model, guide, elbo, None) is None


def test_fused_path_declines_sample_sites_outside_bayesian_layers():
    net = mlp([3, 4, 1])
    net.gain = PyroModule[nn.Identity]()  # a module with a latent of its own
    net.gain.log_gain = pyro.nn.PyroSample(dist.Normal(0.0, 1.0))
    model = BNN(net, likelihoods.Gaussian(), num_data=N)
    x, y = torch.randn(B, 3), torch.randn(B)
    guide = MeanFieldGuide(model)
    guide(x, y)
    assert fused_elbo(model, guide, AnnealedELBO(1.0), None) is None


def test_fused_path_is_not_used_for_a_network_that_issues_its_own_sample_statements(
    monkeypatch,
):
    class Penalised(nn.Module):
        def forward(self, h):
            pyro.factor("penalty", -h.pow(2).sum())  # an observed site the fused path lacks
            return h

    def train():
        pyro.clear_param_store()
        torch.manual_seed(0)
        net = bayesianize(nn.Sequential(nn.Linear(3, 4), Penalised(), nn.Linear(4, 1)))
        model = BNN(net, likelihoods.Gaussian(), num_data=N)
        x, y = torch.randn(N, 3), torch.randn(N)
        guide = MeanFieldGuide(model)
        return model, guide, fit(model, guide, x, y, epochs=2, seed=0, progress=False)

    model, guide, history = train()
    x, y = torch.randn(B, 3), torch.randn(B)
    elbo, first = _set_up(model, guide, x, y)
    fused = fused_elbo(model, guide, elbo, None)
    assert fused is not None and not fused.covers(first)
    _traced_only(monkeypatch)
    *_, traced = train()  # the penalty is in both losses: fit traced this network
    assert history.loss == pytest.approx(traced.loss, rel=1e-6)


def test_fused_path_declines_priors_tied_to_other_sites():
    model, x, y = _problem()
    first = LowRankGuide(model, rank=2, name="first")
    first(x, y)
    carried = BNN(mlp([3, 6, 5, 1], prior=from_guide(first)), likelihoods.Gaussian(), num_data=N)
    guide = MeanFieldGuide(carried, name="second")
    elbo, _ = _set_up(carried, guide, x, y)
    assert fused_elbo(carried, guide, elbo, None) is None


def test_low_rank_fused_path_declines_per_weight_gaussian_priors():
    model, x, y = _problem()
    first = MeanFieldGuide(model, name="first")
    first(x, y)
    carried = BNN(mlp([3, 6, 5, 1], prior=from_guide(first)), likelihoods.Gaussian(), num_data=N)
    low_rank = LowRankGuide(carried, rank=1, name="second")
    elbo, _ = _set_up(carried, low_rank, x, y)
    assert fused_elbo(carried, low_rank, elbo, None) is None
    # the mean-field guide takes the KL site by site, so per-weight priors are fine there
    mean_field = MeanFieldGuide(carried, name="third")
    _compare(carried, mean_field, x, y, None)


def test_fused_path_declines_module_local_parameters():
    with pyro.settings.context(module_local_params=True):
        model, x, y = _problem()
        guide = MeanFieldGuide(model)
        elbo, _ = _set_up(model, guide, x, y)
        assert fused_elbo(model, guide, elbo, None) is None


# --- fit ----------------------------------------------------------------------------------------


def _traced_only(monkeypatch):
    monkeypatch.setattr(training, "fused_elbo", lambda *args: None)


@pytest.mark.parametrize(
    ("guide", "reparam"), [("mean_field", None), ("mean_field", "flipout"), ("low_rank", "local")]
)
def test_fit_gives_the_same_history_and_parameters_fused_or_traced(monkeypatch, guide, reparam):
    def train():
        pyro.clear_param_store()
        model, _, _ = _problem("scale_mixture", "categorical")
        g = torch.Generator().manual_seed(3)
        x, y = torch.randn(N, 3, generator=g), torch.randint(0, 3, (N,), generator=g)
        q = GUIDES[guide](model)
        history = fit(
            model, q, x, y, epochs=3, batch_size=B, reparam=reparam, seed=4, progress=False
        )
        return history, {name: p.detach().clone() for name, p in q.named_parameters()}

    fused_history, fused_params = train()
    _traced_only(monkeypatch)
    traced_history, traced_params = train()
    for field in ("loss", "nll", "kl", "beta", "steps"):
        assert getattr(fused_history, field) == pytest.approx(
            getattr(traced_history, field), rel=1e-4
        )
    for name, value in traced_params.items():
        torch.testing.assert_close(fused_params[name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["resnet", "lstm"])
def test_fit_on_a_network_as_users_write_it_is_the_same_fused_or_traced(monkeypatch, name):
    def train():
        pyro.clear_param_store()
        torch.manual_seed(0)
        net, x, y, likelihood = _user_network(name)
        model = BNN(bayesianize(net), likelihood, num_data=B)
        q = MeanFieldGuide(model)
        history = fit(model, q, x, y, epochs=3, batch_size=5, seed=4, progress=False)
        return history, {name: p.detach().clone() for name, p in q.named_parameters()}

    fused_steps = []
    terms = FusedELBO.terms
    monkeypatch.setattr(FusedELBO, "terms", lambda *a, **k: fused_steps.append(1) or terms(*a, **k))
    fused_history, fused_params = train()
    assert len(fused_steps) >= 6  # fit took the fused path for every step
    _traced_only(monkeypatch)
    traced_history, traced_params = train()
    for field in ("loss", "nll", "kl"):
        assert getattr(fused_history, field) == pytest.approx(
            getattr(traced_history, field), rel=1e-4
        )
    for key, value in traced_params.items():
        torch.testing.assert_close(fused_params[key], value, rtol=1e-4, atol=1e-5)


# --- validation: once per fit -------------------------------------------------------------------


def test_validation_catches_a_bad_distribution_argument_before_the_first_step():
    model, x, y = _problem(likelihood="gaussian_fixed_2d")
    x, y = torch.randn(N, 3), torch.randn(N, 2)
    model.likelihood.scale.fill_(-1.0)  # a noise scale outside the support of Normal's scale
    with pyro.validation_enabled(True), pytest.raises(ValueError, match="scale"):
        fit(model, MeanFieldGuide(model), x, y, epochs=1, batch_size=B, progress=False)


def test_without_validation_a_bad_distribution_argument_is_still_stopped_as_a_nan():
    model, x, y = _problem(likelihood="gaussian_fixed_2d")
    x, y = torch.randn(N, 3), torch.randn(N, 2)
    model.likelihood.scale.fill_(-1.0)
    with pyro.validation_enabled(False), pytest.raises(FloatingPointError, match="'obs'"):
        fit(model, MeanFieldGuide(model), x, y, epochs=1, batch_size=B, progress=False)


def test_the_steps_do_not_validate_a_bad_argument_mid_training_stops_as_a_nan():
    """Validated once, before training: later the loss's finiteness check stops the fit."""
    model, _, _ = _problem(likelihood="gaussian_fixed_2d")
    x, y = torch.randn(N, 3), torch.randn(N, 2)

    class Negate(Callback):
        def on_epoch_end(self, epoch, history):
            if epoch == 0:
                model.likelihood.scale.fill_(-1.0)

    with pyro.validation_enabled(True), pytest.raises(FloatingPointError, match=r"epoch 1.*'obs'"):
        fit(model, MeanFieldGuide(model), x, y, epochs=3, batch_size=B, callbacks=[Negate()],
            progress=False)  # fmt: skip


def _autograd_nodes(tensor: torch.Tensor) -> set[str]:
    """The names of the autograd nodes ``tensor`` was computed through."""
    seen, stack, names = set(), [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack += [child for child, _ in node.next_functions]
    return names


def _mean_field_step(device: str, particles: int, prior=None) -> set[str]:
    """The autograd nodes of one fused mean-field step set up on ``device``."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(B, 3, generator=g).to(device), torch.randn(B, generator=g).to(device)
    net = mlp([3, 8, 1]) if prior is None else mlp([3, 8, 1], prior=prior)
    model = BNN(net, likelihoods.Gaussian(), N).to(device)
    guide = MeanFieldGuide(model)
    with pyro.validation_enabled(False):  # a meta tensor has no values to check
        guide(x, y)
        fused = fused_elbo(model, guide, AnnealedELBO(1.0, num_particles=particles), None)
        terms = fused.terms(x, y)
    assert terms.loss.device.type == device
    return _autograd_nodes(terms.loss)


@pytest.mark.parametrize("particles", [1, 3])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_mean_field_step_draws_every_site_in_one_node_on_any_device(device, particles):
    # on the meta device, as on a GPU, the prior's numbers are 0-d tensors on the device,
    # never read back: the one-node draw takes them there; and it takes a step's particles.
    # One draw on the CPU takes the guide's parameters packed in two buffers.
    nodes = _mean_field_step(device, particles)
    packed = device == "cpu" and particles == 1
    assert ("PackedMeanFieldBlockBackward" in nodes) is packed
    assert ("MeanFieldBlockBackward" in nodes) is not packed
    assert "AddcmulBackward0" not in nodes  # no site drawn by autograd beside it


def test_a_learnable_prior_scale_takes_the_site_by_site_path():
    # the block gives no gradient to a prior's numbers: a prior whose scale is learned is
    # drawn site by site, where autograd reaches it
    scale = torch.tensor(0.7, requires_grad=True)

    class Learned(Gaussian):
        cacheable = False

        def site_distribution(self, shape, *, fan_in, device, dtype):
            return (
                dist.Normal(torch.zeros((), device=device), scale)
                .expand(shape)
                .to_event(len(shape))
            )

    nodes = _mean_field_step("cpu", 1, prior=Learned())
    assert "MeanFieldBlockBackward" not in nodes
    assert "PackedMeanFieldBlockBackward" not in nodes


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("particles", [1, 3])
def test_a_mean_field_step_on_cuda_draws_every_site_in_one_node(particles):
    assert "MeanFieldBlockBackward" in _mean_field_step("cuda", particles)
