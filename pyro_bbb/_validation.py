"""Argument checks shared by every module, raising errors in one style.

Each check names the argument, says what was expected and shows what came, e.g.
``ValueError("epochs must be a positive int, got 0")``, and returns the value (converted
where that is the point, e.g. to ``float``) so that a check reads as an assignment. These are
our own argument checks: they always run, whatever ``pyro.enable_validation`` says (that switch
governs the checks of Pyro and torch distributions). Nothing here imports Pyro.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from numbers import Integral, Real
from typing import TypeVar

import torch

__all__ = [
    "check_choice",
    "check_finite_tensor",
    "check_floating_tensor",
    "check_guide",
    "check_int",
    "check_nonnegative_number",
    "check_number",
    "check_open_unit_interval",
    "check_positive_number",
    "check_same_rows",
    "check_tensor",
]

T = TypeVar("T")


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def check_int(name: str, value: object, *, minimum: int = 1, optional: bool = False) -> int | None:
    """An ``int`` at least ``minimum`` (``None`` too, if ``optional``).

    Raises:
        ValueError: ``"<name> must be a positive int, got 0"`` (``minimum == 1``), or
            ``"<name> must be an int >= <minimum>, got ..."``.
    """
    if optional and value is None:
        return None
    if not _is_int(value) or value < minimum:
        expected = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def check_number(name: str, value: object) -> float:
    """A finite real number, as ``float``.

    Raises:
        ValueError: ``"<name> must be a finite number, got nan"``.
    """
    if not _is_real(value) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def check_positive_number(name: str, value: object) -> float:
    """A finite number above 0, as ``float``.

    Raises:
        ValueError: ``"<name> must be a positive finite number, got -1"``.
    """
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_nonnegative_number(name: str, value: object) -> float:
    """A finite number at least 0, as ``float``.

    Raises:
        ValueError: ``"<name> must be a finite number >= 0, got -1"``.
    """
    if not _is_real(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_open_unit_interval(name: str, value: object) -> float:
    """A number strictly between 0 and 1, as ``float``.

    Raises:
        ValueError: ``"<name> must be in (0, 1), got 1.5"``.
    """
    if not _is_real(value) or not 0 < value < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return float(value)


def check_choice(name: str, value: T, choices: Collection[T]) -> T:
    """One of ``choices``.

    Raises:
        ValueError: ``"<name> must be 'a' or 'b', got 'c'"``, or ``"<name> must be one of
            'a', 'b', 'c', got 'd'"`` for more choices.
    """
    if value not in choices:
        names = [repr(c) for c in choices]
        expected = " or ".join(names) if len(names) <= 2 else "one of " + ", ".join(names)
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def check_guide(name: str, guide: object) -> None:
    """Refuse a ``guide`` that cannot be called, with the likely mix-up named.

    An online updater (:class:`~pyro_bbb.RVGA`, :class:`~pyro_bbb.LoFi`) holds its belief
    as ``.guide``; passed itself, Pyro would fail later with "... is not callable".

    Raises:
        TypeError: If ``guide`` is not callable.
    """
    if callable(guide):
        return
    inner = getattr(guide, "guide", None)
    hint = (
        f"; its posterior is its .guide (pass {name}=updater.guide)"
        if callable(inner)
        else " (a MeanFieldGuide, a LowRankGuide, an Ensemble or a Pyro autoguide)"
    )
    raise TypeError(f"{name} must be a guide, got a {type(guide).__name__}{hint}")


def check_tensor(
    name: str, value: object, dtype: torch.dtype | None = torch.float32
) -> torch.Tensor:
    """A ``torch.Tensor``.

    Args:
        name: The argument's name.
        value: What came.
        dtype: What array-like data are to be converted to, for the message
            (:func:`conversion_hint`; ``None`` for integer labels).

    Raises:
        TypeError: ``"<name> must be a torch.Tensor, got list"``, with the conversion to
            make for a NumPy array, a list or a tuple (:func:`conversion_hint`).
    """
    if not isinstance(value, torch.Tensor):
        hint = conversion_hint(value, name, dtype)
        raise TypeError(
            f"{name} must be a torch.Tensor, got {type(value).__name__}"
            + (f"; convert it with {hint}" if hint else "")
        )
    return value


def conversion_hint(value: object, name: str, dtype: torch.dtype | None = torch.float32) -> str:
    """``torch.as_tensor(<name>, dtype=...)`` for array-like data, else ``""``.

    For data a user would hand scikit-learn: a NumPy array (anything with ``__array__``), a
    list or a tuple.

    Args:
        value: What came.
        name: The argument's name.
        dtype: The floating dtype to convert to (the model's); ``None`` for integer class
            labels, which take ``torch.as_tensor(<name>).long()``.
    """
    if not (hasattr(value, "__array__") or isinstance(value, (list, tuple))):
        return ""
    if dtype is None:
        return f"torch.as_tensor({name}).long()"
    return f"torch.as_tensor({name}, dtype={dtype})"


def check_has_values(name: str, value: torch.Tensor) -> torch.Tensor:
    """A tensor that holds values: not on the ``meta`` device, which has shapes only.

    Raises:
        ValueError: ``"x is on the meta device, which holds shapes but no values"``.
    """
    if value.device.type == "meta":
        raise ValueError(f"{name} is on the meta device, which holds shapes but no values")
    return value


def check_floating_tensor(name: str, value: object) -> torch.Tensor:
    """A floating-point ``torch.Tensor``.

    Raises:
        TypeError: If it is not a tensor.
        ValueError: ``"<name> must be floating point (e.g. <name>.float()), got dtype ..."``.
    """
    check_tensor(name, value)
    if not torch.is_floating_point(value):
        raise ValueError(
            f"{name} must be floating point (e.g. {name}.float()), got dtype {value.dtype}"
        )
    return value


def check_features(
    name: str, value: torch.Tensor, dtype: torch.dtype | None, *, tokens: bool = False
) -> torch.Tensor:
    """Network inputs: floating point of the model's dtype, or integer ids if ``tokens``.

    ``tokens`` is for a network whose first layer is an ``nn.Embedding``: its inputs are
    integer token ids, of any integer dtype.

    Raises:
        ValueError: On a floating tensor of another dtype than ``dtype``, an integer tensor
            when the network takes no token ids, or any other dtype (``bool``, complex).
    """
    check_tensor(name, value)
    if tokens and not value.dtype.is_floating_point and not value.dtype.is_complex:
        if value.dtype == torch.bool:
            raise ValueError(f"{name} must hold integer token ids, got dtype torch.bool")
        return value
    if not torch.is_floating_point(value):
        hint = " (integer token ids are taken by a network whose first layer is nn.Embedding)"
        raise ValueError(
            f"{name} must be floating point (e.g. {name}.float()){hint}, got dtype {value.dtype}"
        )
    return check_dtype(name, value, dtype)


def check_dtype(name: str, value: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A floating tensor of the model's dtype (``dtype=None``: anything).

    Raises:
        ValueError: ``"x has dtype torch.float64 but the model's weights are torch.float32;
            ..."`` with both conversions.
    """
    if dtype is not None and value.dtype != dtype:
        raise ValueError(
            f"{name} has dtype {value.dtype} but the model's weights are {dtype}; convert "
            f"{name} with {name}.to({dtype}), or the model with model.to({value.dtype})"
        )
    return value


def check_finite_tensor(name: str, value: torch.Tensor) -> torch.Tensor:
    """A tensor without NaN or inf (reads its values: on CUDA this synchronises).

    Raises:
        ValueError: ``"<name> contains NaN or inf (first at index [4, 0])"``.
    """
    finite = torch.isfinite(value)
    if not bool(finite.all()):
        bad = (~finite).nonzero()[0].tolist()
        raise ValueError(f"{name} contains NaN or inf (first at index {bad})")
    return value


def check_same_rows(x: torch.Tensor, y: torch.Tensor, x_name: str = "x", y_name: str = "y") -> None:
    """Two tensors with the same number of rows (size of dim 0).

    Raises:
        ValueError: ``"x and y must have the same number of rows, got x (8, 1) and y (7,)"``.
    """
    if x.shape[:1] != y.shape[:1]:
        raise ValueError(
            f"{x_name} and {y_name} must have the same number of rows, got {x_name} "
            f"{tuple(x.shape)} and {y_name} {tuple(y.shape)}"
        )
