r"""NUTS on the same full-batch model that SVI trains, and its result.

:func:`run_nuts` samples :math:`p(w \mid x, y)` of a :class:`~pyro_bbb.BNN` with Pyro's
:class:`~pyro.infer.NUTS` (Hoffman & Gelman 2014, https://arxiv.org/abs/1111.4246). The
model is traced once to find its latent sites, their shapes and priors; the potential
:math:`U(\theta) = -\log p(y, w)` is then a function of one flat vector :math:`\theta`,
evaluated by running the model conditioned on :math:`w` and compiled once with
``torch.jit.trace``, so no leapfrog step re-traces the model in Python. Chains run in
spawned processes or one after another. :class:`NUTSResult` holds the draws by site name,
the per-draw sampler statistics, the per-chain :class:`~pyro.infer.MCMC` objects and the wall
time. ArviZ export, ESS and R̂ live in :mod:`pyro_bbb.diagnostics`.

**The noise scale.** A :class:`~pyro_bbb.likelihoods.Gaussian` with a learned scale holds it
as a point estimate (a Pyro parameter), not a latent site, so NUTS cannot sample it without
a choice: ``noise="fixed"`` holds it at its current value (e.g. the one VI learned, so both
condition on the same likelihood), and ``noise=<distribution>`` makes it a latent with that
prior, sampled in the unconstrained space of the prior's support (log space for
:math:`(0, \infty)`), with the Jacobian.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.distributions.transforms import biject_to
from pyro.infer import MCMC, NUTS
from pyro.poutine.util import site_is_subsample
from tqdm.auto import tqdm

from .guides._init import base_support
from .likelihoods import Gaussian
from .predict import ClassificationPrediction, RegressionPrediction, predict

__all__ = ["NUTSResult", "replay_nuts", "run_nuts"]

#: The single key of the flat parameter vector in Pyro's MCMC.
_THETA = "theta"
#: Per-draw sampler statistics recorded by :class:`_RecordingNUTS`, ArviZ's names.
_STAT_NAMES = ("lp", "diverging", "tree_depth", "n_steps", "step_size", "acceptance_rate")

Noise = Literal["fixed"] | dist.TorchDistribution | None


@dataclass(frozen=True)
class _Site:
    """Where one latent site lives in the flat vector, and how it is constrained."""

    name: str
    shape: torch.Size
    start: int
    stop: int
    prior: dist.TorchDistribution | None = None  # only for a noise scale made latent

    def constrain(self, theta: torch.Tensor) -> torch.Tensor:
        value = theta[..., self.start : self.stop].reshape(theta.shape[:-1] + self.shape)
        return value if self.prior is None else biject_to(self.prior.support)(value)


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
            steps), ``step_size`` and ``acceptance_rate``.
        mcmc: One :class:`~pyro.infer.MCMC` per chain (``None`` for chains run in worker
            processes, whose MCMC objects stay there).
        wall_time: Seconds from the call to the return: initialisation, warm-up and sampling.
        warmup_steps: Warm-up iterations per chain.
        warmup_stats: ``{name: (num_chains,)}``: ``mean_n_steps`` during warm-up and the
            adapted ``step_size``.
        noise: ``"fixed"``, ``"prior"`` or ``"none"`` (the likelihood has no scale to learn).
        noise_site: Name of the noise scale if it was sampled or held fixed, else ``None``.
        noise_value: The fixed noise scale (``noise="fixed"``), else ``None``.
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
        self, model, x: torch.Tensor, *, batch_size: int | None = None, seed: int | None = None
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
            f"divergences={self.num_divergences}, wall_time={self.wall_time:.1f}s)"
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


def replay_nuts(model, result: NUTSResult):
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


# ---------------------------------------------------------------------------------------------
# The potential
# ---------------------------------------------------------------------------------------------


def latent_sites(model, x: torch.Tensor, y: torch.Tensor | None = None) -> dict[str, dict]:
    """The model's latent sample sites from one trace: ``{name: site}`` in model order.

    Leaves out the observation site and plate subsample sites.
    """
    observed = getattr(model, "observation_site", "obs")
    with pyro.validation_enabled(False), torch.no_grad():
        trace = poutine.trace(model).get_trace(x, y)
    return {
        name: site
        for name, site in trace.iter_stochastic_nodes()
        if name != observed and not site_is_subsample(site)
    }


def learned_noise(model) -> str | None:
    """The Pyro parameter name of the model's learned Gaussian noise scale, or ``None``."""
    likelihood = getattr(model, "likelihood", None)
    if isinstance(likelihood, Gaussian) and likelihood.learned:
        return likelihood._pyro_get_fullname("scale")
    return None


class _Potential:
    r"""Potential energy :math:`U(\theta) = -\log p(y, w(\theta))` over the flat vector.

    Picklable (a spawned worker rebuilds the compiled function), and it counts its calls,
    which is how :class:`_RecordingNUTS` knows the leapfrog steps of a transition.
    """

    def __init__(self, model, x, y, sites: list[_Site], noise_name, noise_value, jit: bool):
        self.model, self.x, self.y = model, x, y
        self.sites = sites
        self.noise_name = noise_name  # substituted: fixed value or sampled latent
        self.noise_value = noise_value
        self.jit = jit
        self.threads = torch.get_num_threads()
        self.calls = 0
        self._compiled = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_compiled"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        # a spawned worker keeps the parent's thread count, so chains do not oversubscribe
        torch.set_num_threads(self.threads)

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(y, w) + \log|J|` at one flat vector ``theta`` ``(dim,)``; a scalar."""
        values = {}
        extra = theta.new_zeros(())
        for site in self.sites:
            value = site.constrain(theta)
            values[site.name] = value
            if site.prior is not None:
                unconstrained = theta[site.start : site.stop].reshape(site.shape)
                transform = biject_to(site.prior.support)
                extra = extra + site.prior.log_prob(value).sum()
                extra = extra + transform.log_abs_det_jacobian(unconstrained, value).sum()
        substitute = {}
        if self.noise_name is not None:
            fixed = self.noise_value
            substitute[self.noise_name] = values.pop(self.noise_name) if fixed is None else fixed
        with pyro.validation_enabled(False):
            model = poutine.condition(poutine.substitute(self.model, substitute), values)
            trace = poutine.trace(model).get_trace(self.x, self.y)
        return trace.log_prob_sum() + extra

    def __call__(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        self.calls += 1
        theta = params[_THETA]
        if not self.jit:
            return -self.log_joint(theta)
        if self._compiled is None:
            with warnings.catch_warnings():
                # the model's shape checks are constant for fixed data; torch 2.13 marks
                # jit.trace deprecated, and it is still the fastest here (no re-tracing)
                warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
                warnings.simplefilter("ignore", category=DeprecationWarning)
                self._compiled = torch.jit.trace(
                    self.log_joint, (theta.detach(),), check_trace=False
                )
        return -self._compiled(theta)


class _RecordingNUTS(NUTS):
    """Pyro's NUTS, recording ArviZ's per-draw statistics.

    It hands them back through :meth:`diagnostics`, which is what a worker process returns
    to the parent.
    """

    #: A diagonal inverse mass matrix to start adaptation from, ``(dim,)``, or ``None``.
    initial_inverse_mass: torch.Tensor | None = None

    def setup(self, warmup_steps, *args, **kwargs):
        super().setup(warmup_steps, *args, **kwargs)
        self._records = {name: [] for name in (*_STAT_NAMES, "warmup")}

    def _initialize_adapter(self):
        super()._initialize_adapter()
        if self.initial_inverse_mass is not None:
            adapter = self._adapter.mass_matrix_adapter
            adapter.inverse_mass_matrix = {(_THETA,): self.initial_inverse_mass}
            self._adapter.reset_step_size_adaptation(self._initial_params)

    def sample(self, params):
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

    def diagnostics(self):
        return {**super().diagnostics(), "pyro_bbb_records": self._records}


# ---------------------------------------------------------------------------------------------
# Checks and initialisation
# ---------------------------------------------------------------------------------------------


def _check_data(model, x, y) -> None:
    for name, value in (("x", x), ("y", y)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if x.dim() < 2 or y.dim() < 1 or x.shape[0] != y.shape[0]:
        raise ValueError(
            "run_nuts needs x (num_data, *features) and y (num_data[, dim]) with the same "
            f"number of rows, got x {tuple(x.shape)} and y {tuple(y.shape)}"
        )
    num_data = getattr(model, "num_data", None)
    if num_data is not None and x.shape[0] != num_data:
        raise ValueError(
            f"run_nuts samples p(w | all data) and takes no minibatches: x has {x.shape[0]} "
            f"rows but the model has num_data={num_data}. Pass the whole training set, or "
            f"build the model with num_data={x.shape[0]}"
        )


def _check_positive(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _layout(model, x, y, noise: Noise) -> tuple[list[_Site], str | None, torch.Tensor | None]:
    """The flat layout of the latent sites, and what to do with a learned noise scale."""
    sites, start = [], 0
    for name, site in latent_sites(model, x, y).items():
        if site["scale"] != 1.0:
            raise ValueError(
                f"run_nuts needs an unscaled, full-batch model; site {name!r} has scale "
                f"{site['scale']}"
            )
        support = base_support(site["fn"])
        if support is not torch.distributions.constraints.real or site["cond_indep_stack"]:
            raise NotImplementedError(
                f"run_nuts samples global real-valued sites; site {name!r} has support "
                f"{support} and plates {[f.name for f in site['cond_indep_stack']]}"
            )
        shape = site["value"].shape
        sites.append(_Site(name, shape, start, start + shape.numel()))
        start += shape.numel()
    noise_name = learned_noise(model)
    if noise_name is None:
        if noise is not None:
            raise ValueError(
                f"noise={noise!r} is only for a Gaussian likelihood with a learned scale; "
                f"this model's likelihood is {getattr(model, 'likelihood', None)!r}"
            )
        return sites, None, None
    if noise is None:
        value = float(model.likelihood.scale.detach())
        raise ValueError(
            f"the model learns its Gaussian noise scale ({noise_name!r}, now {value:.4g}) as a "
            "point estimate, which NUTS cannot sample as it stands. Pass noise='fixed' to hold "
            "it at its current value (e.g. the one VI learned), or noise=<a prior over "
            "(0, inf)>, e.g. pyro.distributions.LogNormal(-1.0, 1.0), to sample it"
        )
    if isinstance(noise, str):
        if noise != "fixed":
            raise ValueError(f"noise must be 'fixed', a distribution or None, got {noise!r}")
        return sites, noise_name, model.likelihood.scale.detach().clone()
    if not isinstance(noise, torch.distributions.Distribution) or noise.event_shape:
        raise TypeError(f"noise must be 'fixed' or a scalar distribution, got {noise!r}")
    if not torch.distributions.constraints.positive.check(noise.sample()).all():
        raise ValueError(f"noise's prior must be over positive values, got {noise!r}")
    sites.append(_Site(noise_name, torch.Size(), start, start + 1, prior=noise))
    return sites, noise_name, None


def _flatten(values: Mapping[str, torch.Tensor], sites: list[_Site]) -> torch.Tensor:
    parts = []
    for site in sites:
        if site.name not in values:
            raise KeyError(f"init has no value for site {site.name!r}")
        value = torch.as_tensor(values[site.name])
        if value.shape != site.shape:
            raise ValueError(
                f"init[{site.name!r}] must have shape {tuple(site.shape)}, got {tuple(value.shape)}"
            )
        if site.prior is not None:
            value = biject_to(site.prior.support).inv(value)
        parts.append(value.reshape(-1))
    return torch.cat(parts)


def _initial_theta(model, x, y, potential: _Potential, init, init_steps: int) -> torch.Tensor:
    """One chain's starting point: a prior draw, optionally improved by Adam towards a mode."""
    sites = potential.sites
    if isinstance(init, Mapping):
        return _flatten(init, sites).detach()
    with torch.no_grad():
        draw = {name: site["value"] for name, site in latent_sites(model, x, y).items()}
        for site in sites:
            if site.prior is not None:
                draw[site.name] = site.prior.sample()
        theta = _flatten(draw, sites)
    if init == "prior":
        return theta
    theta = theta.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([theta], lr=0.01)
    for _ in range(init_steps):
        optimizer.zero_grad()
        loss = potential({_THETA: theta})
        loss.backward()
        optimizer.step()
    potential.calls = 0
    return theta.detach()


@torch.no_grad()
def _guide_start(model, guide, x, y, sites: list[_Site], num_chains: int, num_draws: int = 500):
    """Starting points and a diagonal inverse mass matrix from a trained guide.

    Draws ``num_draws`` weight vectors from the guide in one vectorised pass; chain ``c``
    starts at draw ``c`` and the inverse mass matrix starts at the draws' variances (a
    sampled noise scale, which the guide does not hold, starts at the model's current value
    with unit variance in log space).
    """
    nesting = getattr(model, "max_plate_nesting", 1)
    plate = pyro.plate("_init_draws", max(num_draws, num_chains), dim=-(nesting + 1))
    with pyro.validation_enabled(False):
        trace = poutine.trace(plate(guide)).get_trace(x, y)
    parts = []
    for site in sites:
        if site.prior is not None:  # a sampled noise scale
            value = biject_to(site.prior.support).inv(model.likelihood.scale.detach())
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


# ---------------------------------------------------------------------------------------------
# Running chains
# ---------------------------------------------------------------------------------------------


@dataclass
class _ChainJob:
    potential: _Potential
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


def _run_chain(job: _ChainJob) -> tuple[torch.Tensor, dict, MCMC | None]:
    """Run one chain (here or in a worker): ``(draws (num_samples, dim), records, mcmc)``."""
    pyro.set_rng_seed(job.seed)
    potential = job.potential
    model, x, y = potential.model, potential.x, potential.y
    theta0 = job.theta0
    if theta0 is None:
        theta0 = _initial_theta(model, x, y, potential, job.init, job.init_steps)
    kernel = _RecordingNUTS(potential_fn=potential, **job.nuts_options)
    kernel.initial_inverse_mass = job.inverse_mass
    mcmc = MCMC(
        kernel,
        num_samples=job.num_samples,
        warmup_steps=job.warmup_steps,
        initial_params={_THETA: theta0},
        disable_progbar=not job.progress,
    )
    mcmc.run()
    draws = mcmc.get_samples()[_THETA].detach()
    records = mcmc._diagnostics[0]["pyro_bbb_records"]
    return draws, records, mcmc


def _run_in_worker(job: _ChainJob) -> tuple[torch.Tensor, dict, None]:
    draws, records, _ = _run_chain(job)
    return draws, records, None


def run_nuts(
    model,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    num_samples: int,
    warmup_steps: int,
    num_chains: int = 1,
    jit_compile: bool = True,
    seed: int | None = None,
    progress: bool = True,
    noise: Noise = None,
    init: Literal["map", "prior"] | Mapping[str, torch.Tensor] | Callable = "map",
    init_steps: int = 1000,
    max_tree_depth: int = 10,
    target_accept_prob: float = 0.8,
    full_mass: bool = False,
    num_workers: int | None = None,
) -> NUTSResult:
    r"""Sample the posterior of a full-batch model with NUTS.

    The model is traced once; the potential :math:`-\log p(y, w)` is a function of one flat
    vector of every weight (and the noise scale's unconstrained coordinate, if sampled),
    compiled with ``torch.jit.trace`` when ``jit_compile``. Each chain starts from its own
    prior draw, moved ``init_steps`` Adam steps towards a mode (``init="map"``), then runs
    ``warmup_steps`` of step-size and mass-matrix adaptation and keeps ``num_samples``
    draws. A BNN posterior is multimodal: chains started apart usually stay in different
    modes, which R̂ shows (see ``docs/vi_vs_nuts.md``).

    Cost: each draw takes up to :math:`2^{\text{max\_tree\_depth}} - 1` gradient
    evaluations, and Pyro's tree building costs about 1 ms of Python per step on top of the
    potential; see ``docs/vi_vs_nuts.md`` for measured times and the sizes where NUTS is
    practical (networks of up to a few hundred weights, data of up to a few thousand rows).

    Args:
        model: A :class:`~pyro_bbb.BNN` (or any model ``model(x, y)`` whose latent sites are
            global and real-valued), with ``num_data == len(x)``.
        x: The whole training set's inputs ``(num_data, *features)``.
        y: Its targets ``(num_data[, dim])``.
        num_samples: Draws kept per chain.
        warmup_steps: Adaptation iterations per chain, discarded.
        num_chains: Independent chains.
        jit_compile: Compile the potential with ``torch.jit.trace`` (about 2× faster per
            gradient on small nets).
        seed: Chain ``c`` is seeded ``seed + c`` (initialisation and sampler); ``None`` draws
            a seed from torch's generator.
        progress: Show Pyro's progress bar (one chain at a time) or, with workers, a bar
            over finished chains.
        noise: For a Gaussian likelihood with a learned scale only: ``"fixed"`` holds it at
            its current value, a distribution over :math:`(0, \infty)` samples it with that
            prior (as site ``"likelihood.scale"``). Required for such a model, refused
            otherwise.
        init: ``"map"`` (a prior draw moved towards a mode), ``"prior"`` (a prior draw),
            ``{site: value}`` used for every chain, or a trained guide: each chain starts at
            its own draw from it, and the diagonal inverse mass matrix starts at the variances
            of 500 guide draws (adaptation then goes on from there).
        init_steps: Adam steps (learning rate 0.01) of ``init="map"``.
        max_tree_depth: NUTS's tree-depth cap.
        target_accept_prob: Step-size adaptation target.
        full_mass: Adapt a dense mass matrix instead of a diagonal one (cost
            :math:`O(d^2)` per step; pays on small, correlated posteriors).
        num_workers: Processes to run chains in (spawned; each keeps this process's torch
            thread count). Defaults to ``min(num_chains, os.cpu_count())``; 1 runs the
            chains here, one after another, and keeps their MCMC objects.

    Returns:
        A :class:`NUTSResult`.

    Raises:
        ValueError: If ``x`` and ``y`` disagree in rows, ``len(x) != model.num_data`` (a
            minibatch), a site is scaled, a count is not a positive int, or ``noise`` does
            not fit the likelihood (see ``noise``).
        NotImplementedError: For a latent site inside a plate or with a constrained support.
    """
    start_time = time.perf_counter()
    _check_data(model, x, y)
    _check_positive("num_samples", num_samples)
    _check_positive("warmup_steps", warmup_steps, minimum=0)
    _check_positive("num_chains", num_chains)
    _check_positive("init_steps", init_steps, minimum=0)
    _check_positive("max_tree_depth", max_tree_depth)
    if not (isinstance(init, Mapping) or callable(init) or init in ("map", "prior")):
        raise ValueError(
            f"init must be 'map', 'prior', a mapping of sites or a guide, got {init!r}"
        )
    if num_workers is None:
        num_workers = min(num_chains, os.cpu_count() or 1)
    _check_positive("num_workers", num_workers)
    if seed is None:
        seed = int(torch.randint(0, 2**31 - num_chains, ()))
    sites, noise_name, noise_value = _layout(model, x, y, noise)
    potential = _Potential(model, x, y, sites, noise_name, noise_value, jit_compile)
    options = {
        "max_tree_depth": max_tree_depth,
        "target_accept_prob": target_accept_prob,
        "full_mass": full_mass,
    }
    starts, inverse_mass = [None] * num_chains, None
    if callable(init):  # a guide: draw the starts here, the guide stays in this process
        pyro.set_rng_seed(seed)
        starts, inverse_mass = _guide_start(model, init, x, y, sites, num_chains)
        init = None
    jobs = [
        _ChainJob(
            potential, init, init_steps, seed + c, num_samples, warmup_steps, options,
            progress and num_workers == 1, c, starts[c], inverse_mass,
        )
        for c in range(num_chains)
    ]  # fmt: skip
    if num_workers == 1 or num_chains == 1:
        outputs = [_run_chain(job) for job in jobs]
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(num_workers, mp_context=context) as pool:
            futures = [pool.submit(_run_in_worker, job) for job in jobs]
            bar = tqdm(total=num_chains, desc="NUTS chains", disable=not progress)
            outputs = []
            for future in futures:
                outputs.append(future.result())
                bar.update()
            bar.close()
    return _result(outputs, sites, warmup_steps, noise, noise_name, noise_value, start_time)


def _result(outputs, sites, warmup_steps, noise, noise_name, noise_value, start_time):
    draws = torch.stack([out[0] for out in outputs])  # (chains, samples, dim)
    samples = {site.name: site.constrain(draws).detach() for site in sites}
    stats, warmup_stats = {}, {"mean_n_steps": [], "step_size": []}
    for name in _STAT_NAMES:
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
    mode = "none" if noise_name is None else ("fixed" if noise == "fixed" else "prior")
    return NUTSResult(
        samples=samples,
        sample_stats=stats,
        mcmc=tuple(out[2] for out in outputs),
        wall_time=time.perf_counter() - start_time,
        warmup_steps=warmup_steps,
        warmup_stats={k: torch.tensor(v) for k, v in warmup_stats.items()},
        noise=mode,
        noise_site=noise_name,
        noise_value=None if noise_value is None else float(noise_value),
    )
