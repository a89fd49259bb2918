"""Benchmarks against published results, as a library: the UCI regression protocol.

* :mod:`~pyro_bbb.bench.uci`: :func:`run_uci` and :func:`fit_split`, the protocol of
  Hernández-Lobato and Adams (2015) for a BNN, a deterministic net and MC dropout;
* :mod:`~pyro_bbb.bench.uci_config`: :class:`UCIConfig`, how every split is trained and
  scored;
* :mod:`~pyro_bbb.bench.uci_results`: the scores, their summaries and the published figures
  (read from ``published_uci.json``).

``pyro-bbb bench uci PATH`` runs it from the command line.
"""

from .uci import fit_split, run_uci
from .uci_config import UCIConfig
from .uci_results import METHODS, PUBLISHED, PUBLISHED_SOURCES, SplitResult, UCIResults

__all__ = [
    "METHODS",
    "PUBLISHED",
    "PUBLISHED_SOURCES",
    "SplitResult",
    "UCIConfig",
    "UCIResults",
    "fit_split",
    "run_uci",
]
