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
* it estimates a Gaussian's learned noise scale as the stream arrives, from the one-step-ahead
  errors (:class:`~pyro_bbb.online.observation.NoiseEstimate`), and writes it to the
  likelihood;
* it shows the belief as a :class:`~pyro_bbb.online.LowRankPrecisionGuide` (:attr:`guide`),
  converted when the guide is next used, so it is current at every point of the stream.

A filter (:class:`~pyro_bbb.online.LoFi`, :class:`~pyro_bbb.online.RVGA`) supplies its state,
its step and the conversion of its state to the guide's form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.distributions import constraints, transform_to

from .._validation import (
    check_features,
    check_finite_tensor,
    check_nonnegative_number,
    check_same_rows,
    check_tensor,
)
from ..infer.guides import LowRankGuide, MeanFieldGuide
from ..infer.mcmc.potential import module_in_training_mode
from ..model import BNN
from ..priors.precision_normal import CovarianceRootNormal
from .guide import Belief, CovarianceRoot, LowRankPrecisionGuide
from .network import WeightLayout, layout_of_trace, network_function, pull_back_rows, weight_layout
from .observation import NoiseEstimate, Observation

__all__ = ["OnlineUpdater", "Start"]


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


class OnlineUpdater:
    """Base of the online updaters; see the module's notes.

    Attributes:
        model: The :class:`~pyro_bbb.BNN`.
        guide: The belief as a :class:`~pyro_bbb.online.LowRankPrecisionGuide`, current at
            every point of the stream.
        state: The filter's state (its own form of the belief; ``None`` before set-up).
        num_seen: Points folded in so far.
        num_updates: Minibatches folded in so far.
        dynamics_noise: Weight variance added to the belief before each step.

    Args:
        model: A :class:`~pyro_bbb.BNN`.
        guide: ``None``, a ``MeanFieldGuide``, a ``LowRankGuide`` or a
            ``LowRankPrecisionGuide`` (the belief to start from; the last is updated in place).
        guide_rank: The rank of the guide the updater creates (``None``: full).
        dynamics_noise: Weight variance added to the belief before each step.
        init_loc: The starting mean when ``guide`` is ``None``.
    """

    def __init__(
        self,
        model: Any,
        guide: Any,
        *,
        guide_rank: int | None,
        dynamics_noise: float,
        init_loc: Any,
    ) -> None:
        if not isinstance(model, BNN):
            raise TypeError(f"model must be a pyro_bbb.BNN, got {type(model).__name__}")
        self.model = model
        self.observation = Observation(model.likelihood)
        self.dynamics_noise = check_nonnegative_number("dynamics_noise", dynamics_noise)
        self.state: Any = None
        self.num_seen = 0
        self.num_updates = 0
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

    def _step(self, state: Any, pull: Callable[[torch.Tensor], tuple]) -> tuple:
        r"""One step: ``(new state, outputs (S, B, C), curvature rows (C, S, B, d))``.

        ``pull(thetas (S, d))`` returns the outputs at each weight vector, the rows
        :math:`L_n^\top J_n` ``(C, S, B, d)`` and the log-likelihood's gradient in the
        weights, summed over the rows and averaged over the ``S`` weight vectors, ``(d,)``.
        The outputs and rows returned are the one-step-ahead ones, at the belief before the
        minibatch (an iterated step pulls again at later iterates): the learned noise is
        estimated from them.
        """
        raise NotImplementedError

    def _output_variance(self, state: Any, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _belief(self, state: Any) -> Belief | CovarianceRoot:
        raise NotImplementedError

    def _check_guide(self, guide: LowRankPrecisionGuide) -> None:
        pass

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
            FloatingPointError: If the step makes the belief NaN or inf, or a learned noise
                variance NaN, inf or zero (targets so large that their squares overflow);
                the belief and the noise are left as they were, and the message names which.
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
                state, outputs, rows = self._step(old, pull)
            except torch.linalg.LinAlgError as error:  # a factorisation of non-finite values
                raise _diverged(where) from error
            if not all(bool(torch.isfinite(part).all()) for part in state):
                raise _diverged(where)
            variance = None
            if self._noise is not None:
                variance = self._noise_proposal(old, y, outputs, rows, scale, where)
            self.state = state
            if variance is not None:
                self._noise.accept(variance)
                _set_scale(self.model.likelihood, variance.sqrt())
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
        self._layout = layout
        self.state = self._init_state(start)
        self._stale = True  # the guide takes it at its next use
        self.guide.follow(self._export)
        if self.observation.learned_scale:
            self._noise = NoiseEstimate(self.observation.scale().square())

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

    # -- the learned noise
    def _noise_proposal(self, old, y, outputs, rows, scale, where: str) -> torch.Tensor:
        """σ² moved towards the minibatch's innovation variance less the belief's share of it.

        ``outputs`` and ``rows`` are the one-step-ahead ones, at the belief before the step.
        """
        jacobian = rows * scale  # the Gaussian's curvature root is I/σ: rows = J/σ, (C, S, B, d)
        residual = y.reshape(outputs.shape[-2:]) - outputs.mean(0)
        epistemic = self._output_variance(old, jacobian.reshape(-1, jacobian.shape[-1]))
        mean_square = residual.square().mean()
        variance = self._noise.proposal(mean_square, epistemic.mean())
        if not bool(torch.isfinite(variance)) or not bool(variance > 0):
            raise FloatingPointError(
                f"{where} would make the learned noise variance {float(variance):.3g}: the "
                f"minibatch's mean squared one-step-ahead error is {float(mean_square):.3g} "
                f"(targets up to {float(y.abs().max()):.3g}), beyond what "
                f"{str(outputs.dtype).removeprefix('torch.')} holds. The belief and the noise "
                "are left as they were; standardise the targets, e.g. (y - mean) / std"
            )
        return variance


def _diverged(where: str) -> FloatingPointError:
    return FloatingPointError(
        f"{where} made the belief NaN or inf; the belief is left as it was. A linearised step "
        "from a wide prior can overshoot: give the weights a prior of the scale of the "
        "network's own initialisation (e.g. priors.FanInGaussian), or start from a trained "
        "MeanFieldGuide"
    )


def _set_scale(likelihood, sigma: torch.Tensor) -> None:
    """Write a learned Gaussian scale (a positive Pyro parameter) in place."""
    value = likelihood.scale
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
