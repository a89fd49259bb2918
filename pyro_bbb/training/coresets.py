r"""Coresets for variational continual learning: a few points of each task, held out.

Variational continual learning (Nguyen et al. 2018, https://arxiv.org/abs/1710.10628) keeps a
small *coreset* of every task out of training; before predicting, the propagated posterior is
fine-tuned on the coresets, which recovers what the Gaussian approximation lost across tasks.
The paper chooses the points at random or by the greedy *k-center* rule (Gonzalez 1985): start
from one point, then repeatedly add the point farthest (Euclidean, on the flattened inputs)
from those chosen, so the coreset spreads over the input space.

This module holds :func:`select_coreset`, which only picks indices; nothing here trains.
"""

from __future__ import annotations

from typing import Literal

import torch

from .._validation import check_choice, check_int

__all__ = ["CoresetMethod", "select_coreset"]

CoresetMethod = Literal["random", "k-center"]
"""How a coreset is chosen: uniformly at random, or greedily by the k-center rule."""


def select_coreset(
    x: torch.Tensor,
    size: int,
    *,
    method: CoresetMethod = "random",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the rows of ``x`` into a coreset and the rest.

    Args:
        x: Inputs ``(N, *features)``.
        size: Rows in the coreset, ``1 <= size < N``.
        method: ``"random"`` (uniform without replacement) or ``"k-center"`` (greedy
            farthest-point, starting from the first row, as in Nguyen et al. 2018).
        generator: Random numbers for ``"random"``; ``None`` uses torch's global generator.

    Returns:
        ``(coreset, rest)``: int64 row indices on ``x``'s device, each in increasing order.

    Raises:
        ValueError: On a size outside ``[1, N)`` or an unknown method.
    """
    method = check_choice("method", method, ("random", "k-center"))
    n = x.shape[0]
    check_int("size", size)
    if size >= n:
        raise ValueError(f"size must be smaller than the {n} rows of x, got {size}")
    if method == "random":
        order = torch.randperm(n, generator=generator, device="cpu").to(x.device)
        chosen = order[:size]
    else:
        chosen = _k_center(x.reshape(n, -1), size)
    mask = torch.zeros(n, dtype=torch.bool, device=x.device)
    mask[chosen] = True
    return mask.nonzero().squeeze(-1), (~mask).nonzero().squeeze(-1)


def _k_center(points: torch.Tensor, size: int) -> torch.Tensor:
    """Greedy farthest-point selection: ``size`` row indices, the first row first."""
    chosen = torch.empty(size, dtype=torch.long, device=points.device)
    chosen[0] = 0
    distance = (points - points[0]).pow(2).sum(-1)  # squared distance to the nearest chosen
    for k in range(1, size):
        farthest = torch.argmax(distance)
        chosen[k] = farthest
        distance = torch.minimum(distance, (points - points[farthest]).pow(2).sum(-1))
    return chosen
