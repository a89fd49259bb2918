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
the stream arrives (:mod:`~pyro_bbb.online.empirical_bayes`). This module holds
:class:`Observation`, which builds these per-row terms from a model's likelihood, and knows
nothing of filters.
"""

from __future__ import annotations

import torch

from ..likelihoods import Bernoulli, Categorical, Gaussian, Likelihood

__all__ = ["Observation"]


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
        return self.likelihood.noise_scale().detach()

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
