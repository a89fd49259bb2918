r"""ArviZ export for VI and NUTS with one schema, at the size of a real network.

:func:`to_inference_data` turns a trained guide (``S`` draws) or a
:class:`~pyro_bbb.infer.mcmc.NUTSResult` into ArviZ ``InferenceData`` through one code path
(``az.from_dict``). It reads a selection as ArviZ does (``var_names``, ``filter_vars``,
``coords``; :mod:`~pyro_bbb.evaluation.selection`), draws only what it keeps
(:func:`~pyro_bbb.evaluation.draws.posterior_draws`, in slices of draws and rows), leaves out
on request the groups that grow with the data (``log_likelihood``, ``posterior_predictive``),
and before drawing anything refuses an export larger than ``max_bytes`` (1 GB), saying how
large it would be and what to pass (:func:`export_bytes`). This module draws no figures;
ArviZ (which imports matplotlib) is imported on first use, so ``import pyro_bbb`` stays light.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._validation import check_int
from ..infer.guides._base import seeded_draws
from ..infer.mcmc import NUTSResult
from ..training import ConvergenceWarning
from .draws import VI_CHAINS, DrawLayout, Draws, DrawSink, model_sites, posterior_draws
from .netcdf_export import CHAIN_DRAW, NetCDFExport, check_export_path
from .selection import DATA_DIM, select_coords, select_sites, site_dims

if TYPE_CHECKING:
    import arviz as az

__all__ = ["MAX_BYTES", "export_bytes", "to_inference_data", "warn_if_stopped_on_predictive"]

#: The largest export :func:`to_inference_data` builds unless told otherwise (1 GB).
MAX_BYTES = 1e9


#: The guides already warned that their fit stopped on the predictive (each is warned once).
_WARNED: weakref.WeakSet = weakref.WeakSet()


def warn_if_stopped_on_predictive(posterior: Any, where: str) -> None:
    """Warn once per guide whose last fit stopped on the predictive, not on convergence.

    :func:`~pyro_bbb.fit` leaves ``guide.fit_until`` (its ``History.until``): ``"predictive"``
    for its default automatic run, which ends when further steps stop paying on the
    predictive, while the posterior's sds may still be far from their optimum; the
    ``ConvergenceWarning`` names ``until="converged"``, the run to use before the posterior
    itself is read. A NUTS result, a guide never fitted, a fixed-length fit (``None``) or a
    strict one is not warned.

    Args:
        posterior: A guide or a NUTS result.
        where: The function that reads the posterior, for the message.
    """
    if getattr(posterior, "fit_until", None) != "predictive":
        return
    try:
        if posterior in _WARNED:
            return
        _WARNED.add(posterior)
    except TypeError:  # a guide that takes no weak reference is warned every time
        pass
    warnings.warn(
        f"{where} reads the posterior of a guide whose fit stopped on the predictive "
        '(fit\'s default, until="predictive"; History.until): further steps had stopped '
        "paying on the predictive, but the posterior's sds may still be far from their "
        "optimum (up to 1.6 times too wide on conjugate regressions at fit's defaults). "
        'Train with fit(..., until="converged") before exporting the posterior or comparing '
        "it with NUTS",
        ConvergenceWarning,
        stacklevel=3,
    )


def numpy_of(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def export_bytes(
    sites: Mapping[str, tuple[Sequence[int], torch.dtype]],
    num_draws: int,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    log_likelihood: bool = True,
    posterior_predictive: bool = True,
) -> dict[str, int]:
    """The bytes each group of an export holds, before anything is drawn.

    Args:
        sites: ``{site: (shape kept, dtype)}`` of the posterior's variables.
        num_draws: Chains × draws.
        x: The rows' inputs.
        y: Their targets.
        log_likelihood: Whether the export holds the pointwise log-likelihood.
        posterior_predictive: Whether it holds the posterior predictive.

    Returns:
        ``{group: bytes}``: ``"posterior"``, and where asked ``"log_likelihood"``
        (``num_draws × rows`` of the weights' dtype), ``"posterior_predictive"`` (of ``y``'s
        element size), and with either of those ``"observed_data"`` and ``"constant_data"``.
    """
    itemsize = max((dtype.itemsize for _, dtype in sites.values()), default=4)
    sizes = {
        "posterior": num_draws
        * sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in sites.values())
    }
    if log_likelihood:
        sizes["log_likelihood"] = num_draws * y.shape[0] * itemsize
    if posterior_predictive:
        sizes["posterior_predictive"] = num_draws * y.numel() * y.element_size()
    if log_likelihood or posterior_predictive:
        sizes["observed_data"] = y.numel() * y.element_size()
        sizes["constant_data"] = x.numel() * x.element_size()
    return sizes


def _size(num_bytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.3g} {unit}"
    return f"{num_bytes:.0f} B"


def _refuse(
    sizes: Mapping[str, int],
    sites: Mapping[str, tuple[Sequence[int], torch.dtype]],
    num_draws: int,
    var_names: Any,
    max_bytes: float,
) -> None:
    """Raise, saying how large the export would be, where, and what to pass."""
    by_layer: dict[str, int] = {}
    for name, (shape, dtype) in sites.items():
        layer = name.rpartition(".")[0] or name
        by_layer[layer] = by_layer.get(layer, 0) + num_draws * int(np.prod(shape)) * dtype.itemsize
    largest = sorted(by_layer.items(), key=lambda item: -item[1])[:6]
    layers = ", ".join(f"{layer!r} {_size(b)}" for layer, b in largest)
    groups = ", ".join(f"{group} {_size(b)}" for group, b in sizes.items())
    raise ValueError(
        f"to_inference_data would build {_size(sum(sizes.values()))}, above max_bytes="
        f"{max_bytes:g} ({groups}; var_names={var_names!r}: {len(sites)} sites, "
        f"{sum(int(np.prod(s)) for s, _ in sites.values()):,} values a draw over "
        f"{num_draws:,} draws; by layer: {layers}). Pass var_names= for some sites (a "
        f"layer's by its name, e.g. var_names={largest[-1][0]!r}) or coords= for some of "
        "their units, log_likelihood=False and posterior_predictive=False to leave out what "
        "grows with the rows (or pass fewer rows), a smaller num_samples, path= to write it "
        "into a file as it is drawn (memory then holds a slice of it), or max_bytes=None to "
        "build it anyway"
    )


def to_inference_data(
    model: Callable[..., Any],
    posterior: Callable[..., Any] | NUTSResult,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    var_names: str | Sequence[str] | None = None,
    filter_vars: str | None = None,
    coords: Mapping[str, Any] | None = None,
    log_likelihood: bool = True,
    posterior_predictive: bool = True,
    num_samples: int = 125,
    num_chains: int | None = None,
    batch_size: int | None = None,
    max_bytes: float | None = MAX_BYTES,
    path: str | os.PathLike | None = None,
    seed: int | None = None,
) -> az.InferenceData:
    r"""ArviZ ``InferenceData`` of a guide or a NUTS result, one schema for both.

    Groups (``C`` chains, ``S`` draws; a guide's independent draws are split into
    ``num_chains`` chains (4 by default) of ``num_samples`` draws, an
    :class:`~pyro_bbb.infer.Ensemble` is one chain of ``num_samples`` draws per member):

    * ``posterior``: the sampled sites ``var_names`` selects, by name (``"0.weight"``
      ``(C, S, out, in)`` with dims ``("0.out", "0.in")``; a layer's weight and bias share
      ``"<layer>.out"``); a noise scale NUTS sampled appears as ``"likelihood.scale"``.
    * ``posterior_predictive`` (unless ``posterior_predictive=False``): ``"obs"``
      ``(C, S, data[, obs_dim])`` drawn from the likelihood under each draw at ``x``.
    * ``log_likelihood`` (unless ``log_likelihood=False``): ``"obs"`` ``(C, S, data)``,
      :math:`\log p(y_i \mid w_s)` on the data given (what ``az.loo`` and ``az.waic`` read).
    * ``observed_data``: ``"obs"`` = ``y``; ``constant_data``: ``"x"``, with either of the
      two groups above.
    * ``sample_stats``: for NUTS the sampler's ``lp``, ``diverging``, ``tree_depth``,
      ``n_steps``, ``step_size``, ``acceptance_rate`` (on its training data); for a guide,
      with either data group, ``lp`` = :math:`\log p(y, w_s)` on the data given and
      ``log_q`` = :math:`\log q(w_s)` of every site.

    **At the size of a real network.** A 784-400-400-10 network has 478,410 weights: 500
    draws of all of them are 957 MB, and ``az.summary`` of them runs for many minutes. So the
    selection is read as ``az.summary`` reads it, before drawing: ``var_names="1"`` exports
    layer ``1``'s sites, ``coords={"1.out": [0, 1, 2]}`` three of its units; a guide that
    draws site by site (mean-field, point masses, their ensembles) then draws those alone
    when no data group is asked. The data groups grow with the rows (``C·S`` values a row,
    and ``x`` itself): leave them out with ``log_likelihood=False`` and
    ``posterior_predictive=False``, or pass fewer rows (``x[:1000], y[:1000]``, or
    ``coords={"data": ...}``). Whatever is asked is drawn a slice of draws and rows at a time
    in bounded memory, and an export above ``max_bytes`` is refused before anything is drawn,
    with its size by group and layer and what to pass. Values stay float32 (the weights'
    dtype).

    **Into a file.** With ``path=``, what grows with the draws (the sites, the pointwise
    log-likelihood, the predictive) is written into a netCDF file slice by slice as it is
    drawn, so the memory holds one slice, not the export: layer ``2`` of the 784-400-400-10
    network (160,400 weights, 321 MB at 4 × 125 draws) is exported in under 100 MB above
    what the process held. The file has ArviZ's layout (what ``InferenceData.to_netcdf``
    writes; :mod:`~pyro_bbb.evaluation.netcdf_export`), and the ``InferenceData`` returned
    is ``az.from_netcdf(path)``: it reads the values from the file when they are used
    (``az.summary`` reads the variables it summarises), and the file can be opened again in
    another session. With the same ``seed`` the file holds the numbers the export in memory
    would.

    With at least two chains, ``az.summary``, ``az.ess`` and ``az.rhat`` run on a guide's
    export as on NUTS's. For a guide R̂ is 1 up to the noise of the split (its draws are
    independent; every chain has the same distribution) and the ESS is about the number of
    draws: they check the export, not the fit. For an ensemble R̂ compares the members: well
    above 1 means the members found different posteriors (modes), which is what an ensemble
    is for.

    Args:
        model: The model, e.g. a :class:`~pyro_bbb.BNN`.
        posterior: A trained guide or a :class:`~pyro_bbb.infer.mcmc.NUTSResult`.
        x: Inputs ``(batch, *features)``: the training set or any other, e.g. a test set.
        y: Targets ``(batch[, dim])``.
        var_names: The sites to export, as ArviZ reads them
            (:func:`~pyro_bbb.evaluation.selection.select_sites`): a name or list of names of
            sites or layers (``"fc1"`` for ``"fc1.weight"`` and ``"fc1.bias"``), or names to
            leave out, each with ``"~"``. ``None``: every site.
        filter_vars: ``None`` (exact names and layers), ``"like"`` (substrings) or
            ``"regex"`` (regular expressions), as in ArviZ.
        coords: ``{dim: indices}`` of the units to keep, as ``az.summary``'s ``coords``
            select them (not ``az.from_dict``'s, which label them): ``{"0.out": [3, 7]}``
            keeps units 3 and 7 of layer ``0`` (its weights' rows and its biases), labelled
            3 and 7; ``{"data": range(1000)}`` keeps the first 1,000 rows.
        log_likelihood: Whether to build the ``log_likelihood`` group.
        posterior_predictive: Whether to build the ``posterior_predictive`` group.
        num_samples: Draws per chain from a guide, per member from an ensemble (ignored
            for NUTS, which uses all its draws).
        num_chains: Chains of a guide's draws; ``None`` takes 4. An ensemble's chains are
            its members and a NUTS result's its own: ``None`` or their number.
        batch_size: Rows per pass of the model (``None``: as many as hold about 256 MiB of
            activations; see :func:`~pyro_bbb.predict`).
        max_bytes: The largest export to build, in bytes (``None``: no limit); with
            ``path``, the largest to hold in memory (the data groups: the rest is written
            into the file).
        path: A netCDF file to write the export into as it is drawn (written over where it
            exists; the ``InferenceData`` returned reads it); ``None`` builds the export in
            memory.
        seed: Seed for the guide draws and predictive draws (the caller's random state is
            left as it was).

    Returns:
        An ``arviz.InferenceData`` (with ``path``, read from that file as used).

    Warns:
        ConvergenceWarning: Once per guide, when its fit stopped on the predictive
            (``fit``'s default ``until="predictive"``): its sds may be far from the
            posterior's; ``until="converged"`` is the run to export.

    Raises:
        ValueError: If the export would hold more than ``max_bytes`` (the message gives its
            size by group and layer, and what to pass); on a bad selection (as
            :func:`~pyro_bbb.evaluation.selection.select_sites` and
            :func:`~pyro_bbb.evaluation.selection.select_coords`); as
            :func:`~pyro_bbb.evaluation.draws.posterior_draws`.
        KeyError: If a name in ``var_names`` or a dim in ``coords`` matches nothing.
        OSError: With ``path``, before anything is drawn, if its folder does not exist, it
            is a folder, or the disk there has less room than the export takes.
    """
    warn_if_stopped_on_predictive(posterior, "to_inference_data")
    check_int("num_samples", num_samples)
    check_int("num_chains", num_chains, optional=True)
    latent = model_sites(model, x, posterior)
    kept = select_sites(var_names, list(latent), filter_vars)
    dims = {name: site_dims(name, latent[name][0]) for name in kept}
    sizes = {dim: n for name in kept for dim, n in zip(dims[name], latent[name][0], strict=True)}
    chosen = select_coords(coords, {**sizes, DATA_DIM: x.shape[0]})
    rows = chosen.pop(DATA_DIM, None)
    if rows is not None:
        x, y = x[rows.to(x.device)], y[rows.to(y.device)]
    shapes = {
        name: ([len(chosen.get(d, range(n))) for d, n in zip(dims[name], shape, strict=True)], dt)
        for name in kept
        for shape, dt in [latent[name]]
    }
    num_draws = _num_draws(posterior, num_samples, num_chains)
    size = export_bytes(
        shapes, num_draws, x, y,
        log_likelihood=log_likelihood, posterior_predictive=posterior_predictive,
    )  # fmt: skip
    held = size if path is None else {k: v for k, v in size.items() if k in _DATA_GROUPS}
    if max_bytes is not None and sum(held.values()) > max_bytes:
        _refuse(size, shapes, num_draws, var_names, max_bytes)
    if path is not None:
        path = check_export_path(path, sum(size.values()))
    data = log_likelihood or posterior_predictive
    observed = getattr(model, "observation_site", "obs")
    data_dims = [DATA_DIM] + (["obs_dim"] if y.dim() > 1 else [])
    if data:
        dims[observed] = data_dims
        dims["x"] = [DATA_DIM] + [f"x_dim_{i}" for i in range(x.dim() - 1)]
    labels = {dim: index.tolist() for dim, index in chosen.items()}
    if rows is not None and data:
        labels[DATA_DIM] = rows.tolist()
    import arviz as az

    export = None if path is None else NetCDFExport(path, labels)
    sink = None if export is None else _sink(export, dims, observed)
    try:
        with seeded_draws(posterior, seed, x):
            draws = posterior_draws(
                model, posterior, x, y if data else None,
                num_samples=num_samples, num_chains=num_chains, sites=kept, coords=chosen,
                log_likelihood=log_likelihood, predictive=posterior_predictive,
                batch_size=batch_size, sink=sink,
            )  # fmt: skip
        groups = _groups(draws, posterior, x, y, observed, log_likelihood, posterior_predictive)
        if export is None:
            return az.from_dict(**groups, dims=dims, coords=labels or None)
        for group, variables in groups.items():
            lead = () if group in _DATA_GROUPS else CHAIN_DRAW
            for name, values in variables.items():
                named = [*lead, *dims.get(name, ())]
                named += [f"{name}_dim_{i}" for i in range(values.ndim - len(named))]
                export.write(group, name, values, named)
        export.close()
    except BaseException:
        if export is not None:
            export.discard()
        raise
    return az.from_netcdf(path)


#: The groups of the data themselves: no chain or draw dims.
_DATA_GROUPS = ("observed_data", "constant_data")


def _sink(export: NetCDFExport, dims: Mapping[str, Sequence[str]], observed: str) -> Callable:
    """What :func:`posterior_draws` sends to ``export``: the arrays that grow with the draws."""
    written = {
        "log_likelihood": ("log_likelihood", observed),
        "predictive": ("posterior_predictive", observed),
    }

    def sink(key: str, layout: DrawLayout) -> DrawSink | None:
        if key in written:
            group, name = written[key]
            return export.sink(group, name, dims[name], layout)
        if key in dims:  # a site of the posterior
            return export.sink("posterior", key, dims[key], layout)
        return None  # per draw alone (lp, log_q): kept in memory

    return sink


def _groups(
    draws: Draws,
    posterior: object,
    x: torch.Tensor,
    y: torch.Tensor,
    observed: str,
    log_likelihood: bool,
    posterior_predictive: bool,
) -> dict[str, dict[str, np.ndarray]]:
    """The export's groups of what ``draws`` holds in memory, as numpy arrays."""
    groups: dict[str, dict[str, np.ndarray]] = {
        "posterior": {k: numpy_of(v) for k, v in draws.values.items()}
    }
    if posterior_predictive and draws.predictive is not None:
        groups["posterior_predictive"] = {observed: numpy_of(draws.predictive)}
    if log_likelihood and draws.log_likelihood is not None:
        groups["log_likelihood"] = {observed: numpy_of(draws.log_likelihood)}
    if log_likelihood or posterior_predictive:
        groups["observed_data"] = {observed: numpy_of(y)}
        groups["constant_data"] = {"x": numpy_of(x)}
    if isinstance(posterior, NUTSResult):
        groups["sample_stats"] = {k: numpy_of(v) for k, v in posterior.sample_stats.items()}
    elif draws.total_log_likelihood is not None:
        groups["sample_stats"] = {"lp": numpy_of(draws.log_joint), "log_q": numpy_of(draws.log_q)}
    return {group: variables for group, variables in groups.items() if variables}


def _num_draws(posterior: object, num_samples: int, num_chains: int | None) -> int:
    """Chains × draws an export of ``posterior`` holds (checked again when drawing)."""
    if isinstance(posterior, NUTSResult):
        return posterior.num_chains * posterior.num_samples
    members = getattr(posterior, "num_members", None)
    chains = members if members is not None else (num_chains or VI_CHAINS)
    return chains * num_samples
