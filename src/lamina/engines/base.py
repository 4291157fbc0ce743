"""The engine interface: the seam every way of moving bytes plugs into.

An engine stores and retrieves blocks of N-D datasets, step by step, and
keeps the metadata tree (:class:`~lamina.catalog.Catalog`).  The API layer
(``File``, ``Group``, ``Dataset``) talks only to this interface; layers
(derived quantities, background I/O) are engines that wrap an inner engine
and forward what they do not change, like HDF5 pass-through VOL connectors.

Collective calls must be made by every rank of the engine's communicator in
the same order; independent calls may be made by any rank alone.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ..catalog import BlockRecord, Catalog, DatasetSpec, Stats
from ..geometry import Box


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """A written block as users and the query code see it."""

    box: Box
    stats: Stats | None
    nbytes: int  # bytes stored (after compression)
    raw_nbytes: int  # bytes of the uncompressed block
    subfile: str
    offset: int
    codec: str
    rank: int

    @classmethod
    def from_record(cls, rec: BlockRecord, spec: DatasetSpec) -> BlockInfo:
        if rec.codec == 2:
            codec = "stats-only"
        else:
            codec = "raw" if rec.codec == 0 else "+".join(c["id"] for c in spec.codecs)
        return cls(
            rec.box,
            rec.stats,
            rec.length,
            rec.box.size * spec.dtype.itemsize,
            rec.subfile,
            rec.offset,
            codec,
            rec.rank,
        )


class Engine(ABC):
    """Abstract engine.  See the module docstring for the calling rules."""

    #: registry name
    name: str = "?"

    comm = None
    mode: str = "r"
    path: str = ""
    catalog: Catalog

    @abstractmethod
    def open(self, path: str, mode: str, comm, options: dict) -> None:
        """Collective: open or create *path* in *mode* ('r', 'w', 'a') over *comm*."""

    # -- metadata (collective on writers) ---------------------------------
    @abstractmethod
    def define(self, spec: DatasetSpec) -> DatasetSpec:
        """Collective: add a dataset; returns the spec with its id assigned."""

    @abstractmethod
    def make_group(self, path: str) -> None:
        """Collective: add a group (and its parents)."""

    @abstractmethod
    def set_attr(self, path: str, name: str, value) -> None:
        """Collective: set an attribute; every rank must pass the same value."""

    @abstractmethod
    def del_attr(self, path: str, name: str) -> None:
        """Collective: delete an attribute."""

    def set_ext(self, key: str, payload: bytes) -> None:
        """Collective: record an extension entry (used by layers, e.g. derived definitions)."""
        raise NotImplementedError(f"engine {self.name!r} does not store extension records")

    # -- steps ------------------------------------------------------------
    @abstractmethod
    def begin_step(self) -> int:
        """Collective: start a new step; returns its index."""

    @abstractmethod
    def put(self, name: str, box: Box, array: np.ndarray, copy: bool = True) -> None:
        """Independent: write *array* to *box* of dataset *name* in the current step.

        With ``copy=False`` the engine may keep a reference to *array* until
        :meth:`end_step`; the caller must not modify it before then.
        """

    @abstractmethod
    def end_step(self) -> None:
        """Collective: commit the current step atomically."""

    @property
    @abstractmethod
    def in_step(self) -> bool:
        """True between begin_step and end_step."""

    # -- reading ----------------------------------------------------------
    @property
    def steps(self) -> int:
        """Number of committed steps this rank knows of (see :meth:`refresh`)."""
        return len(self.catalog.steps)

    @abstractmethod
    def get(self, name: str, box: Box, step: int, out: np.ndarray) -> None:
        """Independent: read *box* of dataset *name* at *step* into *out* (shape of box)."""

    def blocks(self, name: str, step: int) -> list[BlockInfo]:
        """Independent: the blocks of *name* written in *step*."""
        spec = self.catalog.datasets[name]
        return [BlockInfo.from_record(r, spec) for r in self.catalog.blocks(spec.id, step)]

    @abstractmethod
    def refresh(self) -> int:
        """Collective: pick up steps committed since open; returns the step count."""

    @property
    def writer_closed(self) -> bool:
        """True when the last writer of this file has closed it (no more steps coming)."""
        return self.catalog.closed

    def wait_steps(self, count: int, seconds: float) -> None:
        """Independent: wait up to *seconds* for the writer to reach *count* steps or close.

        A hint for :meth:`lamina.File.wait_for_step`, which calls
        :meth:`refresh` afterwards: engines that are told of new steps
        return as soon as news arrives; files are polled, so the default
        sleeps.
        """
        time.sleep(seconds)

    @abstractmethod
    def close(self) -> None:
        """Collective: finish (commits pending metadata on writers) and release resources."""


_REGISTRY: dict[str, type[Engine]] = {}


def register(cls: type[Engine]) -> type[Engine]:
    """Class decorator: make an engine available to ``lamina.open(engine=name)``."""
    _REGISTRY[cls.name] = cls
    return cls


def get_engine_class(name: str) -> type[Engine]:
    from ..errors import suggest

    # import the built-in engines so they register themselves
    from . import memory, native, transport  # noqa: F401

    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown engine {name!r}; available: {sorted(_REGISTRY)}.{suggest(name, _REGISTRY)}"
        ) from None


def engine_names() -> list[str]:
    from . import memory, native, transport  # noqa: F401

    return sorted(_REGISTRY)
