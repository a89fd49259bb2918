"""Keep the memory a training step frees, for the next step (glibc's malloc; opt-in).

A CPU step allocates and frees the same temporaries every time: activations, their
gradients, the estimators' noise. With glibc's default settings a block of more than its
mmap threshold (128 KiB at first, raised by glibc up to 32 MiB as large blocks are freed)
is its own ``mmap``; freeing it unmaps it, and the next step's block of the same size is
mapped again and takes a page fault, and the kernel zeroes a page, per 4 KiB it touches.
Freed memory at the top of the heap is also handed back to the OS above the trim
threshold. On a large full batch that is most of the step: an ensemble of five 9-100-1
networks on 41,000 rows under local reparameterisation, activations of 78 MiB each, spent
1.4-1.8 times as long in the kernel as in its own arithmetic, about 360,000 faults a step.

**Opt-in.** Set the environment variable ``PYRO_BBB_KEEP_HEAP=1`` and :func:`kept_heap`
(which :func:`~pyro_bbb.fit` holds around its epochs on the CPU, and a chunked
:func:`~pyro_bbb.predict` around its chunks) holds glibc's settings while it is entered:
no block is mapped on its own (``M_MMAP_MAX`` = 0: every block comes from the heap) and
the heap is never trimmed (``M_TRIM_THRESHOLD`` = 2 GiB - 1), so a step reuses the memory
the previous one freed. Unset or ``0``, nothing is done: these settings are the process's,
not the fit's, and a library should not change its host process behind its back.

**What it changes, exactly.** While held: every thread's allocations keep their freed
memory (the settings are process-wide; glibc has no per-thread form). On leaving: the free
memory is handed back to the OS (``malloc_trim(0)``) and the settings are put where glibc's
own adjustment leaves a process that has freed a block of 32 MiB (as a PyTorch process
soon does): ``M_MMAP_MAX`` 65,536 (glibc's default), ``M_MMAP_THRESHOLD`` 32 MiB and
``M_TRIM_THRESHOLD`` 64 MiB. What cannot be put back is glibc's adjustment itself: setting
any of them turns it off for the life of the process (mallopt(3)), so after the first fit
that kept its heap these thresholds stay fixed. A process forked while the heap is held
(a ``DataLoader``'s workers under the ``fork`` start method) starts with the settings of
after a fit, and hands back the free memory it inherited.

Nothing changes in the arithmetic (fits are bit for bit the same) and nothing is done on a
C library other than glibc (musl, macOS), when Python runs on another allocator preloaded
in place of glibc's (jemalloc, tcmalloc: they keep freed memory themselves), or when
glibc's malloc settings were given through the environment (``MALLOC_MMAP_MAX_``,
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_`` or the same
four ``glibc.malloc.*`` tunables in ``GLIBC_TUNABLES``: those are left as given).

What it costs is memory: the heap keeps what the largest step held, and more, because it
cannot always reuse a freed block. PyTorch allocates with 64-byte alignment, so glibc cuts
a few dozen bytes off each large block; they sit in glibc's per-thread cache (tcache) as
if in use, keep the freed blocks around them from merging, and a block of the same size no
longer fits the gap it left. On the ensemble above the process's peak rose from 888 MiB to
1,650-1,890 MiB (the step holds about 570 MiB live); started with
``GLIBC_TUNABLES=glibc.malloc.tcache_count=0`` (the cache can only be set when the process
starts) the same fit peaked at 1,026-1,100 MiB, as fast. Keeping the memory without
glibc's settings (a free region reserved at the top of the heap for the fit, held in place
by a block above it) fragments the same way: 2,210 MiB with a region of 2 GiB (the kernel's
time 6 % of the step's), or, bounded to 1 GiB, 1,580 MiB and 40 % (``docs/performance.md``
has the figures). So it stays glibc's settings, asked for.
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

#: Set to ``1`` (or ``true``, ``yes``, ``on``) to keep the heap; unset or ``0`` (``false``,
#: ``no``, ``off``) leaves glibc's malloc settings alone.
ENVIRONMENT_VARIABLE = "PYRO_BBB_KEEP_HEAP"

# mallopt's parameters, from glibc's malloc.h
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
_KEEP = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1))
# after: glibc's default M_MMAP_MAX, and the thresholds where glibc's own adjustment ends
# on 64-bit (an mmap threshold of 32 MiB, DEFAULT_MMAP_THRESHOLD_MAX; a trim threshold twice that)
_AFTER = ((_M_MMAP_MAX, 65536), (_M_MMAP_THRESHOLD, 32 * 2**20), (_M_TRIM_THRESHOLD, 64 * 2**20))
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
_OFF, _ON = ("", "0", "false", "no", "off"), ("1", "true", "yes", "on")

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
    """Whether the environment asks :func:`kept_heap` to act (see the module's notes).

    Raises:
        ValueError: If ``PYRO_BBB_KEEP_HEAP`` holds something other than a yes or no.
    """
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower()
    if value not in _OFF + _ON:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE}={os.environ[ENVIRONMENT_VARIABLE]!r}: expected 0 or 1 "
            "(1 has glibc's malloc keep the memory fit and predict free on the CPU, 0 or "
            "unset leaves its settings alone)"
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
    """Keep the memory the process frees while inside, on glibc, if asked; see the module.

    Re-entrant and thread-safe: the first holder sets the settings, the last one to leave
    puts them where the module's notes say and returns the free memory to the OS.

    Args:
        active: ``False`` to do nothing (``fit`` on a GPU: its host memory is not the step's).

    Yields:
        Whether glibc's settings are held: only with ``PYRO_BBB_KEEP_HEAP=1``, on glibc,
        when the environment does not configure glibc's malloc itself and ``active`` is
        true.
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
                _release()


def _release() -> None:
    """Glibc's settings of after a fit, and the free memory handed back to the OS."""
    _set(_AFTER)
    _glibc().malloc_trim(0)


def _in_forked_child() -> None:
    """A process forked while the heap was held does not keep it (nor the parent's lock)."""
    global _depth, _lock
    _lock = threading.Lock()
    if _depth:
        _depth = 0
        _release()


os.register_at_fork(after_in_child=_in_forked_child)
