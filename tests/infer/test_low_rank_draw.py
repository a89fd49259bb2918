"""LowRankDraw: a low-rank block's draw and closed-form KL in two compiled passes.

The column functions are checked in float64 against the dense formulas and autograd (values
and every gradient), run as plain torch; the compiled kernels against those functions in
float32; the fused ELBO that takes them against the traced ELBO; and the fallbacks (compiling
off, a failed compile, a device other than the CPU) for their result and their one message.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.distributions import MultivariateNormal, kl_divergence

from pyro_bbb import LowRankGuide
from pyro_bbb.infer import AnnealedELBO, _compiled, _low_rank_draw
from pyro_bbb.infer._low_rank_draw import LowRankDraw, backward_columns, forward_columns
from pyro_bbb.infer.fused import fused_elbo

from .test_fused import _compare, _problem

F64 = torch.float64
MIN_SCALE = 1e-3


def _inputs(d=9, rank=3, dtype=F64, groups=((9, 0.3, 1.5),), seed=0):
    g = torch.Generator().manual_seed(seed)
    kw = {"dtype": dtype, "generator": g}
    loc = torch.randn(d, **kw).requires_grad_()
    rho = (torch.randn(d, **kw) - 1.0).requires_grad_()
    factor_t = torch.randn(rank, d, **kw).requires_grad_()
    noise = torch.randn(d, **kw), torch.randn(rank, **kw)
    constants = _low_rank_draw.prior_constants([(n, (m, s)) for n, m, s in groups], loc)
    return (loc, rho, factor_t), noise, constants


def _dense(params, noise, groups):
    """θ and G from their definitions: softplus, the dense covariance, torch's Gaussian KL."""
    loc, rho, factor_t = params
    eps_diag, eps_factor = noise
    scale = torch.nn.functional.softplus(rho) + MIN_SCALE
    theta = loc + factor_t.mT @ eps_factor + scale * eps_diag
    q = MultivariateNormal(loc, torch.diag(scale.square()) + factor_t.mT @ factor_t)
    p_loc = torch.cat([torch.full((n,), m, dtype=loc.dtype) for n, m, _ in groups])
    p_scale = torch.cat([torch.full((n,), s, dtype=loc.dtype) for n, _, s in groups])
    kl = kl_divergence(q, MultivariateNormal(p_loc, torch.diag(p_scale.square())))
    constants = sum(n * 2 * torch.log(torch.tensor(s, dtype=loc.dtype)) for n, _, s in groups)
    return theta, 2 * kl + loc.numel() - constants  # G: twice the KL, less its constants


@pytest.fixture
def plain(monkeypatch):
    """The column functions run as written, in eager torch."""
    monkeypatch.setenv(_compiled.ENVIRONMENT_VARIABLE, "0")


GROUPS = {"one prior": ((9, 0.3, 1.5),), "a prior per site": ((6, 0.0, 0.5), (3, -0.2, 2.0))}


@pytest.mark.parametrize("groups", list(GROUPS))
@pytest.mark.parametrize("rho_shift", [0.0, 21.0])  # softplus's linear branch above 20
def test_values_and_every_gradient_match_the_dense_formulas(plain, groups, rho_shift):
    params, noise, constants = _inputs(groups=GROUPS[groups])
    with torch.no_grad():
        params[1].add_(rho_shift)
    theta, twice_kl = LowRankDraw.apply(*params, *noise, *constants, MIN_SCALE)
    expected_theta, expected_twice_kl = _dense(params, noise, GROUPS[groups])
    torch.testing.assert_close(theta, expected_theta)
    torch.testing.assert_close(twice_kl, expected_twice_kl)

    weights = torch.randn(theta.shape, dtype=F64, generator=torch.Generator().manual_seed(3))
    grads = torch.autograd.grad((weights * theta).sum() - 0.7 * twice_kl, params)
    expected = torch.autograd.grad(
        (weights * expected_theta).sum() - 0.7 * expected_twice_kl, params
    )
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("used", ["draw", "kl"])
def test_an_unused_output_gives_the_gradient_of_the_other_alone(plain, used):
    params, noise, constants = _inputs()
    theta, twice_kl = LowRankDraw.apply(*params, *noise, *constants, MIN_SCALE)
    expected_theta, expected_twice_kl = _dense(params, noise, GROUPS["one prior"])
    out, want = (theta.sum(), expected_theta.sum())
    if used == "kl":
        out, want = twice_kl, expected_twice_kl
    for got, expected in zip(
        torch.autograd.grad(out, params), torch.autograd.grad(want, params), strict=True
    ):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("groups", list(GROUPS))
def test_the_compiled_kernels_give_the_plain_functions_results(groups):
    params, noise, constants = _inputs(d=700, rank=4, dtype=torch.float32, groups=_scaled(groups))
    args = (*(p.detach() for p in params), *noise, *constants, MIN_SCALE)
    compiled = _low_rank_draw._FORWARD(*args)
    assert _low_rank_draw._FORWARD.failure is None
    for got, want in zip(compiled, forward_columns(*args), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    _, _, scale, slope = compiled
    g = torch.Generator().manual_seed(4)
    a = torch.randn(4, 4, generator=g)
    backward_args = (
        args[0], scale, slope, args[2], *noise, *constants,
        a @ a.mT, torch.randn(700, generator=g), torch.tensor(1.4),
    )  # fmt: skip
    compiled = _low_rank_draw._BACKWARD(*backward_args)
    assert _low_rank_draw._BACKWARD.failure is None
    for got, want in zip(compiled, backward_columns(*backward_args), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _scaled(groups):
    """The groups of ``GROUPS[groups]`` over 700 coordinates, in the same proportions."""
    spec = GROUPS[groups]
    if len(spec) == 1:
        return ((700, *spec[0][1:]),)
    return ((467, *spec[0][1:]), (233, *spec[1][1:]))


@pytest.mark.parametrize("prior", ["gaussian", "fan_in"])  # one prior a block, one a site
def test_the_fused_elbo_with_the_compiled_draw_equals_the_traced_elbo(monkeypatch, prior):
    monkeypatch.setattr(_low_rank_draw, "MIN_NUMBERS", 0)  # every block takes the kernels
    model, x, y = _problem(prior, "categorical")
    guide = LowRankGuide(model, rank=2, init_scale=0.1)
    taken = []
    monkeypatch.setattr(LowRankDraw, "apply", _recording(LowRankDraw.apply, taken), raising=True)
    _compare(model, guide, x, y, None)
    sizes = {sum(shape.numel() for shape in sites.values()) for sites in guide.block_sites.values()}
    assert sizes <= {shape[0] for shape in taken}  # every block went through it


def _recording(apply, calls):
    def wrapped(*args):
        calls.append(args[0].shape)
        return apply(*args)

    return staticmethod(wrapped)


EAGER_CASES = {  # what the kernels do not cover: (particles, estimator, MAX_RANK, MIN_NUMBERS)
    "several draws": (3, None, 8, 0),
    "an estimator that reads the draw's parts": (1, "local", 8, 0),
    "a rank above the largest taken": (1, None, 1, 0),
    "a block too small to pay": (1, None, 8, 10**9),
}


@pytest.mark.parametrize("case", list(EAGER_CASES))
def test_what_the_kernels_do_not_cover_keeps_the_eager_path(monkeypatch, case):
    particles, reparam, max_rank, min_numbers = EAGER_CASES[case]
    monkeypatch.setattr(_low_rank_draw, "MAX_RANK", max_rank)
    monkeypatch.setattr(_low_rank_draw, "MIN_NUMBERS", min_numbers)
    model, x, y = _problem("gaussian", "categorical")
    taken = []
    monkeypatch.setattr(LowRankDraw, "apply", _recording(LowRankDraw.apply, taken))
    _compare(model, LowRankGuide(model, rank=2, init_scale=0.1), x, y, reparam,
             num_particles=particles)  # fmt: skip
    assert not taken


def test_a_failed_compile_runs_the_plain_functions_and_says_so_once(monkeypatch):
    kernel = _compiled.CompiledKernel(forward_columns, "a test kernel")

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(torch, "compile", no_compiler)
    monkeypatch.setattr(_compiled, "_warned", set())
    params, noise, constants = _inputs()
    args = (*(p.detach() for p in params), *noise, *constants, MIN_SCALE)
    with pytest.warns(UserWarning, match="could not build.*no C\\+\\+ compiler.*eager path"):
        got = kernel(*args)
    assert kernel.failure is not None
    assert not kernel.runs_compiled(args[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        again = kernel(*args)
    for a, b, c in zip(got, again, forward_columns(*args), strict=True):
        torch.testing.assert_close(a, c)
        torch.testing.assert_close(b, c)


def test_off_the_cpu_the_kernels_are_not_taken_and_that_is_said_once(monkeypatch):
    monkeypatch.setattr(_compiled, "_warned", set())
    on_meta = torch.empty(2**20, device="meta")
    with pytest.warns(UserWarning, match="CPU only.*never run on meta.*eager path"):
        assert not _low_rank_draw.compiled_draw_applies(on_meta, on_meta.view(4, -1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not _low_rank_draw.compiled_draw_applies(on_meta, on_meta.view(4, -1))


def test_compiling_can_be_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(_compiled.ENVIRONMENT_VARIABLE, "0")
    loc = torch.zeros(2**16)
    assert not _low_rank_draw.compiled_draw_applies(loc, loc.expand(4, -1))
    monkeypatch.setenv(_compiled.ENVIRONMENT_VARIABLE, "1")
    assert _low_rank_draw.compiled_draw_applies(loc, loc.expand(4, -1)) == (
        _low_rank_draw._FORWARD.failure is None
    )


def test_the_kernels_are_built_at_set_up_without_drawing_a_random_number(monkeypatch):
    monkeypatch.setattr(_low_rank_draw, "MIN_NUMBERS", 0)
    monkeypatch.setattr(_low_rank_draw, "_prepared", set())
    model, x, y = _problem("gaussian", "categorical")
    guide = LowRankGuide(model, rank=2, init_scale=0.1)
    elbo = AnnealedELBO(1.0)
    elbo.terms(model, guide, x, y)
    state = torch.get_rng_state()
    assert fused_elbo(model, guide, elbo, None) is not None
    assert torch.equal(torch.get_rng_state(), state)  # the draws stay the traced guide's
    assert _low_rank_draw._prepared == {(torch.float32, 2, guide.min_scale)}


def test_the_kernels_are_built_under_no_grad_too(monkeypatch):
    monkeypatch.setattr(_low_rank_draw, "_prepared", set())
    with torch.no_grad():
        _low_rank_draw.prepare_kernels(torch.zeros(()), 3, MIN_SCALE)
    assert _low_rank_draw._prepared == {(torch.float32, 3, MIN_SCALE)}
