r"""The terms of a low-rank Gaussian block that touch its factor, with a hand-written backward.

For :math:`q = \mathcal{N}(\mu, D + VV^\top)`, :math:`D = \mathrm{diag}(\sigma^2)`, a rank-``r``
factor :math:`V` held transposed as :math:`U = V^\top` (``(r, d)``), and Gaussian priors of
one variance :math:`s_j^2` per group :math:`J_j` of consecutive coordinates (a layer's
weight, its bias), the fused step needs two quantities that involve :math:`U`:

* the shared part of the draw, :math:`\mu + V\varepsilon_2` (``(*sample, d)``);
* :math:`F = \sum_j c_j \lVert U_{:, J_j} \rVert^2 - \log\det C` with :math:`c_j = 1/s_j^2`
  and the capacitance :math:`C = I_r + U D^{-1} U^\top`: the factor's part of twice
  :math:`\mathrm{KL}(q \,\|\, p)` (the trace term and the matrix determinant lemma's part of
  :math:`\log\det(D + VV^\top)`).

On a large layer each pass over :math:`U` is as dear as the rest of a mean-field step's
per-weight work, and each fresh ``(r, d)`` buffer costs page faults on top. Left to autograd
these two quantities take about a dozen passes and six such buffers per step (the scaled copy
:math:`UD^{-1/2}` kept for backward, the Gram product's two gradients, the norm's gradient,
the draw's outer product, their sums). The gradients have closed forms,

.. math::

    \frac{\partial F}{\partial U} = 2\,c \odot U - 2\,C^{-1} U D^{-1}, \qquad
    \frac{\partial F}{\partial \sigma_i} = \frac{2}{\sigma_i^3}\,
        U_{:,i}^\top C^{-1} U_{:,i}, \qquad
    \frac{\partial F}{\partial c_j} = \lVert U_{:, J_j} \rVert^2,

and the draw adds :math:`\varepsilon_2 g^\top` to :math:`\partial/\partial U`, so
:class:`FactorTerms` writes the whole gradient of :math:`U` into one new buffer (the one
that becomes ``U.grad``) in five passes, and keeps no ``(r, d)`` tensor for backward. Its
forward whitens :math:`U` a chunk of columns at a time (:func:`_capacitance`).
``tests/infer/test_fused.py`` checks these gradients against autograd's through the traced
ELBO.
"""

from __future__ import annotations

import torch
from torch.autograd.function import FunctionCtx

__all__ = ["FactorTerms"]


class FactorTerms(torch.autograd.Function):
    """``(μ + V ε₂, F)`` of one block; see the module's notes."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        loc: torch.Tensor,
        scale: torch.Tensor,
        factor_t: torch.Tensor,
        eps: torch.Tensor,
        coefs: torch.Tensor,
        sizes: tuple[int, ...],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""The shared draw and :math:`F`.

        Args:
            ctx: Autograd's context.
            loc: :math:`\mu`, ``(d,)``.
            scale: :math:`\sigma`, ``(d,)``.
            factor_t: :math:`U = V^\top`, ``(r, d)``, contiguous.
            eps: :math:`\varepsilon_2`, ``(*sample, r)``.
            coefs: :math:`c_j`, ``(groups,)``.
            sizes: The groups' sizes, summing to ``d``.

        Returns:
            :math:`\mu + V\varepsilon_2`, ``(*sample, d)``, and :math:`F`, a scalar.
        """
        rank, size = factor_t.shape
        flat = eps.reshape(-1, rank)
        if flat.shape[0] == 1:
            shared = torch.addmv(loc, factor_t.mT, flat[0])
        else:
            shared = torch.addmm(loc, flat, factor_t)
        tril = torch.linalg.cholesky(_capacitance(factor_t, scale.reciprocal()))
        log_det = 2 * tril.diagonal().log().sum()
        squares = torch.stack(
            [torch.linalg.vector_norm(rows).square() for rows in factor_t.split(sizes, -1)]
        )
        # U and σ are the caller's (σ is also kept by the draw's backward): nothing new is kept
        ctx.save_for_backward(factor_t, scale, flat, torch.cholesky_inverse(tril), squares)
        ctx.coefs, ctx.sizes, ctx.coefs_need_grad = coefs.detach(), sizes, coefs.requires_grad
        ctx.set_materialize_grads(False)
        return shared.reshape(*eps.shape[:-1], size), (coefs * squares).sum() - log_det

    @staticmethod
    def backward(
        ctx: FunctionCtx, grad_shared: torch.Tensor | None, grad_f: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        """The closed-form gradients of the module's notes, ``U``'s in one buffer."""
        factor_t, scale, flat, cov_inv, squares = ctx.saved_tensors
        rank, size = factor_t.shape
        grad_loc = grad_scale = grad_factor = grad_coefs = None
        if grad_f is not None:
            # -2 g C^{-1} U, then the column sums of U * it give σ's gradient, then its
            # columns scaled by 1/σ² and the trace term added make U's
            grad_factor = torch.mm(cov_inv * (-2 * grad_f), factor_t)
            dot = factor_t[0] * grad_factor[0]
            for k in range(1, rank):
                dot.addcmul_(factor_t[k], grad_factor[k])
            inv_var = scale.square().reciprocal_()
            grad_scale = dot.mul_(inv_var).div_(scale).neg_()
            grad_factor.mul_(inv_var)
            trace = (2 * grad_f) * ctx.coefs
            start = 0
            for j, n in enumerate(ctx.sizes):
                columns = slice(start, start + n)
                grad_factor[:, columns].addcmul_(factor_t[:, columns], trace[j])
                start += n
            if ctx.coefs_need_grad:
                grad_coefs = grad_f * squares
        if grad_shared is not None:
            flat_grad = grad_shared.reshape(-1, size)
            grad_loc = flat_grad[0] if flat_grad.shape[0] == 1 else flat_grad.sum(0)
            if grad_factor is None:
                grad_factor = torch.mm(flat.mT, flat_grad)
            elif flat.shape[0] == 1:
                grad_factor.addr_(flat[0], flat_grad[0])
            else:
                grad_factor.addmm_(flat.mT, flat_grad)
        return grad_loc, grad_scale, grad_factor, None, grad_coefs, None


#: Columns of U whitened at a time for the capacitance: a buffer of about 1 MiB in float32.
_CHUNK_NUMBERS = 2**18


def _capacitance(factor_t: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    r""":math:`C = I_r + U D^{-1} U^\top`, ``(r, r)``, a chunk of columns at a time.

    Whitening all of :math:`U` at once would take a fresh ``(r, d)`` buffer (page faults,
    and the peak memory of the step); a chunk of :math:`UD^{-1/2}` is written into one small
    buffer, reused across chunks, and its Gram product added in place.
    """
    rank, size = factor_t.shape
    chunk = max(1, min(size, _CHUNK_NUMBERS // rank))
    capacitance = torch.eye(rank, dtype=factor_t.dtype, device=factor_t.device)
    buffer = factor_t.new_empty(rank, chunk)
    for start in range(0, size, chunk):
        stop = min(start + chunk, size)
        whitened = torch.mul(
            factor_t[:, start:stop], inv_scale[start:stop], out=buffer[:, : stop - start]
        )
        capacitance.addmm_(whitened, whitened.mT)
    return capacitance
