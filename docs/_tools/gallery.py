"""The gallery: each example's figure, what it shows, and the command that makes it.

This file is the gallery's one source. ``python docs/_tools/gallery.py`` writes
``docs/gallery.md`` from :data:`GALLERY`; ``--figures`` also runs every example (or those
named with ``--only``) in a scratch folder, exactly as the command on the page reads, and moves
the figure it saved into ``docs/``. Images are never edited by hand. ``tests/test_docs.py``
checks that the page is what this script writes and that every figure exists.

    python docs/_tools/gallery.py                        # the page only
    python docs/_tools/gallery.py --figures              # every figure (about 45 min, 2 cores)
    python docs/_tools/gallery.py --figures --only demo quickstart
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


@dataclass(frozen=True)
class Entry:
    """One gallery item: ``command`` (run from the repository root) saves ``saves``."""

    name: str
    title: str
    text: str  # two lines on what the figure shows
    command: str
    saves: str  # the file the command writes, in the folder it runs in
    minutes: float  # on the project's 2-core machine

    @property
    def figure(self) -> str:
        """The figure's file name in ``docs/``."""
        return f"{self.name}.png"


GALLERY = [
    Entry(
        "quickstart",
        "Quick start: a Bayesian MLP on data with a gap",
        "The README's quick start: 100 epochs of a 1-50-50-1 tanh network under a scale-mixture "
        "prior. The epistemic band (dark) widens in the gap and beyond the data; the total band "
        "adds the learned noise.",
        "python examples/quickstart.py",
        "quickstart.png",
        0.5,
    ),
    Entry(
        "demo_nuts",
        "The demo, with NUTS's band beside VI's",
        "`fit` at its default length and `predict` on the gap data (mean-field), and the NUTS "
        "posterior of the same model on the NumPyro backend: mean-field VI is confident in the "
        "gap where NUTS is not.",
        "python -m pyro_bbb demo --nuts --out demo_nuts.png",
        "demo_nuts.png",
        8,
    ),
    Entry(
        "vi_vs_nuts",
        "Mean-field, low-rank, ensembles and NUTS on the same model",
        "Predictive bands of mean-field VI, low-rank VI, an ensemble of five mean-field guides, "
        "a deep ensemble of five point estimates and a converged NUTS reference (function-space "
        "R̂ and ESS checked) on a small gap problem; the script prints the `compare` table.",
        "python examples/vi_vs_nuts.py --out vi_vs_nuts.png",
        "vi_vs_nuts.png",
        3,
    ),
    Entry(
        "conv_digits",
        "A Bayesian ConvNet's reliability diagram",
        "`bayesianize` on a ConvNet with flipout, trained on scikit-learn's 8×8 digits: "
        "accuracy against confidence per bin, with the expected calibration error.",
        "python examples/conv_digits.py --figure conv_digits.png",
        "conv_digits.png",
        7,
    ),
    Entry(
        "ddp_history",
        "Data-parallel training under torchrun",
        "`fit` on two processes (gloo, CPU) with a checkpoint every 10 epochs: the loss, NLL and "
        "KL per epoch above, β's warm-up below. One process trains the same objective.",
        "torchrun --standalone --nproc_per_node=2 examples/ddp.py",
        "ddp_history.png",
        1,
    ),
    Entry(
        "continual",
        "Variational continual learning on split and permuted digits",
        "Accuracy on every task seen so far as tasks arrive: VCL with and without coresets "
        "against naive fine-tuning (which forgets) and joint training on all tasks.",
        "python examples/continual.py --figure continual.png",
        "continual.png",
        25,
    ),
    Entry(
        "online_regression",
        "Online learning: the posterior as a stream arrives",
        "LoFi folds 1,000 points into a Gaussian belief over the weights, ten at a time, in one "
        "pass; the bands after 20, 100, 300 and 1,000 points, drawn by `predict` from the "
        "belief as it stands (the epistemic band stays wide beyond the data).",
        "python examples/online_regression.py --out online_regression.png",
        "online_regression.png",
        0.5,
    ),
]
"""The gallery's items, in page order."""


def page() -> str:
    """The Markdown of ``docs/gallery.md``."""
    lines = [
        "# Gallery",
        "",
        "What the examples show. Each figure is saved by the command under it, run from the "
        "repository root; `python docs/_tools/gallery.py --figures` runs them all again and "
        "puts the figures here. The examples print their numbers too; the pages of the guide "
        "explain them.",
        "",
    ]
    for entry in GALLERY:
        lines += [
            f"## {entry.title}",
            "",
            f"![{entry.title}]({entry.figure})",
            "",
            entry.text,
            "",
            "```bash",
            entry.command,
            "```",
            "",
        ]
    return "\n".join(lines)


def make_figure(entry: Entry) -> None:
    """Run one example in a scratch folder and move its figure into ``docs/``."""
    with tempfile.TemporaryDirectory() as scratch:
        words = shlex.split(entry.command)
        words = [str(ROOT / w) if w.startswith("examples/") else w for w in words]
        if words[0] == "python":
            words[0] = sys.executable
        elif words[0] == "torchrun":
            words[:1] = [sys.executable, "-m", "torch.distributed.run"]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
        start = time.perf_counter()
        subprocess.run(words, cwd=scratch, env=env, check=True)
        shutil.move(Path(scratch) / entry.saves, DOCS / entry.figure)
    print(f"{entry.name}: docs/{entry.figure} in {time.perf_counter() - start:.0f} s")


def main() -> None:
    """Write the page, and the figures when asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figures", action="store_true", help="run the examples too")
    parser.add_argument("--only", nargs="+", choices=[e.name for e in GALLERY], help="these")
    args = parser.parse_args()
    if args.figures:
        for entry in GALLERY:
            if args.only is None or entry.name in args.only:
                make_figure(entry)
    (DOCS / "gallery.md").write_text(page())
    print("wrote docs/gallery.md")


if __name__ == "__main__":
    main()
