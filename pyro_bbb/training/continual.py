r"""Variational continual learning: a sequence of tasks, each posterior the next task's prior.

Variational continual learning (VCL; Nguyen et al. 2018, https://arxiv.org/abs/1710.10628)
learns tasks :math:`t = 1, 2, \dots` one after another with a Gaussian approximation of the
recursion :math:`p(w \mid D_{1:t}) \propto p(D_t \mid w)\, p(w \mid D_{1:t-1})`:

.. math::

    q_t = \arg\max_q \; \mathbb{E}_q[\log p(D_t \mid w)] - \mathrm{KL}(q \,\|\, q_{t-1}),
    \qquad q_0 = p(w).

:class:`VCL` is a small loop over :func:`~pyro_bbb.fit` that keeps this chain as a
:func:`~pyro_bbb.priors.from_guide` prior (:attr:`VCL.posterior`); the model, guide and
training are the ordinary :class:`~pyro_bbb.BNN`, guides and ``fit``. As in the paper:

* a network built on :class:`~pyro_bbb.nn.MultiHead` has a shared body and one head per task;
  each head keeps the prior it was built with until the task that first trains it;
* an optional *coreset* of each task (random or k-center, :mod:`~pyro_bbb.training.coresets`) is
  held out of training; before predicting, a copy of the posterior is fine-tuned on the
  coresets (of the head's tasks, or of all tasks for a single head), and the chain continues
  from the posterior that never saw them.

This module holds :class:`VCL`; the data of the tasks is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pyro
import pyro.poutine as poutine
import torch
from pyro.poutine.util import site_is_subsample

from .._pyro_compat import site_name
from .._validation import check_choice, check_int
from ..infer.guides import MeanFieldGuide
from ..infer.predictive import ClassificationPrediction, RegressionPrediction, predict
from ..infer.sites import prior_trace
from ..model import BNN
from ..nn import BayesianLayer, MultiHead
from ..priors import PosteriorPrior, from_guide
from .coresets import CoresetMethod, select_coreset
from .history import History
from .loop import fit

__all__ = ["VCL"]

GuideFactory = Callable[..., Any]
"""Builds a guide: ``guide(model, *, init_loc=..., name=...)``, e.g. ``MeanFieldGuide``."""


class VCL:
    r"""Variational continual learning over a sequence of tasks (Nguyen et al. 2018).

    ``vcl.fit(x, y, head=t)`` learns task ``t``: it sets the model's ``num_data`` to the
    task's size and every site it has a posterior for to that posterior as its prior, trains a
    new guide with :func:`~pyro_bbb.fit`, and adds the guide's posterior to the chain. The new
    guide's means start at the previous posterior's means (new sites at the network's own
    initialisation) and its scales at the guide's ``init_scale``: small, so that the first
    steps see the previous solution rather than noise around it. ``vcl.predict(x, head=t)``
    draws from the chain (or from a posterior fine-tuned on the coresets).

    Args:
        model: A :class:`~pyro_bbb.BNN` (its ``num_data`` is set for each task); for
            task-specific heads, its network made from a :class:`~pyro_bbb.nn.MultiHead`. The
            priors its layers have now are the first task's, and each head's until the head is
            first trained.
        guide: A guide class or factory called as ``guide(model, init_loc=..., name=...)``:
            :class:`~pyro_bbb.MeanFieldGuide` (the default, as in the paper) or e.g.
            ``functools.partial(LowRankGuide, rank=10)``.
        coreset: ``None`` (no coreset), ``"random"`` or ``"k-center"``.
        coreset_size: Points of each task held out for the coreset (with ``coreset``).
        finetune: Options of the coreset fine-tuning ``fit`` (``epochs``, ``lr``, …);
            default: those of the last task's ``fit``.
        propagate: ``True``: each posterior is the next prior (VCL). ``False``: every task is
            learned under the network's first priors, starting from the previous means:
            naive sequential fine-tuning, the baseline VCL is compared against.
        name: Prefix of the guides' names in Pyro's param store (``<name>.task0``, …, and
            ``<name>.coreset<head>`` for fine-tuning); parameters under these names are
            replaced. Give two runs in one process different names.
        seed: Seed of the random coresets.

    Raises:
        TypeError: If ``model`` is not a BNN with a Bayesian layer.
        ValueError: On a bad coreset choice or size.
    """

    def __init__(
        self,
        model: BNN,
        *,
        guide: GuideFactory = MeanFieldGuide,
        coreset: CoresetMethod | None = None,
        coreset_size: int = 0,
        finetune: Mapping[str, Any] | None = None,
        propagate: bool = True,
        name: str = "VCL",
        seed: int = 0,
    ) -> None:
        if not isinstance(model, BNN):
            raise TypeError(f"model must be a pyro_bbb.BNN, got {type(model).__name__}")
        self._sites = _bayesian_sites(model.net)
        if not self._sites:
            raise TypeError("the model's network has no Bayesian layer")
        if coreset is not None:
            check_choice("coreset", coreset, ("random", "k-center"))
            check_int("coreset_size", coreset_size)
        elif coreset_size:
            raise ValueError("coreset_size needs a coreset method: coreset='random' or 'k-center'")
        self.model, self.net, self.guide_factory = model, model.net, guide
        self.coreset, self.coreset_size = coreset, coreset_size
        self.finetune = None if finetune is None else dict(finetune)
        self.propagate, self.name = bool(propagate), name
        self._initial = {site: layer.priors[param] for site, (layer, param) in self._sites.items()}
        self._generator = torch.Generator().manual_seed(seed)
        #: The chain: every site's latest posterior, a prior specification.
        self.posterior: PosteriorPrior | None = None
        #: The guide of the last task.
        self.guide = None
        #: One :class:`History` per task.
        self.histories: list[History] = []
        #: The coresets held out so far: ``(x, y, head)`` per task.
        self.coresets: list[tuple[torch.Tensor, torch.Tensor, int | None]] = []
        self._fit_options: dict[str, Any] = {}
        self._finetuned: dict[int | None, Any] = {}

    @property
    def num_tasks(self) -> int:
        """Tasks learned so far."""
        return len(self.histories)

    def fit(
        self, x: torch.Tensor, y: torch.Tensor, *, head: int | None = None, **options: Any
    ) -> History:
        """Learn one task, starting from the posterior of the tasks before.

        Args:
            x: The task's features ``(N, *features)``.
            y: Its targets ``(N,)``.
            head: The task's head of a :class:`~pyro_bbb.nn.MultiHead` network (required
                there; ``None`` for a single-head network).
            **options: Passed to :func:`~pyro_bbb.fit` (``epochs``, ``batch_size``, ``lr``,
                ``beta``, ``reparam``, ``seed``, …). ``beta`` defaults to 1, the plain ELBO
                of Nguyen et al. (2018), not ``fit``'s likelihood-first schedule: holding
                the KL to the previous tasks' posterior at zero for a quarter of the epochs
                would let the network forget them.

        Returns:
            The task's :class:`History`.
        """
        self._check_head(head)
        options.setdefault("beta", 1.0)
        coreset = None
        if self.coreset is not None:
            chosen, rest = select_coreset(
                x, self.coreset_size, method=self.coreset, generator=self._generator
            )
            coreset = (x[chosen], y[chosen], head)
            x, y = x[rest], y[rest]
        model = self._model(head, len(x), carried=self.propagate)
        guide = self._guide(x[: options.get("batch_size") or len(x)], f"task{self.num_tasks}")
        history = fit(model, guide, x, y, **options)
        if coreset is not None:
            self.coresets.append(coreset)
        carried = from_guide(guide)
        previous = {} if self.posterior is None else dict(self.posterior)
        self.posterior = PosteriorPrior({**previous, **carried}, source=carried.source)
        self.guide, self._fit_options = guide, dict(options)
        self._finetuned = {}
        self.histories.append(history)
        return history

    def predict(
        self, x: torch.Tensor, *, head: int | None = None, **options: Any
    ) -> RegressionPrediction | ClassificationPrediction:
        """Predict a task's targets from the posterior of every task learned so far.

        Without a coreset, the weights are drawn from the chain: each site's latest
        posterior (for a multi-head network, the body's from the last task and the head's
        from the last task that trained it). With a coreset, a copy of the chain is first
        fine-tuned on the coresets of this head's tasks (all tasks for a single head), with
        the chain as its prior; the fine-tuned guide is kept until the next ``fit``.

        Args:
            x: Inputs ``(batch, *features)``.
            head: The task's head (multi-head networks).
            **options: Passed to :func:`~pyro_bbb.predict` (``num_samples``, ``seed``, …).

        Returns:
            The prediction of :func:`~pyro_bbb.predict`.
        """
        self._check_head(head)
        coresets = [(xc, yc) for xc, yc, h in self.coresets if h == head]
        if not coresets:
            model = self._model(head, len(x), carried=True)
            return predict(model, _chain_draws(model), x, **options)
        if head not in self._finetuned:
            xc = torch.cat([xc for xc, _ in coresets])
            yc = torch.cat([yc for _, yc in coresets])
            model = self._model(head, len(xc), carried=True)
            guide = self._guide(xc, f"coreset{'' if head is None else head}")
            options_ft = self._fit_options if self.finetune is None else self.finetune
            fit(model, guide, xc, yc, **options_ft)
            self._finetuned[head] = guide
        model = self._model(head, len(x), carried=True)
        return predict(model, self._finetuned[head], x, **options)

    # -- helpers
    def _check_head(self, head: int | None) -> None:
        if isinstance(self.net, MultiHead):
            if head is None:
                raise ValueError("head is required: the network is a MultiHead")
            self.net.head = head  # checks the range
        elif head is not None:
            raise ValueError(f"head must be None for a single-head network, got {head!r}")

    def _configure(self, head: int | None, *, carried: bool) -> None:
        """Activate ``head`` and give every site its prior: the chain's if ``carried``."""
        if head is not None:
            self.net.head = head
        chain = self.posterior if carried and self.posterior is not None else {}
        for site, (layer, param) in self._sites.items():
            layer.priors[param] = chain.get(site, self._initial[site])

    def _model(self, head: int | None, num_data: int, *, carried: bool) -> BNN:
        """The model with ``head`` active and ``num_data`` set, under the chain if ``carried``."""
        self._configure(head, carried=carried)
        self.model.num_data = num_data
        return self.model

    def _guide(self, x: torch.Tensor, label: str):
        """A fresh guide named ``<name>.<label>``, its means at the chain's means.

        ``x`` is a minibatch the model is traced on (BatchNorm needs more than one row).
        """
        name = f"{self.name}.{label}"
        store = pyro.get_param_store()
        for key in [k for k in store if k.startswith(f"{name}.")]:
            del store[key]
        means = {} if self.posterior is None else self.posterior.means()
        trace = prior_trace(self.model, x.to(self.model.device))
        observed = self.model.observation_site
        active = {n for n, _ in trace.iter_stochastic_nodes() if n != observed}
        init = {site: mean for site, mean in means.items() if site in active}
        return self.guide_factory(self.model, init_loc=init, name=name)


def _chain_draws(model: BNN):
    """A guide that draws every latent site from the model's prior, here the chain.

    The model itself with all but its latent sites hidden: ``predict`` records its draws and
    replays the model on them, so every chunk of the inputs sees the same weights.
    """
    observed = model.observation_site

    def hidden(msg) -> bool:
        return msg["type"] != "sample" or msg["name"] == observed or site_is_subsample(msg)

    return poutine.block(model, hide_fn=hidden)


def _bayesian_sites(net: torch.nn.Module) -> dict[str, tuple[BayesianLayer, str]]:
    """``{site name: (layer, parameter name)}`` of every Bayesian parameter of ``net``."""
    sites = {}
    for module in net.modules():
        if isinstance(module, BayesianLayer):
            for param in module.bayesian_parameters:
                name = site_name(module, param)
                sites[name] = (module, param)
    return sites
