"""Write the files that ``tests/io/test_legacy.py`` reads, with a pyro_bbb of the old layout.

Up to commit ``4dde12c`` the :class:`~pyro_bbb.LowRankGuide` stored its factor :math:`V`
as ``<name>.factors.<block>``, ``(d, rank)``. Run this script with such a version on the
path, from the repository root of a checkout of that commit::

    git worktree add /tmp/old 4dde12c
    PYTHONPATH=/tmp/old python tests/io/data/make_low_rank_v1.py tests/io/data

It writes a saved model, two fit checkpoints (a guide and an ensemble of guides, after 2
of 4 epochs) and what that version computed from them: the saved model's predictions and
the parameters of the uninterrupted 4-epoch fits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyro
import torch

import pyro_bbb as bbb
from pyro_bbb.infer import LinearWarmup
from pyro_bbb.training.lr_schedules import CosineDecay

N = 40
X_TEST = torch.linspace(-3, 3, 7).unsqueeze(-1)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(N, 1, generator=g) * 4 - 2
    return x, torch.sin(2 * x.squeeze(-1)) + 0.1 * torch.randn(N, generator=g)


def fresh(kind: str):
    """A model and guide built as the test builds them, in an empty param store."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = bbb.BNN(bbb.mlp([1, 8, 1], activation="tanh"), bbb.likelihoods.Gaussian(), N)
    if kind == "ensemble":
        return model, bbb.Ensemble(model, lambda m: bbb.LowRankGuide(m, rank=2), k=2)
    return model, bbb.LowRankGuide(model, rank=2)


def fit(model, guide, epochs: int, **options):
    # schedules drawn over the whole run, so that 2 epochs and a resume to 4 take the
    # uninterrupted fit's steps
    schedules = {"beta": LinearWarmup(3), "lr_schedule": CosineDecay(4, start=0.2)}
    return bbb.fit(model, guide, *data(), epochs=epochs, batch_size=10, seed=0, progress=False,
                   **schedules, **options)  # fmt: skip


def store() -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in pyro.get_param_store().items()}


def main(out: Path) -> None:
    expected = {}
    model, guide = fresh("guide")
    fit(model, guide, 4)
    bbb.save(out / "low_rank_v1_model.pt", model, guide)
    expected["predictions"] = bbb.predict(model, guide, X_TEST, num_samples=20, seed=0).samples
    for kind in ("guide", "ensemble"):
        fit(*fresh(kind), 2, checkpoint=out / f"low_rank_v1_{kind}_checkpoint.pt")
        fit(*fresh(kind), 4)
        expected[f"{kind}_uninterrupted"] = store()
    torch.save(expected, out / "low_rank_v1_expected.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
