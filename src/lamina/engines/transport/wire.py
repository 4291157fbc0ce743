"""Moving boxes of arrays between producer and consumer ranks: chunks, datatypes, requests, polling.

A requested box travels as one or more messages ("chunks") of at most
:data:`CHUNK` bytes: the box is cut into slabs along its outermost axes
(:func:`chunks`), the same way on both sides, so a consumer posts one
receive per chunk before asking and a 2 GiB message never occurs.  Chunks
also pipeline a large transfer and let both sides see progress while it
runs.

No chunk is packed by hand: a chunk that is a contiguous piece of its array
goes as bytes; one that is not (a column slab of a row-major block, a box
inside a larger output array) goes with an MPI subarray datatype over the
whole array, so MPI copies straight from the producer's block into the
consumer's output.

:class:`Transfers` tracks requests and what they keep alive; :class:`Poll`
is the wait loop: it spins (yielding the CPU) while transfers are in
flight or progress was recent, and sleeps with a growing delay only when
idle, so a shared-memory pipeline never stalls on a sleeping peer.

MPI comes from :mod:`lamina.comm` (the one place that imports mpi4py).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from enum import IntEnum
from itertools import islice

import numpy as np

from ... import comm as comm_mod
from ...catalog.blocks import stat_dtype, sum_dtype
from ...catalog.wire import Decoder, Encoder
from ...errors import FormatError
from ...geometry import Box

MPI = comm_mod.MPI


class Request(IntEnum):
    """What a consumer rank asks of a producer rank: the first int64 word of a ``Tag.REQUEST`` message."""

    #: ``[GET, step, dataset id, ndim, block, start..., stop...]``: send this box of that block (its
    #: row in the step's table of the dataset) of that step
    GET = 1
    #: ``[RELEASE, k]``: every step before *k* is released by this consumer rank
    RELEASE = 2
    #: ``[BYE]``: this consumer rank closed; it releases everything
    BYE = 3
    #: ``[STATS, step, dataset id]``: send the statistics of this producer rank's blocks of that
    #: dataset in that step (they follow the record: see :func:`encode_stats`)
    STATS = 4
    #: ``[PAYLOAD, step, dataset id, block]``: send that block's stored bytes whole (the encoded
    #: bands of a multiresolution dataset, which consumers decode as a file reader does)
    PAYLOAD = 5
    #: ``[WANT, k]``: this consumer rank (flow 'latest') waits for a step of k or later, keeping
    #: those before: the producer may send it a newer step without a release
    WANT = 6
    #: ``[GETS, step, dataset id, ndim, n, then n times (block, start..., stop...)]``: send these
    #: boxes of those blocks of that step in one message, each box's values in C order one
    #: after another (:data:`PACKED`); an empty message where this rank holds any of them no more
    GETS = 7


#: pieces of a read up to this many bytes travel packed, many in one message (``Request.GETS``):
#: a message of its own costs a request, a receive and an answer, hundreds of microseconds of
#: both sides' time for a piece of a few hundred bytes, where copying it costs well under one
PACKED = 1 << 16
#: pieces of one ``GETS`` at most (its request of 8 bytes a number stays small)
PACKED_PIECES = 4096


#: first word after the step in a record message: bit 0 set when the statistics follow on request
STATS_FOLLOW = 1


def encode_stats(dtype: np.dtype, has, smin, smax, ssum, count) -> np.ndarray:
    """A producer rank's statistics of its blocks of one dataset in one step (put order), as bytes.

    Layout: u64 n, then n flags (u1), minima and maxima (the dataset's
    statistics dtype), sums (its sum dtype) and counts (int64).
    """
    e = Encoder()
    e.u64(len(has))
    e.array(has, "u1")
    e.array(smin, stat_dtype(dtype))
    e.array(smax, stat_dtype(dtype))
    e.array(ssum, sum_dtype(dtype))
    e.array(count, "<i8")
    return np.frombuffer(e.getvalue(), dtype=np.uint8)


def decode_stats(buf, dtype: np.dtype, rows: int, what: str) -> tuple[np.ndarray, ...]:
    """:func:`encode_stats` back: ``(has, min, max, sum, count)``; FormatError unless it holds *rows* rows."""
    d = Decoder(bytes(buf), what)
    n = d.u64()
    if n != rows:
        raise FormatError(f"{what}: statistics of {n} blocks, expected {rows}")
    out = (
        d.array("u1", n).view(np.bool_),
        d.array(stat_dtype(dtype), n),
        d.array(stat_dtype(dtype), n),
        d.array(sum_dtype(dtype), n),
        d.array("<i8", n),
    )
    d.expect_end()
    return out


#: bytes per message at most (both sides cut boxes the same way)
CHUNK = 16 << 20
#: passes of MPI progress in a row while transfers are in flight (see Transfers.test)
BURST = 64
#: seconds of spinning after the last progress before a waiting rank starts to sleep
SPIN = 0.002
#: the environment variable that sets :data:`SPIN` (:func:`spin_seconds`)
SPIN_VARIABLE = "LAMINA_TRANSPORT_SPIN"


#: the spin every :class:`Poll` takes by default: the last :func:`spin_seconds`
_spin = SPIN


def spin_seconds() -> float:
    """``$LAMINA_TRANSPORT_SPIN`` (seconds >= 0), else :data:`SPIN` where it is unset or
    empty, from now on the spin of every :class:`Poll`; ValueError naming the variable for
    anything else.  Read where the transport opens a name, before any message (read at
    import before, a value such as '2ms' stopped ``import lamina`` in every program)."""
    global _spin
    _spin = comm_mod.env_seconds(SPIN_VARIABLE, SPIN, zero=True, finite=True)
    return _spin


#: longest sleep between polls when idle
MAX_SLEEP = 1e-3


def chunks(box: Box, itemsize: int, limit: int = CHUNK) -> list[Box]:
    """*box* cut into slabs of at most *limit* bytes (or one element), in C order; pure."""
    if box.empty or box.size * itemsize <= limit:
        return [box]
    out: list[Box] = []
    _split(list(box.start), list(box.stop), 0, itemsize, max(limit, itemsize), out)
    return out


def _split(
    start: list[int], stop: list[int], d: int, item: int, limit: int, out: list[Box]
) -> None:
    row = item * math.prod(stop[k] - start[k] for k in range(d + 1, len(start)))
    if row > limit:  # one slice along axis d is still too big: cut each one along the next axis
        for i in range(start[d], stop[d]):
            s, e = list(start), list(stop)
            s[d], e[d] = i, i + 1
            _split(s, e, d + 1, item, limit, out)
        return
    t = max(1, limit // row)
    for i in range(start[d], stop[d], t):
        s, e = list(start), list(stop)
        s[d], e[d] = i, min(i + t, stop[d])
        out.append(Box(tuple(s), tuple(e)))


def _u8(arr: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array, as a flat uint8 view (no copy)."""
    return arr.reshape(-1).view(np.uint8)


def region_spec(arr: np.ndarray, rel: Box):
    """Buffer spec for the box *rel* (relative to *arr*) of the C-contiguous *arr*, and a datatype to free (or None)."""
    view = arr[rel.within(Box.from_shape(arr.shape))]
    if view.flags.c_contiguous:
        return [_u8(view), MPI.BYTE], None
    item = arr.dtype.itemsize
    dt = MPI.BYTE.Create_subarray([*arr.shape, item], [*rel.shape, item], [*rel.start, 0]).Commit()
    return [_u8(arr), 1, dt], dt


#: the requests in flight :meth:`Transfers.test` looks at in one call, the oldest first
WINDOW = 64


class Transfers:
    """Requests in flight with the buffers and datatypes they use; byte counts once done."""

    def __init__(self) -> None:
        self.reqs: list = []
        self.keep: list = []  # per request: (buffer spec, datatype or None) until it finishes
        self.counts: list[int] = []  # bytes moved; -1 while in flight
        self._live: deque[int] = deque()  # indices of requests in flight, the oldest first
        self._statuses: list = []

    def __len__(self) -> int:
        return len(self._live)

    def add(self, req, spec, dt=None) -> int:
        self.reqs.append(req)
        self.keep.append((spec, dt))
        self.counts.append(-1)
        self._live.append(len(self.reqs) - 1)
        return len(self.reqs) - 1

    def send(self, comm, spec, dt, dest: int, tag: int) -> int:
        return self.add(comm.Isend(spec, dest, tag), spec, dt)

    def recv(self, comm, spec, dt, source: int, tag: int) -> int:
        return self.add(comm.Irecv(spec, source, tag), spec, dt)

    def test(self, burst: int = 1) -> int:
        """Independent: complete what has finished; returns how many did now.

        Up to *burst* passes of MPI progress in a row until something
        finishes: a transfer between processes moves only while both call
        MPI, so a busy rank polls in bursts rather than once per loop.
        """
        live = self._live
        if not live:
            return 0
        # the oldest WINDOW only: a read of thousands of small blocks finishes a few requests
        # a call, and testing every one each time made it quadratic (4,000 blocks: 14 s).
        # Any MPI call moves every transfer of the process; answers come in request order.
        head = list(islice(live, WINDOW))
        if len(self._statuses) < len(head):
            self._statuses = [MPI.Status() for _ in range(len(head))]
        reqs = [self.reqs[i] for i in head]
        statuses = self._statuses[: len(head)]
        for _ in range(burst):
            done = MPI.Request.Testsome(reqs, statuses)
            if done:
                break
        if not done:
            return 0
        for k, j in enumerate(done):  # MPI fills the statuses in completion order
            i = head[j]
            self.counts[i] = self._statuses[k].Get_count(MPI.BYTE)
            self._finish(i)
        for j in done:
            live.remove(head[j])  # (found among the first WINDOW)
        self._forget()
        return len(done)

    def _finish(self, i: int) -> None:
        _, dt = self.keep[i]
        if dt is not None:
            dt.Free()
        self.keep[i] = None

    def _forget(self) -> None:
        """Hook: drop finished requests (for transfers whose counts nobody reads)."""

    def cancel(self) -> None:
        """Independent: withdraw unfinished requests so no late message lands in their buffers."""
        for i in self._live:
            r = self.reqs[i]
            r.Cancel()
            r.Wait()
            self._finish(i)
        self._live.clear()


class SendQueue(Transfers):
    """A producer's sends: finished ones are forgotten, so the lists stay short."""

    def _forget(self) -> None:
        if len(self.reqs) > 2 * len(self._live) + 8:
            self.reqs = [self.reqs[i] for i in self._live]
            self.keep = [self.keep[i] for i in self._live]
            self.counts = [-1] * len(self._live)
            self._live = deque(range(len(self.reqs)))


class Poll:
    """The wait loop: spin while busy or just after progress, then sleep up to 1 ms; knows the timeout.

    ``reset()`` marks progress (it also restarts the timeout, which measures
    time without progress); ``sleep(active)`` waits a little: it only yields
    the CPU when *active* (transfers of this rank in flight) or within
    :data:`SPIN` seconds of the last progress, else it sleeps, doubling the
    delay up to :data:`MAX_SLEEP`.
    """

    def __init__(self, timeout: float, spin: float | None = None) -> None:
        self.timeout = float(timeout)
        self.spin = _spin if spin is None else float(spin)
        self.reset()

    def reset(self) -> None:
        now = time.monotonic()
        self.deadline = now + self.timeout
        self.spin_until = now + self.spin
        self.delay = 2e-5

    @property
    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def sleep(self, active: bool = False) -> None:
        if active or time.monotonic() < self.spin_until:
            os.sched_yield()
            return
        time.sleep(self.delay)
        self.delay = min(2 * self.delay, MAX_SLEEP)
