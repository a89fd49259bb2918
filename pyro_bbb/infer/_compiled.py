r"""Kernels compiled by ``torch.compile``'s CPU code generation, and the fallback to eager torch.

A step bound by memory traffic (a low-rank factor four times the size of the weights, read and
written a dozen times a step) gains from doing one pass where eager torch does one per
operation. :class:`CompiledKernel` wraps a function of tensors written in plain torch
operations: on its first call on the CPU it is compiled by ``torch.compile`` (Inductor writes
one vectorised C++ loop for the whole function and builds it with the machine's C++
compiler; the build is cached on disk, so a later process loads it in a few seconds), and
every call after runs the compiled loop. Results are those of the plain function up to the
order of floating-point sums.

Nothing is required at import: ``torch.compile`` is only called on first use. Where it
cannot work the plain function runs instead, the same arithmetic in eager torch, and one
warning says why, once per process and reason:

* the tensors are not on the CPU (on CUDA the compiled kernels have never run: the
  callers take their eager path there);
* compiling failed (no C++ compiler, an unsupported platform or Python): the first
  call's error is named;
* the environment variable ``PYRO_BBB_COMPILE=0`` turned compiled kernels off.

The callers decide where a kernel pays (large blocks); this module decides whether it can
run.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ENVIRONMENT_VARIABLE", "CompiledKernel", "compiling_enabled", "say_once"]

#: Set to ``0`` (``false``, ``no``, ``off``) to run the plain functions, never compiling.
ENVIRONMENT_VARIABLE = "PYRO_BBB_COMPILE"

_OFF = ("0", "false", "no", "off")
_warned: set[str] = set()
_lock = threading.Lock()


def compiling_enabled() -> bool:
    """Whether ``PYRO_BBB_COMPILE`` leaves compiled kernels on (the default)."""
    return os.environ.get(ENVIRONMENT_VARIABLE, "1").strip().lower() not in _OFF


def say_once(reason: str, message: str, *, stacklevel: int = 4) -> None:
    """Warn ``message`` once a process for ``reason`` (``stacklevel`` as ``warnings.warn``'s)."""
    with _lock:
        if reason in _warned:
            return
        _warned.add(reason)
    warnings.warn(message, UserWarning, stacklevel=stacklevel)


class CompiledKernel:
    """``fn`` compiled on its first call on the CPU; ``fn`` itself where that cannot be.

    Args:
        fn: A function of tensors (and numbers), plain torch operations, no side effects.
        name: What it computes, for the messages.
    """

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn, self.name = fn, name
        self._compiled: Callable[..., Any] | None = None
        #: Why the compiled kernel does not run in this process, once that is known.
        self.failure: str | None = None

    def runs_compiled(self, like: torch.Tensor) -> bool:
        """Whether a call on tensors like ``like`` runs the compiled kernel (says why not, once).

        ``False`` on a device other than the CPU, with ``PYRO_BBB_COMPILE=0``, or after
        compiling failed in this process.
        """
        if like.device.type != "cpu":
            say_once(
                f"{self.name}:{like.device.type}",
                f"{self.name}: the compiled kernel runs on the CPU only and has never run on "
                f"{like.device.type}; the eager path (the same arithmetic) runs there",
            )
            return False
        return compiling_enabled() and self.failure is None

    def __call__(self, *args: Any) -> Any:
        """The compiled kernel's result, or ``fn``'s where compiling fails (said once)."""
        if self.failure is not None or not compiling_enabled():
            return self.fn(*args)
        try:
            if self._compiled is None:
                self._compiled = torch.compile(self.fn, dynamic=True, fullgraph=True)
            return self._compiled(*args)
        except Exception as error:  # a missing compiler, an unsupported platform, ...
            self.failure = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
            say_once(
                f"{self.name}:failed",
                f"{self.name}: torch.compile could not build the compiled kernel here "
                f"({self.failure[:300]}); the eager path (the same arithmetic, slower) runs "
                f"instead. Set {ENVIRONMENT_VARIABLE}=0 to skip the attempt",
            )
            return self.fn(*args)
