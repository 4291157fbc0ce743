"""In situ transport: producer and consumer programs of one MPMD launch exchange datasets over MPI.

``LAMINA_TRANSPORT=file|memory|both`` (or ``lamina.open(..., transport=...)``)
chooses, outside the program, whether a file is written to disk as usual
(``file``), or served from the producer's memory to the consumer programs
(``memory``, engine ``mpi``); ``both`` does both.  ``LAMINA_WORKFLOW`` says
which program produces which name (:mod:`lamina.workflow.routes`); see
``docs/transport.md``.

* :mod:`.producer` -- the writing side (:class:`Producer`), :mod:`.both` its
  variant that writes the native file too (:class:`BothProducer`);
* :mod:`.consumer` -- the reading side (:class:`Consumer`);
* :mod:`.common` -- options and routes both sides share;
* :mod:`.rendezvous` -- pairing the tasks of a name; :mod:`.wire` -- moving boxes.
"""

from __future__ import annotations

from .both import BothProducer
from .common import TRANSPORT_OPTIONS
from .consumer import Consumer
from .producer import Producer


def mpi_engine(mode: str) -> Producer | Consumer:
    """Engine ``mpi``: a producer for writers, a consumer for readers."""
    return Consumer("mpi") if mode == "r" else Producer("mpi")


def both_engine(mode: str) -> BothProducer | Consumer:
    """Engine ``both``: a producer that also writes the file, a consumer for readers."""
    return Consumer("both") if mode == "r" else BothProducer()


__all__ = ["TRANSPORT_OPTIONS", "BothProducer", "Consumer", "Producer", "both_engine", "mpi_engine"]
