"""``fit``'s arguments, read once before anything is built: counts, rate and run length.

What ``validation=`` means is :mod:`~pyro_bbb.training.held_out`'s, what ``epochs`` and
``until`` make of the run :mod:`~pyro_bbb.training.run_length`'s; this module checks the
numbers and answers the questions the set-up asks of the arguments.
"""

from __future__ import annotations

import torch

from .._validation import check_int, check_positive_number
from ..infer.reparam import check_no_outer_estimator
from .optimizers import OptimizerSpec
from .rates import check_rate_choice
from .run_length import check_automatic

__all__ = ["check_options", "rows_of"]


def check_options(
    epochs: int | None,
    batch_size: int | None,
    num_particles: int | None,
    lr: float | None,
    max_steps: int | None,
    until: str | None,
    optimizer: OptimizerSpec | None = None,
) -> str:
    """Check ``fit``'s counts, rate and run length; return the automatic run's rule.

    ``lr=None`` with an optimiser class whose step the rate does not bound (``SGD``) is
    refused (:func:`~.rates.check_rate_choice`), and so is a call inside an estimator's
    block, ``with flipout()``, whose work ``reparam=`` does
    (:func:`~pyro_bbb.infer.reparam.check_no_outer_estimator`).

    Returns:
        ``until``, ``None`` read as ``"predictive"`` (:func:`~.run_length.check_automatic`).
    """
    check_no_outer_estimator("fit")
    check_int("epochs", epochs, optional=True)
    check_int("batch_size", batch_size, optional=True)
    check_int("num_particles", num_particles, optional=True)
    if lr is not None:
        check_positive_number("lr", lr)
    check_rate_choice(lr, optimizer)
    return check_automatic(epochs, max_steps, until)


def rows_of(x: object) -> int:
    """The rows of tensor data, 0 for a ``DataLoader`` (whose rows are not held out)."""
    return x.shape[0] if isinstance(x, torch.Tensor) else 0
