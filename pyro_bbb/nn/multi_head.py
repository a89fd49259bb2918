"""A shared body with one head per task: :class:`MultiHead`.

The multi-head networks of continual learning (Nguyen et al. 2018; Zenke et al. 2017): every
task goes through the same body, then through its own output layer. Only the active head runs,
so a model built on it draws the body's sites and that head's, and a guide for it covers
exactly those. Nothing here knows of guides, priors or training.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["MultiHead"]


class MultiHead(nn.Module):
    """``heads[head](body(x))``: a shared body and the active one of several heads.

    Make it Bayesian like any network, ``bayesianize(MultiHead(body, heads), prior=...)``:
    its sites are ``"body.<path>"`` and ``"heads.<k>.<path>"``, so a mapping prior such as
    ``{"heads.*": Gaussian(1.0), ...}`` gives the heads priors of their own.

    Args:
        body: The shared layers, ``(*sample, batch, *in) -> (*sample, batch, *hidden)``.
        heads: One module per task, each ``(*sample, batch, *hidden) -> (*sample, batch,
            *out)``.

    Raises:
        ValueError: If ``heads`` is empty.
    """

    def __init__(self, body: nn.Module, heads: Sequence[nn.Module]) -> None:
        super().__init__()
        if len(heads) == 0:
            raise ValueError("heads must hold at least one module")
        self.body = body
        self.heads = nn.ModuleList(heads)
        self._head = 0

    @property
    def head(self) -> int:
        """The index of the head ``forward`` uses; set it to switch tasks."""
        return self._head

    @head.setter
    def head(self, value: int) -> None:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 0 <= value < len(self.heads)
        ):
            raise ValueError(f"head must be an int in [0, {len(self.heads)}), got {value!r}")
        self._head = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the body, then the active head."""
        return self.heads[self._head](self.body(x))
