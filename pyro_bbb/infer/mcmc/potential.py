r"""The potential NUTS samples, :math:`U(\theta) = -\log p(y, w(\theta))`, over one flat vector.

The model is traced once to find its latent sites, their shapes and priors
(:func:`flat_layout`); :class:`Potential` then evaluates the log joint at a flat vector
:math:`\theta` by running the model conditioned on :math:`w`, compiled once with
``torch.jit.trace`` so that no leapfrog step re-traces the model in Python.

**The noise scale.** A :class:`~pyro_bbb.likelihoods.Gaussian` with a learned scale holds it
as a point estimate (a Pyro parameter), not a latent site, so NUTS cannot sample it without
a choice: ``noise="fixed"`` holds it at its current value (e.g. the one VI learned, so both
condition on the same likelihood), and ``noise=<distribution>`` makes it a latent with that
prior, sampled in the unconstrained space of the prior's support (log space for
:math:`(0, \infty)`), with the Jacobian.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.distributions.transforms import biject_to
from pyro.poutine.util import site_is_subsample
from torch.distributions import constraints

from ..._pyro_compat import site_name
from ...likelihoods import Gaussian
from ...nn.training_mode import module_in_training_mode
from ..sites import base_support, is_real_valued

__all__ = [
    "THETA",
    "FlatSite",
    "Noise",
    "Potential",
    "check_evaluation_mode",
    "flat_layout",
    "flatten",
    "latent_sites",
    "learned_noise",
    "positive_support",
]

#: The single key of the flat parameter vector in Pyro's MCMC.
THETA = "theta"

Noise = Literal["fixed"] | dist.TorchDistribution | None
"""What to do with a learned Gaussian noise scale: hold it ``"fixed"``, sample it under a prior."""


@dataclass(frozen=True)
class FlatSite:
    """Where one latent site lives in the flat vector, and how it is constrained."""

    name: str
    shape: torch.Size
    start: int
    stop: int
    prior: dist.TorchDistribution | None = None  # only for a noise scale made latent

    def constrain(self, theta: torch.Tensor) -> torch.Tensor:
        """The site's value in its own space from flat vectors ``(*batch, dim)``."""
        value = theta[..., self.start : self.stop].reshape(theta.shape[:-1] + self.shape)
        return value if self.prior is None else biject_to(self.prior.support)(value)


def latent_sites(model, x: torch.Tensor, y: torch.Tensor | None = None) -> dict[str, dict]:
    """The model's latent sample sites from one trace: ``{name: site}`` in model order.

    Leaves out the observation site and plate subsample sites.
    """
    observed = getattr(model, "observation_site", "obs")
    with torch.no_grad():
        trace = poutine.trace(model).get_trace(x, y)
    return {
        name: site
        for name, site in trace.iter_stochastic_nodes()
        if name != observed and not site_is_subsample(site)
    }


def learned_noise(model) -> str | None:
    """The Pyro parameter name of the model's learned Gaussian noise scale, or ``None``."""
    likelihood = getattr(model, "likelihood", None)
    if isinstance(likelihood, Gaussian) and likelihood.learned:
        return site_name(likelihood, "scale")
    return None


class Potential:
    r"""Potential energy :math:`U(\theta) = -\log p(y, w(\theta))` over the flat vector.

    Picklable (a spawned worker rebuilds the compiled function), and it counts its calls,
    which is how :class:`RecordingNUTS` knows the leapfrog steps of a transition.
    """

    def __init__(self, model, x, y, sites: list[FlatSite], noise_name, noise_value, jit: bool):
        self.model, self.x, self.y = model, x, y
        self.sites = sites
        self.noise_name = noise_name  # substituted: fixed value or sampled latent
        self.noise_value = noise_value
        self.jit = jit
        self.threads = torch.get_num_threads()
        self.calls = 0
        self._compiled = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_compiled"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        # a spawned worker keeps the parent's thread count, so chains do not oversubscribe
        torch.set_num_threads(self.threads)

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(y, w) + \log|J|` at one flat vector ``theta`` ``(dim,)``; a scalar."""
        values = {}
        extra = theta.new_zeros(())
        for site in self.sites:
            value = site.constrain(theta)
            values[site.name] = value
            if site.prior is not None:
                unconstrained = theta[site.start : site.stop].reshape(site.shape)
                transform = biject_to(site.prior.support)
                extra = extra + site.prior.log_prob(value).sum()
                extra = extra + transform.log_abs_det_jacobian(unconstrained, value).sum()
        substitute = {}
        if self.noise_name is not None:
            fixed = self.noise_value
            substitute[self.noise_name] = values.pop(self.noise_name) if fixed is None else fixed
        model = poutine.condition(poutine.substitute(self.model, substitute), values)
        trace = poutine.trace(model).get_trace(self.x, self.y)
        return trace.log_prob_sum() + extra

    def __call__(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        r""":math:`U(\theta)` at ``params["theta"]``, as Pyro's ``potential_fn`` takes it."""
        self.calls += 1
        theta = params[THETA]
        if not self.jit:
            return -self.log_joint(theta)
        if self._compiled is None:
            with warnings.catch_warnings():
                # the model's shape checks are constant for fixed data; torch 2.13 marks
                # jit.trace deprecated, and it is still the fastest here (no re-tracing)
                warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
                warnings.simplefilter("ignore", category=DeprecationWarning)
                self._compiled = torch.jit.trace(
                    self.log_joint, (theta.detach(),), check_trace=False
                )
        return -self._compiled(theta)


def check_evaluation_mode(model) -> None:
    """Refuse a network whose dropout or normalisation layers are in training mode.

    NUTS's detailed balance fails silently on a potential that is random or batch-dependent
    (:func:`module_in_training_mode`).

    Raises:
        ValueError: Naming the first such module.
    """
    module = module_in_training_mode(model)
    if module is not None:
        raise ValueError(
            f"run_nuts needs the network in evaluation mode, but module {module} is in "
            "training mode, which makes the potential random (dropout masks) or "
            "batch-dependent (batch statistics). Call model.eval() before run_nuts, and keep "
            "it so for predictions from the result"
        )


def flat_layout(
    model, x: torch.Tensor, y: torch.Tensor, noise: Noise
) -> tuple[list[FlatSite], str | None, torch.Tensor | None]:
    """The flat layout of the latent sites, and what to do with a learned noise scale.

    Returns:
        ``(sites, noise_name, noise_value)``: the sites in flat-vector order (a sampled noise
        scale last), the noise parameter's name (``None`` without a learned noise), and its
        fixed value (``noise="fixed"`` only).

    Raises:
        ValueError: For a scaled (minibatch) site, or a ``noise`` that does not fit the
            likelihood.
        NotImplementedError: For a latent site inside a plate or with a constrained support.
    """
    sites, start = [], 0
    for name, site in latent_sites(model, x, y).items():
        if site["scale"] != 1.0:
            raise ValueError(
                f"run_nuts needs an unscaled, full-batch model; site {name!r} has scale "
                f"{site['scale']}"
            )
        if not is_real_valued(site["fn"]) or site["cond_indep_stack"]:
            plates = [frame.name for frame in site["cond_indep_stack"]]
            raise NotImplementedError(
                f"run_nuts samples global real-valued sites; site {name!r} has support "
                f"{base_support(site['fn'])} and plates {plates}"
            )
        shape = site["value"].shape
        sites.append(FlatSite(name, shape, start, start + shape.numel()))
        start += shape.numel()
    noise_name = learned_noise(model)
    if noise_name is None:
        if noise is not None:
            raise ValueError(
                f"noise={noise!r} is only for a Gaussian likelihood with a learned scale; "
                f"this model's likelihood is {getattr(model, 'likelihood', None)!r}"
            )
        return sites, None, None
    if noise is None:
        value = float(model.likelihood.noise_scale().detach())
        raise ValueError(
            f"the model learns its Gaussian noise scale ({noise_name!r}, now {value:.4g}) as a "
            "point estimate, which NUTS cannot sample as it stands. Pass noise='fixed' to hold "
            "it at its current value (e.g. the one VI learned), or noise=<a prior over "
            "(0, inf)>, e.g. pyro.distributions.LogNormal(-1.0, 1.0), to sample it"
        )
    if isinstance(noise, str):
        if noise != "fixed":
            raise ValueError(f"noise must be 'fixed', a distribution or None, got {noise!r}")
        return sites, noise_name, model.likelihood.noise_scale().detach().clone()
    if not isinstance(noise, torch.distributions.Distribution) or noise.event_shape:
        raise TypeError(f"noise must be 'fixed' or a scalar distribution, got {noise!r}")
    if not positive_support(noise):
        raise ValueError(
            f"noise's prior must be over positive values (support (0, inf) or within it), got "
            f"{noise!r} with support {base_support(noise)}"
        )
    sites.append(FlatSite(noise_name, torch.Size(), start, start + 1, prior=noise))
    return sites, noise_name, None


def positive_support(distribution: torch.distributions.Distribution) -> bool:
    r"""Whether a distribution's support lies in :math:`[0, \infty)` (read, not sampled).

    ``positive``, ``nonnegative``, ``greater_than(a)`` and ``interval(a, b)`` with
    :math:`a \ge 0` qualify: ``biject_to`` maps the real line onto them, so a sampled scale
    is never 0 or negative. A ``Normal(1, 0.3)``, whose draws are almost always positive,
    does not.
    """
    support = base_support(distribution)
    kinds = (constraints.greater_than, constraints.greater_than_eq, constraints.interval)
    return isinstance(support, kinds) and float(support.lower_bound) >= 0


def flatten(values: Mapping[str, torch.Tensor], sites: list[FlatSite]) -> torch.Tensor:
    """One flat vector ``(dim,)`` from site values (a sampled noise scale unconstrained).

    Raises:
        KeyError: If a site has no value.
        ValueError: If a value has the wrong shape.
    """
    parts = []
    for site in sites:
        if site.name not in values:
            raise KeyError(f"init has no value for site {site.name!r}")
        value = torch.as_tensor(values[site.name])
        if value.shape != site.shape:
            raise ValueError(
                f"init[{site.name!r}] must have shape {tuple(site.shape)}, got {tuple(value.shape)}"
            )
        if site.prior is not None:
            value = biject_to(site.prior.support).inv(value)
        parts.append(value.reshape(-1))
    return torch.cat(parts)
