"""Tests of pyro_bbb.nn.affine: Linear and Conv2d maps over weights with sample dims."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pyro_bbb.nn.affine import Conv2dMap, LinearMap

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
