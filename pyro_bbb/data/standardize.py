"""Standardisation with statistics fitted on training data only: :class:`Standardizer`."""

from __future__ import annotations

import torch

from .._validation import check_positive_number

__all__ = ["Standardizer"]


class Standardizer:
    r"""Shift and scale to zero mean and unit variance, with statistics fitted on training data.

    ``transform`` computes :math:`(x - \mu) / \sigma` with :math:`\mu`, :math:`\sigma` the
    per-column mean and population standard deviation of the data passed to :meth:`fit`;
    :math:`\sigma` is floored at ``min_std`` so constant columns map to 0 instead of NaN.

    Typical use on regression targets::

        y_scaler = Standardizer().fit(split.y_train)
        y_train = y_scaler.transform(split.y_train)
        ...  # predict loc, scale in standardized units
        loc = y_scaler.inverse_transform(loc)
        scale = y_scaler.inverse_scale(scale)

    Args:
        min_std: Floor on the fitted standard deviation, positive.

    Raises:
        ValueError: If ``min_std`` is not positive.

    Attributes:
        mean: Per-column mean, shape ``x.shape[1:]``; None before :meth:`fit`.
        std: Per-column floored standard deviation, shape ``x.shape[1:]``; None before
            :meth:`fit`.
    """

    def __init__(self, min_std: float = 1e-6) -> None:
        self.min_std = check_positive_number("min_std", min_std)
        self.mean: torch.Tensor | None = None
        self.std: torch.Tensor | None = None

    def fit(self, x: torch.Tensor) -> Standardizer:
        """Compute the per-column mean and standard deviation of ``x`` over its first dimension.

        Args:
            x: Training data, shape ``(n,)`` or ``(n, features)``, with ``n >= 1``.

        Returns:
            This standardizer, so that ``Standardizer().fit(x)`` can be chained.

        Raises:
            ValueError: If ``x`` has no rows.
        """
        if x.dim() == 0 or x.shape[0] == 0:
            raise ValueError(f"x must have at least one row, got shape {tuple(x.shape)}")
        x = x.detach()
        self.mean = x.mean(dim=0)
        self.std = x.std(dim=0, correction=0).clamp_min(self.min_std)
        return self

    def _fitted(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mean is None or self.std is None:
            raise RuntimeError("Standardizer is not fitted; call fit(x_train) first")
        return self.mean.to(x), self.std.to(x)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        r"""Standardize: :math:`(x - \mu) / \sigma`.

        Args:
            x: Data with trailing shape matching the fitted data, e.g. ``(batch, features)``.

        Returns:
            Standardized data, same shape as ``x``.

        Raises:
            RuntimeError: If :meth:`fit` has not been called.
        """
        mean, std = self._fitted(x)
        return (x - mean) / std

    def inverse_transform(self, x: torch.Tensor) -> torch.Tensor:
        r"""Undo :meth:`transform`: :math:`x \sigma + \mu`.

        Args:
            x: Standardized data, e.g. predictive means ``(num_samples, batch)``.

        Returns:
            Data in original units, same shape as ``x``.

        Raises:
            RuntimeError: If :meth:`fit` has not been called.
        """
        mean, std = self._fitted(x)
        return x * std + mean

    def inverse_scale(self, scale: torch.Tensor) -> torch.Tensor:
        r"""Map a standard deviation from standardized to original units: :math:`s \sigma`.

        Args:
            scale: Standard deviations in standardized units, e.g. ``(num_samples, batch)``.

        Returns:
            Standard deviations in original units, same shape as ``scale``.

        Raises:
            RuntimeError: If :meth:`fit` has not been called.
        """
        _, std = self._fitted(scale)
        return scale * std
