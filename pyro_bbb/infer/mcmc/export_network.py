"""A Bayesian network's forward pass as a pure JAX function of its weights.

:func:`export_network` traces the network once with :mod:`torch.fx` (Bayesian layers and
the known ``torch.nn`` modules are leaves of the trace), and maps every node of the graph to
a JAX function: the Bayesian layers' affine maps (Linear, Conv2d), the elementwise
activations, flattening, pooling and, in evaluation mode, dropout and normalisation. Weights
that are sample sites come from a dictionary by site name; everything else (deterministic
parameters, buffers, hyperparameters) is read once and becomes a constant. Anything this
module does not know raises :class:`NotImplementedError` naming the module or operation.
It knows nothing of priors, likelihoods or samplers.
"""

from __future__ import annotations

import builtins
import functools
import math
import operator
from collections.abc import Callable, Mapping

import numpy as np
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from ...nn import BayesianAffine, Conv2dMap, LinearMap
from ._jax import jax, jnp
from .potential import module_class_name

__all__ = ["ExportedNetwork", "export_network", "unsupported"]

#: The sentence every refusal ends with.
_FALLBACK = "backend='pyro' samples any model"


def unsupported(what: str) -> NotImplementedError:
    """The error for anything the export does not support, pointing at the Pyro backend."""
    return NotImplementedError(f"backend='numpyro' cannot export {what}; {_FALLBACK}")


def constant(value: torch.Tensor, dtype: np.dtype) -> np.ndarray:
    """A tensor (any device, any dtype) as a NumPy array of ``dtype``, for a JAX constant."""
    return value.detach().to("cpu", torch.float64).numpy().astype(dtype)


# --- elementwise activations, with torch's argument order and defaults ---------------------


def _relu(x, inplace=False):
    return jax.nn.relu(x)


def _leaky_relu(x, negative_slope=0.01, inplace=False):
    return jnp.where(x > 0, x, negative_slope * x)


def _elu(x, alpha=1.0, inplace=False):
    return jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0)))


def _celu(x, alpha=1.0, inplace=False):
    return jnp.where(x > 0, x, alpha * jnp.expm1(jnp.minimum(x, 0) / alpha))


def _selu(x, inplace=False):
    # torch's constants (Klambauer et al. 2017)
    return 1.0507009873554804934193349852946 * _elu(x, 1.6732632423543772848170429916717)


def _gelu(x, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


def _softplus(x, beta=1.0, threshold=20.0):
    # torch switches to the identity where beta * x > threshold
    return jnp.where(beta * x > threshold, x, jax.nn.softplus(beta * x) / beta)


def _hardtanh(x, min_val=-1.0, max_val=1.0, inplace=False):
    return jnp.clip(x, min_val, max_val)


def _relu6(x, inplace=False):
    return jnp.clip(x, 0.0, 6.0)


def _silu(x, inplace=False):
    return jax.nn.silu(x)


def _mish(x, inplace=False):
    return x * jnp.tanh(jax.nn.softplus(x))


def _tanh(x):
    return jnp.tanh(x)


def _sigmoid(x):
    return jax.nn.sigmoid(x)


def _softsign(x):
    return x / (1 + jnp.abs(x))


def _log_sigmoid(x):
    return jax.nn.log_sigmoid(x)


def _identity(x, *args, **kwargs):
    return x


def _dropout(x, p=0.5, training=True, inplace=False):
    if training:
        raise unsupported("dropout in training mode (it makes the potential random)")
    return x


#: ``torch.nn`` activation modules: their JAX function and the attributes it takes.
_ACTIVATION_MODULES: dict[type[nn.Module], tuple[Callable, tuple[str, ...]]] = {
    nn.ReLU: (_relu, ()),
    nn.ReLU6: (_relu6, ()),
    nn.LeakyReLU: (_leaky_relu, ("negative_slope",)),
    nn.ELU: (_elu, ("alpha",)),
    nn.CELU: (_celu, ("alpha",)),
    nn.SELU: (_selu, ()),
    nn.GELU: (_gelu, ("approximate",)),
    nn.Softplus: (_softplus, ("beta", "threshold")),
    nn.Hardtanh: (_hardtanh, ("min_val", "max_val")),
    nn.SiLU: (_silu, ()),
    nn.Mish: (_mish, ()),
    nn.Tanh: (_tanh, ()),
    nn.Sigmoid: (_sigmoid, ()),
    nn.Softsign: (_softsign, ()),
    nn.LogSigmoid: (_log_sigmoid, ()),
    nn.Identity: (_identity, ()),
}

# --- shapes and pooling ----------------------------------------------------------------------


def _flatten(x, start_dim=0, end_dim=-1):
    start, end = start_dim % x.ndim, end_dim % x.ndim
    return x.reshape(*x.shape[:start], math.prod(x.shape[start : end + 1]), *x.shape[end + 1 :])


def _pair(value) -> tuple[int, int]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


def _window(x, kernel, stride, padding, dilation=(1, 1)):
    """``lax.reduce_window`` arguments over the last two dims of ``x``."""
    lead = (1,) * (x.ndim - 2)
    return {
        "window_dimensions": lead + kernel,
        "window_strides": lead + stride,
        "padding": ((0, 0),) * (x.ndim - 2) + tuple((p, p) for p in padding),
        "window_dilation": lead + dilation,
    }


def _max_pool2d(pool: nn.Module) -> Callable:
    if pool.ceil_mode or pool.return_indices:
        raise unsupported(f"{pool!r} (ceil_mode or return_indices)")
    kernel = _pair(pool.kernel_size)
    stride = _pair(pool.stride or pool.kernel_size)
    padding, dilation = _pair(pool.padding), _pair(pool.dilation)

    def apply(x):
        window = _window(x, kernel, stride, padding, dilation)
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, **window)

    return apply


def _avg_pool2d(pool: nn.Module) -> Callable:
    if pool.ceil_mode:
        raise unsupported(f"{pool!r} (ceil_mode)")
    kernel = _pair(pool.kernel_size)
    stride, padding = _pair(pool.stride or pool.kernel_size), _pair(pool.padding)
    divisor, include_pad = pool.divisor_override, pool.count_include_pad

    def apply(x):
        window = _window(x, kernel, stride, padding)
        total = jax.lax.reduce_window(x, 0.0, jax.lax.add, **window)
        if divisor:
            return total / divisor
        if include_pad or padding == (0, 0):
            return total / math.prod(kernel)
        ones = jnp.ones(x.shape[-2:], x.dtype)
        window = _window(ones, kernel, stride, padding)
        count = jax.lax.reduce_window(ones, 0.0, jax.lax.add, **window)
        return total / count

    return apply


def _adaptive_pool2d(pool: nn.Module, reduce: str) -> Callable:
    def apply(x):
        height, width = x.shape[-2:]
        out = [
            size if target is None else target
            for size, target in zip((height, width), _pair(pool.output_size), strict=True)
        ]
        if height % out[0] or width % out[1]:
            raise unsupported(f"{pool!r} on {height}x{width} inputs (not a whole number of bins)")
        kernel = (height // out[0], width // out[1])
        window = _window(x, kernel, kernel, (0, 0))
        if reduce == "max":
            return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, **window)
        return jax.lax.reduce_window(x, 0.0, jax.lax.add, **window) / math.prod(kernel)

    return apply


# --- modules ---------------------------------------------------------------------------------


def _affine_layer(layer: BayesianAffine, dtype: np.dtype) -> tuple[Callable, dict[str, str]]:
    """The layer's map over ``(params, x)``, and ``{site name: "weight" | "bias"}``."""
    sites, constants = {}, {}
    for name in ("weight", "bias"):
        if name in layer.priors:
            sites[layer._pyro_get_fullname(name)] = name
        elif layer._parameters.get(name) is not None:
            constants[name] = constant(layer._parameters[name], dtype)
        else:
            constants[name] = None
    by_param = {param: site for site, param in sites.items()}
    affine = layer.affine

    def operands(params):
        return tuple(
            params[by_param[name]] if name in by_param else constants[name]
            for name in ("weight", "bias")
        )

    if isinstance(affine, LinearMap):

        def linear(params, x):
            weight, bias = operands(params)
            out = x @ weight.T
            return out if bias is None else out + bias

        return linear, sites
    if isinstance(affine, Conv2dMap):
        padding = affine.padding

        def conv(params, x):
            weight, bias = operands(params)
            pads = padding
            if isinstance(padding, str):  # torch's "same" pads the extra unit on the right
                sizes = [affine.dilation[i] * (weight.shape[2 + i] - 1) for i in range(2)]
                pads = [(s // 2, s - s // 2) for s in sizes] if padding == "same" else [(0, 0)] * 2
            else:
                pads = [(p, p) for p in pads]
            out = jax.lax.conv_general_dilated(
                x, weight, affine.stride, pads, rhs_dilation=affine.dilation,
                dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=affine.groups,
                precision=jax.lax.Precision.HIGHEST,
            )  # fmt: skip
            return out if bias is None else out + bias.reshape(-1, 1, 1)

        return conv, sites
    raise unsupported(f"a Bayesian layer with the map {affine!r}")


def _normalization(module: nn.Module, dtype: np.dtype) -> Callable:
    affine = [getattr(module, n, None) for n in ("weight", "bias")]
    weight, bias = (None if p is None else constant(p, dtype) for p in affine)
    eps = module.eps
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        if module.running_mean is None:
            raise unsupported(f"{module!r} without running statistics (track_running_stats)")
        mean, var = constant(module.running_mean, dtype), constant(module.running_var, dtype)

        def batch_norm(x):
            view = (-1,) + (1,) * (x.ndim - 2)
            out = (x - mean.reshape(view)) / jnp.sqrt(var.reshape(view) + eps)
            if weight is not None:
                out = out * weight.reshape(view)
            return out if bias is None else out + bias.reshape(view)

        return batch_norm
    axes = tuple(range(-len(module.normalized_shape), 0))

    def layer_norm(x):
        centred = x - x.mean(axes, keepdims=True)
        out = centred / jnp.sqrt((centred**2).mean(axes, keepdims=True) + eps)
        if weight is not None:
            out = out * weight
        return out if bias is None else out + bias

    return layer_norm


def _module_function(module: nn.Module, name: str, dtype: np.dtype) -> Callable | None:
    """A JAX function ``x -> y`` for a known ``torch.nn`` module, ``None`` if unknown."""
    for cls in type(module).__mro__:
        if cls in _ACTIVATION_MODULES:
            fn, attributes = _ACTIVATION_MODULES[cls]
            return functools.partial(fn, **{a: getattr(module, a) for a in attributes})
        if cls is nn.Flatten:
            return functools.partial(_flatten, start_dim=module.start_dim, end_dim=module.end_dim)
        if cls in (nn.Softmax, nn.LogSoftmax):
            if module.dim is None:
                raise unsupported(f"module {name!r}: {module!r} without dim")
            fn = jax.nn.softmax if cls is nn.Softmax else jax.nn.log_softmax
            return functools.partial(fn, axis=module.dim)
        if cls is nn.modules.dropout._DropoutNd:
            return functools.partial(_dropout, training=module.training)
        if cls is nn.MaxPool2d:
            return _max_pool2d(module)
        if cls is nn.AvgPool2d:
            return _avg_pool2d(module)
        if cls in (nn.AdaptiveMaxPool2d, nn.AdaptiveAvgPool2d):
            return _adaptive_pool2d(module, "max" if cls is nn.AdaptiveMaxPool2d else "avg")
        if cls in (nn.modules.batchnorm._BatchNorm, nn.LayerNorm):
            return _normalization(module, dtype)
    return None


def _is_torch_module(module: nn.Module) -> bool:
    """A module of ``torch.nn`` itself (perhaps wrapped by Pyro), not a container."""
    if isinstance(module, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
        return False
    return any(cls.__module__.startswith("torch.nn.") for cls in type(module).__mro__[:-2])


class _Tracer(torch.fx.Tracer):
    """Keeps Bayesian layers and ``torch.nn`` modules as leaves; traces through the rest."""

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return isinstance(module, BayesianAffine) or _is_torch_module(module)


# --- functions and methods found in a traced forward ---------------------------------------

_FUNCTIONS: dict[Callable, Callable] = {
    F.relu: _relu, torch.relu: _relu, F.relu6: _relu6, F.leaky_relu: _leaky_relu,
    F.elu: _elu, F.celu: _celu, F.selu: _selu, torch.selu: _selu, F.gelu: _gelu,
    F.softplus: _softplus, F.hardtanh: _hardtanh, F.silu: _silu, F.mish: _mish,
    torch.tanh: _tanh, F.tanh: _tanh, torch.sigmoid: _sigmoid, F.sigmoid: _sigmoid,
    F.softsign: _softsign, F.logsigmoid: _log_sigmoid, F.dropout: _dropout,
    torch.flatten: _flatten,
    operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
    operator.truediv: operator.truediv, operator.neg: operator.neg,
    operator.getitem: operator.getitem,
}  # fmt: skip

_METHODS: dict[str, Callable] = {
    "relu": _relu, "tanh": _tanh, "sigmoid": _sigmoid, "flatten": _flatten,
    "view": lambda x, *shape: x.reshape(*shape), "reshape": lambda x, *shape: x.reshape(*shape),
    "size": lambda x, dim=None: x.shape if dim is None else x.shape[dim],
}  # fmt: skip


def _getattr(value, name: str):
    if name != "shape":
        raise unsupported(f"the attribute {name!r} of a tensor in the network's forward")
    return value.shape


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
        if isinstance(module, BayesianAffine):
            fn, layer_sites = _affine_layer(module, dtype)
            sites.update({site: (node.target, p) for site, p in layer_sites.items()})

            def layer(env, params, x):
                (inputs,), _ = _args(node, env)
                return fn(params, inputs)

            return layer
        fn = _module_function(module, node.target, dtype)
        if fn is None:
            raise unsupported(f"module {node.target!r} ({module_class_name(module)})")

        def call(env, params, x):
            args, kwargs = _args(node, env)
            return fn(*args, **kwargs)

        return call
    if node.op == "call_function":
        fn = _getattr if node.target is builtins.getattr else _FUNCTIONS.get(node.target)
        if fn is None:
            module = getattr(node.target, "__module__", None) or ""
            name = f"{module.removeprefix('_')}.{getattr(node.target, '__name__', node.target)}"
            raise unsupported(f"the operation {name.lstrip('.')} in the network's forward")
    elif node.op == "call_method":
        fn = _METHODS.get(node.target)
        if fn is None:
            raise unsupported(f"the tensor method .{node.target}() in the network's forward")
    else:  # pragma: no cover (fx has no other ops)
        raise unsupported(f"the graph node {node.format_node()}")

    def apply(env, params, x):
        args, kwargs = _args(node, env)
        return fn(*args, **kwargs)

    return apply
