"""Engine ``mpi``: a producer program serves its datasets to consumer programs over MPI.

The producer side is a :class:`~lamina.engines.core.BlockEngine` whose
"storage" is the producer ranks' own memory: the commit protocol runs as for
files (headers allgathered, overlaps refused, statistics computed, one
record per step), and every committed record is sent by producer rank 0 to
every consumer rank, so consumers hold the same catalog (groups, datasets,
attributes, extension records such as derived-quantity definitions,
per-step blocks with their statistics and producer rank).

Data never passes through a central rank.  A consumer rank reading a box
looks up in its catalog the blocks that meet the box and their producer
ranks, asks each of those ranks for the intersection (one ``GET`` per
piece), and receives the pieces straight into its output buffer
(``Irecv`` of contiguous numpy memory; a scratch buffer only where the
destination is not contiguous).  Where no producer wrote, the fill value.

Producers serve while they are blocked in lamina calls: in ``end_step``
until fewer than ``queue_limit`` steps are unreleased by some consumer
rank, and in ``close`` until every consumer rank has said goodbye.  A
consumer rank releases every step before *k* when it asks for step *k*
(``f.at(k)``, the next iteration of ``iter_steps``, ``close``).

Every wait polls (``Iprobe``/``Testall`` and a short sleep) with a
timeout, so a peer that stops answering gives
:class:`~lamina.errors.TransportError` instead of a hang.  See
``docs/transport.md`` for the protocol.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os

import numpy as np

from ... import comm as comm_mod
from ...catalog import KIND_CLOSE, KIND_META, KIND_STEP, Record
from ...errors import FormatError, ModeError, ShapeError, StepError, TransportError
from ...geometry import Box
from ..base import register
from ..core import CODEC_STATS_ONLY, BlockEngine, Header, Pending
from . import rendezvous, workflow
from .rendezvous import Poll

#: intercommunicator tags
TAG_RECORD = 11  # producer rank 0 -> every consumer rank: committed record bytes; empty: no more
TAG_REQUEST = 12  # consumer rank -> producer rank: int64 words, see REQ_*
TAG_DATA = 13  # producer rank -> consumer rank: the bytes of one requested box; empty: not held

REQ_GET = 1  # [1, step, dataset id, ndim, start..., stop...]
REQ_RELEASE = 2  # [2, k]: every step before k is released by this consumer rank
REQ_BYE = 3  # [3]: this consumer rank closed; it releases everything

NEVER = np.iinfo(np.int64).max

DEFAULT_TIMEOUT = 60.0
TIMEOUT_ENV = "LAMINA_TRANSPORT_TIMEOUT"

#: options only this engine knows; other engines never see them (see lamina.api.file)
TRANSPORT_OPTIONS = {"timeout", "queue_limit", "shallow"}


def _u8(arr: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array, as a flat uint8 view (no copy)."""
    return arr.reshape(-1).view(np.uint8)


@dataclasses.dataclass
class Link:
    """The producer's connection to one consumer task."""

    app: int
    inter: object
    size: int
    released: np.ndarray  # per consumer rank: every step before this one is released
    bye: np.ndarray  # per consumer rank: closed


@register
class TransportEngine(BlockEngine):
    """Engine ``mpi``: in situ transport between the programs of one MPMD launch (module docstring)."""

    name = "mpi"
    # the native engine's options are accepted (and mean nothing here) so that a program
    # runs unchanged whether its files are written or transported
    OPTIONS = TRANSPORT_OPTIONS | {"aggregators", "durable"}

    def __init__(self) -> None:
        super().__init__()
        self._links: list[Link] = []
        self._inter = None  # consumer: the intercommunicator to the producer task
        self._data: dict[int, dict[int, list[tuple[Box, np.ndarray]]]] = {}  # producer: step -> id -> blocks
        self._staged: list[tuple[int, Box, np.ndarray]] = []
        self._sends: list[tuple[object, object]] = []  # (request, buffer kept alive)
        self._agreed = 0  # consumer: steps every consumer rank has (see refresh)
        self._agreed_closed = False
        self._cursor = 0  # consumer: steps before this one are released
        self._ended = False  # consumer: the producer acknowledged this rank's goodbye

    # ------------------------------------------------------------ open
    def _open_storage(self, path: str, mode: str) -> None:
        if mode == "a":
            raise ModeError("the memory transport streams new steps: open with 'w' (producer) or 'r' (consumer)")
        env_timeout = os.environ.get(TIMEOUT_ENV)
        self.timeout = float(self.options.get("timeout", env_timeout or DEFAULT_TIMEOUT))
        self.queue_limit = int(self.options.get("queue_limit", 2))
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.queue_limit < 2:
            # a consumer releases step k when it asks for step k+1, which the producer must be free to make
            raise ValueError(f"queue_limit must be at least 2, got {self.queue_limit}")
        shallow = self.options.get("shallow", ())
        self.shallow = (shallow,) if isinstance(shallow, str) else tuple(str(p) for p in shallow)
        name = workflow.normname(path)
        app = comm_mod.appnum()
        route = workflow.route_for(name, mode, app, comm_mod.task_count(), workflow.from_env())
        if mode == "w":
            links = rendezvous.connect_producer(self.comm, name, app, route.consumers, self.timeout)
            for c, inter in links:
                n = inter.Get_remote_size()
                self._links.append(Link(c, inter, n, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)))
        else:
            self._inter = rendezvous.connect_consumer(self.comm, name, app, route.producer, self.timeout)
            # wait for the producer's first record (its first step, or its close), so that the
            # datasets and definitions are known once open returns, as for a file
            g = comm_mod.Guard()
            with g:
                self._receive(until=lambda: self.catalog.nrecords > 0, what=f"the first step of {name!r}")
            comm_mod.agree(self.comm, g.error)
            self.refresh()

    # ------------------------------------------------------------ producer
    def define(self, spec):
        # blocks stay in memory: no compression (the spec readers see says so)
        return super().define(dataclasses.replace(spec, codecs=()))

    def _stage(self, p: Pending, copy: bool) -> None:
        if copy and any(fnmatch.fnmatchcase(p.spec.path, pat) for pat in self.shallow):
            copy = False  # shallow: keep the caller's array until consumers release the step
        super()._stage(p, copy)

    def _move(self, headers: list[Header], mine: list[Pending]):
        self._staged = [(p.spec.id, p.box, p.data) for p in mine if p.data is not None and p.codec == 0]
        return []

    def _write_record(self, raw: bytes) -> None:
        pass

    def _committed(self, raw: bytes) -> None:
        if raw and raw[0] == KIND_STEP:
            held: dict[int, list[tuple[Box, np.ndarray]]] = {}
            for did, box, arr in self._staged:
                held.setdefault(did, []).append((box, arr))
            self._data[len(self.catalog.steps) - 1] = held
        self._staged = []
        if self.rank == 0:
            buf = np.frombuffer(raw, dtype=np.uint8)
            for link in self._links:
                for r in range(link.size):
                    if not link.bye[r]:
                        self._isend(link.inter, buf, r, TAG_RECORD)

    def _isend(self, inter, buf: np.ndarray, dest: int, tag: int) -> None:
        self._sends.append((comm_mod.isend_bytes(inter, buf, dest, tag), buf))

    def _low(self) -> int:
        """The first step some consumer rank has not released (NEVER if all closed)."""
        return min((int(link.released.min()) for link in self._links), default=NEVER)

    def _unreleased(self) -> int:
        return max(0, len(self.catalog.steps) - self._low())

    def _all_bye(self) -> bool:
        return all(bool(link.bye.all()) for link in self._links)

    def _progress_sends(self) -> None:
        if self._sends:
            self._sends = [(r, b) for r, b in self._sends if comm_mod.test_requests([r]) is None]

    def _serve_once(self) -> bool:
        """Independent: answer every waiting request; True if there was any."""
        busy = False
        for link in self._links:
            while True:
                got = comm_mod.poll_bytes(link.inter, comm_mod.ANY_SOURCE, TAG_REQUEST)
                if got is None:
                    break
                busy = True
                self._answer(link, *got)
        self._progress_sends()
        low = self._low()
        for k in [k for k in self._data if k < low]:
            del self._data[k]
        return busy

    def _answer(self, link: Link, src: int, buf: np.ndarray) -> None:
        if len(buf) % 8 or not len(buf):
            raise TransportError(f"malformed request of {len(buf)} bytes from consumer task {link.app} rank {src}")
        words = buf.view(np.int64)
        kind = int(words[0])
        if kind == REQ_GET and len(words) >= 4:
            step, did, nd = int(words[1]), int(words[2]), int(words[3])
            if len(words) != 4 + 2 * nd:
                raise TransportError(f"malformed data request from consumer task {link.app} rank {src}")
            want = Box(tuple(int(v) for v in words[4 : 4 + nd]), tuple(int(v) for v in words[4 + nd :]))
            piece = np.zeros(0, dtype=np.uint8)  # empty: not held here (released, or never written)
            for box, arr in self._data.get(step, {}).get(did, ()):
                if box.contains(want):
                    piece = _u8(np.ascontiguousarray(arr[want.relative_to(box)]))
                    break
            self._isend(link.inter, piece, src, TAG_DATA)
        elif kind == REQ_RELEASE and len(words) == 2:
            link.released[src] = max(int(link.released[src]), int(words[1]))
        elif kind == REQ_BYE and len(words) == 1:
            link.bye[src] = True
            link.released[src] = NEVER
            if self.rank == 0:  # the last message of the record stream to this rank
                self._isend(link.inter, np.zeros(0, dtype=np.uint8), src, TAG_RECORD)
        else:
            raise TransportError(f"unknown request {kind} from consumer task {link.app} rank {src}")

    def _serve(self, until, what: str) -> None:
        """Independent: serve consumers until *until()*; TransportError after *timeout* s without any request."""
        poll = Poll(self.timeout)
        while True:
            busy = self._serve_once()
            if until():
                return
            if busy:
                poll.reset()
            elif poll.expired:
                raise TransportError(f"{self.path}: waited {self.timeout:g} s for {what}; no consumer request came")
            else:
                poll.sleep()

    def end_step(self) -> None:
        if self.mode == "r":
            return super().end_step()  # raises ModeError
        super().end_step()
        g = comm_mod.Guard()
        with g:
            self._serve(
                lambda: self._unreleased() < self.queue_limit,
                f"consumers to release step {len(self.catalog.steps) - self.queue_limit}",
            )
        comm_mod.agree(self.comm, g.error)

    def _read_region(self, rec, spec, inter, dst) -> None:
        raise ModeError(f"{self.path}: a producer of the memory transport cannot read back what it wrote")

    # ------------------------------------------------------------ consumer
    def _receive(self, until=None, what: str = "") -> None:
        """Independent: apply the records that have arrived; with *until*, wait for it (timeout)."""
        poll = Poll(self.timeout)
        while True:
            got = comm_mod.poll_bytes(self._inter, 0, TAG_RECORD)
            if got is not None:
                raw = got[1].tobytes()
                if not raw:
                    self._ended = True
                else:
                    rec = Record.decode(raw, self.catalog, f"{self.path}: record {self.catalog.nrecords}")
                    self.catalog.apply_record(rec, ops_applied=True)
                poll.reset()
                continue
            if until is None or until():
                return
            if poll.expired:
                raise TransportError(f"{self.path}: no message from the producer in {self.timeout:g} s waiting for {what}")
            poll.sleep()

    @property
    def steps(self) -> int:
        return self._agreed if self.mode == "r" else len(self.catalog.steps)

    @property
    def writer_closed(self) -> bool:
        return self._agreed_closed if self.mode == "r" else self.catalog.closed

    def refresh(self) -> int:
        """Collective: take up the steps every consumer rank has received."""
        if self.mode != "r":
            return len(self.catalog.steps)
        g = comm_mod.Guard()
        with g:
            self._receive()
        comm_mod.agree(self.comm, g.error)
        self._agreed = comm_mod.allreduce_int(self.comm, len(self.catalog.steps), "min")
        self._agreed_closed = bool(comm_mod.allreduce_int(self.comm, int(self.catalog.closed), "min"))
        return self._agreed

    def _release(self, k: int) -> None:
        """Independent: tell every producer rank that this rank is done with every step before *k*."""
        if k <= self._cursor:
            return
        self._cursor = k
        msg = np.array([REQ_RELEASE, k], dtype=np.int64)
        reqs = [comm_mod.isend_bytes(self._inter, _u8(msg), r, TAG_REQUEST) for r in range(self._inter.Get_remote_size())]
        self._wait(reqs, "the producer to take a release")

    def _wait(self, reqs: list, what: str) -> list[int]:
        poll = Poll(self.timeout)
        while True:
            counts = comm_mod.test_requests(reqs)
            if counts is not None:
                return counts
            if poll.expired:
                raise TransportError(f"{self.path}: waited {self.timeout:g} s for {what}; the producer does not answer")
            poll.sleep()

    def check_step(self, step: int | None) -> int:
        """Independent: resolve *step*; on a consumer, wait for it and release every earlier step."""
        if self.mode != "r":
            return super().check_step(step)
        self._receive()
        n = len(self.catalog.steps)
        if step is None:
            if n == 0:
                raise StepError(f"{self.path!r} has no steps yet")
            step = n - 1
        step = int(step)
        if step < 0:
            step += n
            if step < 0:
                raise StepError(f"step {step - n} does not exist in {self.path!r}: {n} step(s) so far")
        if step < self._cursor:
            raise StepError(
                f"step {step} of {self.path!r} was released: the memory transport keeps a step only "
                f"until its consumers ask for a later one (this rank is at step {self._cursor})"
            )
        self._release(step)
        if step >= len(self.catalog.steps):
            self._receive(until=lambda: step < len(self.catalog.steps) or self.catalog.closed, what=f"step {step}")
            if step >= len(self.catalog.steps):
                raise StepError(
                    f"step {step} will never exist: the producer of {self.path!r} closed it after "
                    f"{len(self.catalog.steps)} steps"
                )
        return step

    def get(self, name: str, box: Box, step: int, out: np.ndarray) -> None:
        if self.mode != "r":
            return super().get(name, box, step, out)
        spec = self.lookup(name)
        box.check_inside(spec.shape, f"dataset {spec.path!r}")
        step = self.check_step(step)
        if out.shape != box.shape or out.dtype != spec.dtype:
            raise ShapeError(f"output buffer {out.shape} {out.dtype} does not match box {box} of {spec.dtype}")
        hits = self.catalog.hits(spec.id, step, box)
        if sum(inter.size for _, inter in hits) < box.size:
            out[...] = spec.fill_scalar()
        reqs, recvs, pieces, keep = [], [], [], []
        for rec, inter in hits:
            if rec.codec == CODEC_STATS_ONLY:
                raise FormatError(
                    f"dataset {spec.path!r} keeps only statistics at step {step} (block {rec.box}); "
                    "its values are computed by the derived layer"
                )
            dst = out[(*inter.relative_to(box), ...)]
            tmp = dst if dst.flags.c_contiguous else np.empty(inter.shape, dtype=spec.dtype)
            recvs.append(comm_mod.irecv_bytes(self._inter, _u8(tmp), rec.rank, TAG_DATA))
            reqs.append(recvs[-1])
            pieces.append((dst, tmp, inter, rec.rank))
            hdr = np.array([REQ_GET, step, spec.id, spec.ndim, *inter.start, *inter.stop], dtype=np.int64)
            keep.append(hdr)
            reqs.append(comm_mod.isend_bytes(self._inter, _u8(hdr), rec.rank, TAG_REQUEST))
        if not reqs:
            return
        try:
            counts = self._wait(reqs, f"{spec.path!r} {box} at step {step}")
        except TransportError:
            comm_mod.cancel_receives(recvs)  # a late answer must not land in *out*
            raise
        for (dst, tmp, inter, rank), got in zip(pieces, counts[::2], strict=True):
            if got != tmp.nbytes:
                raise TransportError(
                    f"{self.path}: producer rank {rank} no longer holds {spec.path!r} {inter} of step {step}"
                )
            if tmp is not dst:
                dst[...] = tmp

    # ------------------------------------------------------------ closing
    def close(self) -> None:
        if self._closed:
            return
        try:
            if self.mode == "r":
                g = comm_mod.Guard()
                with g:
                    self._goodbye()
                comm_mod.agree(self.comm, g.error)
            else:
                if comm_mod.allreduce_int(self.comm, int(self._in_step), "max"):
                    self._in_step = True
                    self._commit(KIND_STEP)
                if comm_mod.allreduce_int(self.comm, int(bool(self._pending_ops)), "max"):
                    self._commit(KIND_META)
                self._commit(KIND_CLOSE)
                g = comm_mod.Guard()
                with g:
                    self._serve(self._all_bye, "every consumer rank to close")
                    poll = Poll(self.timeout)
                    while self._sends:
                        self._progress_sends()
                        if poll.expired:
                            raise TransportError(f"{self.path}: consumers did not take the last messages")
                        poll.sleep()
                comm_mod.agree(self.comm, g.error)
        finally:
            self._closed = True
            self._close_storage()
            comm_mod.free(self.comm)

    def _goodbye(self) -> None:
        """Consumer: release everything, say goodbye to every producer rank, drain the record stream."""
        bye = np.array([REQ_BYE], dtype=np.int64)
        reqs = [comm_mod.isend_bytes(self._inter, _u8(bye), r, TAG_REQUEST) for r in range(self._inter.Get_remote_size())]
        self._wait(reqs, "the producer to take this rank's goodbye")

        def acknowledged() -> bool:
            # answers to requests given up after a timeout may still come: take and drop them
            while comm_mod.poll_bytes(self._inter, comm_mod.ANY_SOURCE, TAG_DATA) is not None:
                pass
            return self._ended

        self._receive(until=acknowledged, what="the producer to acknowledge the close")

    def _close_storage(self) -> None:
        for link in self._links:
            comm_mod.free(link.inter)
        self._links = []
        if self._inter is not None:
            comm_mod.free(self._inter)
            self._inter = None
        self._data.clear()
        self._sends = []


__all__ = ["TRANSPORT_OPTIONS", "TransportEngine"]
