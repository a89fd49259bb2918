r"""A posterior's weight draws, replayed through the model, in slices that bound the memory.

:func:`posterior_draws` draws ``C × S`` weight vectors from a guide (or takes a NUTS result's)
and, asked to, replays them through the model on the data: the pointwise log-likelihood, the
posterior predictive, :math:`\log p(w)` and :math:`\log q(w)` per draw. It keeps the sites
asked for only, and holds the whole network's draws a slice of draws at a time (a
784-400-400-10 network at 500 draws is 957 MB of weights), each slice replayed a slice of rows
at a time (:mod:`pyro_bbb.infer.slices`). Where nothing is replayed, a guide that draws its
sites one by one (:class:`~pyro_bbb.MeanFieldGuide`, :class:`~pyro_bbb.DeltaGuide`, an
:class:`~pyro_bbb.infer.Ensemble` of them) draws the sites asked for and no other.

The ArviZ export (:mod:`~pyro_bbb.evaluation.inference_data`) and PSIS
(:mod:`~pyro_bbb.evaluation.diagnostics`) read these draws.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyro
import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample

from .._support import independent_base
from .._validation import check_int
from ..infer import DeltaGuide, Ensemble, MeanFieldGuide
from ..infer.mcmc import NUTSResult, replay_nuts
from ..infer.sites import model_in_plates, prior_latent_sites
from ..infer.slices import SLICE_BYTES, ModelReplay, Undrawn, draws_per_slice
from .selection import site_dims

__all__ = ["VI_CHAINS", "DrawLayout", "DrawSink", "Draws", "model_sites", "posterior_draws"]

#: Name of the plate over draws (placed left of the model's plates).
_DRAWS_PLATE = "_draws"
#: Chains a guide's independent draws are split into by default.
VI_CHAINS = 4
#: What a slice of draws holds, as a multiple of its sites' values: the values, a copy of a
#: block's slices, and a log-density's elementwise terms.
_DRAW_FACTOR = 3
#: A slice of draws takes this share of :data:`~pyro_bbb.infer.slices.SLICE_BYTES`; the
#: activations of its passes over the rows take the budget's whole, so that together they
#: hold about 1.25 times it.
_DRAW_SHARE = 0.25


@dataclass(frozen=True)
class Draws:
    r"""Weight draws of a posterior, and what they give when replayed through a model.

    ``C`` chains of ``S`` draws; what was not asked for is ``None``.

    Attributes:
        values: ``{site: (C, S, *site shape)}`` of the sites kept (their selected units).
        log_prior: :math:`\log p(w)` per draw, ``(C, S)``, if replayed.
        log_q: :math:`\log q(w)` per draw for a guide, if replayed (for an ensemble, the
            density of the mixture of its members).
        log_likelihood: :math:`\log p(y_i \mid w_s)` per draw and row, ``(C, S, rows)``.
        total_log_likelihood: :math:`\sum_i \log p(y_i \mid w_s)` per draw, ``(C, S)``, if
            replayed on targets.
        predictive: Targets drawn from the likelihood under each draw, ``(C, S, rows[,
            dim])``.
    """

    values: dict[str, torch.Tensor]
    log_prior: torch.Tensor | None = None
    log_q: torch.Tensor | None = None
    log_likelihood: torch.Tensor | None = None
    total_log_likelihood: torch.Tensor | None = None
    predictive: torch.Tensor | None = None

    @property
    def log_joint(self) -> torch.Tensor:
        r""":math:`\log p(y, w_s) = \log p(w_s) + \sum_i \log p(y_i \mid w_s)`, ``(C, S)``."""
        if self.log_prior is None or self.total_log_likelihood is None:
            raise ValueError("the draws were not replayed on targets: no log p(y, w)")
        return self.log_prior + self.total_log_likelihood


@torch.no_grad()
def model_sites(
    model: Callable[..., Any], x: torch.Tensor, posterior: object = None
) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """The model's latent sites (outside its plates): ``{site: (shape, dtype)}``, in order.

    A NUTS result's are its samples' (a sampled noise scale among them); any other model's
    come from one trace of the model on two rows of ``x``, drawing from the prior, after
    which the random state and the model's buffers are as they were.

    Args:
        model: The model.
        x: Inputs it takes, ``(batch, *features)``.
        posterior: A :class:`~pyro_bbb.infer.mcmc.NUTSResult`, whose samples name the sites.
    """
    if isinstance(posterior, NUTSResult):
        return {k: (v.shape[2:], v.dtype) for k, v in posterior.samples.items()}
    return {
        name: (site["value"].shape, site["value"].dtype)
        for name, site in prior_latent_sites(model, x[:2]).items()
    }


class DrawSink(Protocol):
    """Where the slices of one kept quantity go, as :func:`posterior_draws` makes them."""

    def add(self, start: int, part: torch.Tensor) -> None:
        """Take plate draws ``start`` to ``start + n - 1``: a slice, laid out as drawn."""


class DrawLayout:
    """How a plate of draws maps onto ``C`` chains of ``S`` draws.

    A guide's ``C·S`` draws are chain-major, an ensemble's ``S`` draws of each of its ``C``
    members draw-major (a slice holds every member: ``(n, C, ...)``), a NUTS result's are its
    chains' (chain-major).
    """

    def __init__(self, chains: int, draws: int, ensemble: bool) -> None:
        self.chains, self.draws, self.ensemble = chains, draws, ensemble
        self.plate_size = draws if ensemble else chains * draws

    def lead(self, t: torch.Tensor, n: int, event: Sequence[int] | int) -> torch.Tensor:
        """A slice's tensor over ``n`` draws of the plate, as ``(n, [C,] *event)``.

        ``event`` is the trailing shape, or the number of trailing dims, to keep.
        """
        rest = t.shape[t.dim() - event :] if isinstance(event, int) else tuple(event)
        return t.reshape(n, self.chains, *rest) if self.ensemble else t.reshape(n, *rest)

    def shape_of(self, part: torch.Tensor) -> tuple[int, ...]:
        """The shape of every draw of what ``part`` is a slice of: ``(C, S, *rest)``."""
        rest = part.shape[2:] if self.ensemble else part.shape[1:]
        return (self.chains, self.draws, *rest)

    def pieces(
        self, start: int, part: torch.Tensor
    ) -> Iterator[tuple[int | slice, slice, torch.Tensor]]:
        """``(chain, draws, values)``: where a slice from plate draw ``start`` goes in ``(C, S)``.

        A chain-major slice that crosses a chain's end comes in one piece per chain.
        """
        n = part.shape[0]
        if self.ensemble:
            yield slice(None), slice(start, start + n), part.transpose(0, 1)
            return
        done = 0
        while done < n:
            chain, draw = divmod(start + done, self.draws)
            m = min(self.draws - draw, n - done)
            yield chain, slice(draw, draw + m), part[done : done + m]
            done += m


class _InMemory:
    """Slices of draws copied, as they come, into one ``(C, S, ...)`` tensor."""

    def __init__(self, layout: DrawLayout) -> None:
        self.layout = layout
        self.tensor: torch.Tensor | None = None

    def add(self, start: int, part: torch.Tensor) -> None:
        if self.tensor is None:
            self.tensor = part.new_empty(self.layout.shape_of(part))
        for chain, draws, values in self.layout.pieces(start, part):
            self.tensor[chain, draws] = values


def _draws_per_slice(
    sites: Mapping[str, tuple[torch.Size, torch.dtype]], members: int, total: int
) -> int:
    one = sum(shape.numel() * dtype.itemsize for shape, dtype in sites.values()) * members
    return draws_per_slice(_DRAW_FACTOR * one, total, _DRAW_SHARE * SLICE_BYTES)


@torch.no_grad()
def posterior_draws(
    model: Callable[..., Any],
    posterior: Callable[..., Any] | NUTSResult,
    x: torch.Tensor,
    y: torch.Tensor | None = None,
    *,
    num_samples: int = 125,
    num_chains: int | None = None,
    sites: Sequence[str] | None = None,
    coords: Mapping[str, torch.Tensor] | None = None,
    log_likelihood: bool = True,
    predictive: bool = False,
    batch_size: int | None = None,
    sink: Callable[[str, DrawLayout], DrawSink | None] | None = None,
) -> Draws:
    """Draw weights from a guide (or take a NUTS result's) and replay them through the model.

    Vectorised over draws: one ``pyro.plate`` of draws left of the model's plates. A guide's
    draws are independent, so splitting them into chains is only a reshape; it lets ArviZ's
    R̂ and ESS, which need at least two chains, read them as they read MCMC's.

    **Memory.** A guide is drawn a slice of draws at a time, each slice's weights of every site
    (with room for their log-densities) a quarter of
    :data:`~pyro_bbb.infer.slices.SLICE_BYTES` at most, and each slice is replayed on the
    rows a slice of rows at a time (``batch_size``, or rows sized by the activations they
    take). What is kept is what was asked: the sites in ``sites`` (their units in
    ``coords``), and per draw and row the log-likelihood and the predictive. With a single
    slice the numbers are those of one pass.

    Args:
        model: The model, e.g. a :class:`~pyro_bbb.BNN`.
        posterior: A trained guide or a :class:`~pyro_bbb.infer.mcmc.NUTSResult`.
        x: Inputs ``(rows, *features)``.
        y: Targets ``(rows[, dim])``, or ``None``: the model is replayed on the rows (giving
            ``log_prior``, ``log_q`` and the log-likelihood) when ``y`` is given or a
            predictive is asked for.
        num_samples: Draws per chain from a guide (per member, for an ensemble); a NUTS
            result uses all its draws.
        num_chains: Chains of a guide's draws (``None``: 4). An ensemble's chains are its
            members and a NUTS result's its own: ``None`` or their number.
        sites: The sites to keep (``None``: every latent site of the model; ``[]``: none).
        coords: ``{dim: int64 indices}`` of the units to keep along the sites' dims
            (:func:`~pyro_bbb.evaluation.selection.site_dims`).
        log_likelihood: Whether to keep the pointwise log-likelihood (with ``y``; its sum
            per draw is kept regardless).
        predictive: Whether to draw the targets under each draw.
        batch_size: Rows per pass of the model (``None``: sized by their activations).
        sink: Where what is kept goes instead of memory: called once for each kept
            quantity (a site's name, ``"log_likelihood"``, ``"predictive"``, ``"log_prior"``,
            ``"log_q"``, ``"total_log_likelihood"``) with the plate's layout, it returns a
            :class:`DrawSink` that takes every slice of that quantity as it is made, or
            ``None`` to keep it in memory. The ArviZ export writes its large arrays into a
            file this way, so that what it holds is a slice.

    Returns:
        :class:`Draws`: ``num_chains`` chains of ``num_samples`` draws for a guide, one chain
        per member for an :class:`~pyro_bbb.infer.Ensemble`, the result's chains for NUTS.
        What was not computed, or went to ``sink``, is ``None`` (a site sent to ``sink`` is
        not in ``values``).

    Raises:
        ValueError: If ``num_samples``, ``num_chains`` or ``batch_size`` is not a positive
            int, ``num_chains`` differs from an ensemble's members or a NUTS result's chains,
            ``y`` does not fit the model's output, or ``sites`` names a site the model has not.
    """
    check_int("num_chains", num_chains, optional=True)
    check_int("batch_size", batch_size, optional=True)
    observed = getattr(model, "observation_site", "obs")
    ensemble = isinstance(posterior, Ensemble)
    nuts = isinstance(posterior, NUTSResult)
    if nuts:
        layout = DrawLayout(posterior.num_chains, posterior.num_samples, False)
        _check_chains(num_chains, layout.chains, "the NUTS result's chains")
    else:
        draws = check_int("num_samples", num_samples)
        if ensemble:
            chains = _check_chains(num_chains, posterior.num_members, "the ensemble's members")
        else:
            chains = VI_CHAINS if num_chains is None else num_chains
        layout = DrawLayout(chains, draws, ensemble)
    latent = model_sites(model, x, posterior)
    sites = list(latent) if sites is None else list(sites)
    unknown = [name for name in sites if name not in latent]
    if unknown:
        raise ValueError(f"sites {unknown} are not the model's; its sites are {list(latent)}")
    coords = dict(coords or {})
    replayed = predictive or y is not None
    targets: dict[str, DrawSink] = {}

    def into(key: str) -> DrawSink:
        if key not in targets:
            external = None if sink is None else sink(key, layout)
            targets[key] = _InMemory(layout) if external is None else external
        return targets[key]

    if nuts:  # the draws are there
        for name in sites:
            into(name).add(
                0, _selected(posterior.samples[name], name, latent, coords, 2).flatten(0, 1)
            )
        if not replayed:
            return _collected(targets, sites)
        replayed_model, guide = replay_nuts(model, posterior)
        step, undrawn = layout.plate_size, set()
    else:
        replayed_model, guide = model, posterior
        family = posterior.members if ensemble else posterior
        drawn = latent
        if not replayed and isinstance(family, (MeanFieldGuide, DeltaGuide)):
            drawn = {name: latent[name] for name in sites}  # drawn site by site: these only
        undrawn = set(latent) - set(drawn)
        members = layout.chains if ensemble else 1
        step = _draws_per_slice(drawn, members, layout.plate_size)
    replayed_model, nesting = model_in_plates(replayed_model, guide)
    plate_dim = -((nesting or 1) + 1)
    module = model if isinstance(model, torch.nn.Module) else None
    num_data = getattr(model, "num_data", None)
    # The model checks y against its likelihood, but refuses more rows than num_data (a
    # minibatch of the training set); a larger test set is run without y, checked here.
    y_model = None if num_data is not None and x.shape[0] > num_data else y
    rows = batch_size
    for start in range(0, layout.plate_size, step):
        n = min(step, layout.plate_size - start)
        plate = pyro.plate(_DRAWS_PLATE, n, dim=plate_dim)
        guide_trace = poutine.trace(Undrawn(undrawn)(plate(guide))).get_trace(x, y_model)
        parts = {}
        if not nuts:
            for name in sites:
                value = layout.lead(guide_trace.nodes[name]["value"], n, latent[name][0])
                parts[name] = _selected(value, name, latent, coords, 2 if ensemble else 1)
        if replayed:
            if not nuts:
                parts["log_q"] = _log_q(posterior, guide_trace, layout, n)
            replay = ModelReplay(replayed_model, guide_trace, plate, observed, module)
            rows = rows or replay.rows_per_slice(x)
            parts.update(_replayed(replay, x, y, rows, num_data, layout, n, predictive))
            if not log_likelihood:  # its per-row values are not kept: no slice's is gathered
                parts.pop("log_likelihood", None)
        for key, part in parts.items():
            into(key).add(start, part)
    return _collected(targets, sites)


def _collected(targets: Mapping[str, DrawSink], sites: Sequence[str]) -> Draws:
    """The :class:`Draws` of what was kept in memory (``None`` for what went elsewhere)."""
    out = {key: t.tensor for key, t in targets.items() if isinstance(t, _InMemory)}
    return Draws(
        {name: out[name] for name in sites if name in out},
        log_prior=out.get("log_prior"),
        log_q=out.get("log_q"),
        log_likelihood=out.get("log_likelihood"),
        total_log_likelihood=out.get("total_log_likelihood"),
        predictive=out.get("predictive"),
    )


def _check_chains(num_chains: int | None, chains: int, what: str) -> int:
    """``chains``, after checking that ``num_chains`` is ``None`` or equal to it."""
    if num_chains is not None and num_chains != chains:
        raise ValueError(
            f"num_chains={num_chains} but the chains are {what} ({chains}); pass "
            f"num_chains=None or {chains}"
        )
    return chains


def _selected(
    value: torch.Tensor,
    name: str,
    latent: Mapping[str, tuple[torch.Size, torch.dtype]],
    coords: Mapping[str, torch.Tensor],
    lead: int,
) -> torch.Tensor:
    """``value`` ``(*lead dims, *site shape)`` with the units of ``coords`` along its dims."""
    for axis, dim in enumerate(site_dims(name, latent[name][0])):
        if dim in coords:
            value = value.index_select(lead + axis, coords[dim].to(value.device))
    return value


def _per_draw(log_prob: torch.Tensor, n: int, layout: DrawLayout) -> torch.Tensor:
    """A log-density over a slice's draws (and the model's plates) summed to ``(n[, C])``."""
    flat = log_prob.reshape(n * (layout.chains if layout.ensemble else 1), -1).sum(-1)
    return layout.lead(flat, n, 0)


def _log_q(posterior, guide_trace: poutine.Trace, layout: DrawLayout, n: int) -> torch.Tensor:
    r""":math:`\log q(w)` of each draw of the slice, ``(n[, C])``."""
    if layout.ensemble:
        return layout.lead(posterior.mixture_log_prob(guide_trace), n, 0)
    return _log_density(guide_trace, n, layout)


def _log_prior(trace: poutine.Trace, observed: str, n: int, layout: DrawLayout) -> torch.Tensor:
    r""":math:`\log p(w)` of each draw of the slice from the model's trace, ``(n[, C])``."""
    return _log_density(trace, n, layout, skip=observed)


def _log_density(
    trace: poutine.Trace, n: int, layout: DrawLayout, skip: str | None = None
) -> torch.Tensor:
    """The latent sites' log-density of each draw (subsample sites and ``skip`` aside)."""
    total = None
    for name, site in trace.iter_stochastic_nodes():
        if name == skip or site_is_subsample(site):
            continue
        term = _per_draw(site["fn"].log_prob(site["value"]), n, layout)
        total = term if total is None else total + term
    return torch.zeros(n) if total is None else total


def _as_targets(fn: pyro.distributions.TorchDistribution, y: torch.Tensor) -> torch.Tensor:
    """``y`` as the likelihood reads it: labels as ints for a Categorical, else floats."""
    base = independent_base(fn)
    if isinstance(base, pyro.distributions.Categorical):
        return y.long()
    if torch.is_floating_point(y):
        return y
    return y.to(base.mean.dtype)


def _replayed(
    replay: ModelReplay,
    x: torch.Tensor,
    y: torch.Tensor | None,
    rows: int,
    num_data: int | None,
    layout: DrawLayout,
    n: int,
    predictive: bool,
) -> dict[str, torch.Tensor]:
    """The model on one slice of draws, a slice of rows at a time: what each draw gives."""
    pointwise: list[torch.Tensor] = []
    drawn: list[torch.Tensor] = []
    log_prior = None
    for start in range(0, x.shape[0], rows):
        x_rows = x[start : start + rows]
        y_rows = None if y is None else y[start : start + rows]
        fits = y_rows is not None and (num_data is None or x_rows.shape[0] <= num_data)
        trace = replay.trace(x_rows, y_rows) if fits else replay.trace(x_rows)
        fn = trace.nodes[replay.observed]["fn"]
        if log_prior is None:
            log_prior = _log_prior(trace, replay.observed, n, layout)
        if y_rows is not None:
            expected = fn.batch_shape[-1:] + fn.event_shape
            if y_rows.shape != expected:
                raise ValueError(
                    f"y must have shape {(x.shape[0], *expected[1:])} for x, got {tuple(y.shape)}"
                )
            pointwise.append(layout.lead(fn.log_prob(_as_targets(fn, y_rows)), n, 1))
        if predictive:
            drawn.append(layout.lead(fn.sample(), n, 1 + fn.event_dim))
    parts = {"log_prior": log_prior}
    if pointwise:
        parts["log_likelihood"] = torch.cat(pointwise, -1)
        parts["total_log_likelihood"] = parts["log_likelihood"].sum(-1)
    if predictive:
        parts["predictive"] = torch.cat(drawn, 1 + int(layout.ensemble))
    return parts
