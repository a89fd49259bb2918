"""The exported JAX potential equals the torch potential, value and gradient, in float64.

Each case builds a float64 model, lays it out as ``run_nuts`` does, and compares
:func:`~pyro_bbb.infer.mcmc.export.export_potential` with the torch
:class:`~pyro_bbb.infer.mcmc.potential.Potential` at random points: every supported layer,
activation, prior and likelihood, a sampled noise scale under each kind of support.
"""

from __future__ import annotations

import numpy as np
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.infer.mcmc.potential import THETA, Potential, flat_layout
from pyro_bbb.nn.builders import _ACTIVATIONS
from pyro_bbb.priors import FanInGaussian, Gaussian, ScaleMixture

from ...support import requires_numpyro

pytestmark = requires_numpyro

RTOL = 1e-8


def potentials(model, x, y, noise=None):
    """``(torch U, JAX U)`` of a model, both over the same flat vector."""
    from pyro_bbb.infer.mcmc._jax import jax
    from pyro_bbb.infer.mcmc.export import export_potential

    model(x, y)  # names the sites
    sites, noise_name, noise_value = flat_layout(model, x, y, noise)
    torch_u = Potential(model, x, y, sites, noise_name, noise_value, jit=False)
    with jax.enable_x64(True):
        jax_u = export_potential(model, x, y, sites, noise_value)
    return torch_u, jax_u, sites[-1].stop


def assert_potentials_agree(model, x, y, noise=None, num_points=3, spread=0.7):
    from pyro_bbb.infer.mcmc._jax import jax, jnp

    torch_u, jax_u, dim = potentials(model, x, y, noise)
    g = torch.Generator().manual_seed(1)
    with jax.enable_x64(True):
        value_and_grad = jax.jit(jax.value_and_grad(jax_u))
        for _ in range(num_points):
            theta = (spread * torch.randn(dim, generator=g, dtype=torch.float64)).requires_grad_()
            expected = torch_u({THETA: theta})
            (expected_grad,) = torch.autograd.grad(expected, theta)
            value, grad = value_and_grad(jnp.asarray(theta.detach().numpy()))
            assert float(value) == pytest.approx(float(expected.detach()), rel=RTOL)
            scale = float(expected_grad.abs().max())
            np.testing.assert_allclose(
                np.asarray(grad), expected_grad.numpy(), rtol=RTOL, atol=RTOL * scale
            )


def regression_data(num=25, features=2, outputs=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num, features, generator=g, dtype=torch.float64)
    y = torch.randn(num, outputs, generator=g, dtype=torch.float64)
    return x, y.squeeze(-1) if outputs == 1 else y


def bnn(net, likelihood, num_data, **kwargs):
    return bbb.BNN(net.double(), likelihood.double(), num_data=num_data, **kwargs)


@pytest.mark.parametrize("activation", sorted(_ACTIVATIONS))
def test_every_mlp_activation_exports_exactly(activation):
    x, y = regression_data()
    net = bbb.mlp([2, 6, 5, 1], activation=activation)
    assert_potentials_agree(bnn(net, bbb.likelihoods.Gaussian(scale=0.3), len(x)), x, y)


@pytest.mark.parametrize(
    "prior",
    [
        Gaussian(0.7, loc=0.2),
        ScaleMixture(0.3, 1.5, 0.1),
        FanInGaussian(1.3),
        {"0.*": ScaleMixture(0.5, 1.0, 0.05), "*.bias": Gaussian(2.0), "*": FanInGaussian()},
    ],
    ids=["gaussian", "scale_mixture", "fan_in", "per_site"],
)
def test_every_prior_exports_exactly(prior):
    x, y = regression_data()
    net = bbb.mlp([2, 6, 1], activation="tanh", prior=prior)
    assert_potentials_agree(bnn(net, bbb.likelihoods.Gaussian(scale=0.3), len(x)), x, y)


@pytest.mark.parametrize(
    "noise",
    [
        "fixed",
        dist.LogNormal(torch.tensor(-1.0, dtype=torch.float64), 0.5),
        dist.HalfCauchy(torch.tensor(1.0, dtype=torch.float64)),
        dist.Gamma(torch.tensor(2.0, dtype=torch.float64), 3.0),
        dist.Uniform(torch.tensor(0.05, dtype=torch.float64), 2.0),
    ],
    ids=["fixed", "lognormal", "halfcauchy", "gamma", "uniform"],
)
def test_a_learned_noise_fixed_or_sampled_exports_exactly(noise):
    x, y = regression_data()
    likelihood = bbb.likelihoods.Gaussian(init_scale=0.4)
    assert_potentials_agree(bnn(bbb.mlp([2, 6, 1]), likelihood, len(x)), x, y, noise=noise)


@pytest.mark.parametrize(
    ("outputs", "likelihood", "labels"),
    [
        (1, bbb.likelihoods.Gaussian(scale=0.2), None),
        (3, bbb.likelihoods.Gaussian(scale=0.2), None),
        (2, bbb.likelihoods.Gaussian(heteroscedastic=True), None),
        (4, bbb.likelihoods.Gaussian(heteroscedastic=True), None),
        (3, bbb.likelihoods.Categorical(), "categorical"),
        (1, bbb.likelihoods.Bernoulli(), "binary"),
        (3, bbb.likelihoods.Bernoulli(), "binary"),
    ],
    ids=["gaussian", "gaussian_3d", "heteroscedastic", "heteroscedastic_2d", "categorical",
         "bernoulli", "bernoulli_multilabel"],
)  # fmt: skip
def test_every_likelihood_exports_exactly(outputs, likelihood, labels):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 2, generator=g, dtype=torch.float64)
    net = bbb.mlp([2, 5, outputs], activation="tanh")
    if labels == "categorical":
        y = torch.randint(0, outputs, (30,), generator=g)
    elif labels == "binary":
        y = torch.randint(0, 2, (30, outputs), generator=g).double().squeeze(-1)
    else:
        width = outputs // 2 if likelihood.heteroscedastic else outputs
        y = torch.randn(30, width, generator=g, dtype=torch.float64).squeeze(-1)
    assert_potentials_agree(bnn(net, likelihood, len(x)), x, y)


def image_data(num=6, channels=2, size=8, classes=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(num, channels, size, size, generator=g, dtype=torch.float64)
    return x, torch.randint(0, classes, (num,), generator=g)


@pytest.mark.parametrize(
    "layers",
    [
        [nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(-3),
         nn.Linear(64, 3)],
        [nn.Conv2d(2, 4, 3, stride=2, padding="valid", bias=False), nn.Tanh(),
         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3), nn.LogSoftmax(dim=-1)],
        [nn.Conv2d(2, 4, 4, padding="same", dilation=2), nn.SiLU(),
         nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), nn.Flatten(),
         nn.Linear(64, 3)],
        [nn.Conv2d(2, 4, 3, groups=2, padding=(1, 2)), nn.ELU(),
         nn.AvgPool2d(2), nn.MaxPool2d(3, stride=1, padding=1, dilation=1),
         nn.AdaptiveMaxPool2d((2, 1)), nn.Flatten(), nn.Linear(8, 3)],
        [nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.GELU(), nn.Dropout2d(0.3), nn.Flatten(),
         nn.LayerNorm(108), nn.Linear(108, 3)],
    ],
    ids=["conv_maxpool", "strided_adaptive_avg", "same_dilated_avgpool", "grouped_pools",
         "batchnorm_layernorm_dropout_eval"],
)  # fmt: skip
def test_conv_pooling_and_normalisation_export_exactly(layers):
    x, y = image_data()
    net = bbb.bayesianize(nn.Sequential(*layers), ScaleMixture(0.5, 1.0, 0.1))
    for module in net.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    model = bnn(net, bbb.likelihoods.Categorical(), len(x))
    model.eval()
    assert_potentials_agree(model, x, y, spread=0.3)


class Residual(nn.Module):
    """A forward only torch.fx can read: functional ops, a residual sum, reshapes."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 6)
        self.hidden = nn.Linear(6, 6)
        self.out = nn.Linear(6, 2)
        self.gain = nn.Parameter(torch.tensor(0.7))

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = h + self.gain * F.softplus(self.hidden(h), beta=2.0)
        h = F.leaky_relu(h, 0.2).reshape(x.shape[0], -1)
        return self.out(h.view(x.size(0), 6) - 0.5)


def test_a_traced_custom_forward_with_deterministic_parameters_exports_exactly():
    x, y = regression_data(features=3, outputs=2)
    net = bbb.bayesianize(Residual(), deterministic=["out.bias", "gain"])
    model = bnn(net, bbb.likelihoods.Gaussian(scale=0.5), len(x), name="b")
    assert_potentials_agree(model, x, y)
    sites, *_ = flat_layout(model, x, y, None)
    assert [s.name for s in sites] == [
        "b.inp.weight", "b.inp.bias", "b.hidden.weight", "b.hidden.bias", "b.out.weight"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("layers", "shape"),
    [
        ([nn.Conv1d(2, 4, 3, stride=2, padding=1, dilation=2), nn.Tanh(), nn.Flatten(),
          nn.Linear(16, 3)], (2, 9)),
        ([nn.Conv1d(2, 4, 3, groups=2, padding="same"), nn.ReLU(), nn.Flatten(),
          nn.Linear(36, 3)], (2, 9)),
        ([nn.Conv3d(2, 3, 2, padding=(1, 0, 1)), nn.SiLU(), nn.Flatten(), nn.Linear(150, 3)],
         (2, 4, 3, 4)),
        ([nn.ConvTranspose1d(2, 4, 3, stride=2, padding=1, output_padding=1, groups=2),
          nn.Tanh(), nn.Flatten(), nn.Linear(72, 3)], (2, 9)),
        ([nn.ConvTranspose2d(2, 3, (2, 3), stride=(2, 1), dilation=(1, 2), bias=False),
          nn.ELU(), nn.Flatten(), nn.Linear(3 * 6 * 7, 3)], (2, 3, 3)),
        ([nn.ConvTranspose3d(2, 2, 2, stride=2, padding=(0, 1, 0)), nn.Tanh(), nn.Flatten(),
          nn.Linear(2 * 4 * 2 * 4, 3)], (2, 2, 2, 2)),
    ],
    ids=["conv1d_strided_dilated", "conv1d_grouped_same", "conv3d", "conv_transpose1d_groups",
         "conv_transpose2d_dilated", "conv_transpose3d"],
)  # fmt: skip
def test_every_convolution_and_its_transpose_exports_exactly(layers, shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, *shape, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (5,), generator=g)
    net = bbb.bayesianize(nn.Sequential(*layers), Gaussian(1.0))
    assert isinstance(net[0], bbb.BayesianAffine)
    assert_potentials_agree(bnn(net, bbb.likelihoods.Categorical(), len(x)), x, y, spread=0.3)


def test_bayesian_layer_norm_batch_norm_and_embedding_export_exactly():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 7, (6, 3), generator=g)
    y = torch.randint(0, 3, (6,), generator=g)
    net = bbb.bayesianize(
        nn.Sequential(
            nn.Embedding(7, 4), nn.Flatten(), nn.LayerNorm(12), nn.Linear(12, 5),
            nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3),
        ),
        ScaleMixture(0.5, 1.0, 0.3),
    )  # fmt: skip
    net[4].module.running_mean.uniform_(-0.5, 0.5)
    net[4].module.running_var.uniform_(0.5, 2.0)
    model = bnn(net, bbb.likelihoods.Categorical(), len(ids))
    model.eval()
    assert_potentials_agree(model, ids, y, spread=0.3)
    sites, *_ = flat_layout(model, ids, y, None)
    assert [s.name for s in sites][:3] == ["0.weight", "2.weight", "2.bias"]


def test_a_deterministic_embedding_exports_with_integer_inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 7, (6, 2), generator=g)
    y = torch.randn(6, 1, generator=g, dtype=torch.float64)
    net = bbb.bayesianize(
        nn.Sequential(nn.Embedding(7, 3), nn.Flatten(), nn.Linear(6, 1)), only="2.*"
    )
    y = y.squeeze(-1)
    assert_potentials_agree(bnn(net, bbb.likelihoods.Gaussian(scale=0.5), len(ids)), ids, y)


def test_a_float32_model_exports_its_float64_potential():
    x, y = regression_data()
    model32 = bbb.BNN(bbb.mlp([2, 5, 1], prior=Gaussian(0.5)), bbb.likelihoods.Gaussian(0.3), 25)
    model64 = bnn(bbb.mlp([2, 5, 1], prior=Gaussian(0.5)), bbb.likelihoods.Gaussian(0.3), 25)
    _, jax32, dim = potentials(model32, x.float(), y.float())
    _, jax64, _ = potentials(model64, x, y)
    from pyro_bbb.infer.mcmc._jax import jax, jnp

    theta = jnp.asarray(np.random.default_rng(0).normal(size=dim))
    with jax.enable_x64(True):
        # the data went through float32 once: equal to float32 rounding, computed in float64
        assert jax32(theta).dtype == jnp.float64
        assert float(jax32(theta)) == pytest.approx(float(jax64(theta)), rel=1e-5)
