"""Where models and data live: the device to train on and the CUDA devices to fork."""

import pytest
import torch

import pyro_bbb as bbb
from pyro_bbb._devices import checked_device, cuda_devices, device_of
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


def test_fit_refuses_a_device_this_process_cannot_use_naming_the_argument(monkeypatch):
    model = bbb.BNN(bbb.mlp([2, 3, 1]), bbb.likelihoods.Gaussian(), num_data=4)
    guide = bbb.MeanFieldGuide(model)
    x, y = torch.randn(4, 2), torch.randn(4)
    with pytest.raises(
        ValueError, match="device must be a device such as 'cpu' or 'cuda', got 'gpu'"
    ):
        bbb.fit(model, guide, x, y, epochs=1, progress=False, device="gpu")
    # where torch has no CUDA (a CPU build, or no GPU visible): said at once, not torch's
    # "Torch not compiled with CUDA enabled" from inside the first .to(device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device='cuda' but .*; pass device='cpu'"):
        bbb.fit(model, guide, x, y, epochs=1, progress=False, device="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(
        ValueError, match=r"device='cuda:2' but torch sees 2 CUDA device\(s\), cuda:0 to cuda:1"
    ):
        checked_device("device", "cuda:2")
    assert checked_device("device", "cuda:1") == torch.device("cuda", 1)
    assert checked_device("device", torch.device("cpu")) == torch.device("cpu")
