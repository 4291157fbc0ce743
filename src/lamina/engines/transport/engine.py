"""Engine ``mpi``: a producer program serves its datasets to consumer programs over MPI.

The producer side is a :class:`~lamina.engines.core.BlockEngine` whose
"storage" is the producer ranks' own memory: the commit protocol runs as for
files (headers allgathered, overlaps refused, statistics computed, one
record per step), and every committed record reaches every consumer rank
(consumer rank *j* gets it from producer rank *j* mod P, so the fan-out is
spread over the producers), so consumers hold the same catalog (groups, datasets,
attributes, extension records such as derived-quantity definitions,
per-step blocks with their statistics and producer rank).

Data never passes through a central rank.  A consumer rank reading a box
looks up in its catalog the blocks that meet the box and their producer
ranks, asks each of those ranks for the intersection (one ``GET`` per
piece), and receives the pieces straight into its output buffer
(``Irecv`` of contiguous numpy memory; a scratch buffer only where the
destination is not contiguous).  Where no producer wrote, the fill value.

Producers answer requests on a serving thread while the program computes
(``serve='thread'``, the default; it needs ``MPI_THREAD_MULTIPLE``), and
on the program's thread while it is blocked in lamina calls: in
``end_step`` until fewer than ``queue_limit`` steps are unreleased by some
consumer rank, and in ``close`` until every consumer rank has said
goodbye (``serve='calls'``: only then).  A
consumer rank releases every step before *k* when it asks for step *k*
(``f.at(k)``, the next iteration of ``iter_steps``, ``close``).

A consumer task may follow every step (``flow='all'``), only the newest
one whenever it is ready (``'latest'``: the producer never waits for it)
or every N-th step; it then sees a stream of its own, numbered 0, 1, 2, ...

Every wait polls with a timeout (:class:`.wire.Poll`: bursts of MPI
progress while bytes move, sleeps only when idle), so a peer that stops
answering gives :class:`~lamina.errors.TransportError` instead of a hang.
See ``docs/transport.md`` for the protocol.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import threading
import time
from contextlib import contextmanager

import numpy as np

from ... import comm as comm_mod
from ... import stats as stats_mod
from ...catalog import KIND_CLOSE, KIND_META, KIND_STEP, Record
from ...errors import FormatError, ModeError, StepError, TransportError
from ...geometry import Box
from ..base import register
from ..core import CODEC_STATS_ONLY, BlockEngine, Header, Pending
from . import rendezvous, wire, workflow
from .wire import Poll
from .workflow import LATEST, parse_flow

#: intercommunicator tags
TAG_RECORD = 11  # producer rank j % P -> consumer rank j: int64 step + committed record bytes; empty: no more
TAG_REQUEST = 12  # consumer rank -> producer rank: int64 words, see REQ_*
TAG_DATA = 13  # producer rank -> consumer rank: one chunk of a requested box; empty: not held

REQ_GET = 1  # [1, step, dataset id, ndim, start..., stop...]
REQ_RELEASE = 2  # [2, k]: every step before k is released by this consumer rank
REQ_BYE = 3  # [3]: this consumer rank closed; it releases everything

NEVER = np.iinfo(np.int64).max

DEFAULT_TIMEOUT = 60.0
TIMEOUT_ENV = "LAMINA_TRANSPORT_TIMEOUT"
SERVE_ENV = "LAMINA_TRANSPORT_SERVE"
#: how producers answer requests: a serving thread (default), or only inside lamina calls
SERVE_MODES = ("thread", "calls")
#: longest sleep of an idle serving thread between polls (a new request waits at most this long)
SERVER_IDLE = 2e-3

#: options only this engine knows; other engines never see them (see lamina.api.file)
TRANSPORT_OPTIONS = {"timeout", "queue_limit", "shallow", "flow", "serve", "stats"}

_u8 = wire._u8
MPI = wire.MPI


class _NoStats:
    """A block sent without statistics (``stats=False``): queries on consumers read it whatever they ask."""

    def result(self):
        return None, (0,)


class _StatsOnly:
    """A block's statistics job with one placeholder checksum (the record format wants one per block)."""

    def __init__(self, job) -> None:
        self.job = job

    def result(self):
        st, _ = self.job.result()
        return st, (0,)


@dataclasses.dataclass
class Link:
    """The producer's connection to one consumer task."""

    app: int
    inter: object
    size: int
    released: np.ndarray  # per consumer rank: every step before this one is released
    bye: np.ndarray  # per consumer rank: closed
    flow: int = 1  # every flow-th step; LATEST: the newest step whenever the task is ready
    delivered: list[int] = dataclasses.field(
        default_factory=list
    )  # steps sent, not yet released by all
    last: int = -1  # the last step delivered
    count: int = 0  # steps delivered: the consumer's step count

    @property
    def low(self) -> int:
        return int(self.released.min())


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
        self._data: dict[
            int, dict[int, list[tuple[Box, np.ndarray]]]
        ] = {}  # producer: step -> id -> blocks
        self._staged: list[tuple[int, Box, np.ndarray]] = []
        self._sends = wire.SendQueue()  # records and control messages
        self._answers = wire.SendQueue()  # data answers to GETs
        self._dirty = False  # producer: releases or steps changed since the last _drop_released
        self._worst = 0  # producer: _unreleased() as of the last _drop_released
        self._newest: tuple[int, Record] | None = None  # producer: the last step, for late delivery
        self._source = 0  # consumer: the producer rank that sends this rank its records
        self._agreed = 0  # consumer: steps every consumer rank has (see refresh)
        self._agreed_closed = False
        self._cursor = 0  # consumer: steps before this one are released
        self._released_real = 0  # consumer: the producer's steps before this one are released
        self._real: list[int] = []  # consumer: the producer's step number of each step received
        self._ended = False  # consumer: the producer acknowledged this rank's goodbye
        self._heard = time.monotonic()  # consumer: when the last record came
        self._waiting: tuple[int, float] | None = None  # consumer: (steps waited for, since when)
        # producer: the serving thread, and the lock it shares with the program's thread (every
        # use of the links, the held steps and the send queues takes it; re-entrant)
        self._lock = threading.RLock()
        self._server: threading.Thread | None = None
        self._stop = threading.Event()
        self._server_error: BaseException | None = None
        self._gave_up = (
            False  # producer: end_step raised TransportError (a consumer stopped answering)
        )
        self._serving_here = (
            0  # > 0 while the program's thread serves (in end_step, close): the thread rests
        )

    # ------------------------------------------------------------ open
    def _open_storage(self, path: str, mode: str) -> None:
        if mode == "a":
            raise ModeError(
                "the memory transport streams new steps: open with 'w' (producer) or 'r' (consumer)"
            )
        name = workflow.normname(path)
        app = comm_mod.appnum()
        wf = workflow.from_env()
        for k, v in workflow.options_for(name, mode, app, wf).items():
            self.options.setdefault(k, v)  # the workflow's defaults; the caller's options win
        env_timeout = os.environ.get(TIMEOUT_ENV)
        self.timeout = float(self.options.get("timeout", env_timeout or DEFAULT_TIMEOUT))
        self.queue_limit = int(self.options.get("queue_limit", 2))
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.queue_limit < 2:
            # a consumer releases step k when it asks for step k+1, which the producer must be free to make
            raise ValueError(f"queue_limit must be at least 2, got {self.queue_limit}")
        self.segment = 0  # no checksums in memory: one placeholder per block (see _stage)
        serve = (
            str(self.options.get("serve", os.environ.get(SERVE_ENV) or "thread")).strip().lower()
        )
        if serve not in SERVE_MODES:
            raise ValueError(f"serve must be one of {', '.join(SERVE_MODES)}, got {serve!r}")
        if serve == "thread" and MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise ValueError(
                "serve='thread' needs MPI initialized with MPI_THREAD_MULTIPLE "
                f"(this MPI gives level {MPI.Query_thread()}); use serve='calls'"
            )
        self.serve_mode = serve
        stats = self.options.get("stats", True)
        if not isinstance(stats, bool | np.bool_):
            raise ValueError(f"stats must be True or False, got {stats!r}")
        self.with_stats = bool(stats)
        shallow = self.options.get("shallow", ())
        shallow = (shallow,) if isinstance(shallow, str) else shallow
        self.shallow = tuple(str(p).lstrip("/") for p in shallow)  # dataset paths have no leading /
        route = workflow.route_for(name, mode, app, comm_mod.task_count(), wf)
        if mode == "w":
            if "flow" in self.options:
                raise ValueError(
                    "flow is chosen by each consumer (lamina.open(name, 'r', flow=...)), not by the producer"
                )
            links = rendezvous.connect_producer(self.comm, name, app, route.consumers, self.timeout)
            for c, inter, flow in links:
                n = inter.Get_remote_size()
                self._links.append(
                    Link(c, inter, n, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool), flow)
                )
            if self.serve_mode == "thread" and self._links:
                self._server = threading.Thread(
                    target=self._server_loop, name=f"lamina-serve {name}", daemon=True
                )
                self._server.start()
        else:
            flow = self.options.get("flow")  # the option wins over the workflow
            if flow is not None:
                self.flow = parse_flow(flow)
            else:
                said = wf.flow(name, app) if wf is not None else None
                self.flow = 1 if said is None else said
            self._inter = rendezvous.connect_consumer(
                self.comm, name, app, route.producer, self.timeout, self.flow
            )
            self._source = (
                self.comm.rank % self._inter.Get_remote_size()
            )  # the producer rank sending records here
            # wait for the producer's first record (its first step, or its close), so that the
            # datasets and definitions are known once open returns, as for a file
            g = comm_mod.Guard()
            with g:
                self._receive(
                    until=lambda: self.catalog.nrecords > 0, what=f"the first step of {name!r}"
                )
            comm_mod.agree(self.comm, g.error)
            self.refresh()

    # ------------------------------------------------------------ producer
    def define(self, spec):
        # blocks stay in memory: no compression (the spec readers see says so)
        return super().define(dataclasses.replace(spec, codecs=()))

    def put(self, name: str, box: Box, array: np.ndarray, copy: bool = True) -> None:
        # copy=False promises the array only until end_step, but consumers read a step later:
        # blocks are copied unless their dataset is shallow (see _stage)
        super().put(name, box, array, True)

    def _stage(self, p: Pending, copy: bool) -> None:
        if copy and any(fnmatch.fnmatchcase(p.spec.path, pat) for pat in self.shallow):
            copy = False  # shallow: keep the caller's array until consumers release the step
        if copy:
            p.data = p.data.copy()
        # statistics for the index; no checksums: the bytes are never stored, MPI moves them
        # on this thread unless asked (the serving loop holds the GIL and competes for the CPU)
        if not self.with_stats:
            p.job = _NoStats()
            return
        background = bool(self.options.get("background_stats", False))
        p.job = _StatsOnly(stats_mod.BlockJob(p.data, 0, checksum=False, background=background))

    def _move(self, headers: list[Header], mine: list[Pending]):
        self._staged = [
            (p.spec.id, p.box, p.data) for p in mine if p.data is not None and p.codec == 0
        ]
        return []

    def _write_record(self, raw: bytes) -> None:
        pass

    def _committed(self, raw: bytes) -> None:
        """Collective (called on every producer rank after each commit): keep the step, send records."""
        with self._lock:
            self._committed_locked(raw)

    def _committed_locked(self, raw: bytes) -> None:
        kind = raw[0] if raw else -1
        step = -1
        deliver = [True] * len(self._links)
        rec = None
        if kind == KIND_STEP:
            step = len(self.catalog.steps) - 1
            held: dict[int, list[tuple[Box, np.ndarray]]] = {}
            for did, box, arr in self._staged:
                held.setdefault(did, []).append((box, arr))
            self._data[step] = held
            self._dirty = True
            deliver = self._decide(step)
            if any(link.flow != 1 for link in self._links):
                rec = Record.decode(raw, self.catalog, "committed record", apply_ops=False)
                if any(link.flow == LATEST for link in self._links):
                    self._newest = (step, rec)
        elif kind == KIND_CLOSE:
            self._deliver_newest()
        self._staged = []
        for link, yes in zip(self._links, deliver, strict=True):
            if kind == KIND_STEP and yes:
                link.delivered.append(step)
                link.last = step
            if kind != KIND_STEP or (yes and link.flow == 1):
                self._send_record(link, step if kind == KIND_STEP else -1, raw)
            elif yes:  # a thinned stream: the consumer numbers the steps it gets 0, 1, 2, ...
                local = dataclasses.replace(rec, step=link.count)
                self._send_record(link, step, local.encode(self.catalog.specs))
            elif rec.ops:  # a skipped step's metadata changes still reach the consumer, in order
                meta = dataclasses.replace(rec, kind=KIND_META, step=-1, blocks=[])
                self._send_record(link, -1, meta.encode(self.catalog.specs))
            if kind == KIND_STEP and yes:
                link.count += 1

    def _decide(self, step: int) -> list[bool]:
        """Collective: which consumer tasks get *step* (every N-th: fixed; latest: rank 0's view, broadcast)."""
        out = [link.flow != LATEST and step % link.flow == 0 for link in self._links]
        if not any(link.flow == LATEST for link in self._links):
            return out
        if self.rank == 0:
            self._serve_once()  # the freshest view of the releases
            flags = bytes(
                int(link.flow == LATEST and (link.last < 0 or link.low > link.last))
                for link in self._links
            )
        else:
            flags = None
        flags = comm_mod.bcast_bytes(self.comm, flags, root=0)
        return [o or bool(f) for o, f in zip(out, flags, strict=True)]

    def _deliver_newest(self) -> None:
        """Collective, at close: a latest consumer that has not got the last step gets it now."""
        last = len(self.catalog.steps) - 1
        for link in self._links:
            if link.flow != LATEST or last < 0 or link.last == last or link.bye.all():
                continue
            link.delivered.append(last)
            link.last = last
            s, rec = self._newest
            assert s == last
            local = dataclasses.replace(
                rec, step=link.count, ops=[]
            )  # its ops went out at its commit
            self._send_record(link, last, local.encode(self.catalog.specs))
            link.count += 1

    def _send_record(self, link: Link, step: int, raw: bytes) -> None:
        buf = np.empty(8 + len(raw), dtype=np.uint8)
        buf[:8] = np.array([step], dtype=np.int64).view(np.uint8)
        buf[8:] = np.frombuffer(raw, dtype=np.uint8)
        for r in range(self.rank, link.size, self.size):  # this rank's share of the consumer ranks
            if not link.bye[r]:
                self._sends.send(link.inter, [buf, MPI.BYTE], None, r, TAG_RECORD)

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

    def _serve_once(self) -> bool:
        """Independent: answer every waiting request; True if anything happened (either thread)."""
        with self._lock:
            return self._serve_once_locked()

    def _serve_once_locked(self) -> bool:
        busy = False
        for link in self._links:
            while True:
                got = comm_mod.poll_bytes(link.inter, comm_mod.ANY_SOURCE, TAG_REQUEST)
                if got is None:
                    break
                busy = True
                self._answer(link, *got)
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
        if kind == REQ_GET and len(words) >= 4:
            step, did, nd = int(words[1]), int(words[2]), int(words[3])
            if len(words) != 4 + 2 * nd or not 0 <= did < len(self.catalog.specs):
                raise TransportError(
                    f"malformed data request from consumer task {link.app} rank {src}"
                )
            want = Box(
                tuple(int(v) for v in words[4 : 4 + nd]), tuple(int(v) for v in words[4 + nd :])
            )
            item = self.catalog.specs[did].dtype.itemsize
            found = None
            for box, arr in self._data.get(step, {}).get(did, ()):
                if box.contains(want):
                    found = box, arr
                    break
            neg = tuple(-a for a in found[0].start) if found else None
            for c in wire.chunks(want, item):
                if found is None:  # not held here (released, or never written): empty answers
                    self._answers.send(
                        link.inter, [np.zeros(0, dtype=np.uint8), MPI.BYTE], None, src, TAG_DATA
                    )
                else:
                    spec, dt = wire.region_spec(found[1], c.shift(neg))
                    self._answers.send(link.inter, spec, dt, src, TAG_DATA)
        elif kind == REQ_RELEASE and len(words) == 2:
            link.released[src] = max(int(link.released[src]), int(words[1]))
            self._dirty = True
        elif kind == REQ_BYE and len(words) == 1:
            link.bye[src] = True
            link.released[src] = NEVER
            self._dirty = True
            if src % self.size == self.rank:  # the last message of the record stream to this rank
                self._sends.send(
                    link.inter, [np.zeros(0, dtype=np.uint8), MPI.BYTE], None, src, TAG_RECORD
                )
        else:
            raise TransportError(f"unknown request {kind} from consumer task {link.app} rank {src}")

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

    # ------------------------------------------------------------ the serving thread
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
        if self.mode == "r":
            return super().end_step()  # raises ModeError
        self._check_server()
        self._gather()
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

    def _gather(self) -> None:
        """Collective: wait for every rank of this task, serving consumers meanwhile.

        Ranks that arrive early would otherwise spin in the blocking
        collectives of the commit and take the CPU from a rank still
        sending; here they sleep once idle.  No timeout: the other ranks
        are this program's own (a blocking collective has none either).
        """
        if self.size == 1:
            return
        req = self.comm.Ibarrier()
        poll = Poll(self.timeout)
        with self._serving():
            while not req.Test():
                if self.mode != "r" and self._serve_once():
                    poll.reset()
                else:
                    poll.sleep(active=len(self._answers) > 0)

    def _data_in_flight(self) -> bool:
        return len(self._answers) > 0

    def _read_region(self, rec, spec, inter, dst) -> None:
        raise ModeError(
            f"{self.path}: a producer of the memory transport cannot read back what it wrote"
        )

    # ------------------------------------------------------------ consumer
    def _receive(self, until=None, what: str = "") -> None:
        """Independent: apply the records that have arrived; with *until*, wait for it (timeout)."""
        poll = Poll(self.timeout)
        while True:
            got = comm_mod.poll_bytes(self._inter, self._source, TAG_RECORD)
            if got is not None:
                buf = got[1]
                if not len(buf):
                    self._ended = True
                elif len(buf) < 9:
                    raise TransportError(
                        f"{self.path}: malformed record message of {len(buf)} bytes"
                    )
                else:
                    real = int(buf[:8].view(np.int64)[0])
                    where = f"{self.path}: record {self.catalog.nrecords}"
                    rec = Record.decode(buf[8:].tobytes(), self.catalog, where)
                    self.catalog.apply_record(rec, ops_applied=True)
                    if rec.kind == KIND_STEP:
                        self._real.append(real)
                self._heard = time.monotonic()
                poll.reset()
                continue
            if until is None or until():
                return
            if poll.expired:
                raise TransportError(
                    f"{self.path}: no message from the producer in {self.timeout:g} s waiting for {what}"
                )
            poll.sleep()

    @property
    def steps(self) -> int:
        return self._agreed if self.mode == "r" else len(self.catalog.steps)

    @property
    def writer_closed(self) -> bool:
        return self._agreed_closed if self.mode == "r" else self.catalog.closed

    def producer_step(self, step: int) -> int:
        """The producer's number of this consumer's *step* (they differ when a flow policy skips steps)."""
        if self.mode != "r":
            return int(step)
        return self._real[step]

    def refresh(self) -> int:
        """Collective: take up the steps every consumer rank has received."""
        if self.mode != "r":
            return len(self.catalog.steps)
        self._gather()
        g = comm_mod.Guard()
        with g:
            self._receive()
            self._check_silence()
        comm_mod.agree(self.comm, g.error)
        self._agreed = comm_mod.allreduce_int(self.comm, len(self.catalog.steps), "min")
        self._agreed_closed = bool(
            comm_mod.allreduce_int(self.comm, int(self.catalog.closed), "min")
        )
        return self._agreed

    def wait_steps(self, count: int, seconds: float) -> None:
        """Independent: wait up to *seconds* for the record of step *count* - 1 (or the close)."""
        if self.mode != "r":
            return super().wait_steps(count, seconds)
        now = time.monotonic()
        if self._waiting is None or self._waiting[0] != count:
            self._waiting = (count, now)
        end = now + seconds
        self._receive(
            until=lambda: (
                len(self.catalog.steps) >= count or self.catalog.closed or time.monotonic() >= end
            ),
            what=f"step {count - 1}",
        )

    def _check_silence(self) -> None:
        """In refresh: a producer silent for *timeout* s while this rank waits for a step is gone."""
        if self._waiting is None:
            return
        count, since = self._waiting
        if len(self.catalog.steps) >= count or self.catalog.closed:
            self._waiting = None
            return
        quiet = time.monotonic() - max(since, self._heard)
        if quiet > self.timeout:
            raise TransportError(
                f"{self.path}: no message from the producer in {quiet:.1f} s waiting for step {count - 1} "
                f"(timeout {self.timeout:g} s)"
            )

    def _release(self, k: int) -> None:
        """Independent: tell every producer rank that this rank is done with every step before *k*."""
        if k <= self._cursor:
            return
        self._cursor = k
        # in the producer's numbering: up to the step before k (k itself may not have arrived)
        if k - 1 < len(self._real):
            real = self._real[k - 1] + 1
        else:
            real = k if self.flow == 1 else self._released_real
        if real <= self._released_real:
            return
        self._released_real = real
        msg = np.array([REQ_RELEASE, real], dtype=np.int64)
        reqs = [
            comm_mod.isend_bytes(self._inter, _u8(msg), r, TAG_REQUEST)
            for r in range(self._inter.Get_remote_size())
        ]
        self._wait(reqs, "the producer to take a release")

    def _wait(self, reqs: list, what: str) -> list[int]:
        poll = Poll(self.timeout)
        while True:
            counts = comm_mod.test_requests(reqs)
            if counts is not None:
                return counts
            if poll.expired:
                raise TransportError(
                    f"{self.path}: waited {self.timeout:g} s for {what}; the producer does not answer"
                )
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
                raise StepError(
                    f"step {step - n} does not exist in {self.path!r}: {n} step(s) so far"
                )
        if step < self._cursor:
            raise StepError(
                f"step {step} of {self.path!r} was released: the memory transport keeps a step only "
                f"until its consumers ask for a later one (this rank is at step {self._cursor})"
            )
        self._release(step)
        if step >= len(self.catalog.steps):
            self._receive(
                until=lambda: step < len(self.catalog.steps) or self.catalog.closed,
                what=f"step {step}",
            )
            if step >= len(self.catalog.steps):
                raise StepError(
                    f"step {step} will never exist: the producer of {self.path!r} closed it after "
                    f"{len(self.catalog.steps)} steps"
                )
        return step

    def get(self, name: str, box: Box, step: int, out: np.ndarray) -> None:
        if self.mode != "r":
            return super().get(name, box, step, out)
        spec, step = self.check_read(name, box, step, out)
        hits = self.catalog.hits(spec.id, step, box)
        if sum(inter.size for _, inter in hits) < box.size:
            out[...] = spec.fill_scalar()
        real = self._real[step]
        item = spec.dtype.itemsize
        direct = out.flags.c_contiguous
        xfer = wire.Transfers()
        pieces = []  # (first request, chunk sizes in bytes, scratch or None, box, producer rank)
        neg = tuple(-a for a in box.start)
        for rec, inter in hits:
            if rec.codec == CODEC_STATS_ONLY:
                raise FormatError(
                    f"dataset {spec.path!r} keeps only statistics at step {step} (block {rec.box}); "
                    "its values are computed by the derived layer"
                )
            if (
                direct
            ):  # straight into the output, a subarray datatype where the piece is not contiguous
                target, shift, tmp = out, neg, None
            else:
                tmp = np.empty(inter.shape, dtype=spec.dtype)
                target, shift = tmp, tuple(-a for a in inter.start)
            first = len(xfer.reqs)
            sizes = []
            for c in wire.chunks(inter, item):
                bspec, dt = wire.region_spec(target, c.shift(shift))
                xfer.recv(self._inter, bspec, dt, rec.rank, TAG_DATA)
                sizes.append(c.size * item)
            pieces.append((first, sizes, tmp, inter, rec.rank))
            hdr = np.array(
                [REQ_GET, real, spec.id, spec.ndim, *inter.start, *inter.stop], dtype=np.int64
            )
            xfer.send(self._inter, [_u8(hdr), MPI.BYTE], None, rec.rank, TAG_REQUEST)
        if not xfer.reqs:
            return
        poll = Poll(self.timeout)
        while len(xfer):
            if xfer.test(wire.BURST):
                poll.reset()
            elif poll.expired:
                xfer.cancel()  # a late answer must not land in *out*
                raise TransportError(
                    f"{self.path}: waited {self.timeout:g} s for {spec.path!r} {box} at step {step}; "
                    "the producer does not answer"
                )
            else:
                poll.sleep(active=True)  # the pipeline moves only while both sides call MPI
        for first, sizes, tmp, inter, rank in pieces:
            if xfer.counts[first : first + len(sizes)] != sizes:
                raise TransportError(
                    f"{self.path}: producer rank {rank} no longer holds {spec.path!r} {inter} of step {step}"
                )
            if tmp is not None:
                out[inter.shift(neg).slices] = tmp

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
                self._gather()
                self._commit_close()
                g = comm_mod.Guard()
                with g:
                    if (
                        self._gave_up
                    ):  # end_step already reported the lost consumer: take what came, go
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
                            raise TransportError(
                                f"{self.path}: consumers did not take the last messages"
                            )
                        else:
                            poll.sleep()
                comm_mod.agree(self.comm, g.error)
        finally:
            self._closed = True
            self._close_storage()
            comm_mod.free(self.comm)

    def _goodbye(self) -> None:
        """Consumer: release everything, say goodbye to every producer rank, drain the record stream."""
        bye = np.array([REQ_BYE], dtype=np.int64)
        reqs = [
            comm_mod.isend_bytes(self._inter, _u8(bye), r, TAG_REQUEST)
            for r in range(self._inter.Get_remote_size())
        ]
        self._wait(reqs, "the producer to take this rank's goodbye")

        def acknowledged() -> bool:
            # answers to requests given up after a timeout may still come: take and drop them
            while comm_mod.poll_bytes(self._inter, comm_mod.ANY_SOURCE, TAG_DATA) is not None:
                pass
            return self._ended

        self._receive(until=acknowledged, what="the producer to acknowledge the close")

    def _close_storage(self) -> None:
        self._stop_server()
        for link in self._links:
            comm_mod.free(link.inter)
        self._links = []
        if self._inter is not None:
            comm_mod.free(self._inter)
            self._inter = None
        self._data.clear()
        self._sends = wire.SendQueue()
        self._answers = wire.SendQueue()


__all__ = ["TRANSPORT_OPTIONS", "TransportEngine"]
