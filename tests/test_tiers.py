"""The tiers of ``tests/tiers.py``: the quick tier by default, every test in one of them."""

import subprocess
import sys

from tests import tiers
from tests.support import REPO


def test_every_entry_of_the_extended_table_names_tests_the_suite_has(request):
    suite = tiers.collection(request.config)
    entries = {(path, test) for path, tests in tiers.EXTENDED.items() for test in tests}
    named = {tiers.extended_entry(nodeid) for nodeid in suite.extended}
    assert entries - named == set(), "tests/tiers.py names tests that are gone or renamed"
    assert suite.quick > 10 * len(suite.extended)  # the quick tier holds nearly every test


def test_a_node_id_is_quick_unless_the_table_names_its_file_test_or_parameter():
    path, tests = next(iter(tiers.EXTENDED.items()))
    test = next(name for name in tests if "[" not in name)
    assert tiers.tier_of(f"{path}::{test}") == "extended"
    assert tiers.tier_of(f"{path}::{test}[a-b]") == "extended"  # every parameter
    assert tiers.tier_of(f"{path}::Class::{test}") == "extended"
    assert tiers.tier_of(f"{path}::{test}_more") == "quick"
    assert tiers.tier_of(f"tests/test_new_file.py::{test}") == "quick"  # new files are quick
    path, tests = next((p, t) for p, t in tiers.EXTENDED.items() if any("[" in n for n in t))
    test = next(name for name in tests if "[" in name)
    base = test.split("[")[0]
    assert tiers.tier_of(f"{path}::{test}") == "extended"
    assert tiers.tier_of(f"{path}::{base}[other]") == "quick"  # only the parameter named


def _collected(*args: str) -> list[str]:
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n0", "-p", "no:cacheprovider",
         *args],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    return [line for line in listed.splitlines() if "::" in line]


def test_the_default_is_the_quick_tier_and_a_marker_expression_or_a_named_test_picks_from_all():
    file = "tests/training/test_distributed.py"
    table = {f"{file}::{test}" for test in tiers.EXTENDED[file]}
    named = f"{file}::test_the_ddp_example_runs_under_torchrun"
    default = _collected(file, named)  # the file's quick tests, and the one named
    assert named in default and not (set(default) - {named}) & table
    picked = {nodeid.split("[")[0] for nodeid in _collected(file, "-m", "not quick")}
    assert picked == table
