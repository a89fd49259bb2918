r"""Initial posterior scales from trained weights: :class:`MOPED`.

MOPED (Krishnan, Subedar & Tickoo 2020, "Specifying weight priors in Bayesian deep neural
networks with empirical Bayes", https://arxiv.org/abs/1906.05323) starts a mean-field guide
at a trained deterministic network: every mean at its trained weight :math:`w` and every
standard deviation at :math:`\sigma = \delta\,|w|`, so large weights start uncertain in
proportion and small ones nearly fixed. This module holds that choice of initial scales; the
guides read it (``MeanFieldGuide(model, init_scale=MOPED(0.1))``).
"""

from __future__ import annotations

import torch

from ..._validation import check_positive_number
from ._init import InitScale

__all__ = ["MOPED"]


class MOPED(InitScale):
    r"""Initial guide scales :math:`\sigma_i = \max(\delta\,|\mu_i|, \sigma_{\text{floor}})`.

    Args:
        delta: :math:`\delta > 0`, the scale relative to the weight's magnitude (Krishnan et
            al. 2020 use 0.1).
        floor: The smallest initial scale, for weights at or near 0 (biases initialised to
            0); must exceed the guide's ``min_scale``.

    Raises:
        ValueError: If ``delta`` or ``floor`` is not positive.
    """

    def __init__(self, delta: float = 0.1, *, floor: float = 1e-3) -> None:
        self.delta = check_positive_number("delta", delta)
        self.floor = check_positive_number("floor", floor)

    def scales(self, loc: torch.Tensor) -> torch.Tensor:
        r"""The initial :math:`\sigma` of every weight, ``loc``'s shape."""
        return (self.delta * loc.detach().abs()).clamp_min(self.floor)

    def check(self, min_scale: float, fraction: float = 1.0) -> None:
        """Raise if the floor's part ``fraction × floor`` is not above ``min_scale``.

        Raises:
            ValueError: If ``fraction × floor`` is not above ``min_scale``.
        """
        if fraction * self.floor <= min_scale:
            raise ValueError(
                f"MOPED floor must exceed min_scale={min_scale:g}"
                + (f" / {fraction:.3g}" if fraction != 1.0 else "")
                + f", got {self.floor}"
            )

    def __repr__(self) -> str:
        return f"MOPED(delta={self.delta:g}, floor={self.floor:g})"
