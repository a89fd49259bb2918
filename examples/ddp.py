"""Data-parallel training with torchrun: the same script runs on one process or many.

    python examples/ddp.py                                     # one process
    torchrun --standalone --nproc_per_node=2 examples/ddp.py   # two processes, this machine
    torchrun --standalone --nproc_per_node=2 examples/ddp.py --max-steps 120  # a short run

Every process builds the same model and holds the whole data set; ``fit`` gives each its
share (as ``DistributedSampler`` would), averages the gradients every step, and makes the
objective the one-process objective with a batch of world size × ``batch_size``. Here the
per-process batch is 100 / world size, so every launch takes the same steps; the run's
length is ``fit``'s default (until more training stops paying). Rank 0 prints, writes a
checkpoint every 10 epochs and saves the trained model; run the script again and it resumes
from the checkpoint (delete ``ddp_checkpoint_*.pt`` to start over).
"""

import argparse
import os

import pyro
import torch
import torch.distributed as dist

import pyro_bbb

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, default=None, help="fit's budget (its default)")
args = parser.parse_args()
if "RANK" in os.environ:  # set by torchrun
    dist.init_process_group()  # gloo for CPU tensors, NCCL for CUDA ones
rank = dist.get_rank() if dist.is_initialized() else 0
world_size = dist.get_world_size() if dist.is_initialized() else 1
torch.set_num_threads(1)  # one core per process

data = pyro_bbb.data.gap_regression(num_data=2000, seed=0)  # the whole data set, every process
pyro.clear_param_store()
torch.manual_seed(0)  # the network's initialisation (fit copies rank 0's to every process)
net = pyro_bbb.mlp([1, 50, 50, 1], activation="tanh")
model = pyro_bbb.BNN(net, pyro_bbb.likelihoods.Gaussian(), num_data=len(data.x))
guide = pyro_bbb.MeanFieldGuide(model, init_scale=0.01)

checkpoint = f"ddp_checkpoint_{world_size}.pt"  # a resume needs the same number of processes
history = pyro_bbb.fit(
    model,
    guide,
    data.x,
    data.y,
    batch_size=100 // world_size,  # per process: the global batch stays 100
    max_steps=args.max_steps,
    seed=0,  # initialisation and data order; the Monte Carlo noise of rank r uses seed + r
    checkpoint=checkpoint,
    checkpoint_every=10,
    resume=checkpoint if os.path.exists(checkpoint) else None,
)

if rank == 0:  # the History is the same on every process; print it once
    print(
        f"{world_size} process(es), {history.steps[-1]} steps of {100 // world_size} x "
        f"{world_size} points: loss {history.loss[-1]:.1f}  nll {history.nll[-1]:.1f}  "
        f"kl {history.kl[-1]:.1f}  {sum(history.seconds):.1f} s; {len(history)} epochs"
    )
    pred = pyro_bbb.predict(model, guide, torch.tensor([[-2.5], [0.0]]), num_samples=200, seed=0)
    print("epistemic std near the data and in the gap:", pred.epistemic_std)
    pyro_bbb.save("ddp_bnn.pt", model, guide)  # pyro_bbb.load fills a fresh model and guide
    print(f"checkpoint: {checkpoint}, trained model: ddp_bnn.pt")
    from pyro_bbb.plots import plot_history  # matplotlib is needed for figures only

    plot_history(history, title=f"{world_size} process(es)", path="ddp_history.png")

if dist.is_initialized():  # pyro_bbb was imported before the group: this stops gloo's threads
    dist.barrier()  # no process tears gloo down while another is still in a collective
    dist.destroy_process_group()
