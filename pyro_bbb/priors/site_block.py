r"""What a Gaussian over a block of sites shares, whatever its form: the sites and their slices.

A Gaussian over the concatenated, flattened values of several sites (a layer's weight and
bias, or a whole network) is drawn as a prior site by site under the model's own names, each
site from its conditional given the block's sites drawn before it in this run of the model.
Two forms do the algebra: :class:`~pyro_bbb.priors.gaussian_block.GaussianBlock` holds the
covariance :math:`D + VV^\top` (a trained :class:`~pyro_bbb.LowRankGuide`),
:class:`~pyro_bbb.priors.precision_block.PrecisionBlock` the precision
:math:`\Upsilon + WW^\top` (an online filter's belief). :class:`SiteBlock` is what they
share: the sites, where each lies in the flat vector, the checks of the arguments and of the
drawn values, the cache of factors, and the template of :meth:`SiteBlock.conditional`.
:class:`BlockSiteConditional` is what their conditionals share: one event of the site's
shape over a flat Gaussian. Nothing here knows either form's algebra.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

__all__ = ["BlockSiteConditional", "SiteBlock"]


class SiteBlock:
    r"""A Gaussian over the concatenated values of named sites, with a diagonal and a factor.

    Subclasses name the factor and the diagonal (:attr:`FACTOR`, :attr:`DIAGONAL`: the
    attributes they are stored as, and the names in error messages) and give the
    conditional's factors (:meth:`_conditional_factors`, cached per site, sites given,
    device and dtype) and the conditional itself (:meth:`_conditional`). The tensors are
    detached and copied.

    Args:
        loc: :math:`\mu`, ``(d,)``.
        factor: The low-rank factor, ``(d, r)`` with ``r >= 1``.
        diag: The diagonal, ``(d,)``, positive.
        sites: ``{site name: shape}`` in the order the sites are concatenated; the shapes'
            sizes add up to ``d``.

    Raises:
        ValueError: On inconsistent shapes or a non-positive diagonal, naming the argument.
    """

    #: The names of the factor and the diagonal, as the subclass stores and takes them.
    FACTOR = "factor"
    DIAGONAL = "diag"

    def __init__(
        self,
        loc: torch.Tensor,
        factor: torch.Tensor,
        diag: torch.Tensor,
        sites: Mapping[str, Sequence[int]],
    ) -> None:
        self.sites = {name: torch.Size(shape) for name, shape in sites.items()}
        d = sum(shape.numel() for shape in self.sites.values())
        if (
            loc.shape != (d,)
            or diag.shape != (d,)
            or factor.dim() != 2
            or factor.shape[0] != d
            or factor.shape[1] < 1
        ):
            raise ValueError(
                f"a block of sites {list(self.sites)} has {d} values: loc and {self.DIAGONAL} "
                f"must be ({d},) and {self.FACTOR} ({d}, rank >= 1), got {tuple(loc.shape)}, "
                f"{tuple(diag.shape)} and {tuple(factor.shape)}"
            )
        if not bool((diag > 0).all()):
            raise ValueError(f"{self.DIAGONAL} must be positive")
        self.loc = loc.detach().clone()
        setattr(self, self.FACTOR, factor.detach().clone())
        setattr(self, self.DIAGONAL, diag.detach().clone())
        self._slices: dict[str, slice] = {}
        start = 0
        for name, shape in self.sites.items():
            self._slices[name] = slice(start, start + shape.numel())
            start += shape.numel()
        self._cache: dict[object, object] = {}

    @property
    def rank(self) -> int:
        """``r``, the columns of the factor."""
        return getattr(self, self.FACTOR).shape[1]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sites={list(self.sites)}, size={self.loc.shape[0]}, "
            f"rank={self.rank})"
        )

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": {}}  # the cached factors are rebuilt where unpickled

    def site_loc(self, site: str) -> torch.Tensor:
        """The marginal mean of one site, in the site's shape."""
        self._check_sites((site,))
        return self.loc[self._slices[site]].reshape(self.sites[site])

    def conditional(
        self,
        site: str,
        drawn: Mapping[str, torch.Tensor],
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> BlockSiteConditional:
        """The distribution of ``site`` given the values of the block's sites in ``drawn``.

        Args:
            site: A site of the block.
            drawn: Values of other sites of the block, ``(*batch, *site shape)`` each; entries
                for sites outside the block are ignored.
            device: Where the distribution lives.
            dtype: Its floating-point type.

        Returns:
            The site's conditional, with event shape the site's shape and batch shape the
            broadcast of the drawn values' leading dims.

        Raises:
            KeyError: If ``site`` is not in the block.
            ValueError: If a drawn value does not have its site's shape.
        """
        self._check_sites((site,))
        given = tuple(name for name in self.sites if name in drawn and name != site)
        key = ("conditional", site, given, device, dtype)
        factors = self._cache.get(key)
        if factors is None:
            factors = self._cache[key] = self._conditional_factors(site, given, device, dtype)
        return self._conditional(site, given, factors, self._flat_values(drawn, given))

    def _conditional_factors(
        self, site: str, given: tuple[str, ...], device: torch.device, dtype: torch.dtype
    ) -> object:
        """What the conditional of ``site`` given ``given`` needs beyond the drawn values."""
        raise NotImplementedError

    def _conditional(
        self,
        site: str,
        given: tuple[str, ...],
        factors: object,
        values: Iterator[tuple[str, torch.Tensor]],
    ) -> BlockSiteConditional:
        """The conditional from its cached factors and the given sites' flat values."""
        raise NotImplementedError

    def _flat_values(
        self, drawn: Mapping[str, torch.Tensor], given: tuple[str, ...]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """``(site, value (*batch, size))`` of each site in ``given``, its shape checked."""
        for name in given:
            value, shape = drawn[name], self.sites[name]
            if value.shape[value.dim() - len(shape) :] != shape:
                raise ValueError(
                    f"site {name!r} of the block must end in shape {tuple(shape)}, got a value "
                    f"of shape {tuple(value.shape)}"
                )
            yield name, value.reshape(*value.shape[: value.dim() - len(shape)], -1)

    def _check_sites(self, sites: Sequence[str]) -> None:
        unknown = [s for s in sites if s not in self.sites]
        if unknown:
            raise KeyError(
                f"site(s) {unknown} are not in the block; its sites are {list(self.sites)}"
            )


class BlockSiteConditional(dist.TorchDistribution):
    """One site of a :class:`SiteBlock` given the block's sites drawn before it.

    One event of the site's shape over a flat Gaussian of the site's values; subclasses
    give the flat mean, variance, draw and log density (``_flat_*``).

    Attributes:
        block: The block this site belongs to.
        site: The site's name.
        given: The names of the block's sites this distribution is conditioned on.
    """

    arg_constraints = {}  # noqa: RUF012 (torch's class-level convention)
    has_rsample = True

    def __init__(
        self,
        batch_shape: torch.Size,
        shape: torch.Size,
        *,
        block: SiteBlock,
        site: str,
        given: tuple[str, ...],
    ) -> None:
        self.block, self.site, self.given = block, site, given
        super().__init__(torch.Size(batch_shape), torch.Size(shape), validate_args=False)

    @property
    def support(self) -> constraints.Constraint:
        """The reals, one event of the site's shape."""
        return constraints.independent(constraints.real, len(self.event_shape))

    @property
    def mean(self) -> torch.Tensor:
        """The conditional mean, ``(*batch, *site shape)``."""
        return self._site_shaped(self._flat_mean())

    @property
    def variance(self) -> torch.Tensor:
        """The conditional variances, ``(*batch, *site shape)``."""
        return self._site_shaped(self._flat_variance())

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        """Draw ``(*sample_shape, *batch, *site shape)``, differentiably in the mean."""
        return self._site_shaped(self._flat_rsample(torch.Size(sample_shape)))

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """Log-density of ``value`` ``(..., *site shape)``, shape the broadcast batch dims."""
        flat = value.reshape(*value.shape[: value.dim() - len(self.event_shape)], -1)
        log_p = self._flat_log_prob(flat)
        return log_p.expand(torch.broadcast_shapes(log_p.shape, self.batch_shape))

    def _site_shaped(self, flat: torch.Tensor) -> torch.Tensor:
        flat = flat.expand(*self.batch_shape, flat.shape[-1]) if flat.dim() == 1 else flat
        return flat.reshape(*flat.shape[:-1], *self.event_shape)

    def _flat_mean(self) -> torch.Tensor:
        raise NotImplementedError

    def _flat_variance(self) -> torch.Tensor:
        raise NotImplementedError

    def _flat_rsample(self, sample_shape: torch.Size) -> torch.Tensor:
        raise NotImplementedError

    def _flat_log_prob(self, flat: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
