"""Tests of pyro_bbb.training.optimizers: the optimiser fit builds over its parameters."""

from __future__ import annotations

import copy

import pytest
import torch

from pyro_bbb import _pyro_compat as compat
from pyro_bbb.infer.guides._packed import PackedParameters
from pyro_bbb.training.optimizers import (
    PackedAdam,
    make_optimizer,
    reset_moments,
    why_not_capturable,
)


def _param(dtype=torch.float32) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.ones(3, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_default_is_adam_fused_over_floating_point_parameters_on_one_device(dtype):
    optim = make_optimizer(None, [_param(dtype), _param(dtype)], 0.1)
    assert type(optim) is torch.optim.Adam
    assert optim.defaults["fused"] is True
    assert optim.param_groups[0]["lr"] == 0.1


def test_the_default_adam_is_not_fused_where_a_parameter_is_complex():
    optim = make_optimizer(None, [_param(), _param(torch.complex64)], 0.1)
    assert type(optim) is torch.optim.Adam
    assert optim.defaults["fused"] is None  # torch's own choice: the per-tensor loop


def test_the_fused_default_takes_the_per_tensor_adams_steps():
    fused, plain = _param(), _param()
    fused_optim = make_optimizer(None, [fused], 0.1)
    plain_optim = torch.optim.Adam([plain], lr=0.1, foreach=False)
    for step in range(5):
        for p, optim in ((fused, fused_optim), (plain, plain_optim)):
            optim.zero_grad()
            (p * torch.arange(3.0) ** 2).sum().mul(step + 1).backward()
            optim.step()
    torch.testing.assert_close(fused, plain)


def test_a_class_is_built_with_lr_and_a_function_is_called_with_the_parameters():
    params = [_param()]
    sgd = make_optimizer(torch.optim.SGD, params, 0.3)
    assert type(sgd) is torch.optim.SGD and sgd.param_groups[0]["lr"] == 0.3
    rms = make_optimizer(lambda ps: torch.optim.RMSprop(ps, lr=1e-3), params, 0.3)
    assert type(rms) is torch.optim.RMSprop and rms.param_groups[0]["lr"] == 1e-3
    assert rms.param_groups[0]["params"] == params


def test_anything_else_is_refused_saying_what_was_given():
    with pytest.raises(TypeError, match=r"must return a torch.optim.Optimizer, got list"):
        make_optimizer(lambda ps: list(ps), [_param()], 0.1)
    with pytest.raises(TypeError, match=r"optimizer must be .* got 'adam'"):
        make_optimizer("adam", [_param()], 0.1)


def test_only_the_fused_adams_can_be_captured_and_the_others_say_why():
    params = [torch.zeros(3, requires_grad=True)]
    assert why_not_capturable(make_optimizer(None, params, 0.1)) is None
    assert why_not_capturable(torch.optim.AdamW(params, fused=True)) is None
    for optim, named in [
        (torch.optim.Adam(params), "Adam (fused=None)"),
        (torch.optim.SGD(params, lr=0.1), "SGD (fused=None)"),
    ]:
        reason = why_not_capturable(optim)
        assert reason.startswith(f"the optimiser is {named}") and "fused=True" in reason


def _packed_params(seed=0):
    """Five parameters: four packed in two buffers (as a guide's locs and rhos), one alone."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 2), (4,)]
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes * 2]
    params.append(torch.nn.Parameter(torch.randn(2, generator=g)))
    PackedParameters(params[:2]), PackedParameters(params[2:4])
    return params


def _gradients(params, step, packed=True):
    """Gradients as the fused step gives them: each buffer's in one buffer alike."""
    g = torch.Generator().manual_seed(100 + step)
    values = [torch.randn(p.shape, generator=g) for p in params]
    if packed:  # views of one gradient buffer per kind, as PackedMeanFieldBlock returns them
        for pair in (slice(0, 2), slice(2, 4)):
            flat = torch.cat([v.reshape(-1) for v in values[pair]])
            values[pair] = compat.stretches_of(flat, values[pair])
    for p, v in zip(params, values, strict=True):
        p.grad = v


def _steps(optim, params, steps, first=0, packed=True):
    for step in range(first, first + steps):
        _gradients(params, step, packed)
        optim.step()


def test_packed_parameters_get_a_packed_adam_that_steps_as_torchs_fused_adam():
    params, plain = (
        _packed_params(),
        [p.detach().clone().requires_grad_() for p in _packed_params()],
    )
    packed_optim = make_optimizer(None, params, 0.05)
    assert type(packed_optim) is PackedAdam
    assert why_not_capturable(packed_optim) is None  # one fused kernel, rates in place
    plain_optim = torch.optim.Adam(plain, lr=0.05, fused=True)
    _steps(packed_optim, params, 4)
    _steps(plain_optim, plain, 4, packed=False)
    for p, q in zip(params, plain, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    for p, q in zip(params, plain, strict=True):  # each parameter's state, as torch keeps it
        mine, torchs = packed_optim.state[p], plain_optim.state[q]
        assert mine.keys() == torchs.keys() and float(mine["step"]) == 4.0
        torch.testing.assert_close(mine["exp_avg_sq"], torchs["exp_avg_sq"])
    # the four packed ones share two moment buffers
    avgs = {packed_optim.state[p]["exp_avg"].untyped_storage().data_ptr() for p in params[:4]}
    assert len(avgs) == 2


def test_a_packed_adam_resumed_from_its_state_dict_continues_bit_for_bit():
    params = _packed_params()
    optim = make_optimizer(None, params, 0.05)
    _steps(optim, params, 3)
    saved = copy.deepcopy(optim.state_dict())
    values = [p.detach().clone() for p in params]
    _steps(optim, params, 3, first=3)

    resumed_params = _packed_params(seed=9)
    with torch.no_grad():
        for p, v in zip(resumed_params, values, strict=True):
            p.copy_(v)
    resumed = make_optimizer(None, resumed_params, 0.05)
    resumed.load_state_dict(saved)
    _steps(resumed, resumed_params, 3, first=3)
    for p, q in zip(params, resumed_params, strict=True):
        assert torch.equal(p, q)
    reset_moments(resumed)
    assert all(not s["exp_avg"].any() and float(s["step"]) == 0 for s in resumed.state.values())


def test_a_packed_adam_steps_gradients_that_do_not_tile_one_tensor_at_a_time():
    params = _packed_params()
    plain = [p.detach().clone().requires_grad_() for p in params]
    optim, plain_optim = make_optimizer(None, params, 0.05), torch.optim.Adam(plain, lr=0.05)
    for step in range(4):  # every other step the gradients are separate tensors
        _gradients(params, step, packed=step % 2 == 0)
        _gradients(plain, step, packed=False)
        optim.step(), plain_optim.step()
    for p, q in zip(params, plain, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_a_packed_adam_refuses_an_option_its_kernel_call_does_not_take():
    params = _packed_params()
    optim = make_optimizer(None, params, 0.05)
    optim.param_groups[0]["amsgrad"] = True
    _gradients(params, 0)
    with pytest.raises(ValueError, match="amsgrad=False, got True in parameter group 0"):
        optim.step()
