r"""Gradient estimators as Pyro effect handlers: local reparameterisation and flipout.

Both are :class:`~pyro.poutine.messenger.Messenger` s. While active they watch every sample
site: each latent draw is remembered with the distribution it came from (in a guide, or the
prior when no guide ran). When a Bayesian layer applies its weights through the
``"bayesian_affine"`` effect (:func:`~pyro_bbb.nn.affine.bayesian_affine`), the handler looks up
the distributions of that layer's weight and bias *by site name*, checks that the values
the layer received are the very tensors those distributions drew, and replaces the plain
computation. No torch function is patched; nothing is looked up by ``id()``.

For a layer ``a = x ⊛ W + b`` (matrix product or convolution, one mechanism for both) with
weights drawn as :math:`W = \bar W + \Delta`, where :math:`\bar W` is the part shared by the
minibatch and :math:`\Delta` has independent entries of variance :math:`\sigma^2`:

* **local reparameterisation** (Kingma, Salimans & Welling 2015,
  https://arxiv.org/abs/1506.02557) samples the pre-activation itself,
  :math:`a = x \circledast \bar W + \bar b + \sqrt{x^2 \circledast \sigma_W^2 + \sigma_b^2}
  \odot \xi`, :math:`\xi \sim \mathcal{N}(0, I)` independently per example and unit;
* **flipout** (Wen et al. 2018, https://arxiv.org/abs/1803.04386) flips the signs of the
  drawn perturbation per example, :math:`a_n = x_n \circledast \bar W + \bar b +
  ((x_n \odot s_n) \circledast \Delta + \Delta_b) \odot r_n` with random signs
  :math:`s_n, r_n`.

**Exactness.** Flipout keeps the weight-sampling objective exactly: each example's
perturbation has the distribution of the drawn one. Local reparameterisation is exact for
Linear layers (a mean-field unit's pre-activation depends on its own row of weights only).
For Conv2d it gives every output position its exact marginal but draws the positions of one
image independently, whereas under shared weights they are correlated; once positions are
mixed nonlinearly (pooling, a later layer) the objective differs from the weight-sampling
ELBO. This is the usual local reparameterisation for convolutions (Molchanov et al. 2017)
and the weight sharing flipout was designed for (Wen et al. 2018): prefer flipout for conv
nets when exactness matters.

Under :class:`~pyro_bbb.MeanFieldGuide` (or Pyro's ``AutoNormal``) :math:`\bar W` is the
mean. Under :class:`~pyro_bbb.LowRankGuide` it is :math:`\mu + V\varepsilon_2`, the
rank-``r`` part drawn once and shared by the minibatch exactly, and only the diagonal part
:math:`D^{1/2}\varepsilon_1` is reparameterised locally (or flipped).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import pyro.distributions as dist
import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import Message
from pyro.poutine.util import site_is_subsample

from .._pyro_compat import active_handlers, autonormal_latent, low_rank_parts
from .._shapes import broadcast_shape, collapse_broadcast, sample_dims
from ..nn.affine import AffineMap
from ..nn.draws import Draw, DrawPath, current_draw, draw_path
from ..nn.network_summary import WEIGHT_SAMPLING, summary
from .sites import BLOCK_KEY

__all__ = [
    "AffineEstimator",
    "Split",
    "check_no_outer_estimator",
    "estimator",
    "estimator_names",
    "estimators_by_layer",
    "flipout",
    "flipout_affine",
    "local_affine",
    "local_reparameterization",
]


@dataclass
class _Draw:
    """A latent sample site as it was drawn."""

    fn: dist.TorchDistribution
    value: torch.Tensor
    infer: dict


@dataclass
class Split:
    """A parameter's draw split into the batch-shared part and the independent part.

    What the estimators' arithmetic (:func:`local_affine`, :func:`flipout_affine`) needs of
    a layer's weight or bias: the handlers build it from the distribution a site was drawn
    from, :mod:`~pyro_bbb.infer.fused` from the guide's parameters.
    """

    shared: torch.Tensor  # \bar W (its sample dims may be collapsed to 1 where constant)
    variance: torch.Tensor | None  # σ² of the independent part; None for a fixed value
    value: torch.Tensor | None  # the draw W; None for a fixed value
    sample_shape: tuple[int, ...] = ()  # the draw's sample dims, data-plate dim dropped

    @property
    def deviation(self) -> torch.Tensor | None:
        r"""The drawn independent part, :math:`W - \bar W` (flipout's perturbation)."""
        return None if self.value is None else self.value - self.shared

    def for_draw(self, draw: Draw | None, event_dims: int, site: str | None) -> Split:
        """This split for the current draw of a per-draw pass of the network; itself outside one.

        Args:
            draw: The draw under way (:func:`~pyro_bbb.nn.draws.current_draw`).
            event_dims: The parameter's own dims (2 for a Linear weight, 1 for a bias).
            site: The parameter's site name.
        """
        if draw is None:
            return self
        select = draw.select
        return Split(
            select(self.shared, event_dims),
            None if self.variance is None else select(self.variance, event_dims),
            None if self.value is None else select(self.value, event_dims, site),
        )


def _same_draw(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``b`` is ``a`` or a broadcast view of it (a plate expands a Delta's value)."""
    return a is b or (
        a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape[-1:] == b.shape[-1:]
    )


def _normal_of(fn: dist.TorchDistribution) -> torch.distributions.Normal | None:
    """The Normal under ``Independent`` wrappers, or ``None``."""
    while isinstance(fn, torch.distributions.Independent):
        fn = fn.base_dist
    return fn if isinstance(fn, torch.distributions.Normal) else None


class AffineEstimator(Messenger):
    """Computes every Bayesian layer's affine op by an estimator, from its parameters' splits.

    The one place where an estimator meets a layer: it takes the layer's
    ``"bayesian_affine"`` message (:func:`~pyro_bbb.nn.affine.bayesian_affine`), splits the
    weight and the bias (:meth:`split`) and computes the pre-activation from the splits
    (:meth:`apply`). Inside a per-draw pass of the network (:mod:`pyro_bbb.nn.draws`) the
    layer holds the current draw's view of each site: the split is made of the value as
    drawn and the current draw's part of it kept (rules 3 and 4 there), so every estimator
    runs on every draw path. Subclasses: the handlers of :func:`local_reparameterization`
    and :func:`flipout`, which split from the distributions the sites were drawn from, and
    the fused ELBO's, which is given the splits (:mod:`pyro_bbb.infer.fused`).
    """

    def _pyro_bayesian_affine(self, msg: Message) -> None:
        if msg["done"]:
            return
        x, weight, bias = msg["args"]
        kwargs = msg["kwargs"]
        affine: AffineMap = kwargs["affine"]
        draw = current_draw()
        w = self._layer_split(draw, kwargs["weight_site"], weight, affine.input_event_dims + 1)
        b = None if bias is None else self._layer_split(draw, kwargs["bias_site"], bias, 1)
        msg["value"] = self.apply(affine, x, w, b)
        msg["done"] = True

    def _layer_split(
        self, draw: Draw | None, site: str | None, value: torch.Tensor, event_dims: int
    ) -> Split:
        """The split of what a layer holds: for the current draw inside a per-draw pass."""
        if draw is None:
            return self.split(site, value, event_dims)
        split = self.split(site, draw.as_drawn(site, value), event_dims)
        return split.for_draw(draw, event_dims, site)

    def split(self, site: str | None, value: torch.Tensor, event_dims: int) -> Split:
        """The split of a layer's parameter.

        Args:
            site: The parameter's site name; ``None`` for one that is not a site.
            value: Its value as drawn, ``(*sample, [1,] *shape)`` (sample dims may be none).
            event_dims: ``len(shape)``.
        """
        raise NotImplementedError

    def apply(
        self, affine: AffineMap, x: torch.Tensor, weight: Split, bias: Split | None
    ) -> torch.Tensor:
        """The pre-activation ``(*sample, batch, *out_features)`` from the splits."""
        raise NotImplementedError


class _WeightNoiseMessenger(AffineEstimator):
    """Splits from the distributions the sites were drawn from: remember draws, resolve."""

    name: str

    def __init__(self) -> None:
        super().__init__()
        self._draws: dict[str, _Draw] = {}
        self._auxiliary: str | None = None

    def __enter__(self):
        self._draws = {}
        return super().__enter__()

    def __exit__(self, *args):
        self._draws = {}
        return super().__exit__(*args)

    # -- remember every latent draw, once: a replay of it (same tensor) is not a new draw
    def _pyro_post_sample(self, msg: Message) -> None:
        if msg["is_observed"] or site_is_subsample(msg):
            return
        name, value = msg["name"], msg["value"]
        previous = self._draws.get(name)
        if previous is not None and previous.value is value:
            return
        if msg["infer"].get("is_auxiliary"):
            self._auxiliary = name
        self._draws[name] = _Draw(msg["fn"], value, dict(msg["infer"]))

    def split(self, site: str | None, value: torch.Tensor, event_dims: int) -> Split:
        draw = self._draws.get(site) if site is not None else None
        if draw is None:  # a deterministic or conditioned parameter: nothing to reparameterise
            return Split(value, None, None)
        if draw.value is not value:
            raise RuntimeError(
                f"{self.name}: the value of site {site!r} reaching its layer is not the one "
                "its distribution drew (was it replaced by a handler such as "
                "poutine.condition inside this one?)"
            )
        block = draw.infer.get(BLOCK_KEY)
        if block is not None:
            shared, variance = self._block_slice(site, value, event_dims, *block)
        else:
            normal = _normal_of(self._source(site, draw).fn)
            if normal is None:
                raise NotImplementedError(self._unsupported(site, draw))
            shared = collapse_broadcast(normal.loc, event_dims)
            variance = collapse_broadcast(normal.scale, event_dims).pow(2)
        return Split(shared, variance, value, tuple(sample_dims(value, event_dims)))

    def _source(self, site: str, draw: _Draw) -> _Draw:
        """Follow AutoNormal's ``Delta`` at a real site to its ``<site>_unconstrained`` draw."""
        if isinstance(draw.fn, dist.Delta):
            aux = self._draws.get(autonormal_latent(site))
            if aux is not None and _same_draw(aux.value, draw.fn.v):
                return aux
        return draw

    def _block_slice(self, site, value, event_dims, aux_site, start, stop):
        draw = self._draws[aux_site]
        fn = draw.fn
        shape = value.shape[value.dim() - event_dims :]
        if isinstance(fn, torch.distributions.LowRankMultivariateNormal):
            noise = getattr(fn, "factor_noise", None)
            if noise is None:
                raise NotImplementedError(
                    f"{self.name}: block {aux_site!r} of site {site!r} is a plain "
                    "LowRankMultivariateNormal that did not keep its factor noise; use "
                    "pyro_bbb.LowRankGuide"
                )
            loc = fn.loc[..., start:stop]
            factor, diag = low_rank_parts(fn)
            shared = loc + (factor[..., start:stop, :] @ noise.unsqueeze(-1)).squeeze(-1)
            variance = collapse_broadcast(diag[..., start:stop], 1)
        else:
            normal = _normal_of(fn)
            if normal is None:
                raise NotImplementedError(self._unsupported(site, draw))
            shared = collapse_broadcast(normal.loc[..., start:stop], 1)
            variance = collapse_broadcast(normal.scale[..., start:stop], 1).pow(2)
        reshape = lambda t: t.reshape(*t.shape[:-1], *shape)  # noqa: E731
        return reshape(shared), reshape(variance)

    def _unsupported(self, site: str, draw: _Draw) -> str:
        source = type(draw.fn).__name__
        hint = ""
        if isinstance(draw.fn, dist.Delta) and self._auxiliary is not None:
            hint = (
                f" It is a Delta set from the latent {self._auxiliary!r}, as Pyro's "
                "AutoContinuous guides (e.g. AutoIAFNormal, AutoDiagonalNormal) draw their "
                "sites."
            )
        return (
            f"{self.name} cannot use the distribution of site {site!r} ({source}).{hint} It "
            "needs a Gaussian per weight: use pyro_bbb.MeanFieldGuide, pyro_bbb.LowRankGuide "
            "or AutoNormal, or train with reparam=None."
        )


class LocalReparameterizationMessenger(_WeightNoiseMessenger):
    """Samples pre-activations instead of weights; see :func:`local_reparameterization`."""

    name = "local_reparameterization"

    def apply(self, affine, x, weight, bias):
        return local_affine(affine, x, weight, bias)


class FlipoutMessenger(_WeightNoiseMessenger):
    """Per-example sign flips of the weight perturbation; see :func:`flipout`."""

    name = "flipout"

    def apply(self, affine, x, weight, bias):
        return flipout_affine(affine, x, weight, bias)


def _sampled(split: Split | None) -> bool:
    return split is not None and bool(split.sample_shape)


def _noise_shape(
    affine: AffineMap, x: torch.Tensor, weight: Split, bias: Split | None, event: int
) -> torch.Size:
    """``(*sample, batch, *ones(event))``: one noise draw per weight draw and example."""
    sample = broadcast_shape(weight.sample_shape, () if bias is None else bias.sample_shape)
    lead = x.shape[: x.dim() - affine.input_event_dims]  # (*x_sample, batch)
    return broadcast_shape((*sample, 1), lead) + (1,) * event


def local_affine(
    affine: AffineMap, x: torch.Tensor, weight: Split, bias: Split | None
) -> torch.Tensor:
    r"""A layer's pre-activation drawn by local reparameterisation.

    :math:`a = x \circledast \bar W + \bar b + \sqrt{x^2 \circledast \sigma_W^2 +
    \sigma_b^2} \odot \xi`, with :math:`\xi \sim \mathcal{N}(0, I)` drawn here, one per
    weight draw, example and output unit.

    Args:
        affine: The layer's map.
        x: Input ``(*sample, batch, *in_features)``.
        weight: The weight's split.
        bias: The bias's split, or ``None``.

    Returns:
        Pre-activation ``(*sample, batch, *out_features)``.
    """
    mean = affine(x, weight.shared, None if bias is None else bias.shared)
    b_var = None if bias is None else bias.variance
    if weight.variance is not None:
        variance = affine(x.pow(2), weight.variance, b_var)  # the bias's added in the product
    else:
        variance = None if b_var is None else affine.bias_view(b_var)
    if variance is None:
        return mean
    if variance.shape == mean.shape and not weight.sample_shape and not _sampled(bias):
        shape = mean.shape  # one weight for every example: a draw per output (the usual case)
    else:
        noise = _noise_shape(affine, x, weight, bias, affine.output_event_dims)
        shape = broadcast_shape(noise, variance.shape, mean.shape)
    # A pre-activation variance of exactly 0 (an all-zero input row into a layer whose
    # bias is deterministic) has sqrt' = inf, and inf * 0 poisons the gradient with NaN.
    # Adding the smallest normal float keeps sqrt' finite there (and the zero row passes
    # 0 on); it changes no variance above 1e-31 (float32), and sqrt(tiny) ~ 1e-19 is below
    # the resolution of any activation. An addition's backward is free, a clamp's two passes.
    std = (variance + torch.finfo(variance.dtype).tiny).sqrt()
    return torch.addcmul(mean, std, torch.randn(shape, dtype=mean.dtype, device=mean.device))


def flipout_affine(
    affine: AffineMap, x: torch.Tensor, weight: Split, bias: Split | None
) -> torch.Tensor:
    r"""A layer's pre-activation with the drawn perturbation sign-flipped per example.

    :math:`a_n = x_n \circledast \bar W + \bar b + ((x_n \odot s_n) \circledast \Delta +
    \Delta_b) \odot r_n`, with the signs :math:`s_n` then :math:`r_n` drawn here.

    Args:
        affine: The layer's map.
        x: Input ``(*sample, batch, *in_features)``.
        weight: The weight's split.
        bias: The bias's split, or ``None``.

    Returns:
        Pre-activation ``(*sample, batch, *out_features)``.
    """
    mean = affine(x, weight.shared, None if bias is None else bias.shared)
    if weight.value is None and (bias is None or bias.value is None):
        return mean
    # signs per weight draw, example and channel, broadcast over the other feature dims
    in_event = affine.input_event_dims
    lead = _noise_shape(affine, x, weight, bias, 0)
    sign_in = _random_signs((*lead, x.shape[-in_event], *[1] * (in_event - 1)), x)
    perturbation = None
    if weight.value is not None:
        perturbation = affine(x * sign_in, weight.deviation, None)
    if bias is not None and bias.value is not None:
        b_dev = affine.bias_view(bias.deviation)
        perturbation = b_dev if perturbation is None else perturbation + b_dev
    out_event = affine.output_event_dims
    shape = broadcast_shape(perturbation.shape, mean.shape)
    out_shape = (*shape[: len(shape) - out_event], shape[-out_event], *[1] * (out_event - 1))
    return mean + perturbation * _random_signs(out_shape, mean)


def _random_signs(shape, like: torch.Tensor) -> torch.Tensor:
    return torch.randint(0, 2, shape, device=like.device).to(like.dtype).mul_(2).sub_(1)


def local_reparameterization() -> LocalReparameterizationMessenger:
    r"""Local reparameterisation of every Bayesian layer, as a Pyro effect handler.

    Use it around both the guide and the model (an ELBO evaluation, ``Predictive``)::

        with pyro_bbb.local_reparameterization():
            loss = elbo.differentiable_loss(model, guide, x, y)

    or as ``fit(..., reparam="local")`` / ``predict(..., reparam="local")``. Each example
    gets its own draw of the pre-activations, which lowers the variance of the gradient
    (Kingma et al. 2015). Exact for Linear layers; for Conv2d the output positions of an
    image are drawn independently, an approximation (see the module's notes; flipout is
    exact there). Under :class:`~pyro_bbb.LowRankGuide` the rank-``r`` part is
    shared by the minibatch exactly. Weights drawn from anything but a Gaussian per weight
    (e.g. ``AutoIAFNormal``, or a scale-mixture prior with no guide) raise
    ``NotImplementedError`` naming the site and its source; there is no silent fallback.

    Returns:
        A :class:`~pyro.poutine.messenger.Messenger`, usable as a context manager.
    """
    return LocalReparameterizationMessenger()


def flipout() -> FlipoutMessenger:
    r"""Flipout (Wen et al. 2018) for every Bayesian layer, as a Pyro effect handler.

    The weight perturbation the guide drew, :math:`\Delta = W - \bar W`, is shared by the
    minibatch but multiplied by independent random signs per example on its inputs and
    outputs, so the examples' perturbations are decorrelated while each one's marginal is
    unchanged. Costs about two matrix products (or convolutions) per layer. Same usage and
    guides as :func:`local_reparameterization`.

    Returns:
        A :class:`~pyro.poutine.messenger.Messenger`, usable as a context manager.
    """
    return FlipoutMessenger()


_ESTIMATORS: dict[str, Callable[[], AbstractContextManager]] = {
    "local": local_reparameterization,
    "flipout": flipout,
}


def estimator_names() -> tuple[str | None, ...]:
    """Every name :func:`estimator` takes: ``None`` (plain weight sampling), then the handlers'."""
    return (None, *_ESTIMATORS)


def estimator(name: str | None) -> Callable[[], AbstractContextManager]:
    """The handler factory for an estimator name.

    Args:
        name: ``None`` (plain weight sampling), ``"local"`` or ``"flipout"``.

    Returns:
        A function returning a fresh context manager.

    Raises:
        ValueError: For any other name.
    """
    if name is None:
        return nullcontext
    if name not in _ESTIMATORS:
        raise ValueError(f"reparam must be None or one of {sorted(_ESTIMATORS)}, got {name!r}")
    return _ESTIMATORS[name]


def check_no_outer_estimator(caller: str) -> None:
    """Refuse a call made inside ``with local_reparameterization()`` or ``with flipout()``.

    ``fit`` applies its estimator itself (``reparam=``) and sets the draws in place; an
    outer one would meet values its own draws did not make.

    Raises:
        ValueError: Naming the context and the ``reparam=`` that does the same.
    """
    for handler in active_handlers():
        if isinstance(handler, AffineEstimator):
            name = getattr(handler, "name", type(handler).__name__)
            keys = [k for k, make in _ESTIMATORS.items() if make.__name__ == name]
            same = f" with reparam={keys[0]!r}" if keys else ""
            raise ValueError(
                f"{caller} was called inside `with {name}()`: it applies its gradient "
                f"estimator itself; call it outside that block{same}"
            )


def estimators_by_layer(model: object, reparam: str | None) -> dict[str, str]:
    """Which estimator each Bayesian layer of a model gets under ``reparam``.

    The affine layers (Linear, ConvNd, ConvTransposeNd) get ``reparam``; every other
    Bayesian layer (an LSTM, a LayerNorm, an Embedding, …) is drawn by weight sampling.

    Args:
        model: A Bayesian network or model (anything else has no layers to report).
        reparam: ``None``, ``"local"`` or ``"flipout"``.

    Returns:
        ``{layer path: "local" | "flipout" | "weight sampling"}``.
    """
    estimator(reparam)  # validates the name
    if not isinstance(model, torch.nn.Module):
        return {}
    return summary(model, reparam=reparam).estimators()


def warn_slower_paths(
    model: object, reparam: str | None, *, several_draws: bool = False, stacklevel: int = 2
) -> dict[str, str]:
    """Warn once, listing every layer of a fit that takes a slower path; return the estimators.

    Two things are slower than the rest: a Bayesian layer ``reparam`` does not apply to (it
    has no affine map, so it is drawn by weight sampling), and, when a step draws several
    weight sets (``several_draws``: particles or ensemble members), a network that runs its
    draws one after another because ``torch.func.vmap`` has no rule for one of its layers
    (:mod:`pyro_bbb.nn.draws`; decide it first with
    :func:`~pyro_bbb.nn.draws.settle_draws`). Nothing is said when neither applies.

    Args:
        model: A Bayesian network or model (anything else has no layers to report).
        reparam: ``None``, ``"local"`` or ``"flipout"``.
        several_draws: Whether each step draws several weight sets.
        stacklevel: As for :func:`warnings.warn`, counted from the caller.

    Returns:
        The mapping of :func:`estimators_by_layer`.
    """
    layers = estimators_by_layer(model, reparam)
    parts = []
    sampled = [layer or "(root)" for layer, how in layers.items() if how == WEIGHT_SAMPLING]
    if reparam is not None and sampled:
        fast = [layer or "(root)" for layer, how in layers.items() if how != WEIGHT_SAMPLING]
        parts.append(
            f"reparam={reparam!r} applies to the affine layers {fast}; the layers {sampled} "
            "have no affine map and are drawn by weight sampling (see model.summary())"
        )
    net = getattr(model, "net", model)
    known = draw_path(net) if several_draws and isinstance(net, torch.nn.Module) else None
    if known is not None and known.path is DrawPath.LOOP:
        parts.append(
            f"each step's weight draws run through the network one after another, as "
            f"torch.func.vmap cannot batch {known.reason} (see model.summary())"
        )
    if parts:
        warnings.warn("; ".join(parts), UserWarning, stacklevel=stacklevel + 1)
    return layers
