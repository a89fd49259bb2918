r"""The low-rank-plus-diagonal Gaussian guide.

:class:`LowRankGuide` approximates each block of weights (a layer's weight and bias, or the
whole network) by :math:`\mathcal{N}(\mu, D + VV^\top)` with :math:`D = \text{softplus}(\rho)^2`
and a rank-``r`` factor :math:`V`. A block is one auxiliary latent; the model's sites are
``Delta`` slices of it, as in Pyro's ``AutoLowRankMultivariateNormal``, so the guide works
with every Pyro ELBO. The block's site annotates which model sites it joins, and
:class:`~pyro_bbb.infer.elbo.AnnealedELBO` uses that to compute the KL to a Gaussian prior
in closed form (:func:`~pyro_bbb.infer.kl.kl_low_rank_diagonal`, by the matrix determinant
lemma, never a :math:`d \times d` matrix). The block's distribution also remembers the factor noise
:math:`\varepsilon_2` it drew, so :func:`~pyro_bbb.local_reparameterization` can add the
rank-``r`` part of a layer's pre-activation exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule

from ..._pyro_compat import SetupError, low_rank_parts, pyro_name
from ..._validation import check_choice, check_int
from ..sites import BLOCK_KEY, JOINT_KEY
from ._base import GaussianGuide
from ._init import InitLoc, InitScale, as_init_scale, scale_from_rho
from ._params import ParamRef, set_param

__all__ = ["OWN_BLOCK", "LowRankGuide", "LowRankMultivariateNormal"]

#: Where a module's own block sits when a child module has a block too: ``<module>.own``.
OWN_BLOCK = "own"


class LowRankMultivariateNormal(dist.LowRankMultivariateNormal):
    r""":math:`\mathcal{N}(\mu, D + VV^\top)` that remembers the noise of its last draw.

    ``rsample`` returns :math:`\mu + D^{1/2}\varepsilon_1 + V\varepsilon_2` and keeps
    :math:`\varepsilon_2` as :attr:`factor_noise` (shape ``sample_shape + batch_shape +
    (rank,)``), which local reparameterisation shares across a minibatch.
    """

    factor_noise: torch.Tensor | None = None

    def expand(self, batch_shape, _instance=None):  # noqa: D102 (torch's API)
        new = self._get_checked_instance(LowRankMultivariateNormal, _instance)
        return super().expand(batch_shape, _instance=new)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        r"""Draw :math:`\mu + D^{1/2}\varepsilon_1 + V\varepsilon_2`, remembering ε₂."""
        shape = self._extended_shape(sample_shape)
        factor, diag = low_rank_parts(self)
        eps_diag = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        eps_factor = torch.randn(
            (*shape[:-1], factor.shape[-1]), dtype=self.loc.dtype, device=self.loc.device
        )
        self.factor_noise = eps_factor
        factor_part = (factor @ eps_factor.unsqueeze(-1)).squeeze(-1)
        return self.loc + factor_part + diag.sqrt() * eps_diag


@dataclass(frozen=True)
class _Slice:
    site: str
    start: int
    stop: int
    shape: torch.Size


@dataclass(frozen=True)
class _Block:
    name: str
    aux_site: str
    slices: tuple[_Slice, ...]

    @property
    def size(self) -> int:
        return self.slices[-1].stop


class LowRankGuide(GaussianGuide):
    r"""Low-rank-plus-diagonal Gaussian guide over blocks of weights.

    .. math::

        q(\theta_b) = \mathcal{N}(\mu_b, D_b + V_b V_b^\top), \quad
        D_b = \text{diag}(\text{softplus}(\rho_b) + \sigma_{\min})^2, \quad
        \theta_b = \mu_b + D_b^{1/2}\varepsilon_1 + V_b\varepsilon_2

    for each block :math:`b`, independent across blocks. Parameters: ``locs.<block>``
    ``(d,)``, ``rhos.<block>`` ``(d,)`` and ``factors_t.<block>`` ``(rank, d)``, the factor
    transposed, :math:`V^\top` (with the member shape in front for the members of an
    :class:`~pyro_bbb.infer.Ensemble`). :math:`V^\top` is stored rather than :math:`V`
    because every product with it (the draw :math:`V\varepsilon_2`, the KL's
    :math:`V^\top D^{-1} V`, their gradients, the optimiser's update) then runs along rows of
    length :math:`d` instead of ``rank``, several times faster; :meth:`block_distribution`
    hands Pyro the :math:`(d, \text{rank})` view. In :func:`~pyro_bbb.fit` on the CPU, a
    block of 65,536 numbers or more (rank times ``d``) is drawn and its KL taken in two
    passes over :math:`V^\top` compiled by ``torch.compile`` (``PYRO_BBB_COMPILE=0`` keeps
    the eager path), the same arithmetic as the traced guide's.

    Args:
        model: The Pyro model, e.g. a :class:`~pyro_bbb.BNN`.
        rank: Columns of :math:`V`, ``1 ≤ rank ≤ d`` for every block. For the diagonal
            guide (rank 0) use :class:`~pyro_bbb.MeanFieldGuide`.
        blocks: ``"layer"``: one block per layer (its weight and bias together), so the cost
            grows as ``d·rank`` per layer. ``"network"``: one block of every weight, for small
            networks where cross-layer correlation matters.
        init_scale: Marginal posterior std at initialisation, split 3:1 in variance between
            the diagonal and the factor; or :class:`~pyro_bbb.infer.guides.moped.MOPED`, a
            std per weight proportional to its initial mean's magnitude.
        init_loc: As in :class:`~pyro_bbb.MeanFieldGuide`.
        min_scale: :math:`\sigma_{\min}`, the floor of the diagonal std.
        name: Prefix in Pyro's param store (default: the class name).
        create_plates: Passed to :class:`~pyro.infer.autoguide.AutoGuide`.

    Raises:
        ValueError: On a rank that is not a positive int (0 names
            :class:`~pyro_bbb.MeanFieldGuide`), an unknown ``blocks``, a bad ``init_scale``,
            and (at the first call) a rank larger than a block's size.
    """

    parameter_kinds: ClassVar[dict[str, str]] = {
        "locs": "loc",
        "rhos": "scale",
        "factors_t": "factor",
    }

    def __init__(
        self,
        model: Callable[..., Any],
        *,
        rank: int = 1,
        blocks: Literal["layer", "network"] = "layer",
        init_scale: float | InitScale = 0.05,
        init_loc: InitLoc = None,
        min_scale: float = 1e-6,
        name: str | None = None,
        create_plates: Callable[..., Any] | None = None,
    ) -> None:
        if rank == 0 and not isinstance(rank, bool):
            raise ValueError(
                "rank must be a positive int, got 0: a rank-0 low-rank guide is the diagonal "
                "(mean-field) guide; use MeanFieldGuide(model) for it"
            )
        self.rank = check_int("rank", rank)
        self.blocks = check_choice("blocks", blocks, ("layer", "network"))
        self.min_scale = float(min_scale)
        self._diag_fraction = math.sqrt(0.75)
        self.init_scale = as_init_scale(init_scale)
        self.init_scale.check(min_scale, self._diag_fraction)
        super().__init__(model, init_loc=init_loc, name=name, create_plates=create_plates)

    # -- set-up
    def _build(self, sites: dict[str, dict], locs: dict[str, torch.Tensor]) -> None:
        groups: dict[str, list[str]] = {}
        for site in sites:
            key = "network" if self.blocks == "network" else (site.rpartition(".")[0] or "_root")
            groups.setdefault(key, []).append(site)
        # a block's parameters sit at its module's path below locs, rhos and factors_t; a
        # module whose own parameters form a block and whose child holds another
        # (MultiheadAttention's in_proj_weight beside out_proj) keeps its own at <path>.own
        self.param_paths = {
            key: f"{key}.{OWN_BLOCK}" if any(k.startswith(key + ".") for k in groups) else key
            for key in groups
        }
        self._blocks = []
        #: Each block's factor's initial size, the root mean square of its entries' stds:
        #: what its learning rate is read from (:mod:`~pyro_bbb.training.rates`).
        self.factor_sizes: dict[str, float] = {}
        self.locs, self.rhos, self.factors_t = PyroModule(), PyroModule(), PyroModule()
        members = self.member_shape
        for key, names in groups.items():
            slices, start = [], 0
            for site in names:
                shape = sites[site]["value"].shape
                slices.append(_Slice(site, start, start + shape.numel(), shape))
                start += shape.numel()
            if self.rank > start:
                raise SetupError(
                    f"rank={self.rank} exceeds the size {start} of block {key!r} "
                    f"(sites {names}); use rank <= {start}"
                    + (" or blocks='network'" if self.blocks == "layer" else "")
                )
            block = _Block(key, f"_{pyro_name(self)}.{key}", tuple(slices))
            self._blocks.append(block)
            loc = torch.cat([locs[s].reshape(*members, -1) for s in names], -1)
            scale = self.init_scale.scales(loc)
            rho = self.init_scale.rho(loc, self.min_scale, self._diag_fraction)
            factor_scale = 0.5 * scale[..., None] / math.sqrt(self.rank)
            self.factor_sizes[key] = float(factor_scale.double().pow(2).mean().sqrt())
            noise = torch.randn(*members, start, self.rank, dtype=loc.dtype).to(loc)
            factor_t = (factor_scale * noise).mT.contiguous()  # V^T, (rank, d)
            path = self.param_paths[key]
            set_param(self.locs, path, loc, site=key)
            set_param(self.rhos, path, rho, site=key)
            set_param(self.factors_t, path, factor_t, site=key)
        paths = self.param_paths
        self._params = {
            block.name: tuple(ParamRef(root, paths[block.name]) for root in self._roots())
            for block in self._blocks
        }

    def _roots(self) -> tuple[PyroModule, PyroModule, PyroModule]:
        """The modules holding the blocks' means, ρ and factors (transposed), in that order."""
        return self.locs, self.rhos, self.factors_t

    # -- the distribution of a block
    def block_distribution(self, block: _Block | str) -> dist.TorchDistribution:
        r"""The :class:`LowRankMultivariateNormal` :math:`\mathcal{N}(\mu, D + VV^\top)` of a block.

        Its event shape is ``(d,)``, the block's size.
        """
        if isinstance(block, str):
            block = self._block(block)
        loc, rho, factor_t = (ref() for ref in self._params[block.name])
        scale = scale_from_rho(rho, self.min_scale)
        return LowRankMultivariateNormal(loc, factor_t.mT, scale.pow(2))  # V, a (d, rank) view

    def _block(self, name: str) -> _Block:
        for block in self._blocks:
            if block.name == name:
                return block
        raise KeyError(f"no block {name!r}; blocks are {[b.name for b in self._blocks]}")

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Draw every block and hand each model site its slice; takes the model's arguments.

        Returns:
            ``{site name: sample}``.
        """
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        result = {}
        for block in self._blocks:
            theta = pyro.sample(
                block.aux_site,
                self.block_distribution(block),
                infer={"is_auxiliary": True, JOINT_KEY: tuple(s.site for s in block.slices)},
            )
            batch = theta.shape[:-1]
            for piece in block.slices:
                value = theta[..., piece.start : piece.stop].reshape(*batch, *piece.shape)
                result[piece.site] = pyro.sample(
                    piece.site,
                    dist.Delta(value, event_dim=len(piece.shape)),
                    infer={BLOCK_KEY: (block.aux_site, piece.start, piece.stop)},
                )
        return result

    # -- files written by earlier versions
    def legacy_parameters(self) -> dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]]:
        r"""Parameters that files of earlier versions hold under another name or layout.

        Earlier versions stored the factor :math:`V` itself, ``<name>.factors.<block>``
        ``(*members, d, rank)``; it is now :math:`V^\top`, ``<name>.factors_t.<block>``
        ``(*members, rank, d)``. :func:`~pyro_bbb.load` and ``fit(resume=...)`` convert such
        a file as they read it (the optimiser's state of the factor too).

        Returns:
            ``{old name in Pyro's param store: (new name, conversion of a saved tensor)}``.
        """
        self._require_setup()
        prefix = pyro_name(self.factors_t).removesuffix("factors_t")
        return {
            f"{prefix}factors.{path}": (f"{prefix}factors_t.{path}", _transposed)
            for path in (self.param_paths[block.name] for block in self._blocks)
        }

    # -- summaries
    @property
    def block_names(self) -> list[str]:
        """Names of the blocks (layer paths, or ``"network"``)."""
        self._require_setup()
        return [block.name for block in self._blocks]

    @property
    def block_sites(self) -> dict[str, dict[str, torch.Size]]:
        """The sites of each block, in their order in it: ``{block: {site: shape}}``."""
        self._require_setup()
        return {block.name: {s.site: s.shape for s in block.slices} for block in self._blocks}

    @torch.no_grad()
    def posterior(self) -> dict[str, dist.TorchDistribution]:
        """The joint posterior of every block, ``{block name: distribution over (d,)}``."""
        self._require_setup()
        return {block.name: self.block_distribution(block) for block in self._blocks}

    @torch.no_grad()
    def covariance(self, block: str) -> torch.Tensor:
        r"""Dense covariance :math:`D + VV^\top` of one block, ``(d, d)`` (small blocks only).

        The members of an ensemble give ``(*member_shape, d, d)``.
        """
        self._require_setup()
        fn = self.block_distribution(block)
        return fn.covariance_matrix

    def _marginals(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        result = {}
        for block in self._blocks:
            loc, rho, factor_t = (ref() for ref in self._params[block.name])
            # the variance D + diag(VV^T) along the rows of V^T: the distribution's own
            # (V's rows squared and summed, across the rank) reads V^T with a stride of d
            # and takes ten times as long on a large block, once an epoch in fit
            variance = factor_t.square().sum(-2) + scale_from_rho(rho, self.min_scale).pow(2)
            scale = variance.sqrt()
            for piece in block.slices:
                result[piece.site] = (
                    loc[..., piece.start : piece.stop].reshape(*self.member_shape, *piece.shape),
                    scale[..., piece.start : piece.stop].reshape(*self.member_shape, *piece.shape),
                )
        return result


def _transposed(factor: torch.Tensor) -> torch.Tensor:
    """``(..., d, rank)`` to ``(..., rank, d)``, contiguous."""
    return factor.mT.contiguous()
