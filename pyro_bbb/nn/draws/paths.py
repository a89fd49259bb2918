"""Which way several weight draws reach a network: its structure first, vmap's errors last.

A network meets draws in one of three ways (:class:`DrawPath`). Where its structure decides,
the structure is read: :func:`broadcasts_draws` proves that draws may flow through the
layers as leading activation dims, and :func:`unbatched_layer` finds a layer ``vmap`` cannot
run on drawn weights whatever its input (a Bayesian ``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` or
``nn.LSTMCell``: one fused kernel with no batching rule), which sends the draws round a
loop. Anything else (a ``BatchNorm`` updating its running statistics from a drawn input, a
data-dependent branch, an operation of the network's own) is only known by trying ``vmap``
(:mod:`~pyro_bbb.nn.draws.per_draw`), and :func:`is_vmap_limitation` tells the errors
``vmap`` raises for what it cannot batch from the network's own. Nothing here runs a network.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from torch import nn

from ..._pyro_compat import join_name, user_class
from ..affine import LinearMap
from ..layers import BayesianAffine, BayesianLayer
from ..multi_head import MultiHead

__all__ = [
    "DrawPath",
    "PerDrawPath",
    "broadcasts_draws",
    "is_vmap_limitation",
    "layer_paths",
    "reachable_layers",
    "unbatched_layer",
]


class DrawPath(str, Enum):
    """How a network meets several weight draws (see :mod:`pyro_bbb.nn.draws`)."""

    BROADCAST = "broadcast"
    VMAP = "vmap"
    LOOP = "loop"


@dataclass(frozen=True)
class PerDrawPath:
    """The path a network takes in one training mode, and why.

    ``backward``: whether a ``vmap`` path was chosen after a backward pass through it too
    (a path decided without gradients is checked again where gradients are taken).
    """

    path: DrawPath
    reason: str = ""  # why a per-draw network took the loop (or broadcast): a layer, an error
    backward: bool = False


# ------------------------------------------------------------------------- broadcast
#: Modules that act on each activation (or each row's trailing dims) alone, so leading sample
#: dims pass through them unchanged; exact classes: a subclass may have its own ``forward``.
_ELEMENTWISE: frozenset[type[nn.Module]] = frozenset(
    {
        nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU,
        nn.Mish, nn.Tanh, nn.Sigmoid, nn.Softplus, nn.Softsign, nn.Tanhshrink, nn.Hardtanh,
        nn.Hardswish, nn.Hardsigmoid, nn.LogSigmoid, nn.Identity, nn.Dropout, nn.AlphaDropout,
        nn.LayerNorm, *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
    }
)  # fmt: skip


def broadcasts_draws(module: nn.Module) -> bool:
    """Whether weight draws may flow through ``module`` as leading activation dims.

    True for the structures whose every operation is known to broadcast over leading dims:
    Bayesian ``Linear`` layers (:class:`~pyro_bbb.nn.layers.BayesianAffine` with a
    :class:`~pyro_bbb.nn.affine.LinearMap`), elementwise modules (activations, dropout,
    ``LayerNorm``; a ``PReLU`` with one weight only, ``Softmax``/``LogSoftmax`` over a
    negative dim), and ``nn.Sequential`` and :class:`~pyro_bbb.nn.multi_head.MultiHead`
    made of those, with their own ``forward``. Anything else (a ``forward`` of your own, a
    convolution, a recurrent layer, a Bayesian ``LayerNorm``) is run once per draw.
    """
    if isinstance(module, BayesianAffine):
        return isinstance(module.affine, LinearMap)
    if isinstance(module, BayesianLayer):
        return False
    cls = user_class(module)
    if cls in (nn.Sequential, MultiHead):
        return all(broadcasts_draws(child) for child in module.children())
    if cls in (nn.Softmax, nn.LogSoftmax):
        return module.dim is not None and module.dim < 0
    if cls is nn.PReLU:
        return module.num_parameters == 1
    return cls in _ELEMENTWISE and next(module.children(), None) is None


# ------------------------------------------------------------------------- the loop
#: Modules whose forward is one fused kernel ``torch.func.vmap`` has no batching rule for
#: once their own parameters carry the draws' dim (``aten::lstm``, ``aten::gru``,
#: ``aten::rnn_tanh``, ``aten::lstm_cell``), whatever their input.
_UNBATCHED_WITH_DRAWN_WEIGHTS: tuple[type[nn.Module], ...] = (nn.RNNBase, nn.LSTMCell)


def unbatched_layer(net: nn.Module) -> str | None:
    """The first layer of ``net`` that ``vmap`` cannot run on drawn weights, in words, or ``None``.

    A Bayesian layer that runs a module on its drawn parameters
    (:class:`~pyro_bbb.nn.module_layer.BayesianModule`), where that module is a recurrent
    layer whose kernel has no batching rule: such a network runs its draws one after
    another, known without trying. ``None`` says nothing either way: the network may still
    hold something ``vmap`` cannot batch, found by trying.
    """
    reachable = {id(layer) for layer in reachable_layers(net)}
    for module, path in layer_paths(net, ""):
        if id(module) not in reachable or not module.bayesian_parameters:
            continue
        for child in module.children():  # a module run on the layer's drawn parameters
            if isinstance(child, _UNBATCHED_WITH_DRAWN_WEIGHTS):
                name = user_class(child).__name__
                return (
                    f"layer {path or '(root)'!r} ({name}), whose fused recurrent kernel has no "
                    "batching rule for drawn weights"
                )
    return None


_VMAP_LIMITATION = re.compile(
    r"vmap|[Bb]atching rule|batched tensor|could not generate a fallback|"
    r"data-dependent control flow"
)


def is_vmap_limitation(error: BaseException) -> bool:
    """Whether ``error`` says ``vmap`` cannot batch an operation (no rule, in-place update).

    ``vmap`` raises a ``RuntimeError`` for an operation it has no rule for and a
    ``ValueError`` for what it cannot take or return; either, naming ``vmap`` or its rules,
    means the network must run its draws one after another. Any other error (a shape
    mismatch of the network's own, say) is the network's and is not caught. Torch gives
    these errors no class of their own, so their text is read: the last resort, for what
    the network's structure does not tell (:func:`unbatched_layer`).
    """
    return isinstance(error, (RuntimeError, ValueError)) and bool(
        _VMAP_LIMITATION.search(str(error))
    )


# ------------------------------------------------------------------------- the layers
def reachable_layers(root: nn.Module) -> list[BayesianLayer]:
    """The Bayesian layers a forward of ``root`` can reach, each once, in ``modules()`` order.

    A :class:`~pyro_bbb.nn.multi_head.MultiHead` reaches its body and its active head only.
    """
    layers: dict[int, BayesianLayer] = {}

    def visit(module: nn.Module) -> None:
        if isinstance(module, BayesianLayer):
            layers.setdefault(id(module), module)
        if isinstance(module, MultiHead):
            children = (module.body, module.heads[module.head])
        else:
            children = tuple(module.children())
        for child in children:
            visit(child)

    visit(root)
    return list(layers.values())


def layer_paths(module: nn.Module, path: str) -> Iterator[tuple[nn.Module, str]]:
    """``(module, path)`` of every module, paths as site names write them (wrappers unnamed)."""
    yield module, path
    unnamed = getattr(module, "unnamed_children", ())
    for name, child in module.named_children():
        child_path = path if name in unnamed else join_name(path, name)
        yield from layer_paths(child, child_path)
