"""How the UCI protocol trains and scores every split: :class:`UCIConfig`.

The options only, checked once: the protocol that uses them is :mod:`pyro_bbb.bench.uci`,
the results that record them :mod:`pyro_bbb.bench.uci_results`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._validation import (
    check_choice,
    check_int,
    check_nonnegative_number,
    check_open_unit_interval,
    check_positive_number,
)
from ..infer.reparam import estimator_names

__all__ = ["UCIConfig"]


@dataclass(frozen=True)
class UCIConfig:
    """How every split is trained and scored; one config serves all methods and data sets.

    Attributes:
        epochs: Passes over the training rows (the folders' ``n_epochs.txt`` says 40, too few
            for mean-field VI; see ``docs/benchmarks.md``); ``None`` trains every method for
            :func:`~pyro_bbb.fit`'s default length, until more training stops improving the
            predictive (``fit(epochs=None)``, ``until="predictive"``, which places
            the BNN's β warm-up itself: ``hold`` and ``warmup`` are then not used).
        batch_size: Minibatch size; ``None`` (the default) trains on the full batch, one step
            per epoch.
        lr: Adam learning rate; ``None`` (the default) for ``fit``'s own, a rate per layer
            from its weights' size (:mod:`~pyro_bbb.training.rates`): the hidden layer's
            0.01 (the ceiling) for up to 13 features, 9.0e-3 for naval's 16, 3.8e-3 for
            year's 90, and the output layer's about 5.1e-3 for 50 hidden units (3.6e-3 for
            100), halved together by an automatic run where they stop paying.
        guide: The BNN's guide, ``"meanfield"`` or ``"lowrank"``.
        rank: Rank of the low-rank guide (one block per layer).
        reparam: Gradient estimator of the BNN: ``None``, ``"local"`` or ``"flipout"``.
        init_scale: Initial posterior std of every weight (BNN).
        hold: Epochs at β = 0 before the warm-up, as a fraction of ``epochs`` (BNN): the
            likelihood first, as :func:`~pyro_bbb.fit` does by default.
        warmup: Length of the linear KL warm-up from β = 0, as a fraction of ``epochs`` (BNN).
        beta: β after the warm-up (BNN); 1 is the ELBO.
        noise_init: Initial noise std, in standardized target units (all methods).
        dropout: Dropout probability of ``"mc_dropout"``.
        members: Members of ``"bnn_ensemble"`` and ``"deep_ensemble"``.
        num_particles: Weight samples per training step (BNN); 1, as the published
            comparison in ``docs/benchmarks.md`` was made; ``None`` takes
            :func:`~pyro_bbb.fit`'s default, which is also 1 for these networks on full
            batches except yacht's (2).
        num_samples: Weight (or dropout-mask) samples per prediction; an ensemble of BNNs
            draws ``num_samples // members`` of each member.
        n_hidden: Hidden units; ``None`` takes each folder's ``n_hidden.txt`` (50 if absent).
        seed: Split ``k`` is trained with seed ``seed + k``, the same for every method.
    """

    epochs: int | None = 2000
    batch_size: int | None = None
    lr: float | None = None
    guide: Literal["meanfield", "lowrank"] = "meanfield"
    rank: int = 2
    reparam: str | None = "local"
    init_scale: float = 1e-2
    hold: float = 0.25
    warmup: float = 0.25
    beta: float = 1.0
    noise_init: float = 0.5
    dropout: float = 0.05
    members: int = 5
    num_particles: int | None = 1
    num_samples: int = 100
    n_hidden: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_samples", "rank", "members"):
            check_int(name, getattr(self, name))
        check_int("epochs", self.epochs, optional=True)
        if self.epochs is None and self.beta != 1:
            raise ValueError(
                f"epochs=None warms beta up to 1 itself; beta={self.beta} needs a fixed epochs"
            )
        check_int("batch_size", self.batch_size, optional=True)
        check_int("num_particles", self.num_particles, optional=True)
        check_int("n_hidden", self.n_hidden, optional=True)
        check_choice("guide", self.guide, ("meanfield", "lowrank"))
        check_choice("reparam", self.reparam, estimator_names())
        if self.lr is not None:
            check_positive_number("lr", self.lr)
        for name in ("init_scale", "warmup", "noise_init"):
            check_positive_number(name, getattr(self, name))
        check_nonnegative_number("beta", self.beta)
        check_nonnegative_number("hold", self.hold)
        if self.hold + self.warmup > 1:
            raise ValueError(
                f"hold + warmup must be at most 1 (fractions of epochs), got {self.hold} + "
                f"{self.warmup}"
            )
        check_open_unit_interval("dropout", self.dropout)
