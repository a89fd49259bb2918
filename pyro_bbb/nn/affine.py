"""Affine maps that accept weights with leading sample dimensions, and the effectful op.

This module holds the two affine maps a Bayesian layer can apply, :class:`LinearMap` and
:class:`Conv2dMap`, and :func:`bayesian_affine`, the Pyro effectful operation through
which every Bayesian layer applies them. It knows nothing of priors, guides or estimators.

**Shapes.** Under Pyro plates a global weight site drawn ``P`` times (particles, predictive
samples) has shape ``(P, 1, *weight_shape)``: the ``1`` is the data plate's dim; replayed by
``Predictive`` it is ``(P, *weight_shape)``. :func:`sample_shape` drops that trailing ``1``
where present, and the remaining sample dims broadcast against the input's leading dims. Inputs are
``(*sample, batch, *features)`` where ``sample`` may be empty (the first layer) and
``features`` is ``(in_features,)`` or ``(channels, height, width)``. Outputs are
``(*broadcast(sample, weight_sample), batch, *out_features)``. ``torch.nn.functional.linear``
and ``conv2d`` accept neither, which is why ``nn.Linear`` cannot be vectorised over samples.

**Effects.** :func:`bayesian_affine` is a no-op wrapper around ``affine(x, weight, bias)``
when no Pyro handler is active. Under a handler it is a message of type
``"bayesian_affine"`` carrying the weight and bias *site names*, so an estimator such as
local reparameterisation can replace the computation (see :mod:`pyro_bbb.infer.reparam`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pyro.poutine.runtime import effectful

from .._shapes import broadcast_shape

__all__ = ["AffineMap", "Conv2dMap", "LinearMap", "bayesian_affine", "sample_shape"]


def sample_shape(param: torch.Tensor, event_dims: int) -> torch.Size:
    """Sample dims of a parameter with a trailing size-1 (data plate) dim dropped.

    Empty for a plain parameter. ``(P, 1, out, in)`` (drawn under a particle plate) and
    ``(P, out, in)`` (as ``Predictive`` replays guide samples) both give ``(P,)``.
    """
    dims = param.shape[: param.dim() - event_dims]
    return dims[:-1] if dims and dims[-1] == 1 else dims


def _squeeze_sample(param: torch.Tensor, event_dims: int, sample_shape: torch.Size) -> torch.Tensor:
    return param.reshape(*sample_shape, *param.shape[param.dim() - event_dims :])


class AffineMap:
    """An affine map ``x ↦ x ⊛ weight + bias`` that broadcasts over weight sample dims.

    Subclasses define the map (matrix product, convolution). The same instance computes the
    map of the weights' means and of their variances, which is what lets one local
    reparameterisation serve every layer type.
    """

    #: Number of trailing input dims that are features (1 for Linear, 3 for Conv2d).
    input_event_dims: int
    #: Number of trailing output dims that are features.
    output_event_dims: int

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """Apply the map.

        Args:
            x: Input ``(*sample, batch, *in_features)``.
            weight: ``weight_shape`` or ``(*sample, 1, *weight_shape)``.
            bias: ``(out,)`` or ``(*sample, 1, out)``, or ``None``.

        Returns:
            Output ``(*sample, batch, *out_features)``.
        """
        raise NotImplementedError

    def bias_view(self, bias: torch.Tensor) -> torch.Tensor:
        """Reshape a bias to broadcast against an output ``(*sample, batch, out, *rest)``.

        ``(out,)`` stays as it is (up to trailing unit dims); a sampled bias
        ``(*sample, [1,] out)`` becomes ``(*sample, 1, out, *ones)``.
        """
        trailing = [1] * (self.output_event_dims - 1)
        if bias.dim() == 1:
            return bias.reshape(*bias.shape, *trailing)
        return bias.reshape(*sample_shape(bias, 1), 1, bias.shape[-1], *trailing)

    def feature_dims(self, x: torch.Tensor) -> torch.Size:
        """The trailing feature dims of an input."""
        return x.shape[x.dim() - self.input_event_dims :]


@dataclass(frozen=True)
class LinearMap(AffineMap):
    """``x Wᵀ + b`` for a weight ``(out_features, in_features)``."""

    input_event_dims: int = 1
    output_event_dims: int = 1

    def __call__(  # noqa: D102 (documented on AffineMap)
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        w_sample = sample_shape(weight, 2)
        b_sample = () if bias is None else sample_shape(bias, 1)
        if math.prod(w_sample) == 1 and math.prod(b_sample) == 1:
            # One weight for every example (possibly with unit sample dims, as local
            # reparameterisation's shared mean has): one fused x Wᵀ + b, as nn.Linear.
            # (a reshape is one more autograd node forward and backward: only where needed)
            weight = weight if weight.dim() == 2 else weight.reshape(weight.shape[-2:])
            bias = bias if bias is None or bias.dim() == 1 else bias.reshape(-1)
            out = F.linear(x, weight, bias)
            lead = broadcast_shape(x.shape[:-2], w_sample, b_sample)
            return out if out.shape[:-2] == lead else out.reshape(*lead, *out.shape[-2:])
        if len(w_sample) == 1 and x.dim() <= 3 and (x.dim() == 2 or x.shape[0] in (1, *w_sample)):
            # S weight draws: one batched product with the bias fused in.
            x = x.expand(*w_sample, *x.shape[-2:])
            weight = weight.reshape(*w_sample, *weight.shape[-2:])
            if bias is None:
                return torch.bmm(x, weight.mT)
            return torch.baddbmm(self.bias_view(bias), x, weight.mT)
        # (*S, [1,] out, in) -> (*S, out, in); x (*Sx, batch, in) -> (*S ∨ Sx, batch, out)
        weight = _squeeze_sample(weight, 2, w_sample)
        out = torch.matmul(x, weight.mT)
        if bias is not None:
            out = out + self.bias_view(bias)
        return out


@dataclass(frozen=True)
class Conv2dMap(AffineMap):
    """2-D cross-correlation with a weight ``(out_channels, in_channels / groups, kh, kw)``.

    Sample dims are folded into channel groups: ``n`` weight samples become one convolution
    with ``n × groups`` groups, so a vectorised draw costs one kernel launch.
    """

    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] | str = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    input_event_dims: int = 3
    output_event_dims: int = 3

    def _conv(self, x: torch.Tensor, weight: torch.Tensor, groups: int) -> torch.Tensor:
        return F.conv2d(x, weight, None, self.stride, self.padding, self.dilation, groups)

    def __call__(  # noqa: D102 (documented on AffineMap)
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if x.dim() < 4:
            raise ValueError(
                f"x must be (*sample, batch, channels, height, width), got shape {tuple(x.shape)}"
            )
        weight_sample = sample_shape(weight, 4)
        weight = _squeeze_sample(weight, 4, weight_sample)
        if not weight_sample:
            lead = x.shape[:-3]
            out = self._conv(x.reshape(-1, *x.shape[-3:]), weight, self.groups)
            out = out.reshape(*lead, *out.shape[-3:])
        else:
            out = self._conv_sampled(x, weight, weight_sample)
        if bias is not None:
            out = out + self.bias_view(bias)
        return out

    def _conv_sampled(
        self, x: torch.Tensor, weight: torch.Tensor, weight_sample: torch.Size
    ) -> torch.Tensor:
        x_sample, (batch, channels, height, width) = x.shape[:-4], x.shape[-4:]
        sample = broadcast_shape(x_sample, weight_sample)
        n, k = math.prod(sample), len(sample)
        out_channels = weight.shape[-4]
        weight = weight.expand(*sample, *weight.shape[-4:]).reshape(-1, *weight.shape[-3:])
        if not x_sample and self.groups == 1:
            # The first layer: every weight sample sees the same input, no copy needed.
            out = self._conv(x, weight, 1)
        else:
            x = x.expand(*sample, *x.shape[-4:]).movedim(k, 0)
            out = self._conv(x.reshape(batch, n * channels, height, width), weight, n * self.groups)
        out = out.reshape(batch, *sample, out_channels, *out.shape[-2:])
        return out.movedim(0, k)


@effectful(type="bayesian_affine")
def bayesian_affine(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    affine: AffineMap,
    weight_site: str | None,
    bias_site: str | None,
) -> torch.Tensor:
    """Apply a Bayesian layer's affine map as a Pyro effect.

    With no handler active this is ``affine(x, weight, bias)``. A handler (e.g.
    :func:`pyro_bbb.local_reparameterization`) sees a message of type ``"bayesian_affine"``
    whose ``args`` are ``(x, weight, bias)`` and whose ``kwargs`` name the sites the weight
    and bias were sampled at (``None`` for a deterministic parameter), and may set its value.

    Args:
        x: Input ``(*sample, batch, *in_features)``.
        weight: The sampled (or deterministic) weight, see :class:`AffineMap`.
        bias: The sampled (or deterministic) bias, or ``None``.
        affine: The map to apply.
        weight_site: The Pyro site name of ``weight``, e.g. ``"fc1.weight"``.
        bias_site: The Pyro site name of ``bias``.

    Returns:
        The pre-activation ``(*sample, batch, *out_features)``.
    """
    return affine(x, weight, bias)
