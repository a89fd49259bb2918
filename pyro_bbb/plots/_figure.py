"""What every figure function shares: an Agg figure independent of pyplot, saving, inputs.

Matplotlib is imported inside the functions, so importing this module needs no matplotlib.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["ArrayLike", "new_figure", "save", "vector"]

ArrayLike = torch.Tensor | np.ndarray | Sequence[float]
"""Plot inputs: a tensor (any device; detached here), a numpy array or a sequence of floats."""


def new_figure(**figure_kwargs: Any) -> Figure:
    """A figure attached to the Agg canvas, independent of ``pyplot`` and of any display."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(**figure_kwargs)
    FigureCanvasAgg(figure)
    return figure


def save(figure: Figure, path: str | os.PathLike[str] | None) -> None:
    if path is not None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(target, dpi=150, bbox_inches="tight")


def vector(values: ArrayLike, name: str) -> np.ndarray:
    """Flatten ``(n,)`` or ``(n, 1)`` input to a float64 numpy vector of shape ``(n,)``."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise ValueError(f"{name} must have shape (n,) or (n, 1), got {array.shape}")
    return array
