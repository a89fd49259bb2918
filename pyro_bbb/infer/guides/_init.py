r"""Where a guide's initial means and scales come from; shared by every guide in this package.

Every guide scale is :math:`\sigma = \mathrm{softplus}(\rho) + \sigma_{\min}`
(:func:`scale_from_rho`), with :math:`\rho` started from an :class:`InitScale`: one
:math:`\sigma` for every weight (:class:`ConstantScale`), or one per weight from its initial
mean (:class:`~pyro_bbb.infer.guides.moped.MOPED`). A guide's means start from one of three
sources: the network's own initialisation (the values :func:`~pyro_bbb.bayesianize` kept),
a pretrained ``nn.Module`` with the same parameter names, or a ``{site name: tensor}``
mapping. This module resolves that choice into one tensor per latent site; it holds no
guide.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from pyro.infer.autoguide import AutoGuide
from pyro.poutine import Trace
from torch import nn

from ..._pyro_compat import SetupError
from ...nn import initial_values
from ..sites import base_support, is_real_valued

__all__ = [
    "ConstantScale",
    "InitLoc",
    "InitScale",
    "as_init_scale",
    "global_latent_sites",
    "initial_locs",
    "inverse_softplus",
    "scale_from_rho",
]

InitLoc = nn.Module | Mapping[str, torch.Tensor] | None
"""``None`` (the network's own initialisation), a fitted guide, a pretrained module, or a
mapping."""


def global_latent_sites(trace: Trace, guide_name: str, model: object = None) -> dict[str, dict]:
    """The latent sample sites of a prototype trace, checked to be global and real-valued.

    A model's declared ``observation_site`` (``"obs"`` for a :class:`~pyro_bbb.BNN`) is left
    out, so a guide can be set up by a call without targets, e.g. ``guide(x)``.

    Args:
        trace: The model's prototype trace.
        guide_name: The guide's class name, for error messages.
        model: The model, whose ``observation_site`` attribute is read if present.

    Returns:
        ``{site name: site}`` in the model's order.

    Raises:
        NotImplementedError: For a site inside a plate or with a constrained support.
    """
    sites = {}
    observed = getattr(model, "observation_site", None)
    for name, site in trace.iter_stochastic_nodes():
        if name == observed:
            continue
        if site["cond_indep_stack"]:
            plates = [frame.name for frame in site["cond_indep_stack"]]
            raise NotImplementedError(
                f"{guide_name} handles global latent sites only; site {name!r} is inside "
                f"plate(s) {plates}. Use an AutoGuideList with a Pyro autoguide for it."
            )
        if not is_real_valued(site["fn"]):
            support = base_support(site["fn"])
            raise NotImplementedError(
                f"{guide_name} needs real-valued sites; site {name!r} has support {support}. "
                "Use pyro.infer.autoguide.AutoNormal for constrained sites."
            )
        sites[name] = site
    if not sites:
        raise SetupError(f"{guide_name}: the model has no latent sample site to approximate")
    return sites


def initial_locs(
    model: nn.Module | object,
    sites: Mapping[str, dict],
    init_loc: InitLoc,
    *,
    network: nn.Module | Iterable[nn.Module] | None = None,
) -> dict[str, torch.Tensor]:
    """Resolve the initial mean of every latent site.

    Args:
        model: The model (its Bayesian layers hold their initial values).
        sites: The latent sites, from :func:`global_latent_sites`.
        init_loc: ``None`` for the network's own initialisation (sites outside Bayesian
            layers start at their prototype draw), a fitted guide of the same model (its
            ``median()``: the means of a Gaussian one, such as an online filter's belief), a
            pretrained ``nn.Module`` whose ``named_parameters()`` names match the site
            names, or a mapping from site names to tensors (unnamed sites keep the
            default).
        network: Where the initial values are read: ``None`` for ``model`` itself where it
            is a module (none otherwise), or the Bayesian layers a model function ran
            (:func:`~pyro_bbb.nn.layers.layers_that_run`).

    Returns:
        ``{site name: tensor}`` with each site's shape, device and dtype.

    Raises:
        ValueError: On an unknown site name, a shape mismatch, or a pretrained module
            missing a site.
    """
    if network is None:
        network = model if isinstance(model, nn.Module) else ()
    defaults = initial_values(network)
    if init_loc is None:
        source: Mapping[str, torch.Tensor] = defaults
    elif isinstance(init_loc, AutoGuide):  # a fitted guide (an online filter's belief too)
        if init_loc.prototype_trace is None:
            raise SetupError(
                f"init_loc is a {type(init_loc).__name__} that has not been fitted or called; "
                "its means are made at its first call"
            )
        medians = {name: value.detach() for name, value in init_loc.median().items()}
        source = {**defaults, **{name: v for name, v in medians.items() if name in sites}}
    elif getattr(init_loc, "num_members", None) is not None:
        raise SetupError(
            f"init_loc is an ensemble of {init_loc.num_members} members, each with means of "
            "its own; pass one member's as a {site: tensor} mapping"
        )
    elif isinstance(init_loc, nn.Module):
        named = {name: p.detach() for name, p in init_loc.named_parameters()}
        missing = [name for name in sites if name not in named and name in defaults]
        if missing:
            raise SetupError(
                f"init_loc module has no parameter for site(s) {missing}; its parameters are "
                f"{sorted(named)}"
            )
        source = {**defaults, **named}
    elif isinstance(init_loc, Mapping):
        unknown = sorted(set(init_loc) - set(sites))
        if unknown:
            raise SetupError(f"init_loc names unknown site(s) {unknown}; sites are {list(sites)}")
        source = {**defaults, **init_loc}
    else:
        raise TypeError(
            "init_loc must be None, a fitted guide, a pretrained nn.Module or a {site: tensor} "
            "mapping, got "
            f"{type(init_loc).__name__}"
        )
    locs = {}
    for name, site in sites.items():
        prototype = site["value"].detach()
        value = source.get(name, prototype)
        value = torch.as_tensor(value).detach()
        if value.shape != prototype.shape:
            raise SetupError(
                f"init_loc for site {name!r} must have shape {tuple(prototype.shape)}, got "
                f"{tuple(value.shape)}"
            )
        locs[name] = value.to(device=prototype.device, dtype=prototype.dtype).clone()
    return locs


def scale_from_rho(rho: torch.Tensor, min_scale: float) -> torch.Tensor:
    r"""Every guide scale, :math:`\sigma = \mathrm{softplus}(\rho) + \sigma_{\min}`.

    Returns:
        σ, the shape of ``rho``.
    """
    # In place: softplus's backward reads ρ, not its output, and adding in place saves a
    # tensor the size of ρ per step (a layer's worth of memory traffic).
    return F.softplus(rho).add_(min_scale)


def inverse_softplus(x: float | torch.Tensor) -> float | torch.Tensor:
    r""":math:`\rho` with :math:`\mathrm{softplus}(\rho) = x`, stable for small :math:`x > 0`.

    A number is computed in double precision (the value every weight then starts from), a
    tensor in its own dtype.
    """
    if isinstance(x, torch.Tensor):
        return x + torch.log(-torch.expm1(-x))
    return x + math.log(-math.expm1(-x))


class InitScale:
    r"""Where a guide's initial standard deviations come from.

    A guide asks for :math:`\rho` with :math:`\mathrm{softplus}(\rho) + \sigma_{\min} =
    f\sigma` for every weight, :math:`f` the part of :math:`\sigma` its diagonal carries
    (1 for a mean-field guide; a low-rank guide puts the rest in its factor).
    """

    def scales(self, loc: torch.Tensor) -> torch.Tensor:
        r"""The initial :math:`\sigma` of every weight, ``loc``'s shape."""
        raise NotImplementedError

    def check(self, min_scale: float, fraction: float = 1.0) -> None:
        r"""Raise ``ValueError`` if some weight's :math:`f\sigma` could reach ``min_scale``."""
        raise NotImplementedError

    def rho(self, loc: torch.Tensor, min_scale: float, fraction: float = 1.0) -> torch.Tensor:
        r""":math:`\rho` of every weight, ``loc``'s shape (see the class's notes)."""
        return inverse_softplus(fraction * self.scales(loc) - min_scale)


class ConstantScale(InitScale):
    r"""The same initial :math:`\sigma` for every weight.

    Args:
        value: :math:`\sigma`, a positive number (weight units).

    Raises:
        ValueError: If ``value`` is not a positive finite number.
    """

    def __init__(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"init_scale must be a positive number, got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"init_scale must be a positive number, got {value!r}")
        self.value = float(value)

    def scales(self, loc: torch.Tensor) -> torch.Tensor:
        return torch.full_like(loc, self.value)

    def check(self, min_scale: float, fraction: float = 1.0) -> None:
        if fraction * self.value <= min_scale:
            raise ValueError(
                f"init_scale must exceed min_scale={min_scale:g}"
                + (f" / {fraction:.3g}" if fraction != 1.0 else "")
                + f", got {self.value!r}"
            )

    def rho(self, loc: torch.Tensor, min_scale: float, fraction: float = 1.0) -> torch.Tensor:
        r""":math:`\rho` of every weight, one number computed in double precision."""
        return torch.full_like(loc, inverse_softplus(fraction * self.value - min_scale))

    def __repr__(self) -> str:
        return f"ConstantScale({self.value:g})"


def as_init_scale(init_scale: float | InitScale) -> InitScale:
    """An :class:`InitScale` from a guide's ``init_scale`` argument (a number or one)."""
    return init_scale if isinstance(init_scale, InitScale) else ConstantScale(init_scale)
