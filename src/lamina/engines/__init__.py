"""Engines: one module or package per way of moving bytes, all implementing :mod:`.base`.

The built-in engines are registered here, by name, with the options each
takes (:mod:`.registry` builds a file's stack from them):

``native``  block-indexed files with aggregation (:mod:`.native`)
``memory``  the same interface, bytes in this process (:mod:`.memory`)
``mpi``     in situ transport between the programs of an MPMD launch (:mod:`.transport`)
``both``    the transport, and the producer writes the native file too
"""

from . import registry
from .base import BlockInfo, Engine
from .block import BlockEngine
from .memory import MemoryEngine
from .native import NativeEngine
from .registry import engine_names, register_engine, register_layer
from .transport import TRANSPORT_OPTIONS, BothProducer, Producer, both_engine, mpi_engine

registry.register_engine(
    "native",
    lambda mode: NativeEngine(),
    NativeEngine.OPTIONS,
    ignores=TRANSPORT_OPTIONS,
    description="block-indexed files: subfiles per aggregator, commit log (docs/format.md)",
)
registry.register_engine(
    "memory",
    lambda mode: MemoryEngine(),
    MemoryEngine.OPTIONS,
    ignores=TRANSPORT_OPTIONS,
    description="the native engine's interface with the bytes in this process (tests, examples)",
)
registry.register_engine(
    "mpi",
    mpi_engine,
    Producer.OPTIONS,
    ignores=NativeEngine.OPTIONS,
    description="in situ transport: producer and consumer programs of one MPMD launch (docs/transport.md)",
)
registry.register_engine(
    "both",
    both_engine,
    BothProducer.OPTIONS,
    description="in situ transport, and the producer writes the native file too",
)

__all__ = [
    "BlockEngine",
    "BlockInfo",
    "Engine",
    "engine_names",
    "register_engine",
    "register_layer",
    "registry",
]
