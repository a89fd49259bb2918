"""NumPyro's chains over the exported potential: starts, statistics, the energy."""

from __future__ import annotations

import numpy as np
import torch

import pyro_bbb as bbb
from pyro_bbb.infer.mcmc.potential import THETA, Potential, flat_layout

from ...problems import conjugate_problem, linear_bnn
from ...support import requires_numpyro

pytestmark = requires_numpyro


def test_find_modes_takes_the_steps_torch_adam_takes():
    from pyro_bbb.infer.mcmc.numpyro_chains import NumPyroChains

    x, y, *_ = conjugate_problem()
    model = bbb.BNN(bbb.mlp([3, 4, 1], activation="tanh").double(),
                    bbb.likelihoods.Gaussian(0.5).double(), num_data=len(x))  # fmt: skip
    sites, noise_name, noise_value = flat_layout(model, x, y, None)
    chains = NumPyroChains(model, x, y, sites, noise_value)
    starts = torch.randn(3, sites[-1].stop, generator=torch.Generator().manual_seed(0),
                         dtype=torch.float64)  # fmt: skip
    moved = chains.find_modes(starts, steps=50)
    potential = Potential(model, x, y, sites, noise_name, noise_value, jit=False)
    for start, got in zip(starts, moved, strict=True):
        theta = start.clone().requires_grad_()
        optimizer = torch.optim.Adam([theta], lr=0.01)
        for _ in range(50):
            optimizer.zero_grad()
            potential({THETA: theta}).backward()
            optimizer.step()
        torch.testing.assert_close(got, theta.detach(), rtol=1e-8, atol=1e-10)
        assert not torch.allclose(got, start)


def test_the_chains_record_the_energy_that_arviz_bfmi_reads():
    import arviz as az

    x, y, *_ = conjugate_problem()
    model = linear_bnn(x)
    result = bbb.run_nuts(
        model, x, y, num_samples=200, warmup_steps=200, num_chains=2, seed=0, progress=False,
        backend="numpyro",
    )  # fmt: skip
    energy = result.sample_stats["energy"]
    # the Hamiltonian is the potential plus a kinetic energy >= 0, i.e. -lp + K
    assert torch.all(energy >= -result.sample_stats["lp"])
    bfmi = az.bfmi(bbb.to_inference_data(model, result, x, y))
    # a Gaussian posterior, well sampled: far above the 0.3 that flags trouble
    assert bfmi.shape == (2,) and np.all(bfmi > 0.5)
    warmup_steps = result.warmup_stats["mean_n_steps"]
    assert warmup_steps.shape == (2,) and torch.all(warmup_steps >= 1)


def test_sequential_chains_in_float32_return_the_model_s_dtype():
    x, y, *_ = conjugate_problem()
    result = bbb.run_nuts(
        linear_bnn(x), x, y, num_samples=30, warmup_steps=30, num_chains=2, seed=0,
        progress=False, backend="numpyro", chain_method="sequential", precision="float32",
    )  # fmt: skip
    assert result.samples["0.weight"].shape == (2, 30, 1, 3)
    assert result.samples["0.weight"].dtype == torch.float64  # the model's dtype
    assert result.sample_stats["lp"].dtype == torch.float32  # the sampler's precision
