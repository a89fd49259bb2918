r"""``fit``'s learning rates when ``lr`` is not given: each tensor's from its layer's size.

Adam moves every parameter by about ``lr`` a step whatever the size of its gradient (Kingma
and Ba 2015, section 2.1: the effective step is bounded by the rate), so one rate means a
different thing to a weight of size 0.5 (one input feature, a tanh unit) than to a weight of
size 0.02 (a unit reading the 784 pixels of an image, under torch's default initialisation
:math:`\mathcal{U}(\pm 1/\sqrt{\text{fan\_in}})`, whose root mean square is
:math:`1/\sqrt{3\,\text{fan\_in}}`). ``fit`` gives each tensor the rate of its layer:

.. math:: \text{lr}_\ell = \min\Big(0.01,\ \tfrac1{16}\,\mathrm{rms}(W_\ell),\
    \tfrac1{16}\,\mathrm{rms}(W_{\max})\Big),

a step moves a typical weight of the layer by at most a sixteenth of its size, and no layer
moves faster than the network's largest weight tensor :math:`W_{\max}` (the one that holds
most weights) does. :math:`W_\ell` is the initial value of the layer's largest weight tensor
(a bias takes its layer's weight's rate; an all-zero tensor, whose size says nothing, the
ceiling; a guide that starts its means at zero, such as Pyro's ``AutoNormal``, reads the
model's initial value). A layer's means, a low-rank factor and the scales ρ
(:math:`\sigma = \mathrm{softplus}(\rho)`, and any parameter Pyro keeps under a positive
constraint: their unconstrained value is a log-scale) move at their layer's rate; a scale of
no layer (a learned noise) at the network's. A low-rank factor :math:`V` starts far smaller
than its layer's weights (:class:`~pyro_bbb.LowRankGuide`: a quarter of the initial variance,
spread over ``rank`` columns, so entries of about :math:`0.5\,\sigma_0/\sqrt{\text{rank}}`),
and moves at most a sixteenth of that initial size a step: at its layer's rate a step moved
each entry by more than half its size, the factor's noise-driven walk outgrew the posterior,
and rank 10 on a 1-50-50-1 regression ended at a β = 1 loss of 2.14 nats a point against
the mean-field guide's 1.23 (0.65 at the factor's own rate).

What that gives: 784-400-400-10 and the gap problem's 1-50-50-1 every tensor at the
largest one's rate, as before (1.3e-3, 5.1e-3); a transformer beside its 5,000-token
:math:`\mathcal N(0, 1)` embedding (the ceiling) its own lower ones (4.5e-3 to 7.9e-3) where
the embedding set them all at 0.01; UCI's one hidden layer 0.01 and its output layer about
5e-3. What the cap is for, measured: on 60,000 images the 400 x 400 layers at their own
size's rate (1.8e-3) took the test error from 10.6 % to 14.1 %; on the gap problem the
1-wide first layer at its own (the ceiling) cost 0.02-0.04 nats of test log-likelihood. So a
10,000-50-2 bag of words keeps 3.6e-4 for its output layer too.

An automatic run then halves every rate together where the fit stops improving
(:mod:`~pyro_bbb.training.auto_epochs`). The rule is Adam's, and holds for optimisers whose
step the rate bounds (:data:`BOUNDED_STEP`); ``fit`` refuses to choose a rate for another
(``torch.optim.SGD`` steps by the rate times the gradient of an objective summed over the
data set): pass ``lr``. :func:`tensor_rates` gives the rates and what set each one
(``python benchmarks/rates.py --show`` prints them for a few networks).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import pyro
import torch
from pyro.distributions import constraints

from ..infer.guides._base import site_guide
from ..nn.layers import initial_values
from .optimizers import BOUNDED_STEP, OptimizerSpec, make_optimizer

__all__ = [
    "BOUNDED_STEP",
    "GROUP_SPREAD",
    "MAX_LR",
    "STEP_SHARE",
    "TensorRate",
    "check_rate_choice",
    "fit_optimizer",
    "own_groups",
    "rate_groups",
    "rate_is_fits",
    "tensor_rates",
]

#: The means' rate's ceiling (and the rate of a tensor whose size says nothing).
MAX_LR = 1e-2
#: The share of a layer's weights' root mean square that a step may move its means.
STEP_SHARE = 1 / 16
#: Rates within this factor of a group's highest share the group (:func:`rate_groups`).
GROUP_SPREAD = 1.2


@dataclass(frozen=True)
class TensorRate:
    """One parameter's rate and what set it.

    Attributes:
        name: The parameter's name in Pyro's param store.
        kind: ``"loc"``, ``"factor"`` or ``"scale"``.
        rate: The learning rate ``fit`` starts it at.
        source: What set the rate (the tensor whose size it reads, or why none).
    """

    name: str
    kind: str
    rate: float
    source: str


def rate_is_fits(lr: float | None, optimizer: object) -> bool:
    """Whether ``fit`` chooses the rates: no ``lr``, and no optimiser built by the user's function.

    An optimiser class is built with ``fit``'s rates; a function sets its own, followed as
    given (an automatic run halves only rates of ``fit``'s).
    """
    return lr is None and (optimizer is None or isinstance(optimizer, type))


def check_rate_choice(lr: float | None, optimizer: object) -> None:
    """Refuse ``lr=None`` with an optimiser class whose step the rate does not bound.

    A function that builds the optimiser sets its own rate, and ``None`` is Adam.

    Raises:
        ValueError: For ``lr=None`` and an optimiser class not in :data:`BOUNDED_STEP`.
    """
    if lr is not None or not isinstance(optimizer, type):
        return
    if issubclass(optimizer, BOUNDED_STEP):
        return
    raise ValueError(
        f"optimizer={optimizer.__name__} needs lr=: fit chooses rates only for optimisers "
        "whose step the rate bounds (Adam, AdamW, Adamax, NAdam, RAdam, RMSprop, Adagrad), "
        f"and {optimizer.__name__}'s step is the rate times the gradient of the ELBO, which "
        "sums over every data point; pass lr= (e.g. 1e-3 divided by the number of points)"
    )


def tensor_rates(
    model: object, guide: object, named: Mapping[str, torch.Tensor]
) -> dict[str, TensorRate]:
    r"""The rate of every parameter ``fit`` trains when ``lr`` is not given (see the module).

    Args:
        model: The model (a :class:`~pyro_bbb.BNN`, or any model).
        guide: The guide, set up (its parameters exist): one of this package's, whose
            parameters say what they are (:meth:`~pyro_bbb.infer.guides._base.SiteGuide.
            parameter_roles`), an ensemble of them, or any other (a Pyro autoguide).
        named: Every parameter, ``{param-store name: unconstrained tensor}``.

    Returns:
        ``{param-store name: TensorRate}``, in ``named``'s order.
    """
    ours = site_guide(guide)
    roles = {} if ours is None else ours.parameter_roles()
    factor_sizes = getattr(ours, "factor_sizes", {})
    bounded = _constrained(named)
    sizes = initial_values(model) if isinstance(model, torch.nn.Module) else {}
    kinds: dict[str, tuple[str, str]] = {}
    for name in named:
        if name in roles:
            kinds[name] = roles[name]
        elif name in bounded:
            kinds[name] = ("scale", _site_of(name, sizes) or name)
        else:
            kinds[name] = ("loc", _site_of(name, sizes) or name)
    located = {n: named[n] for n, (kind, _) in kinds.items() if kind == "loc"}
    means = _mean_rates(located, kinds, sizes)
    network = _network_rate(located, means, kinds, sizes, blocks=factor_sizes)
    by_key = {kinds[n][1]: rate for n, rate in means.items()}
    rates = {}
    for name, (kind, key) in kinds.items():
        if kind == "loc":
            rates[name] = means[name]
            continue
        rate = by_key.get(key)  # a factor or a scale of a site or block: its means' rate
        size = factor_sizes.get(key) if kind == "factor" else None
        if rate is not None and size is not None and STEP_SHARE * size < rate.rate:
            source = f"its initial size (rms {size:.3g}), below its means' ({rate.source})"
            rates[name] = TensorRate(name, kind, STEP_SHARE * size, source)
        elif rate is not None:
            rates[name] = TensorRate(name, kind, rate.rate, f"its means' ({rate.source})")
        else:  # a scale of no layer (a learned noise): the network's rate
            rates[name] = TensorRate(name, kind, network.rate, f"the network's ({network.source})")
    return rates


def _network_rate(
    means: Mapping[str, torch.Tensor],
    rates: dict[str, TensorRate],
    kinds: Mapping[str, tuple[str, str]],
    sites: Mapping[str, torch.Tensor],
    blocks: Collection[str] = (),
) -> TensorRate:
    """The network's rate, its largest weight tensor's; every mean's is capped by it, in place.

    A low-rank guide's means are one vector a block (``blocks``, its layers): the largest
    block stands for the largest weight tensor.

    Measured: on 784-400-400-10 and 60,000 images, the hidden 400 x 400 layers at their own
    size's rate (1.8e-3, against the 784-wide layer's 1.3e-3) took the test error from
    10.6 % to 14.1 %; on the gap problem the 1-wide first layer at its own (the ceiling,
    against the 50 x 50 layer's 5.1e-3) cost 0.02-0.04 nats of test log-likelihood. A layer
    whose weights are smaller than the largest tensor's (a transformer's beside a
    5,000-token N(0, 1) embedding) keeps its own, lower rate.
    """
    tables = [
        n for n in means if _size_tensor(n, means, kinds, sites).dim() >= 2 or kinds[n][1] in blocks
    ]
    if not tables:
        return TensorRate("", "loc", MAX_LR, "no weight tensor: the ceiling")
    largest = rates[max(tables, key=lambda n: means[n].numel())]
    for name, rate in rates.items():
        if rate.rate > largest.rate:
            rates[name] = TensorRate(
                name, rate.kind, largest.rate, f"the network's, {largest.source}, below its own"
            )
    return largest


def _constrained(named: Mapping[str, torch.Tensor]) -> set[str]:
    """The parameters Pyro's param store keeps under a constraint other than the reals."""
    kept = pyro.get_param_store().get_state()["constraints"]
    return {
        name
        for name in named
        if name in kept and not isinstance(kept[name], type(constraints.real))
    }


def _site_of(name: str, sites: Mapping[str, torch.Tensor]) -> str | None:
    """The model's site a parameter of another guide is named after (``AutoNormal.locs.w``)."""
    found = [site for site in sites if name == site or name.endswith("." + site)]
    return max(found, key=len, default=None)


def _mean_rates(
    means: Mapping[str, torch.Tensor],
    kinds: Mapping[str, tuple[str, str]],
    sites: Mapping[str, torch.Tensor],
) -> dict[str, TensorRate]:
    """Each mean's rate from its layer's weight: the layer's largest tensor of 2+ dims."""
    layers: dict[tuple[str, str], list[str]] = {}
    for name in means:
        key = kinds[name][1]
        # the module: "fc1" of site "fc1.weight", under the parameter's own root
        root = name[: len(name) - len(key)] if name.endswith(key) else name
        layers.setdefault((root, key.rpartition(".")[0]), []).append(name)

    def rate_of(name: str) -> tuple[float, str]:
        return _rate_of(name, _size_tensor(name, means, kinds, sites))

    rates = {}
    for members in layers.values():
        tables = [n for n in members if _size_tensor(n, means, kinds, sites).dim() >= 2]
        reference = max(tables, key=lambda n: means[n].numel(), default=None)
        shared = None if reference is None else rate_of(reference)  # once a layer
        for name in members:
            rates[name] = TensorRate(name, "loc", *(shared or rate_of(name)))
    return rates


def _size_tensor(
    name: str,
    means: Mapping[str, torch.Tensor],
    kinds: Mapping[str, tuple[str, str]],
    sites: Mapping[str, torch.Tensor],
) -> torch.Tensor:
    """The tensor whose size sets a mean's rate: its own, or its site's initial value.

    A guide that starts its means at zero (Pyro's ``AutoNormal``) says nothing of the
    weights' size; the model's initial value of the site does.
    """
    tensor = means[name]
    site = sites.get(kinds[name][1])
    if site is not None and not bool(tensor.detach().ne(0).any()):
        return site
    return tensor


def _rate_of(name: str, tensor: torch.Tensor) -> tuple[float, str]:
    """``min(MAX_LR, STEP_SHARE rms)`` of a tensor, and a word on where it came from."""
    size = float(tensor.detach().double().pow(2).mean().sqrt()) if tensor.numel() else 0.0
    if not (size > 0 and math.isfinite(size)):
        return MAX_LR, f"{name} (all zero: the ceiling)"
    return min(MAX_LR, STEP_SHARE * size), f"{name} (rms {size:.3g})"


def rate_groups(
    params: list[torch.Tensor], named: Mapping[str, torch.Tensor], rates: Mapping[str, TensorRate]
) -> list[dict[str, Any]]:
    """The optimiser's parameter groups: rates within :data:`GROUP_SPREAD` share one.

    Each group is one more pass of the optimiser's kernel a step (about 20-40 µs on a busy
    CPU, against a 1-50-50-1 step's 1-2 ms): tensors whose rates lie within a factor of
    :data:`GROUP_SPREAD` of the group's highest share its largest tensor's rate, so that
    layers of one width, whose sizes differ by their random draws alone, are one group. The
    largest tensor's group comes first (``History.lr`` records it).

    Args:
        params: The parameters the optimiser trains, in its order.
        named: ``{param-store name: tensor}``.
        rates: :func:`tensor_rates`.

    Returns:
        ``[{"params": [...], "lr": rate}]``, each group's parameters in ``params``' order.
    """
    rate_of = {id(tensor): rates[name].rate for name, tensor in named.items() if name in rates}
    own = [rate_of.get(id(tensor), MAX_LR) for tensor in params]
    members: list[list[int]] = []
    for rate in sorted(set(own), reverse=True):
        same = [i for i, r in enumerate(own) if r == rate]
        if members and own[members[-1][0]] <= GROUP_SPREAD * rate:
            members[-1] += same
        else:
            members.append(same)
    largest = max(range(len(params)), key=lambda i: params[i].numel())
    members.sort(key=lambda group: largest not in group)
    groups = []
    for group in members:
        group.sort()
        lead = max(group, key=lambda i: params[i].numel())
        groups.append({"params": [params[i] for i in group], "lr": own[lead]})
    return groups


def own_groups(
    model: object, guide: object, named: Mapping[str, torch.Tensor], params: list[torch.Tensor]
) -> list[dict[str, Any]]:
    """``fit``'s own parameter groups: :func:`rate_groups` of :func:`tensor_rates`."""
    return rate_groups(params, named, tensor_rates(model, guide, named))


def fit_optimizer(
    spec: OptimizerSpec | None, lr: float | None, own: bool, model: object, guide: object,
    objective: Any,
) -> torch.optim.Optimizer:  # fmt: skip
    """The optimiser of a fit: at ``fit``'s own rates (``own``), or at ``lr`` (one group).

    Args:
        spec: ``fit``'s ``optimizer``.
        lr: ``fit``'s ``lr``.
        own: Whether ``fit`` chooses the rates (:attr:`~.checkpoint.Checkpointing.own_rates`).
        model: The model.
        guide: The guide, set up.
        objective: What the fit steps on (its ``named`` and ``params``,
            :class:`~pyro_bbb.training.objective.Objective`).
    """
    named, params = objective.named, objective.params
    groups = own_groups(model, guide, named, params) if own else None
    return make_optimizer(spec, params, MAX_LR if lr is None else lr, groups=groups)
