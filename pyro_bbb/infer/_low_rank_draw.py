r"""A low-rank block's whole draw and closed-form KL in two compiled passes over its factor.

For :math:`q = \mathcal{N}(\mu, D + VV^\top)`, :math:`D = \mathrm{diag}(\sigma^2)`,
:math:`\sigma = \mathrm{softplus}(\rho) + \sigma_{\min}`, the factor held transposed as
:math:`U = V^\top` (``(r, d)``), one draw
:math:`\theta = \mu + V\varepsilon_2 + \sigma \odot \varepsilon_1` and the KL divergence to a
prior :math:`\mathcal{N}(m_j, s_j^2)` on each group :math:`J_j` of coordinates need, as
:mod:`~pyro_bbb.infer._low_rank_block` sets out,

.. math::

    G = \sum_j c_j \big(\lVert \sigma_{J_j} \rVert^2 + \lVert \mu_{J_j} - m_j \rVert^2
        + \lVert U_{:, J_j} \rVert^2\big) - 2\sum_i \log\sigma_i - \log\det C,
    \qquad C = I_r + U D^{-1} U^\top, \quad c_j = 1/s_j^2.

Every term is a sum over the coordinates :math:`i` of something of column :math:`i` alone
(:math:`U_{:,i}`, :math:`\mu_i`, :math:`\rho_i`, the noise), but :math:`\log\det C`, which
needs the :math:`r \times r` sums first. So the forward is one pass over the columns
(:func:`forward_columns`: the draw and every sum, :math:`C`'s :math:`r(r+1)/2` entries among
them), then :math:`C`'s Cholesky factor; and the backward, with :math:`A = -2g\,C^{-1}` for
the gradient :math:`g` reaching :math:`G` and :math:`g_\theta` the one reaching the draw, is
one pass more (:func:`backward_columns`), column by column:

.. math::

    \frac{\partial}{\partial U_{:,i}} = \frac{A U_{:,i}}{\sigma_i^2}
        + 2 g c_j U_{:,i} + \varepsilon_2\, g_{\theta,i}, \qquad
    \frac{\partial}{\partial \sigma_i} = g_{\theta,i}\varepsilon_{1,i}
        - \frac{U_{:,i}^\top A U_{:,i} / \sigma_i^2 + 2g}{\sigma_i} + 2 g c_j \sigma_i,

:math:`\partial/\partial\rho_i = \partial/\partial\sigma_i \cdot \mathrm{sigmoid}(\rho_i)`
(softplus's derivative, the identity above its threshold as in ``F.softplus``) and
:math:`\partial/\partial\mu_i = 2 g c_j (\mu_i - m_j) + g_{\theta,i}`. Each pass reads
:math:`U` once and the backward writes its gradient once: two passes over the factor a step,
where the eager :class:`~pyro_bbb.infer._low_rank_block.LowRankBlock` with softplus and the
diagonal part left to autograd makes about fourteen, and no buffer of the factor's size is
made but its gradient. Both passes are plain torch operations compiled by ``torch.compile``
(:mod:`~pyro_bbb.infer._compiled`) into one vectorised loop each; where that cannot run, the
same functions run eagerly.

:class:`LowRankDraw` is the autograd Function; :func:`compiled_draw_applies` says when the
fused step takes it (one draw of a single guide's block under weight sampling, a Gaussian
prior of fixed numbers, on the CPU, a block large enough for the pass to pay). The noise is
drawn by the caller in the guide's order, so the draw is the one the traced guide makes.
``tests/infer/test_low_rank_draw.py`` checks values and every gradient against autograd on
the dense formulas, compiled and not.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch.autograd.function import FunctionCtx, once_differentiable

from ._compiled import CompiledKernel
from ._low_rank_block import cholesky

__all__ = [
    "LowRankDraw",
    "backward_columns",
    "compiled_draw_applies",
    "forward_columns",
    "prepare_kernels",
    "prior_constants",
]

#: softplus's threshold (``F.softplus``'s default): above it, softplus is the identity.
_THRESHOLD = 20.0
#: The largest rank taken: the forward pass keeps r(r + 1)/2 + 2 running sums.
MAX_RANK = 8
#: Numbers in a block's factor (rank × d) from which the compiled passes pay: below it the
#: call's own cost (tens of µs) is more than the passes it saves.
MIN_NUMBERS = 2**16


def forward_columns(
    loc: torch.Tensor,
    rho: torch.Tensor,
    factor_t: torch.Tensor,
    eps_diag: torch.Tensor,
    eps_factor: torch.Tensor,
    coef: torch.Tensor,
    prior_loc: torch.Tensor,
    min_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""The draw and the column sums of :math:`G`, in one pass over the columns.

    Args:
        loc: :math:`\mu`, ``(d,)``.
        rho: :math:`\rho`, ``(d,)``.
        factor_t: :math:`U`, ``(r, d)``.
        eps_diag: :math:`\varepsilon_1`, ``(d,)``.
        eps_factor: :math:`\varepsilon_2`, ``(r,)``.
        coef: :math:`c` per coordinate, ``(d,)``, or one for all, ``()``.
        prior_loc: :math:`m` per coordinate or one for all, likewise.
        min_scale: :math:`\sigma_{\min}`.

    Returns:
        :math:`\theta`, ``(d,)``; ``(2 + r(r+1)/2,)`` sums: the :math:`c`-weighted sum of
        squares, :math:`\sum_i \log\sigma_i`, and :math:`(UD^{-1}U^\top)_{kl}` for
        :math:`k \le l`, row by row; and, for the backward pass, :math:`\sigma` and
        softplus's derivative :math:`\mathrm{sigmoid}(\rho)`, ``(d,)`` each (written
        here, where :math:`e^\rho` is at hand, rather than computed again there).
    """
    rank = factor_t.shape[0]
    rows = [factor_t[k] for k in range(rank)]
    above = rho > _THRESHOLD
    exp = torch.exp(rho)
    scale = torch.where(above, rho, torch.log1p(exp)) + min_scale  # F.softplus(rho) + floor
    slope = torch.where(above, torch.ones_like(rho), exp / (1.0 + exp))
    theta = loc + scale * eps_diag
    squares = scale * scale + (loc - prior_loc).square()
    for k in range(rank):
        theta = theta + eps_factor[k] * rows[k]
        squares = squares + rows[k] * rows[k]
    inv_var = 1.0 / (scale * scale)
    sums = [(coef * squares).sum(), scale.log().sum()]
    for k in range(rank):
        whitened = rows[k] * inv_var
        sums += [(whitened * rows[j]).sum() for j in range(k, rank)]
    return theta, torch.stack(sums), scale, slope


def backward_columns(
    loc: torch.Tensor,
    scale: torch.Tensor,
    slope: torch.Tensor,
    factor_t: torch.Tensor,
    eps_diag: torch.Tensor,
    eps_factor: torch.Tensor,
    coef: torch.Tensor,
    prior_loc: torch.Tensor,
    a: torch.Tensor,
    grad_theta: torch.Tensor,
    twice_grad: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""The gradients of the module's notes for :math:`\mu`, :math:`\rho` and :math:`U`.

    Args:
        loc, factor_t, eps_diag, eps_factor, coef, prior_loc: As in :func:`forward_columns`.
        scale: :math:`\sigma`, ``(d,)``, from :func:`forward_columns`.
        slope: softplus's derivative at :math:`\rho`, ``(d,)``, likewise.
        a: :math:`A = -2g\,C^{-1}`, ``(r, r)``.
        grad_theta: :math:`g_\theta`, ``(d,)``.
        twice_grad: :math:`2g`, ``()``.

    Returns:
        The gradients for ``loc``, ``rho`` and ``factor_t``, in their shapes.
    """
    rank = factor_t.shape[0]
    rows = [factor_t[k] for k in range(rank)]
    inv_scale = 1.0 / scale
    inv_var = inv_scale * inv_scale
    twice_coef = twice_grad * coef
    grads, quadratic = [], None
    for k in range(rank):
        applied = a[k, 0] * rows[0]
        for j in range(1, rank):
            applied = applied + a[k, j] * rows[j]
        term = rows[k] * applied
        quadratic = term if quadratic is None else quadratic + term
        grads.append(applied * inv_var + twice_coef * rows[k] + eps_factor[k] * grad_theta)
    grad_scale = (
        grad_theta * eps_diag - (quadratic * inv_var + twice_grad) * inv_scale + twice_coef * scale
    )
    grad_loc = twice_coef * (loc - prior_loc) + grad_theta
    return grad_loc, grad_scale * slope, torch.stack(grads)


_FORWARD = CompiledKernel(forward_columns, "LowRankGuide's fused draw and KL")
_BACKWARD = CompiledKernel(backward_columns, "LowRankGuide's fused draw and KL")


def compiled_draw_applies(loc: torch.Tensor, factor_t: torch.Tensor) -> bool:
    """Whether :class:`LowRankDraw` is the faster path for this block (see the notes).

    A single guide's block (``loc`` ``(d,)``) of float32 or float64, rank at most
    :data:`MAX_RANK`, at least :data:`MIN_NUMBERS` numbers in its factor, on the CPU with
    the compiled kernels running here.
    """
    return (
        loc.dim() == 1
        and loc.dtype in (torch.float32, torch.float64)
        and factor_t.shape[0] <= MAX_RANK
        and factor_t.numel() >= MIN_NUMBERS
        and _FORWARD.runs_compiled(loc)
        and _BACKWARD.runs_compiled(loc)
    )


_prepared: set[tuple[torch.dtype, int, float]] = set()


def prepare_kernels(like: torch.Tensor, rank: int, min_scale: float) -> None:
    """Compile (or load) the two passes for blocks like ``like`` of this rank, once a process.

    One draw and its backward on a block of fixed numbers of the smallest size taken (no
    random state is used), so that the first training step does not build them.
    """
    key = (like.dtype, rank, min_scale)
    if key in _prepared:
        return
    _prepared.add(key)
    kw = {"dtype": like.dtype, "device": like.device}
    size = max(MIN_NUMBERS // rank, 16)  # the sizes taken (compiled sizes have ranges)
    loc, rho = torch.zeros(size, **kw), torch.zeros(size, **kw)
    factor_t = torch.full((rank, size), 0.1, **kw)
    params = [t.requires_grad_() for t in (loc, rho, factor_t)]
    eps_diag, eps_factor = torch.zeros(size, **kw), torch.zeros(rank, **kw)
    one, zero = torch.ones((), **kw), torch.zeros((), **kw)
    with torch.enable_grad():  # the backward's kernel too, whatever the caller's mode
        theta, twice_kl = LowRankDraw.apply(*params, eps_diag, eps_factor, one, zero, min_scale)
        # a dense gradient for the draw, as a network's layers give it
        torch.autograd.grad((theta, twice_kl), params, (torch.ones_like(theta), one))


def _symmetric(entries: torch.Tensor, rank: int) -> torch.Tensor:
    """The ``(r, r)`` symmetric matrix of its upper triangle's entries, row by row."""
    rows, cols = torch.triu_indices(rank, rank, device=entries.device)
    matrix = entries.new_zeros(rank, rank)
    matrix[rows, cols] = entries
    matrix[cols, rows] = entries
    return matrix


class LowRankDraw(torch.autograd.Function):
    r"""``(θ, G)`` of one block from :math:`\mu, \rho, U` and the noise; see the notes."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        loc: torch.Tensor,
        rho: torch.Tensor,
        factor_t: torch.Tensor,
        eps_diag: torch.Tensor,
        eps_factor: torch.Tensor,
        coef: torch.Tensor,
        prior_loc: torch.Tensor,
        min_scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""The draw :math:`\theta` ``(d,)`` and :math:`G`, a scalar.

        Args:
            ctx: Autograd's context.
            loc: :math:`\mu`, ``(d,)``.
            rho: :math:`\rho`, ``(d,)``.
            factor_t: :math:`U = V^\top`, ``(r, d)``.
            eps_diag: :math:`\varepsilon_1`, ``(d,)``.
            eps_factor: :math:`\varepsilon_2`, ``(r,)``.
            coef: :math:`c_j = 1/s_j^2` per coordinate, ``(d,)``, or one, ``()`` (constants).
            prior_loc: :math:`m_j` per coordinate or one, likewise (constants).
            min_scale: :math:`\sigma_{\min}`.
        """
        rank = factor_t.shape[0]
        # plain tensors, not Parameters (whose shapes torch.compile keeps static): one
        # compiled kernel then serves every block's size
        loc, rho, factor_t = loc.detach(), rho.detach(), factor_t.detach()
        inputs = (loc, rho, factor_t, eps_diag, eps_factor, coef, prior_loc, min_scale)
        theta, sums, scale, slope = _FORWARD(*inputs)
        capacitance = _symmetric(sums[2:], rank)
        capacitance.diagonal().add_(1.0)
        tril = cholesky(capacitance)
        g = sums[0] - 2 * (sums[1] + tril.diagonal().log().sum())
        ctx.save_for_backward(loc, scale, slope, factor_t, eps_diag, eps_factor, coef, prior_loc)
        ctx.tril = tril
        return theta, g

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, grad_theta: torch.Tensor | None, grad_g: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        """The gradients of the notes, in one pass (:func:`backward_columns`)."""
        loc, scale, slope, factor_t, eps_diag, eps_factor, coef, prior_loc = ctx.saved_tensors
        if grad_theta is None:
            grad_theta = torch.zeros_like(loc)
        if grad_g is None:
            grad_g = loc.new_zeros(())
        a = torch.cholesky_inverse(ctx.tril) * (-2 * grad_g)
        grads = _BACKWARD(
            loc, scale, slope, factor_t, eps_diag, eps_factor, coef, prior_loc,
            a, grad_theta, 2 * grad_g,
        )  # fmt: skip
        return (*grads, None, None, None, None, None)


def prior_constants(
    groups: Sequence[tuple[int, tuple]], like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    r""":math:`c` and :math:`m` for :class:`LowRankDraw`: one each, or one per coordinate.

    ``groups`` is ``[(size, (m, s))]``, the block's groups of coordinates and their prior;
    ``None`` when a prior's parameters are tensors that need a gradient (a learned prior:
    the eager path takes it). Made once per block, dtype and device.
    """
    numbers = []
    for size, (m, s) in groups:
        if any(isinstance(v, torch.Tensor) and v.requires_grad for v in (m, s)):
            return None
        numbers.append((size, float(m), float(s)))
    return _constants(tuple(numbers), like.dtype, like.device)


@functools.lru_cache(maxsize=64)
def _constants(
    groups: tuple[tuple[int, float, float], ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    if len({(m, s) for _, m, s in groups}) == 1:
        _, m, s = groups[0]
        values = [torch.tensor(v, dtype=dtype, device=device) for v in (1.0 / (s * s), m)]
    else:
        values = [
            torch.cat([torch.full((n,), v, dtype=dtype, device=device) for n, v in column])
            for column in (
                [(n, 1.0 / (s * s)) for n, _, s in groups],
                [(n, m) for n, m, _ in groups],
            )
        ]
    return values[0], values[1]
