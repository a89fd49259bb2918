"""What inference reads off a model's and a guide's sample sites, in one place.

Guides annotate their sites through Pyro's ``infer`` dict; the ELBO and the estimators read
those annotations. The keys live here, not in either side's module, so that a guide, the
ELBO and the estimators can each import them without importing one another. It also hands on
:func:`base_support` and :func:`is_real_valued`, the real-support check that guides and NUTS
share (defined on the model side, which needs it too), and holds :func:`model_in_plates`, by
which the ELBO, the predictive and the evaluation run a model inside a guide's own plate
(an ensemble's members).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._support import base_support, is_real_valued

__all__ = ["BLOCK_KEY", "JOINT_KEY", "base_support", "is_real_valued", "model_in_plates"]

#: ``infer`` key by which an auxiliary guide site declares that its value is the
#: concatenation of the (flattened) values of these model sites, in order, and that the
#: guide's own sites of those names are ``Delta`` slices of it. The ELBO then computes the KL
#: of the whole group in closed form against the product of the sites' priors where possible.
JOINT_KEY = "pyro_bbb_joint_of"

#: ``infer`` key of a model site drawn as a slice of a block: ``(block site, start, stop)``.
#: Local reparameterisation and flipout read it to find the block's distribution.
BLOCK_KEY = "pyro_bbb_block"


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
