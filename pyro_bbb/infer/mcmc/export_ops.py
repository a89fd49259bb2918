"""Torch operations and modules as JAX functions, for the network export.

This module holds the translations :mod:`~pyro_bbb.infer.mcmc.export_network` applies to the
nodes of a traced forward pass: the elementwise activations (torch's argument order and
defaults, torch's formulas), flattening and reshaping, 2-D pooling, dropout and normalisation
in evaluation mode, embeddings, as modules (:func:`module_function`; with Bayesian parameters
:func:`parametrised_function`), functions (:data:`FUNCTIONS`) and tensor methods
(:data:`METHODS`); and :func:`unsupported`, the one error every refusal of the
export raises. The Bayesian layers themselves, and the graph, are the network export's.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ._jax import jax, jnp

__all__ = [
    "FUNCTIONS",
    "METHODS",
    "constant",
    "module_function",
    "parametrised_function",
    "tensor_attribute",
    "unsupported",
]

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


def _normalization(module: nn.Module, dtype: np.dtype) -> Callable:
    """``fn(params, x)``: batch or layer normalisation, ``params`` holding weight and bias."""
    eps = module.eps
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        if module.running_mean is None:
            raise unsupported(f"{module!r} without running statistics (track_running_stats)")
        mean, var = constant(module.running_mean, dtype), constant(module.running_var, dtype)

        def batch_norm(params, x):
            weight, bias = params.get("weight"), params.get("bias")
            view = (-1,) + (1,) * (x.ndim - 2)
            out = (x - mean.reshape(view)) / jnp.sqrt(var.reshape(view) + eps)
            if weight is not None:
                out = out * weight.reshape(view)
            return out if bias is None else out + bias.reshape(view)

        return batch_norm
    axes = tuple(range(-len(module.normalized_shape), 0))

    def layer_norm(params, x):
        weight, bias = params.get("weight"), params.get("bias")
        centred = x - x.mean(axes, keepdims=True)
        out = centred / jnp.sqrt((centred**2).mean(axes, keepdims=True) + eps)
        if weight is not None:
            out = out * weight
        return out if bias is None else out + bias

    return layer_norm


def _embedding(module: nn.Module, dtype: np.dtype) -> Callable:
    """``fn(params, ids)``: the rows of the weight at integer ids."""
    if module.max_norm is not None:
        raise unsupported(f"{module!r} with max_norm (it renormalises its weight in place)")

    def embedding(params, ids):
        return jnp.take(params["weight"], ids, axis=0)

    return embedding


def parametrised_function(module: nn.Module, dtype: np.dtype) -> Callable | None:
    """A JAX function ``fn(params, x)`` of a module with parameters, ``None`` if unknown.

    ``params`` maps the module's parameter names to values (sampled or constant): the
    normalisation layers (batch normalisation in evaluation mode) and ``nn.Embedding``.

    Raises:
        NotImplementedError: For a known module with options the export does not cover.
    """
    if isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.LayerNorm)):
        return _normalization(module, dtype)
    if isinstance(module, nn.Embedding) and type(module).forward is nn.Embedding.forward:
        return _embedding(module, dtype)
    return None


def module_function(module: nn.Module, name: str, dtype: np.dtype) -> Callable | None:
    """A JAX function ``x -> y`` for a known ``torch.nn`` module, ``None`` if unknown.

    Args:
        module: The module (a Pyro-wrapped ``torch.nn`` class is read by its torch base).
        name: Its path in the network, for errors.
        dtype: NumPy dtype of its constants (normalisation parameters and statistics).

    Raises:
        NotImplementedError: For a known module with options the export does not cover.
    """
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
        if cls in (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.Embedding):
            fn = parametrised_function(module, dtype)
            values = {n: constant(p, dtype) for n, p in module.named_parameters(recurse=False)}
            return functools.partial(fn, values)
    return None


# --- functions and methods found in a traced forward ---------------------------------------

#: Functions a traced forward may call (``call_function`` nodes), by the torch callable.
FUNCTIONS: dict[Callable, Callable] = {
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

#: Tensor methods a traced forward may call (``call_method`` nodes), by name.
METHODS: dict[str, Callable] = {
    "relu": _relu, "tanh": _tanh, "sigmoid": _sigmoid, "flatten": _flatten,
    "view": lambda x, *shape: x.reshape(*shape), "reshape": lambda x, *shape: x.reshape(*shape),
    "size": lambda x, dim=None: x.shape if dim is None else x.shape[dim],
}  # fmt: skip


def tensor_attribute(value, name: str):
    """``getattr(x, name)`` in a traced forward: ``x.shape`` only (static in JAX)."""
    if name != "shape":
        raise unsupported(f"the attribute {name!r} of a tensor in the network's forward")
    return value.shape
