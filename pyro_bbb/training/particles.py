"""How many weight samples a step of :func:`~pyro_bbb.fit` draws when it is not told.

With one sample per step the gradient of the ELBO is noisy even at the optimum, and that
noise, not the learning-rate schedule, is what is left in a fitted posterior's standard
deviations: on conjugate linear regression (the exact posterior known) four samples a step
halve the error of one at the same number of steps, eight bring it within 4 %. Vectorised
over a leading particle dim, extra samples cost only their arithmetic: on a small network
and minibatch that is little beside the fixed cost of launching a step's operations, on a
large one each sample costs nearly a whole step. Hence the default: as many samples as
keep a step's arithmetic, counted as drawn weights times minibatch rows, within
:data:`STEP_BUDGET`, at most :data:`MAX_PARTICLES`. A mean-field guide's fused step draws
them in the same single autograd node as one sample
(:class:`~pyro_bbb.infer._mean_field_block.MeanFieldBlock`), so taking several does not
shut a small problem out of it: at the default particles that node made a step 6-16 %
cheaper than the site-by-site draw (8 samples of a linear regression on 150 rows, 2 of a
1-50-50-1 MLP on 40, 8 of a 13-50-1 MLP on minibatches of 32).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample

from .._devices import cuda_devices
from ..infer.sites import is_point_mass

__all__ = ["MAX_PARTICLES", "STEP_BUDGET", "default_num_particles", "draw_size"]

#: Weights drawn times minibatch rows, summed over a step's samples, that
#: :func:`default_num_particles` stays within (unless one sample alone exceeds it): a dense
#: layer's multiply-adds per sample are its weights times the rows. Measured on CPU (one
#: thread), eight samples rather than one cost 5–7 % more per step for a linear regression
#: of 4 weights on 150 rows (4,800 per step), 18 % for a 13-50-1 MLP on minibatches of 32
#: (192,256); a 1-50-50-1 MLP on 40 rows takes 2 (212,080) at 10 % more.
STEP_BUDGET = 2**18

#: The most samples a step of :func:`default_num_particles` draws.
MAX_PARTICLES = 8


def draw_size(guide: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """The random numbers one call of a guide draws: the sizes of its non-``Delta`` sites.

    A low-rank guide's block counts once (its per-weight sites are ``Delta`` slices of it);
    an ensemble's sites carry every member; a point estimate (``AutoDelta``,
    ``DeltaGuide``) draws nothing. The guide is run once, under a forked random state and
    without gradients, so calling this changes nothing.

    Args:
        guide: A set-up guide.
        *args: What the guide is called with (e.g. a minibatch ``x, y``).
        **kwargs: Likewise.

    Returns:
        The number of scalars drawn.
    """
    with torch.random.fork_rng(devices=cuda_devices(guide)), torch.no_grad():
        trace = poutine.trace(guide).get_trace(*args, **kwargs)
    return sum(
        site["value"].numel()
        for _, site in trace.iter_stochastic_nodes()
        if not site_is_subsample(site) and not is_point_mass(site["fn"])
    )


def default_num_particles(draws: int, rows: int) -> int:
    r""":func:`~pyro_bbb.fit`'s ``num_particles`` when it is ``None``.

    .. math::

        S = \min\Big(8,\ \max\Big(1,\ \Big\lfloor \frac{2^{18}}{d\,B} \Big\rfloor\Big)\Big)

    for a guide that draws :math:`d` numbers per sample (:func:`draw_size`, all members of
    an ensemble together) and a minibatch of :math:`B` rows: 8 samples for 4 weights on 150
    rows, 2 for a 1-50-50-1 MLP (2,651 weights) on 40, 1 for the same on 100 or more, or
    for any network of over 262,144 weights; 1 for a point estimate, which draws nothing.
    A convolution uses each weight at every position, so its arithmetic per sample is
    larger than the count says: pass ``num_particles`` for a convolutional network whose
    minibatch is large.

    Args:
        draws: Numbers the guide draws per sample, :math:`d`.
        rows: Rows of a minibatch, :math:`B`.

    Returns:
        The number of weight samples per step.
    """
    if draws == 0:
        return 1
    return min(MAX_PARTICLES, max(1, STEP_BUDGET // (draws * max(rows, 1))))
