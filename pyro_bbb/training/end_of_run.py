"""The end of a fit: why it ended, the stamp left on the guide, the collapse check.

Run once after the last epoch (:func:`~pyro_bbb.training.loop.fit`); the convergence
check's own verdict and warning are :mod:`~pyro_bbb.training.run_length`'s.
"""

from __future__ import annotations

import dataclasses
from contextlib import suppress

import torch

from ..infer.collapse import FRACTION_THRESHOLD as COLLAPSE_FRACTION
from ..infer.collapse import diagnose_collapse, target_spread, warn_if_collapsed
from .continuation import FitEnd
from .history import History
from .minibatches import Batches
from .run_length import RunLength

__all__ = ["check_collapse", "stamp", "stopped"]


def stopped(length: RunLength, history: History, stop: bool) -> str:
    """Why the run ended (``History.stopped``): a callback (``stop``), or its length's end.

    A continued fit (``History.continues``) says first what it continued from.
    """
    if stop:
        ended = f"a callback stopped the run after epoch {len(history) - 1:,}"
    else:
        ended = length.stopped(history)
    origin = history.continues
    if origin is None:
        return ended
    return (
        f"continued a fit of {origin['epochs']:,} epochs ({origin['steps']:,} steps) from its "
        f"end, at beta = {origin['beta']:.3g} and the rate {origin['lr']:.3g} it left; {ended}"
    )


def stamp(guide: object, end: FitEnd) -> None:
    """Leave on the guide how its last fit ended: ``guide.fit_end`` and ``guide.fit_until``.

    ``fit_until`` (``History.until``) is read where the posterior itself is read
    (:mod:`~pyro_bbb.evaluation`), which warns when the run stopped on the predictive;
    ``fit_end`` is where the next fit of the guide starts from
    (:mod:`~pyro_bbb.training.continuation`). :func:`~pyro_bbb.save` keeps both. A guide
    that takes no attributes is left as it is.
    """
    with suppress(AttributeError, TypeError):
        guide.fit_until = end["until"]
        guide.fit_end = end


def check_collapse(model, guide, history: History, batches: Batches, *, done: bool) -> None:
    """Warn with :class:`~pyro_bbb.PosteriorCollapseWarning` if the fit ended collapsed.

    The per-epoch fraction of weights at their prior, or a learned noise (one scale) above
    the targets' standard deviation, decides whether to look; the diagnosis then runs the
    predictive on up to 2,048 training points
    (:attr:`~pyro_bbb.infer.collapse.CollapseDiagnosis.collapsed` says what it reads). The
    noise is judged only where the run is ``done`` (it ended by its own rule or converged,
    not by a callback): a noise still near its initial 1 after a few fixed epochs, where a
    budget cut the run, or where a callback stopped it, is a fit not done.
    """
    x, y = batches.sample(2048)
    at_prior = bool(history.collapsed) and history.collapsed[-1] >= COLLAPSE_FRACTION
    if at_prior or (done and _noise_above_targets(model, y)):
        diagnosis = diagnose_collapse(model, guide, x, y)
        if diagnosis is not None and not done:
            diagnosis = dataclasses.replace(diagnosis, noise_learned=False)
        warn_if_collapsed(diagnosis, stacklevel=4)


def _noise_above_targets(model, y: torch.Tensor) -> bool:
    """Whether a learned homoscedastic noise is above the targets' standard deviation."""
    likelihood = getattr(model, "likelihood", None)
    if not getattr(likelihood, "learned", False) or not y.is_floating_point() or len(y) < 2:
        return False
    return likelihood.noise_scale().detach().mean().item() > target_spread(y)
