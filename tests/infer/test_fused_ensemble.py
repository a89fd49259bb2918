"""The fused ELBO of an Ensemble of Gaussian members equals the traced one; others decline.

As in ``test_fused.py``: both paths consume torch's random stream in the same order, so after
the same seed the fused terms and the traced ``AnnealedELBO.terms`` (the model in the member
plate) see the same weights, pre-activation noise and signs, and their losses and gradients
agree to float rounding.
"""

from __future__ import annotations

import pyro
import pytest
import torch

import pyro_bbb.training.objective as training
from pyro_bbb import BNN, DeltaGuide, LowRankGuide, MeanFieldGuide, fit, likelihoods, mlp
from pyro_bbb.infer import AnnealedELBO, Ensemble
from pyro_bbb.infer import fused as fused_module
from pyro_bbb.infer.fused import fused_elbo
from pyro_bbb.priors import Gaussian, ScaleMixture

from .test_fused import _compare

N, B = 40, 10

PRIORS = {
    "gaussian": lambda: Gaussian(1.0, loc=0.1),
    "scale_mixture": lambda: ScaleMixture(0.5, 1.0, 0.05),  # Monte Carlo KL
}
LIKELIHOODS = {  # name -> (likelihood, output width, targets of a batch)
    "gaussian": (lambda: likelihoods.Gaussian(), 1, lambda g: torch.randn(B, generator=g)),
    "categorical": (
        lambda: likelihoods.Categorical(),
        3,
        lambda g: torch.randint(0, 3, (B,), generator=g),
    ),
}


def _problem(prior="gaussian", likelihood="gaussian", k=3, family=None):
    pyro.clear_param_store()
    make, width, targets = LIKELIHOODS[likelihood]
    torch.manual_seed(0)
    model = BNN(mlp([3, 6, 5, width], prior=PRIORS[prior]()), make(), num_data=N)
    family = family or (lambda m: MeanFieldGuide(m, init_scale=0.1))
    g = torch.Generator().manual_seed(1)
    return model, Ensemble(model, family, k=k), torch.randn(B, 3, generator=g), targets(g)


FAMILIES = {
    "mean_field": lambda m: MeanFieldGuide(m, init_scale=0.1),
    "low_rank": lambda m: LowRankGuide(m, rank=2, init_scale=0.1),
    "low_rank_network": lambda m: LowRankGuide(m, rank=3, blocks="network"),
}


@pytest.mark.parametrize("num_particles", [1, 2])
@pytest.mark.parametrize("reparam", [None, "local", "flipout"])
@pytest.mark.parametrize("likelihood", list(LIKELIHOODS))
@pytest.mark.parametrize("prior", list(PRIORS))
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_terms_of_members_equal_the_traced_elbo(
    family, k, prior, likelihood, reparam, num_particles
):
    model, ensemble, x, y = _problem(prior, likelihood, k, FAMILIES[family])
    _compare(model, ensemble, x, y, reparam, num_particles=num_particles)


@pytest.mark.parametrize("reparam", [None, "local"])
def test_large_low_rank_blocks_of_members_one_at_a_time_equal_the_traced_elbo(monkeypatch, reparam):
    """Blocks past ``_PER_MEMBER_NUMBERS`` take the per-member Function: the same terms."""
    monkeypatch.setattr(fused_module, "_PER_MEMBER_NUMBERS", 1)
    model, ensemble, x, y = _problem("gaussian", "categorical", 3, FAMILIES["low_rank"])
    _compare(model, ensemble, x, y, reparam, num_particles=2)


def test_the_fused_objective_is_the_sum_of_the_members_own():
    """Each member's KL is its own: the fused KL is the sum of K single guides' KLs."""
    model, ensemble, x, y = _problem("gaussian", k=3)
    elbo = AnnealedELBO(1.0)
    elbo.terms(model, ensemble, x, y)
    kl = fused_elbo(model, ensemble, elbo, None).terms(x, y).kl
    members = []
    for j in range(3):
        single = MeanFieldGuide(model, name=f"member{j}")
        single(x, y)
        with torch.no_grad():
            for part in ("locs", "rhos"):
                for name, value in getattr(single, part).named_parameters():
                    site = name.removesuffix("_unconstrained")
                    whole = dict(getattr(ensemble.members, part).named_parameters())[name]
                    value.copy_(whole[j, 0])
                    assert value.shape == single.median()[site].shape
        members.append(fused_elbo(model, single, AnnealedELBO(1.0), None).terms(x, y).kl)
    torch.testing.assert_close(kl, sum(members))


# --- where the fused path is not taken ------------------------------------------------------


def test_fused_path_declines_point_mass_members():
    model, ensemble, x, y = _problem(family=DeltaGuide)
    elbo = AnnealedELBO(1.0)
    elbo.terms(model, ensemble, x, y)
    assert fused_elbo(model, ensemble, elbo, None) is None


def test_fused_path_declines_an_elbo_whose_particle_plate_is_elsewhere():
    model, ensemble, x, y = _problem()
    elbo = AnnealedELBO(1.0, num_particles=2, max_plate_nesting=4)
    elbo.terms(model, ensemble, x, y)
    assert fused_elbo(model, ensemble, elbo, None) is None


# --- fit ----------------------------------------------------------------------------------------


def _spy(monkeypatch):
    """Record what ``fit`` chose: the fused evaluation or ``None`` (traced)."""
    chosen = []
    choose = training._fused

    def spy(*args):
        chosen.append(choose(*args))
        return chosen[-1]

    monkeypatch.setattr(training, "_fused", spy)
    return chosen


def _train(family, reparam=None):
    model, ensemble, _, _ = _problem("scale_mixture", "categorical", k=2, family=family)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(N, 3, generator=g), torch.randint(0, 3, (N,), generator=g)
    history = fit(
        model, ensemble, x, y, epochs=3, batch_size=B, reparam=reparam, num_particles=2,
        seed=4, progress=False,
    )  # fmt: skip
    return history, {name: p.detach().clone() for name, p in ensemble.named_parameters()}


@pytest.mark.parametrize(
    ("family", "reparam"), [("mean_field", None), ("mean_field", "flipout"), ("low_rank", "local")]
)
def test_fit_of_members_is_fused_and_gives_the_traced_history(monkeypatch, family, reparam):
    chosen = _spy(monkeypatch)
    fused_history, fused_params = _train(FAMILIES[family], reparam)
    assert len(chosen) == 1 and chosen[0] is not None
    monkeypatch.setattr(training, "fused_elbo", lambda *args: None)
    traced_history, traced_params = _train(FAMILIES[family], reparam)
    assert chosen[1] is None
    for field in ("loss", "nll", "kl", "beta", "steps"):
        assert getattr(fused_history, field) == pytest.approx(
            getattr(traced_history, field), rel=1e-4
        )
    for name, value in traced_params.items():
        torch.testing.assert_close(fused_params[name], value, rtol=1e-4, atol=1e-5)


def test_fit_of_point_mass_members_stays_traced(monkeypatch):
    chosen = _spy(monkeypatch)
    _train(DeltaGuide)
    assert chosen == [None]
