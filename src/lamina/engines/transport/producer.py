"""The producer side of the in situ transport (engines ``mpi`` and ``both`` opened for writing).

The producer is a :class:`~lamina.engines.block.BlockEngine` whose
"storage" is the producer ranks' own memory: the commit protocol runs as for
files (headers allgathered, overlaps refused, statistics computed, one
record per step), and every committed record reaches every consumer rank
(consumer rank *j* gets it from producer rank *j* mod P, so the fan-out is
spread over the producers), so consumers hold the same catalog (groups, datasets,
attributes, extension records such as derived-quantity definitions,
per-step blocks with their statistics and producer rank).

Producers answer requests (:class:`~.wire.Request`) on a serving thread
while the program computes (``serve='thread'``, the default; it needs
``MPI_THREAD_MULTIPLE``), and on the program's thread while it is blocked in
lamina calls: in ``end_step`` until fewer than ``queue_limit`` steps are
unreleased by some consumer rank, and in ``close`` until every consumer rank
has said goodbye (``serve='calls'``: only then).

Statistics follow the record: the commit sends the record without them,
and each rank answers a consumer's ``Request.STATS`` for a step and
dataset with the statistics of its blocks, reduced at that first request
(or on the statistics worker thread from ``put`` on, with
``background_stats=True``; ``docs/transport.md``).

A consumer task may follow every step (``flow='all'``), only the newest
one whenever it is ready (``'latest'``: the producer never waits for it)
or every N-th step; it then sees a stream of its own, numbered 0, 1, 2, ...

Every wait polls with a timeout (:class:`.wire.Poll`), so a consumer that
stops answering gives :class:`~lamina.errors.TransportError` instead of a
hang.  See ``docs/transport.md`` for the protocol.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import os
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from ... import comm as comm_mod
from ... import stats as stats_mod
from ...catalog import (
    KIND_CLOSE,
    KIND_META,
    KIND_STEP,
    BlockCodec,
    BlockTable,
    Record,
    decode_packed,
    pack,
)
from ...catalog.record import unpack
from ...errors import ModeError, TransportError
from ...geometry import Box
from ...text import fmt_bytes
from ...workflow import routes
from ...workflow.routes import LATEST
from ..block import StepHeads
from ..staging import Chunk, PutLog
from . import rendezvous, wire
from .common import ABANDON_PATIENCE, MPI, TransportBase
from .wire import Poll, Request

if TYPE_CHECKING:
    from mpi4py.MPI import Intercomm

Tag = comm_mod.Tag


class _Reduce:
    """The statistics of a block, computed the first time they are asked for (no checksums)."""

    __slots__ = ("arr", "value")

    def __init__(self, arr: np.ndarray) -> None:
        self.arr: np.ndarray | None = arr
        self.value: tuple | None = None

    def done(self) -> bool:
        return True

    def result(self):
        if self.arr is not None:
            self.value = (stats_mod.compute(self.arr, 0, checksum=False)[0], (0,))
            self.arr = None
        return self.value


NEVER = np.iinfo(np.int64).max
#: bytes of block tables a producer keeps of the steps every consumer released, for
#: ``ds.blocks(k)``, ``coverage`` and the like on the producer's side: past it the oldest
#: are forgotten (a long stream's metadata would otherwise grow by about 100 bytes a block
#: a step); a forgotten step's tables raise StepError
RECORDS_KEPT = 64 << 20
#: longest sleep of an idle serving thread between polls (a new request waits at most this long)
SERVER_IDLE = 2e-3


@dataclasses.dataclass
class Link:
    """The producer's connection to one consumer task."""

    app: int
    inter: Intercomm
    size: int
    released: np.ndarray  # per consumer rank: every step before this one is released
    bye: np.ndarray  # per consumer rank: closed
    flow: int = 1  # every flow-th step; LATEST: the newest step whenever the task is ready
    delivered: list[int] = dataclasses.field(
        default_factory=list
    )  # steps sent, not yet released by all
    last: int = -1  # the last step delivered
    count: int = 0  # steps delivered: the consumer's step count
    #: per consumer rank (flow 'latest'): it waits for a step of this one or later (Request.WANT)
    wanted: np.ndarray | None = None

    @property
    def low(self) -> int:
        return int(self.released.min())

    @property
    def ready(self) -> int:
        """Every consumer rank released, or waits for, the steps from this one on."""
        if self.wanted is None:
            return self.low
        return int(np.maximum(self.released, self.wanted).min())


class Producer(TransportBase):
    """The producer side: serves its steps to the consumer tasks of its name (module docstring)."""

    ENDS_STREAMS = True

    #: statistics follow the record on request (module docstring); BothProducer's file needs them in it
    DEFER_STATS = True
    #: the tables of released steps are forgotten past RECORDS_KEPT (BothProducer's file keeps them)
    FORGETS = True

    def __init__(self, name: str = "mpi") -> None:
        super().__init__(name)
        self._links: list[Link] = []
        # step -> dataset id -> this rank's blocks of it, in put order (their rows in the step's table)
        self._data: dict[int, dict[int, list[np.ndarray | None]]] = {}
        self._staged: dict[int, list[np.ndarray | None]] = {}
        # step -> this rank's blocks of it, whose statistics are computed after the commit
        self._stats_logs: dict[int, PutLog] = {}
        self._stats_waiting: list[tuple[Link, int, np.ndarray]] = []  # STATS requests not ready yet
        self._lazy_stats = False  # statistics reduced on request (see _connect)
        self._sends = wire.SendQueue()  # records and control messages
        self._answers = wire.SendQueue()  # data answers to GETs
        self._dirty = False  # releases or steps changed since the last _drop_released
        self._worst = 0  # _unreleased() as of the last _drop_released
        # released steps whose block tables are kept, oldest first, with their bytes
        self._kept: collections.deque[tuple[int, int]] = collections.deque()
        self._kept_bytes = 0
        self._why_forgotten = self._forgotten  # one bound method for every forgotten step
        self._newest: tuple[int, bytes] | None = None  # the last step's record, for late delivery
        self._steps_held = 0  # steps whose blocks this rank holds (committed here)
        # GETs for a step this rank has not committed yet: a consumer may have its record (from
        # another producer rank) before this rank is done with the commit; answered once it is
        self._deferred: list[tuple[Link, int, np.ndarray]] = []
        # the serving thread, and the lock it shares with the program's thread (every use of
        # the links, the held steps and the send queues takes it; re-entrant)
        self._lock = threading.RLock()
        self._server: threading.Thread | None = None
        self._stop = threading.Event()
        self._server_error: BaseException | None = None
        self._gave_up = False  # end_step raised TransportError (a consumer stopped answering)
        self._serving_here = (
            0  # > 0 while the program's thread serves (in end_step, close): the thread rests
        )

    def _connect(
        self, name: str, app: int, route: routes.Route, wf: routes.Workflow | None
    ) -> None:
        if "flow" in self.options:
            raise ValueError(
                "flow is chosen by each consumer (lamina.open(name, 'r', flow=...)), not by the producer"
            )
        if self.DEFER_STATS and self._with_stats:
            # the record goes out first; statistics are reduced when a consumer first asks for
            # them (background_stats=True: on the worker thread from put on, asked or not)
            self._stats_in_record = False
            self._lazy_stats = not self.background_stats
        links = rendezvous.connect_producer(
            self.comm, name, app, route.consumers, self.timeout, key=self.rendezvous_key
        )
        for c, inter, flow in links:
            n = inter.Get_remote_size()
            self._links.append(
                Link(
                    c,
                    inter,
                    n,
                    np.zeros(n, dtype=np.int64),
                    np.zeros(n, dtype=bool),
                    flow,
                    wanted=np.zeros(n, dtype=np.int64),
                )
            )
        if self.serve_mode == "thread" and self._links:
            self._server = threading.Thread(
                target=self._server_loop, name=f"lamina-serve {name}", daemon=True
            )
            self._server.start()

    def define(self, spec):
        # blocks stay in memory: no compression (the spec readers see says so)
        return super().define(dataclasses.replace(spec, codecs=()))

    def put(self, name: str, box: Box, array: np.ndarray, copy: bool = True) -> None:
        # copy=False promises the array only until end_step, but consumers read a step later:
        # blocks are copied unless their dataset is shallow (see _stage)
        super().put(name, box, array, True)

    def put_many(self, name: str, starts: np.ndarray, arrays, copy: bool = True) -> None:
        super().put_many(name, starts, arrays, True)  # copied, as put

    def _place(self, spec, arr: np.ndarray, copy: bool, start) -> tuple:
        if copy and any(fnmatch.fnmatchcase(spec.path, pat) for pat in self.shallow):
            copy = False  # shallow: keep the caller's array until consumers release the step
        return super()._place(spec, arr, copy, start)

    def _recycle(self, c: Chunk) -> None:
        """Staging chunks hold the blocks served to consumers: never reused (dropped with their step)."""

    def _job(self, arr: np.ndarray):
        if self._lazy_stats:
            return _Reduce(arr)  # when a consumer asks
        return super()._job(arr)

    def _summarize(self, c: Chunk) -> None:
        if not self._lazy_stats:  # lazily: the chunk is reduced when a consumer asks
            super()._summarize(c)

    def _move(self, heads: StepHeads) -> list[tuple[int, int, int, int]]:
        """Nothing moves: this rank keeps its blocks (as arrays of their boxes) to serve them."""
        log = self._log
        self._staged = {}
        for did, rows in log.rows.items():
            dt = self.catalog.specs[did].dtype
            arrays: list[np.ndarray | None] = []
            starts, stops = log.boxes(did, self.catalog.specs[did].ndim)
            for r, shape in zip(rows, map(tuple, (stops - starts).tolist()), strict=True):
                c = log.chunk[r]
                if c is not None:
                    raw = c.buf[log.coff[r] : log.coff[r] + log.length[r]]
                    arrays.append(raw.view(dt).reshape(shape))
                elif log.codec[r] == BlockCodec.RAW:
                    arrays.append(log.payload[r])
                elif log.codec[r] == BlockCodec.MULTIRES:  # a band: served whole (Request.PAYLOAD)
                    arrays.append(np.frombuffer(log.payload[r], dtype=np.uint8))
                else:
                    arrays.append(None)  # statistics only: nothing to serve
            self._staged[did] = arrays
        return []

    def _committed(self, raw: bytes) -> None:
        """Collective (called on every producer rank after each commit): keep the step, send records."""
        with self._lock:
            self._committed_locked(raw)

    def _committed_locked(self, raw: bytes) -> None:
        head, _ = unpack(raw, "committed record")
        kind = head[0] if len(head) else -1
        step = -1
        deliver = [True] * len(self._links)
        rec = None
        if kind == KIND_STEP:
            step = len(self.catalog.steps) - 1
            self._data[step] = self._staged
            if not self._stats_in_record:  # keep the step's blocks until their statistics are asked
                self._stats_logs[step] = self._log
                self._log = PutLog()
            self._steps_held = step + 1
            self._dirty = True
            deliver = self._decide(step)
            if any(link.flow != 1 for link in self._links):
                rec, _ = decode_packed(raw, self.catalog, "committed record", apply_ops=False)
                if any(link.flow == LATEST for link in self._links):
                    self._newest = (step, raw)
        elif kind == KIND_CLOSE:
            self._deliver_newest()
        self._staged = {}
        if kind == KIND_STEP and self._deferred:
            waiting, self._deferred = self._deferred, []
            for link, src, buf in waiting:
                self._answer(link, src, buf)
        for link, yes in zip(self._links, deliver, strict=True):
            if kind == KIND_STEP and yes:
                link.delivered.append(step)
                link.last = step
            if kind != KIND_STEP or (yes and link.flow == 1):
                self._send_record(link, step if kind == KIND_STEP else -1, raw)
            elif yes:  # a thinned stream: the consumer numbers the steps it gets 0, 1, 2, ...
                assert rec is not None  # decoded above whenever a link thins the stream
                self._send_record(link, step, self._restep(raw, rec, link.count, rec.ops))
            elif (
                rec is not None and rec.ops
            ):  # a skipped step's metadata changes still reach the consumer
                meta = Record(KIND_META, -1, rec.session, rec.nranks, rec.time, rec.ops)
                self._send_record(link, -1, pack(meta.encode(self.catalog.specs)[0], b""))
            if kind == KIND_STEP and yes:
                link.count += 1

    def _restep(self, raw: bytes, rec: Record, step: int, ops: list) -> bytes:
        """The packed record *raw* (decoded: *rec*) numbered *step*, with *ops* as its metadata."""
        _, area = unpack(raw, "committed record")
        head, _ = dataclasses.replace(rec, step=step, ops=list(ops)).encode(self.catalog.specs)
        return pack(head, bytes(area))

    def _decide(self, step: int) -> list[bool]:
        """Collective: which consumer tasks get *step* (every N-th: fixed; latest: rank 0's view, broadcast)."""
        out = [link.flow != LATEST and step % link.flow == 0 for link in self._links]
        if not any(link.flow == LATEST for link in self._links):
            return out
        if self.rank == 0:
            self._serve_once()  # the freshest view of the releases
            flags = bytes(
                int(link.flow == LATEST and (link.last < 0 or link.ready > link.last))
                for link in self._links
            )
        else:
            flags = None
        got = comm_mod.bcast_bytes(self.comm, flags, root=0)
        return [o or bool(f) for o, f in zip(out, got, strict=True)]

    def _deliver_newest(self) -> None:
        """Collective, at close: a latest consumer that has not got the last step gets it now."""
        last = len(self.catalog.steps) - 1
        for link in self._links:
            if link.flow != LATEST or last < 0 or link.last == last or link.bye.all():
                continue
            link.delivered.append(last)
            link.last = last
            assert self._newest is not None and self._newest[0] == last
            raw = self._newest[1]
            rec, _ = decode_packed(raw, self.catalog, "committed record", apply_ops=False)
            # its ops went out at its commit
            self._send_record(link, last, self._restep(raw, rec, link.count, []))
            link.count += 1

    def _send_record(self, link: Link, step: int, raw: bytes) -> None:
        flags = wire.STATS_FOLLOW if step >= 0 and not self._stats_in_record else 0
        buf = np.empty(16 + len(raw), dtype=np.uint8)
        buf[:16] = np.array([step, flags], dtype=np.int64).view(np.uint8)
        buf[16:] = np.frombuffer(raw, dtype=np.uint8)
        for r in range(self.rank, link.size, self.size):  # this rank's share of the consumer ranks
            if not link.bye[r]:
                self._sends.send(link.inter, [buf, MPI.BYTE], None, r, Tag.RECORD)

    def _unreleased(self) -> int:
        """The most steps some blocking consumer task holds (delivered, not released by all its ranks)."""
        with self._lock:
            if self._dirty:
                self._drop_released()
            return self._worst

    def _all_bye(self) -> bool:
        return all(bool(link.bye.all()) for link in self._links)

    def _drop_released(self) -> None:
        """Independent: forget the data of every step no consumer task may still read."""
        self._dirty = False
        keep: set[int] = set()
        self._worst = 0
        for link in self._links:
            low = link.low
            link.delivered = [k for k in link.delivered if k >= low]
            keep.update(link.delivered)
            if link.flow != LATEST and not link.bye.all():
                self._worst = max(self._worst, len(link.delivered))
            if link.flow == LATEST and not link.bye.all() and self.catalog.steps:
                keep.add(
                    len(self.catalog.steps) - 1
                )  # may still go out, when the task is ready or at close
        for k in [k for k in self._data if k not in keep]:
            del self._data[k]
            self._stats_logs.pop(k, None)
            self._keep_tables(k)

    def _keep_tables(self, step: int) -> None:
        """Keep the block tables of *step*, released by every consumer, while the released
        steps' tables fit in :data:`RECORDS_KEPT`; forget the oldest beyond it."""
        if not self.FORGETS or step >= len(self.catalog.steps):
            return
        sb = self.catalog.steps[step]
        # its decoded tables and the encoded sections its loader holds (the committed record)
        n = sb.nbytes + sum(sec.length for sec in sb.sections.values())
        self._kept.append((step, n))
        self._kept_bytes += n
        while self._kept_bytes > RECORDS_KEPT and len(self._kept) > 1:
            old, n = self._kept.popleft()
            self._kept_bytes -= n
            self.catalog.forget(old, self._why_forgotten)

    def _forgotten(self, step: int) -> str:
        return (
            f"{self.path}: step {step} was released by every consumer and its blocks "
            f"forgotten: a producer keeps those of its released steps up to "
            f"{fmt_bytes(RECORDS_KEPT)} (lamina.engines.transport.producer.RECORDS_KEPT), "
            f"the newest first"
        )

    def _serve_once(self) -> bool:
        """Independent: answer every waiting request; True if anything happened (either thread)."""
        with self._lock:
            return self._serve_once_locked()

    def _serve_once_locked(self) -> bool:
        busy = False
        for link in self._links:
            while True:
                got = comm_mod.poll_bytes(link.inter, comm_mod.ANY_SOURCE, Tag.REQUEST)
                if got is None:
                    break
                busy = True
                self._answer(link, *got)
        if self._stats_waiting and any(self._stats_ready(w[2]) for w in self._stats_waiting):
            waiting, self._stats_waiting = self._stats_waiting, []
            for link, src, buf in waiting:
                self._answer(link, src, buf)
            busy = True
        if self._sends.test():
            busy = True
        if self._answers.test(wire.BURST):
            busy = True
        if self._dirty:
            self._drop_released()
        return busy

    def _answer(self, link: Link, src: int, buf: np.ndarray) -> None:
        if len(buf) % 8 or not len(buf):
            raise TransportError(
                f"malformed request of {len(buf)} bytes from consumer task {link.app} rank {src}"
            )
        words = buf.view(np.int64)
        kind = int(words[0])
        if kind == Request.GET and len(words) >= 5:
            step, did, nd, row = int(words[1]), int(words[2]), int(words[3]), int(words[4])
            if step >= self._steps_held:  # not committed here yet: answered at its commit
                self._deferred.append((link, src, buf))
                return
            if len(words) != 5 + 2 * nd or not 0 <= did < len(self.catalog.specs):
                raise TransportError(
                    f"malformed data request from consumer task {link.app} rank {src}"
                )
            want = Box(
                tuple(int(v) for v in words[5 : 5 + nd]), tuple(int(v) for v in words[5 + nd :])
            )
            item = self.catalog.specs[did].dtype.itemsize
            found = self._held(step, did, row, want)
            for c in wire.chunks(want, item):
                if found is None:  # not held here (released, or never written): empty answers
                    self._answers.send(
                        link.inter, [np.zeros(0, dtype=np.uint8), MPI.BYTE], None, src, Tag.DATA
                    )
                else:
                    held_box, held = found
                    spec, dt = wire.region_spec(held, c.shift(tuple(-a for a in held_box.start)))
                    self._answers.send(link.inter, spec, dt, src, Tag.DATA)
        elif kind == Request.GETS and len(words) >= 5:
            step, did, nd, n = int(words[1]), int(words[2]), int(words[3]), int(words[4])
            if step >= self._steps_held:  # not committed here yet: answered at its commit
                self._deferred.append((link, src, buf))
                return
            if not (
                0 <= nd <= 64
                and 0 < n <= wire.PACKED_PIECES
                and len(words) == 5 + n * (1 + 2 * nd)
                and 0 <= did < len(self.catalog.specs)
            ):
                raise TransportError(
                    f"malformed data request from consumer task {link.app} rank {src}"
                )
            packed = self._packed(step, did, words[5:].reshape(n, 1 + 2 * nd))
            self._answers.send(link.inter, [packed, MPI.BYTE], None, src, Tag.DATA)
        elif kind == Request.PAYLOAD and len(words) == 4:
            step, did, row = int(words[1]), int(words[2]), int(words[3])
            if step >= self._steps_held:  # not committed here yet: answered at its commit
                self._deferred.append((link, src, buf))
                return
            band = self._held_band(step, did, row)
            out = band if band is not None else np.zeros(0, dtype=np.uint8)
            self._answers.send(link.inter, [out, MPI.BYTE], None, src, Tag.DATA)
        elif kind == Request.STATS and len(words) == 3:
            self._answer_stats(link, src, buf)
        elif kind == Request.RELEASE and len(words) == 2:
            link.released[src] = max(int(link.released[src]), int(words[1]))
            self._dirty = True
        elif kind == Request.WANT and len(words) == 2 and link.wanted is not None:
            link.wanted[src] = max(int(link.wanted[src]), int(words[1]))
        elif kind == Request.BYE and len(words) == 1:
            link.bye[src] = True
            link.released[src] = NEVER
            self._dirty = True
            if src % self.size == self.rank:  # the last message of the record stream to this rank
                self._sends.send(
                    link.inter, [np.zeros(0, dtype=np.uint8), MPI.BYTE], None, src, Tag.RECORD
                )
        else:
            raise TransportError(f"unknown request {kind} from consumer task {link.app} rank {src}")

    def _stats_ready(self, buf: np.ndarray) -> bool:
        """Whether the STATS request *buf* can be answered now (its step's statistics are reduced)."""
        step = int(buf.view(np.int64)[1])
        log = self._stats_logs.get(step)
        return step < self._steps_held and (log is None or log.ready())

    def _answer_stats(self, link: Link, src: int, buf: np.ndarray) -> None:
        """``[STATS, step, did]``: this rank's statistics of dataset *did* in *step*, once reduced."""
        words = buf.view(np.int64)
        step, did = int(words[1]), int(words[2])
        if not 0 <= did < len(self.catalog.specs):
            raise TransportError(
                f"malformed statistics request from consumer task {link.app} rank {src}"
            )
        if not self._stats_ready(buf):  # not committed here yet, or still being reduced
            self._stats_waiting.append((link, src, buf))
            return
        log = self._stats_logs.get(step)
        if log is None:  # released (or never deferred): nothing to say
            out = np.zeros(0, dtype=np.uint8)
        else:
            dt = self.catalog.specs[did].dtype
            log.reduce_staged(did)  # chunks not reduced yet (lazily: the first request does it)
            _, _, _, has, smin, smax, ssum, count = log.stats_columns(did, dt, 0, False, True)
            out = wire.encode_stats(dt, has, smin, smax, ssum, count)
        self._answers.send(link.inter, [out, MPI.BYTE], None, src, Tag.STATS)

    def _held(self, step: int, did: int, row: int, want: Box) -> tuple[Box, np.ndarray] | None:
        """Block *row* of dataset *did*'s table at *step*, if this rank holds it and it contains *want*."""
        got = self._held_row(step, did, row)
        if got is None or got[0].codec[row] == BlockCodec.MULTIRES:
            return None  # (a band is bytes: served whole, never as a box)
        box = got[0].box(row)
        return (box, got[1]) if box.contains(want) else None

    def _packed(self, step: int, did: int, asked: np.ndarray) -> np.ndarray:
        """The boxes *asked* (rows of block, start..., stop...) of dataset *did* at *step*, their
        values one after another (``Request.GETS``); empty unless this rank holds every block
        asked and each contains its box."""
        none = np.zeros(0, dtype=np.uint8)
        arrays = self._data.get(step, {}).get(did)
        if arrays is None:
            return none
        t = self.catalog.table(did, step)
        nd = t.ndim
        rows, start, stop = asked[:, 0], asked[:, 1 : 1 + nd], asked[:, 1 + nd :]
        if asked.shape[1] != 1 + 2 * nd or ((rows < 0) | (rows >= len(t))).any():
            return none
        if (t.rank[rows] != self.rank).any() or (t.codec[rows] == BlockCodec.MULTIRES).any():
            return none  # (a band is bytes: served whole, never as a box)
        if ((start < t.start[rows]) | (stop > t.stop[rows]) | (start > stop)).any():
            return none
        local = rows - int(np.searchsorted(t.rank, self.rank, side="left"))
        if ((local < 0) | (local >= len(arrays))).any():
            return none
        dtype = self.catalog.specs[did].dtype
        if (start == t.start[rows]).all() and (stop == t.stop[rows]).all():
            # whole blocks (a reader of everything asks for them): one concatenation
            whole = [arrays[j] for j in local.tolist()]
            if any(held is None for held in whole):
                return none
            return np.concatenate(whole, axis=None, dtype=dtype).view(np.uint8)
        item = dtype.itemsize
        sizes = np.prod(stop - start, axis=1, dtype=np.int64) * item
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        at = 0
        rel0, rel1 = (start - t.start[rows]).tolist(), (stop - t.start[rows]).tolist()
        for k, (j, n) in enumerate(zip(local.tolist(), sizes.tolist(), strict=True)):
            held = arrays[j]
            if held is None:
                return none
            piece = held[tuple(map(slice, rel0[k], rel1[k]))]
            out[at : at + n].view(held.dtype).reshape(piece.shape)[...] = piece
            at += n
        return out

    def _held_band(self, step: int, did: int, row: int) -> np.ndarray | None:
        """The stored bytes of band *row* of dataset *did* at *step*, if this rank holds it."""
        got = self._held_row(step, did, row)
        if got is None or got[0].codec[row] != BlockCodec.MULTIRES:
            return None
        return got[1]

    def _held_row(self, step: int, did: int, row: int) -> tuple[BlockTable, np.ndarray] | None:
        """(the table, what this rank keeps of block *row*) of dataset *did* at *step*, if it holds it."""
        if not 0 <= did < len(self.catalog.specs):
            return None
        arrays = self._data.get(step, {}).get(did)
        if arrays is None:
            return None
        t = self.catalog.table(did, step)
        if not 0 <= row < len(t) or int(t.rank[row]) != self.rank:
            return None
        local = row - int(np.searchsorted(t.rank, self.rank, side="left"))
        held = arrays[local] if 0 <= local < len(arrays) else None
        return None if held is None else (t, held)

    def _serve(self, until, what: str) -> None:
        """Independent: serve consumers until *until()*; TransportError after *timeout* s without progress."""
        poll = Poll(self.timeout)
        with self._serving():
            while True:
                busy = self._serve_once()
                if until():
                    return
                if busy:
                    poll.reset()
                elif poll.expired:
                    raise TransportError(
                        f"{self.path}: waited {self.timeout:g} s for {what}; no consumer request came"
                    )
                else:
                    poll.sleep(active=len(self._answers) > 0)

    def _server_loop(self) -> None:
        """The serving thread: answer requests while the program computes between lamina calls.

        It rests while the program's thread serves itself (in end_step and
        close), spins only while its answers are in flight or just after
        progress, and otherwise sleeps up to :data:`SERVER_IDLE` between
        polls.  An error ends the thread and is raised by the program's next
        lamina call on this file.
        """
        poll = Poll(float("inf"))
        try:
            while not self._stop.is_set():
                if self._serving_here:
                    self._stop.wait(SERVER_IDLE)
                    continue
                if self._serve_once():
                    poll.reset()
                elif len(self._answers) or time.monotonic() < poll.spin_until:
                    os.sched_yield()
                else:
                    self._stop.wait(min(poll.delay, SERVER_IDLE))
                    poll.delay *= 2
        except BaseException as e:  # noqa: BLE001 - handed to the program's thread
            self._server_error = e

    def _check_server(self) -> None:
        """Raise, on the program's thread, what stopped the serving thread."""
        if self._server_error is not None:
            e, self._server_error = self._server_error, None
            if isinstance(e, TransportError):
                raise e
            raise TransportError(f"{self.path}: serving consumers failed: {e}") from e

    @contextmanager
    def _serving(self):
        """The program's thread serves; the serving thread rests meanwhile."""
        self._check_server()
        self._serving_here += 1
        try:
            yield
        finally:
            self._serving_here -= 1

    def _stop_server(self) -> None:
        if self._server is not None:
            self._stop.set()
            self._server.join()
            self._server = None

    def end_step(self) -> None:
        self._check_server()
        # (named: a rank in another collective call, a define or a close, raises with this
        # one instead of meeting it and going on to a collective of its own)
        self._gather(comm_mod.CALL_END_STEP)
        super().end_step()
        g = comm_mod.Guard()
        with g:
            # serve until the queue has room, and finish the answers already started (a consumer
            # waiting on them would otherwise wait for this rank's next lamina call)
            self._serve(
                lambda: self._unreleased() < self.queue_limit and not self._data_in_flight(),
                f"consumers to release step {len(self.catalog.steps) - self.queue_limit}",
            )
        try:
            comm_mod.agree(self.comm, g.error)
        except TransportError:
            self._gave_up = True  # a consumer is gone: close does not wait for it a second time
            raise

    def refresh(self) -> int:
        """Collective (trivially): a producer knows every step it committed."""
        return len(self.catalog.steps)

    def _data_in_flight(self) -> bool:
        return len(self._answers) > 0

    def check_can_read(self) -> None:
        raise ModeError(
            f"{self.path}: a producer of the memory transport cannot read back what it wrote"
        )

    # every read is refused once its arguments are checked, whatever the box holds (a box
    # without blocks read as the fill value, one with blocks raised)
    def get(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        self.check_read(name, box, step, out)
        self.check_can_read()

    def get_collective(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        self.check_read(name, box, step, out)
        self.check_can_read()

    def get_level(
        self,
        name: str,
        box: Box,
        step: int | None,
        out: np.ndarray,
        level: int = 0,
        cache: dict | None = None,
        tolerance: float | None = None,
    ) -> int:
        self.check_step(step)
        self.check_can_read()
        return 0

    def _read_region(self, rec, spec, inter, dst) -> None:
        self.check_can_read()

    def _finish(self) -> None:
        self._gather(comm_mod.CALL_CLOSE)
        self._commit_close()
        g = comm_mod.Guard()
        with g:
            if self._gave_up:  # end_step already reported the lost consumer: take what came, go
                self._serve_once()
                self._stop_server()
                return
            self._serve(self._all_bye, "every consumer rank to close")
            self._stop_server()
            self._check_server()
            poll = Poll(self.timeout)
            while len(self._sends) or len(self._answers):
                if self._sends.test() + self._answers.test():
                    poll.reset()
                elif poll.expired:
                    raise TransportError(f"{self.path}: consumers did not take the last messages")
                else:
                    poll.sleep()
        comm_mod.agree(self.comm, g.error)

    def abandon(self) -> None:
        """Independent: leave after an error: end the record stream of this rank's consumer ranks
        (an empty record none of them said goodbye for), so that they stop waiting for steps
        at once instead of after their timeout; then as any engine."""
        if not self._closed:
            try:
                self._stop_server()
                ends = wire.SendQueue()
                empty = np.zeros(0, dtype=np.uint8)
                for link in self._links:
                    for r in range(self.rank, link.size, self.size):
                        if not link.bye[r]:
                            ends.send(link.inter, [empty, MPI.BYTE], None, r, Tag.RECORD)
                poll = Poll(min(self.timeout, ABANDON_PATIENCE))
                while len(ends) and not poll.expired:
                    if not ends.test():
                        poll.sleep()
            except Exception:  # noqa: BLE001 - already leaving after an error
                pass
        super().abandon()

    def _close_storage(self) -> None:
        self._stop_server()
        for link in self._links:
            comm_mod.free(link.inter)
        self._links = []
        self._data.clear()
        self._stats_logs.clear()
        self._stats_waiting = []
        self._sends = wire.SendQueue()
        self._answers = wire.SendQueue()


__all__ = ["Link", "Producer"]
