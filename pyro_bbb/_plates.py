"""The plates a model runs in under a guide that draws inside a plate of its own.

An :class:`~pyro_bbb.infer.Ensemble` draws its members' sites inside a plate left of the
model's plates, and the model must run inside it too, as Pyro's ELBOs run model and guide
inside their particle plate. :func:`model_in_plates` is how every side that replays a model
against a guide (the ELBO, the predictive, the evaluation, saving) asks for that; it knows no
guide class, only the ``members_plate()`` method such a guide has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["model_in_plates"]


def model_in_plates(
    model: Callable[..., Any], guide: Callable[..., Any]
) -> tuple[Callable[..., Any], int | None]:
    """The model as ``guide``'s draws need it, and the plate depth of the two together.

    A guide that draws its sites inside a plate of its own, left of the model's plates (an
    :class:`~pyro_bbb.infer.Ensemble`'s members), says so with a ``members_plate()`` method
    returning that plate; the model must then run inside it too, as Pyro's ELBOs run both
    inside their particle plate.

    Returns:
        ``(model inside the guide's plate, the plate's depth)`` for such a guide; otherwise
        ``(model, its declared max_plate_nesting)``, the depth ``None`` if it declares none.
    """
    members_plate = getattr(guide, "members_plate", None)
    if members_plate is not None:
        plate = members_plate()
        return plate(model), -plate.dim
    nesting = getattr(model, "max_plate_nesting", None)
    return model, nesting if isinstance(nesting, int) else None
