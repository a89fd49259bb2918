r"""How weight draws reach a network: around its ``forward``, not through it.

Several draws of the weights at once (an ELBO's particles, ``predict``'s samples, an
ensemble's members) give every Bayesian parameter leading sample dims,
``(*sample, [1,] *shape)``. A network's ``forward`` is written for activations
``(batch, ...)``: ``torch.flatten(x, 1)``, ``out[:, -1]``, ``nn.LSTM``,
``nn.MultiheadAttention`` and ``BatchNorm`` all count dims from the front. So the draws go
around the network, and its ``forward`` sees the shapes it was written for. A network
meets draws in one of three ways (:class:`DrawPath`), chosen for each network:

* ``"broadcast"``: the draws' sample dims flow through the activations, ``(*sample, batch,
  features)``, in one pass whose matrix products are batched over the draws. Taken only
  for networks proved to allow it by their structure (:func:`broadcasts_draws`):
  ``nn.Sequential`` stacks (and :class:`~pyro_bbb.nn.multi_head.MultiHead`) of Bayesian
  ``Linear`` layers, elementwise activations, dropout and ``LayerNorm``, which is what
  :func:`~pyro_bbb.nn.builders.mlp` builds. It is the fastest path for them.
* ``"vmap"``: every Bayesian site is drawn first, then the network's own ``forward`` runs
  once per draw under :func:`torch.func.vmap` (``randomness="different"``: each draw has
  its own dropout masks and estimator noise), in one vectorised pass.
* ``"loop"``: the same, one draw after another, for networks ``vmap`` cannot batch. Where
  the structure tells (a Bayesian ``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` or ``nn.LSTMCell``,
  whose fused kernel has no batching rule for drawn weights: :func:`unbatched_layer`) the
  loop is taken at once. Anything else (``BatchNorm`` updating its running statistics from
  a drawn input in training mode, a data-dependent branch, a backward pass ``vmap`` cannot
  batch) is found by trying ``vmap`` the first time the network meets draws in a training
  mode (``net.training``), from the errors it raises for what it cannot batch
  (:func:`is_vmap_limitation`); any other error is the network's own and is raised as it
  is. Where gradients are being taken, the decision backpropagates once through the
  vectorised pass too (a rule ``vmap`` has for the forward may be missing for the
  backward); a decision made without gradients is checked again the first time the network
  meets draws with them. :func:`settle_draws` makes the decision, backward included, before
  training.

A caller that put one draw of every site in place itself, with no sample dims (the fused
step of :mod:`pyro_bbb.infer.fused` with one weight draw), says so with :func:`one_draw`:
the root's ``forward`` then runs the network's own at once instead of reading every site
to find sample dims.

A network's output may be any nesting of tuples, lists and dicts (named tuples too) whose
leaves are tensors or anything else (``None``, a number): on every path the tensors get the
draws' sample dims in front and the other leaves come back as the network returned them
(from the first draw). :func:`~pyro_bbb.nn.builders.bayesianize` gives the root of every
network that does not broadcast a :class:`PerDrawForward`, so ``net(x)`` does this in any
Pyro model.

**What a layer may ask of the current draw.** This is the whole contract between the
runner and what runs inside it, the Bayesian layers and the estimators that replace their
arithmetic (:mod:`pyro_bbb.infer.reparam`, :mod:`pyro_bbb.infer.fused`):

1. :func:`current_draw` is ``None`` outside a per-draw pass. There a read of a Bayesian
   parameter gives its value as drawn, ``(*sample, [1,] *shape)``, and a layer either
   computes with the sample dims (the affine layers broadcast over them) or refuses them
   (:class:`~pyro_bbb.nn.module_layer.BayesianModule` raises).
2. Inside a pass it is a :class:`Draw`, and every read of a site, by a layer or by the
   network's own ``forward``, gives this draw's value, ``shape``, with no sample dims: the
   tensor ``draw.views[site]`` itself.
3. ``draw.as_drawn(site, value)`` gives the value as drawn when ``value`` is this draw's
   view of ``site``, matched by identity (what an estimator recorded when the site was
   drawn), and ``value`` unchanged otherwise.
4. ``draw.select(tensor, event_dims)`` gives this draw's part of anything that carries the
   draws' sample dims (a distribution's mean or variance, a given split of the weights);
   sample dims of size 1 are shared by every draw.
5. Random numbers drawn inside the pass are the draw's own (``vmap`` with
   ``randomness="different"``, or one draw after another): a layer draws its noise as for
   one draw.
6. Nothing inside the pass issues a Pyro sample statement: the sites were drawn before it.
   A ``forward`` that issues one of its own is written for draws in front of its
   activations, as a Pyro model under a plate is, and is run that way (``"broadcast"``).

This package is reached through this module only (an import-linter contract); its rooms are
:mod:`~pyro_bbb.nn.draws.current` (the draw and rules 1-4),
:mod:`~pyro_bbb.nn.draws.paths` (what a network's structure tells, and vmap's errors),
:mod:`~pyro_bbb.nn.draws.per_draw` (the runner), :mod:`~pyro_bbb.nn.draws.outputs` (outputs
taken apart and put back) and :mod:`~pyro_bbb.nn.draws.buffers` (buffers kept through a
probe). Nothing here knows of guides or training.
"""

from .buffers import kept_buffers
from .current import Draw, current_draw, one_draw
from .paths import DrawPath, PerDrawPath, broadcasts_draws, is_vmap_limitation, unbatched_layer
from .per_draw import PerDrawForward, describe_draws, draw_path, per_draw_forward, settle_draws

__all__ = [
    "Draw",
    "DrawPath",
    "PerDrawForward",
    "PerDrawPath",
    "broadcasts_draws",
    "current_draw",
    "describe_draws",
    "draw_path",
    "is_vmap_limitation",
    "kept_buffers",
    "one_draw",
    "per_draw_forward",
    "settle_draws",
    "unbatched_layer",
]
