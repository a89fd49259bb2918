r"""What an automatic run reads between its epochs: scores of the recent iterates' average.

An automatic run (``fit(epochs=None)``, :mod:`~pyro_bbb.training.auto_epochs`) decides when
a stage is done from two scores, taken every few epochs (:func:`score_every`) of the average
of the stage's recent iterates (:class:`IterateAverage`), never of the last iterate alone:

* **the β = 1 ELBO's two parts** (:class:`SampleFit`, ``History.averaged_nll`` and
  ``History.averaged_kl``): the expected negative log-likelihood and the KL per data point,
  estimated on a fixed sample of the training rows by local reparameterisation; where their
  sum stops falling, fitting the likelihood no longer pays for the KL it costs, and where
  the expected log-likelihood stops rising, the full rate no longer pays;
* **the held-out log-likelihood** (:class:`HeldOutScore`, ``History.validation``), where
  ``fit(validation=...)`` gives rows to score: the mean over them of
  :math:`\log \frac1S \sum_s p(y_i \mid x_i, w_s)`, :math:`w_s \sim q`, with
  :data:`SCORE_SAMPLES` draws, nats a row (:func:`~pyro_bbb.metrics.log_likelihood`): what
  the predictive gains.

Each score takes the same draws every time (common random numbers: two scores differ
by what training changed, not by Monte Carlo noise), from a generator of its own, so the
fit's random stream is untouched and the network's buffers (BatchNorm's running statistics)
are left as they were. The held-out rows are scored as a validation pass is
(:func:`~pyro_bbb.nn.training_mode.in_evaluation_mode`: dropout off, batch normalisation by
its running statistics, every module's mode given back), so that their score is a function
of the weights and not of how the rows are split. At a constant rate the parameters wander
about where the steps lead them; the average follows the progress and not the wander, so
the scores are smooth enough to decide on after a few readings. Nothing here trains.

The full-rate stage also keeps its best-scoring average (:meth:`IterateAverage.keep_if_best`:
by the held-out score where rows are held out, else by the β = 1 ELBO on the training sample,
the objective itself, not its likelihood part alone, which would prefer the narrowest
posterior), and the run's last stage begins from it (:meth:`IterateAverage.restore_best`): where the
rate is too high for a network to hold its fit (784-400-400-10 on 60,000 images at
``lr=0.01``, batch 64) the stage ends because the fit is falling, and the decay would
otherwise start from the fallen iterate (early stopping's best weights, as Keras's
``EarlyStopping(restore_best_weights=True)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from .._random_state import seeded
from ..infer.elbo import AnnealedELBO
from ..infer.predictive import predict
from ..infer.reparam import estimator
from ..nn.draws import kept_buffers
from ..nn.training_mode import in_evaluation_mode
from .history import History

__all__ = [
    "SCORE_SAMPLES",
    "SCORE_STEPS",
    "HeldOutScore",
    "IterateAverage",
    "SampleFit",
    "Scores",
    "best_epoch",
    "held_out_score",
    "kept_score",
    "score_every",
]

#: Weight draws of a held-out score.
SCORE_SAMPLES = 8
#: The fewest optimiser steps between two scores.
SCORE_STEPS = 10
#: The most training rows the ELBO's parts are scored on (:class:`SampleFit`).
SAMPLE_ROWS = 1024
#: The :math:`\eta` of the iterate average (:class:`IterateAverage`): its last fifth.
AVERAGE_ETA = 4
#: Rows a held-out score evaluates at once (bounds its memory).
_CHUNK = 4096
#: Added to the order's seed for the scores' draws.
_SEED_OFFSET = 104_729


def score_every(steps_per_epoch: int) -> int:
    """Score after every epoch of at least :data:`SCORE_STEPS` steps, else every few epochs."""
    return max(1, math.ceil(SCORE_STEPS / steps_per_epoch))


def kept_score(nll: float, kl: float, validation: float, scored: bool) -> float:
    """What the full-rate stage keeps its best average by, of one epoch's scores.

    The held-out rows' score where rows are scored (``scored``), else the β = 1 ELBO on the
    training sample, ``-(nll + kl)``: the objective itself, not its likelihood part alone,
    which would prefer the narrowest posterior. Higher is better; ``nan`` where not read.
    The one definition: :class:`Scores` decides by it which average to keep
    (:meth:`IterateAverage.keep_if_best` records it), and :func:`best_epoch` names, from
    the History, the epoch kept.
    """
    return validation if scored else -(nll + kl)


def best_epoch(history: History, start: int, end: int, scored: bool) -> int | None:
    """The epoch of ``start`` to ``end - 1`` whose average scored best (:func:`kept_score`).

    Among the epochs since β last changed (scores at another β are of another objective);
    ``None`` where none was read.
    """
    while start < end - 1 and history.beta[start] != history.beta[end - 1]:
        start += 1
    rows = zip(
        history.averaged_nll[start:end],
        history.averaged_kl[start:end],
        history.validation[start:end],
        strict=True,
    )
    scores = [kept_score(nll, kl, v, scored) for nll, kl, v in rows]
    read = [(v, e) for e, v in enumerate(scores, start=start) if not math.isnan(v)]
    return max(read, key=lambda score_epoch: score_epoch[0])[1] if read else None


class IterateAverage:
    r"""A running average of the parameters over a stage: the iterate the scores read.

    Polynomial-decay averaging (Shamir and Zhang 2013), a form of Polyak–Ruppert averaging
    (Polyak and Juditsky 1992) whose window grows with the stage: after the :math:`t`-th
    update of a stage

    .. math:: \bar\theta_t = (1 - \alpha_t)\,\bar\theta_{t-1} + \alpha_t\,\theta_t,
        \qquad \alpha_t = \frac{\eta + 1}{t + \eta},

    which weighs iterate :math:`s` about as :math:`(s/t)^\eta`: the last
    :math:`1/(\eta + 1)` of the stage. It starts afresh with each stage (β and the rate
    change between them). Training never reads it.

    Args:
        params: The trained parameters (the steps keep updating them).
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self.values: list[torch.Tensor] | None = None
        self.count = 0
        self.stage = ""
        #: The stage's best-scoring average so far (:meth:`keep_if_best`), or ``None``.
        self.best: list[torch.Tensor] | None = None
        self.best_score = -math.inf
        self.best_beta = math.nan

    @torch.no_grad()
    def update(self, stage: str) -> None:
        """Average in the current parameters; a new ``stage`` restarts the average."""
        current = [p.detach() for p in self.params]
        if self.values is None or stage != self.stage:
            self.values = [p.clone() for p in current]
            self.count, self.stage = 1, stage
            self.best, self.best_score, self.best_beta = None, -math.inf, math.nan
            return
        self.count += 1
        torch._foreach_lerp_(self.values, current, (AVERAGE_ETA + 1) / (self.count + AVERAGE_ETA))

    @torch.no_grad()
    def keep_if_best(self, score: float, beta: float) -> None:
        """Keep a copy of the average when ``score`` (higher is better) is the best at ``beta``.

        Scores taken at another β are of another objective: a β that changed since the last
        call (a user's warm-up still rising) forgets the best kept so far.
        """
        if beta != self.best_beta:
            self.best, self.best_score, self.best_beta = None, -math.inf, beta
        if self.values is None or not score > self.best_score:  # a nan score keeps nothing
            return
        self.best_score = score
        if self.best is None:
            self.best = [v.clone() for v in self.values]
        else:
            torch._foreach_copy_(self.best, self.values)

    @torch.no_grad()
    def restore_best(self) -> bool:
        """Put the kept best average in the parameters' place, for good.

        Returns:
            Whether there was one to put (``False``: the parameters are left as they are).
        """
        if self.best is None:
            return False
        torch._foreach_copy_([p.detach() for p in self.params], self.best)
        self.best, self.best_score, self.best_beta = None, -math.inf, math.nan
        return True

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """Put the average in the parameters' place for the block, then put them back."""
        if self.values is None:
            yield
            return
        current = [p.detach() for p in self.params]
        with torch.no_grad():
            saved = [p.clone() for p in current]
            torch._foreach_copy_(current, self.values)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(current, saved)

    def state_dict(self) -> dict[str, Any]:
        """The average, its count, its stage and its best (what a checkpoint keeps)."""
        return {
            "values": self.values, "count": self.count, "stage": self.stage,
            "best": self.best, "best_score": self.best_score, "best_beta": self.best_beta,
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave."""

        def placed(values: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
            if values is None:
                return None
            return [v.to(p) for v, p in zip(values, self.params, strict=True)]

        self.values, self.best = placed(state.get("values")), placed(state.get("best"))
        self.count, self.stage = state.get("count", 0), state.get("stage", "")
        self.best_score = state.get("best_score", -math.inf)
        self.best_beta = state.get("best_beta", math.nan)


@contextmanager
def _apart(model: object, seed: int, *tensors: object) -> Iterator[None]:
    """Draw from ``seed`` inside, leaving the fit's random states and the net's buffers."""
    net = getattr(model, "net", None)
    buffers = kept_buffers(net) if isinstance(net, torch.nn.Module) else nullcontext()
    with seeded(seed, model, *tensors), buffers, torch.no_grad():
        yield


class HeldOutScore:
    """The log predictive density of held-out rows, nats a row (see the module).

    Args:
        x: The held-out features ``(M, *features)``, on the training device.
        y: Their targets ``(M[, dim])``.
        seed: Seed of the score's weight draws; every score takes the same draws.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, seed: int) -> None:
        self.x, self.y, self.seed = x, y, seed + _SEED_OFFSET

    def __len__(self) -> int:
        return self.x.shape[0]

    def __call__(self, model: Callable[..., Any], guide: Callable[..., Any]) -> float:
        """The score of ``model`` and ``guide`` as they are now; ``-inf`` if not finite."""
        # a validation pass: dropout off, batch normalisation by its running statistics
        with _apart(model, self.seed, self.x, guide), in_evaluation_mode(model):
            prediction = predict(model, guide, self.x, num_samples=SCORE_SAMPLES, batch_size=_CHUNK)
            value = prediction.log_likelihood(self.y)
        return value if math.isfinite(value) else -math.inf


class SampleFit:
    r"""The expected negative log-likelihood and the KL per data point, on a fixed sample.

    One estimate of the β = 1 ELBO's two parts (:class:`~pyro_bbb.infer.elbo.AnnealedELBO`)
    on a fixed sample of the training rows, scaled to the whole data set by the model
    (:math:`N/B`) and divided by :math:`N`: the loss ``History.plain_loss`` records, per data
    point. It is drawn with local reparameterisation where the layers allow it (Kingma,
    Salimans and Welling 2015): each row its own draw of its activations, which cuts the
    variance of the sum over rows by about their number, so one draw per row suffices.

    Args:
        x: A fixed sample of the training features, on the training device.
        y: Their targets.
        num_data: ``N``.
        seed: Seed of the score's draws; every score takes the same draws.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, num_data: int, seed: int) -> None:
        self.x, self.y, self.num_data, self.seed = x, y, num_data, seed + _SEED_OFFSET
        self._elbo = AnnealedELBO(1.0)

    def __call__(self, model: Callable[..., Any], guide: Callable[..., Any]) -> tuple[float, float]:
        """``(nll, kl)`` per data point of ``model`` and ``guide`` as they are now."""
        with _apart(model, self.seed, self.x, guide), estimator("local")():
            terms = self._elbo.terms(model, guide, self.x, self.y)
        nll, kl = (float(t) / self.num_data for t in (terms.nll, terms.kl))
        return (nll, kl) if math.isfinite(nll + kl) else (math.inf, math.inf)


def held_out_score(
    x: object,
    y: object,
    held: torch.Tensor | None,
    pair: tuple[torch.Tensor, torch.Tensor] | None,
    seed: int | None,
    device: torch.device,
) -> HeldOutScore | None:
    """The score of the held-out rows ``held`` of ``(x, y)``, or of a ``(x_val, y_val)`` pair.

    Args:
        x: ``fit``'s features.
        y: ``fit``'s targets.
        held: The held-out rows' indices, or ``None``.
        pair: Rows of the user's own ``(x_val, y_val)``, scored as given, or ``None``.
        seed: The seed of the minibatch order (the scores' draws derive from it).
        device: The training device.

    Returns:
        The :class:`HeldOutScore`, or ``None`` when nothing is scored.
    """
    seed = 0 if seed is None else seed
    if pair is not None:
        x_val, y_val = (t.to(device) for t in pair)
        return HeldOutScore(x_val, y_val, seed=seed)
    if held is None:
        return None
    index = held.to(device)
    return HeldOutScore(x.to(device)[index], y.to(device)[index], seed=seed)


class Scores:
    """The scores an automatic run reads, of the recent iterates' average.

    Args:
        params: The trained parameters.
        fit: The β = 1 ELBO's parts on a sample of training rows (``None`` in a fixed run,
            which scores nothing).
        held_out: The held-out rows' score, or ``None`` when no rows are held out.
    """

    def __init__(
        self, params: list[torch.Tensor], fit: SampleFit | None, held_out: HeldOutScore | None
    ) -> None:
        self.average = IterateAverage(params)
        self.fit, self.held_out = fit, held_out

    def after_epoch(
        self,
        model: Callable[..., Any],
        guide: Callable[..., Any],
        stage: str,
        reads: frozenset,
        beta: float = 1.0,
        phase: str | None = None,
    ) -> tuple[float, float, float]:
        """Average the epoch's parameters in and read what ``reads`` names.

        Args:
            model: The model.
            guide: The guide.
            stage: The epoch's stage (a new one restarts the average).
            reads: ``"fit"`` (the ELBO's parts on the training sample) and/or
                ``"validation"`` (the held-out rows); empty to only average.
            beta: The epoch's β; the full-rate stage keeps its best-scoring average among
                the epochs since β last changed (:meth:`IterateAverage.keep_if_best`).
            phase: The part of the stage the average restarts with (a halved rate's), or
                ``None`` for the stage itself.

        Returns:
            ``(nll, kl, validation)`` per data point and per held-out row, ``nan`` where
            not read.
        """
        self.average.update(stage if phase is None else phase)
        nll = kl = validation = math.nan
        if reads:
            with self.average.swapped():
                if "fit" in reads:
                    nll, kl = self.fit(model, guide)
                if "validation" in reads and self.held_out is not None:
                    validation = self.held_out(model, guide)
        if stage == "train":
            scored = self.held_out is not None
            self.average.keep_if_best(kept_score(nll, kl, validation, scored), beta)
        return nll, kl, validation
