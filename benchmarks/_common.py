"""What the benchmark scripts share: a description of the machine they ran on."""

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
