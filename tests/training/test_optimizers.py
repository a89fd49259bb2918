"""Tests of pyro_bbb.training.optimizers: the optimiser fit builds over its parameters."""

from __future__ import annotations

import pytest
import torch

from pyro_bbb.training.optimizers import make_optimizer, why_not_capturable


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
