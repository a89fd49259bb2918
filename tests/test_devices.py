"""Where models and data live: the device to train on and the CUDA devices to fork."""

import torch

import pyro_bbb as bbb
from pyro_bbb._devices import cuda_devices, device_of
from tests.support import requires_cuda


def test_the_device_is_read_from_the_first_module_that_has_one():
    model = bbb.BNN(bbb.mlp([2, 3, 1]), bbb.likelihoods.Gaussian(), num_data=4)
    assert device_of(None, "not a module", model) == torch.device("cpu")
    assert device_of() == torch.device("cpu")


def test_a_cpu_run_forks_no_cuda_device():
    net = bbb.mlp([2, 3, 1])
    assert cuda_devices(net, torch.zeros(3), "ignored") == []


@requires_cuda
def test_cuda_devices_of_tensors_and_modules_are_distinct_and_in_index_order():
    net = bbb.mlp([2, 3, 1]).cuda()
    found = cuda_devices(torch.zeros(2, device="cuda"), net, torch.zeros(1))
    assert found == [torch.device("cuda", torch.cuda.current_device())]
    assert device_of(net) == found[0]
