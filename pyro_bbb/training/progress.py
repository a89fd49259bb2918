"""The progress bar of a fit: epochs, the last epoch's losses, the stage and the scores read.

Shown where a person is watching (:func:`show_progress`): a terminal or a Jupyter notebook
(``tqdm.auto`` draws a widget there), on the main process only. Nothing here decides
anything about the run.
"""

from __future__ import annotations

import math

from .._display import show_progress
from .history import EpochRecord
from .run_length import RunLength

__all__ = ["Progress", "show_progress"]


class Progress:
    """A tqdm bar over the epochs with the last epoch's losses, or nothing if not shown.

    An automatic run's length is unknown until its decay begins: the bar counts epochs and
    shows the stage until then, and its total once known.
    """

    def __init__(self, epochs: int | None, show: bool, initial: int = 0) -> None:
        self._bar = None
        self._scores: dict[str, str] = {}
        if show:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=epochs, initial=initial, desc="fit", unit="epoch", dynamic_ncols=True
            )

    def update(
        self, record: EpochRecord, beta: float, length: RunLength, scores: tuple[float, ...]
    ) -> None:
        """Count one epoch; show its losses, β, the stage and the latest scores read."""
        if self._bar is not None:
            if length.total is not None and self._bar.total != length.total:
                self._bar.total = length.total
            self._bar.update(1)
            extra = {"stage": length.current} if length.current else {}
            nll, kl, held_out = scores
            for name, value in (("averaged_loss", nll + kl), ("held_out_ll", held_out)):
                if not math.isnan(value):
                    self._scores[name] = f"{value:.4g}"
            extra.update(self._scores)
            self._bar.set_postfix(
                loss=f"{record.loss:.4g}", nll=f"{record.nll:.4g}", kl=f"{record.kl:.4g}",
                beta=f"{beta:.2g}", **extra,
            )  # fmt: skip

    def close(self, stopped: str) -> None:
        """Close the bar with why the run ended."""
        if self._bar is not None:
            self._bar.set_postfix_str(f"done: {stopped}", refresh=False)
            self._bar.close()
