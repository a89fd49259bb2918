"""Tests of pyro_bbb._shapes: the tuple broadcast against torch's."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_bbb._shapes import broadcast_shape

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@settings(max_examples=50, deadline=None)
@given(st.lists(shapes, min_size=1, max_size=4))
def test_broadcast_shape_matches_torch(shape_list):
    try:
        expected = torch.broadcast_shapes(*shape_list)
    except RuntimeError:
        with pytest.raises(ValueError, match="do not broadcast"):
            broadcast_shape(*shape_list)
        return
    assert broadcast_shape(*shape_list) == expected
