"""Hooks into :func:`~pyro_bbb.fit`: the :class:`Callback` base class.

``fit`` calls every callback's hooks at three points of a run: once before the first step,
between each backward pass and its optimiser update, and after each epoch's record is
appended to the :class:`~pyro_bbb.History` (where a callback may stop the run). Nothing
here trains.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .history import History

__all__ = ["Callback"]


class Callback:
    """Hooks into :func:`~pyro_bbb.fit`. Override the ones you need; all default to nothing."""

    def on_fit_start(self, params: Sequence[torch.Tensor], history: History) -> None:
        """Called once, after the guide is set up and before the first step."""

    def on_after_backward(self, params: Sequence[torch.Tensor], step: int) -> None:
        """Called between ``loss.backward()`` and ``optimizer.step()`` (e.g. to clip).

        In a data-parallel fit the gradients are already averaged over processes here.
        """

    def on_epoch_end(self, epoch: int, history: History) -> bool | None:
        """Called after each epoch's record is appended; return ``True`` to stop training."""
        return None
