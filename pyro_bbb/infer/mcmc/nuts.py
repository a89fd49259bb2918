r"""NUTS on the same full-batch model that SVI trains: :func:`run_nuts`.

:func:`run_nuts` samples :math:`p(w \mid x, y)` of a :class:`~pyro_bbb.BNN` with Pyro's
:class:`~pyro.infer.NUTS` (Hoffman & Gelman 2014, https://arxiv.org/abs/1111.4246) over the
flat potential of :mod:`~pyro_bbb.infer.mcmc.potential`, so no leapfrog step re-traces the
model. Chains run in spawned processes or one after another
(:mod:`~pyro_bbb.infer.mcmc.chains`); the draws come back as a
:class:`~pyro_bbb.infer.mcmc.result.NUTSResult`. ArviZ export, ESS and R̂ live in
:mod:`pyro_bbb.evaluation`.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Literal

import pyro
import torch
from tqdm.auto import tqdm

from ..._validation import check_int, check_tensor
from .chains import STAT_NAMES, ChainJob, guide_start, run_chain, run_in_worker
from .potential import Noise, Potential, flat_layout
from .result import NUTSResult

__all__ = ["run_nuts"]


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
    check_int("num_samples", num_samples)
    check_int("warmup_steps", warmup_steps, minimum=0)
    check_int("num_chains", num_chains)
    check_int("init_steps", init_steps, minimum=0)
    check_int("max_tree_depth", max_tree_depth)
    if not (isinstance(init, Mapping) or callable(init) or init in ("map", "prior")):
        raise ValueError(
            f"init must be 'map', 'prior', a mapping of sites or a guide, got {init!r}"
        )
    if num_workers is None:
        num_workers = min(num_chains, os.cpu_count() or 1)
    check_int("num_workers", num_workers)
    if seed is None:
        seed = int(torch.randint(0, 2**31 - num_chains, ()))
    sites, noise_name, noise_value = flat_layout(model, x, y, noise)
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
    jobs = [
        ChainJob(
            potential, init, init_steps, seed + c, num_samples, warmup_steps, options,
            progress and num_workers == 1, c, starts[c], inverse_mass,
        )
        for c in range(num_chains)
    ]  # fmt: skip
    if num_workers == 1 or num_chains == 1:
        outputs = [run_chain(job) for job in jobs]
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(num_workers, mp_context=context) as pool:
            futures = [pool.submit(run_in_worker, job) for job in jobs]
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
