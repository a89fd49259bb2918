"""Worker processes for the benchmarks that do not run the calling script again.

A worker started by ``multiprocessing``'s ``spawn`` imports the parent's ``__main__`` before
it takes a task (Python's documentation, "Safe importing of main module"): a script without
an ``if __name__ == "__main__":`` guard then runs again in every worker, and its call that
started the workers tries to start more, which fails. The benchmarks' tasks are functions
of this package with arguments of its own, so their workers need nothing from the script:
:func:`script_hidden` starts them without it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["script_hidden"]


@contextmanager
def script_hidden() -> Iterator[None]:
    """While workers start here, ``multiprocessing`` finds no script to import in them.

    ``spawn`` and ``forkserver`` read where ``__main__`` came from (its ``__spec__`` for
    ``python -m``, else its ``__file__``) when a process starts; both are hidden for the
    duration and put back after. A notebook's ``__main__`` has neither. Only tasks whose
    functions and arguments pickle without ``__main__`` may be sent to such workers.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {name: main.__dict__[name] for name in ("__file__", "__spec__") if name in vars(main)}
    main.__dict__.pop("__file__", None)
    if "__spec__" in saved:
        main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)
