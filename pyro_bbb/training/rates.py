r"""``fit``'s learning rates when ``lr`` is not given: each tensor's from its own size.

Adam moves every parameter by about ``lr`` a step whatever the size of its gradient (Kingma
and Ba 2015, section 2.1: the effective step is bounded by the rate), so one rate means a
different thing to a weight of size 0.5 (one input feature, a tanh unit) than to a weight of
size 0.02 (a unit reading the 784 pixels of an image, under torch's default initialisation
:math:`\mathcal{U}(\pm 1/\sqrt{\text{fan\_in}})`, whose root mean square is
:math:`1/\sqrt{3\,\text{fan\_in}}`). ``fit`` therefore gives each tensor a rate on its own
scale, one parameter group of the optimiser per rate:

* **means** (the guide's ``locs``, a low-rank block's factor, the model's point estimates):
  :math:`\min\big(0.01,\ \tfrac1{16}\,\mathrm{rms}(W)\big)`, a step moves a typical weight
  by at most a sixteenth of its size, :math:`W` the initial value of the layer's weight
  (a bias takes its layer's weight's rate; an all-zero tensor, whose size says nothing,
  the ceiling). 784-400-400-10 gets 1.3e-3 for its first layers and 3.6e-3 for its last;
  a 5,000-token embedding of :math:`\mathcal N(0, 1)` rows the ceiling, the rest of a
  transformer its own;
* **scales** (ρ, with :math:`\sigma = \mathrm{softplus}(\rho) \approx e^\rho` for small σ,
  and every parameter Pyro's param store keeps under a positive constraint, such as a
  learned noise scale: their unconstrained value is a log-scale): :data:`SCALE_LR`, a
  relative change of σ a step that is the same for a weight of any size.

An automatic run then halves every rate together where the fit stops improving
(:mod:`~pyro_bbb.training.auto_epochs`). The rule is Adam's, and holds for optimisers whose
step the rate bounds (:data:`BOUNDED_STEP`); ``fit`` refuses to choose a rate for another
(``torch.optim.SGD`` steps by the rate times the gradient of an objective summed over the
data set): pass ``lr``. :func:`tensor_rates` gives the rates and what set each one
(``python benchmarks/rates.py --show`` prints them for a few networks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyro
import torch
from pyro.distributions import constraints

from ..infer.guides._base import SiteGuide
from ..nn.layers import initial_values
from .optimizers import OptimizerSpec, make_optimizer

__all__ = [
    "BOUNDED_STEP",
    "MAX_LR",
    "SCALE_LR",
    "STEP_SHARE",
    "TensorRate",
    "check_rate_choice",
    "fit_optimizer",
    "own_groups",
    "rate_groups",
    "tensor_rates",
]

#: The means' rate's ceiling (and the rate of a tensor whose size says nothing).
MAX_LR = 1e-2
#: The share of a layer's weights' root mean square that a step may move its means.
STEP_SHARE = 1 / 16
#: The rate of the scale parameters: ρ, and positive parameters' logarithms.
SCALE_LR = 1e-2
#: Optimisers whose step the rate bounds, for which ``fit`` chooses rates: Adam and its
#: kin, RMSprop and Adagrad (subclasses too).
BOUNDED_STEP: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.RMSprop,
    torch.optim.Adagrad,
)


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
    roles = _roles(guide)
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
    means = _mean_rates(
        {n: named[n] for n, (kind, _) in kinds.items() if kind == "loc"}, kinds, sizes
    )
    by_key = {kinds[n][1]: rate for n, rate in means.items()}
    rates = {}
    for name, (kind, key) in kinds.items():
        if kind == "loc":
            rates[name] = means[name]
            continue
        rate = by_key.get(key)  # a factor or a scale of a site or block: its means' rate
        if rate is not None:
            rates[name] = TensorRate(name, kind, rate.rate, f"its means' ({rate.source})")
        else:  # a scale of its own (a learned noise): a relative change a step
            rates[name] = TensorRate(name, kind, SCALE_LR, "a scale of no layer: SCALE_LR")
    return rates


def _roles(guide: object) -> dict[str, tuple[str, str]]:
    """``{param-store name: (kind, key)}`` of this package's guides (an ensemble's members)."""
    for candidate in (guide, getattr(guide, "members", None)):
        if isinstance(candidate, SiteGuide):
            return candidate.parameter_roles()
    return {}


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
    rates = {}
    for members in layers.values():
        tables = [n for n in members if _size_tensor(n, means, kinds, sites).dim() >= 2]
        reference = max(tables, key=lambda n: means[n].numel(), default=None)
        for name in members:
            source = name if reference is None else reference
            rates[name] = TensorRate(
                name, "loc", *_rate_of(source, _size_tensor(source, means, kinds, sites))
            )
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
    """The optimiser's parameter groups: one per rate, the largest tensor's group first.

    ``History.lr`` records the first group's rate.

    Args:
        params: The parameters the optimiser trains, in its order.
        named: ``{param-store name: tensor}``.
        rates: :func:`tensor_rates`.

    Returns:
        ``[{"params": [...], "lr": rate}]``, each group's parameters in ``params``' order.
    """
    rate_of = {id(tensor): rates[name].rate for name, tensor in named.items() if name in rates}
    groups: dict[float, list[torch.Tensor]] = {}
    for tensor in params:
        groups.setdefault(rate_of.get(id(tensor), MAX_LR), []).append(tensor)
    largest = max(params, key=torch.Tensor.numel)
    order = sorted(groups, key=lambda rate: all(p is not largest for p in groups[rate]))
    return [{"params": groups[rate], "lr": rate} for rate in order]


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
