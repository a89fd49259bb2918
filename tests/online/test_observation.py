"""The likelihood's gradient and curvature root, against autograd."""

from __future__ import annotations

import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb.online.observation import Observation


def _check_terms(likelihood, output, target):
    terms = Observation(likelihood).cotangents()(output, target)
    root, gradient = terms[:, :-1], terms[:, -1]

    def log_p(out):
        return likelihood.log_prob(out.unsqueeze(0), target.unsqueeze(0)).sum()

    torch.testing.assert_close(gradient, torch.func.grad(log_p)(output))
    hessian = torch.autograd.functional.hessian(log_p, output)
    torch.testing.assert_close(root @ root.T, -hessian)


def test_gaussian_terms_are_the_log_density_s_derivatives():
    output = torch.tensor([0.3, -1.2], dtype=torch.float64)
    _check_terms(bbb.likelihoods.Gaussian(0.7).double(), output, torch.tensor([1.0, 0.5]).double())


def test_categorical_terms_are_the_log_density_s_derivatives():
    output = torch.tensor([0.3, -1.2, 2.0, 0.1], dtype=torch.float64)
    _check_terms(bbb.likelihoods.Categorical(), output, torch.tensor(2))


def test_bernoulli_terms_are_the_log_density_s_derivatives():
    output = torch.tensor([0.3, -1.2], dtype=torch.float64)
    _check_terms(bbb.likelihoods.Bernoulli(), output, torch.tensor([1.0, 0.0]).double())


def test_unsupported_likelihoods_are_refused():
    with pytest.raises(NotImplementedError, match="heteroscedastic"):
        Observation(bbb.likelihoods.Gaussian(heteroscedastic=True))
    assert Observation(bbb.likelihoods.Gaussian()).learned_scale
    assert not Observation(bbb.likelihoods.Gaussian(0.1)).learned_scale
