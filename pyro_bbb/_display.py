"""Whether a person is watching: a terminal or a Jupyter notebook, where progress is shown.

Read by every long run that shows a bar (``fit``, the benchmarks, the demo); it draws nothing
itself.
"""

from __future__ import annotations

import sys

__all__ = ["in_notebook", "show_progress"]


def show_progress(progress: bool | None, is_main: bool = True) -> bool:
    """Whether a fit shows its bar: ``progress`` as given, else where a person is watching.

    Args:
        progress: ``fit``'s argument: ``True`` or ``False`` as given; ``None`` shows the bar
            when standard error is a terminal or the code runs in a Jupyter kernel
            (:func:`in_notebook`), whose standard error is not a terminal.
        is_main: Whether this is the process that reports (rank 0 under ``torch.distributed``).

    Returns:
        ``True`` to show the bar.
    """
    if not is_main:
        return False
    if progress is not None:
        return bool(progress)
    return _isatty(sys.stderr) or in_notebook()


def in_notebook() -> bool:
    """Whether the code runs in a Jupyter (IPython) kernel, where ``tqdm.auto`` draws a widget.

    Read from IPython's running shell, if any: a kernel's shell is a ``ZMQInteractiveShell``
    (Jupyter, JupyterLab, VS Code's notebooks) or, in Google Colab, ``Shell``. A terminal
    IPython session is not a notebook (its standard error is a terminal).
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    get_ipython = getattr(ipython, "get_ipython", None)
    shell = get_ipython() if callable(get_ipython) else None
    if shell is None:
        return False
    return type(shell).__name__ in {"ZMQInteractiveShell", "Shell"} or "IPKernelApp" in getattr(
        shell, "config", {}
    )


def _isatty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False
