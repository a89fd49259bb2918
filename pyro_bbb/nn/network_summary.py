"""What every parameter of a network became: :func:`summary`.

This module holds :func:`summary`, which lists every parameter of a Bayesian network (or a
model holding one) with whether it is a sample site or a point estimate, its shape, prior,
gradient estimator and size, so that nothing stays deterministic unseen. It reads the
network; it changes nothing and knows nothing of guides or training.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .._pyro_compat import join_name, pyro_name, site_name, user_class
from .affine import ConvMap
from .draws import describe_draws
from .layers import FROZEN, BayesianAffine, BayesianLayer

__all__ = ["NetworkSummary", "ParameterSummary", "summary"]

#: What the estimator column says of a parameter drawn whole (no estimator intercepts it).
WEIGHT_SAMPLING = "weight sampling"


@dataclass(frozen=True)
class ParameterSummary:
    """One parameter of a network.

    Attributes:
        name: Its site or parameter name, ``"fc1.weight"``.
        layer: The path of the module holding it, ``"fc1"`` (``""`` for the root).
        module_type: The class name of that module (the wrapped one's for a Bayesian layer).
        bayesian: Whether it is a sample site (``False``: a point estimate).
        shape: Its shape.
        prior: The prior's ``repr`` (``""`` for a point estimate).
        estimator: ``"local"``, ``"flipout"`` or ``"weight sampling"`` for a site;
            ``"point estimate"`` otherwise.
        trainable: ``False`` for a point estimate with ``requires_grad=False`` (frozen).
    """

    name: str
    layer: str
    module_type: str
    bayesian: bool
    shape: tuple[int, ...]
    prior: str
    estimator: str
    trainable: bool = True

    @property
    def count(self) -> int:
        """Number of scalars."""
        return int(torch.Size(self.shape).numel())


@dataclass(frozen=True)
class NetworkSummary:
    """Every parameter of a network; ``str()`` gives a Markdown table with totals.

    Attributes:
        parameters: One row per parameter.
        draws: How several weight draws at once reach the network
            (:func:`~pyro_bbb.nn.draws.describe_draws`).
    """

    parameters: tuple[ParameterSummary, ...]
    draws: str = ""

    @property
    def bayesian(self) -> tuple[ParameterSummary, ...]:
        """The sample sites."""
        return tuple(p for p in self.parameters if p.bayesian)

    @property
    def deterministic(self) -> tuple[ParameterSummary, ...]:
        """The point estimates."""
        return tuple(p for p in self.parameters if not p.bayesian)

    def estimators(self) -> dict[str, str]:
        """``{layer path: estimator}`` of every layer with a sample site."""
        return {p.layer: p.estimator for p in self.bayesian}

    def __str__(self) -> str:
        lines = [
            "| parameter | module | kind | shape | prior | estimator | count |",
            "| --- | --- | --- | --- | --- | --- | ---: |",
        ]
        for p in self.parameters:
            kind = "Bayesian" if p.bayesian else "point estimate"
            kind += "" if p.trainable else " (frozen)"
            shape = "×".join(map(str, p.shape)) or "scalar"
            lines.append(
                f"| {p.name} | {p.module_type} | {kind} | {shape} | {p.prior or '-'} | "
                f"{p.estimator if p.bayesian else '-'} | {p.count:,} |"
            )
        b = sum(p.count for p in self.bayesian)
        d = sum(p.count for p in self.deterministic)
        lines.append("")
        lines.append(
            f"Bayesian: {b:,} scalars in {len(self.bayesian)} sites; point estimates: {d:,} "
            f"scalars in {len(self.deterministic)} tensors"
        )
        if self.draws:
            lines.append(f"Several weight draws at once go {self.draws}")
        return "\n".join(lines)


def _type_name(module: nn.Module) -> str:
    wrapped = getattr(module, "wrapped_type", None)
    if wrapped is not None:
        return wrapped.__name__
    if isinstance(module, BayesianAffine):
        affine = module.affine
        if isinstance(affine, ConvMap):
            return f"Conv{'Transpose' if affine.transposed else ''}{affine.dims}d"
        return "Linear"
    return user_class(module).__name__


def _point_estimate(name: str, path: str, kind: str, value: torch.Tensor) -> ParameterSummary:
    shape = tuple(value.shape)
    return ParameterSummary(
        name, path, kind, False, shape, "", "point estimate", value.requires_grad
    )


def _rows(module: nn.Module, path: str, reparam: str | None) -> Iterator[ParameterSummary]:
    kind = _type_name(module)
    if isinstance(module, BayesianLayer):
        names = getattr(module, "parameter_names", ("weight", "bias"))
        fast = isinstance(module, BayesianAffine) and reparam is not None
        for name in names:
            if name in module.priors:
                prior = repr(module.priors[name])
                if module.centre_priors:
                    prior += " centred on the initial value"
                estimator = reparam if fast else WEIGHT_SAMPLING
                shape = tuple(module.parameter_shape(name))
                site = site_name(module, name)
                yield ParameterSummary(site, path, kind, True, shape, prior, estimator)
            elif module._parameters.get(name) is not None:
                yield _point_estimate(join_name(path, name), path, kind, module._parameters[name])
            elif name in module.__dict__.get(FROZEN, ()):
                yield _point_estimate(join_name(path, name), path, kind, module._buffers[name])
    else:
        for name, value in module.named_parameters(recurse=False):
            yield _point_estimate(join_name(path, name), path, kind, value)
        for name in module.__dict__.get(FROZEN, ()):
            yield _point_estimate(join_name(path, name), path, kind, module._buffers[name])
    unnamed = getattr(module, "unnamed_children", ())
    for name, child in module.named_children():
        yield from _rows(child, path if name in unnamed else join_name(path, name), reparam)


def summary(model: nn.Module, *, reparam: str | None = None) -> NetworkSummary:
    """Every parameter of a Bayesian network or model: site or point estimate, and how.

    ``print(summary(model))`` prints a table with one row per parameter (its site or
    parameter name, the layer type, Bayesian or point estimate, shape, prior, estimator and
    number of scalars), the totals, and how several weight draws at once reach the network
    (through its layers, or around it once per draw; see :mod:`pyro_bbb.nn.draws`). Names
    are the site names the guide uses (a :class:`~pyro_bbb.BNN` roots them at its own name,
    without ``"net."``).

    Args:
        model: A network from :func:`~pyro_bbb.nn.bayesianize` or :func:`~pyro_bbb.nn.mlp`,
            or a :class:`~pyro_bbb.BNN`.
        reparam: The estimator training would use (``None``, ``"local"``, ``"flipout"``):
            affine layers (Linear, ConvNd, ConvTransposeNd) are given it, every other
            Bayesian layer is drawn by weight sampling.

    Returns:
        A :class:`NetworkSummary`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    rows = tuple(_rows(model, pyro_name(model), reparam))
    net = (
        model._modules.get("net", model)
        if "net" in getattr(model, "unnamed_children", ())
        else model
    )
    return NetworkSummary(rows, describe_draws(net))
