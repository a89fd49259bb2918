"""Kernel time and page faults of large full-batch fits, with fit keeping its heap or not.

Each configuration runs ``pyro_bbb.fit`` in a fresh process: with glibc's defaults (``fit``'s
default, no ``PYRO_BBB_KEEP_HEAP``), with glibc's malloc settings held by ``fit``
(``PYRO_BBB_KEEP_HEAP=1``), and the same with glibc's per-thread cache off
(``GLIBC_TUNABLES=glibc.malloc.tcache_count=0``, which only the environment of a new process
can set), and reports from ``getrusage`` of the fit itself: wall time, user and system CPU
time, minor page faults, and the process's peak resident set. It also checks that the fits
end with the same History and parameters, bit for bit (``same result``: as the first row's).

The problem is the UCI protein set's shape: 41,000 rows x 9 features (synthetic,
standard normal features and a smooth target), a 9-100-1 ReLU network, the full batch,
``reparam="local"``, one weight sample a step, a ``MeanFieldGuide`` (``bnn``) or an
``Ensemble`` of five (``ensemble``).

    python benchmarks/heap.py [--configs bnn,ensemble] [--epochs 60] [--threads 1]
    python benchmarks/heap.py --protein-like DIR   # a split folder of protein's shape
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
from pathlib import Path

import pyro
import torch
from _common import in_fresh_process, machine, markdown_table, script_parser

import pyro_bbb
from pyro_bbb.infer import Ensemble

ROWS, FEATURES, HIDDEN, MEMBERS = 41_000, 9, 100, 5


def data(rows: int = ROWS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard normal features and a smooth target with noise, ``(rows, 9)`` and ``(rows,)``."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, FEATURES, generator=generator)
    signal = torch.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] - 0.3 * x[:, 3:].sum(-1)
    return x, signal + 0.3 * torch.randn(rows, generator=generator)


def one_fit(config: str, epochs: int) -> dict:
    """Fit one configuration in this process; what getrusage saw of the fit."""
    pyro.set_rng_seed(0)
    x, y = data()
    model = pyro_bbb.BNN(
        pyro_bbb.mlp([FEATURES, HIDDEN, 1]), pyro_bbb.likelihoods.Gaussian(), num_data=ROWS
    )
    family = pyro_bbb.MeanFieldGuide
    guide = family(model) if config == "bnn" else Ensemble(model, family, k=MEMBERS)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    history = pyro_bbb.fit(
        model, guide, x, y, epochs=epochs, reparam="local", num_particles=1, seed=0,
        progress=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    digest = hashlib.sha256()
    for value in (*history.loss, *history.nll, *history.kl):
        digest.update(repr(value).encode())
    for name, value in sorted(pyro.get_param_store().items()):
        digest.update(name.encode() + value.detach().numpy().tobytes())
    return {
        "wall": wall,
        "user": after.ru_utime - before.ru_utime,
        "system": after.ru_stime - before.ru_stime,
        "faults": after.ru_minflt - before.ru_minflt,
        "peak_mib": after.ru_maxrss / 1024,
        "digest": digest.hexdigest(),
    }


#: How each fit's process is started: the heap kept by fit or not, and glibc's tcache.
SETTINGS = {
    "glibc's defaults (the default)": {"PYRO_BBB_KEEP_HEAP": "0"},
    "kept (PYRO_BBB_KEEP_HEAP=1)": {"PYRO_BBB_KEEP_HEAP": "1"},
    "kept, no tcache": {"PYRO_BBB_KEEP_HEAP": "1", "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"},
}


def fresh_fit(config: str, epochs: int, threads: int, setting: str) -> dict:
    command = [sys.executable, __file__, "--one", config, "--epochs", str(epochs),
               "--threads", str(threads)]  # fmt: skip
    return in_fresh_process(command, env={**os.environ, **SETTINGS[setting]})


def protein_like(folder: Path, rows: int = 45_730, splits: int = 1) -> None:
    """A UCI split folder of protein's shape (45,730 rows, 9 features) from :func:`data`."""
    x, y = data(rows, seed=1)
    folder.mkdir(parents=True, exist_ok=True)
    table = torch.cat([x, y.unsqueeze(-1)], -1).tolist()
    (folder / "data.txt").write_text("\n".join(" ".join(f"{v:.6f}" for v in r) for r in table))
    (folder / "index_features.txt").write_text("\n".join(str(i) for i in range(FEATURES)))
    (folder / "index_target.txt").write_text(str(FEATURES))
    (folder / "n_hidden.txt").write_text(str(HIDDEN))
    (folder / "n_epochs.txt").write_text("40")
    (folder / "n_splits.txt").write_text(str(splits))
    generator = torch.Generator().manual_seed(2)
    for k in range(splits):
        order = torch.randperm(rows, generator=generator).tolist()
        cut = int(0.9 * rows)
        (folder / f"index_train_{k}.txt").write_text("\n".join(map(str, order[:cut])))
        (folder / f"index_test_{k}.txt").write_text("\n".join(map(str, order[cut:])))


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--configs", default="bnn,ensemble")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--protein-like", type=Path, help="write a split folder here, and stop")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.protein_like:
        protein_like(args.protein_like)
        return
    if args.one:
        print(json.dumps(one_fit(args.one, args.epochs)))
        return
    print(
        f"# Full-batch fits, {ROWS:,} x {FEATURES}, 9-{HIDDEN}-1, reparam='local', "
        f"{args.epochs} epochs\n\ntorch {torch.__version__}, {machine()}, {args.threads} "
        f"thread(s), load average {os.getloadavg()[0]:.1f} at the start; each fit in a fresh "
        "process\n"
    )
    header = ("fit", "heap", "wall s", "user s", "system s", "system / user", "minor faults",
              "peak RSS MiB", "same result")  # fmt: skip
    lines = []
    for config in args.configs.split(","):
        runs = {s: fresh_fit(config, args.epochs, args.threads, s) for s in SETTINGS}
        first = next(iter(runs.values()))["digest"]
        lines += [
            (
                config, label, f"{r['wall']:.1f}", f"{r['user']:.1f}", f"{r['system']:.1f}",
                f"{r['system'] / r['user']:.0%}", f"{r['faults']:,}", f"{r['peak_mib']:.0f}",
                "yes" if r["digest"] == first else "NO",
            )
            for label, r in runs.items()
        ]  # fmt: skip
    print(markdown_table(header, lines, align="ll" + "r" * 6 + "l"))
    print(f"\n(load average {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
