"""A newcomer's first two commands: the README's, the getting-started page's and CI's agree.

``.ci/run`` reads the test command out of the README and runs it in a bare venv before it
installs anything else, so a CI run fails whenever a newcomer's first run would. These tests
keep that chain intact: the command CI extracts is the README's, the getting-started page
gives the same two commands, and nothing is installed before the README's command runs.
"""

import re
import shutil
import subprocess

import pytest

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
