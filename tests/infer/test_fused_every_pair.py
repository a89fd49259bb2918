"""Every guide, prior and estimator the package offers: the fused ELBO equals the traced one.

:mod:`pyro_bbb.infer.fused` computes the objective of the traced :class:`AnnealedELBO` a second
time, without traces, for the guides and priors it knows, and the two must stay in step. This
test takes its pairs from the package itself: every guide ``pyro_bbb`` exports, alone and as
an :class:`Ensemble`'s members; every prior family of :mod:`pyro_bbb.priors.families` and a
trained guide's posterior as the next prior (:func:`~pyro_bbb.priors.from_guide`, for every
guide that has one); every estimator name. So a guide, prior or estimator added to the package
is enumerated here without anyone listing it. Where the fused path takes a triple, its loss,
parts and every gradient must equal the traced path's at the same random state, with one
particle and with two; where it declines one, :func:`fit` traces its steps, and the table below
says which it declines and why. A new kind needs a way to be built here (the completeness tests
say so) and its place in the table.
"""

from __future__ import annotations

import inspect

import pyro
import pytest
import torch
from pyro.infer.autoguide import AutoGuide

import pyro_bbb
from pyro_bbb import BNN, LowRankGuide, LowRankPrecisionGuide, MeanFieldGuide, likelihoods, mlp
from pyro_bbb.infer import AnnealedELBO, Ensemble
from pyro_bbb.infer.fused import fused_elbo
from pyro_bbb.infer.reparam import estimator_names
from pyro_bbb.priors import FanInGaussian, Gaussian, ScaleMixture, families, from_guide

from .test_fused import _compare

N, B = 40, 10
SIZES = [3, 6, 5, 1]

#: Every guide class the package exports.
GUIDES = sorted(
    (
        obj
        for name in pyro_bbb.__all__
        if inspect.isclass(obj := getattr(pyro_bbb, name)) and issubclass(obj, AutoGuide)
    ),
    key=lambda cls: cls.__name__,
)
#: Every prior family.
FAMILIES = sorted(
    (getattr(families, name) for name in families.__all__ if name != "Prior"),
    key=lambda cls: cls.__name__,
)

#: How each guide is built here: its forms by label (a low-rank guide has two block layouts).
GUIDE_FORMS = {
    "DeltaGuide": lambda model: pyro_bbb.DeltaGuide(model),
    "LowRankGuide": lambda model: LowRankGuide(model, rank=2, init_scale=0.1),
    "LowRankGuide(blocks='network')": lambda model: LowRankGuide(model, rank=3, blocks="network"),
    "LowRankPrecisionGuide": lambda model: LowRankPrecisionGuide(model, rank=2),
    "MeanFieldGuide": lambda model: MeanFieldGuide(model, init_scale=0.1),
}
#: How each prior family is built here.
FAMILY_FORMS = {
    "FanInGaussian": lambda: FanInGaussian(1.5),
    "Gaussian": lambda: Gaussian(1.0, loc=0.1),
    "ScaleMixture": lambda: ScaleMixture(0.5, 1.0, 0.05),
}

# --- what the fused path takes -------------------------------------------------------------------
#: The guides it computes, alone or as an Ensemble's members.
FUSED_GUIDES = (MeanFieldGuide, LowRankGuide)
#: Guides that refuse a prior at set-up (the online filters' belief needs Gaussian priors with
#: independent values).
REFUSED = {
    ("LowRankPrecisionGuide", "ScaleMixture"),
    ("LowRankPrecisionGuide", "from_guide(LowRankGuide)"),
    ("LowRankPrecisionGuide", "from_guide(LowRankPrecisionGuide)"),
}

#: Guides an Ensemble does not take as members (it takes the guides drawn site by site).
NOT_MEMBERS = {"LowRankPrecisionGuide"}


def _declined_by_the_prior(guide_cls: type, prior: str) -> bool:
    """Priors the fused path declines, and the traced path computes.

    A posterior carried from a guide with low-rank blocks ties each site to the others of its
    block (a conditional given them); a mean-field guide's posterior is a Gaussian per weight,
    which the low-rank fused path declines (it takes one number per site).
    """
    if prior in ("from_guide(LowRankGuide)", "from_guide(LowRankPrecisionGuide)"):
        return True
    return prior == "from_guide(MeanFieldGuide)" and guide_cls is LowRankGuide


def _posterior_sources() -> list[str]:
    """The guides whose trained posterior can be the next prior (from_guide accepts them)."""
    found = []
    for label, make in GUIDE_FORMS.items():
        if "(" in label:  # one form per class is enough to ask
            continue
        model, x, y = _problem(Gaussian(1.0))
        guide = make(model)
        guide(x, y)
        try:
            from_guide(guide)
        except TypeError:
            continue
        found.append(label)
    return found


def _problem(prior):
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = BNN(mlp(SIZES, prior=prior), likelihoods.Gaussian(), num_data=N)
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(B, SIZES[0], generator=g), torch.randn(B, generator=g)


def _prior(label: str):
    """The prior of ``label``: a family's, or a set-up guide's posterior."""
    if not label.startswith("from_guide("):
        return FAMILY_FORMS[label]()
    source = label.removeprefix("from_guide(").removesuffix(")")
    model, x, y = _problem(Gaussian(1.0))
    guide = GUIDE_FORMS[source](model)
    guide(x, y)
    return from_guide(guide)


PRIORS = [*FAMILY_FORMS, *(f"from_guide({source})" for source in _posterior_sources())]
CASES = [
    (guide, members, prior, reparam)
    for guide in GUIDE_FORMS
    for members in (False, True)
    for prior in PRIORS
    for reparam in estimator_names()
]


def test_every_exported_guide_and_prior_family_has_a_way_to_be_built_here():
    built = {label.split("(")[0] for label in GUIDE_FORMS}
    missing = sorted({cls.__name__ for cls in GUIDES} - built)
    assert not missing, f"add {missing} to GUIDE_FORMS, and to FUSED_GUIDES if fused"
    missing = sorted({cls.__name__ for cls in FAMILIES} - set(FAMILY_FORMS))
    assert not missing, f"add {missing} to FAMILY_FORMS"
    assert "from_guide(MeanFieldGuide)" in PRIORS and "from_guide(LowRankGuide)" in PRIORS


@pytest.mark.parametrize(
    ("guide", "members", "prior", "reparam"),
    CASES,
    ids=[f"{'Ensemble of ' if m else ''}{g}-{p}-{r}" for g, m, p, r in CASES],
)
def test_the_fused_elbo_equals_the_traced_one_or_declines(guide, members, prior, reparam):
    model, x, y = _problem(_prior(prior))
    make = GUIDE_FORMS[guide]
    cls = type(make(model))
    if (guide.split("(")[0], prior) in REFUSED:
        with pytest.raises(ValueError, match="Gaussian"):
            make(model)(x, y)
        return
    if members and guide in NOT_MEMBERS:
        with pytest.raises(TypeError, match=f"got {guide}"):
            Ensemble(model, make, k=2)
        return
    pyro.clear_param_store()
    for particles in (1, 2):
        elbo = AnnealedELBO(0.7, num_particles=particles)
        built = Ensemble(model, make, k=2) if members else make(model)
        fused = cls in FUSED_GUIDES and not _declined_by_the_prior(cls, prior)
        if fused:
            _compare(model, built, x, y, reparam, num_particles=particles)
        else:
            elbo.terms(model, built, x, y)  # sets it up, as fit does before asking
            assert fused_elbo(model, built, elbo, reparam) is None
        pyro.clear_param_store()
