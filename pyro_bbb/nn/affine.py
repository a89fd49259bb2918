"""Affine maps that accept weights with leading sample dimensions, and the effectful op.

This module holds the affine maps a Bayesian layer can apply, :class:`LinearMap` and
:class:`ConvMap` (1-, 2- and 3-d convolutions and their transposes, one class), and
:func:`bayesian_affine`, the Pyro effectful operation through which every Bayesian layer
applies them. It knows nothing of priors, guides or estimators.

**Shapes.** Under Pyro plates a global weight site drawn ``P`` times (particles, predictive
samples) has shape ``(P, 1, *weight_shape)``: the ``1`` is the data plate's dim; replayed by
``Predictive`` it is ``(P, *weight_shape)``. The maps drop that trailing ``1`` where
present, and the remaining sample dims broadcast against the input's leading dims. Inputs
are ``(*sample, batch, *features)`` where ``sample`` may be empty (the first layer) and
``features`` is ``(in_features,)`` or ``(channels, *spatial)``. Outputs are
``(*broadcast(sample, weight_sample), batch, *out_features)``. ``torch.nn.functional.linear``
and ``conv*d`` accept neither, which is why ``nn.Linear`` cannot be vectorised over samples.

**Effects.** :func:`bayesian_affine` is a no-op wrapper around ``affine(x, weight, bias)``
when no Pyro handler is active. Under a handler it is a message of type
``"bayesian_affine"`` carrying the weight and bias *site names*, so an estimator such as
local reparameterisation can replace the computation (see :mod:`pyro_bbb.infer.reparam`).
Inside a per-draw pass of a network (:mod:`pyro_bbb.nn.draws`) the layer hands it the
current draw's weights; what a handler may then ask of the draw is stated there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pyro.poutine.runtime import effectful

from .._shapes import broadcast_shape, sample_dims

__all__ = [
    "AffineMap",
    "Conv2dMap",
    "ConvMap",
    "LinearMap",
    "bayesian_affine",
]


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
        return bias.reshape(*sample_dims(bias, 1), 1, bias.shape[-1], *trailing)

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
        if weight.dim() == 2 and (bias is None or bias.dim() == 1):
            return F.linear(x, weight, bias)  # a plain weight, as nn.Linear (the usual case)
        w_sample = sample_dims(weight, 2)
        b_sample = () if bias is None else sample_dims(bias, 1)
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


_SPATIAL = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@dataclass(frozen=True)
class ConvMap(AffineMap):
    """N-d cross-correlation (``nn.Conv1d/2d/3d``) or its transpose (``nn.ConvTranspose*d``).

    The weight is ``(out_channels, in_channels / groups, *kernel)`` for a convolution and
    ``(in_channels, out_channels / groups, *kernel)`` for a transposed one, as in torch. Sample
    dims are folded into channel groups: ``n`` weight samples become one convolution with
    ``n × groups`` groups, so a vectorised draw costs one kernel launch, whatever ``dims``.
    """

    dims: int = 2
    stride: tuple[int, ...] = (1, 1)
    padding: tuple[int, ...] | str = (0, 0)
    dilation: tuple[int, ...] = (1, 1)
    groups: int = 1
    transposed: bool = False
    output_padding: tuple[int, ...] = ()

    @property
    def input_event_dims(self) -> int:  # noqa: D102 (documented on AffineMap)
        return self.dims + 1

    @property
    def output_event_dims(self) -> int:  # noqa: D102 (documented on AffineMap)
        return self.dims + 1

    def in_channels(self, weight_shape: torch.Size) -> int:
        """The input channels a weight of ``weight_shape`` takes."""
        return weight_shape[0] if self.transposed else weight_shape[1] * self.groups

    def _conv(self, x: torch.Tensor, weight: torch.Tensor, groups: int) -> torch.Tensor:
        if self.transposed:
            fn = _CONV_TRANSPOSE[self.dims]
            return fn(
                x, weight, None, self.stride, self.padding, self.output_padding or 0, groups,
                self.dilation,
            )  # fmt: skip
        return _CONV[self.dims](x, weight, None, self.stride, self.padding, self.dilation, groups)

    def __call__(  # noqa: D102 (documented on AffineMap)
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        event = self.dims + 1
        if x.dim() < event + 1:
            spatial = ", ".join(_SPATIAL[self.dims])
            raise ValueError(
                f"x must be (*sample, batch, channels, {spatial}), got shape {tuple(x.shape)}"
            )
        weight_sample = sample_dims(weight, event + 1)
        if weight.dim() > event + 1:  # (a reshape is one more autograd node: only where needed)
            weight = _squeeze_sample(weight, event + 1, weight_sample)
        if not weight_sample and x.dim() == event + 1:  # (batch, channels, *spatial), as nn.Conv
            out = self._conv(x, weight, self.groups)
        elif not weight_sample:
            lead = x.shape[:-event]
            out = self._conv(x.reshape(-1, *x.shape[-event:]), weight, self.groups)
            out = out.reshape(*lead, *out.shape[-event:])
        else:
            out = self._conv_sampled(x, weight, weight_sample)
        if bias is not None:
            out = out + self.bias_view(bias)
        return out

    def _conv_sampled(
        self, x: torch.Tensor, weight: torch.Tensor, weight_sample: torch.Size
    ) -> torch.Tensor:
        event = self.dims + 1
        x_sample, batch, channels = x.shape[: -event - 1], x.shape[-event - 1], x.shape[-event]
        sample = broadcast_shape(x_sample, weight_sample)
        n, k = math.prod(sample), len(sample)
        weight = weight.expand(*sample, *weight.shape[-event - 1 :])
        weight = weight.reshape(-1, *weight.shape[-event:])
        if not x_sample and self.groups == 1 and not self.transposed:
            # The first layer: every weight sample sees the same input, no copy needed.
            out = self._conv(x, weight, 1)
        else:
            x = x.expand(*sample, *x.shape[-event - 1 :]).movedim(k, 0)
            out = self._conv(
                x.reshape(batch, n * channels, *x.shape[-self.dims :]), weight, n * self.groups
            )
        out = out.reshape(batch, *sample, -1, *out.shape[-self.dims :])
        return out.movedim(0, k)


@dataclass(frozen=True)
class Conv2dMap(ConvMap):
    """:class:`ConvMap` for ``nn.Conv2d`` (``dims=2``), kept for its familiar name."""


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
