"""The 1-D regression problem with a gap in its inputs, for examples, tests and the demo.

Inputs lie on ``[-4, -1) ∪ [1, 4)``, targets are ``sin(x)`` plus Gaussian noise; a good
posterior is uncertain in the gap ``(-1, 1)`` and beyond the data. Returned as torch tensors
(float32); the global random state is never touched.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._validation import check_int, check_nonnegative_number

__all__ = ["ToyData", "gap_function", "gap_regions", "gap_regression"]

_GAP_DATA_INTERVALS: tuple[tuple[float, float], ...] = ((-4.0, -1.0), (1.0, 4.0))
_GAP_INTERVALS: tuple[tuple[float, float], ...] = ((-1.0, 1.0),)
_GAP_EXTRAPOLATION_INTERVALS: tuple[tuple[float, float], ...] = ((-7.0, -4.0), (4.0, 7.0))


class ToyData(NamedTuple):
    """A toy regression data set.

    Attributes:
        x: Inputs, shape ``(num_data, 1)``, float32.
        y: Targets, shape ``(num_data,)``, float32.
    """

    x: torch.Tensor
    y: torch.Tensor


def gap_function(x: torch.Tensor) -> torch.Tensor:
    r"""The noiseless regression function of :func:`gap_regression`, :math:`f(x) = \sin(x)`.

    Args:
        x: Inputs of any shape.

    Returns:
        :math:`\sin(x)`, same shape as ``x``.
    """
    return torch.sin(x)


def gap_regions() -> dict[str, list[tuple[float, float]]]:
    """The input intervals of the gap problem, for shading plots and scoring by region.

    Every value is a list of closed ``(low, high)`` intervals, so each region can be passed
    straight to :func:`pyro_bbb.plots.plot_regression_bands` as ``shade=``.

    The regions:

    * ``"data"``: ``[(-4, -1), (1, 4)]``, where :func:`gap_regression` draws inputs;
    * ``"gap"``: ``[(-1, 1)]``, between the two clusters, where a good model's epistemic
      uncertainty should grow;
    * ``"extrapolation"``: ``[(-7, -4), (4, 7)]``, beyond the data on either side.

    Returns:
        A fresh dict ``{region: [(low, high), ...]}`` with the three keys above.
    """
    return {
        "data": list(_GAP_DATA_INTERVALS),
        "gap": list(_GAP_INTERVALS),
        "extrapolation": list(_GAP_EXTRAPOLATION_INTERVALS),
    }


def gap_regression(num_data: int = 160, noise: float = 0.1, seed: int = 0) -> ToyData:
    r"""Draw the 1-D regression problem with a gap in the middle of its inputs.

    Half of the inputs (rounded down) are uniform on :math:`[-4, -1)`, the rest uniform on
    :math:`[1, 4)`, so no input lies in the gap :math:`(-1, 1)`; targets are

    .. math:: y = \sin(x) + \varepsilon, \qquad \varepsilon \sim \mathcal{N}(0, \text{noise}^2).

    Points are returned in random order. A seeded ``torch.Generator`` is used, so the global
    random state is untouched and the same seed always gives the same data.

    Args:
        num_data: Number of points, at least 2 so that both sides are populated.
        noise: Standard deviation of the Gaussian observation noise, non-negative.
        seed: Seed of the generator.

    Returns:
        A :class:`ToyData` with ``x`` of shape ``(num_data, 1)`` and ``y`` of shape
        ``(num_data,)``, both float32.

    Raises:
        ValueError: If ``num_data`` is not an int >= 2 or ``noise`` is negative.
    """
    check_int("num_data", num_data, minimum=2)
    check_nonnegative_number("noise", noise)
    generator = torch.Generator().manual_seed(seed)
    (left_low, left_high), (right_low, right_high) = _GAP_DATA_INTERVALS
    num_left = num_data // 2
    u = torch.rand(num_data, generator=generator, dtype=torch.float64)
    x = torch.cat(
        [
            left_low + (left_high - left_low) * u[:num_left],
            right_low + (right_high - right_low) * u[num_left:],
        ]
    )
    x = x[torch.randperm(num_data, generator=generator)]
    y = gap_function(x) + noise * torch.randn(num_data, generator=generator, dtype=torch.float64)
    return ToyData(x=x.float().unsqueeze(-1), y=y.float())
