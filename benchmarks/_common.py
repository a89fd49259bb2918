"""The benchmark scripts' harness: what every script repeats, so that a script holds its
problem and its rows.

* The record: the machine a table was measured on (:func:`machine`), the repository's
  folder (:func:`repository_root`).
* Arguments: a script's parser, described by its docstring (:func:`script_parser`), and the
  options of a resumable run (:func:`add_run_arguments`: ``--out``, ``--table``).
* Resumable output: finished runs as JSON lines (:func:`read_rows`, :func:`append_row`), run
  what a file lacks and print its table (:func:`run_missing`); a report's Markdown and JSON
  side by side (:func:`save_report`); a measurement in a process of its own
  (:func:`in_fresh_process`).
* Tables: Markdown (:func:`markdown_table`), rows by their keys (:func:`grouped`), a mean
  with its spread (:func:`mean_error`, :func:`plus_minus`), a table of them over runs
  (:func:`spread_table`).
* Timing: one function's median time (:func:`median_time`), several taking turns
  (:func:`interleaved`), a block's time and the convergence warnings raised in it
  (:class:`Timed`); the stages of an automatic run (:func:`stage_starts`).

Nothing here imports torch or pyro_bbb until a function needs them, so ``--help`` and
``--table`` are instant.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
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


#: The five UCI regression sets' split folders beside the repository (``--uci``'s default,
#: whatever the folder a script is run from).
UCI_FOLDER = repository_root().parent / "shared" / "data" / "uci"


# --------------------------------------------------------------------------------- arguments
def script_parser(doc: str | None) -> argparse.ArgumentParser:
    """A script's parser, described by the first paragraph of its docstring ``doc``."""
    first = (doc or "").strip().split("\n\n", 1)[0]
    return argparse.ArgumentParser(description=" ".join(first.split()))


def add_run_arguments(parser: argparse.ArgumentParser, out: str) -> None:
    """``--out`` (the rows' file, ``out`` by default) and ``--table`` (print it and exit)."""
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--table", action="store_true", help="print the table and exit")


# --------------------------------------------------------------------------- resumable output
def read_rows(path: Path) -> list[dict]:
    """The rows a resumable benchmark wrote to ``path`` (JSON lines), none if it is new."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def append_row(path: Path, row: dict) -> None:
    """Adds one finished run to ``path`` at once, so an interrupted benchmark resumes there."""
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


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


def in_fresh_process(
    command: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float | None = None
) -> dict:
    """Run ``command`` (a measurement that needs a process of its own: a fresh heap, other
    environment variables, torchrun) and read its result, the JSON of its last stdout line.

    Raises:
        RuntimeError: the command failed; the message ends with its stdout and stderr.
    """
    run = subprocess.run(
        list(command), capture_output=True, text=True, env=None if env is None else dict(env),
        timeout=timeout,
    )  # fmt: skip
    if run.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{run.stdout[-2000:]}{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def save_report(folder: Path, name: str, text: str, data: object) -> None:
    """Write ``text`` to ``folder/name.md`` and ``data`` as JSON to ``folder/name.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.md").write_text(text)
    (folder / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")


# ------------------------------------------------------------------------------------ tables
def markdown_table(header: Sequence[str], lines: Iterable[Sequence[object]], *, align: str) -> str:
    """A Markdown table of ``lines`` under ``header``, aligned by ``align``.

    ``align`` has a letter a column: ``"l"`` for words (aligned left), ``"r"`` for figures
    (aligned right); ``"l" * 2 + "r" * 5`` for two columns of names and five of numbers.
    """
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align must be 'l' or 'r' for each of {len(header)} columns: {align!r}")
    rule = ["---" if a == "l" else "---:" for a in align]
    rows = [header, rule, *lines]
    return "\n".join("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)


def grouped(rows: Iterable[dict], columns: Sequence[str]) -> dict[tuple, list[dict]]:
    """The rows by their values of ``columns``, in the order first met."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[c] for c in columns), []).append(row)
    return groups


def mean_error(values: Iterable[float], *, error: str = "sd") -> tuple[float, float]:
    """The mean of ``values`` and their sample standard deviation (``error="sd"``) or the
    mean's standard error (``"se"``, the sd over √n); the error of one value is 0."""
    values = [float(v) for v in values]
    if error not in ("sd", "se"):
        raise ValueError(f"error must be 'sd' or 'se', got {error!r}")
    if len(values) < 2:
        return values[0], 0.0
    sd = statistics.stdev(values)
    return statistics.fmean(values), sd if error == "sd" else sd / math.sqrt(len(values))


def plus_minus(values: Iterable[float], digits: int = 3, *, error: str = "sd") -> str:
    """``"mean ± error"`` of ``values`` (:func:`mean_error`) to ``digits`` decimals."""
    mean, spread = mean_error(values, error=error)
    return f"{mean:.{digits}f} ± {spread:.{digits}f}"


def spread_table(
    rows: Sequence[dict], methods: Iterable[str], columns: Sequence[tuple[str, str, int]]
) -> str:
    """A Markdown table of ``"mean ± sd"`` over runs: a line per method, a column per figure.

    Args:
        rows: One dict per run, with its ``"method"`` and its figures.
        methods: The methods, in the table's order (each must have runs in ``rows``).
        columns: ``(title, key, decimals)`` of each figure.
    """
    lines = []
    for method in methods:
        runs = [r for r in rows if r["method"] == method]
        lines.append((method, *(plus_minus([r[k] for r in runs], d) for _, k, d in columns)))
    header = ("method", *(title for title, _, _ in columns))
    return markdown_table(header, lines, align="l" * len(header))


# ------------------------------------------------------------------------------------ timing
def median_time(
    run: Callable[[], object], repeats: int, *, clock: Callable[[], float] = time.perf_counter
) -> float:
    """The median seconds of ``repeats`` calls of ``run`` on ``clock``, after one untimed."""
    return interleaved({"run": run}, repeats, clock=clock)["run"]


def interleaved(
    runs: Mapping[str, Callable[[], object]],
    repeats: int,
    *,
    clock: Callable[[], float] = time.perf_counter,
    sync: Callable[[], object] = lambda: None,
) -> dict[str, float]:
    """The median seconds of each of ``runs`` over ``repeats`` rounds, taking turns.

    Each run is called once untimed (warm-up: the allocator, lazy set-up), then once a round
    in the order given, so load from elsewhere falls on every run alike. ``sync`` is called
    before the clock stops (``torch.cuda.synchronize`` on a GPU, whose work is asynchronous).
    """
    times: dict[str, list[float]] = {label: [] for label in runs}
    for run in runs.values():
        run()
    for _ in range(repeats):
        for label, run in runs.items():
            start = clock()
            run()
            sync()
            times[label].append(clock() - start)
    return {label: statistics.median(values) for label, values in times.items()}


class Timed:
    """A block's seconds on ``clock`` and the convergence warnings raised in it.

    The warnings are kept rather than shown (every one, not only the first of a place)::

        with Timed() as timed:
            history = bbb.fit(model, guide, x, y)
        timed.seconds, timed.warnings  # CPU seconds; the ConvergenceWarning messages

    Attributes:
        seconds: The block's time on ``clock`` (the process's CPU time by default).
        warnings: The messages of the ``ConvergenceWarning``\\ s raised in the block.
    """

    def __init__(self, clock: Callable[[], float] = time.process_time) -> None:
        self.clock = clock
        self.seconds = 0.0
        self.warnings: list[str] = []

    def __enter__(self) -> Timed:
        self._catching = warnings.catch_warnings(record=True)
        self._caught = self._catching.__enter__()
        warnings.simplefilter("always")
        self._start = self.clock()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = self.clock() - self._start
        self._catching.__exit__(*exc)
        from pyro_bbb.training.convergence import ConvergenceWarning

        self.warnings = [
            str(w.message) for w in self._caught if issubclass(w.category, ConvergenceWarning)
        ]


def stage_starts(history) -> dict[str, int]:
    """The first epoch of each stage of an automatic run (none for a fixed length)."""
    starts: dict[str, int] = {}
    for epoch, stage in enumerate(history.stage):
        if stage:
            starts.setdefault(stage, epoch)
    return starts
