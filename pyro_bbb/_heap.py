"""Keep the memory a training step frees, for the next step (glibc's malloc only).

A CPU step allocates and frees the same temporaries every time: activations, their
gradients, the estimators' noise. With glibc's default settings a block of more than its
mmap threshold (128 KiB at first, raised by glibc up to 32 MiB as large blocks are freed)
is its own ``mmap``; freeing it unmaps it, and the next step's block of the same size is
mapped again and takes a page fault, and the kernel zeroes a page, per 4 KiB it touches.
Freed memory at the top of the heap is also handed back to the OS above the trim
threshold. On a large full batch that is most of the step: an ensemble of five 9-100-1
networks on 41,000 rows under local reparameterisation, activations of 78 MiB each, spent
1.6 times as long in the kernel as in its own arithmetic, about 360,000 faults a step.

:func:`kept_heap` holds glibc's settings for the time it is entered: no block is mapped on
its own (``M_MMAP_MAX`` = 0: every block comes from the heap) and the heap is never trimmed
(``M_TRIM_THRESHOLD`` = 2 GiB - 1), so a step reuses the memory the previous one freed. On
leaving it sets ``M_MMAP_MAX`` back to glibc's default (65,536) and the trim threshold to
64 MiB, and hands the free memory back to the OS (``malloc_trim(0)``). glibc cannot report
its settings, so the previous trim threshold cannot be restored as such: 64 MiB is where
glibc's own adjustment ends in a process that has freed a block of 32 MiB or more (as a
PyTorch process soon does); the mmap threshold is left where glibc had it. The settings are
the process's, not the thread's: while a fit runs, other threads' allocations keep their
memory too.

Nothing changes in the arithmetic (fits are bit for bit the same) and nothing is done on a
C library other than glibc (musl, macOS), when Python runs on another allocator preloaded
in place of glibc's (jemalloc, tcmalloc: they keep freed memory themselves), when glibc's
malloc settings were given through the environment (``MALLOC_MMAP_MAX_``,
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_`` or the same
four ``glibc.malloc.*`` tunables in ``GLIBC_TUNABLES``: those are left as given), or when
the environment variable ``PYRO_BBB_KEEP_HEAP`` is ``0``.

What it costs is memory: the heap keeps what the largest step held, and more, because it
cannot always reuse a freed block. PyTorch allocates with 64-byte alignment, so glibc cuts
a few dozen bytes off each large block; they sit in glibc's per-thread cache (tcache) as
if in use, keep the freed blocks around them from merging, and a block of the same size no
longer fits the gap it left. On the ensemble above the process's peak rose from 889 MiB to
1,700-1,950 MiB (the step holds about 570 MiB live); started with
``GLIBC_TUNABLES=glibc.malloc.tcache_count=0`` (the cache can only be set when the process
starts) the same fit peaked at 1,030-1,100 MiB, as fast (``docs/performance.md`` has the
figures).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["ENVIRONMENT_VARIABLE", "kept_heap"]

#: Set to ``0`` (or ``false``, ``no``, ``off``) to leave glibc's malloc settings alone.
ENVIRONMENT_VARIABLE = "PYRO_BBB_KEEP_HEAP"

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt's parameters, from glibc's malloc.h
_KEEP = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1))
_AFTER = ((_M_MMAP_MAX, 65536), (_M_TRIM_THRESHOLD, 64 * 2**20))
_GLIBC_VARIABLES = (
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
)
_GLIBC_TUNABLES = tuple(
    f"glibc.malloc.{name}" for name in ("mmap_max", "mmap_threshold", "trim_threshold", "top_pad")
)
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
_OFF, _ON = ("0", "false", "no", "off"), ("", "1", "true", "yes", "on")

_lock = threading.Lock()
_depth = 0  # nested and concurrent holders: the first sets, the last restores


@functools.cache
def _glibc() -> Any | None:
    """The C library if it is glibc (``mallopt``, ``malloc_trim``), else ``None``."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc's own symbol: musl and macOS lack it)
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def _wanted() -> bool:
    """Whether the environment allows :func:`kept_heap` to act (see the module's notes).

    Raises:
        ValueError: If ``PYRO_BBB_KEEP_HEAP`` holds something other than a yes or no.
    """
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower()
    if value not in _OFF + _ON:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE}={os.environ[ENVIRONMENT_VARIABLE]!r}: expected 0 or 1 "
            "(0 leaves glibc's malloc settings alone during fit and predict)"
        )
    if value in _OFF:
        return False
    preloaded = os.environ.get("LD_PRELOAD", "")
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return (
        not any(name in tunables for name in _GLIBC_TUNABLES)
        and not any(name in os.environ for name in _GLIBC_VARIABLES)
        and not any(name in preloaded for name in _OTHER_ALLOCATORS)
    )


def _set(settings: tuple[tuple[int, int], ...]) -> bool:
    libc = _glibc()
    return all(libc.mallopt(parameter, value) == 1 for parameter, value in settings)


@contextmanager
def kept_heap(active: bool = True) -> Iterator[bool]:
    """Keep the memory the process frees while inside, on glibc; see the module's notes.

    Re-entrant and thread-safe: the first holder sets the settings, the last one to leave
    restores them and returns the free memory to the OS.

    Args:
        active: ``False`` to do nothing (``fit`` on a GPU: its host memory is not the step's).

    Yields:
        Whether glibc's settings are held (``False`` on another C library, when the
        environment configures glibc's malloc or sets ``PYRO_BBB_KEEP_HEAP=0``, or when
        ``active`` is false).
    """
    global _depth
    if not active or not _wanted() or _glibc() is None:
        yield False
        return
    with _lock:
        _depth += 1
        held = _depth > 1 or _set(_KEEP)
    try:
        yield held
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _set(_AFTER)
                _glibc().malloc_trim(0)
