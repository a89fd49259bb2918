"""Shared test set-up: a clean Pyro state per test, and the tiers of ``tests/tiers.py``.

``python -m pytest -q`` runs the quick tier; ``--tier=extended`` the tests CI adds,
``--tier=all`` every test. Without ``--tier``, a ``-m`` expression picks from every test
(``-m slow``, ``-m "not quick"``), and a test named on the command line by its id runs
whatever its tier.
"""

from __future__ import annotations

from pathlib import Path

import pyro
import pytest
import torch

from tests import tiers

TESTS = Path(__file__).resolve().parent


def pytest_addoption(parser):
    parser.addoption(
        "--tier",
        choices=("quick", "extended", "all"),
        default=None,
        help="quick: the README's tests (the default without -m); extended: the tests CI adds "
        "(statistical checks at size, NUTS chains, several processes); all: every test",
    )


def _tier(config) -> str:
    return config.getoption("tier") or ("all" if config.getoption("markexpr") else "quick")


def _named(config) -> list[tuple[Path, str]]:
    """The tests named by id on the command line: ``(file, the id after the file)``."""
    named = []
    for arg in config.args:
        path, sep, rest = arg.partition("::")
        if sep:
            named.append((Path(config.invocation_params.dir, path).resolve(), rest))
    return named


@pytest.hookimpl(tryfirst=True)  # before -m and -k select, so that they see the tier markers
def pytest_collection_modifyitems(config, items):
    extended = set()
    for item in items:
        entry = tiers.extended_entry(item.nodeid)
        if entry is None:
            item.add_marker(tiers.QUICK)
        else:
            item.add_marker(pytest.mark.extended(reason=tiers.EXTENDED[entry[0]][entry[1]]))
            extended.add(item.nodeid)
    if set(TESTS.rglob("test_*.py")) <= {item.path for item in items}:
        quick = len(items) - len(extended)
        config.stash[tiers.COLLECTION] = tiers.Collection(quick, frozenset(extended))

    tier = _tier(config)
    if tier == "all":
        return
    named = _named(config)

    def chosen(item) -> bool:
        if item.get_closest_marker(tier) is not None:
            return True
        tail = item.nodeid.partition("::")[2]
        return any(
            item.path == path and (tail == rest or tail.startswith((f"{rest}[", f"{rest}::")))
            for path, rest in named
        )

    keep = [item for item in items if chosen(item)]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not chosen(item)])
        items[:] = keep


def pytest_terminal_summary(terminalreporter, config):
    if _tier(config) == "quick" and not hasattr(config, "workerinput"):
        terminalreporter.write_line(
            "the quick tier ran: --tier=all runs every test, as CI does (tests/tiers.py)"
        )


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
