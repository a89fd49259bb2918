"""Every private name of Pyro and torch the package uses still means what it did.

Each test exercises one function of :mod:`pyro_bbb._pyro_compat` against the public
behaviour it stands for, so that a release of Pyro or torch that renames or changes one fails
here, under its name.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroParam, PyroSample
from torch import nn

from pyro_bbb import _pyro_compat as compat


class Layer(PyroModule):
    def __init__(self):
        super().__init__()
        self.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))
        self.scale = PyroParam(torch.ones(2))


class Net(PyroModule):
    def __init__(self):
        super().__init__()
        self.fc = Layer()

    def forward(self):
        return self.fc.weight


def test_site_names_follow_pyros_own_naming_of_a_pyro_sample():
    net = Net()
    trace = pyro.poutine.trace(net).get_trace()
    assert compat.site_name(net.fc, "weight") == "fc.weight" and "fc.weight" in trace.nodes
    named = PyroModule(name="b")
    named.net = Net()
    assert compat.pyro_name(named.net.fc) == "b.net.fc"
    assert compat.join_name("", "w") == "w" and compat.join_name("a", "w") == "a.w"
    compat.set_pyro_name(named, "c")
    assert compat.pyro_name(named) == "c" and compat.pyro_name(nn.Linear(1, 1)) == ""


def test_a_runs_cached_values_are_what_its_pyro_samples_return():
    net = Net()
    value = torch.full((2, 3), 7.0)
    with compat.run_context(net):
        assert compat.cached_value(net.fc, "fc.weight") is None
        compat.set_cached_value(net.fc, "fc.weight", value)
        assert compat.cached_value(net.fc, "fc.weight") is value
        assert net() is value  # read, no sample statement
    assert compat.cached_value(net.fc, "fc.weight") is None  # forgotten after the run
    assert set(compat.sample_attributes(net.fc)) == {"weight"}
    assert compat.sample_attributes(nn.Linear(1, 1)) == {}


def test_rooting_and_sharing_a_name_rename_a_networks_sites():
    owner = PyroModule(name="model")
    net = Net()
    compat.root_network(net, "m", owner)
    with compat.run_context(owner):
        trace = pyro.poutine.trace(net).get_trace()
    assert "m.fc.weight" in trace.nodes

    class Wrapper(compat.PyroNameSharing, PyroModule):
        def __init__(self):
            super().__init__()
            self.module = Net()

    outer = PyroModule()
    outer.wrapper = Wrapper()
    assert compat.pyro_name(outer.wrapper._modules["module"].fc) == "wrapper.fc"
    assert compat.user_class(outer.wrapper) is Wrapper
    assert compat.user_class(PyroModule[nn.Linear](1, 1)) is nn.Linear


def test_a_pyro_params_store_value_and_its_unconstrained_tensor_agree():
    pyro.clear_param_store()
    layer = Layer()
    through_getattr = PyroModule()
    through_getattr.layer = layer
    with compat.run_context(through_getattr):
        expected = through_getattr.layer.scale  # registers it in the param store
        fast = compat.param_store_value(layer, "scale")
    assert fast is not None and torch.equal(fast, expected)
    assert compat.unconstrained_parameter(layer, "scale").shape == (2,)
    assert compat.module_local_params() is False
    pyro.clear_param_store()
    assert compat.param_store_value(layer, "scale") is None  # out of sync: take getattr


def test_autonormal_draws_its_latent_under_the_name_given():
    pyro.clear_param_store()

    def model():
        pyro.sample("w", dist.Normal(0.0, 1.0))

    trace = pyro.poutine.trace(AutoNormal(model)).get_trace()
    assert compat.autonormal_latent("w") in trace.nodes


def test_convolutions_and_low_rank_parts_are_found():
    assert compat.conv_kinds(nn.Conv2d(1, 1, 1)) == (True, False)
    assert compat.conv_kinds(nn.ConvTranspose1d(1, 1, 1)) == (True, True)
    assert compat.conv_kinds(nn.Linear(1, 1)) == (False, False)
    factor, diag = torch.randn(4, 2), torch.rand(4) + 0.5
    fn = dist.LowRankMultivariateNormal(torch.zeros(4), factor, diag).expand([3])
    got_factor, got_diag = compat.low_rank_parts(fn)
    assert torch.equal(got_factor, factor) and torch.equal(got_diag, diag)  # not broadcast
    tril = compat.low_rank_capacitance_tril(fn)
    capacitance = torch.eye(2) + factor.mT @ (factor / diag.unsqueeze(-1))
    torch.testing.assert_close(tril @ tril.mT, capacitance)


def test_a_tensors_version_counts_its_in_place_changes():
    tensor = torch.zeros(3)
    before = compat.tensor_version(tensor)
    tensor.copy_(torch.ones(3))
    tensor.add_(1)
    assert compat.tensor_version(tensor) == before + 2
    assert compat.tensor_version(tensor + 1) == 0  # a new tensor starts at 0


def test_a_flat_tensor_is_cut_into_views_and_tensors_put_end_to_end():
    like = [torch.zeros(2, 3), torch.zeros(4), torch.zeros(1, 1)]
    flat = torch.arange(11.0)
    views = compat.stretches_of(flat, like)
    assert [v.shape for v in views] == [t.shape for t in like]
    assert all(v.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for v in views)
    assert torch.equal(views[1], torch.arange(6.0, 10.0))
    joined = compat.concatenated(views)
    assert torch.equal(joined, flat) and joined.data_ptr() != flat.data_ptr()
    one = compat.concatenated([views[0]])  # a new tensor even for one
    assert torch.equal(one, flat[:6]) and one.data_ptr() != flat.data_ptr()


def test_the_fused_adam_kernel_steps_as_torchs_fused_adam():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    q = p.detach().clone()
    optim = torch.optim.Adam([p], lr=0.1, fused=True)
    avg, avg_sq, count = torch.zeros(3), torch.zeros(3), torch.zeros(())
    for step in range(3):
        grad = torch.tensor([0.5, -1.0, 2.0]) * (step + 1)
        p.grad = grad.clone()
        optim.step()
        count.add_(1)  # the caller counts, as Adam does before its kernel
        compat.fused_adam_step(
            [q], [grad], [avg], [avg_sq], [count],
            lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
        )  # fmt: skip
    assert torch.equal(p.detach(), q)
    assert torch.equal(optim.state[p]["exp_avg_sq"], avg_sq)
