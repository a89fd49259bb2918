"""The prior families, and what a prior specification must provide.

This module holds the families (:class:`Gaussian`, :class:`ScaleMixture`,
:class:`FanInGaussian`) and the :class:`Prior` protocol they follow. How a layer picks one of
them for each site by name is :mod:`~pyro_bbb.priors.matching`; a trained guide's posterior as
the next prior is :mod:`~pyro_bbb.priors.posterior`. It knows nothing of inference.

A *prior specification* is a small object with one method,
``site_distribution(shape, fan_in=..., device=..., dtype=...)``, that returns the
distribution of one parameter: batch shape ``()`` and event shape ``shape``. The Bayesian
layers call it lazily, when the model runs, with the layer's own device, so
``model.to("cuda")`` moves the priors with the network and nothing is built on the CPU behind
the user's back. A prior that sets ``cacheable = True`` promises that its distribution
depends on nothing but the arguments (no learnable hyperparameters): the layer then builds
it once per device and dtype instead of on every pass. The priors here are cacheable and
immutable; to change a layer's prior, assign a new one to ``layer.priors[name]``.

A prior may also tie a site to others: one with a non-empty ``joint_sites`` (the names of the
sites it is jointly distributed with, as :func:`~pyro_bbb.priors.from_guide` makes for a
low-rank block) is called with ``drawn={site: value}``, the values of those sites that the
model has already drawn in the current run, and returns the site's conditional given them. A
prior with an ``initial_loc`` tensor (a carried posterior) gives the default initial mean of a
guide.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from torch.distributions.utils import broadcast_all

from .._validation import check_int, check_number, check_positive_number

__all__ = ["FanInGaussian", "Gaussian", "Prior", "ScaleMixture"]


@runtime_checkable
class Prior(Protocol):
    """What a prior specification must provide."""

    def site_distribution(
        self, shape: torch.Size, *, fan_in: int, device: torch.device, dtype: torch.dtype
    ) -> dist.TorchDistribution:
        """Return the prior of one parameter of shape ``shape`` (all dims are event dims)."""
        ...


class _Immutable:
    """Refuses attribute assignment after ``__init__``: layers cache the distribution."""

    cacheable = True

    def __setattr__(self, name: str, value: object) -> None:
        if getattr(self, "_frozen", False):
            raise AttributeError(
                f"{type(self).__name__} is immutable; assign a new prior to "
                "layer.priors[name] instead"
            )
        super().__setattr__(name, value)


def _independent(base: dist.TorchDistribution, shape: torch.Size) -> dist.TorchDistribution:
    return base.expand(shape).to_event(len(shape))


class Gaussian(_Immutable):
    r"""Isotropic Gaussian prior :math:`w \sim \mathcal{N}(\mu, \sigma^2)` on every weight.

    ``Gaussian(1.0)`` is :math:`\mathcal{N}(0, 1)`: the scale is the one positional argument,
    and a mean other than 0 is given by name, ``Gaussian(1.0, loc=0.5)``, so that neither order
    (``dist.Normal(loc, scale)``'s or ours) can be misread. Against a Normal guide its KL
    divergence is available in closed form, so :class:`~pyro_bbb.infer.elbo.AnnealedELBO`
    computes it analytically.

    Args:
        scale: Prior standard deviation :math:`\sigma > 0`, in the units of the weights.
        loc: Prior mean :math:`\mu`, keyword-only.

    Raises:
        ValueError: If ``scale`` is not positive or ``loc`` not finite.
    """

    def __init__(self, scale: float = 1.0, *, loc: float = 0.0) -> None:
        self.scale = check_positive_number("scale", scale)
        self.loc = check_number("loc", loc)
        self._frozen = True

    def site_distribution(
        self, shape: torch.Size, *, fan_in: int, device: torch.device, dtype: torch.dtype
    ) -> dist.TorchDistribution:
        """Return ``Normal(loc, scale)`` expanded to ``shape`` as one event."""
        loc = torch.tensor(self.loc, device=device, dtype=dtype)
        scale = torch.tensor(self.scale, device=device, dtype=dtype)
        return _independent(dist.Normal(loc, scale), shape)

    def __repr__(self) -> str:
        return f"Gaussian(scale={self.scale:g}, loc={self.loc:g})"


class FanInGaussian(_Immutable):
    r"""Layer-wise Gaussian prior whose scale follows the layer's fan-in.

    :math:`w \sim \mathcal{N}(0, \text{gain}^2 / \text{fan\_in})`, the variance that keeps
    pre-activations of unit scale (He et al. 2015 for ``gain = sqrt(2)`` and ReLU). The
    fan-in of a Linear layer is ``in_features``; of a Conv2d layer ``in_channels / groups ×
    kernel height × kernel width``. Biases use the same fan-in as their layer's weight.

    Args:
        gain: Multiplier of :math:`1/\sqrt{\text{fan\_in}}`, positive.

    Raises:
        ValueError: If ``gain`` is not positive.
    """

    def __init__(self, gain: float = 1.0) -> None:
        self.gain = check_positive_number("gain", gain)
        self._frozen = True

    def site_distribution(
        self, shape: torch.Size, *, fan_in: int, device: torch.device, dtype: torch.dtype
    ) -> dist.TorchDistribution:
        """Return ``Normal(0, gain / sqrt(fan_in))`` expanded to ``shape``."""
        check_int("fan_in", fan_in)
        scale = torch.tensor(self.gain / math.sqrt(fan_in), device=device, dtype=dtype)
        return _independent(dist.Normal(torch.zeros((), device=device, dtype=dtype), scale), shape)

    def __repr__(self) -> str:
        return f"FanInGaussian(gain={self.gain:g})"


class ScaleMixture(dist.TorchDistribution):
    r"""Scale mixture of two zero-mean Gaussians (Blundell et al. 2015, eq. 7).

    .. math::

        p(w) = \pi\,\mathcal{N}(w \mid 0, \sigma_1^2) + (1 - \pi)\,\mathcal{N}(w \mid 0, \sigma_2^2)

    A proper :class:`torch.distributions.Distribution`: ``log_prob`` is computed by
    log-sum-exp over the two components, so it stays finite for :math:`\sigma_2 = e^{-8}`
    and weights far in the tails, and ``sample`` draws the component first. It has no
    closed-form KL against a Gaussian guide, so the ELBO estimates that term by Monte Carlo.
    It is also a prior specification, so it can be passed to :func:`~pyro_bbb.nn.bayesianize`.

    Args:
        pi: Weight of the first component, in :math:`(0, 1)`.
        sigma1: Standard deviation of the first (usually wide) component, positive.
        sigma2: Standard deviation of the second (usually narrow) component, positive.
        validate_args: Passed to :class:`~torch.distributions.Distribution`.

    Raises:
        ValueError: If ``pi`` is outside ``(0, 1)`` or a ``sigma`` is not positive.
    """

    arg_constraints = {  # noqa: RUF012 (torch's class-level convention)
        "pi": constraints.unit_interval,
        "sigma1": constraints.positive,
        "sigma2": constraints.positive,
    }
    support = constraints.real
    has_rsample = False

    def __init__(
        self,
        pi: float | torch.Tensor = 0.5,
        sigma1: float | torch.Tensor = 1.0,
        sigma2: float | torch.Tensor = 0.0025,
        validate_args: bool | None = None,
    ) -> None:
        if validate_args is not False:  # site_distribution passes False: checked once here
            for name, value in (("pi", pi), ("sigma1", sigma1), ("sigma2", sigma2)):
                v = torch.as_tensor(value, dtype=torch.float64)
                ok = ((v > 0) & (v < 1)) if name == "pi" else ((v > 0) & torch.isfinite(v))
                if not bool(ok.all()):
                    expected = "in (0, 1)" if name == "pi" else "positive"
                    raise ValueError(f"{name} must be {expected}, got {value!r}")
        self.pi, self.sigma1, self.sigma2 = broadcast_all(pi, sigma1, sigma2)
        super().__init__(self.pi.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):  # noqa: D102 (torch's documented API)
        new = self._get_checked_instance(ScaleMixture, _instance)
        batch_shape = torch.Size(batch_shape)
        new.pi = self.pi.expand(batch_shape)
        new.sigma1 = self.sigma1.expand(batch_shape)
        new.sigma2 = self.sigma2.expand(batch_shape)
        super(ScaleMixture, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def cacheable(self) -> bool:
        """Whether layers may build the site distribution once: no parameter is learnable."""
        return not any(t.requires_grad for t in (self.pi, self.sigma1, self.sigma2))

    @property
    def mean(self) -> torch.Tensor:
        """Zero, of the batch shape."""
        return torch.zeros_like(self.pi)

    @property
    def variance(self) -> torch.Tensor:
        r""":math:`\pi\sigma_1^2 + (1 - \pi)\sigma_2^2`."""
        return self.pi * self.sigma1**2 + (1 - self.pi) * self.sigma2**2

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Log-density of ``value``, shape broadcast of ``value`` and the batch shape."""
        if self._validate_args:
            self._validate_sample(value)
        components = torch.stack(
            (
                torch.log(self.pi) + dist.Normal(0.0, self.sigma1).log_prob(value),
                torch.log1p(-self.pi) + dist.Normal(0.0, self.sigma2).log_prob(value),
            )
        )
        return torch.logsumexp(components, dim=0)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        """Draw the component, then the weight; shape ``sample_shape + batch_shape``."""
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            first = torch.rand(shape, dtype=self.pi.dtype, device=self.pi.device) < self.pi
            scale = torch.where(first, self.sigma1.expand(shape), self.sigma2.expand(shape))
            return scale * torch.randn(shape, dtype=scale.dtype, device=scale.device)

    def site_distribution(
        self, shape: torch.Size, *, fan_in: int, device: torch.device, dtype: torch.dtype
    ) -> dist.TorchDistribution:
        """Return this mixture on ``device`` expanded to ``shape`` as one event."""
        moved = ScaleMixture(
            self.pi.to(device=device, dtype=dtype),
            self.sigma1.to(device=device, dtype=dtype),
            self.sigma2.to(device=device, dtype=dtype),
            validate_args=False,
        )
        return _independent(moved, shape)

    def __repr__(self) -> str:
        if self.pi.dim() == 0:
            return (
                f"ScaleMixture(pi={self.pi.item():g}, sigma1={self.sigma1.item():g}, "
                f"sigma2={self.sigma2.item():g})"
            )
        return f"ScaleMixture(batch_shape={tuple(self.batch_shape)})"
