"""The consumer side of the in situ transport (engines ``mpi`` and ``both`` opened for reading).

Data never passes through a central rank.  A consumer rank reading a box
looks up in its catalog the blocks that meet the box and their producer
ranks, asks each of those ranks for the intersection (one ``GET`` per
piece), and receives the pieces straight into its output buffer
(``Irecv`` of contiguous numpy memory; a scratch buffer only where the
destination is not contiguous).  Where no producer wrote, the fill value.

A consumer rank releases every step before *k* when it asks for step *k*
(``f.at(k)``, the next iteration of ``iter_steps``, ``close``); reads made
ahead of the program (``iter_steps(prefetch=True)``, in
:meth:`Consumer.reading_ahead`) release nothing.  Every
wait polls with a timeout (:class:`.wire.Poll`), so a producer that stops
answering gives :class:`~lamina.errors.TransportError` instead of a hang.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from ... import comm as comm_mod
from ...catalog import (
    KIND_CLOSE,
    KIND_STEP,
    BlockTable,
    DatasetSpec,
    Decoder,
    Record,
    decode_packed,
)
from ...catalog.record import unpack
from ...errors import FormatError, StepError, TransportError
from ...geometry import Box, rows_prod
from ...layouts import read as layout_read
from ...layouts.spec import Layout
from ...workflow import routes
from ...workflow.routes import LATEST, parse_flow
from ..base import BlockInfo, step_number, under
from ..block import refuse_stats_only
from ..placement import place_pieces
from . import rendezvous, wire
from .common import ABANDON_PATIENCE, MPI, TransportBase
from .wire import Poll, Request

if TYPE_CHECKING:
    from mpi4py.MPI import Intercomm

Tag = comm_mod.Tag
_u8 = wire._u8


#: seconds a transfer waits without progress before it looks whether the producer left
LEFT_CHECK = 0.05


#: a method that asks producer ranks and takes their answers: one thread of a rank at a
#: time.  Answers come on (producer rank, tag) and MPI gives each to the oldest receive
#: posted for it: the reads of two threads at once took each other's bytes (wrong values,
#: or a truncation error).
_exchange = under("_exchanging")


class Consumer(TransportBase):
    """The consumer side: reads the steps a producer task serves (module docstring)."""

    def __init__(self, name: str = "mpi") -> None:
        super().__init__(name)
        self._inter: Intercomm | None = None  # the intercommunicator to the producer task
        self._source = 0  # the producer rank that sends this rank its records
        self._agreed = 0  # steps every consumer rank has (see refresh)
        self._agreed_closed = False
        self._cursor = 0  # steps before this one are released
        self._released_real = 0  # the producer's steps before this one are released
        # what a released step raises, made when raised: one bound method for every step
        self._why_released = self._released
        self._wanted_real = 0  # flow 'latest': a step of the producer's from this one is wanted
        self._real: list[int] = []  # the producer's step number of each step received
        self._ended = False  # the producer acknowledged this rank's goodbye (or left)
        # the producer left after an error (its empty record came unasked): it sends nothing
        # more, and every wait for it raises that at once (see _receive and _left_error)
        self._left = False
        self._bye_sent = False  # this rank said goodbye: an empty record answers it
        self._heard = time.monotonic()  # when the last record came
        self._waiting: tuple[int, float] | None = None  # (steps waited for, since when)
        # steps whose statistics are still with the producer ranks (asked for when first used),
        # and the (step, dataset id) pairs asked for already
        self._stats_follow: set[int] = set()
        self._stats_got: set[tuple[int, int]] = set()
        self._ahead = False  # reads are made ahead of the program: they release nothing
        self._exchanging = threading.RLock()  # held by a read's requests and answers (_exchange)
        # records received and not applied yet: (message, producer step, flags, kind) from the first
        # that changes the datasets, groups, attributes or definitions on (applied by refresh,
        # on every rank alike: see _receive)
        self._held: list[tuple[np.ndarray, int, int, int]] = []

    @property
    def inter(self) -> Intercomm:
        """The intercommunicator to the producer task (once open)."""
        if self._inter is None:
            raise ValueError(f"{self.path!r} is not open")
        return self._inter

    def _connect(
        self, name: str, app: int, route: routes.Route, wf: routes.Workflow | None
    ) -> None:
        flow = self.options.get("flow")  # the option wins over the workflow
        if flow is not None:
            self.flow = parse_flow(flow)
        else:
            said = wf.flow(name, app) if wf is not None else None
            self.flow = 1 if said is None else said
        patience = max(self.timeout, self.wait)  # for the producer to open the name at all
        self._inter = rendezvous.connect_consumer(
            self.comm, name, app, route.producer, patience, self.flow, key=self.rendezvous_key
        )
        self._source = (
            self.comm.rank % self.inter.Get_remote_size()
        )  # the producer rank sending records here
        # wait for the producer's first record (its first step, or its close), so that the
        # datasets and definitions are known once open returns, as for a file
        g = comm_mod.Guard()
        with g:
            self._receive(
                until=lambda: self.catalog.nrecords + len(self._held) > 0,
                what=f"the first step of {name!r}",
            )
        comm_mod.agree(self.comm, g.error)
        self.refresh()

    def _receive(self, until=None, what: str = "", timeout: float | None = None) -> None:
        """Independent: apply the records that have arrived; with *until*, wait for it (at most
        *timeout* s without a record, by default the transport's).

        A producer that left after an error ends the stream with an empty record: that is
        remembered, not raised here, so that the steps received before it are still taken up
        (``refresh``) and handed out; a wait for anything more (*until* not met) raises it at
        once, whichever thread (the program's, the read-ahead's) took the record in."""
        timeout = self.timeout if timeout is None else timeout
        poll = Poll(timeout)
        while True:
            got = comm_mod.poll_bytes(self.inter, self._source, Tag.RECORD)
            if got is not None:
                buf = got[1]
                if not len(buf):
                    self._ended = True
                    if not self._bye_sent:  # not the answer to a goodbye: the producer left
                        self._left = True
                elif len(buf) < 17:
                    raise TransportError(
                        f"{self.path}: malformed record message of {len(buf)} bytes"
                    )
                else:
                    real, flags = (int(v) for v in buf[:16].view(np.int64))
                    kind, changes = _head_of(buf)
                    if self._held or changes:
                        # a record that changes what every rank sees (datasets, groups,
                        # attributes, definitions), and those after it, wait for refresh:
                        # applied in an independent call here, ranks at one step saw
                        # different datasets and made different collective reads
                        self._held.append((buf, real, flags, kind))
                    else:
                        self._apply(buf, real, flags)
                self._heard = time.monotonic()
                poll.reset()
                continue
            if until is None or until():
                return
            if self._left:
                raise self._left_error()
            if poll.expired:
                raise TransportError(
                    f"{self.path}: no message from the producer in {timeout:g} s waiting for {what}"
                )
            poll.sleep()

    def _left_error(self) -> TransportError:
        return TransportError(
            f"{self.path}: the producer left the stream after an error of its own: no more "
            f"steps come ({self._steps_in()} received)"
        )

    def _heard_left(self) -> bool:
        """Independent, while this rank waits for answers: take in the records that arrived;
        whether the producer left (it answers nothing more)."""
        self._receive()
        return self._left

    def _apply(self, buf: np.ndarray, real: int, flags: int) -> None:
        """Apply the record message *buf* (after its 16 bytes of producer step and flags)."""
        where = f"{self.path}: record {self.catalog.nrecords}"
        rec, blocks = decode_packed(buf[16:], self.catalog, where)
        self.catalog.apply_record(rec, ops_applied=True, blocks=blocks)
        if rec.kind == KIND_STEP:
            self._real.append(real)
            step = len(self.catalog.steps) - 1
            if step < self._cursor:  # released before it arrived (a wait for a later step)
                self.catalog.forget(step, self._why_released)
            elif flags & wire.STATS_FOLLOW:
                self._stats_follow.add(step)

    def _take_held(self, records: int | None = None, step: int | None = None) -> None:
        """Apply held records in order: until the catalog holds *records* records, or step
        *step*, or all of them."""
        while self._held:
            if records is not None and self.catalog.nrecords >= records:
                return
            if step is not None and step < len(self.catalog.steps):
                return
            buf, real, flags, _ = self._held.pop(0)
            self._apply(buf, real, flags)

    def _steps_in(self) -> int:
        """Steps received, applied or held."""
        return len(self.catalog.steps) + sum(h[3] == KIND_STEP for h in self._held)

    def _closed_in(self) -> bool:
        """Whether the producer's close record was received (applied or held)."""
        return self.catalog.closed or any(h[3] == KIND_CLOSE for h in self._held)

    @property
    def steps(self) -> int:
        return self._agreed

    @property
    def writer_closed(self) -> bool:
        return self._agreed_closed

    def producer_step(self, step: int) -> int:
        """The producer's number of this consumer's *step* (they differ when a flow policy skips steps)."""
        return self._real[step]

    def refresh(self) -> int:
        """Collective: take up the steps every consumer rank has received."""
        self._gather(comm_mod.CALL_REFRESH)
        g = comm_mod.Guard()
        with g:
            self._receive()
            self._check_silence()
            if self._left and self._agreed >= self._steps_in():
                # every step received was taken up by an earlier refresh: none comes any more
                raise self._left_error()
        comm_mod.agree(self.comm, g.error)
        # the records every rank has received are applied on every rank (those held: the
        # first that changes the metadata and those after it)
        upto = comm_mod.allreduce_int(self.comm, self.catalog.nrecords + len(self._held), "min")
        g = comm_mod.Guard()
        with g:
            self._take_held(records=upto)
        comm_mod.agree(self.comm, g.error)
        self._agreed = comm_mod.allreduce_int(self.comm, len(self.catalog.steps), "min")
        self._agreed_closed = bool(
            comm_mod.allreduce_int(self.comm, int(self.catalog.closed), "min")
        )
        return self._agreed

    def wait_steps(self, count: int, seconds: float) -> None:
        """Independent: wait up to *seconds* for the record of step *count* - 1 (or the close).

        Every step before the one before it is released first (``wait_for_step(k)``,
        ``iter_steps(start=k)``): a producer that waits for releases before it commits more
        (``queue_limit``, at least 2) would otherwise never send it.  The step just before
        stays, so that a program waiting for the next step of a stream that ends can still
        read the last one it was given; asking for step *k* itself (``f.at(k)``) releases it.
        """
        if not self._ahead and not self.catalog.closed:
            self._release(count - 2)
            if self.flow == LATEST and self._real:
                # ready for a newer step, the one held kept: the producer sends it the newest
                self._want(self._real[-1] + 1)
        now = time.monotonic()
        if self._waiting is None or self._waiting[0] != count:
            self._waiting = (count, now)
        end = now + seconds
        self._receive(
            until=lambda: self._steps_in() >= count or self._closed_in() or time.monotonic() >= end,
            what=f"step {count - 1}",
        )

    def _check_silence(self) -> None:
        """In refresh: a producer silent for *timeout* s while this rank waits for a step is gone."""
        if self._waiting is None:
            return
        count, since = self._waiting
        if self._steps_in() >= count or self._closed_in():
            self._waiting = None
            return
        quiet = time.monotonic() - max(since, self._heard)
        if quiet > self.timeout:
            raise TransportError(
                f"{self.path}: no message from the producer in {quiet:.1f} s waiting for step {count - 1} "
                f"(timeout {self.timeout:g} s)"
            )

    @contextmanager
    def reading_ahead(self) -> Iterator[None]:
        """Independent: reads of later steps made inside (the background layer's read-ahead of
        step k + 1 while the program reads step k) release no step: the program does, when it
        asks for a step itself."""
        self._ahead = True
        try:
            yield
        finally:
            self._ahead = False

    def _release(self, k: int) -> None:
        """Independent: tell every producer rank that this rank is done with every step before
        *k* that it can name: all of them where step k - 1 arrived or every step comes, else
        (a flow that skips steps) those received so far; called again as more arrive."""
        if k <= self._cursor:
            return
        # in the producer's numbering: up to the step before k (k itself may not have arrived)
        if k - 1 < len(self._real):
            real, cursor = self._real[k - 1] + 1, k
        elif self.flow == 1:
            real, cursor = k, k
        else:  # step k - 1 has not arrived (its number is not known): the steps received have
            if len(self._real) <= self._cursor:
                return  # none since the last release
            real, cursor = self._real[-1] + 1, len(self._real)
        before, self._cursor = self._cursor, cursor
        for gone in range(before, cursor):  # never read again here: their blocks go
            self.catalog.forget(gone, self._why_released)
            self._stats_follow.discard(gone)
        if self._stats_got:
            self._stats_got = {got for got in self._stats_got if got[0] >= cursor}
        if real <= self._released_real:
            return
        self._released_real = real
        self._tell_all([Request.RELEASE, real], "the producer to take a release")

    def _released(self, step: int) -> str:
        return (
            f"step {step} of {self.path!r} was released: the memory transport keeps a step only "
            f"until its consumers ask for a later one (this rank is at step {self._cursor})"
        )

    def _want(self, real: int) -> None:
        """Independent (flow 'latest'): tell every producer rank that this rank waits for a
        step of the producer's *real* or later, once."""
        if real <= self._wanted_real:
            return
        self._wanted_real = real
        self._tell_all([Request.WANT, real], "the producer to take a request")

    def _tell_all(self, words: list[int], what: str, timeout: float | None = None) -> None:
        """Independent: send the request *words* to every producer rank; wait until each took
        it (at most *timeout* s without progress, by default the transport's)."""
        if self._left:
            return  # a producer that left takes no request (nor needs any)
        msg = np.array(words, dtype=np.int64)
        reqs = [
            comm_mod.isend_bytes(self.inter, _u8(msg), r, Tag.REQUEST)
            for r in range(self.inter.Get_remote_size())
        ]
        self._wait(reqs, what, timeout)

    def _wait(self, reqs: list, what: str, timeout: float | None = None) -> list[int]:
        timeout = self.timeout if timeout is None else timeout
        poll = Poll(timeout)
        while True:
            counts = comm_mod.test_requests(reqs)
            if counts is not None:
                return counts
            if poll.expired:
                raise TransportError(
                    f"{self.path}: waited {timeout:g} s for {what}; the producer does not answer"
                )
            poll.sleep()

    def check_step(self, step: int | None) -> int:
        """Independent: resolve *step*; on a consumer, wait for it and release every earlier step.

        ``None`` (a plain ``f[...]``) is the latest step every consumer rank has,
        ``f.steps - 1`` (as the latest committed step is for a file): the same on every
        rank, whatever each received since the last ``refresh``; asking for it releases
        nothing (a step the program iterates over stays readable, as in a file)."""
        self._receive()
        n = len(self.catalog.steps)
        if step is None:
            if self._agreed == 0:
                raise StepError(f"{self.path!r} has no steps yet")
            latest = self._agreed - 1
            if latest < self._cursor:
                raise StepError(
                    f"step {latest} of {self.path!r} (the latest step every consumer rank has, "
                    f"read by a plain f[...]) was released: this rank asked for step "
                    f"{self._cursor} (read it with f.at({self._cursor}), or refresh first)"
                )
            return latest
        step = step_number(step)
        if step < 0:
            step += n
            if step < 0:
                raise StepError(
                    f"step {step - n} does not exist in {self.path!r}: {n} step(s) so far"
                )
        if step < self._cursor:
            raise StepError(self._released(step))
        if step >= self._steps_in() and self._closed_in():
            raise self._never(step)  # before any release: a step asked for in vain frees nothing
        if not self._ahead:
            self._release(step)
        if step >= len(self.catalog.steps):

            def arrived() -> bool:
                if not self._ahead:  # steps before it that arrive meanwhile go as they come
                    self._release(step)
                return step < self._steps_in() or self._closed_in()

            self._receive(until=arrived, what=f"step {step}")
            # a step past those the ranks agreed on, read alone: its records applied here
            self._take_held(step=step)
            if step >= len(self.catalog.steps):
                raise self._never(step)
        return step

    def _never(self, step: int) -> StepError:
        return StepError(
            f"step {step} will never exist: the producer of {self.path!r} closed it after "
            f"{len(self.catalog.steps)} steps"
        )

    def block_table(self, name: str, step: int, stats: bool = True, level: int = 0) -> BlockTable:
        t = super().block_table(name, step, stats, level)
        if stats and step in self._stats_follow and len(t):
            spec = self.catalog.level(name, level)
            if (step, spec.id) not in self._stats_got:
                self._fetch_stats(spec, step, t)
                self._stats_got.add((step, spec.id))
        return t

    def blocks(self, name: str, step: int) -> Sequence[BlockInfo]:
        self.block_table(name, step)  # the statistics first, where they follow the record
        return super().blocks(name, step)

    @_exchange
    def _fetch_stats(self, spec: DatasetSpec, step: int, t: BlockTable) -> None:
        """Independent: ask every producer rank that wrote blocks of *spec* in *step* for their statistics.

        Producers reduce their blocks while consumers fetch the data, and
        answer once done (module docstring of the producer); the answers
        fill in the table's statistics.
        """
        if step < self._cursor:
            raise StepError(
                f"step {step} of {self.path!r} was released: its statistics are gone with it"
            )
        ranks = np.unique(t.rank).tolist()
        msg = np.array([Request.STATS, self._real[step], spec.id], dtype=np.int64)
        reqs = [comm_mod.isend_bytes(self.inter, _u8(msg), r, Tag.REQUEST) for r in ranks]
        what = f"statistics of {spec.path!r} at step {step}"
        left = set(ranks)
        poll = Poll(self.timeout)
        heard = time.monotonic()
        while left:
            got = comm_mod.poll_bytes(self.inter, comm_mod.ANY_SOURCE, Tag.STATS)
            if got is None:
                if poll.expired:
                    raise TransportError(
                        f"{self.path}: waited {self.timeout:g} s for the {what}; the producer does not answer"
                    )
                if time.monotonic() - heard > LEFT_CHECK:
                    heard = time.monotonic()
                    if self._heard_left():  # (answers that had come were taken above)
                        raise self._left_error()
                poll.sleep()
                continue
            src, buf = got
            if src not in left:
                raise TransportError(f"{self.path}: producer rank {src} sent unasked {what}")
            left.discard(src)
            if not len(buf):
                raise TransportError(f"{self.path}: producer rank {src} no longer holds the {what}")
            rows = np.flatnonzero(t.rank == src)
            cols = wire.decode_stats(buf, spec.dtype, len(rows), f"{what} from producer rank {src}")
            t.set_stats(rows, *cols)
            poll.reset()
        self._wait(reqs, f"the producer to take a request for the {what}")

    @_exchange
    def payloads(self, step: int, wanted, into: np.ndarray | None = None) -> list[list[np.ndarray]]:
        """The stored bytes of blocks (bands of multiresolution datasets), whole, from the producer
        ranks that hold them: one ``PAYLOAD`` request and one receive per block, all in flight
        together; the layout decodes them as it does a file's."""
        xfer = wire.Transfers()
        got: list[list[np.ndarray]] = []
        asked = []  # (request index, group, position, producer rank, expected bytes)
        for g, (spec, t, rows) in enumerate(wanted):
            got.append([])
            for k, r in enumerate(np.asarray(rows, dtype=np.int64).tolist()):
                n, rank = int(t.length[r]), int(t.rank[r])
                buf = np.empty(n, dtype=np.uint8)
                got[g].append(buf)
                asked.append(
                    (xfer.recv(self.inter, [buf, MPI.BYTE], None, rank, Tag.DATA), g, k, rank, n)
                )
                msg = np.array([Request.PAYLOAD, self._real[step], spec.id, r], dtype=np.int64)
                xfer.send(self.inter, [_u8(msg), MPI.BYTE], None, rank, Tag.REQUEST)
        self._transfer(xfer, lambda: f"{len(asked)} encoded blocks")
        for i, g, k, rank, n in asked:
            if xfer.counts[i] != n:
                spec, t, rows = wanted[g]
                raise TransportError(
                    f"{self.path}: producer rank {rank} no longer holds block "
                    f"{t.box(int(rows[k]))} of {spec.path!r}"
                )
        return got

    def _transfer(self, xfer: wire.Transfers, what) -> None:
        """Independent: complete *xfer*; TransportError after *timeout* s without progress."""
        poll = Poll(self.timeout)
        heard = time.monotonic()
        while len(xfer):
            if xfer.test(wire.BURST):
                poll.reset()
            elif poll.expired:
                xfer.cancel()  # a late answer must not land in the caller's memory
                raise TransportError(
                    f"{self.path}: waited {self.timeout:g} s for {what()}; the producer does not answer"
                )
            else:
                if time.monotonic() - heard > LEFT_CHECK:
                    # no answer yet: a producer that left after an error ended the record
                    # stream (an empty record), taken in here or earlier by any call of this
                    # rank's (the read-ahead thread's too): it answers nothing more
                    heard = time.monotonic()
                    try:
                        gone = self._heard_left()
                    except BaseException:
                        xfer.cancel()
                        raise
                    if gone:
                        xfer.cancel()
                        raise self._left_error()
                poll.sleep(active=True)  # the pipeline moves only while both sides call MPI

    def get_collective(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        """Collective: each rank reads its own *box* as :meth:`get` does (the pieces come
        straight from the producer ranks that hold them: no block is read twice to share
        out), an error on any rank raised on every rank."""
        g = comm_mod.Guard()
        with g:
            self.get(name, box, step, out)
        comm_mod.agree(self.comm, g.error)

    @_exchange
    def get(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        spec, step = self.check_read(name, box, step, out)
        layout = Layout.of(spec)
        if layout is not None:  # encoded bands, fetched whole and decoded here
            self._count_read(layout_read.read(self, spec, layout, box, step, 0, out))
            return
        t = self.catalog.table(spec.id, step)
        idx, lo, hi = t.hits(box.start, box.stop)
        covered = int(rows_prod(hi - lo).sum()) if len(idx) else 0
        if covered < box.size:
            out[...] = spec.fill_scalar()
        real = self._real[step]
        item = spec.dtype.itemsize
        direct = out.flags.c_contiguous
        xfer = wire.Transfers()
        pieces = []  # (first request, chunk sizes in bytes, scratch or None, box, producer rank)
        neg = tuple(-a for a in box.start)
        refuse_stats_only(spec, t, idx, step)  # (as a file's reader says it)
        piece_bytes = rows_prod(hi - lo) * item
        small = piece_bytes <= wire.PACKED
        packs = self._ask_packed(
            xfer, spec, real, t, idx[small], lo[small], hi[small], piece_bytes[small]
        )
        big = ~small
        for i, a, b in zip(idx[big].tolist(), lo[big].tolist(), hi[big].tolist(), strict=True):
            inter = Box(tuple(a), tuple(b))
            rank = int(t.rank[i])
            if (
                direct
            ):  # straight into the output, a subarray datatype where the piece is not contiguous
                target, shift, tmp = out, neg, None
            else:
                tmp = np.empty(inter.shape, dtype=spec.dtype)
                target, shift = tmp, tuple(-v for v in inter.start)
            first = len(xfer.reqs)
            sizes = []
            for c in wire.chunks(inter, item):
                bspec, dt = wire.region_spec(target, c.shift(shift))
                xfer.recv(self.inter, bspec, dt, rank, Tag.DATA)
                sizes.append(c.size * item)
            pieces.append((first, sizes, tmp, inter, rank))
            hdr = np.array(
                [Request.GET, real, spec.id, spec.ndim, i, *inter.start, *inter.stop],
                dtype=np.int64,
            )
            xfer.send(self.inter, [_u8(hdr), MPI.BYTE], None, rank, Tag.REQUEST)
        if not xfer.reqs:
            return
        self._transfer(xfer, lambda: f"{spec.path!r} {box} at step {step}")
        for first, sizes, tmp, inter, rank in pieces:
            if xfer.counts[first : first + len(sizes)] != sizes:
                raise TransportError(
                    f"{self.path}: producer rank {rank} no longer holds {spec.path!r} {inter} of step {step}"
                )
            if tmp is not None:
                out[inter.shift(neg).slices] = tmp
        for first, scratch, a, b, rank in packs:
            if xfer.counts[first] != len(scratch):
                first_box = Box(tuple(a[0].tolist()), tuple(b[0].tolist()))
                held = (
                    f"{spec.path!r} {first_box}"
                    if len(a) == 1
                    else f"every one of {len(a)} pieces of {spec.path!r} asked together, the "
                    f"first {first_box},"
                )
                raise TransportError(
                    f"{self.path}: producer rank {rank} no longer holds {held} of step {step}"
                )
            place_pieces(scratch.view(spec.dtype), a - np.asarray(box.start), b - a, out)
        self._count_read(covered * item)  # what the producer ranks sent

    def _ask_packed(
        self,
        xfer: wire.Transfers,
        spec: DatasetSpec,
        real: int,
        t: BlockTable,
        idx: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
        nbytes: np.ndarray,
    ) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray, int]]:
        """Ask for the pieces *lo*..*hi* (of *nbytes* each) of blocks *idx* of *t*, each small,
        packed many in a message (``Request.GETS``: one request and one answer per producer rank and
        :data:`.wire.PACKED_PIECES`, at most :data:`.wire.CHUNK` bytes); the receives posted
        in *xfer*.  Per message ``(its request, scratch, starts, stops, producer rank)``."""
        out: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, int]] = []
        if not len(idx):
            return out
        ranks = t.rank[idx]
        for rank in np.unique(ranks).tolist():
            mine = np.flatnonzero(ranks == rank)
            # cut where a message would pass either limit
            ends = np.cumsum(nbytes[mine])
            k = 0
            while k < len(mine):
                base = int(ends[k - 1]) if k else 0
                stop = int(np.searchsorted(ends, base + wire.CHUNK, side="right"))
                stop = min(max(stop, k + 1), k + wire.PACKED_PIECES, len(mine))
                sel = mine[k:stop]
                a, b = lo[sel], hi[sel]
                scratch = np.empty(int(ends[stop - 1]) - base, dtype=np.uint8)
                first = xfer.recv(self.inter, [scratch, MPI.BYTE], None, rank, Tag.DATA)
                rows = np.column_stack([idx[sel], a, b]).astype(np.int64, copy=False)
                hdr = np.concatenate(
                    [
                        np.array([Request.GETS, real, spec.id, spec.ndim, len(sel)], np.int64),
                        rows.reshape(-1),
                    ]
                )
                xfer.send(self.inter, [_u8(hdr), MPI.BYTE], None, rank, Tag.REQUEST)
                out.append((first, scratch, a, b, rank))
                k = stop
        return out

    def _finish(self) -> None:
        g = comm_mod.Guard()
        with g:
            self._goodbye()
        # (named, as a reader's close: a rank still in a refresh or a collective read raises
        # with this one, where it waited for ever)
        comm_mod.agree(self.comm, g.error, call=comm_mod.CALL_CLOSE)

    def _goodbye(self, timeout: float | None = None) -> None:
        """Consumer: release everything, say goodbye to every producer rank, drain the record
        stream (each wait at most *timeout* s, by default the transport's)."""
        self._bye_sent = True
        self._tell_all([Request.BYE], "the producer to take this rank's goodbye", timeout)

        def acknowledged() -> bool:
            # answers to requests given up after a timeout may still come: take and drop them
            while comm_mod.poll_bytes(self.inter, comm_mod.ANY_SOURCE, Tag.DATA) is not None:
                pass
            return self._ended

        self._receive(
            until=acknowledged, what="the producer to acknowledge the close", timeout=timeout
        )

    def abandon(self) -> None:
        """Independent: leave after an error of this rank's (or another's): say goodbye first,
        as close does, so that the producer stops waiting for this rank's releases and goes on
        with its steps (the goodbye's own failure, a producer gone too, changes nothing)."""
        if not self._closed and self._inter is not None and not self._ended:
            try:
                self._goodbye(min(self.timeout, ABANDON_PATIENCE))
            except Exception:  # noqa: BLE001 - already leaving after an error
                pass
        super().abandon()

    def _close_storage(self) -> None:
        if self._inter is not None:
            comm_mod.free(self._inter)
            self._inter = None


def _head_of(buf: np.ndarray) -> tuple[int, int]:
    """The kind of the record in message *buf* (after its producer step and flags) and its
    count of metadata changes (datasets, groups, attributes, definitions); (-1, 0) where the
    message cannot say (it is decoded, and refused, where it is applied)."""
    try:
        head, _ = unpack(buf[16:], "record message")
        d = Decoder(bytes(head), "record message")
        kind = Record.read_head(d)[0]
        return kind, d.u32()
    except FormatError:
        return -1, 0


__all__ = ["Consumer"]
