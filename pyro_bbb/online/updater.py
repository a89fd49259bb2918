r"""What every online updater shares: the model, the belief as a guide, checks, a learned noise.

An updater keeps a Gaussian belief over a :class:`~pyro_bbb.BNN`'s Bayesian weights and folds
each minibatch into it with ``update(x, y)``. :class:`OnlineUpdater` does what does not depend
on the filter's algebra:

* it checks the model (Gaussian priors; Gaussian, Categorical or Bernoulli likelihood) and each
  minibatch (shapes, dtype, device, finite values, labels), naming what is wrong;
* it sets itself up at the first minibatch (the weights' layout from one trace, the network
  as a function of the flat weights) or at once from a guide already set up;
* it starts from the prior, or from a guide (:class:`Start`: mean-field, low-rank, or
  precision form);
* it pulls the likelihood's gradient and curvature root back through the network for a
  filter step (:func:`~pyro_bbb.online.network.pull_back_rows`);
* it scores each minibatch under the belief before it, after the drift that
  ``dynamics_noise`` adds (the one-step-ahead predictive, :class:`Ahead`), and adds its
  log-density to :attr:`OnlineUpdater.log_evidence`;
* from the same predictive it estimates a Gaussian's learned noise scale
  (:class:`~pyro_bbb.online.empirical_bayes.NoiseEstimate`), written to the likelihood, and,
  when asked, the prior's scale
  (:class:`~pyro_bbb.online.empirical_bayes.PriorScaleEstimate`), applied to the belief;
* it shows the belief as a :class:`~pyro_bbb.online.LowRankPrecisionGuide` (:attr:`guide`),
  converted when the guide is next used, so it is current at every point of the stream.

A filter (:class:`~pyro_bbb.online.LoFi`, :class:`~pyro_bbb.online.RVGA`) supplies its state
(its start, and its conversion to the guide's form) and the pure functions of it, from its own
module, as a :class:`FilterAlgebra`; the updater runs the step both filters take with them:
the drift, then one or more Gauss-Newton steps on the minibatch, each pulled back at the mean
or at mirrored draws of the last iterate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.distributions import MultivariateNormal, constraints, transform_to

from .._validation import (
    check_features,
    check_finite_tensor,
    check_nonnegative_number,
    check_same_rows,
    check_tensor,
)
from ..infer.guides import LowRankGuide, MeanFieldGuide
from ..model import BNN
from ..nn.training_mode import module_in_training_mode
from ..priors.precision_normal import CovarianceRootNormal
from .empirical_bayes import NoiseEstimate, PriorScaleEstimate
from .guide import Belief, CovarianceRoot, LowRankPrecisionGuide
from .network import WeightLayout, layout_of_trace, network_function, pull_back_rows, weight_layout
from .observation import Observation

__all__ = ["Ahead", "FilterAlgebra", "OnlineUpdater", "Start"]


class Start(NamedTuple):
    r"""A starting belief over the flat weights, in whichever form its source holds it.

    Attributes:
        mean: ``(d,)``.
        precision_diag: The diagonal of a precision ``(d,)`` (with ``precision_factor``), or
            ``None`` when ``covariance`` is given.
        precision_factor: ``(d, k)`` or ``None``.
        covariance: A dense covariance ``(d, d)`` (from a ``LowRankGuide``), or ``None``.
        covariance_root: A square root ``(d, d)`` of the covariance (from a full-rank
            ``LowRankPrecisionGuide`` that holds one), or ``None``.
    """

    mean: torch.Tensor
    precision_diag: torch.Tensor | None
    precision_factor: torch.Tensor | None
    covariance: torch.Tensor | None
    covariance_root: torch.Tensor | None = None


class Ahead(NamedTuple):
    """A minibatch under the belief before it, after the drift (the one-step-ahead predictive).

    Attributes:
        residual: Errors of the predictive mean, ``(B, C)`` (``None`` for a classifier).
        epistemic: The belief's variance of the outputs, ``(B, C)``.
        log_likelihood: The minibatch's log predictive density (nats, a scalar tensor).
        jacobian: The outputs' Jacobian rows ``(C, S, B, d)`` at the ``S`` weight vectors the
            step pulled back at (``None`` for a classifier).
    """

    residual: torch.Tensor | None
    epistemic: torch.Tensor
    log_likelihood: torch.Tensor
    jacobian: torch.Tensor | None


class FilterAlgebra(NamedTuple):
    r"""A filter's pure functions of its state, which the updater calls: its module's own.

    :math:`\Sigma` is the belief's covariance, in whatever form the state holds it.

    Attributes:
        predict: ``predict(state, dynamics_noise)``: the belief after the drift,
            :math:`\Sigma + qI`.
        draws: ``draws(state, num_samples)``: mirrored draws :math:`\mu \pm \varepsilon_s`,
            ``(num_samples, d)``, from torch's global random state.
        update: ``update(state, gradient, curvature_rows, *, iterate=None)``: the
            Gauss-Newton step on a minibatch from the belief before it, with the likelihood's
            gradient ``(d,)`` and curvature rows ``(k, d)`` taken at ``iterate`` (``None``:
            at the belief's mean).
        output_covariance: ``output_covariance(state, rows)``: :math:`A\Sigma A^\top` for
            Jacobian rows :math:`A` ``(..., k, d)``; ``(..., k, k)``.
        covariance_rows: ``covariance_rows(state, rows)``: ``rows @ Σ`` for rows ``(k, d)``,
            :math:`(\Sigma a)^\top` of each row :math:`a`.
        shift_prior: ``shift_prior(state, delta, anchor)``: the belief with precision
            :math:`\Lambda + \mathrm{diag}(\delta)` and its mean moved by the Newton step
            towards ``anchor`` that the added precision implies,
            :math:`\mu + (\Lambda + \mathrm{diag}\,\delta)^{-1}\,\delta \odot (\mu_0 - \mu)`.
    """

    predict: Callable[[Any, float], Any]
    draws: Callable[[Any, int], torch.Tensor]
    update: Callable[..., Any]
    output_covariance: Callable[[Any, torch.Tensor], torch.Tensor]
    covariance_rows: Callable[[Any, torch.Tensor], torch.Tensor]
    shift_prior: Callable[[Any, torch.Tensor, torch.Tensor], Any]


class OnlineUpdater:
    r"""Base of the online updaters; see the module's notes.

    Attributes:
        model: The :class:`~pyro_bbb.BNN`.
        guide: The belief as a :class:`~pyro_bbb.online.LowRankPrecisionGuide`, current at
            every point of the stream.
        state: The filter's state (its own form of the belief; ``None`` before set-up).
        num_seen: Points folded in so far.
        num_updates: Minibatches folded in so far.
        log_evidence: The sum over the stream of the one-step-ahead log predictive densities
            :math:`\log p(y_t \mid x_t, y_{<t})` (nats, linearised), the prequential score
            of Dawid (1984): by the chain rule the stream's log marginal likelihood under
            the filter, each term measured before the filter saw its minibatch.
        dynamics_noise: Weight variance added to the belief before each step.
        num_iterations: Gauss-Newton steps on each minibatch.

    Args:
        model: A :class:`~pyro_bbb.BNN`.
        algebra: The filter's functions of its state.
        guide: ``None``, a ``MeanFieldGuide``, a ``LowRankGuide`` or a
            ``LowRankPrecisionGuide`` (the belief to start from; the last is updated in place).
        guide_rank: The rank of the guide the updater creates (``None``: full).
        dynamics_noise: Weight variance added to the belief before each step.
        init_loc: The starting mean when ``guide`` is ``None``.
        learn_prior_scale: Learn a multiplier of the starting belief's precision from the
            stream (:class:`~pyro_bbb.online.empirical_bayes.PriorScaleEstimate`): for a
            Gaussian likelihood and a start with a diagonal precision (the prior, or a
            ``MeanFieldGuide``); refused otherwise.
        num_iterations: Gauss-Newton steps on each minibatch, each taken at the last
            iterate (1: the filter's plain step).
        num_draws: ``None`` to take each step's expectations at the mean (linearised), or
            an even number of mirrored draws to take them by Monte Carlo.

    Raises:
        ValueError: If ``learn_prior_scale`` is asked of a classifier (at once) or of a
            start whose precision is not diagonal (where the start is known: at once for a
            guide that is set up, else at the first update).
    """

    def __init__(
        self,
        model: Any,
        guide: Any,
        *,
        algebra: FilterAlgebra,
        guide_rank: int | None,
        dynamics_noise: float,
        init_loc: Any,
        learn_prior_scale: bool = False,
        num_iterations: int = 1,
        num_draws: int | None = None,
    ) -> None:
        if not isinstance(model, BNN):
            raise TypeError(f"model must be a pyro_bbb.BNN, got {type(model).__name__}")
        self.model = model
        self.algebra = algebra
        self.num_iterations = num_iterations
        self._num_draws = num_draws
        self.observation = Observation(model.likelihood)
        self.dynamics_noise = check_nonnegative_number("dynamics_noise", dynamics_noise)
        self.learn_prior_scale = bool(learn_prior_scale)
        if self.learn_prior_scale and not self.observation.regression:
            raise ValueError(
                "learn_prior_scale=True learns the prior's scale from a Gaussian likelihood's "
                "one-step-ahead predictive, but the model's likelihood is a "
                f"{type(model.likelihood).__name__}; leave learn_prior_scale=False for a "
                "classifier"
            )
        self._prior_scale: PriorScaleEstimate | None = None
        self._anchor: tuple[torch.Tensor, torch.Tensor] | None = None
        self._prior_applied = 1.0
        self.state: Any = None
        self.num_seen = 0
        self.num_updates = 0
        self.log_evidence = 0.0
        self._layout: WeightLayout | None = None
        self._network: Callable | None = None
        self._num_outputs: int | None = None
        self._noise: NoiseEstimate | None = None
        self._stale = False
        if guide is not None and not isinstance(
            guide, (LowRankPrecisionGuide, MeanFieldGuide, LowRankGuide)
        ):
            raise TypeError(
                "guide must be None, a MeanFieldGuide, a LowRankGuide or a "
                f"LowRankPrecisionGuide, got {type(guide).__name__}"
            )
        if guide is not None and guide.model is not model:
            raise ValueError("guide was built for another model")
        if isinstance(guide, LowRankPrecisionGuide):
            self._check_guide(guide)
            self.guide = guide
            source = guide if guide.is_set_up else None
        else:
            self.guide = LowRankPrecisionGuide(model, rank=guide_rank, init_loc=init_loc)
            if guide is not None and guide.prototype_trace is None:
                raise ValueError(
                    f"the {type(guide).__name__} to start from has no parameters yet; train it "
                    "(or call it once) first, or start from the prior (guide=None)"
                )
            source = guide
        if source is not None:
            layout = layout_of_trace(source.prototype_trace, model.observation_site)
            self._begin(layout, _start_of(source, layout))

    # -- what a filter supplies
    def _init_state(self, start: Start) -> Any:
        raise NotImplementedError

    def _belief(self, state: Any) -> Belief | CovarianceRoot:
        raise NotImplementedError

    #: How far (in log units) the learned prior scale may drift before the belief follows it:
    #: 0 follows every step; a filter whose shift costs :math:`O(d^3)` waits for larger moves.
    prior_shift_tolerance = 0.0

    def _check_guide(self, guide: LowRankPrecisionGuide) -> None:
        pass

    # -- the step
    def _step(self, state: Any, pull: Callable[[torch.Tensor], tuple]) -> tuple:
        r"""One step: ``(new state, predicted state, outputs (S, B, C), rows (C, S, B, d))``.

        The predicted state is the belief the minibatch is scored under: ``state`` after
        the drift (covariance :math:`\Sigma + qI` with ``dynamics_noise`` :math:`q`), before
        the minibatch is folded in. Each of the ``num_iterations`` Gauss-Newton steps starts
        from it, with the likelihood pulled back at the last iterate (the first: at the
        predicted belief itself).

        ``pull(thetas (S, d))`` returns the outputs at each weight vector, the rows
        :math:`L_n^\top J_n` ``(C, S, B, d)`` and the log-likelihood's gradient in the
        weights, summed over the rows and averaged over the ``S`` weight vectors, ``(d,)``.
        The outputs and rows returned are the one-step-ahead ones, at the belief before the
        minibatch (an iterated step pulls again at later iterates): the learned noise is
        estimated from them.
        """
        predicted = self.algebra.predict(state, self.dynamics_noise)
        current = predicted
        for iteration in range(self.num_iterations):
            if self._num_draws is None:
                thetas = current.mean.unsqueeze(0)
            else:
                thetas = self.algebra.draws(current, self._num_draws)
            outputs, rows, gradient = pull(thetas)
            if not iteration:  # the one-step-ahead predictive
                ahead = outputs, rows
            flat = rows.reshape(-1, rows.shape[-1]) / thetas.shape[0] ** 0.5
            iterate = current.mean if iteration else None
            current = self.algebra.update(predicted, gradient, flat, iterate=iterate)
        return current, predicted, *ahead

    # -- the stream
    def update(self, x: torch.Tensor, y: torch.Tensor) -> OnlineUpdater:
        """Fold a minibatch (or one point) into the belief, in one pass.

        Args:
            x: Features ``(batch, *features)`` on the model's device, in its dtype.
            y: Targets ``(batch,)`` or ``(batch, dim)``: floats for a Gaussian, int labels
                for a Categorical, 0/1 for a Bernoulli.

        Returns:
            The updater itself, so updates chain.

        Raises:
            ValueError: On inputs the model cannot take (naming the argument), NaN or inf.
            FloatingPointError: If the step makes the belief NaN or inf, or the minibatch's
                squared one-step-ahead errors overflow (targets of 1e30 in float32: a learned
                noise and the log-evidence would be inf); the belief and the noise are left
                as they were, and the message names which.
        """
        self._check_inputs(x, y)
        self._check_evaluation_mode()
        if self._network is None:
            self._set_up(x)
        self.model.likelihood.check_target(y, self._num_outputs, values=True)
        scale = self.observation.scale() if self.observation.regression else None
        cotangents = self.observation.cotangents(scale)
        layout, network = self._layout, self._network
        num_outputs = self._num_outputs

        def pull(thetas: torch.Tensor) -> tuple:
            outputs, pulled = pull_back_rows(network, layout, thetas, x, y, cotangents)
            gradient = pulled[num_outputs].sum(-2).mean(0)
            return outputs, pulled[:num_outputs], gradient

        old = self.state
        where = f"update {self.num_updates + 1} (points seen before it: {self.num_seen})"
        with torch.no_grad():
            try:
                state, predicted, outputs, rows = self._step(old, pull)
            except torch.linalg.LinAlgError as error:  # a factorisation of non-finite values
                raise _diverged(where) from error
            if not all(bool(torch.isfinite(part).all()) for part in state):
                raise _diverged(where)
            ahead = self._one_step_ahead(predicted, y, outputs, rows, scale)
            if ahead.residual is not None:
                _check_errors(ahead.residual, y, where)
            variance = None
            if self._noise is not None:
                variance = self._noise.proposal(ahead.residual.square(), ahead.epistemic)
            alpha = None
            if self._prior_scale is not None:
                alpha = self._prior_proposal(old, ahead, scale)
            self.state = state
            if variance is not None:
                self._noise.accept()
                _set_scale(self.model.likelihood, variance.sqrt())
            if alpha is not None:
                self._prior_scale.accept()
                self._follow_prior_scale(alpha)
        self.log_evidence += float(ahead.log_likelihood)
        self.num_seen += x.shape[0]
        self.num_updates += 1
        self._stale = True
        return self

    @property
    def layout(self) -> WeightLayout | None:
        """Where each site lives in the flat weights (``None`` before set-up)."""
        return self._layout

    @property
    def noise_scale(self) -> torch.Tensor | None:
        """A Gaussian likelihood's current noise σ (``None`` for classification)."""
        return self.observation.scale() if self.observation.regression else None

    # -- set-up
    def _set_up(self, x: torch.Tensor) -> None:
        if not self.guide.is_set_up:
            self.guide(x)  # at the prior, or at the belief it was given
        if self._layout is None:
            layout = weight_layout(self.model, x)
            self._begin(layout, _start_of(self.guide, layout))
        self._network = network_function(self.model, self._layout, x)
        with torch.no_grad():
            sample = self._network(self._layout.unflatten(self._layout.prior_loc), x[:1])
        self._num_outputs = sample.shape[-1]

    @torch.no_grad()
    def _begin(self, layout: WeightLayout, start: Start) -> None:
        precision = _diagonal_precision(start)
        if self.learn_prior_scale and precision is None:
            raise ValueError(
                "learn_prior_scale=True learns a multiplier of a starting precision that is "
                f"diagonal (the prior's, or a MeanFieldGuide's), but this start holds "
                f"{_start_form(start)}; start from the prior (guide=None) or a MeanFieldGuide, "
                "or leave learn_prior_scale=False"
            )
        self._layout = layout
        self.state = self._init_state(start)
        self._stale = True  # the guide takes it at its next use
        self.guide.follow(self._export)
        if self.observation.learned_scale:
            self._noise = NoiseEstimate(self.observation.scale().square())
        if self.learn_prior_scale:
            self._anchor = (start.mean.clone(), precision)
            self._prior_scale = PriorScaleEstimate()

    def _export(self) -> Belief | CovarianceRoot | None:
        if not self._stale:
            return None
        self._stale = False
        return self._belief(self.state)

    # -- checks
    def _check_evaluation_mode(self) -> None:
        module = module_in_training_mode(self.model)
        if module is not None:
            raise ValueError(
                f"{type(self).__name__} needs the network in evaluation mode, but module "
                f"{module} is in training mode, which makes it random (dropout masks) or "
                "batch-dependent (batch statistics), where the filter linearises one function "
                "of the weights. Call model.eval() first, and keep it so for predictions"
            )

    def _check_inputs(self, x: torch.Tensor, y: torch.Tensor) -> None:
        check_tensor("x", x)
        check_tensor("y", y)
        check_features("x", x, self.model.dtype, tokens=self.model.accepts_token_ids)
        if x.dim() < 2 or x.shape[0] == 0:
            raise ValueError(f"x must be (batch, *features) with batch >= 1, got {tuple(x.shape)}")
        device = self.model.device
        if x.device != device or y.device != device:
            raise ValueError(
                f"x and y must be on the model's device {device}, got {x.device} and {y.device}"
            )
        check_same_rows(x, y)
        if x.is_floating_point():
            check_finite_tensor("x", x)

    # -- the one-step-ahead predictive
    def _one_step_ahead(self, predicted, y, outputs, rows, scale) -> Ahead:
        r"""The minibatch under the belief before it: errors, variances, log-density.

        ``predicted`` is the belief after the drift, before the minibatch: covariance
        :math:`\Sigma = \Sigma_{t-1} + qI`, as in the Kalman filter's order (predict, score
        :math:`y_t`, update). ``outputs`` ``(S, B, C)`` and ``rows`` ``(C, S, B, d)`` are the
        one-step-ahead ones.
        For a Gaussian the outputs' covariance is the linearised :math:`J\Sigma J^\top` over
        the minibatch's ``B·C`` outputs (averaged over the ``S`` weight vectors the step
        pulled back at), and the log-density the joint
        :math:`\log\mathcal N(y;\, \bar f,\, J\Sigma J^\top + \sigma^2 I)`; for a classifier
        the rows hold the likelihood's curvature, not :math:`J`, and the log-density is the
        plug-in one, at the mean outputs.
        """
        mean = outputs.mean(0)
        if not self.observation.regression:
            log_density = self.model.likelihood.log_prob(mean, y).sum()
            return Ahead(None, torch.zeros_like(mean), log_density, None)
        jacobian = rows * scale  # the Gaussian's curvature root is I/σ: rows = J/σ
        by_draw = jacobian.permute(1, 2, 0, 3).flatten(1, 2)  # (S, B·C, d), row-major (b, c)
        covariance = self.algebra.output_covariance(predicted, by_draw).mean(0)  # (B·C, B·C)
        epistemic = covariance.diagonal().reshape(mean.shape)
        residual = y.reshape(mean.shape) - mean
        total = covariance.double().clone()  # epistemic is a view of covariance
        total.diagonal().add_(float(scale.square()))
        log_density = MultivariateNormal(
            torch.zeros_like(total[0]), covariance_matrix=total, validate_args=False
        ).log_prob(residual.reshape(-1).double())
        return Ahead(residual, epistemic, log_density.to(mean.dtype), jacobian)

    # -- the learned prior scale
    def _prior_proposal(self, old, ahead: Ahead, scale) -> torch.Tensor | None:
        r"""The prior's multiplier moved along the one-step-ahead score (a Gaussian's only).

        The predictive variances (``ahead``) are those after the drift; their slopes in
        :math:`\alpha` are taken at ``old``, the belief the multiplier acts on: with
        :math:`\Sigma_{t-1}(\alpha) = (\Lambda + (\alpha - 1)\Lambda_0)^{-1}` the drift
        :math:`qI` does not depend on :math:`\alpha`, so
        :math:`\partial v/\partial\alpha = -u^\top\Lambda_0 u` with
        :math:`u = \Sigma_{t-1}J^\top`.
        """
        if ahead.jacobian is None:
            return None
        anchor_mean, anchor_precision = self._anchor
        rows = ahead.jacobian.reshape(-1, ahead.jacobian.shape[-1])
        spread = self.algebra.covariance_rows(old, rows)  # u = ΣJᵀ, one row per output and point
        variance_slope = -(spread.square() * anchor_precision).sum(-1)
        mean_slope = spread @ (anchor_precision * (anchor_mean - old.mean))
        shape = ahead.jacobian.shape[:-1]  # (C, S, B)
        errors = ahead.residual.mT.unsqueeze(1).expand(shape).reshape(-1)
        total = (ahead.epistemic + scale.square()).mT.unsqueeze(1).expand(shape).reshape(-1)
        return self._prior_scale.proposal(errors, total, variance_slope, mean_slope)

    def _follow_prior_scale(self, alpha: torch.Tensor) -> None:
        """Move the belief's prior precision to ``alpha`` times the start's, exactly."""
        change = float(alpha) / self._prior_applied
        if abs(math.log(change)) <= self.prior_shift_tolerance:
            return
        anchor_mean, anchor_precision = self._anchor
        delta = (float(alpha) - self._prior_applied) * anchor_precision
        self.state = self.algebra.shift_prior(self.state, delta, anchor_mean)
        self._prior_applied = float(alpha)

    @property
    def prior_scale(self) -> float | None:
        r"""The learned multiplier :math:`\alpha` of the starting belief's precision.

        The belief's prior is the starting one with its variances divided by
        :math:`\alpha`; ``None`` when the prior's scale is not learned.
        """
        return None if self._prior_scale is None else self._prior_applied


def _check_errors(residual: torch.Tensor, y: torch.Tensor, where: str) -> None:
    """Refuse a minibatch whose squared one-step-ahead errors overflow the dtype."""
    squares = residual.square()
    if not bool(torch.isfinite(squares).all()):
        raise FloatingPointError(
            f"{where}: the squared one-step-ahead errors of this minibatch are "
            f"{float(squares.max()):.3g} (targets up to {float(y.abs().max()):.3g}), beyond what "
            f"{str(y.dtype).removeprefix('torch.')} holds; a learned noise variance and the "
            "stream's log-evidence would be inf. The belief and the noise are left as they "
            "were; standardise the targets, e.g. (y - mean) / std"
        )


def _diverged(where: str) -> FloatingPointError:
    return FloatingPointError(
        f"{where} made the belief NaN or inf; the belief is left as it was. A linearised step "
        "from a wide prior can overshoot: give the weights a prior of the scale of the "
        "network's own initialisation (e.g. priors.FanInGaussian), or start from a trained "
        "MeanFieldGuide"
    )


def _diagonal_precision(start: Start) -> torch.Tensor | None:
    """The starting belief's precision if it is diagonal (a prior, a mean-field guide)."""
    if start.covariance_root is not None:
        root = start.covariance_root
        if bool((root - torch.diag(root.diagonal())).any()):
            return None
        return root.diagonal().square().reciprocal()
    if start.covariance is not None:
        return None
    if start.precision_factor is not None and bool(start.precision_factor.any()):
        return None
    return start.precision_diag.clone()


def _start_form(start: Start) -> str:
    """What a start with a precision that is not diagonal holds, in words."""
    if start.covariance is not None:
        return "a LowRankGuide's covariance D + VVᵀ"
    if start.covariance_root is not None:
        return "a full covariance (a full-rank LowRankPrecisionGuide's)"
    rank = start.precision_factor.shape[1]
    return f"a precision with a low-rank part W ≠ 0 (rank {rank}: a belief carried from a stream)"


def _set_scale(likelihood, sigma: torch.Tensor) -> None:
    """Write a learned Gaussian scale (a positive Pyro parameter) in place."""
    value = likelihood.noise_scale()
    with torch.no_grad():
        value.unconstrained().copy_(transform_to(constraints.positive).inv(sigma))


def _start_of(guide: Any, layout: WeightLayout) -> Start:
    """The belief a guide holds, over the layout's flat weights."""
    if isinstance(guide, LowRankPrecisionGuide):
        if dict(guide.block_sites["network"]) != dict(layout.sites):
            raise ValueError(
                "the LowRankPrecisionGuide's sites differ from the model's: "
                f"{list(guide.block_sites['network'])} against {list(layout.sites)}"
            )
        fn = guide.distribution()  # on the guide's buffers: copied, for the guide overwrites them
        if isinstance(fn, CovarianceRootNormal):
            return Start(fn.loc.clone(), None, None, None, fn.covariance_root.clone())
        return Start(fn.loc.clone(), fn.precision_diag.clone(), fn.precision_factor.clone(), None)
    if isinstance(guide, MeanFieldGuide):
        marginals = guide.marginals()
        mean = layout.flatten({name: loc.detach() for name, (loc, _) in marginals.items()})
        scale = layout.flatten({name: scale.detach() for name, (_, scale) in marginals.items()})
        return Start(mean, scale.square().reciprocal(), None, None)
    # a LowRankGuide: its blocks' covariances D + VVᵀ, placed by site
    d = layout.size
    offsets, start = {}, 0
    for name, shape in layout.sites.items():
        offsets[name] = torch.arange(start, start + shape.numel())
        start += shape.numel()
    like = layout.prior_loc
    mean = like.new_zeros(d)
    covariance = like.new_zeros(d, d)
    posterior = guide.posterior()
    for block, sites in guide.block_sites.items():
        index = torch.cat([offsets[name] for name in sites])
        fn = posterior[block]
        mean[index] = fn.loc.detach().to(like)
        covariance[index.unsqueeze(-1), index] = fn.covariance_matrix.detach().to(like)
    return Start(mean, None, None, covariance)
