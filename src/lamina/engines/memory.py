"""The in-process engine: the same interface as ``native``, bytes held in memory.

Used by tests and as the simplest proof of the engine seam.  A store lives
in this process under its path until :func:`drop` or the process ends; a
writer and a reader opened on the same path in one process share it.  With
several ranks every rank receives every block (allgather), so any rank can
read any region; this is for correctness, not speed (the in situ transport
redistributes point to point instead).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import numpy as np

from .. import comm as comm_mod
from .. import stats as stats_mod
from ..catalog import Catalog, decode_packed
from ..errors import ChecksumError, FormatError, LockError, NotALaminaFileError
from .block import BlockEngine, StepHeads, wait_for


@dataclass
class MemoryStore:
    """One in-memory file: its records (head and block area, packed), and its block bytes."""

    records: list[bytes] = field(default_factory=list)
    #: (session, writer rank) -> that rank's blocks of that session, back to back
    data: dict[tuple[int, int], bytearray] = field(default_factory=dict)
    sessions: int = 0
    writer: bool = False  # a writer has it open (one at a time, as the native engine's lock)


_STORES: dict[str, MemoryStore] = {}
_LOCK = threading.Lock()


def _key(path: str) -> str:
    """The store of *path*: one for every spelling of one path, as a file on disk is
    ('./x.lam', an absolute path and 'x.lam/' opened three stores, and a second writer
    on another spelling wrote to an empty one without a LockError)."""
    path = os.fspath(path)
    if "://" in path:  # a name of its own ("mem://x"), no path of this file system
        return path
    return os.path.normpath(os.path.abspath(path))


def drop(path: str) -> None:
    """Forget the in-memory file *path* in this process."""
    with _LOCK:
        _STORES.pop(_key(str(path)), None)


class MemoryEngine(BlockEngine):
    """Engine ``memory``: blocks and metadata in this process's memory."""

    name = "memory"

    def _open_storage(self, path: str, mode: str) -> None:
        key = _key(path)
        if mode == "r" and self.wait:
            wait_for(
                path,
                self.wait,
                lambda: key in _STORES,
                lambda s: FileNotFoundError(
                    f"no in-memory lamina file {path!r} after waiting {s:g} s for its writer "
                    "to create it"
                ),
            )
        with _LOCK:
            held = _STORES.get(key)
            if mode != "r" and held is not None and held.writer:
                raise LockError(f"{path!r} is already open for writing in this process")
            if mode == "w":
                _STORES[key] = MemoryStore()
            elif key not in _STORES:
                if mode == "r" and "://" not in path and os.path.exists(path):
                    raise NotALaminaFileError(
                        f"no in-memory lamina file {path!r} in this process: the path is on "
                        "disk (a native file is read with engine='native')"
                    )
                if mode == "r":  # (as a file on disk that is not there)
                    raise FileNotFoundError(f"no in-memory lamina file {path!r} in this process")
                _STORES[key] = MemoryStore()
            self.store = _STORES[key]
        self._key = key
        self._seen = 0
        self.refresh_local()
        if mode != "r":
            self.store.writer = True
            self.session = self.store.sessions
            self.store.sessions += 1
        self._ends = [0] * self.size

    def refresh_local(self) -> None:
        if _STORES.get(self._key) is not self.store:
            # re-created ('w') or dropped since this engine opened it: its records are another
            # file's, as a native reader says of a file re-created under it
            raise FormatError(
                f"{self.path!r}: the in-memory file was re-created (or dropped) while open "
                "here; open it again to read the new one"
            )
        for raw in self.store.records[self._seen :]:
            rec, blocks = decode_packed(raw, self.catalog, f"memory record {self._seen}")
            self.catalog.apply_record(rec, ops_applied=True, blocks=blocks)
            self._seen += 1

    def refresh(self) -> int:
        """Collective (trivially): replay records added since open."""
        self.refresh_local()
        return len(self.catalog.steps)

    def _move(self, heads: StepHeads) -> list[tuple[int, int, int, int]]:
        """Every rank's blocks go to every rank (allgather), appended to that writer rank's bytes."""
        rows, _ = heads.unplaced(self.rank)
        mine = b"".join(self._log.views(rows.tolist()))
        everything = comm_mod.allgather_bytes(self.comm, mine)
        bases = []
        for src, data in enumerate(everything):
            if not data:
                continue
            held = self.store.data.setdefault((self.session, src), bytearray())
            bases.append((src, self.session, src, len(held)))
            held += data
        return bases

    def _committed(self, shared: bytes) -> None:
        self.store.records.append(shared)
        self._seen += 1

    def _payload(self, rec, spec) -> np.ndarray:
        held = self.store.data.get((rec.session, rec.agg))
        if held is None or rec.offset + rec.length > len(held):
            raise ChecksumError(f"in-memory block of {spec.path!r} at {rec.box} is missing")
        # a copy: a view would pin the bytearray, which grows with every step
        payload = bytes(memoryview(held)[rec.offset : rec.offset + rec.length])
        got = stats_mod.segment_crcs(payload, rec.seg)
        if got != rec.crcs:
            raise ChecksumError(
                f"checksum mismatch in {self.path}: dataset {spec.path!r}, block {rec.box}"
            )
        return np.frombuffer(payload, dtype=np.uint8)

    def _close_storage(self) -> None:
        if self.mode != "r" and getattr(self, "store", None) is not None:
            self.store.writer = False

    def _read_region(self, rec, spec, inter, dst) -> None:
        arr = self.decode_payload(rec, spec, self._payload(rec, spec))
        dst[...] = arr[inter.relative_to(rec.box)]


__all__ = ["MemoryEngine", "MemoryStore", "drop", "Catalog", "np"]
