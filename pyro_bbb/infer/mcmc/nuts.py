r"""NUTS on the same full-batch model that SVI trains: :func:`run_nuts`, with two backends.

:func:`run_nuts` samples :math:`p(w \mid x, y)` of a :class:`~pyro_bbb.BNN` with the No-U-Turn
Sampler (Hoffman & Gelman 2014, https://arxiv.org/abs/1111.4246) over one flat vector of
the latent sites (:mod:`~pyro_bbb.infer.mcmc.potential`):

* ``backend="pyro"``: Pyro's :class:`~pyro.infer.NUTS` over the torch potential
  (:mod:`~pyro_bbb.infer.mcmc.chains`), for any model with global real-valued sites;
* ``backend="numpyro"``: NumPyro's NUTS over the potential exported to JAX
  (:mod:`~pyro_bbb.infer.mcmc.numpyro_chains`), compiled as a whole and one to two orders
  of magnitude faster per draw, for the networks, priors and likelihoods the export knows.

Both start their chains at the same points for the same seed and return the same
:class:`~pyro_bbb.infer.mcmc.result.NUTSResult`. ArviZ export, ESS and R̂ live in
:mod:`pyro_bbb.evaluation`.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal

import pyro
import torch
from tqdm.auto import tqdm

from ..._validation import check_choice, check_int, check_tensor
from .chains import ChainJob, chain_statistics, guide_start, initial_theta, run_chain, run_in_worker
from .potential import Noise, Potential, check_evaluation_mode, flat_layout, flatten
from .result import NUTSResult

__all__ = ["BACKENDS", "run_nuts"]

#: The samplers :func:`run_nuts` can use.
BACKENDS = ("pyro", "numpyro")


def _check_data(model, x, y) -> None:
    check_tensor("x", x)
    check_tensor("y", y)
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


def _backend_options(backend, num_workers, chain_method, precision):
    """``(num_workers, chain_method, float64)``, refusing another backend's options."""
    if backend == "pyro":
        for name, value in (("chain_method", chain_method), ("precision", precision)):
            if value is not None:
                raise ValueError(
                    f"{name} is an option of backend='numpyro'; backend='pyro' runs chains in "
                    "num_workers processes, in the model's own dtype"
                )
        return check_int("num_workers", 1 if num_workers is None else num_workers), None, None
    if num_workers is not None:
        raise ValueError(
            "num_workers is an option of backend='pyro'; backend='numpyro' runs its chains "
            "as chain_method says ('vectorized', 'sequential' or 'parallel')"
        )
    from .numpyro_chains import CHAIN_METHODS  # JAX only when it is asked for

    chain_method = check_choice("chain_method", chain_method or "vectorized", CHAIN_METHODS)
    precision = check_choice("precision", precision or "float64", ("float64", "float32"))
    return None, chain_method, precision == "float64"


def run_nuts(
    model: Callable[..., Any],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    num_samples: int,
    warmup_steps: int,
    num_chains: int = 1,
    backend: Literal["pyro", "numpyro"] = "pyro",
    seed: int | None = None,
    progress: bool = True,
    noise: Noise = None,
    init: Literal["map", "prior"] | Mapping[str, torch.Tensor] | Callable = "map",
    init_steps: int = 1000,
    max_tree_depth: int = 10,
    target_accept_prob: float = 0.8,
    full_mass: bool = False,
    jit_compile: bool = True,
    num_workers: int | None = None,
    chain_method: Literal["vectorized", "sequential", "parallel"] | None = None,
    precision: Literal["float64", "float32"] | None = None,
) -> NUTSResult:
    r"""Sample the posterior of a full-batch model with NUTS.

    The model is traced once; the potential :math:`-\log p(y, w)` is a function of one flat
    vector of every weight (and the noise scale's unconstrained coordinate, if sampled).
    Each chain starts from its own prior draw, moved ``init_steps`` Adam steps towards a
    mode (``init="map"``), then runs ``warmup_steps`` of step-size and mass-matrix
    adaptation and keeps ``num_samples`` draws. A BNN posterior is multimodal: chains
    started apart may settle in different modes, which R̂ shows (see
    ``docs/vi_vs_nuts.md``).

    **Backends.** ``"pyro"`` runs Pyro's NUTS on the torch potential, compiled with
    ``torch.jit.trace`` when ``jit_compile``; it samples any model with global real-valued
    sites, and Pyro's tree building costs about 1 ms of Python per leapfrog step.
    ``"numpyro"`` (``pip install "pyro-bbb[numpyro]"``) exports the model's log joint to a
    JAX function of the same flat vector and runs NumPyro's NUTS over it, chains
    vectorised, in float64 by default: a BNN posterior is stiff (step sizes of 1e-3 and
    trajectories of a thousand steps), and float32 round-off in the energy over such a
    trajectory is large enough to bias the acceptance test. The export knows the networks
    :func:`~pyro_bbb.nn.mlp` builds, :func:`~pyro_bbb.nn.bayesianize`\ d Linear, ConvNd and
    ConvTransposeNd with elementwise activations, flattening, pooling, embeddings and
    normalisation layers (in a ``Sequential`` or any forward
    ``torch.fx`` traces), the priors of :mod:`pyro_bbb.priors` and the likelihoods of
    :mod:`pyro_bbb.likelihoods`; anything else raises before any sampling. A float32 or
    CUDA model is exported in the chosen precision on the CPU; its draws come back in the
    model's dtype, on its device. Both backends start at the same points for the same seed,
    and return the same site names, shapes and statistics (``energy`` only with NumPyro).

    Cost: each draw takes up to :math:`2^{\text{max\_tree\_depth}} - 1` gradient
    evaluations; see ``docs/vi_vs_nuts.md`` for measured times and the sizes where each
    backend is practical.

    Args:
        model: A :class:`~pyro_bbb.BNN` (``backend="pyro"``: any model ``model(x, y)`` whose
            latent sites are global and real-valued), with ``num_data == len(x)``, its
            dropout and normalisation layers in evaluation mode.
        x: The whole training set's inputs ``(num_data, *features)``.
        y: Its targets ``(num_data[, dim])``.
        num_samples: Draws kept per chain.
        warmup_steps: Adaptation iterations per chain, discarded.
        num_chains: Independent chains.
        backend: ``"pyro"`` or ``"numpyro"``, see above.
        seed: Chain ``c`` starts from a draw seeded ``seed + c``; Pyro's sampler is seeded
            the same way, NumPyro's with ``PRNGKey(seed)``. ``None`` draws a seed from
            torch's generator.
        progress: Show the sampler's progress bar (Pyro: one chain at a time, or a bar over
            finished chains with workers).
        noise: For a Gaussian likelihood with a learned scale only: ``"fixed"`` holds it at
            its current value, a distribution whose support lies in :math:`(0, \infty)`
            samples it with that prior (as site ``"likelihood.scale"``). Required for such a
            model, refused otherwise.
        init: ``"map"`` (a prior draw moved towards a mode), ``"prior"`` (a prior draw),
            ``{site: value}`` used for every chain, or a trained guide: each chain starts at
            its own draw from it, and the diagonal inverse mass matrix starts at the variances
            of 500 guide draws (adaptation then goes on from there).
        init_steps: Adam steps (learning rate 0.01, on the torch potential) of
            ``init="map"``.
        max_tree_depth: NUTS's tree-depth cap.
        target_accept_prob: Step-size adaptation target.
        full_mass: Adapt a dense mass matrix instead of a diagonal one (cost
            :math:`O(d^2)` per step; pays on small, correlated posteriors).
        jit_compile: Compile the torch potential with ``torch.jit.trace`` (the Pyro
            backend's sampler and ``init="map"``).
        num_workers: ``backend="pyro"`` only: processes to run chains in. 1 (the default)
            runs the chains here, one after another, and keeps their MCMC objects; this
            works from a script without an ``if __name__ == "__main__":`` guard and from a
            notebook. More spawns worker processes (each keeps this process's torch thread
            count), which re-import a script's ``__main__``: guard it.
        chain_method: ``backend="numpyro"`` only: ``"vectorized"`` (the default: one
            compiled program steps every chain, each iteration as long as the slowest
            chain's tree), ``"sequential"`` or ``"parallel"`` (one JAX device per chain:
            ``numpyro.set_host_device_count(n)`` before JAX starts).
        precision: ``backend="numpyro"`` only: ``"float64"`` (the default) or ``"float32"``.

    Returns:
        A :class:`NUTSResult`.

    Raises:
        ValueError: If ``backend`` is unknown, an option belongs to the other backend,
            ``x`` and ``y`` disagree in rows, ``len(x) != model.num_data`` (a minibatch), a
            site is scaled, a count is not a positive int, a dropout or normalisation layer
            is in training mode, or ``noise`` does not fit the likelihood.
        NotImplementedError: For a latent site inside a plate or with a constrained support;
            with ``backend="numpyro"``, for a model the export does not know (before
            any sampling).
        ImportError: For ``backend="numpyro"`` without JAX and NumPyro installed.
        RuntimeError: If worker processes die (e.g. an unguarded script with
            ``num_workers > 1``).
    """
    start_time = time.perf_counter()
    check_choice("backend", backend, BACKENDS)
    _check_data(model, x, y)
    check_int("num_samples", num_samples)
    check_int("warmup_steps", warmup_steps, minimum=0)
    check_int("num_chains", num_chains)
    check_int("init_steps", init_steps, minimum=0)
    check_int("max_tree_depth", max_tree_depth)
    if not (isinstance(init, Mapping) or callable(init) or init in ("map", "prior")):
        raise ValueError(
            f"init must be 'map', 'prior', a mapping of sites or a guide, got {init!r}"
        )
    num_workers, chain_method, float64 = _backend_options(
        backend, num_workers, chain_method, precision
    )
    check_evaluation_mode(model)
    if seed is None:
        seed = int(torch.randint(0, 2**31 - num_chains, ()))
    sites, noise_name, noise_value = flat_layout(model, x, y, noise)
    if backend == "numpyro":
        from .numpyro_chains import NumPyroChains  # JAX only when it is asked for

        exported = NumPyroChains(model, x, y, sites, noise_value, float64=float64)
    potential = Potential(model, x, y, sites, noise_name, noise_value, jit_compile)
    options = {
        "max_tree_depth": max_tree_depth,
        "target_accept_prob": target_accept_prob,
        "full_mass": full_mass,
    }
    starts, inverse_mass = [None] * num_chains, None
    if callable(init):  # a guide: draw the starts here, the guide stays in this process
        pyro.set_rng_seed(seed)
        starts, inverse_mass = guide_start(model, init, x, y, sites, num_chains)
        init = None
    if backend == "numpyro":
        if init in ("map", "prior"):  # the Pyro backend's starts, seeded alike
            for c in range(num_chains):
                pyro.set_rng_seed(seed + c)
                starts[c] = initial_theta(model, x, y, potential, "prior", 0)
        elif isinstance(init, Mapping):
            starts = [flatten(init, sites).detach()] * num_chains
        starts = torch.stack(list(starts))
        if init == "map":
            starts = exported.find_modes(starts, steps=init_steps)
        out = exported.run(
            starts, num_samples=num_samples, warmup_steps=warmup_steps,
            seed=seed, chain_method=chain_method, progress=progress, inverse_mass=inverse_mass,
            **options,
        )  # fmt: skip
        draws = torch.from_numpy(out.draws)
        stats = {name: torch.from_numpy(value) for name, value in out.stats.items()}
        stats["tree_depth"] = torch.ceil(torch.log2(stats["n_steps"] + 1.0)).long()
        warmup_stats = {k: torch.from_numpy(v) for k, v in out.warmup_stats.items()}
        mcmc = (None,) * num_chains
    else:
        jobs = [
            ChainJob(
                potential, init, init_steps, seed + c, num_samples, warmup_steps, options,
                progress and num_workers == 1, c, starts[c], inverse_mass,
            )
            for c in range(num_chains)
        ]  # fmt: skip
        outputs = _run_pyro_chains(jobs, num_workers, progress)
        draws = torch.stack([out[0] for out in outputs])  # (chains, samples, dim)
        stats, warmup_stats = chain_statistics(outputs)
        mcmc = tuple(out[2] for out in outputs)
    return NUTSResult(
        samples={site.name: site.constrain(draws).to(x) for site in sites},
        sample_stats=stats,
        mcmc=mcmc,
        wall_time=time.perf_counter() - start_time,
        warmup_steps=warmup_steps,
        warmup_stats=warmup_stats,
        noise="none" if noise_name is None else ("fixed" if noise == "fixed" else "prior"),
        noise_site=noise_name,
        noise_value=None if noise_value is None else float(noise_value),
        backend=backend,
    )


def _run_pyro_chains(jobs: list[ChainJob], num_workers: int, progress: bool) -> list:
    """Run Pyro's chains here, one after another, or in ``num_workers`` spawned processes."""
    if num_workers == 1 or len(jobs) == 1:
        return [run_chain(job) for job in jobs]
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(num_workers, mp_context=context) as pool:
            futures = [pool.submit(run_in_worker, job) for job in jobs]
            bar = tqdm(total=len(jobs), desc="NUTS chains", disable=not progress)
            outputs = []
            for future in futures:
                outputs.append(future.result())
                bar.update()
            bar.close()
    except BrokenProcessPool as error:
        raise RuntimeError(
            f"run_nuts's {num_workers} worker processes died. Spawned workers re-import the "
            "script that called run_nuts: a script without an `if __name__ == '__main__':` "
            "guard starts again in each of them, and classes defined in a notebook cannot be "
            "sent to them. Use num_workers=1 (the default: chains run here) or "
            "backend='numpyro' (chains vectorised in this process), or guard the script"
        ) from error
    return outputs
