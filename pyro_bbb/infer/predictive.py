r"""Vectorised Monte Carlo prediction and the split of uncertainty into its sources.

:func:`predict` draws ``S`` weight samples from the guide in one vectorised pass (a
``pyro.plate`` over samples, never a Python loop over them) and returns a
:class:`Prediction`: for regression the predictive mixture
:math:`p(y|x) \approx \frac1S \sum_s \mathcal{N}(y \mid \mu_s(x), \sigma_s^2(x))` with its
mean and its variance split by the law of total variance,

.. math::

    \mathrm{Var}[y] = \underbrace{\mathrm{Var}_s[\mu_s]}_{\text{epistemic}}
        + \underbrace{\mathbb{E}_s[\sigma_s^2]}_{\text{aleatoric}},

and for classification the per-sample logits, from which come the mean probabilities, exact
log-probabilities (log-softmax, never the log of a rounded probability) and the entropy split
:math:`\mathbb{H}[\bar p] = \mathbb{E}_s \mathbb{H}[p_s] + \mathrm{MI}` (expected entropy,
aleatoric, plus mutual information between label and weights, epistemic).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample

from .. import metrics
from .._heap import kept_heap
from .._support import independent_base
from .._validation import (
    check_choice,
    check_finite_tensor,
    check_guide,
    check_int,
    check_open_unit_interval,
    check_tensor,
)
from ..model import BNN, checked_network_output
from ..nn.training_mode import batch_norm_in_training_mode
from .guides._base import seeded_draws
from .linearised import check_gaussian_draws, linearised_outputs
from .reparam import estimator
from .sites import model_in_plates
from .slices import Concatenation, ModelReplay, draws_per_slice, expanded_parameter

__all__ = [
    "DRAW_BYTES",
    "ClassificationPrediction",
    "Prediction",
    "RegressionPrediction",
    "TrainingModeWarning",
    "draw_passes",
    "predict",
]


@dataclass(frozen=True)
class Prediction:
    """Predictive samples at a set of inputs; see the two subclasses for the summaries.

    Attributes:
        samples: Draws of the targets, ``(num_samples, batch[, dim])``.
    """

    samples: torch.Tensor

    @property
    def num_samples(self) -> int:
        """``S``, the number of weight samples."""
        return self.samples.shape[0]


@dataclass(frozen=True)
class RegressionPrediction(Prediction):
    """The predictive of a Gaussian likelihood, a mixture of ``S`` Gaussians per point.

    Attributes:
        samples: Draws of ``y``, ``(num_samples, batch[, dim])``.
        loc_samples: Mean of ``y`` under each weight sample, same shape.
        scale_samples: Noise std under each weight sample, broadcastable to it.
    """

    loc_samples: torch.Tensor
    scale_samples: torch.Tensor

    @property
    def mean(self) -> torch.Tensor:
        """Predictive mean ``(batch[, dim])``, target units."""
        return self.loc_samples.mean(0)

    @property
    def epistemic_std(self) -> torch.Tensor:
        r"""Epistemic std :math:`\sqrt{\mathrm{Var}_s[\mu_s]}`; ``(batch[, dim])``."""
        return self.loc_samples.var(0, unbiased=False).sqrt()

    @property
    def aleatoric_std(self) -> torch.Tensor:
        r"""Aleatoric std :math:`\sqrt{\mathbb{E}_s[\sigma_s^2]}`, ``(batch[, dim])``."""
        return self.scale_samples.expand_as(self.loc_samples).pow(2).mean(0).sqrt()

    @property
    def std(self) -> torch.Tensor:
        """Total predictive std, epistemic and aleatoric added in variance, ``(batch[, dim])``."""
        return (self.epistemic_std.pow(2) + self.aleatoric_std.pow(2)).sqrt()

    def interval(self, level: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
        """Central predictive interval of the mixture (not a Gaussian fit to it).

        Args:
            level: Probability mass inside, in ``(0, 1)``.

        Returns:
            ``(lower, upper)``, each ``(batch[, dim])``: the ``(1 ± level) / 2`` quantiles
            of the mixture, solved by bisection to 1e-6 of the predictive std.
        """
        check_open_unit_interval("level", level)
        alpha = (1 - level) / 2
        return self.quantile(alpha), self.quantile(1 - alpha)

    def quantile(self, q: float) -> torch.Tensor:
        """Quantile ``q`` of the predictive mixture at each point, ``(batch[, dim])``."""
        check_open_unit_interval("q", q)
        loc = self.loc_samples
        scale = self.scale_samples.expand_as(loc)
        component = dist.Normal(loc, scale)
        z = abs(dist.Normal(0.0, 1.0).icdf(torch.tensor(min(q, 1 - q) / loc.shape[0])).item())
        low = (loc - (z + 1) * scale).min(0).values
        high = (loc + (z + 1) * scale).max(0).values
        tolerance = 1e-6 * self.std.clamp_min(1e-12)
        for _ in range(100):
            mid = (low + high) / 2
            below = component.cdf(mid.unsqueeze(0)).mean(0) < q
            low = torch.where(below, mid, low)
            high = torch.where(below, high, mid)
            if bool(((high - low) <= tolerance).all()):
                break
        return (low + high) / 2

    def log_likelihood(self, y: torch.Tensor) -> float:
        """Mean log predictive density of ``y`` per point, from the mixture (nats)."""
        return metrics.gaussian_log_likelihood(self.loc_samples, self.scale_samples, y)

    def unstandardize(
        self, mean: torch.Tensor | float, std: torch.Tensor | float
    ) -> RegressionPrediction:
        """The prediction in original units, for a model trained on ``(y - mean) / std``.

        Args:
            mean: Training-target mean (target units), scalar or ``(dim,)``.
            std: Training-target std, positive, scalar or ``(dim,)``.

        Returns:
            A new prediction whose samples, means and scales are in target units.
        """
        std = torch.as_tensor(std, dtype=self.loc_samples.dtype, device=self.loc_samples.device)
        if (std <= 0).any():
            raise ValueError(f"std must be positive, got {std}")
        return replace(
            self,
            samples=self.samples * std + mean,
            loc_samples=self.loc_samples * std + mean,
            scale_samples=self.scale_samples * std,
        )


@dataclass(frozen=True)
class ClassificationPrediction(Prediction):
    r"""The predictive of a Categorical or Bernoulli likelihood, kept as logits.

    Probabilities, log-probabilities and entropies are all derived from the logits, so the
    log-probabilities stay exact where probabilities round to 0 or 1 (a confident error of
    200 nats is reported as 200, not as the 27.6 nats of a probability clamped at 1e-12).

    **One convention for both likelihoods**: :attr:`probs`, :attr:`log_probs`,
    :attr:`probs_samples` and :attr:`log_probs_samples` end with a dim over the classes, two
    for a Bernoulli likelihood (``[y = 0, y = 1]``), so ``probs`` is ``log_probs.exp()`` and
    ``predicted`` its ``argmax`` for either. :mod:`pyro_bbb.metrics` takes them as they are
    (its functions also take a binary :math:`p(y=1)` ``(batch,)`` of your own). Two columns,
    not :math:`p(y=1)` alone, because :math:`\log p(y=0)` cannot be recovered from
    :math:`\log p(y=1)` once :math:`p(y=1)` rounds to 1: the log-probabilities need both,
    and the probabilities follow them. ``probs[..., 1]`` is :math:`p(y=1)`.

    Attributes:
        samples: Draws of the labels, ``(num_samples, batch[, dim])``.
        logits_samples: The logits under each weight sample: ``(num_samples, batch,
            classes)`` for Categorical, ``(num_samples, batch[, dim])`` of
            :math:`\log\frac{p(y=1)}{p(y=0)}` for Bernoulli.
        binary: Whether the logits are Bernoulli logits.
    """

    logits_samples: torch.Tensor
    binary: bool = False

    @classmethod
    def from_probs(
        cls, samples: torch.Tensor, probs_samples: torch.Tensor, *, binary: bool = False
    ) -> ClassificationPrediction:
        """Build a prediction from per-sample probabilities (their logs become the logits).

        Args:
            samples: Draws of the labels, ``(num_samples, batch[, dim])``.
            probs_samples: Class probabilities ``(num_samples, batch, classes)``, or
                :math:`p(y=1)` ``(num_samples, batch[, dim])`` if ``binary``.
            binary: Whether the probabilities are Bernoulli :math:`p(y=1)`.
        """
        logits = torch.logit(probs_samples) if binary else probs_samples.log()
        return cls(samples=samples, logits_samples=logits, binary=binary)

    @property
    def probs_samples(self) -> torch.Tensor:
        """Class probabilities under each weight sample, ``(num_samples, batch[, dim], classes)``.

        Binary predictions have the two classes ``[p(y=0), p(y=1)]`` as the last dim.
        """
        if self.binary:
            logits = self.logits_samples
            return torch.sigmoid(torch.stack([-logits, logits], -1))
        return torch.softmax(self.logits_samples, -1)

    @property
    def log_probs_samples(self) -> torch.Tensor:
        """Log-probabilities under each weight sample, ``(num_samples, batch[, dim], classes)``.

        Binary predictions have the two classes ``[log p(y=0), log p(y=1)]`` as the last dim.
        """
        if self.binary:
            logits = self.logits_samples
            return torch.nn.functional.logsigmoid(torch.stack([-logits, logits], -1))
        return torch.log_softmax(self.logits_samples, -1)

    @property
    def probs(self) -> torch.Tensor:
        """Mean predictive probabilities, ``(batch[, dim], classes)``; binary: two classes."""
        return self.probs_samples.mean(0)

    @property
    def log_probs(self) -> torch.Tensor:
        r"""Log of the mean predictive probabilities, ``(batch[, dim], classes)``.

        :math:`\log \frac1S \sum_s p(y \mid w_s)` by ``logsumexp`` of the per-sample
        log-softmax, exact where the probabilities underflow; binary predictions get the two
        columns ``[log p(y=0), log p(y=1)]``. This is what :func:`pyro_bbb.metrics.nll` takes.
        """
        return torch.logsumexp(self.log_probs_samples, 0) - math.log(self.num_samples)

    @property
    def predicted(self) -> torch.Tensor:
        """The most probable label per point, ``(batch[, dim])``."""
        return self.probs.argmax(-1)

    @staticmethod
    def _entropy(log_p: torch.Tensor) -> torch.Tensor:
        """Entropy over the last (class) dim from log-probabilities, 0 log 0 = 0."""
        return -(log_p.exp() * log_p.clamp_min(torch.finfo(log_p.dtype).min)).sum(-1)

    @property
    def entropy(self) -> torch.Tensor:
        r"""Predictive entropy :math:`\mathbb{H}[\bar p]`, the total (nats), ``(batch[, dim])``."""
        return self._entropy(self.log_probs)

    @property
    def expected_entropy(self) -> torch.Tensor:
        r""":math:`\mathbb{E}_s\,\mathbb{H}[p_s]`, the aleatoric part (nats), ``(batch[, dim])``."""
        return self._entropy(self.log_probs_samples).mean(0)

    @property
    def mutual_information(self) -> torch.Tensor:
        r""":math:`\mathbb{H}[\bar p] - \mathbb{E}_s\mathbb{H}[p_s]`, the epistemic part (nats)."""
        return (self.entropy - self.expected_entropy).clamp_min(0)

    def log_likelihood(self, y: torch.Tensor) -> float:
        r"""Mean log predictive probability of the labels ``y`` per point (nats).

        :math:`\frac1N\sum_i \log \frac1S\sum_s p(y_i \mid w_s)`, from the log-softmax
        (log-sigmoid) of the logits, so a confident error counts in full. For multi-label
        Bernoulli targets ``(batch, dim)`` the labels of one point are joint under each
        sample (a product over ``dim``), not averaged separately.
        """
        if self.binary:
            y = y.to(self.logits_samples.dtype).expand_as(self.logits_samples)
            log_p = -torch.nn.functional.binary_cross_entropy_with_logits(
                self.logits_samples, y, reduction="none"
            )
            log_p = log_p.reshape(*log_p.shape[:2], -1).sum(-1)
        else:
            index = y.long().reshape(1, -1, 1).expand(self.num_samples, -1, 1)
            log_p = torch.log_softmax(self.logits_samples, -1).gather(-1, index).squeeze(-1)
        return metrics.log_likelihood(log_p)


PREDICTIVES = ("sample", "linearised")


class TrainingModeWarning(UserWarning):
    """:func:`predict` on a network whose batch normalisation is in training mode."""


#: The memory the guide's draws of one pass of :func:`predict` may take, in bytes (256 MiB):
#: more draws than fit are taken in passes (:func:`draw_passes`).
DRAW_BYTES = 256 * 2**20


@torch.no_grad()
def predict(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    x: torch.Tensor,
    *,
    num_samples: int = 100,
    predictive: str | None = None,
    reparam: str | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
) -> RegressionPrediction | ClassificationPrediction:
    r"""Monte Carlo predictive distribution at ``x``, vectorised over weight samples.

    The guide is drawn once, ``num_samples`` times in one pass; the model is replayed on
    those weights for each slice of the rows of ``x`` (so slices share the same weight
    samples), slices sized by the memory their activations take (``batch_size``). Draws of
    every weight that would take more than :data:`DRAW_BYTES` (256 MiB: 1,000 draws of a
    784-400-400-10 network's 478,410 weights take 1.9 GB, 100 of a ResNet-18's 4.5 GB) are
    drawn in passes of as many as fit, one after another from the same random stream, each
    over every slice (:func:`draw_passes`).

    ``predictive="linearised"`` gives the linearised (GLM) predictive of a Gaussian guide
    instead (Immer, Korzepa and Bauer 2021; :mod:`~pyro_bbb.infer.linearised`): the network
    linearised at the guide's mean :math:`\mu`, its outputs at the same draws
    :math:`f(x;\mu) + J(x)(\theta_s - \mu)`, Gaussian with covariance :math:`J\Sigma J^\top`.
    It is the predictive a belief built from Gauss-Newton curvature is made for (the online
    filters', a Laplace approximation's): the network run at such draws under-fits and
    over-states its uncertainty. It costs about twice the sampled predictive (a forward-mode
    product per draw).

    Args:
        model: A :class:`~pyro_bbb.BNN`.
        guide: A trained guide for it (any Pyro guide).
        x: Inputs ``(batch, *features)`` on the model's device.
        num_samples: ``S``, weight samples (30–100 is typical); for an
            :class:`~pyro_bbb.infer.Ensemble`, samples of each member, so the prediction
            holds ``K·S`` samples, ``S`` of each member: its uniform mixture.
        predictive: ``"sample"``, the network at each weight draw, or ``"linearised"``,
            the network linearised at the guide's mean (a :class:`~pyro_bbb.BNN` and a
            guide that draws Gaussian weights: ``MeanFieldGuide``, ``LowRankGuide``,
            ``LowRankPrecisionGuide``, Pyro's Gaussian autoguides; not an ``Ensemble``).
            ``None`` takes the guide's ``default_predictive`` where it names one (an online
            filter's :class:`~pyro_bbb.online.LowRankPrecisionGuide`: ``"linearised"``), else
            ``"sample"``.
        reparam: ``None``, ``"local"`` or ``"flipout"``: the estimator to predict with. Under
            ``"local"`` each point gets its own weight draw, so samples are not joint
            functions across points; for MLPs the marginal predictive per point is the same,
            for conv nets it is approximate (see :mod:`pyro_bbb.infer.reparam`). ``None`` is exact.
        batch_size: Rows of ``x`` per pass. ``None`` sizes the passes by memory: a probe on
            two rows counts the activations a row takes at ``num_samples`` draws (what the
            network's modules return), and each pass takes as many rows as hold about
            :data:`~pyro_bbb.infer.slices.SLICE_BYTES` (256 MiB), so memory does not grow
            with ``len(x)`` (a LeNet-5 at 50 draws: about 90 images a pass). Give a number
            for larger passes (a GPU) or smaller ones. The passes share the guide's draws and
            the targets are drawn once from every row's distribution, so the prediction is
            the same for any ``batch_size`` (to floating-point rounding of the network, in
            practice bit for bit), except under ``reparam="local"``/``"flipout"``, whose noise
            is drawn pass by pass. On the CPU, with ``PYRO_BBB_KEEP_HEAP=1``, the passes
            reuse the memory the previous one freed (glibc; as in :func:`~pyro_bbb.fit`).
        seed: The draws' seed: the same seed gives the same prediction. The caller's random
            state is left as it was (a prediction inside a training loop does not reset the
            loop's draws); ``None`` draws from the current state and advances it.

    Returns:
        A :class:`RegressionPrediction` or :class:`ClassificationPrediction`.

    Warns:
        TrainingModeWarning: When a batch normalisation of the network is in training mode
            (call ``model.eval()`` first, as in plain PyTorch).

    Raises:
        ValueError: On bad options, or inputs with NaN/inf or that the model refuses; for
            ``"linearised"``, on a guide whose draws are not Gaussian, an ensemble, or a
            ``reparam``.
        NotImplementedError: For a likelihood other than a Normal, Categorical or
            Bernoulli one.
        TypeError: If ``guide`` cannot be called (an online updater's posterior is its
            ``.guide``).
    """
    check_guide("guide", guide)
    if predictive is None:
        predictive = getattr(guide, "default_predictive", "sample")
    check_choice("predictive", predictive, PREDICTIVES)
    check_int("num_samples", num_samples)
    check_int("batch_size", batch_size, optional=True)
    dtype = getattr(model, "dtype", None)
    check_tensor("x", x, dtype if isinstance(dtype, torch.dtype) else torch.float32)
    if torch.is_floating_point(x) and x.device.type != "meta":  # the model names a meta x
        check_finite_tensor("x", x)
    if isinstance(model, BNN):  # before the network runs on a few rows of x
        model.check_inputs(x)
    if predictive == "linearised":
        _check_linearisable(model, guide, reparam)
    observed = getattr(model, "observation_site", "obs")
    members = getattr(guide, "num_members", 1)
    module = model if isinstance(model, torch.nn.Module) else None
    normalised = (
        None if module is None else batch_norm_in_training_mode(getattr(module, "net", module))
    )
    if normalised is not None:
        warnings.warn(
            f"predict: the network's {normalised} is in training mode, so each slice of rows "
            "is normalised by its own statistics (the prediction depends on the rows and on "
            "batch_size) and updates the running ones; call model.eval() before predicting "
            "(and model.train() before fitting again)",
            TrainingModeWarning,
            stacklevel=3,
        )
    model, nesting = model_in_plates(model, guide)
    dim = -((nesting or 1) + 1)  # the draws' plate, left of the model's (and the members')
    linearised = predictive == "linearised"  # linearised at one mean: its draws in one pass
    passes = [num_samples] if linearised else draw_passes(guide, num_samples)
    with seeded_draws(guide, seed, x), estimator(reparam)(), _explained(module, x):
        together = Concatenation(num_samples, along="draws") if len(passes) > 1 else None
        for draws in passes:  # one pass of every draw, unless they would not fit DRAW_BYTES
            plate = pyro.plate("predictive_samples", draws, dim=dim)
            guide_trace = poutine.trace(plate(guide)).get_trace(x)
            replay = ModelReplay(model, guide_trace, plate, observed, module)
            if batch_size is None:
                # the linearised pass carries a tangent beside each activation
                batch_size = replay.rows_per_slice(x, factor=2 if linearised else 1)
            chunks = torch.split(x, batch_size)
            # asked to, chunks on the CPU reuse the memory the last one freed (pyro_bbb._heap)
            with kept_heap(len(chunks) > 1 and x.device.type == "cpu"):
                if linearised:
                    return _linearised(module, guide, guide_trace, chunks, num_samples)
                rows = Concatenation(x.shape[0])
                for chunk in chunks:
                    rows.add(replay.observation(chunk))
                fn = rows.result()
            if together is not None:
                together.add(fn)
            del guide_trace, replay, rows  # this pass's draws, before the next pass's
        if together is not None:
            fn = together.result()
        # drawn once from every row's distribution, as Pyro draws a site: fn() (rsample if it can)
        return _summarise(fn, fn(), num_samples * members)


@contextlib.contextmanager
def _explained(module: torch.nn.Module | None, x: torch.Tensor) -> Iterator[None]:
    """Where the draws' pass fails, the network of a BNN run plainly on two rows says why.

    An input with a dim the network does not take fails inside a layer, on the draws' dim
    against the stray one; the plain run names it (:func:`~pyro_bbb.model.check_network_output`).
    Any other failure is raised as it came.
    """
    try:
        yield
    except RuntimeError as error:
        if isinstance(module, BNN):
            try:
                checked_network_output(module.net, x[:2])
            except ValueError as explained:
                raise explained from error
            except RuntimeError:
                pass
        raise


def draw_passes(guide: Callable[..., Any], num_samples: int) -> list[int]:
    """The draws in each pass of :func:`predict`: all at once, unless over :data:`DRAW_BYTES`.

    The guide's draws of every weight, ``num_samples`` times, are held while the model runs
    on them: 100 draws of a ResNet-18's 11 million weights take 4.5 GB. Where they would
    take more than :data:`DRAW_BYTES`, they are drawn in passes of as many as fit, each run
    over every slice of the rows, one after the other from the same random stream (other
    numbers than one pass would draw, from the same distribution). The size of a draw is
    read from the guide's prototype trace (its sites' shapes; an ensemble's, once a member);
    a guide without one takes one pass.

    Returns:
        The draws of each pass, summing to ``num_samples``.
    """
    trace = getattr(guide, "prototype_trace", None)
    per_draw = 0
    if trace is not None:
        for site in trace.nodes.values():
            if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site):
                value = site["value"]
                per_draw += value.numel() * value.element_size()
    per_draw *= getattr(guide, "num_members", 1)
    size = draws_per_slice(per_draw, num_samples, DRAW_BYTES)
    return [min(size, num_samples - start) for start in range(0, num_samples, size)]


def _check_linearisable(model, guide, reparam) -> None:
    if not isinstance(model, BNN):
        raise ValueError(
            "predictive='linearised' needs a pyro_bbb.BNN (its network linearised at the "
            f"guide's mean), got {type(model).__name__}"
        )
    if getattr(guide, "num_members", 1) > 1:
        raise ValueError(
            "predictive='linearised' linearises at one mean; an Ensemble has one per member: "
            "use predictive='sample'"
        )
    if reparam is not None:
        raise ValueError(
            f"predictive='linearised' draws whole weight vectors; reparam must be None, got "
            f"{reparam!r}"
        )


def _linearised(model, guide, guide_trace, chunks, num_samples):
    """The linearised predictive at each chunk, from the guide's draws in ``guide_trace``."""
    check_gaussian_draws(guide_trace, model)
    mean = {name: value.detach() for name, value in guide.median(chunks[0]).items()}
    draws = {
        name: guide_trace.nodes[name]["value"].reshape(num_samples, *mean[name].shape)
        for name in mean
        if name in guide_trace.nodes
    }
    together = Concatenation(sum(chunk.shape[0] for chunk in chunks))
    for chunk in chunks:
        together.add(model.likelihood(linearised_outputs(model, mean, draws, chunk)))
    fn = together.result()
    return _summarise(fn, fn.sample(), num_samples)


def _summarise(fn: dist.TorchDistribution, draws: torch.Tensor, num_samples: int) -> Prediction:
    """The prediction from the observation's distribution over every row and draws of it."""
    event_dim = fn.event_dim
    base = independent_base(fn)

    def parameter(name: str, event: int = event_dim) -> torch.Tensor:
        """A parameter expanded to the batch shape: ``(S, batch, *event)``."""
        return _samples_first(expanded_parameter(base, name), num_samples, event)

    samples = _samples_first(draws, num_samples, event_dim)
    if isinstance(base, dist.Normal):
        return RegressionPrediction(
            samples=samples, loc_samples=parameter("loc"), scale_samples=parameter("scale")
        )
    if isinstance(base, dist.Categorical):
        return ClassificationPrediction(samples=samples, logits_samples=parameter("logits", 1))
    if isinstance(base, dist.Bernoulli):
        return ClassificationPrediction(
            samples=samples, logits_samples=parameter("logits"), binary=True
        )
    raise NotImplementedError(
        "predict summarises Normal, Categorical and Bernoulli likelihoods, got "
        f"{type(base).__name__}"
    )


def _samples_first(t: torch.Tensor, num_samples: int, event_dim: int) -> torch.Tensor:
    """``(S, 1, ..., batch, *event)`` or ``(batch, *event)`` → ``(S, batch, *event)``."""
    batch_and_event = t.shape[t.dim() - 1 - event_dim :]
    return t.reshape(-1, *batch_and_event).expand(num_samples, *batch_and_event)
