"""The Bayesian layers: :class:`BayesianLayer`, their base, and :class:`BayesianAffine`.

This module holds what every layer whose parameters are Pyro sample sites shares (priors
built on the layer's device, initial values, site names: :class:`BayesianLayer`), the affine
layer with fast estimators (:class:`BayesianAffine`, one class for Linear and every ConvNd and
ConvTransposeNd), the versions of 4-D-only torch layers (pooling, 2-D normalisation) that
accept leading sample dims, :func:`initial_values`, which reads the layers' initial
weights, and :func:`fresh_initial_values`, which draws new ones for the affine layers. Any
other module is made Bayesian by :class:`~pyro_bbb.nn.module_layer.BayesianModule`; how
networks are converted is in :mod:`pyro_bbb.nn.builders`. Nothing here knows of guides or
training.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping

import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from torch import nn

from .._pyro_compat import cached_value, pyro_name, site_name
from ..priors import PriorSpec
from .affine import AffineMap, ConvMap, bayesian_affine

__all__ = [
    "BayesianAffine",
    "BayesianLayer",
    "freeze_parameter",
    "fresh_initial_values",
    "initial_values",
    "layers_that_run",
]


#: The attribute listing a module's frozen parameters (kept as buffers).
FROZEN = "_frozen_parameters"


def freeze_parameter(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Keep a frozen (``requires_grad=False``) parameter of ``module`` as a buffer.

    Pyro's param store makes every parameter it holds trainable, and a ``PyroModule`` puts
    its parameters there, so a parameter the user froze (a trained body under a Bayesian
    head) is held as a buffer of the same name: the forward reads it as before, it moves
    with ``.to()`` and stays in the ``state_dict``, and no optimiser sees it.
    """
    module._parameters.pop(name, None)
    module.register_buffer(name, value)
    frozen = module.__dict__.setdefault(FROZEN, [])
    if name not in frozen:
        frozen.append(name)


class _SitePrior:
    """The prior of one parameter of a layer, built on the layer's device when called.

    A class rather than a lambda so that Bayesian networks pickle (checkpoints, spawned
    MCMC workers).
    """

    def __init__(self, param: str) -> None:
        self.param = param

    def __call__(self, layer: BayesianLayer) -> dist.TorchDistribution:
        return layer.prior_distribution(self.param)


def _centred(distribution: dist.TorchDistribution, centre: torch.Tensor) -> dist.TorchDistribution:
    """``distribution`` shifted by ``centre`` (one event of its shape).

    A Gaussian stays a Gaussian (so its KL to a Gaussian guide stays analytic); any other
    prior is shifted by an affine transform.
    """
    base, event = distribution, 0
    while isinstance(base, torch.distributions.Independent):
        event += base.reinterpreted_batch_ndims
        base = base.base_dist
    if isinstance(base, torch.distributions.Normal):
        return dist.Normal(base.loc + centre, base.scale).to_event(event)
    shift = dist.transforms.AffineTransform(centre, 1.0, event_dim=centre.dim())
    return dist.TransformedDistribution(distribution, [shift])


class BayesianLayer(PyroModule):
    r"""Base of the layers whose parameters are Pyro sample sites.

    Each Bayesian parameter ``name`` is a :class:`~pyro.nn.PyroSample` whose prior is created
    on the layer's device (once per device and dtype for a ``cacheable`` prior), so
    ``.to(device)`` is all it takes to move it; the value the parameter had when the layer was
    made (its own initialisation or trained weights) is kept in the buffer ``<name>_init``,
    the default mean of a guide (:func:`initial_values`). A parameter without a prior stays a
    deterministic ``nn.Parameter`` (a point estimate). Site names are the layer's path and the
    parameter's name, ``"fc1.weight"``.

    Args:
        priors: Prior per Bayesian parameter name.
        centre_priors: Shift every prior by the parameter's initial value, so that a prior
            with mean 0 is centred on the (trained) weights the layer was made from; a prior
            carried from a guide (with an ``initial_loc``) is left as it is.
    """

    def __init__(self, priors: Mapping[str, PriorSpec], *, centre_priors: bool = False) -> None:
        super().__init__()
        self.priors = dict(priors)
        self.centre_priors = bool(centre_priors)
        self.fan_in: dict[str, int] = {}
        # Each depends on the layer's place in its network or on the prior's device, and is
        # kept with what it was computed for: (prior, device, dtype), the layer's Pyro name.
        self._prior_cache: dict[str, tuple] = {}
        self._site_name_cache: tuple[str | None, dict[str, str]] = (None, {})

    def _add_parameter(self, name: str, value: torch.Tensor | None, fan_in: int) -> None:
        """Make ``value`` the parameter ``name``: a sample site if it has a prior."""
        if value is None:
            setattr(self, name, None)
        elif name in self.priors:
            # The module's own initialisation: the default guide mean.
            self.register_buffer(f"{name}_init", value.detach().clone(), persistent=False)
            self.fan_in[name] = fan_in
            setattr(self, name, PyroSample(_SitePrior(name)))
        elif not value.requires_grad:
            freeze_parameter(self, name, value.detach().clone())
        else:
            setattr(self, name, nn.Parameter(value.detach().clone()))

    @property
    def bayesian_parameters(self) -> tuple[str, ...]:
        """Names of the parameters that are sample sites (``"weight"``, ``"bias"``, …)."""
        return tuple(self.priors)

    def prior_distribution(self, param: str) -> dist.TorchDistribution:
        """The prior of ``param`` on this layer's device; event shape = the parameter's.

        Built once per prior, device and dtype when the prior is ``cacheable`` (see
        :mod:`pyro_bbb.priors`), otherwise on every call. A prior tied to other sites (its
        ``joint_sites``, e.g. one site of a block from :func:`~pyro_bbb.priors.from_guide`)
        is given the values of those the model has drawn so far in this run, and returns the
        conditional distribution.
        """
        init = self._buffers[f"{param}_init"]
        prior = self.priors[param]
        fan_in = self.fan_in[param]
        joint = getattr(prior, "joint_sites", ())
        if joint:
            prefix = self._joint_prefix(param, prior.site)
            drawn = {s: v for s in joint if (v := cached_value(self, prefix + s)) is not None}
            return prior.site_distribution(
                init.shape, fan_in=fan_in, device=init.device, dtype=init.dtype, drawn=drawn
            )
        key = (prior, init.device, init.dtype)
        cache = self._prior_cache
        cached = cache.get(param)
        if cached is not None and cached[0] == key:
            return cached[1]
        distribution = prior.site_distribution(
            init.shape, fan_in=fan_in, device=init.device, dtype=init.dtype
        )
        if self.centre_priors and getattr(prior, "initial_loc", None) is None:
            distribution = _centred(distribution, init)  # a carried posterior has its own
        if getattr(prior, "cacheable", False):
            cache[param] = (key, distribution)
        return distribution

    def _joint_prefix(self, param: str, site: str) -> str:
        """The model's name prefix of a prior made for ``site`` (``"b."`` in a BNN named b).

        A joint prior names its sites as the network it was made for did; in a model with a
        name, the drawn values carry that name in front.
        """
        fullname = self._site_names()[param]
        if fullname == site:
            return ""
        if fullname.endswith("." + site):
            return fullname[: len(fullname) - len(site)]
        raise ValueError(
            f"site {fullname!r} has the prior of site {site!r} (a joint prior from "
            "from_guide): each site must keep the prior made for it"
        )

    def _site_names(self) -> dict[str, str]:
        """The full site name of every Bayesian parameter, cached.

        A name depends on where the layer sits in its network, so the cache is keyed by
        the layer's own Pyro name. (Every run of the layer reads them: where
        :func:`layers_that_run` is listening, the layer is noted here.)
        """
        if _LISTENING:
            _LISTENING[-1].append(self)
        prefix = pyro_name(self)
        cached = self._site_name_cache
        if cached[0] != prefix:
            cached = (prefix, {name: site_name(self, name) for name in self.priors})
            self._site_name_cache = cached
        return cached[1]

    def _value(self, param: str, names: dict[str, str]) -> torch.Tensor | None:
        """``getattr(self, param)``, read first from this run's draws when one was made.

        Inside a run of the network (its ``PyroModule`` context active) a ``PyroSample``
        returns the value the context holds for the site before it would issue a
        ``pyro.sample`` statement; this is that lookup, from the cached site name, without
        Pyro's attribute machinery (which builds the name again on every access). Anything
        else (no draw yet, a deterministic parameter, no run) goes through ``getattr``.
        """
        site = names.get(param)
        if site is not None:
            value = cached_value(self, site)  # None outside a run
            if value is not None:
                return value
        return getattr(self, param)

    def parameter_shape(self, name: str) -> torch.Size:
        """The shape of parameter ``name``, Bayesian or not."""
        if name in self.priors:
            return self._buffers[f"{name}_init"].shape
        return self._parameters[name].shape


class BayesianAffine(BayesianLayer):
    r"""A layer :math:`x \mapsto x \circledast W + b` whose weight and bias are Pyro sites.

    Built from an ``nn.Linear``, ``nn.Conv1d/2d/3d`` or ``nn.ConvTranspose1d/2d/3d`` by
    :func:`bayesianize` (or directly). It applies its weights through the effect
    :func:`~pyro_bbb.nn.affine.bayesian_affine`, so the fast estimators (local
    reparameterisation, flipout) apply to it; see :class:`BayesianLayer` for priors and
    initial values.

    Weights may carry leading sample dims (``(P, 1, out, in)`` under a particle plate), so
    ``Predictive(parallel=True)`` and vectorised ELBO particles work; see
    :mod:`pyro_bbb.nn.affine` for the shape rules.

    Args:
        affine: The map to apply (:class:`~pyro_bbb.nn.affine.LinearMap` or
            :class:`~pyro_bbb.nn.affine.ConvMap`).
        weight: Initial weight, ``(out, in)``, ``(out, in / groups, *kernel)`` or (transposed)
            ``(in, out / groups, *kernel)``.
        bias: Initial bias ``(out,)`` or ``None``.
        priors: Prior per parameter name (``"weight"``, ``"bias"``); a parameter missing
            from it stays a deterministic ``nn.Parameter``.
        centre_priors: See :class:`BayesianLayer`.
    """

    def __init__(
        self,
        affine: AffineMap,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        priors: Mapping[str, PriorSpec],
        *,
        centre_priors: bool = False,
    ) -> None:
        super().__init__(priors, centre_priors=centre_priors)
        self.affine = affine
        self._checked_shapes: tuple | None = None  # the last input shape that passed
        fan_in = int(weight[0].numel())  # torch's own convention, also for transposed convs
        self._add_parameter("weight", weight, fan_in)
        self._add_parameter("bias", bias, fan_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer.

        Args:
            x: Input ``(*sample, batch, *in_features)``.

        Returns:
            Pre-activation ``(*sample, batch, *out_features)``.
        """
        self._check_features(x)
        names = self._site_names()
        return bayesian_affine(
            x,
            self._value("weight", names),
            self._value("bias", names),
            affine=self.affine,
            weight_site=names.get("weight"),
            bias_site=names.get("bias"),
        )

    def _check_features(self, x: torch.Tensor) -> None:
        """Raise if ``x``'s trailing dims are not this layer's input features.

        The check depends only on the input's shape, the weight's and the map, so the last
        one that passed is remembered and the next call with the same (every step of a fit)
        is free; any other input is checked, and fails at the call that passes it.
        """
        key = (x.shape, self.parameter_shape("weight"), self.affine)
        if self._checked_shapes == key:
            return
        expected = self._expected_features()
        got = x.shape[x.dim() - len(expected) :]
        if len(got) != len(expected) or any(
            e is not None and e != g for e, g in zip(expected, got, strict=True)
        ):
            raise ValueError(
                f"{type(self).__name__} {pyro_name(self) or '(root)'!r} expects input "
                f"features {tuple(expected)} in its last {len(expected)} dim(s), got "
                f"{tuple(got)} there (an input of {x.dim()} dims, its batch first)"
            )
        self._checked_shapes = key

    def _expected_features(self) -> tuple[int | None, ...]:
        shape = self.parameter_shape("weight")
        if isinstance(self.affine, ConvMap):
            return (self.affine.in_channels(shape), *(None,) * self.affine.dims)
        return (shape[1],)

    def extra_repr(self) -> str:  # noqa: D102
        shape = tuple(self.parameter_shape("weight"))
        priors = ", ".join(f"{k}={v!r}" for k, v in self.priors.items())
        return f"{type(self.affine).__name__}, weight={shape}, {priors}"


#: The lists :func:`layers_that_run` is filling, innermost last.
_LISTENING: list[list[BayesianLayer]] = []


@contextlib.contextmanager
def layers_that_run() -> Iterator[list[BayesianLayer]]:
    """The Bayesian layers that run inside the block, in the order they first ran.

    A guide of a model function sees its sites but not the layers that draw them (a
    function has no ``modules()``): its first run of the model, under this block, finds
    them, so that their initial values (:func:`initial_values`) start its means.

    Yields:
        A list, filled as the block runs, each layer once.
    """
    seen: list[BayesianLayer] = []
    _LISTENING.append(seen)
    try:
        yield seen
    finally:
        _LISTENING.pop()
        unique = list(dict.fromkeys(seen))
        seen[:] = unique


def _layers_of(model: nn.Module | Iterable[nn.Module]) -> Iterable[nn.Module]:
    return model.modules() if isinstance(model, nn.Module) else model


def initial_values(model: nn.Module | Iterable[nn.Module]) -> dict[str, torch.Tensor]:
    """The initial value of every Bayesian parameter, by site name.

    These are the values the network had when it was made Bayesian (its own initialisation
    or pretrained weights), used as default guide means; for a site whose prior is a carried
    posterior (:func:`~pyro_bbb.priors.from_guide`), the posterior mean instead.

    Args:
        model: A network from :func:`bayesianize`/:func:`mlp`, or a model containing one; or
            the Bayesian layers themselves (those a model function ran,
            :func:`layers_that_run`).

    Returns:
        ``{site name: tensor of the parameter's shape}``, on the model's device.
    """
    values = {}
    for module in _layers_of(model):
        if isinstance(module, BayesianLayer):
            for param in module.bayesian_parameters:
                site = site_name(module, param)
                init = getattr(module, f"{param}_init")
                carried = getattr(module.priors[param], "initial_loc", None)
                if isinstance(carried, torch.Tensor) and carried.shape == init.shape:
                    init = carried.to(device=init.device, dtype=init.dtype)
                values[site] = init
    return values


def fresh_initial_values(model: nn.Module | Iterable[nn.Module]) -> dict[str, torch.Tensor]:
    r"""A new draw of torch's default initialisation of every Bayesian affine layer's parameters.

    ``nn.Linear`` and every ``ConvNd``/``ConvTransposeNd`` start their weight and bias from
    :math:`\mathcal{U}(-1/\sqrt{\text{fan\_in}}, 1/\sqrt{\text{fan\_in}})` (Kaiming-uniform
    with :math:`a = \sqrt 5` for the weight); this draws that again, from torch's global
    random state, for the parameters of every :class:`BayesianAffine`. Independently
    initialised members of an ensemble start here (Lakshminarayanan et al. 2017). Other
    Bayesian layers (a :class:`~pyro_bbb.nn.module_layer.BayesianModule`: a LayerNorm's scale
    starts at 1, not at a random draw) are left out: their members start from
    :func:`initial_values`.

    Args:
        model: A network from :func:`bayesianize`/:func:`mlp`, or a model containing one; or
            the Bayesian layers themselves.

    Returns:
        ``{site name: tensor of the parameter's shape}``, on the parameter's device and dtype.
    """
    values = {}
    for module in _layers_of(model):
        if isinstance(module, BayesianAffine):
            for param in module.bayesian_parameters:
                bound = 1.0 / module.fan_in[param] ** 0.5
                site = site_name(module, param)
                init = getattr(module, f"{param}_init")
                values[site] = torch.empty_like(init).uniform_(-bound, bound)
    return values
