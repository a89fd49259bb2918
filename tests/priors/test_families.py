"""Tests of pyro_bbb.priors.families: the prior families, their densities and checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pyro_bbb import bayesianize
from pyro_bbb.priors import FanInGaussian, Gaussian, ScaleMixture

from ..support import scaled


def _normal_log_pdf(w: float, scale: float) -> float:
    """log N(w; 0, scale²) in float64."""
    return -0.5 * math.log(2 * math.pi) - math.log(scale) - 0.5 * (w / scale) ** 2


def _mixture_log_pdf(w: float, pi: float, sigma1: float, sigma2: float) -> float:
    """log(pi N(w; 0, s1²) + (1 - pi) N(w; 0, s2²)) in float64, by logaddexp."""
    return float(
        np.logaddexp(
            math.log(pi) + _normal_log_pdf(w, sigma1),
            math.log1p(-pi) + _normal_log_pdf(w, sigma2),
        )
    )


def _mixture_cdf(w: torch.Tensor, pi: float, sigma1: float, sigma2: float) -> torch.Tensor:
    def phi(z):
        return 0.5 * (1 + torch.erf(z / math.sqrt(2)))

    return pi * phi(w / sigma1) + (1 - pi) * phi(w / sigma2)


# --- ScaleMixture.log_prob ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pi", "sigma1", "sigma2"),
    [(0.5, 1.0, 0.0025), (0.25, 1.0, math.exp(-8)), (0.75, math.exp(-1), math.exp(-7))],
)
@pytest.mark.parametrize("w", [0.0, 1e-4, -0.003, 0.5, -2.0, 10.0, -10.0])
def test_scale_mixture_log_prob_matches_float64_mixture_density(pi, sigma1, sigma2, w):
    prior = ScaleMixture(pi, sigma1, sigma2)
    got = prior.log_prob(torch.tensor(w)).item()
    expected = _mixture_log_pdf(w, pi, sigma1, sigma2)
    assert math.isfinite(got)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-4)


def test_scale_mixture_log_prob_is_finite_at_tiny_sigma2_and_far_tails():
    sigma2 = math.exp(-8)
    prior = ScaleMixture(0.5, 1.0, sigma2)
    w = torch.tensor([10.0, -10.0, 1e3])
    got = prior.log_prob(w)
    assert torch.isfinite(got).all()
    expected = [_mixture_log_pdf(v, 0.5, 1.0, sigma2) for v in w.tolist()]
    assert got.tolist() == pytest.approx(expected, rel=1e-5)
    # summing densities before the log would underflow to log(0) here
    assert math.exp(_normal_log_pdf(10.0, sigma2)) == 0.0


def test_scale_mixture_log_prob_in_float64_matches_to_double_precision():
    pi, sigma1, sigma2 = 0.3, 1.5, math.exp(-8)
    prior = ScaleMixture(
        torch.tensor(pi, dtype=torch.float64),
        torch.tensor(sigma1, dtype=torch.float64),
        torch.tensor(sigma2, dtype=torch.float64),
    )
    w = torch.linspace(-10, 10, 41, dtype=torch.float64)
    got = prior.log_prob(w)
    assert got.dtype == torch.float64
    expected = [_mixture_log_pdf(v, pi, sigma1, sigma2) for v in w.tolist()]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    w=st.floats(-1e3, 1e3),
    pi=st.floats(1e-4, 1 - 1e-4),
    log_sigma1=st.floats(-10.0, 3.0),
    log_sigma2=st.floats(-10.0, 3.0),
)
def test_scale_mixture_log_prob_is_finite_and_between_component_bounds(
    w, pi, log_sigma1, log_sigma2
):
    sigma1, sigma2 = math.exp(log_sigma1), math.exp(log_sigma2)
    as64 = {"dtype": torch.float64}
    prior = ScaleMixture(
        torch.tensor(pi, **as64), torch.tensor(sigma1, **as64), torch.tensor(sigma2, **as64)
    )
    got = prior.log_prob(torch.tensor(w, **as64)).item()
    assert math.isfinite(got)
    log_n1, log_n2 = _normal_log_pdf(w, sigma1), _normal_log_pdf(w, sigma2)
    # a convex combination of two densities lies below the larger one...
    upper = max(log_n1, log_n2)
    # ...and above each weighted component
    lower = max(math.log(pi) + log_n1, math.log1p(-pi) + log_n2)
    # ...and no density exceeds the peak of its narrowest component
    peak = -0.5 * math.log(2 * math.pi) - math.log(min(sigma1, sigma2))
    tol = 1e-9 * max(1.0, abs(upper))
    assert lower - tol <= got <= upper + tol
    assert got <= peak + 1e-9
    # the float32 path (the default dtype) is finite too
    got32 = ScaleMixture(pi, sigma1, sigma2).log_prob(torch.tensor(w)).item()
    assert math.isfinite(got32)


# --- ScaleMixture.sample --------------------------------------------------------------------


def test_scale_mixture_samples_have_mixture_mean_variance_and_cdf():
    pi, sigma1, sigma2 = 0.3, 2.0, 0.1
    n = scaled(200_000, 2_000_000)
    w = ScaleMixture(pi, sigma1, sigma2).sample((n,)).double()
    assert w.shape == (n,)
    variance = pi * sigma1**2 + (1 - pi) * sigma2**2
    fourth = 3 * (pi * sigma1**4 + (1 - pi) * sigma2**4)
    mean_se = math.sqrt(variance / n)
    var_se = math.sqrt((fourth - variance**2) / n)
    assert abs(w.mean().item()) < 5 * mean_se
    assert abs(w.pow(2).mean().item() - variance) < 5 * var_se
    # Kolmogorov–Smirnov distance to the mixture CDF, against the 0.1% critical value
    sorted_w = w.sort().values
    cdf = _mixture_cdf(sorted_w, pi, sigma1, sigma2)
    ecdf_hi = torch.arange(1, n + 1, dtype=torch.float64) / n
    ecdf_lo = torch.arange(0, n, dtype=torch.float64) / n
    ks = torch.maximum((ecdf_hi - cdf).abs(), (cdf - ecdf_lo).abs()).max().item()
    assert ks < 1.95 / math.sqrt(n)


def test_scale_mixture_mean_and_variance_properties_match_closed_form():
    prior = ScaleMixture(torch.tensor([0.2, 0.6]), 1.5, 0.01)
    assert prior.mean.tolist() == [0.0, 0.0]
    expected = [p * 1.5**2 + (1 - p) * 0.01**2 for p in (0.2, 0.6)]
    assert prior.variance.tolist() == pytest.approx(expected)


# --- shapes --------------------------------------------------------------------------------


def test_scale_mixture_batch_shape_broadcasts_its_arguments():
    prior = ScaleMixture(torch.tensor([0.2, 0.5, 0.8]), 1.0, torch.tensor([[0.1], [0.01]]))
    assert prior.batch_shape == (2, 3)
    assert prior.event_shape == ()
    assert prior.sample().shape == (2, 3)
    assert prior.sample((4,)).shape == (4, 2, 3)
    assert prior.log_prob(torch.zeros(2, 3)).shape == (2, 3)
    assert prior.log_prob(torch.zeros(5, 1, 1)).shape == (5, 2, 3)


def test_scale_mixture_expand_keeps_parameters_and_log_prob():
    prior = ScaleMixture(torch.tensor([0.2, 0.7]), 1.0, 0.05)
    expanded = prior.expand((3, 2))
    assert isinstance(expanded, ScaleMixture)
    assert expanded.batch_shape == (3, 2)
    assert expanded.sample((4,)).shape == (4, 3, 2)
    w = torch.randn(3, 2)
    torch.testing.assert_close(expanded.log_prob(w), prior.log_prob(w))
    assert expanded.variance.shape == (3, 2)


def test_scale_mixture_site_distribution_is_one_event_of_the_site_shape():
    prior = ScaleMixture(0.4, 1.0, 0.01)
    site = prior.site_distribution(
        torch.Size([3, 4]), fan_in=4, device=torch.device("cpu"), dtype=torch.float64
    )
    assert site.batch_shape == ()
    assert site.event_shape == (3, 4)
    w = torch.randn(3, 4, dtype=torch.float64)
    log_p = site.log_prob(w)
    assert log_p.dtype == torch.float64
    expected = sum(_mixture_log_pdf(v, 0.4, 1.0, 0.01) for v in w.flatten().tolist())
    # the hyperparameters are held as float32 tensors, so agreement is to float32 rounding
    assert log_p.item() == pytest.approx(expected, rel=1e-6)
    assert site.sample((2,)).shape == (2, 3, 4)


def test_gaussian_site_distribution_has_the_site_shape_dtype_and_scale():
    site = Gaussian(2.5, loc=1.0).site_distribution(
        torch.Size([2, 5]), fan_in=5, device=torch.device("cpu"), dtype=torch.float64
    )
    assert site.event_shape == (2, 5)
    assert site.batch_shape == ()
    w = torch.zeros(2, 5, dtype=torch.float64)
    expected = 10 * (-0.5 * math.log(2 * math.pi) - math.log(2.5) - 0.5 * (1 / 2.5) ** 2)
    assert site.log_prob(w).item() == pytest.approx(expected, rel=1e-12)


# --- argument checks -----------------------------------------------------------------------


@pytest.mark.parametrize("pi", [0, 0.0, 1, 1.0, 1.5, -0.1, math.nan])
def test_scale_mixture_rejects_pi_outside_open_unit_interval(pi):
    with pytest.raises(ValueError, match=r"pi must be in \(0, 1\)"):
        ScaleMixture(pi, 1.0, 0.1)


@pytest.mark.parametrize("name", ["sigma1", "sigma2"])
@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan])
def test_scale_mixture_rejects_non_positive_sigma_naming_it(name, value):
    kwargs = {"pi": 0.5, "sigma1": 1.0, "sigma2": 0.1, name: value}
    with pytest.raises(ValueError, match=rf"{name} must be positive"):
        ScaleMixture(**kwargs)


@pytest.mark.parametrize("pi", [1.5, -0.1])
def test_scale_mixture_rejects_tensor_pi_outside_unit_interval_under_validation(pi):
    with pytest.raises(ValueError, match=r"pi"):
        ScaleMixture(torch.tensor(pi), 1.0, 0.1, validate_args=True)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, math.nan])
def test_gaussian_prior_rejects_non_positive_scale(scale):
    with pytest.raises(ValueError, match=r"scale must be a positive finite number"):
        Gaussian(scale)


@pytest.mark.parametrize("gain", [0.0, -2.0])
def test_fan_in_gaussian_rejects_non_positive_gain(gain):
    with pytest.raises(ValueError, match=r"gain must be a positive finite number"):
        FanInGaussian(gain)


# --- FanInGaussian through bayesianize -----------------------------------------------------


def _prior_scale(layer, param: str) -> torch.Tensor:
    return layer.prior_distribution(param).base_dist.scale


@pytest.mark.parametrize("gain", [1.0, math.sqrt(2)])
def test_fan_in_gaussian_scale_is_gain_over_sqrt_in_features_for_linear(gain):
    net = bayesianize(nn.Sequential(nn.Linear(7, 3)), FanInGaussian(gain))
    for param in ("weight", "bias"):
        scale = _prior_scale(net[0], param)
        torch.testing.assert_close(scale, torch.full_like(scale, gain / math.sqrt(7)))
    assert net[0].prior_distribution("weight").event_shape == (3, 7)


def test_fan_in_gaussian_scale_counts_channels_per_group_and_kernel_for_conv2d():
    conv = nn.Conv2d(6, 4, kernel_size=(3, 5), groups=2)
    net = bayesianize(nn.Sequential(conv), FanInGaussian(2.0))
    fan_in = (6 // 2) * 3 * 5
    for param in ("weight", "bias"):
        scale = _prior_scale(net[0], param)
        torch.testing.assert_close(scale, torch.full_like(scale, 2.0 / math.sqrt(fan_in)))
    assert net[0].prior_distribution("weight").event_shape == (4, 3, 3, 5)


def test_fan_in_gaussian_rejects_zero_fan_in():
    with pytest.raises(ValueError, match=r"fan_in must be a positive int"):
        FanInGaussian().site_distribution(
            torch.Size([2]), fan_in=0, device=torch.device("cpu"), dtype=torch.float32
        )


@pytest.mark.parametrize("pi", [torch.tensor(0.0), torch.tensor(1.0), torch.tensor([0.3, 1.0])])
def test_scale_mixture_refuses_tensor_pi_at_the_ends_of_the_interval(pi):
    with pytest.raises(ValueError, match="pi must be in"):
        ScaleMixture(pi, 1.0, 0.1)
