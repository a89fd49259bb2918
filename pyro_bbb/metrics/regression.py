r"""Scores of regression predictions: RMSE, test log-likelihood, interval coverage.

Plain functions of tensors a predictive has already produced; each returns a Python
``float`` computed in float64 on detached CPU copies. The test log-likelihood is that of the
predictive *mixture* over weight samples, not of a Gaussian fitted to it.
"""

from __future__ import annotations

import math

import torch

from ._inputs import as_float64, check_finite, check_same_shape

__all__ = ["gaussian_log_likelihood", "interval_coverage", "log_likelihood", "rmse"]


def rmse(mean: torch.Tensor, y: torch.Tensor) -> float:
    r"""Root mean squared error of point predictions.

    .. math:: \mathrm{RMSE} = \sqrt{\frac{1}{N}\sum_{i=1}^{N} (\hat y_i - y_i)^2},

    where the sum runs over every entry (points and, for ``(batch, dim)`` inputs, dimensions).

    Args:
        mean: Predicted values (usually the predictive mean), shape ``(batch,)`` or
            ``(batch, dim)``.
        y: Targets, same shape as ``mean``. No broadcasting is done, so a ``(batch, 1)``
            prediction against ``(batch,)`` targets is an error rather than a silent
            ``(batch, batch)`` comparison.

    Returns:
        The RMSE, in the units of ``y``.

    Raises:
        ValueError: If the shapes differ, an input is empty or holds NaN/inf.
    """
    m = as_float64(mean, "mean")
    t = as_float64(y, "y")
    check_same_shape(m, "mean", t, "y")
    check_finite(m, "mean")
    check_finite(t, "y")
    return math.sqrt(float(((m - t) ** 2).mean()))


def log_likelihood(log_probs: torch.Tensor) -> float:
    r"""Mean per-point log predictive density from per-sample log-likelihoods.

    Given Monte Carlo weight samples :math:`w_s \sim q(w)` and
    :math:`\ell_{s,i} = \log p(y_i \mid x_i, w_s)`, the predictive density of point :math:`i` is
    the mixture :math:`\frac{1}{S}\sum_s p(y_i \mid x_i, w_s)`, so

    .. math::
        \mathrm{LL} = \frac{1}{N}\sum_{i=1}^{N}
            \Big(\operatorname{logsumexp}_{s}\, \ell_{s,i} - \log S\Big),

    computed stably with ``logsumexp``.

    Args:
        log_probs: Per-sample, per-point log-likelihoods, shape ``(num_samples, batch)``
            (nats). Entries may be ``-inf``; NaN and ``+inf`` are rejected.

    Returns:
        The mean over points of the log of the sample-averaged likelihood, in nats per point.

    Raises:
        ValueError: If ``log_probs`` is not 2-D, is empty, or holds NaN or ``+inf``.
    """
    lp = as_float64(log_probs, "log_probs")
    if lp.dim() != 2:
        raise ValueError(
            f"log_probs must have shape (num_samples, batch), got {tuple(log_probs.shape)}"
        )
    if torch.isnan(lp).any() or (lp == math.inf).any():
        raise ValueError("log_probs must not hold NaN or +inf")
    num_samples = lp.shape[0]
    per_point = torch.logsumexp(lp, dim=0) - math.log(num_samples)
    return float(per_point.mean())


def gaussian_log_likelihood(
    loc: torch.Tensor, scale: torch.Tensor | float, y: torch.Tensor
) -> float:
    r"""Test log-likelihood of targets under a Gaussian predictive *mixture*.

    Each weight sample :math:`s` predicts :math:`\mathcal{N}(\mu_{s,i}, \sigma_{s,i}^2)` for point
    :math:`i`; the predictive is their equal-weight mixture (not one Gaussian fitted to it):

    .. math::
        \mathrm{LL} = \frac{1}{N}\sum_{i=1}^{N}
            \Big(\operatorname{logsumexp}_{s}\,
            \log \mathcal{N}(y_i \mid \mu_{s,i}, \sigma_{s,i}^2) - \log S\Big).

    For ``(num_samples, batch, dim)`` inputs the dimensions are independent given :math:`s`, so
    :math:`\log \mathcal{N}` is summed over ``dim`` before mixing. The result is in the units
    implied by ``y``: if the model was fitted to standardized targets, either transform ``loc``
    and ``scale`` back first or subtract :math:`\log \sigma_y` (per dimension) from the result.

    Args:
        loc: Per-sample predictive means, shape ``(num_samples, batch)`` or
            ``(num_samples, batch, dim)``.
        scale: Per-sample predictive standard deviations (observation noise), same shape as
            ``loc`` or broadcastable to it (e.g. a scalar noise std). Must be positive.
        y: Targets, shape ``(batch,)`` or ``(batch, dim)`` matching ``loc.shape[1:]``.

    Returns:
        The mean per-point log predictive density, in nats per point.

    Raises:
        ValueError: If the shapes do not match, ``scale`` is not positive, or an input holds
            NaN/inf.
    """
    mu = as_float64(loc, "loc")
    if mu.dim() not in (2, 3):
        raise ValueError(
            "loc must have shape (num_samples, batch) or (num_samples, batch, dim), "
            f"got {tuple(loc.shape)}"
        )
    sigma = as_float64(torch.as_tensor(scale), "scale")
    try:
        sigma = sigma.expand_as(mu)
    except RuntimeError:
        raise ValueError(
            f"scale must be broadcastable to loc's shape {tuple(mu.shape)}, "
            f"got {tuple(sigma.shape)}"
        ) from None
    t = as_float64(y, "y")
    if t.shape != mu.shape[1:]:
        raise ValueError(
            f"y must have shape {tuple(mu.shape[1:])} (loc without its sample dimension), "
            f"got {tuple(t.shape)}"
        )
    for value, name in ((mu, "loc"), (sigma, "scale"), (t, "y")):
        check_finite(value, name)
    if (sigma <= 0).any():
        raise ValueError(f"scale must be positive, got minimum {float(sigma.min()):.6g}")
    z = (t - mu) / sigma
    log_density = -0.5 * z**2 - torch.log(sigma) - 0.5 * math.log(2 * math.pi)
    if log_density.dim() == 3:
        log_density = log_density.sum(-1)
    return log_likelihood(log_density)


def interval_coverage(lower: torch.Tensor, upper: torch.Tensor, y: torch.Tensor) -> float:
    r"""Fraction of targets inside their predictive intervals.

    .. math:: \frac{1}{N}\sum_{i=1}^{N} \mathbf{1}[l_i \le y_i \le u_i].

    A well-calibrated central 95% interval has coverage close to 0.95.

    Args:
        lower: Interval lower bounds, shape ``(batch,)`` or ``(batch, dim)``.
        upper: Interval upper bounds, same shape as ``lower``.
        y: Targets, same shape as ``lower``.

    Returns:
        The fraction of entries with ``lower <= y <= upper``, in ``[0, 1]``.

    Raises:
        ValueError: If the shapes differ, any ``lower > upper``, or an input holds NaN.
    """
    lo = as_float64(lower, "lower")
    hi = as_float64(upper, "upper")
    t = as_float64(y, "y")
    check_same_shape(lo, "lower", hi, "upper")
    check_same_shape(lo, "lower", t, "y")
    for value, name in ((lo, "lower"), (hi, "upper"), (t, "y")):
        if torch.isnan(value).any():
            raise ValueError(f"{name} must not hold NaN")
    if (lo > hi).any():
        raise ValueError(f"lower must be <= upper everywhere, got {int((lo > hi).sum())} inverted")
    return float(((lo <= t) & (t <= hi)).double().mean())
