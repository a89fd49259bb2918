"""Tests of pyro_bbb.training.minibatches: the data order, its shards, and loaders."""

from __future__ import annotations

import warnings

import pyro
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import pyro_bbb as bbb
from pyro_bbb import TargetScaleWarning
from pyro_bbb.training.minibatches import epoch_order, make_batches

CPU = torch.device("cpu")


@pytest.mark.parametrize("num_data", [1, 5, 7, 64])
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("shuffle", [True, False])
def test_each_process_visits_the_indices_distributed_sampler_gives_it(
    num_data, world_size, shuffle
):
    for epoch in (0, 3):
        for rank in range(world_size):
            sampler = DistributedSampler(
                range(num_data), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=11
            )
            sampler.set_epoch(epoch)
            order = epoch_order(
                num_data, epoch, seed=11, shuffle=shuffle, rank=rank, world_size=world_size
            )
            assert order.tolist() == list(sampler)


def test_the_order_depends_on_the_seed_and_epoch_only():
    first = epoch_order(100, 2, seed=5)
    torch.rand(10)  # drawing elsewhere does not move it
    assert torch.equal(epoch_order(100, 2, seed=5), first)
    assert not torch.equal(epoch_order(100, 3, seed=5), first)
    assert sorted(first.tolist()) == list(range(100))


def _model(num_data):
    return bbb.BNN(bbb.mlp([2, 4, 1]), bbb.likelihoods.Gaussian(), num_data=num_data)


@pytest.mark.parametrize("num_data", [64, 61])
def test_minibatches_of_all_processes_together_are_one_process_batch_of_their_total(num_data):
    x = torch.arange(num_data, dtype=torch.float32).unsqueeze(-1).repeat(1, 2)
    y = torch.zeros(num_data)
    model = _model(num_data)
    one = make_batches(model, x, y, 16, True, CPU, seed=3)
    two = [make_batches(model, x, y, 8, True, CPU, seed=3, rank=r, world_size=2) for r in (0, 1)]
    assert len(two[0]) == len(two[1]) == len(one)  # every process takes the same steps
    for epoch in (0, 1):
        steps = zip(one(epoch), two[0](epoch), two[1](epoch), strict=True)
        for (xb, _), (x0, _), (x1, _) in steps:
            together = torch.cat([x0, x1])[:, 0].sort().values
            if num_data % 16 == 0:
                assert torch.equal(together, xb[:, 0].sort().values)
            else:  # the padded last step repeats points, as DistributedSampler does
                assert set(together.tolist()) >= set(xb[:, 0].tolist())


def test_a_multi_process_loader_without_a_distributed_sampler_warns():
    data = TensorDataset(torch.randn(8, 2), torch.randn(8))
    with pytest.warns(UserWarning, match=r"every process iterates the whole data set"):
        make_batches(_model(8), DataLoader(data, batch_size=4), None, None, True, CPU, world_size=2)


def test_a_distributed_sampler_is_told_the_epoch_so_it_reshuffles():
    data = TensorDataset(torch.arange(16.0).unsqueeze(-1).repeat(1, 2), torch.zeros(16))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    batches = make_batches(_model(16), loader, None, None, True, CPU, rank=1, world_size=2)
    seen = [next(iter(batches(epoch)))[0][:, 0].tolist() for epoch in (0, 1)]
    assert sampler.epoch == 1
    assert seen[0] != seen[1]
    assert seen[1] == epoch_order(16, 1, seed=0, rank=1, world_size=2).float().tolist()


def test_the_likelihood_scale_check_leaves_batchnorm_statistics_and_random_state_alone():
    # The check traces the model once from the prior: a BatchNorm in training mode would
    # otherwise take that pass's batch statistics into its running ones before the first step.
    from pyro_bbb.training.minibatches import check_likelihood_scale

    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    model = bbb.BNN(bbb.bayesianize(net), bbb.likelihoods.Gaussian(), num_data=100)
    x, y = torch.randn(10, 3) + 5.0, torch.randn(10)
    norm = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d))
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    state = torch.get_rng_state()
    check_likelihood_scale(model, (x, y), num_data=100)
    assert torch.equal(torch.get_rng_state(), state)
    for key, value in norm.state_dict().items():
        assert torch.equal(value, before[key]), key


def _regression(y: torch.Tensor):
    pyro.clear_param_store()
    x = torch.linspace(-3, 3, len(y)).unsqueeze(-1)
    model = bbb.BNN(bbb.mlp([1, 8, y.shape[1] if y.dim() > 1 else 1]), bbb.likelihoods.Gaussian(),
                    num_data=len(y))  # fmt: skip
    return model, bbb.MeanFieldGuide(model), x


@pytest.mark.parametrize(
    ("scale", "shift", "warned"),
    [(1.0, 0.0, False), (5.0, 3.0, False), (0.2, 0.0, False), (100.0, 0.0, True),
     (0.01, 0.0, True), (1.0, 100.0, True)],
)  # fmt: skip
def test_targets_far_from_unit_scale_are_warned_of_before_training(scale, shift, warned):
    # measured at fit's defaults (1-32-32-1, 300 points): at scale 0.01 and 1e5, or shifted
    # by 100, the posterior stayed at the prior; at 100 the error was three times scale 1's
    y = shift + scale * torch.sin(torch.linspace(-3, 3, 40))
    model, guide, x = _regression(y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bbb.fit(model, guide, x, y, epochs=1, progress=False)
    found = [w for w in caught if issubclass(w.category, TargetScaleWarning)]
    assert len(found) == int(warned)
    if warned:
        message = str(found[0].message)
        assert f"standard deviation {float(y.std()):.3g}" in message
        assert "Standardizer" in message and "unstandardize" in message
        assert found[0].filename == __file__  # it points at the call of fit


def test_the_target_scale_is_read_per_column_from_a_loaders_first_batch_and_never_of_labels():
    y = torch.stack([torch.randn(40), 50 * torch.randn(40)], -1)
    model, guide, x = _regression(y)
    loader = DataLoader(TensorDataset(x, y), batch_size=10)
    with pytest.warns(TargetScaleWarning, match=r"y \(column 1\) has mean") as caught:
        bbb.fit(model, guide, loader, epochs=2, progress=False)
    assert len([w for w in caught if issubclass(w.category, TargetScaleWarning)]) == 1
    pyro.clear_param_store()
    labels = torch.randint(0, 3, (40,))
    classifier = bbb.BNN(bbb.mlp([1, 8, 3]), bbb.likelihoods.Categorical(), num_data=40)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TargetScaleWarning)
        bbb.fit(classifier, bbb.MeanFieldGuide(classifier), x, labels, epochs=1, progress=False)


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ([{"x": torch.zeros(2), "y": torch.zeros(())}] * 8, r"yields dicts \(keys \['x', 'y'\]\)"),
        (TensorDataset(torch.zeros(8, 2), torch.zeros(8), torch.zeros(8)), "yields 3 items a"),
    ],
    ids=["dicts", "triples"],
)
def test_a_loader_that_does_not_yield_pairs_is_refused_saying_what_it_yields(dataset, message):
    # before: "'str' object has no attribute 'to'" and "too many values to unpack"
    pyro.clear_param_store()
    model = bbb.BNN(bbb.mlp([2, 4, 1]), bbb.likelihoods.Gaussian(), num_data=8)
    loader = DataLoader(dataset, batch_size=4)
    with pytest.raises(TypeError, match=message + ".*fit reads \\(x, y\\) pairs"):
        bbb.fit(model, bbb.MeanFieldGuide(model), loader, epochs=1, progress=False)
