"""A mean-field guide's parameters packed into two buffers: the same tensors, names and values."""

from __future__ import annotations

import copy

import pyro
import pytest
import torch

from pyro_bbb import BNN, MeanFieldGuide, fit, likelihoods, load, mlp, save
from pyro_bbb.infer.guides._packed import PackedParameters

N = 30


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, 3, generator=g), torch.randn(N, generator=g)


def _guide(seed=0):
    torch.manual_seed(seed)
    model = BNN(mlp([3, 5, 1]), likelihoods.Gaussian(), num_data=N)
    guide = MeanFieldGuide(model, init_scale=0.1)
    guide(*_data())
    return model, guide


def _store():
    return dict(pyro.get_param_store().named_parameters())


def test_packing_keeps_every_tensor_its_name_and_value_and_puts_it_in_one_buffer():
    tensors = [torch.randn(2, 3).requires_grad_(), torch.randn(4).requires_grad_()]
    values = [t.detach().clone() for t in tensors]
    packed = PackedParameters(tensors)

    assert packed.buffer.shape == (10,)
    for tensor, value, (start, stop) in zip(tensors, values, [(0, 6), (6, 10)], strict=True):
        assert torch.equal(tensor, value) and tensor.requires_grad and tensor.is_leaf
        assert torch.equal(packed.buffer[start:stop], value.reshape(-1))
    with torch.no_grad():
        tensors[1].add_(1.0)  # an update of a tensor is an update of its stretch
    assert torch.equal(packed.buffer[6:], values[1] + 1.0)
    assert packed.holds(tensors)
    tensors[0].data = tensors[0].detach().clone()  # given other data: outside the buffer
    assert not packed.holds(tensors)


def test_packing_refuses_tensors_that_cannot_share_a_buffer():
    with pytest.raises(ValueError, match="one dtype and device"):
        PackedParameters([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])
    with pytest.raises(ValueError, match="at least one"):
        PackedParameters([])


def test_a_guides_packed_parameters_are_its_param_store_tensors_by_their_names():
    pyro.clear_param_store()
    _, guide = _guide()
    before = _store()
    values = {name: p.detach().clone() for name, p in before.items()}
    locs, rhos = guide._packed()

    after = _store()
    assert after.keys() == before.keys()
    for name, tensor in after.items():
        assert tensor is before[name]  # the same tensors: an optimiser's references hold
        assert torch.equal(tensor, values[name])
    assert [f"MeanFieldGuide.locs.{n}" for n in guide._event_dims] == [
        n for n, t in after.items() for packed in locs.tensors if t is packed
    ]
    assert locs.buffer.numel() == rhos.buffer.numel() == sum(v.numel() for v in locs.tensors)
    assert pyro.param("MeanFieldGuide.rhos.0.weight").data_ptr() == rhos.buffer.data_ptr()
    assert guide._packed() is not None and guide._packed()[0] is locs  # checked, not repacked


def test_a_packed_guide_round_trips_its_state_dict_and_a_saved_file(tmp_path):
    pyro.clear_param_store()
    model, guide = _guide()
    guide._packed()
    state = {k: v.clone() for k, v in guide.state_dict().items()}
    save(tmp_path / "m.pt", model, guide)

    pyro.clear_param_store()
    _, guide2 = _guide(seed=5)  # other initial values
    guide2._packed()
    guide2.load_state_dict(state)
    for key, value in guide2.state_dict().items():
        assert torch.equal(value, state[key])
    packed = guide2._packed()
    assert packed is guide2.__dict__["_packing"]  # copied in place: still packed

    pyro.clear_param_store()
    model3, guide3 = _guide(seed=7)
    load(tmp_path / "m.pt", model3, guide3)
    for key, value in guide3.state_dict().items():
        assert torch.equal(value, state[key])


def test_a_guide_given_other_data_is_packed_again_with_its_values():
    pyro.clear_param_store()
    _, guide = _guide()
    first = guide._packed()
    values = {k: v.clone() for k, v in guide.state_dict().items()}
    guide.double()  # every parameter gets new data
    second = guide._packed()
    assert second is not first and second[0].buffer.dtype == torch.float64
    for key, value in guide.state_dict().items():
        torch.testing.assert_close(value, values[key].double())
        assert value.untyped_storage().data_ptr() in {
            second[0].buffer.untyped_storage().data_ptr(),
            second[1].buffer.untyped_storage().data_ptr(),
        }


def test_a_deep_copy_of_a_packed_guide_is_its_own():
    pyro.clear_param_store()
    _, guide = _guide()
    locs, _ = guide._packed()
    twin = copy.deepcopy(guide)
    twin_locs, _ = twin._packed()
    with torch.no_grad():
        twin_locs.buffer.add_(1.0)
    assert not torch.equal(twin_locs.buffer, locs.buffer)
    # the twin's own tensors moved, the guide's did not (run, or read, the twin shares the
    # param store's tensors of its name, as every PyroModule does)
    twin_loc, loc = twin._params["0.weight"][0], guide._params["0.weight"][0]
    assert torch.equal(twin_loc.module_value(), loc.module_value() + 1.0)


def test_fit_trains_the_packed_parameters_and_continues_from_a_reloaded_store():
    pyro.clear_param_store()
    model, guide = _guide()
    x, y = _data()
    fit(model, guide, x, y, epochs=2, batch_size=10, lr=1e-2, num_particles=1, progress=False)
    locs, _ = guide._packed()
    assert pyro.param("MeanFieldGuide.locs.0.weight").data_ptr() == locs.buffer.data_ptr()
    trained = {k: v.detach().clone() for k, v in _store().items()}

    state = pyro.get_param_store().get_state()  # a reload gives the store other tensors
    pyro.get_param_store().set_state(copy.deepcopy(state))
    fit(model, guide, x, y, epochs=1, batch_size=10, lr=1e-2, num_particles=1, progress=False)
    moved = _store()
    assert moved.keys() == trained.keys()
    assert any(not torch.equal(moved[k], trained[k]) for k in trained)  # it trained on
    locs, _ = guide._packed()
    assert pyro.param("MeanFieldGuide.locs.0.weight").data_ptr() == locs.buffer.data_ptr()
