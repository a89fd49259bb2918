r"""What one observation tells a Gaussian belief: the likelihood's gradient and curvature.

A filter linearises the network, :math:`f(x;\theta) \approx f(x;\mu) + J(\theta - \mu)`, and
needs from the likelihood :math:`p(y \mid f)` two things per observation, both in the
network's output space (:math:`C` outputs):

* the gradient :math:`g = \nabla_f \log p(y \mid f)`, ``(C,)``;
* a root :math:`L` of the curvature :math:`H = -\nabla_f^2 \log p(y \mid f) = LL^\top`,
  ``(C, C)``, for the generalised Gauss-Newton matrix :math:`J^\top H J` (Schraudolph 2002),
  which for these likelihoods (canonical links) is also the Fisher information.

* Gaussian: :math:`g = (y - f)/\sigma^2`, :math:`L = I/\sigma`;
* Categorical, :math:`p = \mathrm{softmax}(f)`: :math:`g = e_y - p`,
  :math:`L = \mathrm{diag}(\sqrt p) - p\sqrt p^\top` (then :math:`LL^\top = \mathrm{diag}(p) -
  pp^\top`, since :math:`\sum_c p_c = 1`);
* Bernoulli, :math:`p = \mathrm{sigmoid}(f)`: :math:`g = y - p`,
  :math:`L = \mathrm{diag}\sqrt{p(1-p)}`.

A Gaussian likelihood with a learned scale (``likelihoods.Gaussian()``) has it estimated as
the stream arrives (:class:`NoiseEstimate`). This module holds :class:`Observation`, which
builds these per-row terms from a model's likelihood, and knows nothing of filters.
"""

from __future__ import annotations

import torch

from ..likelihoods import Bernoulli, Categorical, Gaussian, Likelihood

__all__ = ["NoiseEstimate", "Observation"]


class Observation:
    r"""The gradient and curvature root of a model's likelihood, one row at a time.

    Args:
        likelihood: The model's likelihood: ``Gaussian`` (fixed or learned homoscedastic
            scale), ``Categorical`` or ``Bernoulli``.

    Raises:
        NotImplementedError: For a heteroscedastic Gaussian or another likelihood.
    """

    def __init__(self, likelihood: Likelihood) -> None:
        if isinstance(likelihood, Gaussian) and likelihood.heteroscedastic:
            raise NotImplementedError(
                "the online updaters take a Gaussian likelihood with one scale (fixed or "
                "learned), not a heteroscedastic one"
            )
        if not isinstance(likelihood, (Gaussian, Categorical, Bernoulli)):
            raise NotImplementedError(
                "the online updaters take a Gaussian, Categorical or Bernoulli likelihood, "
                f"got {type(likelihood).__name__}"
            )
        self.likelihood = likelihood
        self.learned_scale = isinstance(likelihood, Gaussian) and likelihood.learned

    @property
    def regression(self) -> bool:
        """Whether the likelihood is a Gaussian (targets are floats)."""
        return isinstance(self.likelihood, Gaussian)

    def scale(self) -> torch.Tensor:
        """The Gaussian's current noise scale σ (a detached scalar tensor)."""
        return self.likelihood.scale.detach()

    def cotangents(self, scale: torch.Tensor | None = None):
        r"""The per-row map ``(output (C,), target) -> [L | g]``, ``(C, C + 1)``.

        The first ``C`` columns are :math:`L`, the last is :math:`g`: pulled back through the
        network they give :math:`J^\top L` and :math:`J^\top g`
        (:func:`~pyro_bbb.online.network.pull_back_rows`).

        Args:
            scale: The Gaussian's σ to use (default: the likelihood's current one).
        """
        likelihood = self.likelihood
        if isinstance(likelihood, Gaussian):
            sigma = self.scale() if scale is None else scale

            def gaussian(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                target = y.reshape(out.shape).to(out.dtype)
                eye = torch.eye(out.shape[-1], dtype=out.dtype, device=out.device)
                gradient = (target - out) / sigma.square()
                return torch.cat([eye / sigma, gradient.unsqueeze(-1)], -1)

            return gaussian
        if isinstance(likelihood, Categorical):

            def categorical(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                p = torch.softmax(out, -1)
                classes = torch.arange(out.shape[-1], device=out.device)
                one_hot = (classes == y).to(out.dtype)
                root = torch.diag_embed(p.sqrt()) - p.unsqueeze(-1) * p.sqrt().unsqueeze(-2)
                return torch.cat([root, (one_hot - p).unsqueeze(-1)], -1)

            return categorical

        def bernoulli(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            p = torch.sigmoid(out)
            target = y.reshape(out.shape).to(out.dtype)
            root = torch.diag_embed((p * (1 - p)).sqrt())
            return torch.cat([root, (target - p).unsqueeze(-1)], -1)

        return bernoulli


class NoiseEstimate:
    r"""A Gaussian likelihood's noise variance, estimated from the stream's one-step-ahead errors.

    Before a minibatch is folded in, the belief predicts each target with variance
    :math:`J\Sigma J^\top + \sigma^2` (linearised), so the squared one-step-ahead error
    :math:`e = y - f(x; \mu)` has expectation that sum: the noise variance is what the errors
    hold beyond the belief's own uncertainty (covariance matching, Mehra 1972, "Approaches to
    adaptive filtering"),

    .. math::

        s_t^2 = \max\big(\overline{e^2} - \overline{J\Sigma J^\top},\;
            \epsilon\,\overline{e^2}\big),
        \qquad
        \sigma^2_t = (1 - \gamma_t)\,\sigma^2_{t-1} + \gamma_t\, s_t^2, \quad
        \gamma_t = t^{-0.6},

    averages over the minibatch's rows and outputs, with the steps of online EM (Cappé and
    Moulines 2009), which forget the first minibatches faster than a running mean; the first
    minibatch sets the estimate (:math:`\gamma_1 = 1`), and :math:`\epsilon = 0.01` keeps
    it positive. Errors measured *after* the update (the M-step of variational EM) are the
    alternative, and a trap: a filter that starts with a large σ updates weakly, so its errors
    stay large and so does σ (measured in ``docs/online.md``: twice the true σ and 1 nat
    worse, where this estimate lands within 10 % of it).

    Args:
        variance: The starting variance (the likelihood's scale squared).
    """

    #: The exponent α of the step :math:`\gamma_t = t^{-\alpha}`, in (1/2, 1].
    step_exponent = 0.6
    #: :math:`\epsilon`, the floor of a minibatch's estimate as a fraction of its errors.
    floor = 0.01

    def __init__(self, variance: torch.Tensor) -> None:
        self.variance = variance.detach().clone()
        self.steps = 0

    def proposal(self, mean_square_error: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
        r"""The variance after one more minibatch, without taking it (see :meth:`accept`).

        Args:
            mean_square_error: :math:`\overline{e^2}`, the mean squared one-step-ahead error.
            predicted: :math:`\overline{J\Sigma J^\top}`, the belief's mean predicted
                variance of the outputs at those points.
        """
        step = (self.steps + 1) ** -self.step_exponent
        estimate = (mean_square_error - predicted).clamp_min(self.floor * mean_square_error)
        return (1 - step) * self.variance + step * estimate.detach()

    def accept(self, variance: torch.Tensor) -> None:
        """Take a :meth:`proposal` as the new variance."""
        self.steps += 1
        self.variance = variance

    def update(self, mean_square_error: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
        """Fold one minibatch in and return the new variance: :meth:`proposal`, :meth:`accept`."""
        self.accept(self.proposal(mean_square_error, predicted))
        return self.variance
