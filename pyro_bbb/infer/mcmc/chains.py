"""One NUTS chain with Pyro's sampler: its start, its run, and the statistics it records.

:class:`RecordingNUTS` is Pyro's :class:`~pyro.infer.NUTS` recording ArviZ's per-draw
statistics; :func:`initial_theta` and :func:`guide_start` find where a chain starts;
:func:`run_chain` runs one chain from a picklable :class:`ChainJob`, in this process or in a
worker. How chains are dispatched is in :mod:`pyro_bbb.infer.mcmc.nuts`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pyro
import pyro.poutine as poutine
import torch
from pyro.distributions.transforms import biject_to
from pyro.infer import MCMC, NUTS

from .potential import THETA, FlatSite, Potential, flatten, latent_sites

__all__ = [
    "STAT_NAMES",
    "ChainJob",
    "RecordingNUTS",
    "chain_statistics",
    "guide_start",
    "initial_theta",
    "run_chain",
    "run_in_worker",
]

#: Per-draw sampler statistics recorded by :class:`RecordingNUTS`, ArviZ's names.
STAT_NAMES = ("lp", "diverging", "tree_depth", "n_steps", "step_size", "acceptance_rate")


class RecordingNUTS(NUTS):
    """Pyro's NUTS, recording ArviZ's per-draw statistics.

    It hands them back through :meth:`diagnostics`, which is what a worker process returns
    to the parent.
    """

    #: A diagonal inverse mass matrix to start adaptation from, ``(dim,)``, or ``None``.
    initial_inverse_mass: torch.Tensor | None = None

    def setup(self, warmup_steps, *args, **kwargs):  # noqa: D102 (Pyro's kernel API)
        super().setup(warmup_steps, *args, **kwargs)
        self._records = {name: [] for name in (*STAT_NAMES, "warmup")}

    def _initialize_adapter(self):
        super()._initialize_adapter()
        if self.initial_inverse_mass is not None:
            adapter = self._adapter.mass_matrix_adapter
            adapter.inverse_mass_matrix = {(THETA,): self.initial_inverse_mass}
            self._adapter.reset_step_size_adaptation(self._initial_params)

    def sample(self, params):  # noqa: D102 (Pyro's kernel API)
        calls = self.potential_fn.calls
        step_size = self.step_size
        divergences = len(self._divergences)
        old_mean = self._mean_accept_prob
        warmup = self._t < self._warmup_steps
        z = super().sample(params)
        n_steps = self.potential_fn.calls - calls
        n = self._t if warmup else self._t - self._warmup_steps
        record = self._records
        record["warmup"].append(warmup)
        record["lp"].append(-float(self._potential_energy_last))
        record["diverging"].append(len(self._divergences) > divergences)
        record["n_steps"].append(n_steps)
        record["tree_depth"].append(math.ceil(math.log2(n_steps + 1)))
        record["step_size"].append(step_size)
        # Pyro keeps only the running mean; invert its update (clamped against round-off)
        accept_prob = old_mean + (self._mean_accept_prob - old_mean) * n
        record["acceptance_rate"].append(min(max(accept_prob, 0.0), 1.0))
        return z

    def diagnostics(self):  # noqa: D102 (Pyro's kernel API)
        return {**super().diagnostics(), "pyro_bbb_records": self._records}


def initial_theta(model, x, y, potential: Potential, init, init_steps: int) -> torch.Tensor:
    """One chain's starting point: a prior draw, optionally improved by Adam towards a mode."""
    sites = potential.sites
    if isinstance(init, Mapping):
        return flatten(init, sites).detach()
    with torch.no_grad():
        draw = {name: site["value"] for name, site in latent_sites(model, x, y).items()}
        for site in sites:
            if site.prior is not None:
                draw[site.name] = site.prior.sample()
        theta = flatten(draw, sites)
    if init == "prior":
        return theta
    theta = theta.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([theta], lr=0.01)
    for _ in range(init_steps):
        optimizer.zero_grad()
        loss = potential({THETA: theta})
        loss.backward()
        optimizer.step()
    potential.calls = 0
    return theta.detach()


@torch.no_grad()
def guide_start(model, guide, x, y, sites: list[FlatSite], num_chains: int, num_draws: int = 500):
    """Starting points and a diagonal inverse mass matrix from a trained guide.

    Draws ``num_draws`` weight vectors from the guide in one vectorised pass; chain ``c``
    starts at draw ``c`` and the inverse mass matrix starts at the draws' variances (a
    sampled noise scale, which the guide does not hold, starts at the model's current value
    with unit variance in log space).
    """
    nesting = getattr(model, "max_plate_nesting", 1)
    plate = pyro.plate("_init_draws", max(num_draws, num_chains), dim=-(nesting + 1))
    trace = poutine.trace(plate(guide)).get_trace(x, y)
    parts = []
    for site in sites:
        if site.prior is not None:  # a sampled noise scale
            value = biject_to(site.prior.support).inv(model.likelihood.noise_scale().detach())
            parts.append(value.reshape(1, 1).expand(plate.size, 1))
            continue
        if site.name not in trace.nodes:
            raise ValueError(f"init guide has no site {site.name!r}; it has {list(trace.nodes)}")
        value = trace.nodes[site.name]["value"]
        parts.append(value.reshape(plate.size, -1))
    draws = torch.cat(parts, dim=1)
    variance = draws.var(0)
    noise = [s for s in sites if s.prior is not None]
    for site in noise:
        variance[site.start : site.stop] = 1.0
    return draws[:num_chains], variance


@dataclass
class ChainJob:
    """Everything one chain needs, picklable so that a worker process can run it."""

    potential: Potential
    init: object
    init_steps: int
    seed: int
    num_samples: int
    warmup_steps: int
    nuts_options: dict
    progress: bool
    chain: int
    theta0: torch.Tensor | None = None
    inverse_mass: torch.Tensor | None = None


def run_chain(job: ChainJob) -> tuple[torch.Tensor, dict, MCMC | None]:
    """Run one chain (here or in a worker): ``(draws (num_samples, dim), records, mcmc)``."""
    pyro.set_rng_seed(job.seed)
    potential = job.potential
    model, x, y = potential.model, potential.x, potential.y
    theta0 = job.theta0
    if theta0 is None:
        theta0 = initial_theta(model, x, y, potential, job.init, job.init_steps)
    kernel = RecordingNUTS(potential_fn=potential, **job.nuts_options)
    kernel.initial_inverse_mass = job.inverse_mass
    mcmc = MCMC(
        kernel,
        num_samples=job.num_samples,
        warmup_steps=job.warmup_steps,
        initial_params={THETA: theta0},
        disable_progbar=not job.progress,
    )
    mcmc.run()
    draws = mcmc.get_samples()[THETA].detach()
    records = mcmc._diagnostics[0]["pyro_bbb_records"]
    return draws, records, mcmc


def run_in_worker(job: ChainJob) -> tuple[torch.Tensor, dict, None]:
    """:func:`run_chain` in a worker process: the MCMC object stays there."""
    draws, records, _ = run_chain(job)
    return draws, records, None


def chain_statistics(
    outputs: list[tuple[torch.Tensor, dict, MCMC | None]],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per-draw statistics after warm-up ``{name: (num_chains, num_samples)}``, and warm-up's.

    The warm-up statistics are ``mean_n_steps`` and the adapted ``step_size``, per chain.
    """
    stats, warmup_stats = {}, {"mean_n_steps": [], "step_size": []}
    for name in STAT_NAMES:
        dtype = torch.bool if name == "diverging" else None
        per_chain = []
        for _, records, _ in outputs:
            keep = [v for v, w in zip(records[name], records["warmup"], strict=True) if not w]
            per_chain.append(torch.tensor(keep, dtype=dtype))
        stats[name] = torch.stack(per_chain)
    for _, records, mcmc in outputs:
        steps = [n for n, w in zip(records["n_steps"], records["warmup"], strict=True) if w]
        warmup_stats["mean_n_steps"].append(sum(steps) / max(len(steps), 1))
        warmup_stats["step_size"].append(
            mcmc.kernel.step_size if mcmc else records["step_size"][-1]
        )
    return stats, {k: torch.tensor(v) for k, v in warmup_stats.items()}
