"""fit's own learning rates: each tensor's, printed, and what they buy on networks of a kind.

``--show`` prints the rate ``fit`` starts each parameter at when ``lr`` is not given
(:func:`pyro_bbb.training.rates.tensor_rates`), and what set it, for the networks the rule
was weighed on: the gap problem's 1-50-50-1 tanh MLP, a UCI 13-50-1 MLP, scikit-learn's
digits (64-100-10), 784-400-400-10, a 10,000-50-2 bag-of-words MLP and a transformer
reading 5,000 tokens through an :math:`\\mathcal N(0, 1)` embedding.

``--fit`` fits the last two, and an SGD fit, at ``fit``'s defaults on problems made here,
under each ``--rules``: ``own`` (the package's rule) and ``largest`` (the earlier rule, one
rate for every tensor: a sixteenth of the largest weight tensor's root mean square, at most
0.01), with test accuracy, NLL and CPU seconds (one thread):

* ``bow``: documents of 40 words drawn from a Zipf law over 10,000 words, labelled by which
  of two sets of 50 frequent words they hold more of; 2,000 training and 1,000 test
  documents, word counts as features, batch 100.
* ``transformer``: sequences of 8 tokens of a 5,000-token vocabulary (the first of 300
  frequent ones, the rest uniform), labelled by the first token modulo 3; an embedding of
  width 32, one encoder layer, a linear head; 2,000 training and 1,000 test sequences,
  batch 100.
* ``sgd``: the gap problem (600 points, 1-50-50-1 tanh) with ``optimizer=torch.optim.SGD``
  and no ``lr``.

    python benchmarks/rates.py --show
    python benchmarks/rates.py --fit bow transformer sgd --rules own largest --seeds 0 1
"""

from __future__ import annotations

import argparse
import time
import warnings

import pyro
import torch
from torch import nn

import pyro_bbb as bbb
from pyro_bbb.data import gap_regression
from pyro_bbb.nn.layers import initial_values
from pyro_bbb.training import rates
from pyro_bbb.training.rates import MAX_LR, STEP_SHARE, tensor_rates


class TokenClassifier(nn.Module):
    """An embedding, one transformer encoder layer, a linear head read at the first token."""

    def __init__(self, vocab: int = 5000, width: int = 32, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.encoder = nn.TransformerEncoderLayer(
            width, nhead=2, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens))[:, 0])


def networks() -> dict[str, tuple[bbb.BNN, tuple[torch.Tensor, torch.Tensor]]]:
    """The networks whose rates ``--show`` prints, each with two rows it takes."""
    torch.manual_seed(0)
    regression, categorical = bbb.likelihoods.Gaussian, bbb.likelihoods.Categorical
    labels = torch.zeros(2, dtype=torch.long)

    def mlp(sizes, likelihood, n, **options):
        model = bbb.BNN(bbb.mlp(sizes, **options), likelihood(), num_data=n)
        y = labels if likelihood is categorical else torch.zeros(2)
        return model, (torch.zeros(2, sizes[0]), y)

    transformer = bbb.BNN(bbb.bayesianize(TokenClassifier()), categorical(), num_data=2000)
    return {
        "gap 1-50-50-1 tanh": mlp([1, 50, 50, 1], regression, 600, activation="tanh"),
        "UCI 13-50-1": mlp([13, 50, 1], regression, 455),
        "digits 64-100-10": mlp([64, 100, 10], categorical, 1347),
        "784-400-400-10": mlp([784, 400, 400, 10], categorical, 60000),
        "bag of words 10,000-50-2": mlp([10000, 50, 2], categorical, 2000),
        "transformer, 5,000 tokens": (transformer, (torch.zeros(2, 8, dtype=torch.long), labels)),
    }


def show() -> None:
    """Print every parameter's rate for each of :func:`networks`."""
    for title, (model, inputs) in networks().items():
        pyro.clear_param_store()
        guide = bbb.MeanFieldGuide(model)
        guide(*inputs)
        store = pyro.get_param_store()
        named = {name: store.get_param(name).unconstrained() for name in store}
        print(f"\n{title}")
        for rate in tensor_rates(model, guide, named).values():
            print(f"  {rate.name:44s} {rate.kind:6s} {rate.rate:8.2e}  {rate.source}")


def _largest(model, guide, named, params) -> list[dict]:
    """The earlier rule: one rate, a sixteenth of the largest weight tensor's size."""
    weights = [v for v in initial_values(model).values() if v.dim() >= 2 and v.numel()]
    largest = max(weights, key=torch.Tensor.numel).detach().double()
    size = float(largest.pow(2).mean().sqrt())
    return [{"params": params, "lr": min(MAX_LR, STEP_SHARE * size) if size > 0 else MAX_LR}]


def _zipf(count: int, size: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    weights = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    return torch.multinomial(weights.expand(count, vocab), size, replacement=True, generator=g)


def bow_data(seed: int) -> tuple[torch.Tensor, ...]:
    """Word counts of Zipf documents, labelled by which of two word sets they hold more of."""
    g = torch.Generator().manual_seed(seed)
    vocab, n = 10000, 3000
    words = _zipf(n, 40, vocab, g)
    counts = torch.zeros(n, vocab).scatter_add_(1, words, torch.ones(n, 40))
    sets = torch.randperm(200, generator=g)[:100].view(2, 50) + 20
    score = counts[:, sets[0]].sum(1) - counts[:, sets[1]].sum(1)
    y = (score + 0.5 * torch.randn(n, generator=g) > 0).long()
    return counts[:2000], y[:2000], counts[2000:], y[2000:]


def token_data(seed: int) -> tuple[torch.Tensor, ...]:
    """Sequences whose label is their first (frequent) token modulo 3."""
    g = torch.Generator().manual_seed(seed)
    n = 3000
    tokens = torch.randint(0, 5000, (n, 8), generator=g)
    tokens[:, 0] = torch.randint(0, 300, (n,), generator=g)
    y = tokens[:, 0] % 3
    return tokens[:2000], y[:2000], tokens[2000:], y[2000:]


def fit_case(case: str, rule: str, seed: int) -> dict:
    """One fit at ``fit``'s defaults under ``rule``; its test scores and CPU seconds."""
    saved = rates.own_groups
    if rule == "largest":
        rates.own_groups = _largest
    try:
        return _fit_case(case, seed)
    finally:
        rates.own_groups = saved


def _fit_case(case: str, seed: int) -> dict:
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    row: dict = {}
    start = time.process_time()
    if case == "sgd":
        data = gap_regression(600, 0.1, seed)
        model = bbb.BNN(bbb.mlp([1, 50, 50, 1], activation="tanh"), bbb.likelihoods.Gaussian(), 600)
        try:
            bbb.fit(model, bbb.MeanFieldGuide(model), data.x, data.y,
                    optimizer=torch.optim.SGD, seed=seed, progress=False)  # fmt: skip
            row["outcome"] = "trained"
        except (ValueError, FloatingPointError) as error:
            row["outcome"] = f"{type(error).__name__}: {str(error)[:90]}"
        row["cpu"] = time.process_time() - start
        return row
    x, y, xt, yt = bow_data(seed) if case == "bow" else token_data(seed)
    net = bbb.mlp([10000, 50, 2]) if case == "bow" else bbb.bayesianize(TokenClassifier())
    model = bbb.BNN(net, bbb.likelihoods.Categorical(), num_data=len(x))
    guide = bbb.MeanFieldGuide(model)
    history = bbb.fit(model, guide, x, y, batch_size=100, seed=seed, progress=False)
    pred = bbb.predict(model, guide, xt, num_samples=50, seed=0)
    row |= {
        "accuracy": float((pred.predicted == yt).float().mean()),
        "nll": -pred.log_likelihood(yt),
        "epochs": len(history),
        "cpu": time.process_time() - start,
    }
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print each tensor's rate")
    parser.add_argument("--fit", nargs="*", default=[], choices=["bow", "transformer", "sgd"])
    parser.add_argument("--rules", nargs="+", default=["own", "largest"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.show:
        show()
    for case in args.fit:
        for rule in args.rules:
            for seed in args.seeds:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    row = fit_case(case, rule, seed)
                scores = "  ".join(
                    f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                )
                print(f"{case:12s} {rule:8s} seed {seed}: {scores}", flush=True)


if __name__ == "__main__":
    main()
