r"""Every site of a mean-field guide drawn, and its KL taken, in one autograd node.

For :math:`q(w) = \prod_i \mathcal{N}(\mu_i, \sigma_i^2)`, :math:`\sigma = \mathrm{softplus}
(\rho) + \sigma_{\min}`, and a prior :math:`\mathcal{N}(m_j, s_j^2)` of one number per site
:math:`j`, the fused step needs the draw :math:`w = \mu + \sigma \odot \varepsilon` and each
site's closed-form KL divergence

.. math::

    \mathrm{KL}_j = \frac{\lVert \sigma_{J_j} \rVert^2 + \lVert \mu_{J_j} - m_j \rVert^2}
        {2 s_j^2} - \sum_{i \in J_j} \log \sigma_i + n_j \big(\log s_j - \tfrac12\big).

Done site by site and left to autograd, that is some twenty small operations a site forward
and as many backward: on a ResNet's 62 tensors, 2,500 calls a step, more time than the
arithmetic. :class:`MeanFieldBlock` takes every site in one node of the autograd graph: per
site the draw is three passes (softplus, its floor, :math:`\mu + \sigma\varepsilon`), the KL a
pass for :math:`\log\sigma` and three reductions, and the backward writes each gradient in
closed form,

.. math::

    \frac{\partial \mathcal{L}}{\partial \mu} = g_w + g\, c \odot (\mu - m), \qquad
    \frac{\partial \mathcal{L}}{\partial \sigma} = g_w \odot \varepsilon
        + g\,\big(c \odot \sigma - 1/\sigma\big), \qquad
    \frac{\partial \mathcal{L}}{\partial \rho} = \frac{\partial \mathcal{L}}{\partial \sigma}
        \odot \mathrm{sigmoid}(\rho),

with :math:`g_w` the gradient reaching the weights, :math:`g` the one reaching the total KL
and :math:`c = 1/s^2`: five passes. The noise is drawn site by site, in the guide's order and
shapes, so the same random state gives the same weights as the site-by-site draw. Several
draws (a step's particles) are a leading sample shape on every site's noise: the KL is
taken once, and the draws' gradients are summed back to each parameter's shape. A prior's
numbers are Python floats where they were read as such (on the CPU) or 0-d tensors on the
weights' device, used where they are: the block reads nothing back to the host, so it runs
on a GPU as on the CPU. Nothing here knows of guides or models: :mod:`pyro_bbb.infer.fused`
lays the sites out.

:class:`PackedMeanFieldBlock` is the same node over parameters packed end to end in two
buffers (:class:`~pyro_bbb.infer.guides._packed.PackedParameters`: each site's
:math:`\mu` and :math:`\rho` a view of them, no copy): the softplus, the draw, the KL's
passes and every gradient are then one call each over the whole network, about twenty calls
a step where the site-by-site block makes about twenty a site (on a ResNet's 62 sites,
1,200). Only the noise is still drawn site by site, into the site's stretch of one buffer,
and each site's KL is a sum over its stretch. It takes one draw, on the CPU
(:func:`packed_block_runs`); laying the sites end to end by copying them instead cost
three copies a step, which on 784-400-400-10 weighed more than the calls saved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.function import once_differentiable

from .._pyro_compat import concatenated, stretches_of
from ._compiled import say_once
from .guides._init import scale_from_rho

__all__ = ["MeanFieldBlock", "PackedMeanFieldBlock", "SiteLayout", "packed_block_runs"]

#: softplus's threshold (``F.softplus``'s default): above it, softplus is the identity.
_THRESHOLD = 20.0

#: Up to this many numbers (sites times weights) a packed block sums each site's terms by
#: one product with a 0/1 matrix (an LSTM's 6 sites: one call instead of eight); above it,
#: by one sum a site, which reads the terms once (a ResNet's 62 sites: 0.14 ms, where the
#: product would take a 170 MB matrix).
_INDICATOR_NUMBERS = 2**18


@dataclass(eq=False)
class SiteLayout:
    r"""The sites a :class:`MeanFieldBlock` draws, and each one's prior :math:`N(m_j, s_j^2)`.

    Args:
        shapes: Each site's shape, in the guide's order.
        prior_locs: Each site's prior mean :math:`m_j`: a number, or a 0-d tensor on the
            weights' device (not requiring gradients).
        prior_scales: Each site's prior scale :math:`s_j`, likewise.
        min_scale: :math:`\sigma_{\min}`, added to every softplus.
    """

    shapes: Sequence[torch.Size]
    prior_locs: Sequence[float | torch.Tensor]
    prior_scales: Sequence[float | torch.Tensor]
    min_scale: float
    _constants: dict = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        #: :math:`c_j = 1/s_j^2`: a number, or a 0-d tensor where :math:`s_j` is one
        self.coefs = [1.0 / (s * s) for s in self.prior_scales]
        #: Each site's number of weights :math:`n_j`, its stretch of a packed buffer.
        self.sizes = [math.prod(shape) for shape in self.shapes]

    def site_sums(self, terms: torch.Tensor) -> torch.Tensor:
        """Each site's sum of a packed buffer ``(d,)``: ``(sites,)``."""
        if len(self.sizes) * terms.numel() > _INDICATOR_NUMBERS:
            return torch.stack([piece.sum() for piece in terms.split(self.sizes)])
        key = ("indicator", terms.dtype, terms.device)
        indicator = self._constants.get(key)
        if indicator is None:
            indicator = torch.zeros(len(self.sizes), terms.numel(), dtype=terms.dtype)
            start = 0
            for row, size in zip(indicator, self.sizes, strict=True):
                row[start : start + size] = 1.0
                start += size
            indicator = self._constants[key] = indicator.to(terms.device)
        return torch.mv(indicator, terms)

    def packed_prior(self, like: torch.Tensor) -> tuple[float | torch.Tensor, torch.Tensor | None]:
        r"""The prior over a packed buffer: :math:`c/2` and :math:`m`, per weight where they vary.

        Returns:
            ``(half_coef, loc)``: :math:`c_j/2`, one number when every site has the same
            float, else ``(d,)``; :math:`m_j`, ``None`` when every one is the number 0, else
            ``(d,)``. Made once a device.
        """
        key = ("packed", like.dtype, like.device)
        made = self._constants.get(key)
        if made is None:
            coefs, locs = self.coefs, self.prior_locs
            if all(isinstance(c, float) and c == coefs[0] for c in coefs):
                half = coefs[0] / 2
            else:
                half = self._per_weight([_on(c, like) / 2 for c in coefs], like)
            loc = None if all(map(_is_zero, locs)) else self._per_weight(locs, like)
            made = self._constants[key] = (half, loc)
        return made

    def _per_weight(self, numbers: Sequence[float | torch.Tensor], like: torch.Tensor):
        """One number a site, repeated over the site's weights: ``(d,)``."""
        values = torch.stack([_on(v, like) for v in numbers])
        sizes = torch.tensor(self.sizes, device=like.device)
        return values.repeat_interleave(sizes, output_size=sum(self.sizes))

    def site_constants(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``c_j / 2`` and ``n_j (log s_j - 1/2)``, ``(sites,)`` each; made once a device."""
        key = (like.dtype, like.device)
        made = self._constants.get(key)
        if made is None:
            if all(isinstance(s, float) for s in self.prior_scales):
                half = [c / 2 for c in self.coefs]
                constant = [
                    n * (math.log(s) - 0.5)
                    for n, s in zip(self.sizes, self.prior_scales, strict=True)
                ]
                made = tuple(
                    torch.tensor(v, dtype=like.dtype, device=like.device) for v in (half, constant)
                )
            else:  # device tensors: computed there, never read back
                scales = torch.stack([_on(s, like) for s in self.prior_scales])
                sizes = torch.tensor(self.sizes, dtype=like.dtype).to(like.device)
                made = (scales.square().reciprocal().div(2), sizes * (scales.log() - 0.5))
            self._constants[key] = made
        return made


def _on(value: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A number or 0-d tensor as a 0-d tensor of ``like``'s dtype and device."""
    return torch.as_tensor(value, dtype=like.dtype, device=like.device)


def _is_zero(value: float | torch.Tensor) -> bool:
    """Whether a prior mean is the number 0 (a tensor is not read: it may be on a GPU)."""
    return isinstance(value, float) and value == 0.0


def _rho_gradient(
    grad_noise: torch.Tensor,
    grad_coef: torch.Tensor,
    negative: torch.Tensor,
    rho: torch.Tensor,
    scale: torch.Tensor,
) -> torch.Tensor:
    r""":math:`\partial\mathcal{L}/\partial\rho` (the notes above), written over ``grad_noise``.

    Args:
        grad_noise: :math:`g_w \odot \varepsilon`, the parameter's shape (several draws
            summed); its buffer becomes the gradient.
        grad_coef: :math:`g\,c`, a 0-d tensor or one per weight.
        negative: :math:`-g`, 0-d.
        rho: :math:`\rho`.
        scale: :math:`\sigma`.
    """
    grad_scale = grad_noise.addcmul_(scale, grad_coef)
    grad_scale.addcdiv_(negative.expand_as(scale), scale)
    # dρ = dσ ⊙ sigmoid(ρ), written over dσ (torch's own softplus derivative, threshold too)
    return torch.ops.aten.softplus_backward.grad_input(
        grad_scale, rho, 1.0, _THRESHOLD, grad_input=grad_scale
    )


class MeanFieldBlock(torch.autograd.Function):
    r"""Draws every site and takes its KL in one call; gradients in closed form.

    ``MeanFieldBlock.apply(layout, sample, *locs, *rhos)`` with the draws' leading sample
    shape (``()`` for one draw; ``(particles, 1)`` for a step's particles) and each site's
    :math:`\mu` and :math:`\rho` (the site's shape). The noise is drawn here, site by site.

    Returns:
        ``(total, kl, *values)``: the total KL (a 0-d tensor, differentiable), each site's
        KL ``(sites,)`` (for records: not differentiable) and each site's draws
        :math:`\mu + \sigma \varepsilon`, ``(*sample, *site shape)``.
    """

    @staticmethod
    def forward(ctx, layout: SiteLayout, sample: tuple[int, ...], *params: torch.Tensor):
        count = len(layout.shapes)
        locs, rhos = params[:count], params[count:]
        values, saved = [], []
        squares, logs = [], []
        for loc, rho, m in zip(locs, rhos, layout.prior_locs, strict=True):
            scale = scale_from_rho(rho, layout.min_scale)
            # site by site, in the site-by-site draw's shapes: the guide's random stream
            eps = torch.empty((*sample, *loc.shape), dtype=loc.dtype, device=loc.device)
            eps.normal_()
            values.append(torch.addcmul(loc, scale, eps))
            deviation = loc if _is_zero(m) else loc - m
            flat_scale, flat_dev = scale.view(-1), deviation.reshape(-1)
            squares.append(torch.dot(flat_scale, flat_scale) + torch.dot(flat_dev, flat_dev))
            logs.append(scale.log().sum())
            saved.append((deviation, rho, scale, eps))
        half_coef, constant = layout.site_constants(locs[0])
        kl = torch.stack(squares).mul_(half_coef).sub_(torch.stack(logs)).add_(constant)
        ctx.layout, ctx.saved = layout, saved
        ctx.mark_non_differentiable(kl)
        return (kl.sum(), kl, *values)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_total, grad_kl, *grad_values):
        layout, saved = ctx.layout, ctx.saved
        ctx.saved = None
        grad_locs, grad_rhos = [], []
        if grad_total is None:
            grad_total = torch.zeros((), dtype=saved[0][0].dtype, device=saved[0][0].device)
        negative = -grad_total
        for (deviation, rho, scale, eps), grad_value, c in zip(
            saved, grad_values, layout.coefs, strict=True
        ):
            if grad_value is None:
                grad_value, grad_noise = torch.zeros_like(scale), torch.zeros_like(scale)
            elif grad_value.shape != scale.shape:  # several draws: summed to the parameter
                grad_noise = torch.mul(grad_value, eps).sum_to_size(scale.shape)
                grad_value = grad_value.sum_to_size(scale.shape)
            else:
                grad_noise = torch.mul(grad_value, eps)
            grad_coef = grad_total * c
            grad_locs.append(torch.addcmul(grad_value, deviation, grad_coef))
            grad_rhos.append(_rho_gradient(grad_noise, grad_coef, negative, rho, scale))
        return (None, None, *grad_locs, *grad_rhos)


class PackedMeanFieldBlock(torch.autograd.Function):
    r""":class:`MeanFieldBlock` over packed parameters: one draw, every site in a few calls.

    ``PackedMeanFieldBlock.apply(layout, locs, rhos, *site_locs, *site_rhos)``: the buffers
    ``locs`` and ``rhos``, ``(d,)``, with the sites end to end in ``layout``'s order, and
    each site's :math:`\mu` and :math:`\rho` (views of them: the parameters autograd gives
    the gradients to). The arithmetic reads the buffers; the noise is drawn site by site,
    each into its stretch of one buffer, so the draws are the site-by-site block's.

    Returns:
        As :class:`MeanFieldBlock` for one draw: ``(total, kl, *values)``, each site's draw a
        view of one buffer.
    """

    @staticmethod
    def forward(ctx, layout: SiteLayout, locs: torch.Tensor, rhos: torch.Tensor, *params):
        scale = scale_from_rho(rhos, layout.min_scale)
        eps = torch.empty_like(locs)
        for piece in eps.split(layout.sizes):  # site by site: the guide's random stream
            piece.normal_()
        value = torch.addcmul(locs, scale, eps)
        half_coef, prior_loc = layout.packed_prior(locs)
        deviation = locs if prior_loc is None else locs - prior_loc
        # per weight log σ - c/2 (σ² + (μ - m)²), summed over each site's stretch: -KL_j
        if isinstance(half_coef, float):
            terms = scale.log()
            terms.addcmul_(scale, scale, value=-half_coef)
            terms.addcmul_(deviation, deviation, value=-half_coef)
        else:
            terms = torch.mul(scale, scale).addcmul_(deviation, deviation).mul_(half_coef)
            terms = scale.log().sub_(terms)
        _, constant = layout.site_constants(locs)
        kl = torch.sub(constant, layout.site_sums(terms))
        sites = params[: len(layout.sizes)]  # each site's shape
        ctx.layout, ctx.sites, ctx.saved = layout, sites, (deviation, rhos, scale, eps)
        ctx.mark_non_differentiable(kl)
        return (kl.sum(), kl, *stretches_of(value, sites))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_total, grad_kl, *grad_values):
        layout, sites, (deviation, rhos, scale, eps) = ctx.layout, ctx.sites, ctx.saved
        ctx.saved = ctx.sites = None
        if grad_total is None:
            grad_total = torch.zeros((), dtype=scale.dtype, device=scale.device)
        grad_value = concatenated(
            [
                torch.zeros_like(site) if grad is None else grad
                for grad, site in zip(grad_values, sites, strict=True)
            ]
        )
        half_coef, _ = layout.packed_prior(scale)
        grad_coef = (2 * grad_total) * half_coef  # one pass over the weights: 2x is exact
        grad_loc = torch.addcmul(grad_value, deviation, grad_coef)
        grad_noise = grad_value.mul_(eps)  # g_w is this node's own buffer: written over
        grad_rho = _rho_gradient(grad_noise, grad_coef, -grad_total, rhos, scale)
        return (None, None, None, *stretches_of(grad_loc, sites), *stretches_of(grad_rho, sites))


def packed_block_runs(device: torch.device) -> bool:
    """Whether :class:`PackedMeanFieldBlock` runs on ``device``: on the CPU only.

    It has been measured and tested on the CPU alone; on any other device the site-by-site
    :class:`MeanFieldBlock` draws (the same values), and one warning a device type says so
    (none for ``meta``, which holds no values).
    """
    if device.type == "cpu":
        return True
    if device.type != "meta":
        say_once(
            f"packed-{device.type}",
            "MeanFieldGuide: the fused step's packed draw (every site in a few calls) has "
            f"run on the CPU only; on {device.type} the sites are drawn one by one (the same "
            "values, more calls a step)",
            stacklevel=3,
        )
    return False
