r"""What a NUTS run returns: :class:`NUTSResult`, and :func:`replay_nuts` to predict from it.

A result holds the draws by the model's site names, the per-draw sampler statistics in
ArviZ's names, the per-chain :class:`~pyro.infer.MCMC` objects and the wall time. Its draws
replay through the model exactly as a guide's do, so :func:`~pyro_bbb.predict`,
:func:`~pyro_bbb.to_inference_data` and :func:`~pyro_bbb.compare` treat both alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.infer import MCMC

from ..predictive import ClassificationPrediction, RegressionPrediction, predict

__all__ = ["NUTSResult", "replay_nuts"]


@dataclass(frozen=True)
class NUTSResult:
    r"""Draws of a NUTS run, with the sampler's statistics and cost.

    Attributes:
        samples: ``{site: (num_chains, num_samples, *site shape)}``, by the model's site names
            (and the noise parameter's name, e.g. ``"likelihood.scale"``, if it was sampled).
        sample_stats: ``{name: (num_chains, num_samples)}`` per draw, ArviZ's names:
            ``lp`` (log joint :math:`\log p(y, w)` of the training data, plus the log
            Jacobian of a sampled noise scale), ``diverging``, ``tree_depth``
            (:math:`\lceil\log_2(\text{n\_steps} + 1)\rceil`), ``n_steps`` (leapfrog
            steps), ``step_size`` and ``acceptance_rate``; with ``backend="numpyro"`` also
            ``energy`` (the Hamiltonian, which ArviZ's BFMI reads).
        mcmc: One Pyro :class:`~pyro.infer.MCMC` per chain (``None`` for chains run in
            worker processes, whose MCMC objects stay there, and for ``backend="numpyro"``).
        wall_time: Seconds from the call to the return: initialisation, warm-up and sampling.
        warmup_steps: Warm-up iterations per chain.
        warmup_stats: ``{name: (num_chains,)}``: ``mean_n_steps`` during warm-up and the
            adapted ``step_size``.
        noise: ``"fixed"``, ``"prior"`` or ``"none"`` (the likelihood has no scale to learn).
        noise_site: Name of the noise scale if it was sampled or held fixed, else ``None``.
        noise_value: The fixed noise scale (``noise="fixed"``), else ``None``.
        backend: The sampler that drew them, ``"pyro"`` or ``"numpyro"``.
    """

    samples: dict[str, torch.Tensor]
    sample_stats: dict[str, torch.Tensor]
    mcmc: tuple[MCMC | None, ...]
    wall_time: float
    warmup_steps: int
    warmup_stats: dict[str, torch.Tensor] = field(default_factory=dict)
    noise: str = "none"
    noise_site: str | None = None
    noise_value: float | None = None
    backend: str = "pyro"

    @property
    def num_chains(self) -> int:
        """Number of chains."""
        return next(iter(self.samples.values())).shape[0]

    @property
    def num_samples(self) -> int:
        """Draws kept per chain."""
        return next(iter(self.samples.values())).shape[1]

    def flat_samples(self) -> dict[str, torch.Tensor]:
        """Every chain's draws pooled: ``{site: (num_chains * num_samples, *site shape)}``."""
        return {k: v.reshape(-1, *v.shape[2:]) for k, v in self.samples.items()}

    @property
    def weight_sites(self) -> list[str]:
        """The model's weight sites (all sampled sites but a sampled noise scale)."""
        return [k for k in self.samples if not (self.noise == "prior" and k == self.noise_site)]

    @property
    def num_divergences(self) -> int:
        """Divergent transitions after warm-up, over all chains."""
        return int(self.sample_stats["diverging"].sum())

    def predict(
        self,
        model: Callable[..., Any],
        x: torch.Tensor,
        *,
        batch_size: int | None = None,
        seed: int | None = None,
    ) -> RegressionPrediction | ClassificationPrediction:
        """The posterior predictive at ``x`` from every draw, as :func:`~pyro_bbb.predict` gives.

        Args:
            model: The model NUTS sampled.
            x: Inputs ``(batch, *features)``.
            batch_size: Evaluate ``x`` in chunks of this many rows.
            seed: Seed for the draws of ``y``.

        Returns:
            A prediction over ``num_chains * num_samples`` weight draws.
        """
        replayed, guide = replay_nuts(model, self)
        num = self.num_chains * self.num_samples
        return predict(replayed, guide, x, num_samples=num, batch_size=batch_size, seed=seed)

    def __repr__(self) -> str:
        return (
            f"NUTSResult(num_chains={self.num_chains}, num_samples={self.num_samples}, "
            f"warmup_steps={self.warmup_steps}, sites={list(self.samples)}, "
            f"divergences={self.num_divergences}, wall_time={self.wall_time:.1f}s, "
            f"backend={self.backend!r})"
        )


class _Replay:
    """A guide of fixed draws, ``(S, 1, *shape)`` per site under the draws plate.

    It replays NUTS draws through the model exactly as a guide's draws are replayed.
    """

    def __init__(self, values: dict[str, torch.Tensor]) -> None:
        self.values = values

    def __call__(self, *args, **kwargs) -> None:
        for name, value in self.values.items():
            shape = value.shape[1:]
            pyro.sample(name, dist.Delta(value.unsqueeze(1), event_dim=len(shape)))


def replay_nuts(model: Callable[..., Any], result: NUTSResult) -> Callable[..., Any]:
    """``(model, guide)`` that replay a NUTS result's pooled draws under a draws plate.

    The guide hands each weight site its draws; the model has the noise scale substituted:
    a sampled one per draw, shaped ``(S, 1, 1)`` so that it broadcasts against the network
    output ``(S, batch, out)`` (a width-1 Gaussian squeezes the last dim of both), or the
    value NUTS held fixed.
    """
    flat = result.flat_samples()
    guide = _Replay({k: flat[k] for k in result.weight_sites})
    if result.noise == "prior":
        scale = flat[result.noise_site].reshape(-1, 1, 1)
    elif result.noise == "fixed":
        scale = torch.tensor(result.noise_value, dtype=flat[result.weight_sites[0]].dtype)
    else:
        return model, guide
    return poutine.substitute(model, {result.noise_site: scale}), guide
