"""Turning networks into Pyro models of their weights: :func:`bayesianize` and :func:`mlp`.

Every chosen parameter of a network becomes a :class:`~pyro.nn.PyroSample` site named after
its place in it (``"fc1.weight"``, ``"0.bias"``): each ``nn.Linear`` and ``nn.Conv2d`` is
replaced by a :class:`~pyro_bbb.nn.layers.BayesianAffine` with priors picked per site by
name pattern. Nothing here knows of guides or training.
"""

from __future__ import annotations

import copy
import fnmatch
import itertools
from collections.abc import Callable, Iterable, Sequence

import torch
from pyro.nn import PyroModule
from pyro.nn.module import to_pyro_module_
from torch import nn

from ..priors import Gaussian, PriorSpec, resolve_prior
from .affine import AffineMap, Conv2dMap, LinearMap
from .layers import BayesianAffine, fold_sample_dims

__all__ = ["bayesianize", "mlp"]


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
    fold_sample_dims(net)
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
            _check_carried_shape(priors[pname], site, value.shape)
    return BayesianAffine(affine, layer.weight, layer.bias, priors)


def _check_carried_shape(prior: object, site: str, shape: torch.Size) -> None:
    """A carried posterior (``from_guide``) must have the parameter's shape: say so now."""
    carried = getattr(prior, "initial_loc", None)
    if isinstance(carried, torch.Tensor) and carried.shape != shape:
        raise ValueError(
            f"site {site!r} has shape {tuple(carried.shape)} in the guide its prior was made "
            f"from (from_guide) but {tuple(shape)} in this network"
        )


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
