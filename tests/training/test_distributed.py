"""Tests of pyro_bbb.training.distributed: data-parallel fit under torchrun against one process.

``ddp_script.py`` is a user's script (no main guard). It runs once under ``torchrun
--nproc_per_node=2`` (gloo) and once alone, the single-process reference with the same
global batch; each process saves what it saw, and the tests compare.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pyro_bbb.training.distributed import DataParallel, data_parallel

from ..support import REPO, requires_cuda

SCRIPT = Path(__file__).with_name("ddp_script.py")
TIMEOUT = 300  # seconds; the two processes need about 15 s on an idle 2-core machine


def _run(command: list[str], out: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [*command, str(SCRIPT), str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("ddp")
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"], out)
    _run([sys.executable], out)

    def load(name):
        return torch.load(out / f"{name}.pt", weights_only=False)

    return {"rank0": load("rank0_of2"), "rank1": load("rank1_of2"), "alone": load("rank0_of1")}


def test_a_world_of_one_without_a_process_group_changes_nothing():
    parallel = data_parallel()
    assert parallel == DataParallel(rank=0, world_size=1) and parallel.is_main
    assert not parallel.active
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    parallel.average_gradients_([p])
    parallel.broadcast_([p])
    assert torch.equal(p.grad, torch.full((3,), 2.0)) and torch.equal(p.detach(), torch.ones(3))
    values = torch.tensor([1.0, 2.0])
    assert parallel.mean(values) is values
    assert parallel.shared_seed(None, torch.device("cpu")) is None
    assert parallel.device("cuda") == torch.device("cuda")
    assert parallel.gather("a") == ["a"]


def test_map_on_two_processes_ends_where_one_process_with_twice_the_batch_does(runs):
    alone, ddp = runs["alone"]["map"], runs["rank0"]["map"]
    assert ddp["steps"] == alone["steps"] == [4, 8, 12]  # 64 points, 16 per global step
    for name, value in alone["params"].items():
        error = (ddp["params"][name] - value).abs().max() / value.abs().max()
        assert error < 1e-5, name
    assert ddp["loss"] == pytest.approx(alone["loss"], rel=1e-5)


def test_a_loader_with_a_distributed_sampler_takes_the_steps_of_one_process(runs):
    # A DistributedSampler on two processes with batch 8 ends where one on one process with
    # batch 16 ends: fit tells the samplers the epoch, so both reshuffle alike.
    alone, ddp = runs["alone"]["map_loader"], runs["rank0"]["map_loader"]
    assert ddp["steps"] == alone["steps"] == [4, 8, 12]
    for name, value in alone["params"].items():
        error = (ddp["params"][name] - value).abs().max() / value.abs().max()
        assert error < 1e-5, name


def test_every_process_ends_with_the_same_parameters_and_history(runs):
    for part in ("map", "map_loader", "mc"):
        zero, one = runs["rank0"][part], runs["rank1"][part]
        assert zero["loss"] == one["loss"]
        for name, value in zero["params"].items():
            assert torch.equal(one["params"][name], value), (part, name)


def test_every_process_starts_from_rank_zeros_initialisation(runs):
    zero, one = runs["rank0"]["mc"], runs["rank1"]["mc"]
    own = one["own_init"]["0.weight"]
    assert not torch.equal(own, zero["own_init"]["0.weight"])  # built differently
    # the optimiser does not move: the parameters are where the broadcast put them
    locs = one["params"]["RecordingGuide.locs.0.weight"]
    assert torch.equal(locs, zero["own_init"]["0.weight"])


def test_monte_carlo_noise_differs_between_processes(runs):
    zero, one = runs["rank0"]["mc"]["draws"], runs["rank1"]["mc"]["draws"]
    assert zero.shape == one.shape == (300, 1, 3)
    assert (zero - one).abs().amin(dim=(1, 2)).gt(0).all()  # every step, every weight


def _expected_gradient(params: dict, x: torch.Tensor, y: torch.Tensor) -> dict:
    r"""Gradient of the expected loss of mean-field linear regression, in closed form.

    :math:`E_q[-\log p(y|w)] = \sum_i [(y_i - x_i\mu_w - \mu_b)^2 + \sum_j x_{ij}^2 s_j^2 +
    s_b^2] / 2\sigma^2 + \text{const}`, plus the Gaussian KL to :math:`\mathcal N(0, 1)`.
    """
    names = [f"RecordingGuide.{k}.0.{s}" for s in ("weight", "bias") for k in ("locs", "rhos")]
    loc_w, rho_w, loc_b, rho_b = (params[n].clone().requires_grad_() for n in names)
    s_w, s_b = F.softplus(rho_w) + 1e-6, F.softplus(rho_b) + 1e-6
    mean = x @ loc_w.reshape(-1) + loc_b
    variance = x.pow(2) @ s_w.reshape(-1).pow(2) + s_b.pow(2)
    nll = ((y - mean).pow(2) + variance).sum() / (2 * 0.5**2)
    loc, scale = torch.cat([loc_w.reshape(-1), loc_b]), torch.cat([s_w.reshape(-1), s_b])
    kl = (-scale.log() + (scale.pow(2) + loc.pow(2)) / 2 - 0.5).sum()
    grads = torch.autograd.grad(nll + kl, [loc_w, rho_w, loc_b, rho_b])
    return dict(zip(names, grads, strict=True))


@pytest.mark.parametrize("run", ["rank0", "alone"])
def test_rank_averaged_gradient_is_the_single_process_gradient_in_expectation(runs, run):
    # Each process sees half the data; unaveraged, its gradient's expectation would be off
    # by hundreds of standard errors.
    result = runs[run]
    expected = _expected_gradient(result["mc"]["params"], result["x"], result["y"])
    for name, grads in result["mc"]["grads"].items():
        standard_error = grads.std(0) / grads.shape[0] ** 0.5
        z = (grads.mean(0) - expected[name]) / standard_error
        assert z.abs().max() < 5, (name, z)


def test_averaging_over_two_processes_halves_the_gradient_variance(runs):
    ddp, alone = runs["rank0"]["mc"]["grads"], runs["alone"]["mc"]["grads"]
    ratio = torch.cat([(ddp[n].var(0) / alone[n].var(0)).reshape(-1) for n in ddp])
    # two independent draws averaged; 300 steps give the ratio to about ±20 %
    assert 0.3 < ratio.median() < 0.8, ratio


def test_resume_under_torchrun_equals_the_uninterrupted_fit_on_every_process(runs):
    for run in ("rank0", "rank1", "alone"):
        (full, full_loss), (resumed, resumed_loss) = runs[run]["resume"].values()
        assert resumed_loss == full_loss
        for name, value in full.items():
            assert torch.equal(resumed[name], value), (run, name)


CUDA_SCRIPT = """
import os
import sys

import pyro
import torch
import torch.distributed as dist

import pyro_bbb as bbb

dist.init_process_group()  # NCCL for CUDA tensors
out = sys.argv[1]
x = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
y = x.sum(-1)


def run(epochs, **options):
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = bbb.BNN(bbb.mlp([3, 8, 1]), bbb.likelihoods.Gaussian(), num_data=64)
    guide = bbb.MeanFieldGuide(model)
    history = bbb.fit(
        model, guide, x, y, epochs=epochs, batch_size=8, seed=0, device="cuda",
        beta=bbb.infer.LinearWarmup(3), lr_schedule=bbb.training.CosineDecay(4), **options,
    )  # fmt: skip
    devices = {str(v.device) for v in pyro.get_param_store().values()}
    return {n: v.detach().cpu() for n, v in pyro.get_param_store().items()}, history.loss, devices


path = os.path.join(out, "cuda.pt")
full = run(4)
run(2, checkpoint=path)
resumed = run(4, resume=path)
torch.save({"full": full, "resumed": resumed}, os.path.join(out, f"cuda{dist.get_rank()}.pt"))
dist.barrier()
dist.destroy_process_group()
"""


@requires_cuda
def test_nccl_on_every_gpu_trains_each_process_on_its_own_and_resumes(tmp_path):
    processes = min(2, torch.cuda.device_count())
    script = tmp_path / "cuda_script.py"
    script.write_text(CUDA_SCRIPT)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    run = subprocess.run(
        [*command, f"--nproc_per_node={processes}", str(script), str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for rank in range(processes):
        result = torch.load(tmp_path / f"cuda{rank}.pt", weights_only=False)
        (full, full_loss, devices), (resumed, resumed_loss, _) = result["full"], result["resumed"]
        assert devices == {f"cuda:{rank}"}
        assert resumed_loss == pytest.approx(full_loss, rel=1e-6)
        for name, value in full.items():
            assert torch.allclose(resumed[name], value, rtol=1e-6, atol=1e-7), name


def test_the_ddp_example_runs_under_torchrun(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text((REPO / "examples" / "ddp.py").read_text())  # it writes where it runs
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [*command, str(script), "--max-steps", "120"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # fit's default length within a budget of 120 steps: 6 epochs of 1,000 rows a process
    assert "2 process(es), 120 steps of 50 x 2 points" in run.stdout  # printed once, by rank 0
    assert "; 6 epochs" in run.stdout
    assert run.stdout.count("process(es)") == 1
    written = {p.name for p in tmp_path.iterdir()}
    assert written == {"ddp.py", "ddp_checkpoint_2.pt", "ddp_bnn.pt", "ddp_history.png"}


@pytest.mark.parametrize(
    "path",
    ["examples/ddp.py", "benchmarks/ddp.py", "docs/distributed.md", "tests/training/ddp_script.py"],
)
def test_every_script_we_show_waits_for_all_processes_before_tearing_the_group_down(path):
    # Without the barrier the first process to finish may tear its gloo group down while
    # another is still in its last collective.
    lines = [line.strip() for line in (REPO / path).read_text().splitlines()]
    teardown = next(i for i, line in enumerate(lines) if line == "dist.destroy_process_group()")
    assert lines[teardown - 1].startswith("dist.barrier()"), lines[teardown - 1]


TEARDOWN_SCRIPT = """
import glob, json, sys
import pyro_bbb as bbb  # before the group, as a script imports it
import torch, torch.distributed as dist

dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
x = torch.linspace(-1, 1, 8).unsqueeze(-1)
model = bbb.BNN(bbb.mlp([1, 1]), bbb.likelihoods.Gaussian(), num_data=8)
bbb.fit(model, bbb.MeanFieldGuide(model), x, x[:, 0], epochs=1, progress=False)  # torch.optim
dist.barrier()
dist.destroy_process_group()
print(json.dumps([open(path).read().strip() for path in glob.glob("/proc/self/task/*/comm")]))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="lists threads from Linux's /proc")
def test_destroying_the_group_after_a_fit_stops_gloos_threads_before_the_interpreter_exits(
    tmp_path,
):
    # fit's optimiser imports torch._dynamo, which imports torch.distributed.nn.functional,
    # whose functions bind the default group into their default arguments: imported after
    # init_process_group, they kept the group alive past destroy_process_group, and gloo's
    # threads ran on into the interpreter's exit, where one process of a torchrun pair
    # aborted now and then (SIGABRT). import pyro_bbb imports that module before the group.
    run = subprocess.run(
        [sys.executable, "-c", TEARDOWN_SCRIPT, str(tmp_path / "rendezvous")],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    threads = json.loads(run.stdout.strip().splitlines()[-1])  # the script's threads
    assert threads and not [name for name in threads if "gloo" in name], threads
