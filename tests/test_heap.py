"""Tests of pyro_bbb._heap: asked to, glibc keeps freed memory while fit and predict run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from pyro_bbb import BNN, MeanFieldGuide, _heap, likelihoods, mlp, predict
from pyro_bbb._heap import ENVIRONMENT_VARIABLE, kept_heap

requires_glibc = pytest.mark.skipif(_heap._glibc() is None, reason="needs glibc's malloc")

# Page faults of allocating and filling a tensor of 64 MiB ten times, before and inside
# kept_heap: above glibc's largest mmap threshold (32 MiB) every such block is mapped anew.
# After it, the resident set (the free memory is handed back) and the faults of blocks of
# 256 MiB, more than the heap holds free: mapped on their own again, as before. Whether glibc
# maps such a block on its own (mallinfo2's count of mapped blocks): before, yes; inside, no;
# after, and in a process forked inside, yes again; and whether glibc took the settings of
# after (mallopt accepts each).
_FAULTS = textwrap.dedent(
    """
    import ctypes, json, os, resource, torch
    from pyro_bbb import _heap
    from pyro_bbb._heap import kept_heap

    libc = ctypes.CDLL(None, use_errno=True)
    # pages of 4 KiB whatever the machine's transparent huge pages (PR_SET_THP_DISABLE = 41):
    # the counts below are one fault per page touched
    libc.prctl(41, 1, 0, 0, 0)

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost",
        )]

    libc.mallinfo2.restype = Mallinfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def mapped(mib):
        before = libc.mallinfo2().hblks
        block = libc.malloc(mib * 2**20)
        on_its_own = libc.mallinfo2().hblks > before
        libc.free(block)
        return on_its_own

    def faults(numbers):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            torch.empty(numbers).fill_(1.0)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    def resident_mib():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024

    counts = {"before": faults(16 * 2**20), "mapped_before": mapped(256)}
    with kept_heap() as held:
        counts["inside"] = faults(16 * 2**20)
        counts["resident_inside"] = resident_mib()
        counts["mapped_inside"] = mapped(256)
        read, write = os.pipe()
        if os.fork() == 0:
            os.write(write, json.dumps(mapped(256)).encode())
            os._exit(0)
        os.close(write)
        counts["mapped_in_child"] = json.loads(os.read(read, 100))
        os.wait()
    counts["resident_after"] = resident_mib()
    counts["after_large"] = faults(64 * 2**20)
    counts["mapped_after"] = mapped(256)
    counts["settings_after_taken"] = _heap._set(_heap._AFTER)
    counts["held"] = held
    print(json.dumps(counts))
    """
)


@pytest.fixture(scope="module")
def faults() -> dict:
    """What :data:`_FAULTS` counts, in a fresh process that asks for the kept heap."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environment.pop("GLIBC_TUNABLES", None)
    environment[ENVIRONMENT_VARIABLE] = "1"
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS], check=True, capture_output=True, text=True, env=environment
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


requires_mallinfo2 = pytest.mark.skipif(
    _heap._glibc() is None or not hasattr(_heap._glibc(), "mallinfo2"),
    reason="needs glibc 2.33 or later (mallinfo2)",
)


@requires_mallinfo2
def test_freed_blocks_above_glibcs_mmap_ceiling_are_reused_inside_and_returned_after(faults):
    counts = faults
    assert counts["held"]
    pages = 10 * 64 * 2**20 // 4096  # one fault per page touched when every block is new
    assert counts["before"] > 0.9 * pages
    assert counts["inside"] < 0.3 * pages  # the first blocks' pages only
    # the heap held at least one block (64 MiB) inside, and handed it back on leaving
    assert counts["resident_inside"] - counts["resident_after"] > 48
    assert counts["after_large"] > 0.9 * 4 * pages


@requires_mallinfo2
def test_after_the_heap_was_kept_and_in_a_forked_child_glibc_maps_large_blocks_again(faults):
    """What stays changed: the thresholds where glibc's adjustment ends, fixed (module notes)."""
    counts = faults
    assert counts["mapped_before"] and not counts["mapped_inside"]
    assert counts["mapped_after"] and counts["settings_after_taken"]
    # a process forked while the heap is kept (a DataLoader's worker) starts as after
    assert counts["mapped_in_child"]


def test_by_default_glibcs_settings_are_left_alone(monkeypatch):
    calls: list[tuple] = []
    monkeypatch.setattr(_heap, "_set", lambda settings: calls.append(settings) or True)
    monkeypatch.setattr(_heap, "_glibc", lambda: object())
    monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    with kept_heap() as held:
        assert not held
    assert calls == []


@pytest.mark.parametrize(
    "variable, value",
    [
        (ENVIRONMENT_VARIABLE, "0"),
        (ENVIRONMENT_VARIABLE, "off"),
        ("MALLOC_MMAP_THRESHOLD_", "65536"),
        ("MALLOC_TRIM_THRESHOLD_", "0"),
        ("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0:glibc.malloc.mmap_max=0"),
        ("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
    ],
)
def test_the_environment_can_turn_it_off_or_configure_glibc_itself(monkeypatch, variable, value):
    calls: list[tuple] = []
    monkeypatch.setattr(_heap, "_set", lambda settings: calls.append(settings) or True)
    monkeypatch.setattr(_heap, "_glibc", lambda: object())
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "1")  # asked for, but not given
    monkeypatch.setenv(variable, value)
    with kept_heap() as held:
        assert not held
    assert calls == []


def test_other_glibc_tunables_leave_it_on(monkeypatch, plain_environment):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0")
    assert _heap._wanted()
    monkeypatch.delenv(ENVIRONMENT_VARIABLE)
    assert not _heap._wanted()


def test_a_bad_value_of_the_environment_variable_is_refused(monkeypatch):
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "sometimes")
    refused = pytest.raises(ValueError, match=r"PYRO_BBB_KEEP_HEAP='sometimes': expected 0 or 1")
    with refused, kept_heap():
        pass


def test_on_another_c_library_nothing_is_done(monkeypatch):
    monkeypatch.setattr(_heap, "_glibc", lambda: None)
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "1")
    with kept_heap() as held:
        assert not held


@pytest.fixture
def plain_environment(monkeypatch):
    """Kept heap asked for; no variable that configures glibc's malloc itself."""
    for name in ("GLIBC_TUNABLES", "LD_PRELOAD", *_heap._GLIBC_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "1")


@requires_glibc
@pytest.mark.usefixtures("plain_environment")
def test_nested_holders_restore_once_the_last_one_leaves(monkeypatch):
    calls: list[tuple] = []
    monkeypatch.setattr(_heap, "_set", lambda settings: calls.append(settings) or True)
    monkeypatch.setattr(_heap._glibc(), "malloc_trim", lambda pad: 1)
    with kept_heap() as outer:
        with kept_heap() as inner:
            assert outer and inner
        assert calls == [_heap._KEEP]
    assert calls == [_heap._KEEP, _heap._AFTER]
    assert _heap._depth == 0


@pytest.mark.usefixtures("plain_environment")
def test_predict_keeps_the_heap_across_its_chunks_only(monkeypatch):
    calls: list[tuple] = []
    monkeypatch.setattr(_heap, "_set", lambda settings: calls.append(settings) or True)
    monkeypatch.setattr(_heap, "_glibc", lambda: SimpleNamespace(malloc_trim=lambda pad: 1))
    model = BNN(mlp([2, 4, 1]), likelihoods.Gaussian(), num_data=10)
    guide = MeanFieldGuide(model)
    x = torch.randn(10, 2)
    predict(model, guide, x, num_samples=3)
    assert calls == []  # one pass: nothing to reuse
    predict(model, guide, x, num_samples=3, batch_size=4)
    assert calls == [_heap._KEEP, _heap._AFTER]
