"""Turning networks into Pyro models of their weights: :func:`bayesianize` and :func:`mlp`.

Every chosen parameter of a network becomes a :class:`~pyro.nn.PyroSample` site named after
its place in it (``"fc1.weight"``, ``"0.bias"``, ``"rnn.weight_ih_l0"``), with its prior picked
by name pattern. ``nn.Linear`` and every ``nn.ConvNd`` / ``nn.ConvTransposeNd`` become a
:class:`~pyro_bbb.nn.layers.BayesianAffine` (the fast estimators apply to them); any other
module with a chosen parameter is wrapped in a :class:`~pyro_bbb.nn.module_layer.BayesianModule`
(weight sampling). Nothing here knows of guides or training.
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

from .._pyro_compat import conv_kinds
from ..priors import Gaussian, PriorSpec, resolve_prior
from .affine import AffineMap, ConvMap, LinearMap
from .draws import PerDrawForward, broadcasts_draws
from .layers import BayesianAffine, BayesianLayer, freeze_parameter
from .module_layer import BayesianModule

__all__ = ["bayesianize", "mlp"]

_CONV_CLASSES = (
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
)  # fmt: skip


def _affine_of(module: nn.Module) -> AffineMap | None:
    """The affine map of a Linear or ConvNd/ConvTransposeNd that runs torch's own forward.

    ``None`` for anything else: a subclass with its own forward, a convolution padded other
    than with zeros. Those are made Bayesian by weight sampling.
    """
    cls = type(module)
    if isinstance(module, nn.Linear) and cls.forward is nn.Linear.forward:
        return LinearMap()
    base = next((c for c in _CONV_CLASSES if isinstance(module, c)), None)
    conv, transposed = conv_kinds(module)
    if base is None or cls.forward is not base.forward or not conv:
        return None
    if module.padding_mode != "zeros":
        return None
    return ConvMap(
        dims=len(module.kernel_size),
        stride=tuple(module.stride),
        padding=module.padding if isinstance(module.padding, str) else tuple(module.padding),
        dilation=tuple(module.dilation),
        groups=module.groups,
        transposed=transposed,
        output_padding=tuple(module.output_padding) if transposed else (),
    )


def _matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether a parameter's name matches a pattern, or lies in the module a pattern names."""
    return any(
        fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, f"{p}.*") for p in patterns
    )


def _patterns(name: str, value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    if not all(isinstance(p, str) for p in value):
        raise TypeError(f"{name} must be a pattern or a sequence of patterns, got {value!r}")
    return tuple(value)


def bayesianize(
    module: nn.Module,
    prior: PriorSpec | None = None,
    *,
    only: str | Sequence[str] | None = None,
    deterministic: str | Sequence[str] = (),
    centre_priors: bool = False,
    inplace: bool = False,
) -> PyroModule:
    """Put a prior on every parameter of any network, or on those you choose.

    Every parameter becomes a Pyro sample site named by its path in the network
    (``"fc1.weight"``, ``"0.bias"``, ``"rnn.weight_ih_l0"``), unless ``only`` or
    ``deterministic`` keep it a point estimate. ``nn.Linear``, ``nn.Conv1d/2d/3d`` and
    ``nn.ConvTranspose1d/2d/3d`` become a :class:`BayesianAffine`, whose pre-activations the
    fast estimators (``reparam="local"`` or ``"flipout"``) can sample; any other module with a
    Bayesian parameter (an LSTM, a LayerNorm, an Embedding, a module of your own, a
    convolution padded other than with zeros) is wrapped in a
    :class:`~pyro_bbb.nn.module_layer.BayesianModule`, which draws the parameters and runs the
    module on them (weight sampling). Parameters kept deterministic are learned as point
    estimates; :func:`~pyro_bbb.nn.network_summary.summary` lists every parameter and what it
    became.
    A parameter frozen with ``requires_grad=False`` and kept deterministic stays frozen (it is
    held as a buffer of the same name, out of Pyro's param store).
    The network's ``forward`` runs unchanged and always sees the shapes it was written for
    (``torch.flatten(x, 1)``, ``out[:, -1]``, ``nn.LSTM``, ``BatchNorm``): when a
    :class:`~pyro_bbb.BNN` draws several weight sets at once (particles, ``predict``, an
    ensemble) it runs the network once per draw, vectorised by ``torch.func.vmap`` where it
    can (see :mod:`pyro_bbb.nn.draws`).

    For a last-layer (or any subnetwork) BNN on a trained body, name the layers:
    ``bayesianize(trained, only="head.*")``.

    Args:
        module: The network. It is copied unless ``inplace``, so a pretrained network
            stays available, e.g. as ``MeanFieldGuide(..., init_loc=module)``.
        prior: One prior for every site, or a mapping from ``fnmatch`` patterns over site
            names to priors (``{"*.bias": Gaussian(10.0), "*": ScaleMixture(...)}``); first
            match wins. Defaults to ``Gaussian(1.0)``.
        only: Patterns of the site names to make Bayesian (e.g. ``"fc2.*"``), or modules by
            name (``"fc2"``: every parameter in it); ``None`` (the default) for every
            parameter. Each pattern must match a parameter.
        deterministic: Patterns of site names, or modules by name, to keep deterministic
            (e.g. ``["*.bias"]``), applied after ``only``.
        centre_priors: Centre every prior on the parameter's current value (a trained
            network's weights) instead of on the prior's own mean: the empirical-Bayes prior
            of MOPED (Krishnan et al. 2020, "Specifying weight priors in Bayesian deep neural
            networks with empirical Bayes"). A Gaussian stays a Gaussian. A prior carried from
            a guide (``from_guide``) is left as it is: it is centred on that posterior.
        inplace: Convert ``module`` itself instead of a copy.

    Returns:
        The Bayesian network, a ``PyroModule``; ``net(x)`` draws weights from the prior.

    Raises:
        ValueError: If a prior is invalid, no pattern matches a site, a pattern of ``only``
            matches no parameter, or no parameter is left Bayesian.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    prior = Gaussian(1.0) if prior is None else prior
    selection = _Selection(
        prior, _patterns("only", only), _patterns("deterministic", deterministic), centre_priors
    )
    if selection.only is not None:
        names = [name for name, _ in module.named_parameters()]
        unmatched = [p for p in selection.only if not any(_matches(n, [p]) for n in names)]
        if unmatched:
            raise ValueError(
                f"only: pattern(s) {unmatched} match no parameter; the parameters are {names}"
            )
    net = module if inplace else copy.deepcopy(module)
    net = selection.convert(net, "")
    if selection.num_sites == 0:
        already = any(isinstance(m, BayesianLayer) for m in module.modules())
        raise ValueError(
            "bayesianize found no parameter to make Bayesian "
            f"(only={only!r}, deterministic={list(selection.deterministic)!r})"
            + (
                "; the network's layers are Bayesian already (as mlp's are): use it as it is"
                if already
                else ""
            )
        )
    _to_pyro_modules(net)
    if not broadcasts_draws(net):  # several weight draws go around its forward, not through
        net.forward = PerDrawForward(net)
    return net


class _Selection:
    """Which parameters become Bayesian, with which prior; converts a network bottom-up."""

    def __init__(
        self,
        prior: PriorSpec,
        only: tuple[str, ...] | None,
        deterministic: tuple[str, ...],
        centre_priors: bool,
    ) -> None:
        self.prior, self.only, self.deterministic = prior, only, deterministic
        self.centre_priors = centre_priors
        self.num_sites = 0

    def priors(self, module: nn.Module, path: str) -> dict[str, PriorSpec]:
        """The prior of every chosen direct parameter of ``module`` at ``path``."""
        priors = {}
        for name, value in module.named_parameters(recurse=False):
            site = f"{path}.{name}" if path else name
            if self.only is not None and not _matches(site, self.only):
                continue
            if _matches(site, self.deterministic) or not torch.is_floating_point(value):
                continue
            priors[name] = resolve_prior(self.prior, site)
            _check_carried_shape(priors[name], site, value.shape)
        return priors

    def convert(self, module: nn.Module, path: str) -> nn.Module:
        """``module`` with its chosen parameters made Bayesian (children first)."""
        for name, child in list(module.named_children()):
            converted = self.convert(child, f"{path}.{name}" if path else name)
            if converted is not child:
                setattr(module, name, converted)
        priors = self.priors(module, path)
        if not priors:
            for name, value in list(module.named_parameters(recurse=False)):
                if not value.requires_grad:
                    freeze_parameter(module, name, value.detach())
            return module
        self.num_sites += len(priors)
        affine = _affine_of(module)
        if affine is not None:
            return BayesianAffine(
                affine, module.weight, module.bias, priors, centre_priors=self.centre_priors
            )
        return BayesianModule(module, priors, centre_priors=self.centre_priors)


def _to_pyro_modules(module: nn.Module) -> None:
    """Make every module a ``PyroModule``, but a childless module run by a BayesianModule.

    That one holds no parameter any more and runs under ``functional_call``; it keeps its own
    class, which matters to modules that cache their weights (``nn.LSTM``).
    """
    for child in module.children():
        if isinstance(module, BayesianModule) and next(child.children(), None) is None:
            continue
        _to_pyro_modules(child)
    # Children first: the parent's conversion re-registers its children, and a Sequential
    # keeps its order only if all of them are PyroModules by then.
    to_pyro_module_(module, recurse=False)
    if isinstance(module, BayesianModule):  # its wrapped module shares its name and context
        module.share_name()


def _check_carried_shape(prior: object, site: str, shape: torch.Size) -> None:
    """A carried posterior (``from_guide``) must have the parameter's shape: say so now."""
    carried = getattr(prior, "initial_loc", None)
    if isinstance(carried, torch.Tensor) and carried.shape != shape:
        raise ValueError(
            f"site {site!r} has shape {tuple(carried.shape)} in the guide its prior was made "
            f"from (from_guide) but {tuple(shape)} in this network"
        )


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
