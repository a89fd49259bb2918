"""A Bayesian network's forward pass as a pure JAX function of its weights.

:func:`export_network` traces the network once with :mod:`torch.fx` (Bayesian layers and
the known ``torch.nn`` modules are leaves of the trace), and maps every node of the graph to
a JAX function: the Bayesian layers' affine maps (Linear, ConvNd, ConvTransposeNd) here,
everything else (activations, flattening, pooling, dropout, embeddings, and normalisation in
evaluation mode, with Bayesian parameters or not) by
:mod:`~pyro_bbb.infer.mcmc.export_ops`. Weights that are sample sites come from a dictionary
by site name; everything else (deterministic parameters, buffers, hyperparameters) is read
once and becomes a constant. Anything unknown raises :class:`NotImplementedError` naming the
module or operation. It knows nothing of priors, likelihoods or samplers.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Callable, Mapping

import numpy as np
import torch
import torch.fx
from torch import nn

from ..._pyro_compat import site_name
from ...nn import BayesianAffine, BayesianLayer, BayesianModule, ConvMap, LinearMap
from ...nn.training_mode import module_class_name
from ._jax import jax, jnp
from .export_ops import (
    FUNCTIONS,
    METHODS,
    constant,
    module_function,
    parametrised_function,
    tensor_attribute,
    unsupported,
)

__all__ = ["ExportedNetwork", "export_network"]


def _layer_operands(layer: BayesianLayer, names: tuple[str, ...], dtype: np.dtype):
    """``(operands(params) -> {param: value}, {site name: param})`` of a layer's parameters.

    Sampled parameters come from ``params`` by site name; deterministic ones are constants.
    """
    sites, constants = {}, {}
    for name in names:
        if name in layer.priors:
            sites[site_name(layer, name)] = name
        elif layer._parameters.get(name) is not None:
            constants[name] = constant(layer._parameters[name], dtype)
        else:
            constants[name] = None
    by_param = {param: site for site, param in sites.items()}

    def operands(params):
        return {name: params[by_param[name]] if name in by_param else constants[name]
                for name in names}  # fmt: skip

    return operands, sites


_CONV_LAYOUT = {1: ("NCH", "OIH", "NCH"), 2: ("NCHW", "OIHW", "NCHW"),
                3: ("NCDHW", "OIDHW", "NCDHW")}  # fmt: skip


def _conv(affine: ConvMap) -> Callable:
    """``conv(x, weight)`` in JAX with torch's semantics, for a ConvNd or ConvTransposeNd."""
    dims, dilation = affine.dims, affine.dilation

    def conv(x, weight):
        kernel = weight.shape[2:]
        extent = [dilation[i] * (kernel[i] - 1) for i in range(dims)]
        if affine.transposed:
            # torch's transposed convolution is the gradient of a convolution: dilate the
            # input by the stride, pad by the kernel's extent, and convolve with the kernel
            # flipped and its in/out axes swapped within each group.
            groups = affine.groups
            w = weight.reshape(groups, -1, *weight.shape[1:]).swapaxes(1, 2)
            w = jnp.flip(w.reshape(-1, w.shape[2], *kernel), axis=tuple(range(2, 2 + dims)))
            extra = affine.output_padding or (0,) * dims
            pads = [
                (e - p, e - p + o) for e, p, o in zip(extent, affine.padding, extra, strict=True)
            ]
            return jax.lax.conv_general_dilated(
                x, w, (1,) * dims, pads, lhs_dilation=affine.stride, rhs_dilation=dilation,
                dimension_numbers=_CONV_LAYOUT[dims], feature_group_count=groups,
                precision=jax.lax.Precision.HIGHEST,
            )  # fmt: skip
        padding = affine.padding
        if padding == "same":  # torch pads the extra unit on the right
            pads = [(e // 2, e - e // 2) for e in extent]
        elif padding == "valid":
            pads = [(0, 0)] * dims
        else:
            pads = [(p, p) for p in padding]
        return jax.lax.conv_general_dilated(
            x, weight, affine.stride, pads, rhs_dilation=dilation,
            dimension_numbers=_CONV_LAYOUT[dims], feature_group_count=affine.groups,
            precision=jax.lax.Precision.HIGHEST,
        )  # fmt: skip

    return conv


def _affine_layer(layer: BayesianAffine, dtype: np.dtype) -> tuple[Callable, dict[str, str]]:
    """The layer's map over ``(params, x)``, and ``{site name: "weight" | "bias"}``."""
    operands, sites = _layer_operands(layer, ("weight", "bias"), dtype)
    affine = layer.affine
    if isinstance(affine, LinearMap):

        def linear(params, x):
            values = operands(params)
            out = x @ values["weight"].T
            return out if values["bias"] is None else out + values["bias"]

        return linear, sites
    if isinstance(affine, ConvMap):
        conv = _conv(affine)

        def convolution(params, x):
            values = operands(params)
            out = conv(x, values["weight"])
            bias = values["bias"]
            return out if bias is None else out + bias.reshape(-1, *(1,) * affine.dims)

        return convolution, sites
    raise unsupported(f"a Bayesian layer with the map {affine!r}")


def _module_layer(
    layer: BayesianModule, name: str, dtype: np.dtype
) -> tuple[Callable, dict[str, str]]:
    """A wrapped module's map over ``(params, x)``, and ``{site name: parameter name}``."""
    module = layer.module
    fn = parametrised_function(module, dtype)
    if fn is None:
        raise unsupported(
            f"module {name!r} ({layer.wrapped_type.__name__}) with Bayesian parameters"
        )
    operands, sites = _layer_operands(layer, layer.parameter_names, dtype)
    return (lambda params, x: fn(operands(params), x)), sites


def _is_torch_module(module: nn.Module) -> bool:
    """A module of ``torch.nn`` itself (perhaps wrapped by Pyro), not a container."""
    if isinstance(module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
        return False
    return any(cls.__module__.startswith("torch.nn.") for cls in type(module).__mro__[:-2])


class _Tracer(torch.fx.Tracer):
    """Keeps Bayesian layers and ``torch.nn`` modules as leaves; traces through the rest."""

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return isinstance(module, BayesianLayer) or _is_torch_module(module)


class ExportedNetwork:
    """The network as ``net(params, x) -> output``, with the sites it reads.

    Attributes:
        sites: ``{site name: (layer path, "weight" | "bias")}`` of every sampled parameter.
    """

    def __init__(self, steps: list, output, sites: dict[str, tuple[str, str]]) -> None:
        self._steps = steps
        self._output = output
        self.sites = sites

    def __call__(self, params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
        """The network's output ``(batch, *out_features)`` at weights ``params``.

        Args:
            params: ``{site name: value of the site's shape}``.
            x: Inputs ``(batch, *features)``.
        """
        env = {}
        for node, step in self._steps:
            env[node] = step(env, params, x)
        return env[self._output]


def export_network(net: nn.Module, *, dtype: np.dtype = np.float64) -> ExportedNetwork:
    """Trace a Bayesian network and map its forward pass to JAX.

    Args:
        net: A network from :func:`~pyro_bbb.nn.bayesianize` or :func:`~pyro_bbb.nn.mlp`
            whose sites have their names (the model has run once).
        dtype: NumPy dtype of the constants (float64 or float32).

    Returns:
        An :class:`ExportedNetwork`.

    Raises:
        NotImplementedError: If :mod:`torch.fx` cannot trace the forward, or a module,
            function or method in it has no JAX translation here.
    """
    try:
        graph = _Tracer().trace(net)
    except Exception as error:
        raise unsupported(f"a network whose forward torch.fx cannot trace ({error})") from error
    steps, sites, output = [], {}, None
    for node in graph.nodes:
        if node.op == "output":
            output = node.args[0]
            continue
        steps.append((node, _step(net, node, sites, dtype)))
    if not isinstance(output, torch.fx.Node):
        raise unsupported("a network that returns more than one tensor")
    return ExportedNetwork(steps, output, sites)


def _args(node: torch.fx.Node, env: dict):
    load = functools.partial(torch.fx.node.map_arg, fn=lambda n: env[n])
    return load(node.args), load(node.kwargs)


def _step(net: nn.Module, node: torch.fx.Node, sites: dict, dtype: np.dtype) -> Callable:
    """One node of the graph as ``step(env, params, x) -> value``."""
    if node.op == "placeholder":
        if node.prev.op != "root":  # a second argument of forward
            if not node.args:
                raise unsupported(f"a network whose forward takes more than x ({node.target!r})")
            return lambda env, params, x: node.args[0]
        return lambda env, params, x: x
    if node.op == "get_attr":
        value = functools.reduce(getattr, node.target.split("."), net)
        value = constant(value, dtype) if isinstance(value, torch.Tensor) else value
        return lambda env, params, x: value
    if node.op == "call_module":
        module = net.get_submodule(node.target)
        if isinstance(module, BayesianLayer):
            if isinstance(module, BayesianAffine):
                fn, layer_sites = _affine_layer(module, dtype)
            else:
                fn, layer_sites = _module_layer(module, node.target, dtype)
            sites.update({site: (node.target, p) for site, p in layer_sites.items()})

            def layer(env, params, x):
                (inputs,), _ = _args(node, env)
                return fn(params, inputs)

            return layer
        fn = module_function(module, node.target, dtype)
        if fn is None:
            raise unsupported(f"module {node.target!r} ({module_class_name(module)})")

        def call(env, params, x):
            args, kwargs = _args(node, env)
            return fn(*args, **kwargs)

        return call
    if node.op == "call_function":
        fn = tensor_attribute if node.target is builtins.getattr else FUNCTIONS.get(node.target)
        if fn is None:
            module = getattr(node.target, "__module__", None) or ""
            name = f"{module.removeprefix('_')}.{getattr(node.target, '__name__', node.target)}"
            raise unsupported(f"the operation {name.lstrip('.')} in the network's forward")
    elif node.op == "call_method":
        fn = METHODS.get(node.target)
        if fn is None:
            raise unsupported(f"the tensor method .{node.target}() in the network's forward")
    else:  # pragma: no cover (fx has no other ops)
        raise unsupported(f"the graph node {node.format_node()}")

    def apply(env, params, x):
        args, kwargs = _args(node, env)
        return fn(*args, **kwargs)

    return apply
