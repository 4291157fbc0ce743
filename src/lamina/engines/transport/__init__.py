"""In situ transport: producer and consumer programs of one MPMD launch exchange datasets over MPI.

``LAMINA_TRANSPORT=file|memory|both`` (or ``lamina.open(..., transport=...)``)
chooses, outside the program, whether a file is written to disk as usual
(``file``), or served from the producer's memory to the consumer programs
(``memory``, engine ``mpi``).  ``LAMINA_WORKFLOW`` says which program
produces which name (:mod:`.workflow`); see ``docs/transport.md``.
"""

from __future__ import annotations

import os

from .both import BothEngine
from .engine import TRANSPORT_OPTIONS, TransportEngine
from .workflow import ENV as WORKFLOW_ENV
from .workflow import Route, Workflow, in_memory

ENV = "LAMINA_TRANSPORT"
CHOICES = ("file", "memory", "both")


def transport_choice(transport: str | None = None) -> str:
    """*transport*, else ``$LAMINA_TRANSPORT``, else ``'file'``; ValueError if unknown."""
    choice = (transport or os.environ.get(ENV) or "file").strip().lower()
    if choice not in CHOICES:
        raise ValueError(
            f"transport must be one of {list(CHOICES)} (argument or ${ENV}), got {choice!r}"
        )
    return choice


def engine_for(path: str, mode: str, transport: str | None = None) -> str | None:
    """The engine name the transport choice asks for *path*, or None for the usual file engine."""
    choice = transport_choice(transport)
    if choice == "file" or not in_memory(path):
        return None
    return "mpi" if choice == "memory" else "both"


__all__ = [
    "CHOICES",
    "ENV",
    "TRANSPORT_OPTIONS",
    "BothEngine",
    "WORKFLOW_ENV",
    "Route",
    "TransportEngine",
    "Workflow",
    "engine_for",
    "in_memory",
    "transport_choice",
]
