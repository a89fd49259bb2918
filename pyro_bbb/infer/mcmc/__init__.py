r"""NUTS on the very model SVI trains, over a once-traced flat potential.

* :mod:`~pyro_bbb.infer.mcmc.potential`: the flat layout of the latent sites and the
  potential energy :math:`-\log p(y, w)`;
* :mod:`~pyro_bbb.infer.mcmc.chains`: one chain with Pyro's NUTS, its start and statistics;
* :mod:`~pyro_bbb.infer.mcmc.nuts`: :func:`run_nuts`, which runs the chains;
* :mod:`~pyro_bbb.infer.mcmc.result`: :class:`NUTSResult` and :func:`replay_nuts`.
"""

from .nuts import run_nuts
from .result import NUTSResult, replay_nuts

__all__ = ["NUTSResult", "replay_nuts", "run_nuts"]
