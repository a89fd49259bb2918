r"""The rows an automatic run holds out of its steps to score the predictive on.

An automatic run (``fit(epochs=None)``) asks whether further steps still improve the
predictive, on rows the steps do not see (:mod:`~pyro_bbb.training.scoring` scores them).
This module decides how many and which:

* :func:`check_validation`: what ``fit(validation=...)`` may ask for: a fraction of at most
  half the rows, or a pair ``(x_val, y_val)``, of an automatic run that reads it (not a
  fixed run, nor ``until="converged"``, whose rule reads no held-out score);
* :func:`held_out_fraction`: the share ``fit(validation=...)`` asks for (none by default);
  a fraction of a ``DataLoader``'s rows, or for a model whose predictive cannot be scored,
  is refused;
* :func:`held_out_rows`: none when that is under :data:`MIN_HELD_OUT` rows (too few to
  score; :func:`held_out_split` warns then);
* :func:`hold_out`: which, by a seeded permutation (the same on every process and on
  resuming);
* :func:`resolve_validation`: all of that at once, ``fit``'s ``validation`` as the one
  :class:`Validation` the rest of the run reads.

The held-out rows are given back before the run's end (its decay trains on every row), so
the returned guide has seen all the data. Nothing here trains.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch

from .._validation import check_has_values

__all__ = [
    "MIN_HELD_OUT",
    "Validation",
    "check_validation",
    "held_out_fraction",
    "held_out_rows",
    "held_out_split",
    "hold_out",
    "resolve_validation",
    "scorable",
]

#: The fewest rows worth holding out: fewer score too noisily to decide on.
MIN_HELD_OUT = 10
#: The largest share of the rows a fraction may hold out: the rest train.
MAX_FRACTION = 0.5
#: Added to the order's seed for the held-out rows, so that they are not the first rows of
#: the minibatch order's permutation.
_SEED_OFFSET = 7_919


def held_out_rows(num_data: int, fraction: float) -> int:
    """How many of ``num_data`` rows a ``fraction`` holds out: 0 when too few to score.

    ``round(fraction · N)``, at most half the rows (``N // 2``), and 0 when that is under
    :data:`MIN_HELD_OUT`.
    """
    count = min(round(fraction * num_data), num_data // 2)
    return count if count >= MIN_HELD_OUT else 0


def hold_out(num_data: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ``range(num_data)`` into training rows and ``count`` held-out rows.

    Args:
        num_data: ``N``, the rows.
        count: Rows to hold out, ``0 <= count < N``.
        seed: Seed of the permutation (the minibatch order's; the same on every process).

    Returns:
        ``(train, held)``: sorted int64 indices, on the CPU.
    """
    generator = torch.Generator().manual_seed(seed + _SEED_OFFSET)
    order = torch.randperm(num_data, generator=generator)
    return order[count:].sort().values, order[:count].sort().values


def check_validation(validation: object, epochs: int | None, until: str = "predictive") -> None:
    """Check ``fit``'s ``validation``: a fraction in [0, 0.5], a pair of tensors, or ``None``.

    Args:
        validation: ``fit``'s ``validation``.
        epochs: ``fit``'s ``epochs``.
        until: The automatic run's rule, ``"predictive"`` or ``"converged"``.

    Raises:
        TypeError: If it is none of these.
        ValueError: If a fraction is outside [0, :data:`MAX_FRACTION`], or ``validation`` is
            given to a run of fixed length or to one of ``until="converged"`` (neither reads
            a held-out score).
    """
    if validation is None:
        return
    if epochs is not None:
        raise ValueError(
            f"validation= applies to a run of epochs=None (it decides when the run ends); "
            f"with epochs={epochs} the run's length is fixed"
        )
    if until == "converged":
        raise ValueError(
            f"validation={_shown(validation)} is read by fit's default rule "
            '(until="predictive"); until="converged" stops on the convergence check of the '
            "beta = 1 loss and scores no held-out rows, so rows held out would only be "
            'taken from training: pass validation=None with until="converged", or drop until'
        )
    if isinstance(validation, (int, float)) and not isinstance(validation, bool):
        if not 0 <= validation <= MAX_FRACTION:
            raise ValueError(
                f"validation must be a fraction of the rows in [0, {MAX_FRACTION:g}] (the "
                f"rest train), got {validation!r}; for more held-out rows pass a pair "
                "(x_val, y_val) of your own"
            )
        return
    if (
        isinstance(validation, tuple)
        and len(validation) == 2
        and all(isinstance(t, torch.Tensor) for t in validation)
    ):
        check_has_values("validation[0]", validation[0])
        check_has_values("validation[1]", validation[1])
        if validation[0].shape[0] != validation[1].shape[0]:
            raise ValueError(
                f"validation=(x_val, y_val) must have as many rows each, got "
                f"{validation[0].shape[0]} and {validation[1].shape[0]}"
            )
        return
    raise TypeError(
        "validation must be a fraction of the rows to hold out (e.g. 0.1), 0 to hold out "
        f"none, or a pair (x_val, y_val) of tensors; got {validation!r}"
    )


def scorable(model: object) -> bool:
    """Whether held-out rows can be scored: the model is a network with a likelihood."""
    return isinstance(getattr(model, "net", None), torch.nn.Module) and hasattr(model, "likelihood")


def held_out_fraction(
    model: object, x: object, epochs: int | None, validation: float | tuple | None
) -> float:
    """The share of rows an automatic run holds out: 0 where it scores none or reads a pair.

    A number ``validation`` is taken as given for tensor data of a model whose predictive
    can be scored; ``None`` (the default) holds nothing out, nor does a fixed run or a pair
    ``(x_val, y_val)``.

    Raises:
        ValueError: If a fraction above 0 is asked of a ``DataLoader`` (its rows are not
            held out), or ``validation`` of a model whose predictive cannot be scored (one
            without a network ``model.net`` and a ``model.likelihood``, as a
            :class:`~pyro_bbb.BNN` has).
    """
    if epochs is not None or validation is None:
        return 0.0
    if not scorable(model) and (isinstance(validation, tuple) or validation):
        raise ValueError(
            f"validation={_shown(validation)} is scored by the model's predictive, which "
            f"needs a network model.net and a model.likelihood (a pyro_bbb.BNN); "
            f"{type(model).__name__} has none: pass validation=None"
        )
    if isinstance(validation, tuple):
        return 0.0
    if not isinstance(x, torch.Tensor) and validation:
        raise ValueError(
            f"validation={validation!r} holds out a fraction of tensor data's rows, and a "
            f"{type(x).__name__}'s rows cannot be held out: pass validation=(x_val, y_val), "
            "tensors of rows the loader does not yield, or x and y as tensors"
        )
    return float(validation)


def held_out_split(
    num_data: int, fraction: float, seed: int | None
) -> tuple[torch.Tensor | None, torch.Tensor | None, int | None]:
    """The training rows and the held-out rows of ``fraction`` of ``num_data``, and the seed.

    Args:
        num_data: ``N``, the rows.
        fraction: The share to hold out (:func:`held_out_fraction`).
        seed: The seed of the minibatch order (the checkpoint's on resuming), or ``None``.

    Returns:
        ``(train, held, seed)``: sorted indices (both ``None`` when nothing is held out) and
        the order's seed, drawn here when rows are held out and it was ``None``.
    """
    count = held_out_rows(num_data, fraction) if fraction and num_data else 0
    if not count:
        if fraction and num_data:
            warnings.warn(
                f"validation={fraction:g} of {num_data:,} rows holds out "
                f"{min(round(fraction * num_data), num_data // 2)}, too few to score (at least "
                f"{MIN_HELD_OUT}): nothing is held out and the run reads the fit to the "
                "training rows; pass a larger fraction, a pair (x_val, y_val), or "
                "validation=None to say so",
                UserWarning,
                stacklevel=3,
            )
        return None, None, seed
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, ()))
    train, held = hold_out(num_data, count, seed)
    return train, held, seed


class Validation(NamedTuple):
    """``fit``'s ``validation``, resolved: what an automatic run holds out and what it scores."""

    #: The share of tensor data's rows held out of the steps (0: none).
    fraction: float
    #: Rows of the user's own to score, ``(x_val, y_val)``, or ``None``.
    pair: tuple[torch.Tensor, torch.Tensor] | None


def resolve_validation(
    validation: float | tuple[torch.Tensor, torch.Tensor] | None,
    model: object,
    x: object,
    epochs: int | None,
    until: str,
) -> Validation:
    """Check ``fit``'s ``validation`` and resolve it: the share held out, or the pair scored.

    Raises:
        TypeError: As :func:`check_validation`.
        ValueError: As :func:`check_validation` and :func:`held_out_fraction`.
    """
    check_validation(validation, epochs, until)
    fraction = held_out_fraction(model, x, epochs, validation)
    return Validation(fraction, validation if isinstance(validation, tuple) else None)


def _shown(validation: object) -> str:
    """``validation`` as a message shows it: a pair as ``(x_val, y_val)``."""
    return "(x_val, y_val)" if isinstance(validation, tuple) else repr(validation)
