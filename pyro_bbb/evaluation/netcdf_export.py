r"""An ArviZ export written into a netCDF file as it is drawn, holding a slice at a time.

``to_inference_data(..., path=...)`` (:mod:`~pyro_bbb.evaluation.inference_data`) sends the
arrays that grow with the draws (the posterior's sites, the pointwise log-likelihood, the
posterior predictive) here slice by slice as
:func:`~pyro_bbb.evaluation.draws.posterior_draws` makes them, each written into its place in
the file and let go: a 160,400-weight layer at 4 × 125 draws is 321 MB of values, more than an
export in memory can hold in 300 MB. The rest (the data, ``sample_stats``) is written once
drawn.

The file has ArviZ's layout: one netCDF4 group per ``InferenceData`` group, written with
h5netcdf, as ``InferenceData.to_netcdf`` writes it, each variable with its dims and every dim
with its coordinate, so ``az.from_netcdf`` (``arviz.InferenceData.from_netcdf``) reads it and
xarray opens each group. Booleans are stored as xarray stores them (``int8`` marked
``dtype="bool"``).
"""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .draws import DrawLayout

__all__ = ["NetCDFExport", "check_export_path"]

#: The two dims every group but the data's leads with.
CHAIN_DRAW = ("chain", "draw")


def check_export_path(path: str | os.PathLike, num_bytes: int) -> Path:
    """``path`` as a ``Path``, once it is known that the export can be written there.

    Raises:
        FileNotFoundError: If its folder does not exist.
        IsADirectoryError: If it is a folder.
        OSError: If the disk there has less room than ``num_bytes`` (the message says both).
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"path={str(path)!r}: its folder {str(folder)!r} does not exist")
    if path.is_dir():
        raise IsADirectoryError(f"path={str(path)!r} is a folder; name the file to write")
    free = shutil.disk_usage(folder).free
    if num_bytes > free:
        raise OSError(
            f"path={str(path)!r}: the export takes {num_bytes / 1e6:,.0f} MB and the disk "
            f"there has {free / 1e6:,.0f} MB free; write it elsewhere, or export less "
            "(var_names=, coords=, num_samples=, fewer rows)"
        )
    return path


class NetCDFExport:
    """An ``InferenceData`` being written into ``path``, group by group, slice by slice.

    Args:
        path: The file, written over where it exists (once the new one is complete).
        labels: ``{dim: labels}`` of the dims whose coordinates are not ``0, 1, ...`` (the
            units and rows ``coords=`` kept).
    """

    def __init__(self, path: Path, labels: Mapping[str, Sequence[Any]]) -> None:
        import arviz as az
        import h5netcdf

        self.path, self.labels = path, labels
        #: Every group's attributes, as ArviZ's converters set them.
        self.attrs = {
            "created_at": datetime.datetime.now(datetime.UTC).isoformat(),
            "arviz_version": az.__version__,
        }
        # written beside the file, then put in its place: an InferenceData still reading an
        # earlier export of the same name keeps its file, and no half-written file is left
        self._partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        self._file = h5netcdf.File(self._partial, "w")

    def sink(self, group: str, name: str, dims: Sequence[str], layout: DrawLayout) -> _FileSink:
        """Where the slices of ``group``'s variable ``name``, dims ``(chain, draw, *dims)``, go."""
        return _FileSink(self, group, name, tuple(dims), layout)

    def variable(
        self, group: str, name: str, dims: Sequence[str], shape: Sequence[int], dtype: Any
    ) -> Any:
        """A new variable of ``group``, its dims (with their coordinates) made where new.

        A boolean one is stored as xarray stores it (:func:`_stored`).
        """
        if group not in self._file.groups:
            self._file.create_group(group).attrs.update(self.attrs)
        handle = self._file.groups[group]
        for dim, size in zip(dims, shape, strict=True):
            if dim in handle.dimensions:
                continue
            handle.dimensions[dim] = size
            labels = self.labels.get(dim)
            handle.create_variable(
                dim, (dim,), data=np.arange(size) if labels is None else np.asarray(labels)
            )
        boolean = np.dtype(dtype) == np.bool_
        variable = handle.create_variable(name, tuple(dims), dtype=np.int8 if boolean else dtype)
        if boolean:
            variable.attrs["dtype"] = "bool"
        return variable

    def write(self, group: str, name: str, values: np.ndarray, dims: Sequence[str]) -> None:
        """Write a whole variable."""
        self.variable(group, name, dims, values.shape, values.dtype)[...] = _stored(values)

    def close(self) -> None:
        """Finish the file and put it in ``path``'s place."""
        self._file.close()
        os.replace(self._partial, self.path)

    def discard(self) -> None:
        """Close and remove the file an error left half written (``path`` is untouched)."""
        self._file.close()
        self._partial.unlink(missing_ok=True)


class _FileSink:
    """A :class:`~pyro_bbb.evaluation.draws.DrawSink` writing each slice into its place."""

    def __init__(
        self,
        export: NetCDFExport,
        group: str,
        name: str,
        dims: tuple[str, ...],
        layout: DrawLayout,
    ) -> None:
        self.export, self.group, self.name, self.dims, self.layout = (
            export, group, name, dims, layout,
        )  # fmt: skip
        self.variable: Any = None

    def add(self, start: int, part: torch.Tensor) -> None:
        for chain, draws, values in self.layout.pieces(start, part):
            array = values.detach().cpu().numpy()
            if self.variable is None:
                self.variable = self.export.variable(
                    self.group, self.name, CHAIN_DRAW + self.dims, self.layout.shape_of(part),
                    array.dtype,
                )  # fmt: skip
            self.variable[chain, draws] = _stored(array)


def _stored(values: np.ndarray) -> np.ndarray:
    """Values as the file holds them: booleans as ``int8``, as xarray stores them."""
    return values.astype(np.int8) if values.dtype == np.bool_ else values
