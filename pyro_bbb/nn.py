"""Bayesian layers, :func:`bayesianize` and the :func:`mlp` builder.

This module turns networks into Pyro models of their weights: every chosen parameter becomes
a :class:`~pyro.nn.PyroSample` site named after its place in the network (``"fc1.weight"``,
``"0.bias"``). One layer class, :class:`BayesianAffine`, serves Linear and Conv2d alike; it
applies its weights through :func:`~pyro_bbb.ops.bayesian_affine`, the effect that estimators
such as local reparameterisation intercept. Nothing here knows of guides or training.
"""

from __future__ import annotations

import copy
import fnmatch
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence

import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from pyro.nn.module import to_pyro_module_
from torch import nn

from .ops import AffineMap, Conv2dMap, LinearMap, bayesian_affine
from .priors import Gaussian, PriorSpec, resolve_prior

__all__ = ["BayesianAffine", "bayesianize", "initial_values", "mlp"]


class _SitePrior:
    """The prior of one parameter of a layer, built on the layer's device when called.

    A class rather than a lambda so that Bayesian networks pickle (checkpoints, spawned
    MCMC workers).
    """

    def __init__(self, param: str) -> None:
        self.param = param

    def __call__(self, layer: BayesianAffine) -> dist.TorchDistribution:
        return layer.prior_distribution(self.param)


class BayesianAffine(PyroModule):
    r"""A layer :math:`x \mapsto x \circledast W + b` whose weight and bias are Pyro sites.

    Built from an ``nn.Linear`` or ``nn.Conv2d`` by :func:`bayesianize` (or directly), it
    keeps that layer's initial values as the default means of a guide
    (:func:`initial_values`). Each Bayesian parameter is a
    :class:`~pyro.nn.PyroSample` whose prior is created on the device of the layer (once
    per device and dtype for a ``cacheable`` prior), so ``.to(device)`` is all it takes to
    move it.

    Weights may carry leading sample dims (``(P, 1, out, in)`` under a particle plate), so
    ``Predictive(parallel=True)`` and vectorised ELBO particles work; see
    :mod:`pyro_bbb.ops` for the shape rules.

    Args:
        affine: The map to apply (:class:`~pyro_bbb.ops.LinearMap` or
            :class:`~pyro_bbb.ops.Conv2dMap`).
        weight: Initial weight, ``(out, in)`` or ``(out, in / groups, kh, kw)``.
        bias: Initial bias ``(out,)`` or ``None``.
        priors: Prior per parameter name (``"weight"``, ``"bias"``); a parameter missing
            from it stays a deterministic ``nn.Parameter``.
    """

    def __init__(
        self,
        affine: AffineMap,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        priors: Mapping[str, PriorSpec],
    ) -> None:
        super().__init__()
        self.affine = affine
        self.priors = dict(priors)
        self.fan_in = int(weight[0].numel())
        for name, value in (("weight", weight), ("bias", bias)):
            if value is None:
                setattr(self, name, None)
            elif name in self.priors:
                # The module's own initialisation: the default guide mean.
                self.register_buffer(f"{name}_init", value.detach().clone(), persistent=False)
                setattr(self, name, PyroSample(_SitePrior(name)))
            else:
                setattr(self, name, nn.Parameter(value.detach().clone()))

    @property
    def bayesian_parameters(self) -> tuple[str, ...]:
        """Names of the parameters that are sample sites (``"weight"``, ``"bias"``)."""
        return tuple(self.priors)

    def prior_distribution(self, param: str) -> dist.TorchDistribution:
        """The prior of ``param`` on this layer's device; event shape = the parameter's.

        Built once per prior, device and dtype when the prior is ``cacheable`` (see
        :mod:`pyro_bbb.priors`), otherwise on every call.
        """
        init = self._buffers[f"{param}_init"]
        prior = self.priors[param]
        key = (prior, init.device, init.dtype)
        cache = self.__dict__.setdefault("_prior_cache", {})
        cached = cache.get(param)
        if cached is not None and cached[0] == key:
            return cached[1]
        distribution = prior.site_distribution(
            init.shape, fan_in=self.fan_in, device=init.device, dtype=init.dtype
        )
        if getattr(prior, "cacheable", False):
            cache[param] = (key, distribution)
        return distribution

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layer.

        Args:
            x: Input ``(*sample, batch, *in_features)``.

        Returns:
            Pre-activation ``(*sample, batch, *out_features)``.
        """
        self._check_features(x)
        weight_site, bias_site = self._site_names()
        return bayesian_affine(
            x,
            self.weight,
            self.bias,
            affine=self.affine,
            weight_site=weight_site,
            bias_site=bias_site,
        )

    def _check_features(self, x: torch.Tensor) -> None:
        expected = self._expected_features()
        got = x.shape[x.dim() - len(expected) :]
        if len(got) != len(expected) or any(
            e is not None and e != g for e, g in zip(expected, got, strict=True)
        ):
            raise ValueError(
                f"{type(self).__name__} {self._pyro_name or '(root)'!r} expects input "
                f"features {tuple(expected)} in its last dims, got x of shape {tuple(x.shape)}"
            )

    def _site_names(self) -> tuple[str | None, str | None]:
        """The full site names of weight and bias (``None`` if deterministic), cached.

        A name depends on where the layer sits in its network, so the cache is keyed by
        the layer's own Pyro name.
        """
        prefix = self.__dict__.get("_pyro_name")
        cached = self.__dict__.get("_site_name_cache")
        if cached is None or cached[0] != prefix:
            names = tuple(
                self._pyro_get_fullname(name) if name in self.priors else None
                for name in ("weight", "bias")
            )
            cached = (prefix, names)
            self.__dict__["_site_name_cache"] = cached
        return cached[1]

    def _expected_features(self) -> tuple[int | None, ...]:
        shape = self._parameter_shape("weight")
        if isinstance(self.affine, Conv2dMap):
            return (shape[1] * self.affine.groups, None, None)
        return (shape[1],)

    def _parameter_shape(self, name: str) -> torch.Size:
        if name in self.priors:
            return getattr(self, f"{name}_init").shape
        return self._parameters[name].shape

    def extra_repr(self) -> str:  # noqa: D102
        shape = tuple(self._parameter_shape("weight"))
        priors = ", ".join(f"{k}={v!r}" for k, v in self.priors.items())
        return f"{type(self.affine).__name__}, weight={shape}, {priors}"


def _affine_of(module: nn.Module) -> AffineMap | None:
    if isinstance(module, nn.Linear):
        return LinearMap()
    if isinstance(module, nn.Conv2d):
        if module.padding_mode != "zeros":
            raise ValueError(
                f"bayesianize supports Conv2d with padding_mode='zeros', got "
                f"{module.padding_mode!r}"
            )
        return Conv2dMap(
            stride=tuple(module.stride),
            padding=module.padding if isinstance(module.padding, str) else tuple(module.padding),
            dilation=tuple(module.dilation),
            groups=module.groups,
        )
    return None


def _folding_forward(base: type[nn.Module]) -> Callable:
    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        lead = x.shape[:-3]
        out = base.forward(self, x.reshape(-1, *x.shape[-3:]), *args, **kwargs)
        return out.reshape(*lead, *out.shape[1:])

    forward.__doc__ = f"{base.__name__}.forward over inputs with leading sample dims."
    return forward


#: Layers that accept only ``(batch, channels, height, width)``, and their versions that fold
#: leading sample dims into the batch. Module-level classes, so the networks pickle.
_SAMPLE_FOLDING: dict[type[nn.Module], type[nn.Module]] = {}
for _base in (
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveAvgPool2d,
    nn.LPPool2d,
    nn.BatchNorm2d,
    nn.InstanceNorm2d,
    nn.Dropout2d,
):
    _name = f"SampleFolding{_base.__name__}"
    _SAMPLE_FOLDING[_base] = globals()[_name] = type(
        _name,
        (_base,),
        {
            "forward": _folding_forward(_base),
            "__module__": __name__,
            "__doc__": f"``{_base.__name__}`` for inputs ``(*sample, batch, C, H, W)``.",
        },
    )


def _fold_sample_dims(module: nn.Module) -> None:
    """Let 4-D-only layers take inputs with sample dims, by class swap (names unchanged)."""
    for child in module.modules():
        folding = _SAMPLE_FOLDING.get(type(child))
        if folding is not None:
            child.__class__ = folding


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def bayesianize(
    module: nn.Module,
    prior: PriorSpec | None = None,
    *,
    deterministic: Sequence[str] = (),
    inplace: bool = False,
) -> PyroModule:
    """Turn the Linear and Conv2d parameters of any network into Pyro sample sites.

    Every ``nn.Linear`` and ``nn.Conv2d`` becomes a :class:`BayesianAffine` whose weight and
    bias are sites named by their path in the network (``"fc1.weight"``, ``"0.bias"``).
    Every other module becomes a :class:`~pyro.nn.PyroModule` with its parameters left
    deterministic (normalisation layers, embeddings): they are learned as point estimates.
    Layers that accept only 4-D inputs (2-D pooling, ``BatchNorm2d``, ``InstanceNorm2d``,
    ``Dropout2d``) are given a forward that folds the weights' sample dims into the batch,
    so vectorised particles and predictions work through them. A reshape of your own (e.g.
    ``nn.Flatten``) must count feature dims from the end: ``nn.Flatten(-3)``.

    Args:
        module: The network. It is copied unless ``inplace``, so a pretrained network
            stays available, e.g. as ``MeanFieldGuide(..., init_loc=module)``.
        prior: One prior for every site, or a mapping from ``fnmatch`` patterns over site
            names to priors (``{"*.bias": Gaussian(10.0), "*": ScaleMixture(...)}``); first
            match wins. Defaults to ``Gaussian(1.0)``.
        deterministic: Patterns of site names to keep deterministic although they belong to
            a Linear or Conv2d (e.g. ``["out.bias"]``).
        inplace: Convert ``module`` itself instead of a copy.

    Returns:
        The Bayesian network, a ``PyroModule``; ``net(x)`` draws weights from the prior.

    Raises:
        ValueError: If a prior is invalid, no pattern matches a site, or ``deterministic``
            leaves no parameter Bayesian.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    prior = Gaussian(1.0) if prior is None else prior
    if isinstance(deterministic, str):
        deterministic = [deterministic]
    net = module if inplace else copy.deepcopy(module)
    num_sites = _replace_affine_layers(net, "", prior, tuple(deterministic))
    if isinstance(net, (nn.Linear, nn.Conv2d)):
        net = _bayesian_layer(net, "", prior, tuple(deterministic))
        num_sites = len(net.priors)
    if num_sites == 0:
        raise ValueError(
            "bayesianize found no Linear or Conv2d parameter to make Bayesian "
            f"(deterministic={list(deterministic)!r})"
        )
    _fold_sample_dims(net)
    to_pyro_module_(net)
    return net


def _bayesian_layer(
    layer: nn.Module, path: str, prior: PriorSpec, deterministic: tuple[str, ...]
) -> BayesianAffine:
    affine = _affine_of(layer)
    assert affine is not None
    priors = {}
    for pname, value in layer.named_parameters(recurse=False):
        site = f"{path}.{pname}" if path else pname
        if value is not None and not _matches(site, deterministic):
            priors[pname] = resolve_prior(prior, site)
    return BayesianAffine(affine, layer.weight, layer.bias, priors)


def _replace_affine_layers(
    parent: nn.Module, prefix: str, prior: PriorSpec, deterministic: tuple[str, ...]
) -> int:
    count = 0
    for child_name, child in list(parent.named_children()):
        path = f"{prefix}.{child_name}" if prefix else child_name
        if _affine_of(child) is not None:
            layer = _bayesian_layer(child, path, prior, deterministic)
            setattr(parent, child_name, layer)
            count += len(layer.priors)
        else:
            count += _replace_affine_layers(child, path, prior, deterministic)
    return count


_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
    "softplus": nn.Softplus,
}


def mlp(
    sizes: Sequence[int],
    activation: str | Callable[[], nn.Module] = "relu",
    prior: PriorSpec | None = None,
    *,
    deterministic: Sequence[str] = (),
    dropout: float = 0.0,
) -> PyroModule:
    """Build a Bayesian multi-layer perceptron in one call.

    ``mlp([1, 50, 50, 1])`` is ``bayesianize(nn.Sequential(Linear(1, 50), ReLU(),
    Linear(50, 50), ReLU(), Linear(50, 1)))``; its sites are ``"0.weight"``, ``"0.bias"``,
    ``"2.weight"``, … (the Sequential's indices).

    With ``dropout=p > 0`` an ``nn.Dropout(p)`` follows every activation, so the sites of
    ``mlp([1, 50, 1], dropout=0.1)`` are ``"0.*"`` and ``"3.*"``. Dropout is active while the
    network is in training mode (the default, also during :func:`~pyro_bbb.predict`), which is
    MC dropout (Gal and Ghahramani 2016, https://arxiv.org/abs/1506.02142): each weight sample
    of a prediction also draws its own dropout masks. Call ``net.eval()`` to switch it off.

    Args:
        sizes: Layer widths from input to output, at least two; e.g. ``[in, hidden, out]``.
        activation: A name (``"relu"``, ``"tanh"``, ``"sigmoid"``, ``"gelu"``, ``"silu"``,
            ``"elu"``, ``"leaky_relu"``, ``"softplus"``) or a module factory, applied after
            every layer but the last.
        prior: As in :func:`bayesianize`; defaults to ``Gaussian(1.0)``.
        deterministic: As in :func:`bayesianize`.
        dropout: Probability in ``[0, 1)`` of zeroing each hidden unit after each activation;
            0 (the default) adds no dropout layer.

    Returns:
        The Bayesian network mapping ``(*sample, batch, sizes[0])`` to
        ``(*sample, batch, sizes[-1])``.

    Raises:
        ValueError: On fewer than two sizes, a non-positive size, an unknown activation or a
            dropout probability outside ``[0, 1)``.
    """
    sizes = list(sizes)
    if len(sizes) < 2 or any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"sizes must be at least two positive ints, got {sizes!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"dropout must be a probability in [0, 1), got {dropout!r}")
    if isinstance(activation, str):
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)} or a module factory, "
                f"got {activation!r}"
            )
        activation = _ACTIVATIONS[activation]
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(activation())
            if dropout > 0:
                layers.append(nn.Dropout(float(dropout)))
    return bayesianize(nn.Sequential(*layers), prior, deterministic=deterministic, inplace=True)


def initial_values(model: nn.Module) -> dict[str, torch.Tensor]:
    """The initial value of every Bayesian parameter, by site name.

    These are the values the network had when it was made Bayesian (its own initialisation
    or pretrained weights), used as default guide means.

    Args:
        model: A network from :func:`bayesianize`/:func:`mlp`, or a model containing one.

    Returns:
        ``{site name: tensor of the parameter's shape}``, on the model's device.
    """
    values = {}
    for module in model.modules():
        if isinstance(module, BayesianAffine):
            for param in module.bayesian_parameters:
                site = f"{module._pyro_name}.{param}" if module._pyro_name else param
                values[site] = getattr(module, f"{param}_init")
    return values
