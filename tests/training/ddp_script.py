"""A user's data-parallel script, as tests/training/test_distributed.py runs it.

Written as users write scripts, top level and without a main guard. Under ``torchrun`` it
calls ``init_process_group()`` and ``fit`` trains data-parallel; run alone it is the
single-process reference with the same global batch. Each process saves what it saw to
``OUT/rank{rank}_of{world_size}.pt``:

* ``map``: MAP (``AutoDelta``, a deterministic objective) with a batch of ``16 // W`` per
  process for 3 epochs: the final parameters and History; ``map_loader``: the same from a
  ``DataLoader`` with a ``DistributedSampler``;
* ``mc``: a mean-field fit of conjugate linear regression whose optimiser does not move
  (SGD, lr 0), 300 steps on the process's whole share: the network is initialised
  differently on each process (fit must broadcast rank 0's), the guide records its draws
  and a callback the (averaged) gradients;
* ``resume``: a minibatch fit with a β warm-up, uninterrupted to 4 epochs, against 2 epochs
  with a checkpoint resumed to 4.
"""

import os
import sys

import pyro
import torch
import torch.distributed as dist
from pyro.infer.autoguide import AutoDelta
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import pyro_bbb as bbb

out = sys.argv[1]
if "RANK" in os.environ:  # launched by torchrun
    dist.init_process_group(backend="gloo")
rank = dist.get_rank() if dist.is_initialized() else 0
world_size = dist.get_world_size() if dist.is_initialized() else 1
torch.set_num_threads(1)

g = torch.Generator().manual_seed(0)
x = torch.randn(64, 3, generator=g, dtype=torch.float64)
w = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
y = x @ w + 0.3 + 0.5 * torch.randn(64, generator=g, dtype=torch.float64)
results = {"x": x, "y": y}


def store() -> dict:
    return {name: value.detach().clone() for name, value in pyro.get_param_store().items()}


# --- MAP: one process with batch 16 = two with batch 8 each
pyro.clear_param_store()
model = bbb.BNN(bbb.mlp([3, 8, 1]).double(), bbb.likelihoods.Gaussian().double(), num_data=64)
guide = AutoDelta(model)
history = bbb.fit(model, guide, x, y, epochs=3, batch_size=16 // world_size, lr=0.01, seed=0)
results["map"] = {"params": store(), "loss": history.loss, "steps": history.steps}

# --- the same with a DataLoader that brings its DistributedSampler
pyro.clear_param_store()
model = bbb.BNN(bbb.mlp([3, 8, 1]).double(), bbb.likelihoods.Gaussian().double(), num_data=64)
guide = AutoDelta(model)
dataset = TensorDataset(x, y)
sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=0)
loader = DataLoader(dataset, batch_size=16 // world_size, sampler=sampler)
history = bbb.fit(model, guide, loader, epochs=3, lr=0.01, seed=0)
results["map_loader"] = {"params": store(), "loss": history.loss, "steps": history.steps}


# --- Monte Carlo gradients at fixed parameters
class RecordingGuide(bbb.MeanFieldGuide):
    def forward(self, *args, **kwargs):
        draws = super().forward(*args, **kwargs)
        self.draws.append(draws["0.weight"].detach().clone())
        return draws


class GradientRecorder(bbb.Callback):
    def on_fit_start(self, params, history):
        self.params, self.grads = params, []

    def on_after_backward(self, params, step):
        self.grads.append([p.grad.detach().clone() for p in params])


pyro.clear_param_store()
torch.manual_seed(100 + rank)  # a different network initialisation on every process
net = bbb.mlp([3, 1], prior=bbb.priors.Gaussian(1.0)).double()
model = bbb.BNN(net, bbb.likelihoods.Gaussian(scale=0.5).double(), num_data=64)
own_init = {name: v.clone() for name, v in bbb.nn.initial_values(model).items()}
guide = RecordingGuide(model, init_scale=0.3)
guide.draws = []
recorder = GradientRecorder()
history = bbb.fit(
    model, guide, x, y, epochs=300, optimizer=lambda p: torch.optim.SGD(p, lr=0.0), seed=0,
    callbacks=[recorder], num_particles=1,  # one draw a step per process, and no draw to count
)  # fmt: skip
names = {id(pyro.param(name).unconstrained()): name for name in pyro.get_param_store()}
results["mc"] = {
    "own_init": own_init,
    "params": store(),
    "draws": torch.stack(guide.draws[1:]),  # the first is the set-up's, under a forked state
    "grads": {
        names[id(p)]: torch.stack([step[i] for step in recorder.grads])
        for i, p in enumerate(recorder.params)
    },
    "loss": history.loss,
}


# --- a checkpoint written by rank 0 and resumed by every process
def run(epochs: int, **options) -> tuple[dict, list]:
    pyro.clear_param_store()
    torch.manual_seed(300)
    model = bbb.BNN(bbb.mlp([3, 8, 1]), bbb.likelihoods.Gaussian(), num_data=64)
    guide = bbb.MeanFieldGuide(model)
    history = bbb.fit(
        model, guide, x.float(), y.float(), epochs=epochs, batch_size=8, seed=1,
        beta=bbb.infer.LinearWarmup(3), lr_schedule=bbb.training.CosineDecay(4), **options,
    )  # fmt: skip
    return store(), history.loss


checkpoint = os.path.join(out, f"checkpoint_of{world_size}.pt")
uninterrupted = run(4)
run(2, checkpoint=checkpoint)
resumed = run(4, resume=checkpoint)
results["resume"] = {"uninterrupted": uninterrupted, "resumed": resumed}

torch.save(results, os.path.join(out, f"rank{rank}_of{world_size}.pt"))
if dist.is_initialized():
    dist.barrier()  # tear down together, as examples/ddp.py explains
    dist.destroy_process_group()
