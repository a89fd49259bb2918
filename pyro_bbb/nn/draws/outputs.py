"""A network's output taken apart and put back: the tensors at the leaves of nested containers.

A network may return any nesting of tuples, lists and dicts (named tuples too) whose leaves
are tensors or anything else (``None``, a number). A per-draw pass stacks the tensors of its
draws and passes the other leaves on; ``torch.func.vmap`` returns tensors only, so the
tensors are taken out of one draw's output and put back after. Nothing here knows of
draws or layers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["TENSOR", "map_leaves", "map_tensors", "tensor_leaves"]

#: Where a tensor was, in an output whose tensors were taken out.
TENSOR = object()


def map_leaves(fn: Callable[..., Any], *trees: Any, leaf: Callable[[Any], bool]) -> Any:
    """``fn`` over the ``leaf`` values at the same places of nested tuples, lists and dicts.

    Anything else (``None``, a number) is passed on from the first tree.
    """
    first = trees[0]
    if leaf(first):
        return fn(*trees)
    if isinstance(first, (tuple, list)):
        mapped = [map_leaves(fn, *parts, leaf=leaf) for parts in zip(*trees, strict=True)]
        return type(first)(mapped) if not hasattr(first, "_fields") else type(first)(*mapped)
    if isinstance(first, dict):
        return {key: map_leaves(fn, *(tree[key] for tree in trees), leaf=leaf) for key in first}
    return first


def map_tensors(fn: Callable[..., Any], *trees: Any) -> Any:
    """``fn`` over the tensors at the same places of nested tuples, lists and dicts."""
    return map_leaves(fn, *trees, leaf=lambda value: isinstance(value, torch.Tensor))


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """The tensors of a nested output, in the order :func:`map_tensors` visits them."""
    found: list[torch.Tensor] = []
    map_tensors(found.append, tree)
    return found
