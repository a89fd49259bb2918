r"""The rows an automatic run holds out of its steps to score the predictive on.

An automatic run (``fit(epochs=None)``) asks whether further steps still improve the
predictive, on rows the steps do not see (:mod:`~pyro_bbb.training.scoring` scores them).
This module decides how many and which:

* :func:`held_out_fraction`: the share ``fit(validation=...)`` asks for (none by default,
  none of a ``DataLoader``);
* :func:`held_out_rows`: none when that is under :data:`MIN_HELD_OUT` rows (too few to
  score);
* :func:`hold_out`: which, by a seeded permutation (the same on every process and on
  resuming).

The held-out rows are given back before the run's end (its decay trains on every row), so
the returned guide has seen all the data. Nothing here trains.
"""

from __future__ import annotations

import torch

from .._validation import check_has_values

__all__ = [
    "MIN_HELD_OUT",
    "check_validation",
    "held_out_fraction",
    "held_out_rows",
    "held_out_split",
    "hold_out",
    "scorable",
]

#: The fewest rows worth holding out: fewer score too noisily to decide on.
MIN_HELD_OUT = 10
#: Added to the order's seed for the held-out rows, so that they are not the first rows of
#: the minibatch order's permutation.
_SEED_OFFSET = 7_919


def held_out_rows(num_data: int, fraction: float) -> int:
    """How many of ``num_data`` rows a ``fraction`` holds out: 0 when too few to score.

    ``round(fraction · N)``, but 0 when that is under :data:`MIN_HELD_OUT` or leaves fewer
    rows to train on.
    """
    count = round(fraction * num_data)
    return count if MIN_HELD_OUT <= count <= num_data - count else 0


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


def check_validation(validation: object, epochs: int | None) -> None:
    """Check ``fit``'s ``validation``: a fraction in [0, 1), a pair of tensors, or ``None``.

    Raises:
        TypeError: If it is none of these.
        ValueError: If a fraction is outside [0, 1), or ``validation`` is given to a run of
            fixed length (only an automatic run reads it).
    """
    if validation is None:
        return
    if epochs is not None:
        raise ValueError(
            f"validation= applies to a run of epochs=None (it decides when the run ends); "
            f"with epochs={epochs} the run's length is fixed"
        )
    if isinstance(validation, (int, float)) and not isinstance(validation, bool):
        if not 0 <= validation < 1:
            raise ValueError(
                f"validation must be a fraction of the rows in [0, 1), got {validation!r}"
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
    can be scored; ``None`` (the default) holds nothing out, nor does a fixed run, a pair
    ``(x_val, y_val)`` or a ``DataLoader``.
    """
    if epochs is not None or isinstance(validation, tuple) or not isinstance(x, torch.Tensor):
        return 0.0
    if validation is None:
        return 0.0
    return float(validation) if scorable(model) else 0.0


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
        return None, None, seed
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, ()))
    train, held = hold_out(num_data, count, seed)
    return train, held, seed
