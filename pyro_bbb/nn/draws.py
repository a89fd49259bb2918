r"""How weight draws reach a network: around its ``forward``, not through it.

Several draws of the weights at once (an ELBO's particles, ``predict``'s samples, an
ensemble's members) give every Bayesian parameter leading sample dims,
``(*sample, [1,] *shape)``. A network's ``forward`` is written for activations
``(batch, ...)``: ``torch.flatten(x, 1)``, ``out[:, -1]``, ``nn.LSTM``,
``nn.MultiheadAttention`` and ``BatchNorm`` all count dims from the front. So the draws go
around the network, and its ``forward`` sees the shapes it was written for. A network
meets draws in one of three ways (:class:`DrawPath`), chosen for each network:

* ``"broadcast"``: the draws' sample dims flow through the activations, ``(*sample, batch,
  features)``, in one pass whose matrix products are batched over the draws. Taken only
  for networks proved to allow it by their structure (:func:`broadcasts_draws`):
  ``nn.Sequential`` stacks (and :class:`~pyro_bbb.nn.multi_head.MultiHead`) of Bayesian
  ``Linear`` layers, elementwise activations, dropout and ``LayerNorm``, which is what
  :func:`~pyro_bbb.nn.builders.mlp` builds. It is the fastest path for them.
* ``"vmap"``: every Bayesian site is drawn first, then the network's own ``forward`` runs
  once per draw under :func:`torch.func.vmap` (``randomness="different"``: each draw has
  its own dropout masks and estimator noise), in one vectorised pass.
* ``"loop"``: the same, one draw after another, for networks ``vmap`` has no rule for
  (``nn.LSTM``, ``nn.GRU``, ``BatchNorm`` updating its running statistics in training mode,
  a data-dependent branch, a backward pass ``vmap`` cannot batch). Which of ``vmap`` and
  ``loop`` a network takes is decided the first time it meets draws in a training mode
  (``net.training``), from the error class ``vmap`` raises (:func:`is_vmap_limitation`);
  any other error is the network's own and is raised as it is. Where gradients are being
  taken, the decision backpropagates once through the vectorised pass too (a rule ``vmap``
  has for the forward may be missing for the backward); a decision made without gradients
  (under ``torch.no_grad()``) is checked again so the first time the network meets draws
  with them. :func:`settle_draws` makes the decision, backward included, before training.

A network's output may be any nesting of tuples, lists and dicts (named tuples too) whose
leaves are tensors or anything else (``None``, a number): on every path the tensors get the
draws' sample dims in front and the other leaves come back as the network returned them
(from the first draw).

:func:`~pyro_bbb.nn.builders.bayesianize` gives the root of every network that does not
broadcast a :class:`PerDrawForward`, so ``net(x)`` does this in any Pyro model. Inside a
per-draw pass every read of a site gives the current draw's value, and the estimators
(:mod:`pyro_bbb.infer.reparam`) take the current draw's part of what they derive from a
site's distribution (:class:`~pyro_bbb.nn.sample_dims.Draw`), so local reparameterisation
and flipout work on every path. Nothing here knows of guides or training.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import Message
from torch import nn
from torch.func import vmap

from .._devices import cuda_devices
from .._pyro_compat import join_name, set_cached_value, user_class
from .._shapes import broadcast_shape
from .affine import LinearMap
from .layers import BayesianAffine, BayesianLayer
from .multi_head import MultiHead
from .sample_dims import Draw, running_draw
from .sample_dims import sample_shape as drawn_shape

__all__ = [
    "DrawPath",
    "PerDrawForward",
    "PerDrawPath",
    "broadcasts_draws",
    "describe_draws",
    "draw_path",
    "is_vmap_limitation",
    "kept_buffers",
    "per_draw_forward",
    "settle_draws",
]


class DrawPath(str, Enum):
    """How a network meets several weight draws (see the module's notes)."""

    BROADCAST = "broadcast"
    VMAP = "vmap"
    LOOP = "loop"


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
    :class:`~pyro_bbb.nn.affine.LinearMap`), the elementwise modules above (a ``PReLU`` with
    one weight only, ``Softmax``/``LogSoftmax`` over a negative dim), and ``nn.Sequential``
    and :class:`~pyro_bbb.nn.multi_head.MultiHead` made of those, with their own
    ``forward``. Anything else (a ``forward`` of your own, a convolution, a recurrent layer,
    a Bayesian ``LayerNorm``) is run once per draw.
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


# ------------------------------------------------------------------------- vmap's limits
_VMAP_LIMITATION = re.compile(
    r"vmap|[Bb]atching rule|batched tensor|could not generate a fallback|"
    r"data-dependent control flow"
)


def is_vmap_limitation(error: BaseException) -> bool:
    """Whether ``error`` says ``vmap`` cannot batch an operation (no rule, in-place update).

    ``vmap`` raises a ``RuntimeError`` for an operation it has no rule for and a
    ``ValueError`` for what it cannot take or return; either, naming ``vmap`` or its rules,
    means the network must run its draws one after another. Any other error (a shape
    mismatch of the network's own, say) is the network's and is not caught.
    """
    return isinstance(error, (RuntimeError, ValueError)) and bool(
        _VMAP_LIMITATION.search(str(error))
    )


@contextmanager
def kept_buffers(module: nn.Module) -> Iterator[None]:
    """Restore ``module``'s buffers (e.g. BatchNorm's running statistics) on leaving.

    For passes that check or probe a network: they must leave it as it was.
    """
    saved = [(buffer, buffer.detach().clone()) for buffer in _changeable_buffers(module)]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def _changeable_buffers(root: nn.Module) -> Iterator[torch.Tensor]:
    """Every buffer but the Bayesian layers' initial values, which no forward changes."""
    for module in root.modules():
        constant = {f"{p}_init" for p in module.priors} if isinstance(module, BayesianLayer) else ()
        for name, buffer in module.named_buffers(recurse=False):
            if name not in constant:
                yield buffer


class _Innermost:
    """Records the innermost module whose ``forward`` was under way (global hooks)."""

    def __init__(self, root: nn.Module) -> None:
        self._names = dict(_layer_paths(root, ""))  # by module
        self._stack: list[str] = []
        self.culprit: str | None = None

    def __enter__(self) -> _Innermost:
        hooks = torch.nn.modules.module
        self._handles = (
            hooks.register_module_forward_pre_hook(self._enter),
            hooks.register_module_forward_hook(self._leave),
        )
        return self

    def __exit__(self, kind, error, traceback) -> None:
        for handle in self._handles:
            handle.remove()
        if error is not None and self._stack:
            self.culprit = self._stack[-1]

    def _enter(self, module: nn.Module, args: Any) -> None:
        name = self._names.get(module)
        if name is not None:
            self._stack.append(f"layer {name or '(root)'!r} ({user_class(module).__name__})")

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if module in self._names and self._stack:
            self._stack.pop()


class _OwnStatementError(Exception):
    """A network's forward issued a Pyro sample statement of its own in a per-draw pass."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _NoStatements(Messenger):
    """Stops a per-draw pass at a sample statement of the network's own, before any handler.

    The Bayesian sites were drawn before the pass, so inside it a sample statement is the
    network's own (``pyro.factor``, ``pyro.deterministic``, a latent of its own): issued once
    per draw it would repeat a site, and under ``vmap`` leak batched values into traces.
    """

    def _process_message(self, msg: Message) -> None:
        if msg["type"] == "sample":
            raise _OwnStatementError(msg["name"])


# ------------------------------------------------------------------------- the runner
@dataclass(frozen=True)
class PerDrawPath:
    """The per-draw path a network takes in one training mode, and why.

    ``backward``: whether a ``vmap`` path was chosen after a backward pass through it too
    (a path decided without gradients is checked again where gradients are taken).
    """

    path: DrawPath
    reason: str = ""  # why a per-draw network took the loop (or broadcast): a layer, an error
    backward: bool = False


class PerDrawForward:
    """The ``forward`` :func:`~pyro_bbb.nn.builders.bayesianize` gives a network's root.

    It runs the network's own ``forward`` (its class's, unchanged) on the weights drawn in the
    current Pyro run. With no sample dims that is one call. With several draws, every
    reachable Bayesian site is drawn first (in the order of ``net.modules()``; a
    :class:`~pyro_bbb.nn.multi_head.MultiHead` draws its body and active head only), and
    the network's ``forward`` runs once per draw: vectorised by :func:`torch.func.vmap`, or
    one draw after another where ``vmap`` has no rule (see the module's notes). Every read
    of a site in that pass, a layer's or the ``forward``'s own (``self.out_proj.weight`` in
    ``nn.MultiheadAttention``), gives the current draw's value. Forward hooks of the root
    run once per call, those of the modules inside it once per draw.

    Installed only on networks that do not broadcast draws (:func:`broadcasts_draws`), as
    an instance attribute, so the network keeps its class, ``state_dict``, pickles and
    copies.

    Args:
        module: The network's root.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._paths: dict[bool, PerDrawPath] = {}  # by training mode, once met

    def path(self) -> PerDrawPath | None:
        """The path in the network's current training mode; ``None`` until it meets draws."""
        return self._paths.get(self.module.training)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The network's output on the current run's weights.

        Args:
            *args: The network's arguments; the first is its input ``(batch, ...)``.
            **kwargs: Its keyword arguments.

        Returns:
            The network's output, with the draws' sample dims in front of every tensor.
        """
        module = self.module
        forward = type(module).forward
        drawn = dict(_draw_sites(module))
        sample = broadcast_shape(*(drawn_shape(value, dims) for value, dims in drawn.values()))
        if not sample:
            return forward(module, *args, **kwargs)
        known = self._paths.get(module.training)
        if known is not None and known.path is DrawPath.BROADCAST:
            return forward(module, *args, **kwargs)
        if known is not None and known.path is DrawPath.LOOP:
            return _per_draw_pass(module, drawn, sample, args, kwargs, vectorised=False)
        if known is not None and (known.backward or not _differentiable(module, drawn)):
            return _per_draw_pass(module, drawn, sample, args, kwargs, vectorised=True)
        return self._decide(drawn, sample, args, kwargs)

    def _decide(self, drawn, sample, args, kwargs) -> Any:
        """Try ``vmap`` (and a backward pass through it where gradients are taken); decide."""
        module = self.module
        innermost = _Innermost(module)
        backward = _differentiable(module, drawn)
        try:
            with innermost:
                out = _per_draw_pass(module, drawn, sample, args, kwargs, vectorised=True)
            if backward:
                _backpropagate_once(out, module, drawn)
        except _OwnStatementError as statement:
            # A forward written in Pyro (a pyro.factor, a site of its own) is written for
            # draws in front of its activations, as any Pyro model under a plate is.
            reason = f"its forward issues the Pyro statement {statement.name!r} of its own"
            self._paths[module.training] = PerDrawPath(DrawPath.BROADCAST, reason)
            return type(module).forward(module, *args, **kwargs)
        except (RuntimeError, ValueError) as error:
            if not is_vmap_limitation(error):
                raise
            if innermost.culprit is not None:
                where = innermost.culprit
            else:
                where = "the network's backward pass" if backward else "the network"
            reason = f"{where}: {str(error).splitlines()[0]}"
            self._paths[module.training] = PerDrawPath(DrawPath.LOOP, reason)
            return _per_draw_pass(module, drawn, sample, args, kwargs, vectorised=False)
        self._paths[module.training] = PerDrawPath(DrawPath.VMAP, backward=backward)
        return out


def _differentiable(module: nn.Module, drawn: Mapping[str, tuple[torch.Tensor, int]]) -> bool:
    """Whether a pass now would be backpropagated: gradients on, and a draw or weight needs one."""
    if not torch.is_grad_enabled():
        return False
    if any(value.requires_grad for value, _ in drawn.values()):
        return True
    return any(param.requires_grad for param in module.parameters())


def _backpropagate_once(out: Any, module: nn.Module, drawn) -> None:
    """One backward pass from ``out`` to the draws and weights, leaving no gradient behind.

    Where training will backpropagate through a ``vmap`` pass, its backward must batch too;
    this finds out at the decision. The graph is kept for the caller's own backward pass.
    """
    outputs = [t for t in _tensor_leaves(out) if t.requires_grad and t.is_floating_point()]
    inputs = [value for value, _ in drawn.values() if value.requires_grad]
    inputs += [param for param in module.parameters() if param.requires_grad]
    if outputs and inputs:
        total = sum(t.sum() for t in outputs)
        torch.autograd.grad(total, inputs, retain_graph=True, allow_unused=True)


def per_draw_forward(net: nn.Module) -> PerDrawForward | None:
    """The :class:`PerDrawForward` of a network's root, or ``None`` (a broadcasting network)."""
    forward = net.__dict__.get("forward")
    return forward if isinstance(forward, PerDrawForward) else None


def draw_path(net: nn.Module) -> PerDrawPath | None:
    """How ``net`` meets several weight draws in its current training mode.

    Returns:
        ``DrawPath.BROADCAST`` for a network that broadcasts draws; ``DrawPath.VMAP`` or
        ``DrawPath.LOOP`` (with the reason) for one that has met draws in this training
        mode; ``None`` for one that has not yet (it will try ``vmap`` first).
    """
    runner = per_draw_forward(net)
    if runner is None:
        return PerDrawPath(DrawPath.BROADCAST)
    return runner.path()


def settle_draws(net: nn.Module, *args: Any, plate_dim: int = -2) -> PerDrawPath:
    """Decide, now, how ``net`` meets several weight draws in its current training mode.

    A network that does not broadcast is run once on two draws from its prior, and a
    backward pass taken from its output to those draws (its gradients not kept), with its
    buffers and every random state as they were: ``vmap`` or the loop is then known before
    training, including where only the backward pass cannot be batched (``fit`` calls this
    at its set-up, on its first minibatch). Without this the decision is made at the first
    call with draws.

    Args:
        net: A network from :func:`~pyro_bbb.nn.builders.bayesianize`.
        *args: Its arguments, e.g. a minibatch ``x`` (BatchNorm needs more than one row).
        plate_dim: The dim of the probe's plate of draws, left of the model's own plates.

    Returns:
        The path (see :func:`draw_path`).
    """
    runner = per_draw_forward(net)
    if runner is None:
        return PerDrawPath(DrawPath.BROADCAST)
    known = runner.path()
    if known is None or (known.path is DrawPath.VMAP and not known.backward):
        state = pyro.util.get_rng_state()
        try:
            with (
                torch.random.fork_rng(devices=cuda_devices(net, *args)),
                torch.enable_grad(),
                kept_buffers(net),
                poutine.block(),
                _DifferentiableDraws(),
                pyro.plate("draws", 2, dim=plate_dim),
            ):
                net(*args)
        finally:
            pyro.util.set_rng_state(state)
        known = runner.path()
    return known


class _DifferentiableDraws(Messenger):
    """Makes a probe's draws leaves that need gradients, as a guide's draws are."""

    def _pyro_post_sample(self, msg: Message) -> None:
        value = msg["value"]
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            msg["value"] = value.detach().requires_grad_()


def describe_draws(net: nn.Module) -> str:
    """One line saying how weight draws reach ``net``, for summaries and warnings."""
    known = draw_path(net)
    if known is None:
        return "around the network, once per draw (torch.func.vmap; a loop if vmap has no rule)"
    if known.path is DrawPath.BROADCAST:
        why = known.reason or "Linear layers and elementwise modules only"
        return f"through the layers, broadcast ({why})"
    if known.path is DrawPath.VMAP:
        return "around the network, once per draw, vectorised by torch.func.vmap"
    return f"around the network, one draw after another (vmap cannot batch {known.reason})"


def _draw_sites(net: nn.Module) -> Iterator[tuple[str, tuple[torch.Tensor, int]]]:
    """Every reachable Bayesian site's value as drawn: a Pyro sample statement each."""
    for layer in _reachable_layers(net):
        names = layer._site_names()
        for param in layer.bayesian_parameters:
            yield names[param], (getattr(layer, param), len(layer.parameter_shape(param)))


def _per_draw_pass(module, drawn, sample, args, kwargs, *, vectorised: bool):
    """``module``'s own forward once per draw; outputs stacked, ``(*sample, ...)``."""
    count = math.prod(sample)
    values = {site: value for site, (value, _) in drawn.items()}
    flat = {}
    for site, (value, dims) in drawn.items():
        event = value.shape[value.dim() - dims :]
        own = value.reshape(*drawn_shape(value, dims), *event)
        flat[site] = own.expand(*sample, *event).reshape(count, *event)
    forward = type(module).forward

    def one(index, views):
        for site, view in views.items():  # every read of a site gets this draw's value
            set_cached_value(module, site, view)
        try:
            with running_draw(Draw(sample, index, values, views)), _NoStatements():
                return forward(module, *args, **kwargs)
        finally:
            for site, value in values.items():
                set_cached_value(module, site, value)

    if vectorised:
        skeletons = []  # the output with its tensors taken out: vmap returns tensors only

        def tensors_of_one(index, views):
            out = one(index, views)
            if isinstance(out, torch.Tensor):
                return out  # the common case, as it is
            skeletons.append(_map_tensors(lambda t: _TENSOR, out))
            return tuple(_tensor_leaves(out))

        index = torch.arange(count, device=_device_of(flat, args))
        out = vmap(tensors_of_one, randomness="different")(index, flat)
        if skeletons:
            leaves = iter(out)
            out = _map_leaves(lambda _: next(leaves), skeletons[-1], leaf=lambda v: v is _TENSOR)
    else:
        outs = [one(i, {site: v[i] for site, v in flat.items()}) for i in range(count)]
        out = _map_tensors(lambda *leaves: torch.stack(leaves), *outs)
    return _map_tensors(lambda t: t.reshape(*sample, *t.shape[1:]), out)


#: Where a tensor was, in an output whose tensors were taken out.
_TENSOR = object()


def _map_leaves(fn: Callable[..., Any], *trees: Any, leaf: Callable[[Any], bool]) -> Any:
    """``fn`` over the ``leaf`` values at the same places of nested tuples, lists and dicts.

    Anything else (``None``, a number) is passed on from the first tree.
    """
    first = trees[0]
    if leaf(first):
        return fn(*trees)
    if isinstance(first, (tuple, list)):
        mapped = [_map_leaves(fn, *parts, leaf=leaf) for parts in zip(*trees, strict=True)]
        return type(first)(mapped) if not hasattr(first, "_fields") else type(first)(*mapped)
    if isinstance(first, dict):
        return {key: _map_leaves(fn, *(tree[key] for tree in trees), leaf=leaf) for key in first}
    return first


def _map_tensors(fn: Callable[..., Any], *trees: Any) -> Any:
    """``fn`` over the tensors at the same places of nested tuples, lists and dicts."""
    return _map_leaves(fn, *trees, leaf=lambda value: isinstance(value, torch.Tensor))


def _tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """The tensors of a nested output, in the order :func:`_map_tensors` visits them."""
    found: list[torch.Tensor] = []
    _map_tensors(found.append, tree)
    return found


def _device_of(flat: Mapping[str, torch.Tensor], args: tuple) -> torch.device:
    for value in (*flat.values(), *args):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _reachable_layers(root: nn.Module) -> list[BayesianLayer]:
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


def _layer_paths(module: nn.Module, path: str) -> Iterator[tuple[nn.Module, str]]:
    """``(module, path)`` of every module, paths as site names write them (wrappers unnamed)."""
    yield module, path
    unnamed = getattr(module, "unnamed_children", ())
    for name, child in module.named_children():
        child_path = path if name in unnamed else join_name(path, name)
        yield from _layer_paths(child, child_path)
