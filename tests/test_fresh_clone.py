"""A newcomer's first two commands: the README's, the getting-started page's and CI's agree.

``.ci/run`` reads the test command out of the README and runs it in a bare venv before it
installs anything else, so a CI run fails whenever a newcomer's first run would. These tests
keep that chain intact: the command CI extracts is the README's, the getting-started page
gives the same two commands, nothing is installed before the README's command runs, and CI
runs the other tier after it. The README's figures for its test command are checked against
the suite itself: the counts against what the quick tier collects.
"""

import re
import shutil
import subprocess

import pytest

from tests import tiers
from tests.support import REPO

CI = REPO / ".ci" / "run"


def _commands(markdown: str) -> dict[str, str]:
    """The one-line ```bash blocks that follow the lines "Demo..." and "Tests..."."""
    found = {}
    for label in ("Demo", "Tests"):
        match = re.search(rf"^{label}\b.*?\n```bash\n(.+?)\n```", markdown, re.M | re.S)
        assert match, f"no ```bash block after a line starting with {label!r}"
        found[label] = match.group(1)
    return found


def test_the_getting_started_page_gives_the_readme_commands():
    readme = _commands((REPO / "README.md").read_text())
    page = _commands((REPO / "docs" / "getting_started.md").read_text())
    assert page == readme
    assert readme["Tests"] == (
        'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q'
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="CI's script is a bash script")
def test_ci_runs_the_readme_test_command_as_written():
    script = CI.read_text()
    awk = re.search(r"test_command=\"\$\(awk '(.+?)' README.md\)\"", script)
    assert awk, "CI no longer reads its test command from the README"
    extracted = subprocess.run(
        ["awk", awk.group(1), "README.md"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert extracted == _commands((REPO / "README.md").read_text())["Tests"]


def test_ci_installs_nothing_before_the_readme_test_command():
    lines = CI.read_text().splitlines()
    runs = next(i for i, line in enumerate(lines) if line.startswith("bash -euo pipefail -c"))
    before = [line for line in lines[:runs] if not line.lstrip().startswith("#")]
    assert not [line for line in before if re.search(r"\bpip\b", line)], before
    assert any(line.startswith("python3 -m venv") for line in before), "CI makes no bare venv"


def test_ci_runs_the_extended_tier_after_the_readme_test_command():
    lines = CI.read_text().splitlines()
    runs = next(i for i, line in enumerate(lines) if line.startswith("bash -euo pipefail -c"))
    assert "python -m pytest -q --tier=extended" in lines[runs:]


#: The README's figures for its test command, from one run of it as written.
FIGURES = re.compile(
    r"one run of it as written on a clean clone in a fresh venv on (?P<date>\d{4}-\d\d-\d\d) "
    r".*?about (?P<install>\d+) s to install and (?P<run>\d+) s to run the quick tier "
    r"\((?P<cpu>\d+) s of CPU\)"
    r".*?(?P<passed>\d[\d,]*) passed, (?P<skipped>\d+) skipped"
    r".*?the extended tier \(.*?: (?P<extended>\d+) tests"
)


def _readme_figures() -> dict[str, str]:
    match = FIGURES.search(" ".join((REPO / "README.md").read_text().split()))
    assert match, "the README's figures for its test command are not found"
    return match.groupdict()


def test_the_readmes_counts_are_what_its_test_command_collects(request):
    figures = _readme_figures()
    suite = tiers.collection(request.config)
    passed, skipped = int(figures["passed"].replace(",", "")), int(figures["skipped"])
    assert passed + skipped == suite.quick, (
        f"the README gives {passed} passed and {skipped} skipped; the quick tier collects "
        f"{suite.quick} tests: run the README's test command on a clean clone and give its figures"
    )
    assert int(figures["extended"]) == len(suite.extended)


def test_the_readmes_quick_tier_fits_in_three_minutes_of_two_cores():
    # its CPU time, which a busy machine inflates least; more, and tests move to the extended
    # tier (tests/tiers.py)
    assert int(_readme_figures()["cpu"]) <= 2 * 180


def test_the_getting_started_page_gives_the_readmes_figures():
    # two pages once gave the same command 70 s / 5 min 12 s and 54 s / 2 min 8 s
    figures = _readme_figures()
    page = " ".join((REPO / "docs" / "getting_started.md").read_text().split())
    assert f"about {figures['install']} s to install and {figures['run']} s to run" in page
    for figure in ("passed", "skipped", "date", "extended"):
        assert figures[figure] in page, figure
