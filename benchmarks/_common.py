"""What the benchmark scripts share: the machine they ran on, rows kept across runs, reports."""

import argparse
import json
import platform
from collections.abc import Callable, Iterable, Sequence
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


def add_run_arguments(parser: argparse.ArgumentParser, out: str) -> None:
    """``--out`` (the rows' file, ``out`` by default) and ``--table`` (print it and exit)."""
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--table", action="store_true", help="print the table and exit")


def run_missing(
    args: argparse.Namespace,
    runs: Iterable[tuple[dict, Callable[[], dict]]],
    *,
    table: Callable[[list[dict]], str],
    describe: Callable[[dict], str],
) -> None:
    """Run what ``args.out`` lacks, one row a run, then print the table of all its rows.

    Each of ``runs`` is ``(key, run)``: the columns that name the run (``{"problem": ...,
    "seed": ...}``) and what makes its row; a run whose key a row of ``args.out`` already
    has is skipped, so an interrupted benchmark resumes. Each row is written at once and
    told by ``describe``. With ``args.table`` only the table is printed.
    """
    done = read_rows(args.out)
    if args.table:
        print(table(done))
        return
    import torch

    torch.set_num_threads(1)
    for key, run in runs:
        if any(all(row.get(k) == v for k, v in key.items()) for row in done):
            continue
        row = run()
        append_row(args.out, row)
        print(describe(row), flush=True)
    print(table(read_rows(args.out)))


def grouped(rows: Iterable[dict], columns: Sequence[str]) -> dict[tuple, list[dict]]:
    """The rows by their values of ``columns``, in the order first met."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[c] for c in columns), []).append(row)
    return groups


def markdown_table(header: Sequence[str], lines: Iterable[Sequence[object]], *, text: int) -> str:
    """A Markdown table of ``lines`` under ``header``: ``text`` columns of words, then numbers.

    The first ``text`` columns are aligned left, the rest (the figures) right.
    """
    rule = ["---"] * text + ["---:"] * (len(header) - text)
    rows = [header, rule, *lines]
    return "\n".join("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)


def stage_starts(history) -> dict[str, int]:
    """The first epoch of each stage of an automatic run (none for a fixed length)."""
    starts: dict[str, int] = {}
    for epoch, stage in enumerate(history.stage):
        if stage:
            starts.setdefault(stage, epoch)
    return starts
