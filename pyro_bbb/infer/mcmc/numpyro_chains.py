"""NUTS chains with NumPyro's sampler over the exported JAX potential.

:class:`NumPyroChains` exports a model's potential
(:func:`~pyro_bbb.infer.mcmc.export.export_potential`) and runs NumPyro's
:class:`~numpyro.infer.NUTS` over it, chains vectorised by default: the whole sampler,
tree building included, is compiled by XLA, which is why it is one to two orders of
magnitude faster per leapfrog step than Pyro's NUTS driving a torch potential. It returns
NumPy draws and ArviZ's per-draw statistics; :mod:`~pyro_bbb.infer.mcmc.nuts` turns them
into a :class:`~pyro_bbb.infer.mcmc.result.NUTSResult`. Precision is a context
(``jax.enable_x64``), not a global switch, so other JAX code in the process is untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._jax import jax, jnp, numpyro
from .export import export_potential
from .potential import FlatSite

__all__ = ["CHAIN_METHODS", "NumPyroChains", "NumPyroDraws"]

#: How NumPyro runs several chains (``"parallel"`` needs one JAX device per chain).
CHAIN_METHODS = ("vectorized", "sequential", "parallel")

#: NumPyro's state fields recorded per draw, and their names in ArviZ's ``sample_stats``.
_FIELDS = {
    "potential_energy": "lp",
    "energy": "energy",
    "diverging": "diverging",
    "num_steps": "n_steps",
    "accept_prob": "acceptance_rate",
    "adapt_state.step_size": "step_size",
}


@dataclass(frozen=True)
class NumPyroDraws:
    """What the chains return, as NumPy arrays.

    Attributes:
        draws: Flat vectors ``(num_chains, num_samples, dim)``.
        stats: ``{ArviZ name: (num_chains, num_samples)}``.
        warmup_stats: ``{"mean_n_steps", "step_size": (num_chains,)}``.
    """

    draws: np.ndarray
    stats: dict[str, np.ndarray]
    warmup_stats: dict[str, np.ndarray]


class NumPyroChains:
    """A model's exported potential, and NumPyro's NUTS over it.

    Args:
        model: The :class:`~pyro_bbb.BNN`.
        x: The whole training set's inputs.
        y: Its targets.
        sites: The flat layout.
        noise_value: A learned noise scale held fixed, else ``None``.
        float64: Export and sample in float64 (else float32).

    Raises:
        NotImplementedError: If the model cannot be exported (before anything is sampled).
    """

    def __init__(
        self,
        model: Callable[..., Any],
        x: torch.Tensor,
        y: torch.Tensor,
        sites: list[FlatSite],
        noise_value: torch.Tensor | None,
        *,
        float64: bool = True,
    ) -> None:
        self.float64 = float64
        self.dim = sites[-1].stop
        dtype = np.float64 if float64 else np.float32
        with jax.enable_x64(float64):
            self.potential = export_potential(model, x, y, sites, noise_value, dtype=dtype)

    def find_modes(self, starts: torch.Tensor, *, steps: int, lr: float = 0.01) -> torch.Tensor:
        """Move each start ``steps`` Adam steps down the potential, all chains at once.

        The same update as ``torch.optim.Adam(lr=lr)`` (betas 0.9, 0.999, eps 1e-8) on the
        torch potential, compiled as one loop: ``init="map"`` costs milliseconds here.

        Args:
            starts: ``(num_chains, dim)``.
            steps: Adam steps.
            lr: Learning rate.

        Returns:
            The moved starts, ``(num_chains, dim)``, float64.
        """
        with jax.enable_x64(self.float64):
            gradient = jax.grad(self.potential)

            def adam(theta):
                def step(carry, t):
                    theta, m, v = carry
                    g = gradient(theta)
                    m = 0.9 * m + 0.1 * g
                    v = 0.999 * v + 0.001 * g * g
                    denom = jnp.sqrt(v) / jnp.sqrt(1 - 0.999**t) + 1e-8
                    return (theta - lr / (1 - 0.9**t) * m / denom, m, v), None

                zeros = jnp.zeros_like(theta)
                counts = jnp.arange(1, steps + 1, dtype=theta.dtype)
                return jax.lax.scan(step, (theta, zeros, zeros), counts)[0][0]

            moved = jax.jit(jax.vmap(adam))(self._array(starts))
            return torch.from_numpy(np.array(moved, dtype=np.float64))

    def _array(self, tensor: torch.Tensor) -> jax.Array:
        dtype = np.float64 if self.float64 else np.float32
        return jnp.asarray(tensor.detach().cpu().numpy().astype(dtype))

    def run(
        self,
        starts: torch.Tensor,
        *,
        num_samples: int,
        warmup_steps: int,
        seed: int,
        max_tree_depth: int,
        target_accept_prob: float,
        full_mass: bool,
        chain_method: str,
        progress: bool,
        inverse_mass: torch.Tensor | None = None,
    ) -> NumPyroDraws:
        """Warm up and sample every chain.

        Args:
            starts: One flat starting point per chain, ``(num_chains, dim)``.
            num_samples: Draws kept per chain.
            warmup_steps: Adaptation iterations per chain (step size and mass matrix,
                NumPyro's windowed scheme, as Stan's).
            seed: Seed of NumPyro's ``PRNGKey``.
            max_tree_depth: NUTS's tree-depth cap.
            target_accept_prob: Step-size adaptation target.
            full_mass: Adapt a dense mass matrix.
            chain_method: One of :data:`CHAIN_METHODS`.
            progress: Show NumPyro's progress bar.
            inverse_mass: A diagonal inverse mass matrix ``(dim,)`` to start adaptation from.

        Returns:
            :class:`NumPyroDraws`.
        """
        num_chains = starts.shape[0]
        with jax.enable_x64(self.float64):
            init = self._array(starts)
            options = {}
            if inverse_mass is not None:
                mass = self._array(inverse_mass)
                options["inverse_mass_matrix"] = jnp.diag(mass) if full_mass else mass
            kernel = _NUTS(
                warmup_steps, potential_fn=self.potential, max_tree_depth=max_tree_depth,
                target_accept_prob=target_accept_prob, dense_mass=full_mass, **options,
            )  # fmt: skip
            # MCMC sees no warm-up: one compiled loop runs (and records) warm-up and draws
            mcmc = numpyro.infer.MCMC(
                kernel, num_warmup=0, num_samples=warmup_steps + num_samples,
                num_chains=num_chains, chain_method=chain_method, progress_bar=progress,
            )  # fmt: skip
            mcmc.run(
                jax.random.PRNGKey(seed),
                init_params=init if num_chains > 1 else init[0],
                extra_fields=tuple(_FIELDS),
            )
            draws = np.array(mcmc.get_samples(group_by_chain=True))
            fields = {
                name: np.array(value).reshape(num_chains, -1)
                for name, value in mcmc.get_extra_fields(group_by_chain=True).items()
            }
        stats = {_FIELDS[name]: value[:, warmup_steps:] for name, value in fields.items()}
        stats["lp"] = -stats["lp"]
        warmup_stats = {
            "mean_n_steps": fields["num_steps"][:, :warmup_steps].mean(1)
            if warmup_steps
            else np.zeros(num_chains),
            "step_size": stats["step_size"][:, -1],
        }
        draws = draws[:, warmup_steps:].reshape(num_chains, num_samples, -1)
        return NumPyroDraws(draws, stats, warmup_stats)


class _NUTS(numpyro.infer.NUTS):
    """NumPyro's NUTS adapting over its own number of warm-up iterations, whatever MCMC says.

    ``MCMC(num_warmup=0, num_samples=warmup + samples)`` then compiles one loop, not one for
    warm-up and one for sampling (each takes seconds of XLA compilation), and records the
    warm-up's statistics too. The kernel adapts while its iteration count is below
    ``warmup_steps``, exactly as under ``MCMC(num_warmup=warmup_steps)``.
    """

    def __init__(self, warmup_steps: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self._warmup_steps = warmup_steps

    def init(self, rng_key, num_warmup, init_params=None, model_args=(), model_kwargs=None):
        # Compiled, where NumPyro runs it op by op (each op compiled on first use): its side
        # effects on the kernel depend on no traced value, as NumPyro's own vmap of it needs.
        def init(key, params):
            return super(_NUTS, self).init(
                key, self._warmup_steps, params, model_args, model_kwargs or {}
            )

        return jax.jit(init)(rng_key, init_params)
