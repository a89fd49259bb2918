"""The how-to pages' code runs as written: each page's Python blocks, in a fresh process.

A page whose blocks build everything they use (data, model, guide) is run whole; the
full-size images page on a subset of the images and a short budget (two substitutions,
named below), so the code a user copies is the code that was checked.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyro_bbb.data import FASHION_MNIST

from .support import REPO

HOWTO = REPO / "docs" / "howto"


def _code(page: str) -> str:
    """The page's ```python blocks, in order, as one script."""
    text = (HOWTO / page).read_text()
    return "\n\n".join(re.findall(r"```python\n(.*?)```", text, flags=re.S))


def _run(code: str, tmp_path: Path) -> str:
    script = tmp_path / "page.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_use_your_own_network_runs_as_written(tmp_path):
    out = _run(_code("your_own_network.md"), tmp_path)
    assert "| lstm.weight_hh_l0 | LSTM | Bayesian |" in out  # the summary the page prints


@pytest.mark.skipif(not FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_train_on_full_size_images_runs_as_written_on_a_subset(tmp_path):
    code = _code("full_size_images.md")
    shrunk = {
        'image_split("/usr/share/datasets/fashion-mnist")': (
            'image_split("/usr/share/datasets/fashion-mnist", num_train=1000, num_test=500)'
        ),
        "batch_size=128, seed=0)": "batch_size=128, seed=0, max_steps=80)",
    }
    for old, new in shrunk.items():
        assert old in code, f"the page no longer holds {old!r}"
        code = code.replace(old, new)
    out = _run(code, tmp_path)
    accuracy = float(out.split()[-3])
    assert 0.5 < accuracy <= 1.0


@pytest.mark.skipif(importlib.util.find_spec("numpyro") is None, reason="needs the numpyro extra")
def test_compare_with_nuts_runs_as_written(tmp_path):
    out = _run(_code("compare_with_nuts.md"), tmp_path)
    assert "function-space bulk ESS" in out and "W2 to the other" in out
