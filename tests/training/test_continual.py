"""Variational continual learning: the posterior chain, heads, coresets, and split digits."""

from __future__ import annotations

import json
import subprocess
import sys

import pyro
import pyro.poutine as poutine
import pytest
import torch
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.infer import AnnealedELBO
from pyro_bbb.nn import MultiHead
from pyro_bbb.priors import Gaussian
from pyro_bbb.priors.posterior import NormalPosterior
from pyro_bbb.training import VCL

from ..support import REPO, scaled


def two_tasks(seed=0):
    """Two binary tasks on 4 features, labels from different directions."""
    g = torch.Generator().manual_seed(seed)
    tasks = []
    for direction in (torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 1.0, -1.0])):
        x = torch.randn(60, 4, generator=g)
        tasks.append((x, (x @ direction > 0).long()))
    return tasks


def multi_head_model(num_heads=2):
    body = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
    net = bbb.bayesianize(MultiHead(body, [nn.Linear(8, 2) for _ in range(num_heads)]))
    return bbb.BNN(net, bbb.likelihoods.Categorical(2), num_data=1)


class Recorder:
    """A guide factory that keeps what VCL asked for."""

    def __init__(self, make=bbb.MeanFieldGuide):
        self.make, self.calls = make, []

    def __call__(self, model, **options):
        guide = self.make(model, **options)
        self.calls.append((guide, options))
        return guide


FIT = {"epochs": 3, "batch_size": 30, "progress": False, "seed": 0}


def test_each_task_learns_under_the_posterior_of_the_tasks_before():
    (x0, y0), (x1, y1) = two_tasks()
    model = multi_head_model()
    initial = model.net.heads[1].priors["weight"]
    guides = Recorder()
    vcl = VCL(model, guide=guides)
    vcl.fit(x0, y0, head=0, **FIT)
    after_first = vcl.posterior
    assert set(after_first) == {"body.0.weight", "body.0.bias", "heads.0.weight", "heads.0.bias"}
    # head 1 keeps the prior it was built with until the task that trains it
    assert model.net.heads[1].priors["weight"] is initial
    vcl.fit(x1, y1, head=1, **FIT)
    # task 1 ran under task 0's posterior of the body, and started at its means
    assert model.net.body[0].priors["weight"] is after_first["body.0.weight"]
    _, options = guides.calls[1]
    assert set(options["init_loc"]) == {"body.0.weight", "body.0.bias"}
    assert torch.equal(options["init_loc"]["body.0.weight"], after_first["body.0.weight"].loc)
    assert options["name"] == "VCL.task1"
    # the chain: the body from task 1, head 0 still from task 0, head 1 from task 1
    assert vcl.posterior["heads.0.weight"] is after_first["heads.0.weight"]
    assert vcl.posterior["body.0.weight"] is not after_first["body.0.weight"]
    assert isinstance(vcl.posterior["heads.1.weight"], NormalPosterior)
    assert vcl.num_tasks == 2 and vcl.guide is guides.calls[1][0]


def test_naive_fine_tuning_starts_at_the_previous_means_under_the_first_prior():
    (x0, y0), (x1, y1) = two_tasks()
    model = multi_head_model()
    initial = model.net.body[0].priors["weight"]
    guides = Recorder()
    vcl = VCL(model, guide=guides, propagate=False, name="naive")
    vcl.fit(x0, y0, head=0, **FIT)
    means = vcl.posterior.means()
    vcl.fit(x1, y1, head=1, **FIT)
    assert model.net.body[0].priors["weight"] is initial
    _, options = guides.calls[1]
    assert torch.equal(options["init_loc"]["body.0.weight"], means["body.0.weight"])


def test_predictions_draw_each_head_with_the_latest_body():
    (x0, y0), (x1, y1) = two_tasks()
    model = multi_head_model()
    vcl = VCL(model)
    options = {**FIT, "epochs": 60}
    vcl.fit(x0, y0, head=0, **options)
    vcl.fit(x1, y1, head=1, **options)
    for head, (x, y) in enumerate(two_tasks()):
        pred = vcl.predict(x, head=head, num_samples=30, seed=0)
        assert pred.probs.shape == (60, 2)
        assert (pred.probs.argmax(-1) == y).float().mean() > 0.8
    # the weights are drawn once for every chunk of the inputs
    whole = vcl.predict(x0, head=0, num_samples=4, seed=3)
    chunked = vcl.predict(x0, head=0, num_samples=4, seed=3, batch_size=7)
    torch.testing.assert_close(whole.probs_samples, chunked.probs_samples)


def test_a_coreset_is_held_out_of_training_and_tunes_the_prediction():
    (x0, y0), (x1, y1) = two_tasks()
    model = multi_head_model()
    guides = Recorder()
    vcl = VCL(model, guide=guides, coreset="k-center", coreset_size=10)
    vcl.fit(x0, y0, head=0, **FIT)
    assert vcl.histories[0].num_data == 50
    ((xc, yc, head),) = vcl.coresets
    assert yc.shape == (10,)
    assert head == 0 and xc.shape == (10, 4) and torch.equal(xc[0], x0[0])  # k-center: row 0
    vcl.fit(x1, y1, head=1, **FIT)
    vcl.predict(x0, head=0, num_samples=5)
    tuned, options = guides.calls[-1]
    assert options["name"] == "VCL.coreset0"
    # fine-tuned under the chain, from its means; kept until the next fit
    assert set(options["init_loc"]) == {
        "body.0.weight",
        "body.0.bias",
        "heads.0.weight",
        "heads.0.bias",
    }
    vcl.predict(x0, head=0, num_samples=5)
    assert guides.calls[-1][0] is tuned
    assert sum(1 for k in pyro.get_param_store() if k.startswith("VCL.coreset0.")) == 8


def test_a_single_head_network_fine_tunes_on_every_tasks_coreset():
    (x0, y0), (x1, y1) = two_tasks()
    net = bbb.mlp([4, 8, 2], "tanh")
    seen = []

    class Sizes(bbb.Callback):
        def on_fit_start(self, params, history):
            seen.append(history.num_data)

    finetune = {"epochs": 2, "callbacks": [Sizes()], "progress": False}
    model = bbb.BNN(net, bbb.likelihoods.Categorical(2), 1)
    vcl = VCL(model, coreset="random", coreset_size=5, finetune=finetune)
    vcl.fit(x0, y0, **FIT)
    vcl.fit(x1, y1, **FIT)
    vcl.predict(x1, num_samples=5)
    assert seen == [10]  # one fine-tuning fit, on both tasks' coresets
    assert set(vcl.posterior) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_a_low_rank_chain_keeps_each_blocks_posterior():
    (x0, y0), (x1, y1) = two_tasks()
    vcl = VCL(multi_head_model(), guide=lambda model, **kw: bbb.LowRankGuide(model, rank=2, **kw))
    vcl.fit(x0, y0, head=0, **FIT)
    vcl.fit(x1, y1, head=1, **FIT)
    body = vcl.posterior["body.0.weight"].block
    assert vcl.posterior["body.0.bias"].block is body
    assert vcl.posterior["heads.0.weight"].block is not body
    assert vcl.predict(x0, head=0, num_samples=5).probs.shape == (60, 2)


def test_a_network_block_chain_draws_an_old_head_given_the_new_body():
    # A network block joins the body and head 0. Task 1 does not see head 0, so the exact
    # update keeps head 0's conditional given the body: it is drawn from the old block given
    # the body drawn from the new posterior, and the new block's KL is still one term.
    (x0, y0), (x1, y1) = two_tasks()
    network = lambda model, **kw: bbb.LowRankGuide(model, rank=3, blocks="network", **kw)  # noqa: E731
    vcl = VCL(multi_head_model(), guide=network)
    vcl.fit(x0, y0, head=0, **FIT)
    vcl.fit(x1, y1, head=1, **FIT)
    terms = AnnealedELBO().terms(vcl.model, vcl.guide, x1, y1)
    assert set(terms.sites) == {"_VCL.task1.network", "obs"}
    assert vcl.posterior["heads.0.weight"].block is not vcl.posterior["body.0.weight"].block
    vcl.model.net.head = 0
    trace = poutine.trace(vcl.model).get_trace(x0)
    assert trace.nodes["heads.0.weight"]["fn"].given == ("body.0.weight", "body.0.bias")


def test_bad_heads_models_and_coresets_are_refused():
    (x0, y0), _ = two_tasks()
    vcl = VCL(multi_head_model())
    with pytest.raises(ValueError, match="head is required"):
        vcl.fit(x0, y0, **FIT)
    with pytest.raises(ValueError, match=r"head must be an int in \[0, 2\)"):
        vcl.fit(x0, y0, head=2, **FIT)
    single = VCL(bbb.BNN(bbb.mlp([4, 2]), bbb.likelihoods.Categorical(2), 1))
    with pytest.raises(ValueError, match="head must be None"):
        single.fit(x0, y0, head=0, **FIT)
    with pytest.raises(TypeError, match=r"model must be a pyro_bbb\.BNN"):
        VCL(bbb.mlp([4, 2]))
    with pytest.raises(ValueError, match="coreset must be"):
        VCL(multi_head_model(), coreset="greedy", coreset_size=3)
    with pytest.raises(ValueError, match="coreset_size needs a coreset method"):
        VCL(multi_head_model(), coreset_size=3)


@pytest.mark.slow
def test_vcl_remembers_split_digits_far_better_than_naive_fine_tuning():
    # Five two-class tasks, one head each. Naive fine-tuning starts each task at the previous
    # means under the N(0, 1) prior again, and its body drifts away from the earlier heads;
    # VCL's prior holds the body near what the earlier tasks needed. 60 epochs a task, over
    # six network seeds: average accuracy 0.925-0.967 against 0.558-0.843, the gap 0.10-0.41
    # (mean 0.24); how far naive fine-tuning drifts depends on the seed, so the gap is
    # averaged over seeds (two here, all six in the full form). The epochs stay at 60 in both
    # forms: at 100 epochs a task, VCL itself fell to 0.865 on two of four seeds (its prior
    # narrows with every task), so the claim is made where it was measured.
    pytest.importorskip("sklearn")
    tasks = bbb.data.split_digits()
    options = {"epochs": 60, "batch_size": 64, "lr": 0.01, "progress": False}

    def final_average_accuracy(propagate, seed):
        torch.manual_seed(seed)
        body = nn.Sequential(nn.Linear(64, 20), nn.ReLU(), nn.Linear(20, 20), nn.ReLU())
        net = bbb.bayesianize(MultiHead(body, [nn.Linear(20, 2) for _ in tasks]), Gaussian(1.0))
        model = bbb.BNN(net, bbb.likelihoods.Categorical(2), num_data=1)
        vcl = VCL(model, propagate=propagate, name=f"propagate={propagate}")
        for t, task in enumerate(tasks):
            vcl.fit(task.x_train, task.y_train, head=t, seed=t, **options)
        accuracies = [
            (
                vcl.predict(task.x_test, head=t, num_samples=50, seed=0).probs.argmax(-1)
                == task.y_test
            )
            .float()
            .mean()
            for t, task in enumerate(tasks)
        ]
        return torch.stack(accuracies).mean().item()

    seeds = range(scaled(2, 6))
    vcl = [final_average_accuracy(True, seed) for seed in seeds]
    naive = [final_average_accuracy(False, seed) for seed in seeds]
    assert min(vcl) > 0.9, vcl
    gaps = [v - n for v, n in zip(vcl, naive, strict=True)]
    assert sum(gaps) / len(gaps) > 0.1, (vcl, naive)


def test_the_continual_example_runs_end_to_end(tmp_path):
    pytest.importorskip("sklearn")
    out, table = tmp_path / "continual.png", tmp_path / "continual.json"
    args = ["--epochs", "1", "--hidden", "8", "--coreset", "5"]
    args += ["--figure", str(out), "--json", str(table)]
    script = REPO / "examples" / "continual.py"
    run = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    for text in ("split digits (multi-head)", "permuted digits (single head)", "joint training"):
        assert text in run.stdout
    assert "fits ended before fit's convergence check passed: each ran --epochs 1" in run.stdout
    assert "ConvergenceWarning" not in run.stderr  # said once, in words, not fit by fit
    results = json.loads(table.read_text())
    rows = results["split digits (multi-head)"]["naive fine-tuning"]
    assert [len(row) for row in rows] == [1, 2, 3, 4, 5]  # every task seen so far, each time
    assert out.stat().st_size > 10_000
