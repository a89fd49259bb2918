r"""Which sites and which of their units an export holds, read as ArviZ reads a selection.

* :func:`select_sites`: ArviZ's ``var_names`` and ``filter_vars`` over a network's sites, as
  ``az.summary`` reads them (names, ``"~name"`` to leave out, ``filter_vars="like"`` for
  substrings, ``"regex"`` for regular expressions), and a layer's name (its module path,
  ``"fc1"`` or ``"0"``) for all its sites (``"fc1.weight"``, ``"fc1.bias"``);
* :func:`select_coords`: ``coords`` as ``az.summary`` reads them, ``{dim: the indices to
  keep}``, checked against the sites' dims;
* :func:`site_dims`: the dims a site is named by in ArviZ (a layer's weight and bias share
  ``"<layer>.out"``).

Nothing here draws or exports; :func:`~pyro_bbb.to_inference_data` uses these before it
draws, so that it draws and keeps only what was asked.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["DATA_DIM", "FILTERS", "select_coords", "select_sites", "site_dims"]

#: ``filter_vars`` values besides ``None`` (exact names, or a layer's name).
FILTERS = ("like", "regex")

#: The dim of the rows of the data (the log-likelihood, the predictive, the data themselves).
DATA_DIM = "data"


def site_dims(name: str, shape: Sequence[int]) -> list[str]:
    """Named dims of a site.

    A layer's weight ``(out, in[, kh, kw])`` and bias ``(out,)`` share ``"<layer>.out"``;
    other sites get ``"<site>_dim_<i>"``.
    """
    layer, _, param = name.rpartition(".")
    prefix = f"{layer}." if layer else ""
    if param == "weight" and len(shape) in (2, 4):
        return [f"{prefix}out", f"{prefix}in", f"{prefix}kh", f"{prefix}kw"][: len(shape)]
    if param == "bias" and len(shape) == 1:
        return [f"{prefix}out"]
    return [f"{name}_dim_{i}" for i in range(len(shape))]


def layers_of(sites: Sequence[str]) -> list[str]:
    """The layers (module paths) holding the sites, in order: ``"fc1"`` for ``"fc1.weight"``."""
    layers: dict[str, None] = {}
    for site in sites:
        layers.setdefault(site.rpartition(".")[0], None)
    return [layer for layer in layers if layer]


def select_sites(
    var_names: str | Sequence[str] | None,
    sites: Sequence[str],
    filter_vars: str | None = None,
) -> list[str]:
    """The sites ``var_names`` names, in the network's order, as ``az.summary`` reads them.

    Args:
        var_names: ``None`` for every site; a name or a list of names: a site (``"1.weight"``)
            or a layer, by its module path (``"1"``, ``"fc1"``, ``"block"``: every site
            under it). Names that start with ``"~"`` are left out instead (all of them must:
            a list mixing names to keep and to leave out is refused).
        sites: Every site, in the network's order.
        filter_vars: ``None``: exact names (or layers); ``"like"``: each name is a substring
            of the sites it selects; ``"regex"``: a regular expression searched in them.

    Returns:
        The selected sites, in ``sites``' order.

    Raises:
        ValueError: On a ``filter_vars`` other than ``None``, ``"like"`` or ``"regex"``, an
            empty list, a list mixing names to keep and to leave out, or a selection that
            leaves no site.
        KeyError: If a name to keep matches no site (as ArviZ raises).

    Warns:
        UserWarning: If a name to leave out matches no site (as ArviZ warns).
    """
    if filter_vars is not None and filter_vars not in FILTERS:
        raise ValueError(f"filter_vars must be None, 'like' or 'regex', got {filter_vars!r}")
    if var_names is None:
        return list(sites)
    names = [var_names] if isinstance(var_names, str) else list(var_names)
    if not names or not all(isinstance(name, str) for name in names):
        raise ValueError(f"var_names must be None, a name or a list of names, got {var_names!r}")
    leave_out = [name.startswith("~") for name in names]
    if any(leave_out) and not all(leave_out):
        raise ValueError(
            f"var_names mixes names to keep and names to leave out ('~'): {names}; pass "
            "either the names to keep or, each with '~', those to leave out"
        )
    chosen: set[str] = set()
    for name in names:
        pattern = name[1:] if all(leave_out) else name
        matched = _matching(pattern, sites, filter_vars)
        if not matched:
            where = f"sites {list(sites)} and layers {layers_of(sites)}"
            if all(leave_out):
                warnings.warn(f"var_names: {name!r} matches none of the {where}", stacklevel=3)
            else:
                raise KeyError(f"var_names: {name!r} matches none of the {where}")
        chosen.update(matched)
    kept = [site for site in sites if (site in chosen) != all(leave_out)]
    if not kept:
        raise ValueError(f"var_names={var_names!r} leaves none of the sites {list(sites)}")
    return kept


def _matching(pattern: str, sites: Sequence[str], filter_vars: str | None) -> set[str]:
    if filter_vars == "like":
        return {site for site in sites if pattern in site}
    if filter_vars == "regex":
        return {site for site in sites if re.search(pattern, site)}
    if pattern in sites:
        return {pattern}
    return {site for site in sites if site.startswith(f"{pattern}.")}


def select_coords(
    coords: Mapping[str, Any] | None, sizes: Mapping[str, int]
) -> dict[str, torch.Tensor]:
    """``coords`` as ``az.summary`` reads them: the indices to keep along named dims.

    An export's dims have the default coordinates ``0, 1, ...``, so a label is an index.

    Args:
        coords: ``{dim: labels}``: an int, a ``slice`` or ``range``, or a sequence, array or
            tensor of ints (``None`` or ``{}``: everything).
        sizes: ``{dim: size}`` of every dim the selection may name.

    Returns:
        ``{dim: int64 indices}``, in the order given.

    Raises:
        KeyError: For a dim that is not among ``sizes``.
        ValueError: For labels that are not ints in ``[0, size)``, or none at all.
    """
    selected = {}
    for dim, labels in (coords or {}).items():
        if dim not in sizes:
            raise KeyError(f"coords: no dim {dim!r}; the dims are {sorted(sizes)}")
        size = sizes[dim]
        if isinstance(labels, slice):
            labels = range(size)[labels]
        index = torch.as_tensor(np.atleast_1d(np.asarray(labels)))
        if index.numel() == 0:
            raise ValueError(f"coords[{dim!r}] selects nothing")
        if index.dtype.is_floating_point or index.dtype == torch.bool or index.dim() != 1:
            raise ValueError(
                f"coords[{dim!r}] must be ints (indices along {dim!r}), got {labels!r}"
            )
        if int(index.min()) < 0 or int(index.max()) >= size:
            raise ValueError(
                f"coords[{dim!r}] must lie in [0, {size}) (the size of {dim!r}), got labels "
                f"from {int(index.min())} to {int(index.max())}"
            )
        selected[dim] = index.long()
    return selected
