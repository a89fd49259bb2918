"""The runner of a network's ``forward`` once per weight draw: ``vmap``, or a loop.

:class:`PerDrawForward` is the ``forward`` :func:`~pyro_bbb.nn.builders.bayesianize` gives
the root of every network that does not broadcast draws. With several draws it draws every
reachable Bayesian site first, then runs the network's own ``forward`` once per draw with
that draw current (:mod:`~pyro_bbb.nn.draws.current`): vectorised by
:func:`torch.func.vmap`, or one draw after another where ``vmap`` cannot batch the network.
Which of the two, and why, is decided the first time the network meets draws in a training
mode (:mod:`~pyro_bbb.nn.draws.paths` says what its structure tells; the rest is found by
trying ``vmap``), or before training by :func:`settle_draws`. Nothing here knows of guides
or training.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import Message
from torch import nn
from torch.func import vmap

from ..._pyro_compat import set_cached_value, user_class
from ..._random_state import kept_random_state
from ..._shapes import broadcast_shape, sample_dims
from .buffers import kept_buffers
from .current import Draw, drawn_once, running_draw
from .outputs import TENSOR, map_leaves, map_tensors, tensor_leaves
from .paths import (
    DrawPath,
    PerDrawPath,
    is_vmap_limitation,
    layer_paths,
    reachable_layers,
    unbatched_layer,
)

__all__ = ["PerDrawForward", "describe_draws", "draw_path", "per_draw_forward", "settle_draws"]


class PerDrawForward:
    """The ``forward`` :func:`~pyro_bbb.nn.builders.bayesianize` gives a network's root.

    It runs the network's own ``forward`` (its class's, unchanged) on the weights drawn in the
    current Pyro run. With no sample dims that is one call (made at once where the caller
    said so, :func:`~pyro_bbb.nn.draws.one_draw`). With several draws, every
    reachable Bayesian site is drawn first (in the order of ``net.modules()``; a
    :class:`~pyro_bbb.nn.multi_head.MultiHead` draws its body and active head only), and
    the network's ``forward`` runs once per draw: vectorised by :func:`torch.func.vmap`, or
    one draw after another where ``vmap`` has no rule (see :mod:`pyro_bbb.nn.draws`). Every read
    of a site in that pass, a layer's or the ``forward``'s own (``self.out_proj.weight`` in
    ``nn.MultiheadAttention``), gives the current draw's value. Forward hooks of the root
    run once per call, those of the modules inside it once per draw.

    Installed only on networks that do not broadcast draws
    (:func:`~pyro_bbb.nn.draws.paths.broadcasts_draws`), as
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
        if drawn_once():  # the caller put one draw in place: no sample dims to look for
            return forward(module, *args, **kwargs)
        drawn = dict(_draw_sites(module))
        sample = broadcast_shape(*(sample_dims(value, dims) for value, dims in drawn.values()))
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
        """Take the path the structure tells, else try ``vmap`` (backward too); decide."""
        module = self.module
        unbatched = unbatched_layer(module)
        innermost = _Innermost(module)
        backward = _differentiable(module, drawn)
        try:
            if unbatched is not None:
                out = _per_draw_pass(module, drawn, sample, args, kwargs, vectorised=False)
                self._paths[module.training] = PerDrawPath(DrawPath.LOOP, unbatched)
                return out
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
            if unbatched is not None or not is_vmap_limitation(error):
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
    outputs = [t for t in tensor_leaves(out) if t.requires_grad and t.is_floating_point()]
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
        with (
            kept_random_state(net, *args),
            torch.enable_grad(),
            kept_buffers(net),
            poutine.block(),
            _DifferentiableDraws(),
            pyro.plate("draws", 2, dim=plate_dim),
        ):
            net(*args)
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
    for layer in reachable_layers(net):
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
        own = value.reshape(*sample_dims(value, dims), *event)
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
            skeletons.append(map_tensors(lambda t: TENSOR, out))
            return tuple(tensor_leaves(out))

        index = torch.arange(count, device=_device_of(flat, args))
        out = vmap(tensors_of_one, randomness="different")(index, flat)
        if skeletons:
            leaves = iter(out)
            out = map_leaves(lambda _: next(leaves), skeletons[-1], leaf=lambda v: v is TENSOR)
    else:
        outs = [one(i, {site: v[i] for site, v in flat.items()}) for i in range(count)]
        out = map_tensors(lambda *leaves: torch.stack(leaves), *outs)
    return map_tensors(lambda t: t.reshape(*sample, *t.shape[1:]), out)


def _device_of(flat: Mapping[str, torch.Tensor], args: tuple) -> torch.device:
    for value in (*flat.values(), *args):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


class _Innermost:
    """Records the innermost module whose ``forward`` was under way (global hooks)."""

    def __init__(self, root: nn.Module) -> None:
        self._names = dict(layer_paths(root, ""))  # by module
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
