"""Tests of pyro_bbb.nn.affine: Linear and ConvNd/ConvTransposeNd maps over sampled weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pyro_bbb.nn.affine import Conv2dMap, ConvMap, LinearMap

from .networks import conv_loop, linear_loop

CONV_CASES = [
    {"stride": 1, "padding": 0, "groups": 1},
    {"stride": 2, "padding": 1, "groups": 1},
    {"stride": 1, "padding": 1, "groups": 2},
    {"stride": 2, "padding": 2, "groups": 4, "dilation": 2},
]


@pytest.mark.parametrize("keep_plate_dim", [True, False])
@pytest.mark.parametrize("x_has_samples", [False, True])
def test_linear_map_with_sampled_weights_matches_a_loop_of_f_linear(keep_plate_dim, x_has_samples):
    P, B, n_in, n_out = 4, 5, 3, 2
    weight = torch.randn(P, 1, n_out, n_in) if keep_plate_dim else torch.randn(P, n_out, n_in)
    bias = torch.randn(P, 1, n_out) if keep_plate_dim else torch.randn(P, n_out)
    x = torch.randn(P, B, n_in) if x_has_samples else torch.randn(B, n_in)
    out = LinearMap()(x, weight, bias)
    assert out.shape == (P, B, n_out)
    torch.testing.assert_close(out, linear_loop(x, weight, bias))


def test_linear_map_with_plain_weights_broadcasts_over_input_sample_dims():
    x = torch.randn(3, 5, 4)
    weight, bias = torch.randn(2, 4), torch.randn(2)
    out = LinearMap()(x, weight, bias)
    expected = torch.stack([F.linear(x[p], weight, bias) for p in range(3)])
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("options", CONV_CASES)
@pytest.mark.parametrize("keep_plate_dim", [True, False])
@pytest.mark.parametrize("x_has_samples", [False, True])
def test_conv2d_map_with_sampled_weights_matches_a_loop_of_f_conv2d(
    options, keep_plate_dim, x_has_samples
):
    P, B, c_in, c_out = 3, 2, 4, 8
    groups = options["groups"]
    weight_shape = (c_out, c_in // groups, 3, 3)
    weight = torch.randn(P, 1, *weight_shape) if keep_plate_dim else torch.randn(P, *weight_shape)
    bias = torch.randn(P, 1, c_out) if keep_plate_dim else torch.randn(P, c_out)
    x = torch.randn(P, B, c_in, 7, 6) if x_has_samples else torch.randn(B, c_in, 7, 6)
    affine = Conv2dMap(
        stride=(options["stride"],) * 2,
        padding=(options["padding"],) * 2,
        dilation=(options.get("dilation", 1),) * 2,
        groups=groups,
    )
    out = affine(x, weight, bias)
    expected = conv_loop(x, weight, bias, **options)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected)


def test_conv2d_map_with_plain_weights_broadcasts_over_input_sample_dims():
    x = torch.randn(3, 2, 4, 6, 6)
    weight, bias = torch.randn(6, 2, 3, 3), torch.randn(6)
    out = Conv2dMap(padding=(1, 1), groups=2)(x, weight, bias)
    expected = torch.stack([F.conv2d(x[p], weight, bias, padding=1, groups=2) for p in range(3)])
    torch.testing.assert_close(out, expected)


def test_conv2d_map_with_same_padding_and_sampled_weights_matches_a_loop():
    x = torch.randn(2, 3, 7, 7)
    weight, bias = torch.randn(4, 1, 5, 3, 3, 3), torch.randn(4, 1, 5)
    out = Conv2dMap(padding="same")(x, weight, bias)
    torch.testing.assert_close(out, conv_loop(x, weight, bias, padding="same"))
    assert out.shape == (4, 2, 5, 7, 7)


def test_conv2d_map_rejects_inputs_without_channel_and_spatial_dims():
    with pytest.raises(ValueError, match=r"x must be \(\*sample, batch, channels, height, width\)"):
        Conv2dMap()(torch.randn(3, 8, 8), torch.randn(2, 3, 3, 3), None)


ND_CASES = [
    pytest.param(1, False, {"stride": 2, "padding": 1, "dilation": 2, "groups": 2}, id="conv1d"),
    pytest.param(3, False, {"stride": 1, "padding": 1, "dilation": 1, "groups": 1}, id="conv3d"),
    pytest.param(
        1, True, {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2, "dilation": 1},
        id="conv_transpose1d",
    ),
    pytest.param(
        2, True, {"stride": 2, "padding": 0, "output_padding": 0, "groups": 1, "dilation": 2},
        id="conv_transpose2d",
    ),
    pytest.param(
        3, True, {"stride": 1, "padding": 1, "output_padding": 0, "groups": 1, "dilation": 1},
        id="conv_transpose3d",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("dims", "transposed", "options"), ND_CASES)
@pytest.mark.parametrize("x_has_samples", [False, True])
def test_conv_map_of_any_dimension_and_its_transpose_matches_a_loop_of_torch_calls(
    dims, transposed, options, x_has_samples
):
    P, B, c_in, c_out, groups = 3, 2, 4, 6, options["groups"]
    if transposed:
        weight_shape = (c_in, c_out // groups, *(3,) * dims)
        fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[dims]
    else:
        weight_shape = (c_out, c_in // groups, *(3,) * dims)
        fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[dims]
    weight, bias = torch.randn(P, 1, *weight_shape), torch.randn(P, 1, c_out)
    spatial = (5,) * dims
    x = torch.randn(P, B, c_in, *spatial) if x_has_samples else torch.randn(B, c_in, *spatial)
    affine = ConvMap(
        dims=dims, transposed=transposed,
        stride=(options["stride"],) * dims, padding=(options["padding"],) * dims,
        dilation=(options["dilation"],) * dims, groups=groups,
        output_padding=(options["output_padding"],) * dims if transposed else (),
    )  # fmt: skip
    out = affine(x, weight, bias)
    expected = torch.stack(
        [fn(x[p] if x_has_samples else x, weight[p, 0], bias[p, 0], **options) for p in range(P)]
    )
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected)
    # and one unsampled weight broadcasts over the input's sample dims
    plain = affine(x, weight[0, 0], bias[0, 0])
    first = fn(x[0] if x_has_samples else x, weight[0, 0], bias[0, 0], **options)
    torch.testing.assert_close(plain[0] if x_has_samples else plain, first)


def test_a_plain_weight_on_a_plain_batch_reaches_the_convolution_as_it_is():
    # as nn.Conv2d: no reshape of the weight or of the activations (each would be one more
    # autograd node forward and backward, on every convolution of a network)
    conv = Conv2dMap(padding=1)
    x = torch.randn(4, 3, 6, 6, requires_grad=True)
    weight = torch.randn(5, 3, 3, 3, requires_grad=True)
    out = conv(x, weight, None)
    torch.testing.assert_close(out, F.conv2d(x, weight, padding=1))
    assert type(out.grad_fn).__name__ == "ConvolutionBackward0"
    assert all(type(f).__name__ == "AccumulateGrad" for f, _ in out.grad_fn.next_functions if f)
