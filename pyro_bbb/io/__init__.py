"""Files: :func:`save` and :func:`load` of a trained model and guide, written atomically.

* :mod:`~pyro_bbb.io.serialization`: :func:`save` and :func:`load`;
* :mod:`~pyro_bbb.io.files`: our files on disk (atomic write, safe and checked read), which
  :func:`save` and :func:`~pyro_bbb.fit`'s checkpoints write.
"""

from .serialization import load, save

__all__ = ["load", "save"]
