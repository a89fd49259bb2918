"""Tests of pyro_bbb.priors.matching: how a prior specification reaches each site."""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn

from pyro_bbb import bayesianize
from pyro_bbb.priors import FanInGaussian, Gaussian, ScaleMixture, resolve_prior


def _linear_net() -> nn.Module:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(3, 4)
            self.fc2 = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    return Net()


def test_resolve_prior_rejects_an_object_that_is_not_a_prior():
    with pytest.raises(ValueError, match=r"prior\['\*'\] must be a prior"):
        resolve_prior({"*": 1.0}, "fc1.weight")
    with pytest.raises(ValueError, match=r"prior must be a prior"):
        resolve_prior("gaussian", "fc1.weight")


@pytest.mark.parametrize("cls", [Gaussian, ScaleMixture, FanInGaussian])
def test_bayesianize_rejects_a_prior_class_instead_of_an_instance(cls):
    with pytest.raises(ValueError, match=r"prior must be a prior such as Gaussian\(1.0\)"):
        bayesianize(_linear_net(), cls)
    with pytest.raises(ValueError, match=r"prior\['\*'\] must be a prior"):
        bayesianize(_linear_net(), {"*": cls})


# --- per-site priors by pattern ------------------------------------------------------------


def test_prior_patterns_put_each_prior_on_its_sites():
    mixture = ScaleMixture(0.5, 1.0, 0.0025)
    net = bayesianize(_linear_net(), {"*.bias": Gaussian(10.0), "*": mixture})
    trace = pyro.poutine.trace(net).get_trace(torch.randn(5, 3))
    sites = {name: site["fn"] for name, site in trace.nodes.items() if site["type"] == "sample"}
    assert set(sites) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    for name in ("fc1.bias", "fc2.bias"):
        base = sites[name].base_dist
        assert isinstance(base, torch.distributions.Normal)
        torch.testing.assert_close(base.scale, torch.full_like(base.scale, 10.0))
    for name in ("fc1.weight", "fc2.weight"):
        base = sites[name].base_dist
        assert isinstance(base, ScaleMixture)
        assert base.pi.unique().tolist() == [0.5]
        assert base.sigma2.unique().tolist() == pytest.approx([0.0025])


def test_prior_patterns_first_match_wins_in_mapping_order():
    net = bayesianize(
        _linear_net(), {"fc1.*": Gaussian(3.0), "*.weight": Gaussian(0.5), "*": Gaussian(1.0)}
    )
    assert net.fc1.priors["weight"].scale == 3.0
    assert net.fc1.priors["bias"].scale == 3.0
    assert net.fc2.priors["weight"].scale == 0.5
    assert net.fc2.priors["bias"].scale == 1.0


def test_prior_patterns_without_a_match_raise_naming_the_site():
    with pytest.raises(ValueError, match=r"no pattern matches site 'fc2\.weight'"):
        bayesianize(_linear_net(), {"fc1.*": Gaussian(1.0)})


def test_default_prior_is_a_unit_gaussian_on_every_site():
    net = bayesianize(_linear_net())
    for layer in (net.fc1, net.fc2):
        for param in ("weight", "bias"):
            scale = layer.prior_distribution(param).base_dist.scale
            torch.testing.assert_close(scale, torch.ones_like(scale))
