"""The rows of ``benchmarks/images.py`` that are not ``pyro_bbb``: plain torch networks and IVON.

* ``run_deterministic``: a network trained by Adam (lr 1e-3, batch 128, ``--epochs``
  epochs), MC dropout's masks kept on at prediction (100 passes averaged);
* ``run_ivon``: IVON (Shen et al. 2024, "Variational Learning is Effective for Large Deep
  Networks", https://arxiv.org/abs/2402.17641; ``pip install --no-deps ivon-opt``), a
  mean-field Gaussian posterior learned by a drop-in optimiser, with its authors' recipe:
  the effective sample size ``ess`` the number of training images, one weight sample a step
  (``train_samples=1``), a cosine decay of the rate to zero over the run, weight decay
  1e-4, ``hess_init`` 0.1 (``--ivon-hess-init``), ``--ivon-epochs`` epochs (20), batch 128,
  and the predictive the mean of the softmax over 50 weight samples. Its rate is the row's
  protocol (``lr0.1``: its README's, ``lr0.2``). Without the package installed its rows
  are skipped with a message (``has_ivon``).

Each returns its row's training CPU seconds, epochs, steps and scores.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import torch
from _images_nets import lenet5, mlp_layers, scores
from torch import nn

from pyro_bbb.data import Split

#: IVON's rates, one protocol each.
IVON_PROTOCOLS = ("lr0.1", "lr0.2")
#: Weight samples of IVON's predictive.
IVON_TEST_SAMPLES = 50


def in_minibatches(
    num_train: int, epochs: int, max_steps: int | None, step: Callable[[torch.Tensor], None]
) -> tuple[float, int, int]:
    """Call ``step(rows)`` on shuffled minibatches of 128 rows for ``epochs`` epochs, ending
    early after ``max_steps`` steps: the process's CPU seconds, the epochs and the steps."""
    budget = math.inf if max_steps is None else max_steps
    start, steps, done = time.process_time(), 0, 0
    while done < epochs and steps < budget:
        for rows in torch.randperm(num_train).split(128):
            step(rows)
            steps += 1
            if steps >= budget:
                break
        done += 1
    return time.process_time() - start, done, steps


def run_deterministic(name: str, data: Split, seed: int, args: argparse.Namespace) -> dict:
    """A plain torch network: Adam lr 1e-3, batch 128, ``--epochs`` epochs (``--max-steps``)."""
    torch.manual_seed(seed)
    net = lenet5() if name == "lenet" else mlp_layers(400, args.dropout * (name == "dropout"))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step(rows: torch.Tensor) -> None:
        loss = nn.functional.cross_entropy(net(data.x_train[rows]), data.y_train[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    cpu, epochs, steps = in_minibatches(len(data.x_train), args.epochs, args.max_steps, step)
    with torch.no_grad():
        if name == "dropout":  # MC dropout: masks stay on, 100 forward passes averaged
            log_probs = torch.stack([net(data.x_test).log_softmax(-1) for _ in range(100)])
            log_probs = log_probs.logsumexp(0) - torch.log(torch.tensor(100.0))
        else:
            net.eval()
            log_probs = net(data.x_test).log_softmax(-1)
    return {"cpu": cpu, "epochs": epochs, "steps": steps} | scores(log_probs, data.y_test)


def has_ivon() -> bool:
    """Whether IVON is installed (its rows are skipped, with a message, otherwise)."""
    try:
        import ivon  # noqa: F401
    except ImportError:
        return False
    return True


def run_ivon(name: str, protocol: str, data: Split, seed: int, args: argparse.Namespace) -> dict:
    """IVON with its own recipe (see the module's notes) at the protocol's rate."""
    import ivon

    torch.manual_seed(seed)
    net = lenet5() if name == "ivon_lenet" else mlp_layers(400)
    num_train = len(data.x_train)
    optimizer = ivon.IVON(
        net.parameters(), lr=float(protocol.removeprefix("lr")), ess=num_train,
        hess_init=args.ivon_hess_init, weight_decay=1e-4,
    )  # fmt: skip
    steps = args.ivon_epochs * math.ceil(num_train / 128)
    if args.max_steps is not None:
        steps = min(steps, args.max_steps)
    decay = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)

    def step(rows: torch.Tensor) -> None:
        with optimizer.sampled_params(train=True):  # one weight sample a step
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(net(data.x_train[rows]), data.y_train[rows])
            loss.backward()
        optimizer.step()
        decay.step()

    cpu, epochs, done = in_minibatches(num_train, args.ivon_epochs, steps, step)
    with torch.no_grad():
        probs = torch.zeros(len(data.x_test), 10)
        for _ in range(IVON_TEST_SAMPLES):
            with optimizer.sampled_params():
                probs += net(data.x_test).softmax(-1)
        log_probs = (probs / IVON_TEST_SAMPLES).log()
    return {"cpu": cpu, "epochs": epochs, "steps": done} | scores(log_probs, data.y_test)
