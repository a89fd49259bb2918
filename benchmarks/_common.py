"""What the benchmark scripts share: the machine they ran on, rows kept across runs."""

import json
import platform
from pathlib import Path


def machine() -> str:
    """The CPU model, for the record."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def repository_root() -> Path:
    """The repository's folder (the benchmarks' parent)."""
    return Path(__file__).resolve().parents[1]


def read_rows(path: Path) -> list[dict]:
    """The rows a resumable benchmark wrote to ``path`` (JSON lines), none if it is new."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def append_row(path: Path, row: dict) -> None:
    """Adds one finished run to ``path`` at once, so an interrupted benchmark resumes there."""
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
