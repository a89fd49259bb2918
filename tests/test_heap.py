"""Tests of pyro_bbb._heap: glibc keeps freed memory while fit and predict run, then not."""

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
# 256 MiB, more than the heap holds free: mapped on their own again, as before.
_FAULTS = textwrap.dedent(
    """
    import ctypes, json, resource, torch
    from pyro_bbb._heap import kept_heap

    # pages of 4 KiB whatever the machine's transparent huge pages (PR_SET_THP_DISABLE = 41):
    # the counts below are one fault per page touched
    ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0)

    def faults(numbers):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            torch.empty(numbers).fill_(1.0)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    def resident_mib():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024

    counts = {"before": faults(16 * 2**20)}
    with kept_heap() as held:
        counts["inside"] = faults(16 * 2**20)
        counts["resident_inside"] = resident_mib()
    counts["resident_after"] = resident_mib()
    counts["after_large"] = faults(64 * 2**20)
    counts["held"] = held
    print(json.dumps(counts))
    """
)


def _faults() -> dict:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environment.pop(ENVIRONMENT_VARIABLE, None)
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS], check=True, capture_output=True, text=True, env=environment
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@requires_glibc
def test_freed_blocks_above_glibcs_mmap_ceiling_are_reused_inside_and_returned_after():
    counts = _faults()
    assert counts["held"]
    pages = 10 * 64 * 2**20 // 4096  # one fault per page touched when every block is new
    assert counts["before"] > 0.9 * pages
    assert counts["inside"] < 0.3 * pages  # the first blocks' pages only
    # the heap held at least one block (64 MiB) inside, and handed it back on leaving
    assert counts["resident_inside"] - counts["resident_after"] > 48
    assert counts["after_large"] > 0.9 * 4 * pages


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
    monkeypatch.setenv(variable, value)
    with kept_heap() as held:
        assert not held
    assert calls == []


def test_other_glibc_tunables_leave_it_on(monkeypatch, plain_environment):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0")
    assert _heap._wanted()


def test_a_bad_value_of_the_environment_variable_is_refused(monkeypatch):
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, "sometimes")
    refused = pytest.raises(ValueError, match=r"PYRO_BBB_KEEP_HEAP='sometimes': expected 0 or 1")
    with refused, kept_heap():
        pass


def test_on_another_c_library_nothing_is_done(monkeypatch):
    monkeypatch.setattr(_heap, "_glibc", lambda: None)
    monkeypatch.delenv(ENVIRONMENT_VARIABLE, raising=False)
    with kept_heap() as held:
        assert not held


@pytest.fixture
def plain_environment(monkeypatch):
    """No variable that turns kept_heap off or configures glibc's malloc."""
    for name in (ENVIRONMENT_VARIABLE, "GLIBC_TUNABLES", "LD_PRELOAD", *_heap._GLIBC_VARIABLES):
        monkeypatch.delenv(name, raising=False)


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
