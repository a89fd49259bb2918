"""Tests of where a fit shows its bar (pyro_bbb._display, pyro_bbb.training.progress)."""

from __future__ import annotations

import io
import sys
import types
from typing import ClassVar

import pytest
import torch

from pyro_bbb import BNN, MeanFieldGuide, fit, likelihoods, mlp
from pyro_bbb import _display as progress_module
from pyro_bbb._display import in_notebook, show_progress


class ZMQInteractiveShell:  # the class name a Jupyter kernel's IPython shell has
    config: ClassVar[dict] = {}


class TerminalInteractiveShell:
    config: ClassVar[dict] = {}


def _fake_ipython(monkeypatch, shell) -> None:
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: shell
    monkeypatch.setitem(sys.modules, "IPython", ipython)


def _not_a_terminal(monkeypatch) -> io.StringIO:
    err = io.StringIO()  # isatty() is False, as a notebook's stderr
    monkeypatch.setattr(progress_module.sys, "stderr", err)
    return err


def test_a_jupyter_kernel_shows_the_bar_though_its_stderr_is_not_a_terminal(monkeypatch):
    _not_a_terminal(monkeypatch)
    _fake_ipython(monkeypatch, ZMQInteractiveShell())
    assert in_notebook()
    assert show_progress(None)


def test_a_plain_script_with_stderr_redirected_shows_no_bar(monkeypatch):
    _not_a_terminal(monkeypatch)
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert not in_notebook()
    assert not show_progress(None)


def test_a_terminal_ipython_is_not_a_notebook(monkeypatch):
    _fake_ipython(monkeypatch, TerminalInteractiveShell())
    assert not in_notebook()
    _fake_ipython(monkeypatch, None)  # IPython imported, no shell running
    assert not in_notebook()


def test_progress_given_is_followed_and_only_the_main_process_reports(monkeypatch):
    _fake_ipython(monkeypatch, ZMQInteractiveShell())
    assert not show_progress(False)
    assert show_progress(True)
    assert not show_progress(True, is_main=False)
    assert not show_progress(None, is_main=False)


def test_fit_in_a_notebook_draws_its_bar_at_the_defaults(monkeypatch):
    err = _not_a_terminal(monkeypatch)
    _fake_ipython(monkeypatch, ZMQInteractiveShell())
    drawn = []
    import tqdm.auto

    real = tqdm.auto.tqdm

    def spy(*args, **kwargs):  # tqdm.auto's text fallback without ipywidgets, written to err
        drawn.append(kwargs)
        return real(*args, **{**kwargs, "file": err})

    monkeypatch.setattr(tqdm.auto, "tqdm", spy)
    torch.manual_seed(0)
    x, y = torch.randn(20, 1), torch.randn(20)
    model = BNN(mlp([1, 4, 1]), likelihoods.Gaussian(scale=0.5), num_data=20)
    fit(model, MeanFieldGuide(model), x, y, epochs=3, seed=0)
    assert drawn and drawn[0]["total"] == 3
    assert "3/3" in err.getvalue()


@pytest.mark.parametrize("progress", [None, False])
def test_fit_outside_a_notebook_and_terminal_draws_nothing(monkeypatch, progress):
    _not_a_terminal(monkeypatch)
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", lambda *a, **k: pytest.fail("a bar was drawn"))
    x, y = torch.randn(20, 1), torch.randn(20)
    model = BNN(mlp([1, 4, 1]), likelihoods.Gaussian(scale=0.5), num_data=20)
    fit(model, MeanFieldGuide(model), x, y, epochs=2, seed=0, progress=progress)
