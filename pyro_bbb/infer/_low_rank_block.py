r"""A low-rank Gaussian block's shared draw and closed-form KL, with a hand-written backward.

For :math:`q = \mathcal{N}(\mu, D + VV^\top)`, :math:`D = \mathrm{diag}(\sigma^2)`, with the
rank-``r`` factor held transposed as :math:`U = V^\top` (``(r, d)``), and a Gaussian prior
:math:`\mathcal{N}(m_j, s_j^2)` on each group :math:`J_j` of consecutive coordinates (a
layer's weight, its bias), the fused step needs

* the shared part of the draw, :math:`\mu + V\varepsilon_2` (``(*sample, d)``);
* twice the KL divergence up to a constant,

  .. math::

      G = \sum_j c_j \big(\lVert \sigma_{J_j} \rVert^2 + \lVert \mu_{J_j} - m_j \rVert^2
          + \lVert U_{:, J_j} \rVert^2\big) - \log\det(D + VV^\top), \qquad c_j = 1/s_j^2,

  so that :math:`\mathrm{KL}(q \,\|\, p) = \tfrac12\big(G - d + \sum_j n_j \log s_j^2\big)`,
  with :math:`\log\det(D + VV^\top) = \sum_i \log\sigma_i^2 + \log\det C` by the matrix
  determinant lemma, :math:`C = I_r + U D^{-1} U^\top`.

On a large layer the step is bound by memory traffic: a pass over :math:`U` moves ``r``
times the numbers of a pass over the weights, and every fresh buffer of that size costs page
faults on top.
Left to autograd these terms take about 25 passes over :math:`U` a step and six fresh
``(r, d)`` buffers (the scaled copy :math:`UD^{-1/2}` kept for backward, the Gram product's
two gradients, the norm's gradient, the draw's outer product, their sums), and as many of
size ``d``; here the forward reads :math:`U` three times (the draw, the capacitance, the
norms) and the backward makes eleven passes into the one new gradient buffer. The
gradients have closed forms,

.. math::

    \frac{\partial G}{\partial U} = 2\,c \odot U - 2\,C^{-1} U D^{-1}, \qquad
    \frac{\partial G}{\partial \sigma_i} = 2 c\,\sigma_i - \frac{2}{\sigma_i}
        + \frac{2}{\sigma_i^3}\, U_{:,i}^\top C^{-1} U_{:,i}, \qquad
    \frac{\partial G}{\partial \mu} = 2 c \odot (\mu - m),

(and :math:`\partial G/\partial c_j`, :math:`\partial G/\partial m_j` for a prior whose
parameters are learned), and the draw adds :math:`\varepsilon_2 g^\top` to
:math:`\partial/\partial U` and :math:`g` to :math:`\partial/\partial \mu`. So
:class:`LowRankBlock` writes each parameter's gradient into one new buffer (the one that
becomes its ``.grad``), keeps nothing of size ``r × d`` for backward but :math:`U` itself,
and whitens :math:`U` for the capacitance a chunk of columns at a time
(:func:`_capacitance`). ``tests/infer/test_low_rank_block.py`` checks the values against
the dense formulas and the gradients against finite differences; ``test_fused.py`` checks
both against the traced ELBO.
"""

from __future__ import annotations

import torch
from torch.autograd.function import FunctionCtx

__all__ = ["LowRankBlock", "cholesky", "inverse_from_cholesky"]


class LowRankBlock(torch.autograd.Function):
    """``(μ + V ε₂, G)`` of one block; see the module's notes."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        loc: torch.Tensor,
        scale: torch.Tensor,
        factor_t: torch.Tensor,
        eps: torch.Tensor,
        prior_locs: torch.Tensor | None,
        coefs: torch.Tensor,
        sizes: tuple[int, ...],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""The shared draw and :math:`G`.

        Args:
            ctx: Autograd's context.
            loc: :math:`\mu`, ``(d,)``.
            scale: :math:`\sigma`, ``(d,)``.
            factor_t: :math:`U = V^\top`, ``(r, d)``, contiguous.
            eps: :math:`\varepsilon_2`, ``(*sample, r)``.
            prior_locs: :math:`m_j`, ``(groups,)``, or ``None`` for zeros.
            coefs: :math:`c_j = 1/s_j^2`, ``(groups,)``.
            sizes: The groups' sizes, summing to ``d``.

        Returns:
            :math:`\mu + V\varepsilon_2`, ``(*sample, d)``, and :math:`G`, a scalar.
        """
        rank, size = factor_t.shape
        flat = eps.reshape(-1, rank)
        # a tensor of its own, not a view, so that the caller may add the diagonal part in place
        shared = loc.new_empty(*eps.shape[:-1], size)
        if flat.shape[0] == 1:
            torch.addmv(loc, factor_t.mT, flat[0], out=shared.view(size))
        else:
            torch.addmm(loc, flat, factor_t, out=shared.view(-1, size))
        tril = cholesky(_capacitance(factor_t, scale.reciprocal()))
        log_det = 2 * (scale.log().sum() + tril.diagonal().log().sum())
        squares = []
        for j, (mean, std, rows) in enumerate(
            zip(loc.split(sizes), scale.split(sizes), factor_t.split(sizes, -1), strict=True)
        ):
            deviation = mean if prior_locs is None else mean - prior_locs[j]
            squares += [torch.linalg.vector_norm(t).square() for t in (std, deviation, rows)]
        squares = torch.stack(squares).reshape(len(sizes), 3).sum(-1)
        # μ, σ and U are the caller's (σ is also kept by the draw's backward): nothing new
        ctx.save_for_backward(
            loc, scale, factor_t, flat, inverse_from_cholesky(tril), squares, prior_locs, coefs
        )
        ctx.sizes = sizes
        ctx.set_materialize_grads(False)
        return shared, (coefs * squares).sum() - log_det

    @staticmethod
    def backward(
        ctx: FunctionCtx, grad_shared: torch.Tensor | None, grad_g: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        """The closed-form gradients of the module's notes, each into one new buffer."""
        loc, scale, factor_t, flat, cov_inv, squares, prior_locs, coefs = ctx.saved_tensors
        rank, size = factor_t.shape
        grad_loc = grad_scale = grad_factor = grad_prior_locs = grad_coefs = None
        if grad_g is not None:
            # -2g C^{-1} U: the column sums of U * it give the log-determinant's part of σ's
            # gradient; scaled by 1/σ² it is that part of U's
            grad_factor = torch.mm(cov_inv * (-2 * grad_g), factor_t)
            dot = factor_t[0] * grad_factor[0]
            for k in range(1, rank):
                dot.addcmul_(factor_t[k], grad_factor[k])
            inv_var = scale.square().reciprocal_()
            grad_scale = dot.mul_(inv_var).add_(2 * grad_g).div_(scale).neg_()
            grad_factor.mul_(inv_var)
            twice = (2 * grad_g) * coefs
            grad_loc = torch.empty_like(loc)
            start = 0
            for j, n in enumerate(ctx.sizes):
                group = slice(start, start + n)
                grad_factor[:, group].addcmul_(factor_t[:, group], twice[j])
                grad_scale[group].addcmul_(scale[group], twice[j])
                torch.mul(loc[group], twice[j], out=grad_loc[group])
                if prior_locs is not None:
                    grad_loc[group].sub_(twice[j] * prior_locs[j])
                start += n
            if ctx.needs_input_grad[4]:
                sums = torch.stack([mean.sum() for mean in loc.split(ctx.sizes)])
                counts = loc.new_tensor(ctx.sizes)
                grad_prior_locs = -twice * (sums - counts * prior_locs)
            if ctx.needs_input_grad[5]:
                grad_coefs = grad_g * squares
        if grad_shared is not None:
            flat_grad = grad_shared.reshape(-1, size)
            draw_loc = flat_grad[0] if flat_grad.shape[0] == 1 else flat_grad.sum(0)
            grad_loc = draw_loc if grad_loc is None else grad_loc.add_(draw_loc)
            if grad_factor is None:
                grad_factor = torch.mm(flat.mT, flat_grad)
            elif flat.shape[0] == 1:
                grad_factor.addr_(flat[0], flat_grad[0])
            else:
                grad_factor.addmm_(flat.mT, flat_grad)
        return grad_loc, grad_scale, grad_factor, None, grad_prior_locs, grad_coefs, None


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


#: Devices where :func:`inverse_from_cholesky` takes ``torch.cholesky_inverse``.
_CHOLESKY_INVERSE_DEVICES = ("cpu",)


def cholesky(matrix: torch.Tensor) -> torch.Tensor:
    r"""The lower Cholesky factor of ``matrix`` (``(..., r, r)``), without an error check.

    ``torch.linalg.cholesky`` reads its error code back to the host after the
    factorisation: on CUDA a wait for the device, which a captured CUDA graph cannot hold.
    :math:`C = I + UD^{-1}U^\top` is positive definite unless its inputs are not finite, and
    then the loss is not finite either, which stops the fit.
    """
    return torch.linalg.cholesky_ex(matrix).L


def inverse_from_cholesky(tril: torch.Tensor) -> torch.Tensor:
    r""":math:`C^{-1} = L^{-\top} L^{-1}` from :math:`C`'s lower Cholesky factor :math:`L`.

    ``torch.cholesky_inverse`` on the CPU; on CUDA, where it reads its error code back to
    the host (see :func:`cholesky`), two triangular products, which do not.
    """
    if tril.device.type in _CHOLESKY_INVERSE_DEVICES:
        return torch.cholesky_inverse(tril)
    eye = torch.eye(tril.shape[-1], dtype=tril.dtype, device=tril.device)
    inverse_factor = torch.linalg.solve_triangular(tril, eye, upper=False)
    return inverse_factor.mT @ inverse_factor
