"""Shared test set-up: a clean Pyro state per test."""

from __future__ import annotations

import pyro
import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """One thread from the start: module-scoped fixtures run before each test's set-up, and
    their fits took 8 times as long on torch's default threads on a busy 2-core machine."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def clean_pyro_state():
    """Every test starts with an empty param store, fixed seeds and validation on."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    torch.set_num_threads(1)  # small nets: one thread is fastest, and robust to a busy machine
    with pyro.validation_enabled(True):
        yield
    pyro.clear_param_store()
