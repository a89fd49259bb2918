r"""``fit``'s learning rate when ``lr`` is not given: a fraction of the weights' own size.

Adam moves every parameter by about ``lr`` a step whatever the size of its gradient (Kingma
and Ba 2015, section 2.1: the effective step is bounded by the rate), so one rate means a
different thing to a weight of size 0.5 (one input feature, a tanh unit) than to a weight of
size 0.02 (a unit reading the 784 pixels of an image, under torch's default initialisation
:math:`\mathcal{U}(\pm 1/\sqrt{\text{fan\_in}})`, whose root mean square is
:math:`1/\sqrt{3\,\text{fan\_in}}`). A step of 0.01 is a fifth of the second; a
784-400-400-10 network on 60,000 images cannot hold its fit at that rate once β rises and
Monte Carlo noise drives the means, and reaches a test error five points worse than at
``lr=1e-3``. The default rate is therefore

.. math:: \text{lr} = \min\Big(0.01,\; \tfrac1{16}\, \mathrm{rms}(W)\Big),

with :math:`W` the initial value of the network's largest Bayesian weight tensor (two or more
dimensions: a matrix or kernel; the one that holds most of the weights): a step moves a
typical weight by at most a sixteenth of its size. Networks of small fan-in (UCI's one
hidden layer of 50) keep 0.01; 1-50-50-1 starts at 5.1e-3, a LeNet-5 at 1.8e-3,
784-400-400-10 at 1.3e-3. An automatic run then halves it where the fit stops improving
(:mod:`~pyro_bbb.training.auto_epochs`). A model with no Bayesian weight tensor to read
(a Pyro model of the user's own) starts at :data:`MAX_LR`.
"""

from __future__ import annotations

import math

import torch

from ..nn.layers import initial_values

__all__ = ["MAX_LR", "STEP_SHARE", "default_lr"]

#: The default rate's ceiling (and the rate of a model whose weights cannot be read).
MAX_LR = 1e-2
#: The share of the largest weight tensor's root mean square that a step may move.
STEP_SHARE = 1 / 16


def default_lr(model: object) -> float:
    r"""The learning rate ``fit`` uses when ``lr`` is not given (see the module).

    Args:
        model: The model ``fit`` trains (a :class:`~pyro_bbb.BNN`, or any model).

    Returns:
        :math:`\min(0.01, \frac1{16} \mathrm{rms}(W))`, :math:`W` the initial value of the
        model's largest Bayesian weight tensor; 0.01 where it has none (or it is all
        zeros).
    """
    if not isinstance(model, torch.nn.Module):
        return MAX_LR
    weights = [v for v in initial_values(model).values() if v.dim() >= 2 and v.numel()]
    if not weights:
        return MAX_LR
    largest = max(weights, key=torch.Tensor.numel).detach().double()
    size = float(largest.pow(2).mean().sqrt())
    return min(MAX_LR, STEP_SHARE * size) if size > 0 and math.isfinite(size) else MAX_LR
