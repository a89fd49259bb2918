r"""The Bayesian neural network as one Pyro model.

:class:`BNN` joins a Bayesian network (from :func:`~pyro_bbb.nn.bayesianize` or
:func:`~pyro_bbb.nn.mlp`) and a likelihood into ``model(x, y=None)``, with the data plate
that makes minibatch training exact in expectation: a batch of ``B`` of the ``N`` training
points has its log-likelihood scaled by :math:`N/B`, and the weights' prior counts once.
Nothing here knows of guides or training.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyro
import pyro.poutine as poutine
import torch
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule
from torch import nn

from ._pyro_compat import root_network, run_context, set_cached_value
from ._validation import (
    check_features,
    check_finite_tensor,
    check_int,
    check_same_rows,
    check_tensor,
)
from .likelihoods import Likelihood
from .nn.draws import kept_buffers
from .nn.layers import BayesianLayer
from .nn.network_summary import NetworkSummary, summary

__all__ = ["BNN", "check_network_output"]


class BNN(PyroModule):
    r"""A Bayesian neural network as a Pyro model :math:`p(y, w \mid x)`.

    .. math::

        w \sim p(w), \qquad y_i \mid x_i, w \sim p(y_i \mid f_w(x_i)),
        \quad i \in \text{plate}(N)

    ``model(x, y)`` on a minibatch of ``B`` rows observes ``y`` at the site ``"obs"``
    inside ``pyro.plate("data", N)`` subsampled to ``B``, so Pyro scales its log-likelihood
    by ``N / B``. ``model(x)`` samples ``"obs"`` for prediction, with the plate sized to
    ``x``. The network's sites keep their own names (``"fc1.weight"``, not
    ``"net.fc1.weight"``). It works unchanged with ``pyro.infer.SVI``, ``Predictive``,
    ``pyro.render_model``, MCMC and any autoguide.

    Args:
        net: A Bayesian network (``PyroModule``), e.g. ``mlp([1, 50, 1])``.
        likelihood: The observation model, e.g. ``likelihoods.Gaussian()``.
        num_data: ``N``, the number of training points.
        name: Prefix of the model's site and parameter names (``"a"`` gives ``"a.0.weight"``
            and ``"a.likelihood.scale"``). Pyro's param store is global: two models in one
            process with the same (default, empty) name share their point estimates, such
            as a learned noise scale.

    Raises:
        TypeError: If ``net`` is not a ``PyroModule`` or ``likelihood`` not a ``Likelihood``.
        ValueError: If ``num_data`` is not a positive int.
    """

    #: The model's data plate is the only plate; particle plates go at dim -2.
    max_plate_nesting = 1
    #: Name of the observation site.
    observation_site = "obs"
    #: The network's names do not appear in site names (see :func:`~pyro_bbb.nn.network_summary`).
    unnamed_children = ("net",)

    def __init__(
        self, net: nn.Module, likelihood: Likelihood, num_data: int, *, name: str = ""
    ) -> None:
        if not isinstance(net, PyroModule):
            raise TypeError(
                "net must be a Bayesian PyroModule, e.g. bayesianize(module) or "
                f"mlp([...]); got {type(net).__name__}"
            )
        if not isinstance(likelihood, Likelihood):
            raise TypeError(
                "likelihood must be a pyro_bbb.likelihoods.Likelihood such as Gaussian(); "
                f"got {type(likelihood).__name__}"
            )
        check_int("num_data", num_data)
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        super().__init__(name=name)
        self.net = net
        self.likelihood = likelihood
        self.num_data = num_data
        # Root the network's sites at the model's name, so they read "fc1.weight" (or
        # "name.fc1.weight"), not "net.fc1.weight".
        root_network(net, name, self)
        self.accepts_token_ids = _first_layer_takes_tokens(net)

    def __getattr__(self, name: str):
        # PyroModule renames a child whose name is "" on every attribute access; reading
        # the network straight from _modules keeps its sites rooted at the model's name.
        if name == "net" and "net" in self.__dict__.get("_modules", {}):
            return self._modules["net"]
        return super().__getattr__(name)

    @property
    def device(self) -> torch.device:
        """The device of the network's parameters and priors."""
        for tensor in self.net.buffers():
            return tensor.device
        for tensor in self.net.parameters():
            return tensor.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype | None:
        """The floating dtype of the network's parameters and priors (``None`` if it has none)."""
        for tensor in (*self.net.buffers(), *self.net.parameters()):
            if torch.is_floating_point(tensor):
                return tensor.dtype
        return None

    def network_at(self, weights: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The network's output with its Bayesian weights at given values, drawing nothing.

        Inside a run of the model a ``PyroSample`` attribute returns the value cached under
        its site name before it would issue a ``pyro.sample`` statement, so the network's own
        ``forward`` runs on ``weights``: a pure function of them, for :mod:`torch.func`
        (Jacobians, JVPs, ``vmap``), with no trace. Weights without sample dims make it one
        pass of the network.

        Args:
            weights: ``{site name: value of the site's shape}`` for every Bayesian weight.
            x: Inputs ``(batch, *features)``.

        Returns:
            The network's output, ``(batch, C)``.
        """
        with run_context(self):
            for name, value in weights.items():
                set_cached_value(self, name, value)
            return self.net(x)

    def summary(self, *, reparam: str | None = None) -> NetworkSummary:
        """Every parameter: sample site or point estimate, shape, prior, estimator, size.

        ``print(model.summary())`` prints the table; see
        :func:`~pyro_bbb.nn.network_summary.summary`.
        """
        return summary(self, reparam=reparam)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Run the model.

        Args:
            x: Features ``(batch, *features)`` on the model's device: floating point of the
                weights' dtype, or integer token ids when the network's first layer is an
                ``nn.Embedding`` (:attr:`accepts_token_ids`).
            y: Targets ``(batch,)`` or ``(batch, dim)``, or ``None`` to sample them.

        Returns:
            The observed or sampled targets, ``(*sample, batch[, dim])``.

        Raises:
            ValueError: On integer features (but token ids), features of another dtype than
                the weights, mismatched batch sizes or devices, a batch larger than
                ``num_data``, or targets the likelihood cannot take.
            TypeError: If the network returns something other than a tensor.
        """
        self.check_inputs(x, y)
        output = self.net(x)
        if not isinstance(output, torch.Tensor):
            raise TypeError(
                f"the network returned a {type(output).__name__}, but a BNN's likelihood reads "
                "one tensor (batch, ...); return it alone (e.g. forward's `return out` for "
                "`return out, extra`), or call the network in a Pyro model of your own, which "
                "may take any output"
            )
        batch = x.shape[0]
        check_network_output(output, batch)
        if y is None:
            plate = pyro.plate("data", batch)
        else:
            self.likelihood.check_target(y, output.shape[-1], values=is_validation_enabled())
            y = self.likelihood.as_observation(y, output)
            subsample = None if batch == self.num_data else self._subsample(batch, x.device)
            plate = pyro.plate("data", self.num_data, subsample=subsample)
        with plate:
            return pyro.sample(self.observation_site, self.likelihood(output), obs=y)

    def _subsample(self, batch: int, device: torch.device) -> torch.Tensor:
        """``arange(batch)``, kept between calls.

        Which rows a minibatch holds does not matter to the model, only how many (for the
        ``N / B`` scale).
        """
        cached = self.__dict__.get("_subsample_cache")
        if cached is None or cached.shape[0] != batch or cached.device != device:
            cached = torch.arange(batch, device=device)
            self.__dict__["_subsample_cache"] = cached
        return cached

    def check_inputs(self, x: torch.Tensor, y: torch.Tensor | None = None) -> None:
        """Refuse inputs (and targets) the model cannot take, before it runs on them.

        What :meth:`forward` checks first; :func:`~pyro_bbb.predict` checks ``x`` so before it
        runs the network on a few of its rows.

        Args:
            x: Features ``(batch, *features)``.
            y: Targets ``(batch[, dim])``, or ``None``.

        Raises:
            ValueError: As :meth:`forward` says, naming the argument, what was expected and
                what came (one point without its batch dim: ``x.unsqueeze(0)``).
        """
        check_features("x", x, self.dtype, tokens=self.accepts_token_ids)
        if x.dim() < 2:
            raise ValueError(
                f"x must be (batch, *features), got shape {tuple(x.shape)}; for one point, "
                "pass it with its batch dim: x.unsqueeze(0)"
            )
        device = self.device
        if x.device != device:
            raise ValueError(
                f"x is on {x.device} but the model is on {device}; move x with "
                f"x.to({str(device)!r}), or the model with model.to({str(x.device)!r}) "
                "(fit(..., device=) moves model, guide and data)"
            )
        if y is None:
            return
        check_tensor("y", y)
        if y.device != x.device:
            raise ValueError(f"y is on {y.device} but x is on {x.device}")
        check_same_rows(x, y)
        if x.shape[0] > self.num_data:
            raise ValueError(
                f"the batch has {x.shape[0]} rows but num_data={self.num_data}; "
                "num_data must be the size of the whole training set"
            )
        if is_validation_enabled() and x.is_floating_point():
            check_finite_tensor("x", x)


def _first_layer_takes_tokens(net: nn.Module) -> bool:
    """Whether the first module with parameters (in registration order) is an embedding."""
    for module in net.modules():
        if isinstance(module, BayesianLayer) or module._parameters:
            wrapped = getattr(module, "wrapped_type", type(module))
            return issubclass(wrapped, (nn.Embedding, nn.EmbeddingBag))
    return False


def checked_network_output(net: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The network's output on ``x``, once checked (:func:`check_network_output`).

    The network runs once, weights drawn from their priors, nothing recorded and its buffers
    (a BatchNorm's statistics) left as they were: a check of shapes, before a fit's first
    step or where a prediction failed.

    Returns:
        The output, or ``None`` where it is not one tensor (the model says so when it runs).
    """
    with torch.no_grad(), poutine.block(), kept_buffers(net):
        output = net(x)
    if not isinstance(output, torch.Tensor):
        return None
    check_network_output(output, len(x))
    return output


def check_network_output(output: torch.Tensor, rows: int) -> None:
    """Refuse a network output that is not ``(..., batch, outputs)``, as a BNN reads it.

    A forward that ends in ``.squeeze(-1)`` returns one number per row without an output
    dim, which the likelihood would read as ``batch`` outputs of one row. A one-dimensional
    output of ``rows`` numbers is that case, whatever the likelihood (a network's output for
    a batch always has the batch dim and an output dim). An output whose next-to-last dim is
    not the rows comes from an input with a dim the network does not take (``x`` of
    ``(batch, 1, features)`` through an MLP), which would otherwise fail later on a mismatch
    of sizes that names neither.

    Args:
        output: What the network returned for ``rows`` rows (any weight draws' dims first).
        rows: The rows of its input.

    Raises:
        ValueError: If ``output`` is ``(rows,)``, or its next-to-last dim is not ``rows``,
            naming the fix.
    """
    if output.dim() == 1 and output.shape[0] == rows:
        raise ValueError(
            f"the network returned shape ({rows},) for {rows} rows, but a BNN reads a "
            "network's output as (batch, outputs): return (batch, 1) for one output per row "
            "(e.g. leave out a final .squeeze(-1) in forward)"
        )
    if output.dim() >= 2 and output.shape[-2] != rows:
        raise ValueError(
            f"the network returned shape {tuple(output.shape)} for {rows} rows of x, but a "
            "BNN reads a network's output as (batch, outputs), one row per row of x next to "
            f"last, where it has {output.shape[-2]}: does x have a dim the network does not "
            "take (x is (batch, *features), the features as the first layer reads them)?"
        )
