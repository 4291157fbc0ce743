"""The in-process engine: the same interface as ``native``, bytes held in memory.

Used by tests and as the simplest proof of the engine seam.  A store lives
in this process under its path until :func:`drop` or the process ends; a
writer and a reader opened on the same path in one process share it.  With
several ranks every rank receives every block (allgather), so any rank can
read any region; this is for correctness, not speed (the in situ transport
redistributes point to point instead).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from .. import comm as comm_mod
from .. import stats as stats_mod
from ..catalog import BlockCodec, Catalog, Record
from ..errors import ChecksumError, NotALaminaFileError
from .block import BlockEngine, Header, Pending, wait_for


@dataclass
class MemoryStore:
    records: list[bytes] = field(default_factory=list)
    blocks: dict[tuple[int, int, int], bytes] = field(default_factory=dict)
    sessions: int = 0


_STORES: dict[str, MemoryStore] = {}
_LOCK = threading.Lock()


def drop(path: str) -> None:
    """Forget the in-memory file *path* in this process."""
    with _LOCK:
        _STORES.pop(str(path), None)


class MemoryEngine(BlockEngine):
    """Engine ``memory``: blocks and metadata in this process's memory."""

    name = "memory"

    def _open_storage(self, path: str, mode: str) -> None:
        if mode == "r" and self.wait:
            wait_for(
                path,
                self.wait,
                lambda: path in _STORES,
                lambda s: NotALaminaFileError(
                    f"no in-memory lamina file {path!r} after waiting {s:g} s"
                ),
            )
        with _LOCK:
            if mode == "w":
                _STORES[path] = MemoryStore()
            elif path not in _STORES:
                if mode == "r":
                    raise NotALaminaFileError(f"no in-memory lamina file {path!r} in this process")
                _STORES[path] = MemoryStore()
            self.store = _STORES[path]
        self._seen = 0
        self.refresh_local()
        if mode != "r":
            self.session = self.store.sessions
            self.store.sessions += 1
        self._ends = [0] * self.size

    def refresh_local(self) -> None:
        for raw in self.store.records[self._seen :]:
            rec = Record.decode(raw, self.catalog, f"memory record {self._seen}")
            self.catalog.apply_record(rec, ops_applied=True)
            self._seen += 1

    def refresh(self) -> int:
        """Collective (trivially): replay records added since open."""
        self.refresh_local()
        return len(self.catalog.steps)

    def _stage(self, p: Pending, copy: bool) -> None:
        super()._stage(p, copy)

    def _move(self, headers: list[Header], mine: list[Pending]):
        parts = []
        for p in mine:
            if p.location is None:  # statistics-only blocks have nothing to move
                raw = p.payload if p.codec == BlockCodec.PIPELINE else p.data
                assert raw is not None  # moved once, at the commit
                parts.append(bytes(raw.data) if isinstance(raw, np.ndarray) else raw)
        everything = comm_mod.allgather_bytes(self.comm, b"".join(parts))
        pos = [0] * self.size
        locations = []
        for h in headers:
            if h.location is not None:
                continue
            src = h.rank
            data = everything[src][pos[src] : pos[src] + h.length]
            pos[src] += h.length
            key = (self.session, src, self._ends[src])
            self._ends[src] += h.length
            self.store.blocks[key] = data
            if src == self.rank:
                locations.append((src, h.idx, *key))
        for p in mine:
            p.data = None
        return locations

    def _write_record(self, raw: bytes) -> None:
        pass

    def _committed(self, raw: bytes) -> None:
        self.store.records.append(raw)
        self._seen += 1

    def _read_region(self, rec, spec, inter, dst) -> None:
        payload = self.store.blocks.get((rec.session, rec.agg, rec.offset))
        if payload is None or len(payload) != rec.length:
            raise ChecksumError(f"in-memory block of {spec.path!r} at {rec.box} is missing")
        got = stats_mod.segment_crcs(payload, rec.seg)
        if got != rec.crcs:
            raise ChecksumError(
                f"checksum mismatch in {self.path}: dataset {spec.path!r}, block {rec.box}"
            )
        arr = self.decode_payload(rec, spec, payload)
        dst[...] = arr[inter.relative_to(rec.box)]


__all__ = ["MemoryEngine", "MemoryStore", "drop", "Catalog", "np"]
