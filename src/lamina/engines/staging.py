"""What a rank has put in the current step, until the commit: columns, a staging buffer, an overlap index.

:class:`PutLog` keeps one row per block put (in put order) in plain
lists, so a ``put`` appends a few values and builds no object; the commit
turns them into arrays.  Small raw blocks (at most :data:`SMALL` bytes)
are copied into :class:`Chunk` buffers, one after the other: their
statistics and checksums are then computed a chunk at a time
(:func:`lamina.stats.summarize_flat`, a few numpy calls for thousands of
blocks), and a chunk is written or sent as one piece.  Larger blocks keep
their own array and a :class:`~lamina.stats.BlockJob`.

:class:`BoxIndex` finds, at ``put``, a box of the same rank and step that
the new box overlaps, in constant time for the decompositions programs
write (a hash grid whose cells are the size of the first box).

A batch (``put_many``) adds its rows with a few list extensions, keeps its
boxes as the arrays it came with (:meth:`PutLog.boxes` joins them at the
commit), is staged a chunk at a time (:meth:`PutLog.stage_run`), and is
entered in the overlap index with numpy when its boxes lie in distinct
cells of their own (:meth:`BoxIndex.insert_many`).  A chunk written
whole records where once (``Chunk.loc``), not per row.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import stats as stats_mod
from ..catalog import CODEC_STATS_ONLY, BlockCodec, DatasetSpec
from ..catalog.blocks import stat_dtype, sum_dtype
from ..errors import OverlapError
from ..geometry import Box, fits

if TYPE_CHECKING:
    from concurrent.futures import Future

#: raw blocks of at most this many bytes are staged in chunks and summarized in batches
SMALL = stats_mod.SMALL
#: bytes per staging chunk (written or sent as one piece)
CHUNK_BYTES = 4 << 20
_RAW = int(BlockCodec.RAW)
_RAWS = array("B", [_RAW])
_STATS_ONLY_BYTE = bytes([CODEC_STATS_ONLY])
_chain = itertools.chain.from_iterable


class Chunk:
    """A staging buffer: small blocks' bytes back to back, and their statistics once computed."""

    __slots__ = ("buf", "_mv", "used", "rows", "runs", "job", "summaries", "loc")

    def __init__(self, size: int = CHUNK_BYTES, buf: np.ndarray | None = None) -> None:
        self.set_buffer(np.empty(size, dtype=np.uint8) if buf is None else buf)
        self.used = 0
        self.rows: list[int] = []  # PutLog rows staged here, in order (their bytes are consecutive)
        # runs of those rows of one dtype: (index in self.rows of the run's first, dtype)
        self.runs: list[tuple[int, np.dtype]] = []
        self.job: Future | None = None
        # per run of rows of one dtype: (first row index in self.rows, Summary)
        self.summaries: list[tuple[int, stats_mod.Summary]] | None = None
        # (session, aggregator, offset) where the chunk's bytes were stored, once they are
        self.loc: tuple[int, int, int] | None = None

    def set_buffer(self, buf: np.ndarray) -> None:
        """Stage into *buf* (uint8) from now on."""
        self.buf = buf
        self._mv = buf.data  # kept: a put of a small block copies through it

    def add(self, row: int, arr: np.ndarray) -> int:
        """Copy *arr*'s bytes in; the offset where they start."""
        off = self.used
        n = arr.nbytes
        self._mv[off : off + n] = arr.data.cast("B")  # arr is C-contiguous
        self.used = off + n
        self._note(arr.dtype)
        self.rows.append(row)
        return off

    def add_each(self, first_row: int, arrays: Sequence[Any], sizes: list[int]) -> list[int]:
        """Copy *arrays* (C-contiguous, of any shapes and dtypes; *sizes* their bytes) for rows
        ``first_row, first_row + 1, ...`` with one join; where each starts."""
        off = self.used
        total = sum(sizes)
        self._mv[off : off + total] = b"".join(arrays)
        self.used = off + total
        at = list(itertools.accumulate(sizes[:-1], initial=off))
        first = len(self.rows)
        for k, a in enumerate(arrays):
            self._note(a.dtype, first + k)
        self.rows.extend(range(first_row, first_row + len(arrays)))
        return at

    def add_run(self, first_row: int, count: int, nbytes: int, dtype: np.dtype, data) -> int:
        """Copy *count* blocks of *nbytes* each for rows ``first_row, first_row + 1, ...``:
        back to back in *data* (bytes), or *data* a list of *count* C-contiguous arrays of
        one shape (of at least one dimension) and of *dtype*; the offset where they start."""
        off = self.used
        n = count * nbytes
        if isinstance(data, list):
            # their bytes joined by bytes.join (any C-contiguous buffer will do), then copied in:
            # a third of np.concatenate's cost per block, which checks each for overlap with out
            self._mv[off : off + n] = b"".join(data)
        else:
            self.buf[off : off + n] = data
        self.used = off + n
        self._note(dtype)
        self.rows.extend(range(first_row, first_row + count))
        return off

    def _note(self, dtype: np.dtype, at: int | None = None) -> None:
        """The rows added next (from row *at* of the chunk, by default the next one) are of
        *dtype*: a new run unless the last is of it."""
        runs = self.runs
        if not runs or runs[-1][1] != dtype:
            runs.append((len(self.rows) if at is None else at, dtype))

    def summarize(self, lengths: Sequence[int], offsets: Sequence[int], checksum: bool) -> None:
        """Compute the statistics (and checksums) of every block staged here, run by run of one dtype."""
        out: list[tuple[int, stats_mod.Summary]] = []
        runs = self.runs
        n = len(self.rows)
        for i, (k, dt) in enumerate(runs):
            j = runs[i + 1][0] if i + 1 < len(runs) else n
            a = offsets[k]
            b = offsets[j - 1] + lengths[j - 1]
            values = self.buf[a:b].view(dt)
            mine = lengths[k:j]
            if mine.count(mine[0]) == j - k:  # blocks of one size (of one shape, or alone)
                out.append((k, stats_mod.summarize_rows(values, j - k, checksum)))
                continue
            sizes = np.array(mine, dtype=np.int64) // dt.itemsize
            out.append((k, stats_mod.summarize_flat(values, sizes, checksum)))
        self.summaries = out

    def start(
        self, lengths: Sequence[int], offsets: Sequence[int], checksum: bool, background: bool
    ) -> None:
        """Summarize, on the worker thread when *background*."""
        if self.summaries is not None or self.job is not None:
            return
        if background:
            self.job = stats_mod._pool().submit(self.summarize, lengths, offsets, checksum)
        else:
            self.summarize(lengths, offsets, checksum)

    def worth_a_thread(self) -> bool:
        """Whether the statistics of the blocks staged here are worth the worker thread: at
        least :data:`~lamina.stats.BACKGROUND_MIN` bytes, of blocks of
        :data:`~lamina.stats.FAST_MIN` bytes or more on average.

        Smaller blocks are summarized here.  Their checksums are one loop of a
        call per block that holds the interpreter lock from start to end: on
        the thread it stops the program's thread for as long, at whatever
        Python step it is (committing a step of 4,096 lent blocks of 4^3
        float64 on each of two ranks, the step's corner tables took 1.2-1.7 ms
        to fill beside the thread against 0.13-0.19 ms with the statistics
        inline).  Larger blocks are checksummed by calls that release the
        lock, and reduced by numpy loops that do too.
        """
        n = len(self.rows)
        return self.used >= stats_mod.BACKGROUND_MIN and self.used >= n * stats_mod.FAST_MIN

    def done(self) -> bool:
        """Whether the statistics of the blocks staged here are computed (or never started)."""
        return self.job is None or self.job.done()

    def wait(self) -> None:
        if self.job is not None:
            job, self.job = self.job, None
            job.result()

    def reset(self) -> None:
        self.wait()
        self.used = 0
        self.rows = []
        self.runs = []
        self.summaries = None
        self.loc = None


class WriteMark:
    """Whether a write call into the open step is under way (:attr:`putting`: set as it
    starts, cleared as it returns or raises an ``Exception``), and whether one was cut short
    before (:attr:`cut`): an interrupt (``KeyboardInterrupt``, ``SystemExit``) that escapes a
    call leaves :attr:`putting` set wherever it lands, its blocks missing or half added, and
    the step must not be committed (:meth:`cut_short`).  The engine's put log is one (its
    ``put`` spells :meth:`call` out, a call less a block); the background layer holds one."""

    def __init__(self) -> None:
        self.putting = False
        self.cut = False

    def call(self, fn: Callable[..., None], *args) -> None:
        """``fn(*args)``, marked under way; an ``Exception`` out of it (its checks', before
        anything of it is kept, or a failure its owner keeps) clears the mark."""
        if self.putting:  # the last write call never returned: an interrupt cut it short
            self.cut = True
        self.putting = True
        try:
            fn(*args)
        except Exception:
            self.putting = False
            raise
        self.putting = False

    def cut_short(self) -> bool:
        """Whether a write call into the open step never returned (an interrupt cut it short)."""
        return self.putting or self.cut

    def forget(self) -> None:
        """The open step is gone (ended, dropped): a write cut short was of that step."""
        self.putting = self.cut = False


class PutLog(WriteMark):
    """The blocks of the current step on this rank, one row per block in put order (module docstring)."""

    def __init__(self) -> None:
        # the mark (WriteMark) is kept here, not on the engine: an attribute of this object
        # costs a few nanoseconds, one of the engine's (a large instance dictionary) ten or
        # more, at every block's put.  Not cleared with the rows: the engine says when a step
        # is over (discard_step).
        super().__init__()
        self.clear()

    def clear(self) -> None:
        # per row, in put order
        self.ds: list[int] = []  # dataset id
        # numeric columns as machine arrays: a commit takes them as numpy arrays in one copy
        self.length = array("q")  # bytes stored
        self.codec = array("B")
        # (session, agg, offset) of rows placed on their own; staged rows: their chunk's loc
        self.placed: dict[int, tuple[int, int, int]] = {}
        self.payload: list = []  # the bytes to store (array, bytes), None when staged or stored
        self.chunk: list[Chunk | None] = []  # the chunk a staged block lies in
        self.coff = array("q")  # its offset there
        self.job: list[stats_mod.StatsJob | None] = []  # statistics of a block not staged
        self.jobbed: list[int] = []  # the rows that have one
        # per dataset: its rows and their boxes, in put order; the boxes as pieces (arrays
        # of a batch or of earlier single puts) and a tail of single puts' tuples
        self.rows: dict[int, list[int]] = {}
        self.starts: dict[int, list[tuple[int, ...]]] = {}
        self.stops: dict[int, list[tuple[int, ...]]] = {}
        self.pieces: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        # per dataset with a layout: each band's largest coefficient magnitude, in put order
        self.amax: dict[int, list[float]] = {}
        self.chunks: list[Chunk] = []  # chunks of this step, in order

    def __len__(self) -> int:
        return len(self.ds)

    def consistent(self) -> bool:
        """Whether every column has a row for each block, and every dataset a box for each of
        its rows: what a commit takes for granted, and what an addition cut short between
        its parts (an interrupt) leaves untrue.  A few sums, per dataset, not per block."""
        n = len(self.ds)
        if not (
            len(self.length) == len(self.codec) == len(self.payload) == n
            and len(self.chunk) == len(self.coff) == len(self.job) == n
        ):
            return False
        rows = 0
        for did, mine in self.rows.items():
            boxes = len(self.starts.get(did, ()))
            if boxes != len(self.stops.get(did, ())):
                return False
            boxes += sum(len(a) for a, _ in self.pieces.get(did, ()))
            if boxes != len(mine):
                return False
            rows += len(mine)
        return rows == n

    def add(
        self,
        did: int,
        start: tuple[int, ...],
        stop: tuple[int, ...],
        length: int,
        codec: int,
        payload=None,
        job: stats_mod.StatsJob | None = None,
        loc: tuple[int, int, int] | None = None,
        amax: float | None = None,
    ) -> int:
        row = len(self.ds)
        if amax is not None:
            self.amax.setdefault(did, []).append(amax)
        self.ds.append(did)
        self.length.append(length)
        self.codec.append(codec)
        if loc is not None:
            self.placed[row] = loc
        self.payload.append(payload)
        self.chunk.append(None)
        self.coff.append(0)
        self.job.append(job)
        if job is not None:
            self.jobbed.append(row)
        self._add_box(did, row, start, stop)
        return row

    def add_staged(
        self, did: int, start: tuple[int, ...], stop: tuple[int, ...], arr: np.ndarray, c: Chunk
    ) -> None:
        """A small raw block, copied into chunk *c* (which has room for it): :meth:`add` and
        :meth:`stage` in one call, the path of every ``put`` of a small block."""
        row = len(self.ds)
        self.ds.append(did)
        self.length.append(arr.nbytes)
        self.codec.append(_RAW)
        self.payload.append(None)
        self.chunk.append(c)
        self.coff.append(c.add(row, arr))
        self.job.append(None)
        self._add_box(did, row, start, stop)

    def add_staged_each(
        self,
        dids: list[int],
        starts: list[tuple[int, ...]],
        stops: list[tuple[int, ...]],
        arrays: list[np.ndarray],
        c: Chunk,
    ) -> None:
        """:meth:`add_staged` of several small raw blocks, in order, that chunk *c* has room
        for: the rows' columns extended and the bytes copied in once."""
        row = len(self.ds)
        n = len(dids)
        sizes = [a.nbytes for a in arrays]
        self.ds.extend(dids)
        self.length.extend(sizes)
        self.codec.extend(_RAWS * n)
        self.payload.extend([None] * n)
        self.chunk.extend([c] * n)
        self.coff.extend(c.add_each(row, arrays, sizes))
        self.job.extend([None] * n)
        rows_of, starts_of, stops_of = self.rows, self.starts, self.stops
        for did, r, a, b in zip(dids, range(row, row + n), starts, stops, strict=True):
            rows = rows_of.get(did)  # _add_box, spelled out: a call less per block
            if rows is None:
                rows_of[did], starts_of[did], stops_of[did] = [r], [a], [b]
            else:
                rows.append(r)
                starts_of[did].append(a)
                stops_of[did].append(b)

    def _add_box(self, did: int, row: int, start: tuple[int, ...], stop: tuple[int, ...]) -> None:
        rows = self.rows.get(did)
        if rows is None:
            self.rows[did], self.starts[did], self.stops[did] = [row], [start], [stop]
        else:
            rows.append(row)
            self.starts[did].append(start)
            self.stops[did].append(stop)

    def add_many(
        self, did: int, starts: np.ndarray, stops: np.ndarray, length: int, codec: int
    ) -> int:
        """Rows for blocks ``[starts[k], stops[k])`` of dataset *did*, *length* bytes each
        (nothing placed or staged yet); the first row."""
        row = len(self.ds)
        n = len(starts)
        self.ds.extend([did] * n)
        self.length.extend(array("q", [length]) * n)
        self.codec.extend(array("B", [codec]) * n)
        self.payload.extend([None] * n)
        self.chunk.extend([None] * n)
        self.coff.extend(array("q", [0]) * n)
        self.job.extend([None] * n)
        if did not in self.rows:
            self.rows[did], self.starts[did], self.stops[did] = [], [], []
        self.rows[did].extend(range(row, row + n))
        pieces = self.pieces.setdefault(did, [])
        self._flush_tail(did, pieces)
        pieces.append((starts, stops))
        return row

    def _flush_tail(self, did: int, pieces: list[tuple[np.ndarray, np.ndarray]]) -> None:
        tail = self.starts[did]
        if tail:
            shape = (len(tail), len(tail[0]))
            pieces.append(
                (
                    np.array(tail, dtype=np.int64).reshape(shape),
                    np.array(self.stops[did], dtype=np.int64).reshape(shape),
                )
            )
            self.starts[did], self.stops[did] = [], []

    def boxes(self, did: int, ndim: int) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, stops)`` of dataset *did*'s rows, in put order, as ``(n, ndim)`` int64 arrays."""
        pieces = self.pieces.setdefault(did, [])
        self._flush_tail(did, pieces)
        if not pieces:
            return np.zeros((0, ndim), np.int64), np.zeros((0, ndim), np.int64)
        if len(pieces) > 1:
            pieces[:] = [
                (np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces]))
            ]
        return pieces[0]

    def boxes_by_row(self, ndims: dict[int, int], width: int) -> tuple[np.ndarray, np.ndarray]:
        """Every row's corners in row order, as ``(n, width)`` int64 arrays: a dataset's own
        dimensions first (*ndims*: dataset id -> its ndim, for every dataset of the step),
        zeros after.  Datasets written by single puts are joined by ndim and placed with
        one scatter each: a step of many datasets pays a few numpy calls, not a few each."""
        n = len(self.ds)
        start = stop = None
        by_ndim: dict[int, list[int]] = {}
        for did, nd in ndims.items():
            if self.pieces.get(did) or not self.starts.get(did):
                s, e = self.boxes(did, nd)
                if len(s) == n and nd == width:  # every row, in order (rows ascend): one dataset
                    return s, e
                if start is None or stop is None:
                    start, stop = _zero_corners(n, width)
                rows = index_of(self.rows[did])
                start[rows, :nd], stop[rows, :nd] = s, e
            else:
                by_ndim.setdefault(nd, []).append(did)
        for nd, dids in by_ndim.items():
            if not nd:
                continue
            tails = [self.starts[d] for d in dids]
            k = sum(map(len, tails))
            s = np.array(list(_chain(tails)), dtype=np.int64).reshape(k, nd)
            e = np.array(list(_chain(self.stops[d] for d in dids)), dtype=np.int64).reshape(k, nd)
            mine = [self.rows[d] for d in dids]
            if k == n and nd == width and _one_after_another(mine):
                return s, e  # every row, in order, of one ndim (many datasets of one shape)
            if start is None or stop is None:
                start, stop = _zero_corners(n, width)
            rows = np.fromiter(_chain(mine), np.int64, k)
            start[rows, :nd], stop[rows, :nd] = s, e
        if start is None or stop is None:
            return _zero_corners(n, width)
        return start, stop

    def locations(self):
        """Where every row is stored: ``(located, session, aggregator, offset)`` arrays, one
        entry per row (unplaced: 0)."""
        n = len(self.ds)
        located = np.zeros(n, dtype=bool)
        session = np.zeros(n, dtype=np.uint32)
        agg = np.zeros(n, dtype=np.uint32)
        offset = np.zeros(n, dtype=np.int64)
        coff = None
        for c in self.chunks:
            if c.loc is None or not c.rows:
                continue
            if coff is None:
                coff = np.array(self.coff, dtype=np.int64)  # one copy of the machine array
            at = index_of(c.rows)
            located[at] = True
            session[at], agg[at] = c.loc[0], c.loc[1]
            offset[at] = c.loc[2] + coff[at]
        for r, loc in self.placed.items():
            located[r] = True
            session[r], agg[r], offset[r] = loc
        return located, session, agg, offset

    def stage_run(self, first_row: int, count: int, nbytes: int, dtype, data, chunk: Chunk) -> None:
        """Stage rows ``first_row..first_row + count`` (blocks of *nbytes* each, back to back in
        *data*, or a list of arrays: :meth:`Chunk.add_run`) in *chunk*, which has room for them."""
        off = chunk.add_run(first_row, count, nbytes, dtype, data)
        end = first_row + count
        self.coff[first_row:end] = array(
            "q", np.arange(off, off + count * nbytes, nbytes, dtype=np.int64).tobytes()
        )
        self.chunk[first_row:end] = [chunk] * count

    def chunk_columns(self, c: Chunk) -> tuple[Sequence[int], Sequence[int]]:
        """(lengths, offsets) of the rows staged in *c*."""
        rows = c.rows
        if (
            rows and rows[-1] - rows[0] == len(rows) - 1
        ):  # consecutive (no block between kept apart)
            a, b = rows[0], rows[-1] + 1
            return self.length[a:b], self.coff[a:b]
        return [self.length[r] for r in rows], [self.coff[r] for r in rows]

    def summarize(self, c: Chunk, checksum: bool, background: bool) -> None:
        lengths, offsets = self.chunk_columns(c)
        c.start(lengths, offsets, checksum, background)

    def chunks_of(self, rows: list[int]) -> list[Chunk]:
        """The chunks the staged ones among *rows* lie in, each once, in order."""
        if len(rows) == len(self.ds):  # every row (one dataset): every chunk with rows
            return [c for c in self.chunks if c.rows]
        mine = self._mask(rows)
        return [c for c in self.chunks if c.rows and mine[index_of(c.rows)].any()]

    def _mask(self, rows: list[int]) -> np.ndarray:
        m = np.zeros(len(self.ds), dtype=bool)
        m[index_of(rows)] = True
        return m

    def reduce_staged(self, did: int) -> None:
        """Reduce now (on this thread) the chunks holding blocks of dataset *did* not reduced yet."""
        for c in self.chunks_of(self.rows.get(did, [])):
            if c.summaries is None and c.job is None:
                self.summarize(c, False, False)

    def ready(self) -> bool:
        """Whether every statistics job of this step has finished (stats_columns will not wait)."""
        jobs = self.job
        return all(c.done() for c in self.chunks) and all(
            (j := jobs[r]) is None or j.done() for r in self.jobbed
        )

    def wait(self) -> None:
        """Let every background job finish (before a failed step's buffers go)."""
        for c in self.chunks:
            try:
                c.wait()
            except Exception:
                pass
        for r in self.jobbed:
            j = self.job[r]
            if j is not None:
                try:
                    j.result()
                except Exception:
                    pass

    def views(self, rows: list[int]):
        """The bytes of *rows* (in that order) as few memoryviews: consecutive staged rows of a chunk as one."""
        spans = self._chunk_spans(rows)
        if spans is not None:
            return spans
        out: list[memoryview] = []
        cur: tuple[Chunk, int, int] | None = None  # (chunk, start, end) being extended
        for r in rows:
            c = self.chunk[r]
            if c is not None:
                a, b = self.coff[r], self.coff[r] + self.length[r]
                if cur is not None and cur[0] is c and cur[2] == a:
                    cur = (c, cur[1], b)
                    continue
                if cur is not None:
                    out.append(cur[0].buf.data[cur[1] : cur[2]])
                cur = (c, a, b)
                continue
            if cur is not None:
                out.append(cur[0].buf.data[cur[1] : cur[2]])
                cur = None
            p = self.payload[r]
            out.append(p.data.cast("B") if isinstance(p, np.ndarray) else memoryview(p).cast("B"))
        if cur is not None:
            out.append(cur[0].buf.data[cur[1] : cur[2]])
        return out

    def _chunk_spans(self, rows: list[int]) -> list[memoryview] | None:
        """:meth:`views` of a run of consecutive rows that chunks hold whole, one view per
        chunk without a look at each row; None for anything else."""
        n = len(rows)
        if not n or rows[-1] - rows[0] != n - 1:
            return None
        a, b = rows[0], rows[-1] + 1
        spans = []
        for c in self.chunks:
            cr = c.rows
            if not cr or cr[-1] < a or cr[0] >= b:
                continue
            if cr[0] < a or cr[-1] >= b or cr[-1] - cr[0] != len(cr) - 1:
                return None
            spans.append((cr[0], cr[-1], c))
        spans.sort(key=lambda s: s[0])
        out = []
        expect = a
        for first, last, c in spans:
            if first != expect:
                return None  # a row between them is not staged
            out.append(c.buf.data[self.coff[first] : self.coff[last] + self.length[last]])
            expect = last + 1
        return out if expect == b else None

    def stats_columns(self, did: int, dtype: np.dtype, seg: int, checksum: bool, stats: bool):
        """Columns of dataset *did*'s rows, in order: seg, ncrc, crcs (flat), has_stats, min,
        max, sum, count (only its chunks are waited for and only its blocks' jobs asked).

        Without *checksum* every block gets one checksum 0 and segment 0
        (the record format wants one per block); without *stats*, none.
        """
        segs, one, many, has, mins, maxs, sums, count = self._stat_rows(
            {did: dtype}, seg, checksum, stats
        )
        sel = index_of(self.rows.get(did, []))
        k = len(sel)
        sd, md = stat_dtype(dtype).str, sum_dtype(dtype).str
        smin = mins[sd][sel] if sd in mins else np.zeros(k, dtype=sd)
        smax = maxs[sd][sel] if sd in maxs else np.zeros(k, dtype=sd)
        ssum = sums[md][sel] if md in sums else np.zeros(k, dtype=md)
        ncrc, crcs = _crc_columns(one, many, sel)
        return segs[sel], ncrc, crcs, has[sel], smin, smax, ssum, count[sel]

    def _stat_rows(
        self,
        dtypes: dict[int, np.dtype],
        seg: int,
        checksum: bool,
        stats: bool,
        stats_only: bool = False,
    ):
        """Statistics and checksums of every row, from one pass over the chunks and jobs of
        the datasets in *dtypes*: ``(segs, one, many, has, mins, maxs, sums, count)``, with
        *one* the checksum of each block of one segment, *many* the checksums of the others
        (by row), and min, max and sum by their stored dtype's ``str`` (a column each, zero
        in the rows of other dtypes).  Without *stats*, statistics-only blocks keep theirs
        with *stats_only* (their statistics were given at put, nothing is waited for)."""
        n = len(self.ds)
        many: dict[int, tuple[int, ...]] = {}  # blocks with another number of checksums
        # min/max by their stored dtype (int64, uint64 or float64), sums float64 or complex128
        mins: dict[str, np.ndarray] = {}
        maxs: dict[str, np.ndarray] = {}
        sums: dict[str, np.ndarray] = {}
        chunks: list[Chunk] = []
        if stats or checksum:  # else nothing to wait for (statistics that follow the record)
            if all(did in dtypes for did in self.rows):
                chunks = [c for c in self.chunks if c.rows]
            else:  # some datasets: their chunks only (others may not be reduced yet)
                chunks = self.chunks_of(sorted(_chain(self.rows.get(d, []) for d in dtypes)))
            if len(chunks) == 1 and not self.jobbed:
                whole = self._one_summary(chunks[0], n)
                if whole is not None:  # every row, in order, in one run of one chunk: its columns
                    one = (
                        whole.crcs
                        if checksum and whole.crcs is not None
                        else np.zeros(n, dtype=np.uint32)
                    )
                    if not stats:
                        has, count = np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64)
                        return self._segs(n, seg, checksum), one, many, has, mins, maxs, sums, count
                    key = whole.mins.dtype.str
                    mins, maxs = {key: whole.mins}, {key: whole.maxs}
                    sums = {whole.sums.dtype.str: whole.sums}
                    has = np.ones(n, dtype=bool)
                    segs = self._segs(n, seg, checksum)
                    return segs, one, many, has, mins, maxs, sums, whole.counts
        has = np.zeros(n, dtype=bool)
        count = np.zeros(n, dtype=np.int64)
        one = np.zeros(n, dtype=np.uint32)  # the checksum of each block that has one

        def col(into: dict[str, np.ndarray], dt: np.dtype) -> np.ndarray:
            got = into.get(dt.str)
            if got is None:
                got = into[dt.str] = np.zeros(n, dtype=dt)
            return got

        if stats or checksum or stats_only:
            if stats or checksum:
                for c in chunks:  # staged rows: their chunk's summaries, run by run
                    c.wait()
                    crows = index_of(c.rows)
                    for first, s in c.summaries or ():
                        j = crows[first : first + len(s.counts)]
                        if stats:
                            col(mins, s.mins.dtype)[j] = s.mins
                            col(maxs, s.maxs.dtype)[j] = s.maxs
                            col(sums, s.sums.dtype)[j] = s.sums
                            count[j] = s.counts
                            has[j] = True
                        if checksum and s.crcs is not None:
                            one[j] = s.crcs
            ds, codec = self.ds, self.codec
            # without *stats*, statistics-only blocks keep theirs (given at put: done already)
            alone = not stats and stats_only
            for r in self.jobbed:  # blocks summarized on their own
                job = self.job[r]
                dt = dtypes.get(ds[r])
                if job is None or dt is None:
                    continue
                kept = stats or (alone and codec[r] == CODEC_STATS_ONLY)
                if not (kept or checksum):
                    continue
                st, cr = job.result()
                if checksum:
                    if len(cr) == 1:
                        one[r] = cr[0]
                    else:
                        many[r] = cr
                if st is not None and kept:
                    has[r] = True
                    col(mins, stat_dtype(dt))[r] = st.min
                    col(maxs, stat_dtype(dt))[r] = st.max
                    col(sums, sum_dtype(dt))[r] = st.sum
                    count[r] = st.count
        return self._segs(n, seg, checksum), one, many, has, mins, maxs, sums, count

    def _segs(self, n: int, seg: int, checksum: bool) -> np.ndarray:
        """The checksum segment of every row: *seg*, 0 for statistics-only blocks (and
        every block without checksums)."""
        if not checksum:
            return np.zeros(n, dtype=np.int64)
        if _STATS_ONLY_BYTE not in self.codec.tobytes():  # (memchr over a copy of n bytes)
            return filled(n, seg, np.int64)
        segs = np.zeros(n, dtype=np.int64)
        segs[np.frombuffer(self.codec, dtype=np.uint8) != CODEC_STATS_ONLY] = seg
        return segs

    @staticmethod
    def _one_summary(c: Chunk, n: int) -> stats_mod.Summary | None:
        """The summary of chunk *c* when it holds rows ``0..n-1`` in order in one run of one
        dtype (a step of small blocks of one dataset, or of datasets of one dtype, staged in
        one chunk): its columns are the step's as they are.  Else None."""
        c.wait()
        got = c.summaries
        rows = c.rows
        if got is None or len(got) != 1 or len(rows) != n or not n:
            return None
        if rows[0] != 0 or rows[-1] != n - 1:
            return None  # (rows are ascending: n of them from 0 to n - 1 are every row)
        return got[0][1]

    def step_stats(
        self,
        dtypes: dict[int, np.dtype],
        seg: int,
        checksum: bool,
        stats: bool,
        stats_only: bool = False,
    ):
        """The columns of :meth:`stats_columns` for every row of the step at once, in row
        order (*dtypes*: every dataset of the step): seg, ncrc, crcs (flat), has_stats, min
        and max as their 8 stored bytes (``<u8``), sum (float64, or complex128 where any
        dataset is complex), count.  With *stats_only*, statistics-only blocks keep their
        statistics even without *stats* (they are all such a block holds)."""
        segs, one, many, has, mins, maxs, sums, count = self._stat_rows(
            dtypes, seg, checksum, stats, stats_only
        )
        n = len(segs)
        ncrc, crcs = _crc_columns(one, many, None)

        def bits(cols: dict[str, np.ndarray]) -> np.ndarray:  # one column of 8-byte patterns
            got = [c.view("<u8") for c in cols.values()]
            if not got:
                return np.zeros(n, dtype="<u8")
            out = got[0]
            for c in got[1:]:  # each is zero in the others' rows
                out = out | c
            return out

        if not sums:
            ssum = np.zeros(n, dtype="<f8")
        elif len(sums) == 1:
            ssum = next(iter(sums.values()))
        else:  # float and complex datasets in one step
            ssum = sum(c.astype("<c16") for c in sums.values())
        return segs, ncrc, crcs, has, bits(mins), bits(maxs), ssum, count


#: ``setflags`` unbound and called positionally: a quarter of the cost of
#: ``a.flags.writeable = ...`` (numpy's stubs make ``write`` keyword-only; passed by
#: keyword the call costs twice as much)
_setflags: Callable[[np.ndarray, bool], None] = np.ndarray.setflags  # type: ignore[assignment]


def make_writeable(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Make *arrays* writeable again (lamina made them read-only), the last made read-only
    first; the ones numpy refuses (a view whose base is still read-only) are tried again
    once the others are thawed.  Returns those it could not thaw at all (a base made
    read-only by something else keeps its views so, as numpy wants)."""
    left = arrays[::-1]
    while True:
        refused = []
        for a in left:
            try:
                _setflags(a, True)
            except ValueError:
                refused.append(a)
        if not refused or len(refused) == len(left):
            return refused
        left = refused


class Held:
    """The caller's own arrays a writer keeps by reference (``copy=False``) past the call
    that lent them: made read-only by :meth:`hold` until :meth:`release` (the step ended),
    so that a change before then fails with numpy's error instead of leaving a block whose
    checksum or statistics are not those of its bytes.  An array read-only already is left
    as it is (and so after the step)."""

    __slots__ = ("arrays",)

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []

    def __bool__(self) -> bool:
        return bool(self.arrays)

    def hold(self, arr: np.ndarray) -> None:
        if arr.flags.writeable:
            _setflags(arr, False)
            self.arrays.append(arr)

    def release(self) -> None:
        """Make writeable again what :meth:`hold` made read-only, the last held first."""
        arrays, self.arrays = self.arrays, []
        make_writeable(arrays)


class LentBlocks:
    """Small raw blocks a program lent (``put`` with ``copy=False``), kept until the commit
    enters and stages them with the step's other blocks (``BlockEngine._flush_lent``).

    Kept as ``put`` gives them, in three lists side by side (definitions, corners,
    arrays); an array that was writeable is made read-only until :meth:`thaw`, so that
    a program that changes it before its step is committed gets numpy's error, not
    corrupt data.  :attr:`uniform` says whether every block is of one dataset and one
    shape, the common case, which the commit stages as a single group.
    """

    __slots__ = ("specs", "starts", "arrays", "frozen", "held", "uniform", "_spec", "_shape")

    def __init__(self) -> None:
        self.specs: list[DatasetSpec] = []
        self.starts: list[tuple] = []
        self.arrays: list[np.ndarray] = []
        self.frozen: list[np.ndarray] = []  # the arrays add made read-only
        # larger arrays lent to put, made read-only by hold until the step ends (release)
        self.held = Held()
        self.uniform = True
        self._spec: DatasetSpec | None = None
        self._shape: tuple = ()

    def __len__(self) -> int:
        return len(self.arrays)

    def add(
        self, spec: DatasetSpec, start: tuple, arr: np.ndarray, mine: np.ndarray | None
    ) -> None:
        """Keep *arr* (C-contiguous, of *spec*'s dtype) for the box at *start*; *mine*, the
        caller's array whose memory it is (None: a copy), read-only until :meth:`thaw` where
        it is writeable."""
        if self.arrays:
            if spec is not self._spec or arr.shape != self._shape:
                self.uniform = False
        else:
            self._spec, self._shape = spec, arr.shape
        if mine is not None and mine.flags.writeable:
            _setflags(mine, False)
            self.frozen.append(mine)
        self.specs.append(spec)
        self.starts.append(start)
        self.arrays.append(arr)

    def take(self, spec: DatasetSpec, start: tuple, arr: np.ndarray) -> bool:
        """Keep *arr* lent at *start* as :meth:`add` does, if it is a block ``put`` would keep
        so: of *spec*'s dtype (the caller checked), C-contiguous, of 1 to :data:`SMALL`
        bytes, within *spec*'s bounds at a corner of ints (:func:`~lamina.geometry.fits`;
        3-D corners, the common ones, tested here: a call less per block).  Else False, and
        nothing is kept.  What it keeps, and how, is :meth:`add`'s, spelled out here for
        the same reason (calling it costs 5 % of a lent block's write and commit)."""
        flags = arr.flags
        shape = arr.shape
        extent = spec.shape
        if not flags.c_contiguous or not 0 < arr.nbytes <= SMALL:
            return False
        if len(start) == 3 and len(shape) == 3 and len(extent) == 3:
            a, b, c = start
            if not (type(a) is int and type(b) is int and type(c) is int):
                return False
            x, y, z = shape
            X, Y, Z = extent
            if not (0 <= a and 0 <= b and 0 <= c and a + x <= X and b + y <= Y and c + z <= Z):
                return False
        elif not fits(start, shape, extent):
            return False
        if self.arrays:
            if spec is not self._spec or shape != self._shape:
                self.uniform = False
        else:
            self._spec, self._shape = spec, shape
        if flags.writeable:
            _setflags(arr, False)
            self.frozen.append(arr)
        self.specs.append(spec)
        self.starts.append(start)
        self.arrays.append(arr)
        return True

    def groups(self) -> list[tuple[DatasetSpec, list[tuple], list[np.ndarray]]]:
        """The blocks by dataset and block shape, in the order each group first appears:
        ``(definition, corners, arrays)`` each."""
        if self.uniform:
            return [(self.specs[0], self.starts, self.arrays)] if self.arrays else []
        by_key: dict[tuple, tuple[DatasetSpec, list[tuple], list[np.ndarray]]] = {}
        for spec, start, arr in zip(self.specs, self.starts, self.arrays, strict=True):
            key = (spec.id, arr.shape)
            g = by_key.get(key)
            if g is None:
                by_key[key] = (spec, [start], [arr])
            else:
                g[1].append(start)
                g[2].append(arr)
        return list(by_key.values())

    def hold(self, arr: np.ndarray) -> None:
        """*arr*, the caller's own array lent to ``put`` with ``copy=False`` and kept by
        reference past the call (written by its aggregator while its statistics are taken on a
        thread, sent to the aggregator at the commit, or encoded then): read-only until
        :meth:`release` (:class:`Held`)."""
        self.held.hold(arr)

    def release(self) -> None:
        """Make writeable again the arrays :meth:`hold` made read-only (the step ended), and
        the lent ones :meth:`thaw` could not thaw while a base of theirs was held."""
        self.held.release()

    def thaw(self) -> None:
        """Make writeable again the arrays :meth:`add` made read-only, and forget every block
        (a view whose base :meth:`hold` keeps read-only thaws with it, at :meth:`release`)."""
        frozen = self.frozen
        self.specs, self.starts, self.arrays, self.frozen = [], [], [], []
        self.uniform, self._spec = True, None
        if frozen:
            self.held.arrays.extend(make_writeable(frozen)[::-1])


def _one_after_another(runs: list[list[int]]) -> bool:
    """Whether ascending lists of rows follow each other (together ascending)."""
    return all(a[-1] < b[0] for a, b in zip(runs, runs[1:], strict=False))


def filled(n: int, value: int, dtype) -> np.ndarray:
    """``np.full(n, value, dtype)`` without its Python wrapper (a commit makes a few a step)."""
    a = np.empty(n, dtype)
    a.fill(value)
    return a


def _zero_corners(n: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(start, stop)`` of *n* rows, *width* int64 corners each, all zero."""
    return np.zeros((n, width), dtype=np.int64), np.zeros((n, width), dtype=np.int64)


def index_of(rows: list[int]) -> np.ndarray:
    """*rows* (ascending, as the log appends them) as an int64 array; a run of consecutive
    rows, the common case, without reading the list."""
    n = len(rows)
    if n and rows[-1] - rows[0] == n - 1:
        return np.arange(rows[0], rows[0] + n, dtype=np.int64)
    return np.array(rows, dtype=np.int64)


def _crc_columns(
    one: np.ndarray, many: dict[int, tuple[int, ...]], rows: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(ncrc, crcs)`` of *rows* (ascending; None: every row): one checksum each from
    *one*, or the several *many* holds for a row (a block of several checksum segments),
    flattened in row order."""
    crcs = one if rows is None else one[rows]
    ncrc = filled(len(crcs), 1, np.uint32)
    if not many or not len(crcs):
        return ncrc, crcs
    if rows is None:
        rows = np.arange(len(one))
    keys = np.array(sorted(many), dtype=np.int64)
    at = np.minimum(np.searchsorted(rows, keys), len(rows) - 1)
    mine = [(int(i), many[int(r)]) for i, r in zip(at, keys, strict=True) if rows[i] == r]
    if not mine:
        return ncrc, crcs
    for i, cr in mine:
        ncrc[i] = len(cr)
    flat = np.repeat(crcs, ncrc)
    # where each row's checksums start (int64: numpy 1.x made a uint64 plus an int a float)
    first = (np.cumsum(ncrc) - ncrc).astype(np.int64)
    for i, cr in mine:
        flat[first[i] : first[i] + len(cr)] = cr
    return ncrc, flat


class BoxIndex:
    """The boxes one rank put into one dataset in the current step, to test a new box for overlap.

    A hash grid: the cell is the first box's shape; a box is entered in
    every cell it touches, and a new box is tested against the boxes of
    the cells it touches.  A box touching more than :data:`MAX_CELLS` cells
    is kept aside and tested against all boxes at once (numpy); when such
    boxes become common the grid is rebuilt with the median box shape.
    """

    MAX_CELLS = 16
    #: batches of at least this many boxes are checked with numpy and kept as arrays (fewer
    #: than this cost less one by one; 64 boxes of 4^3: 46 us entered each, 14 us as a batch)
    LAZY_BATCH = 16

    __slots__ = (
        "ndim",
        "shape",
        "cell",
        "grid",
        "starts",
        "stops",
        "big",
        "n",
        "_rebuilt_at",
        "keys",
        "lazy",
        "loose",
        "swept",
    )

    def __init__(self, ndim: int, shape: tuple[int, ...] | None = None) -> None:
        self.ndim = ndim
        self.shape = shape  # the dataset's, to number the cells of a batch (insert_many)
        # boxes of batches not entered in the grid yet: their (sorted) cell numbers and arrays
        self.keys: np.ndarray | None = None
        self.lazy: list[tuple[np.ndarray, np.ndarray]] = []
        # the lazy boxes are one batch found apart by a sweep (no cell numbers: keys is None)
        self.swept = False
        self.cell: tuple[int, ...] | None = None
        self.grid: dict[tuple[int, ...], list[int]] = {}
        self.starts: list[tuple[int, ...]] = []
        self.stops: list[tuple[int, ...]] = []
        self.big: list[int] = []
        self.n = 0
        self._rebuilt_at = 32  # rebuild only after the boxes doubled since the last time
        # the first box, kept out of the grid until a second comes: a dataset written once a
        # step (most of them) never pays for its cells
        self.loose = False

    def insert(self, start: tuple[int, ...], stop: tuple[int, ...]) -> int:
        """Enter ``[start, stop)`` unless it meets an entered box: -1, or the index of that box."""
        if self.lazy:
            self._materialize()
        if self.ndim == 0:
            if self.n:
                return 0
            self._append(start, stop, None)
            return -1
        if self.cell is None:
            self.cell = tuple(max(1, b - a) for a, b in zip(start, stop, strict=True))
        if not self.n:  # nothing to meet
            self.starts.append(start)
            self.stops.append(stop)
            self.n = 1
            self.loose = True
            return -1
        if self.loose:
            self._settle()
        starts, stops = self.starts, self.stops
        for j in self.big:
            if _meets(start, stop, starts[j], stops[j]):
                return j
        cells = self._cells(start, stop)
        if cells is None:  # a big box: test against every box
            if self.n:
                lo = np.array(starts, dtype=np.int64)
                hi = np.array(stops, dtype=np.int64)
                hit = np.all((lo < np.array(stop)) & (hi > np.array(start)), axis=1)
                if bool(hit.any()):
                    return int(np.argmax(hit))
        else:
            grid = self.grid
            for key in cells:
                got = grid.get(key)
                if got:
                    for j in got:
                        if _meets(start, stop, starts[j], stops[j]):
                            return j
        self._append(start, stop, cells)
        return -1

    def _settle(self) -> None:
        """Enter the first box in the grid (a second one has come)."""
        self.loose = False
        cells = self._cells(self.starts[0], self.stops[0])
        if cells is None:
            self.big.append(0)
        else:
            self._enter_cells(0, cells)

    def _append(self, start, stop, cells) -> None:
        j = self.n
        self.starts.append(start)
        self.stops.append(stop)
        self.n = j + 1
        if self.ndim == 0:
            return
        if cells is None:
            self.big.append(j)
            if 4 * len(self.big) > self.n and self.n >= 2 * self._rebuilt_at:
                self._rebuild()
            return
        self._enter_cells(j, cells)

    def _enter_cells(self, j: int, cells) -> None:
        """Box *j* in each of the grid's *cells*."""
        grid = self.grid
        for key in cells:
            got = grid.get(key)
            if got is None:
                grid[key] = [j]
            else:
                got.append(j)

    def insert_many(self, starts: np.ndarray, stops: np.ndarray) -> tuple[int, int] | None:
        """Enter the boxes ``[starts[k], stops[k])`` (``(n, ndim)`` arrays) unless one meets an
        entered box or an earlier one of them: then ``(k, index of the box it meets)`` and
        nothing is entered (a box of this batch met has index ``self.n + its position``).

        A large batch of one-cell boxes in distinct new cells, or a large first batch whose
        boxes lie apart along an axis, is checked with numpy (:meth:`_insert_lazy`); any other
        batch box by box, as :meth:`insert` enters them."""
        if self._insert_lazy(starts, stops):
            return None
        return self._insert_each(starts, stops)

    def _insert_lazy(self, starts: np.ndarray, stops: np.ndarray) -> bool:
        """Enter a batch of one-cell boxes with numpy, kept as arrays, if that is sure to be exact.

        Boxes that each lie in one cell can only meet boxes of the same
        cell; a batch whose cells are all distinct and new holds no
        overlap.  Only while the grid is empty (every box so far came this
        way) and for large batches; otherwise False and nothing is entered.
        The step's first batch may instead be found apart by a sweep
        (:func:`apart`: boxes of uneven shapes, a particle array cut in
        blocks); a batch after it is then entered box by box.
        """
        if (
            self.ndim == 0
            or len(starts) < self.LAZY_BATCH
            or self.shape is None
            or (self.n and not self.lazy)
            or self.swept
        ):
            return False
        global _lazy_last
        if self.cell is None:
            self.cell = tuple(max(1, int(v)) for v in (stops[0] - starts[0]))
        seen = None
        if not self.n:  # the step's first batch: the last step's, as a simulation writes them?
            seen = (self.cell, self.shape, starts.shape, starts.tobytes(), stops.tobytes())
            last = _lazy_last
            if last is not None and last[0] == seen:
                self.keys = last[1]
                self.lazy.append((starts, stops))
                self.n += len(starts)
                return True
        cell = np.array(self.cell, dtype=np.int64)
        lo = starts // cell
        if not ((stops - 1) // cell == lo).all():  # a box over several cells
            return self._insert_swept(starts, stops)
        dims = -(-np.array(self.shape, dtype=np.int64) // cell)
        if float(np.prod(dims.astype(np.float64))) >= 2.0**62:
            return False
        keys = np.ravel_multi_index(tuple(lo.T), tuple(dims.tolist()))
        keys.sort()
        if bool((keys[1:] == keys[:-1]).any()):
            # two boxes in one cell: the grid tells whether they meet, unless a sweep does
            return self._insert_swept(starts, stops)
        if self.keys is not None and len(self.keys):
            at = np.searchsorted(self.keys, keys).clip(max=len(self.keys) - 1)
            if bool((self.keys[at] == keys).any()):
                return False
            keys = np.concatenate((self.keys, keys))
            keys.sort()
        keys.flags.writeable = False  # (kept for the next step: never changed in place)
        if seen is not None:
            _lazy_last = (seen, keys)
        self.keys = keys
        self.lazy.append((starts, stops))
        self.n += len(starts)
        return True

    def _insert_swept(self, starts: np.ndarray, stops: np.ndarray) -> bool:
        """Keep the step's first batch as arrays where its boxes lie apart along an axis
        (:func:`apart`: none meets another); otherwise False and nothing is entered."""
        if self.n or not apart(starts, stops):
            return False
        self.swept = True
        self.lazy.append((starts, stops))
        self.n = len(starts)
        return True

    def _materialize(self) -> None:
        """Enter the boxes kept as arrays in the grid, in order (before any other change)."""
        pieces, self.lazy, self.keys, self.swept = self.lazy, [], None, False
        self.n -= sum(len(p[0]) for p in pieces)
        for starts, stops in pieces:
            for a, b in zip(map(tuple, starts.tolist()), map(tuple, stops.tolist()), strict=True):
                self._append(a, b, self._cells(a, b))

    def _insert_each(self, starts: np.ndarray, stops: np.ndarray) -> tuple[int, int] | None:
        s_t = list(map(tuple, starts.tolist()))
        e_t = list(map(tuple, stops.tolist()))
        for k, (a, b) in enumerate(zip(s_t, e_t, strict=True)):
            j = self.insert(a, b)
            if j >= 0:
                for _ in range(k):
                    self.pop()
                return (k, j)
        return None

    def pop(self) -> None:
        """Forget the box entered last (its put failed after the test)."""
        if self.lazy:
            self._materialize()
        if self.loose:  # the first box, alone and out of the grid
            self.starts.pop()
            self.stops.pop()
            self.n, self.loose = 0, False
            return
        j = self.n - 1
        start, stop = self.starts.pop(), self.stops.pop()
        self.n = j
        if self.ndim == 0:
            return
        if self.big and self.big[-1] == j:
            self.big.pop()
            return
        for key in self._cells(start, stop) or ():
            got = self.grid.get(key)
            if got and got[-1] == j:
                got.pop()

    def _cells(self, start, stop):
        cell = self.cell
        assert cell is not None
        ndim = self.ndim
        lo: tuple[int, ...]
        hi: tuple[int, ...]
        if ndim == 3:  # the common cases, unrolled
            c0, c1, c2 = cell
            a0, a1, a2 = start[0] // c0, start[1] // c1, start[2] // c2
            b0, b1, b2 = (stop[0] - 1) // c0, (stop[1] - 1) // c1, (stop[2] - 1) // c2
            if a0 == b0 and a1 == b1 and a2 == b2:
                return ((a0, a1, a2),)
            lo, hi = (a0, a1, a2), (b0, b1, b2)
        elif ndim == 1:
            c0 = cell[0]
            a0, b0 = start[0] // c0, (stop[0] - 1) // c0
            if a0 == b0:
                return ((a0,),)
            lo, hi = (a0,), (b0,)
        elif ndim == 2:
            c0, c1 = cell
            a0, a1 = start[0] // c0, start[1] // c1
            b0, b1 = (stop[0] - 1) // c0, (stop[1] - 1) // c1
            if a0 == b0 and a1 == b1:
                return ((a0, a1),)
            lo, hi = (a0, a1), (b0, b1)
        else:
            lo = tuple(a // c for a, c in zip(start, cell, strict=True))
            hi = tuple((b - 1) // c for b, c in zip(stop, cell, strict=True))
            if lo == hi:
                return (lo,)
        count = 1
        for a, b in zip(lo, hi, strict=True):
            count *= b - a + 1
        if count > self.MAX_CELLS:
            return None
        return list(itertools.product(*(range(a, b + 1) for a, b in zip(lo, hi, strict=True))))

    def _rebuild(self) -> None:
        """Many boxes are big for the grid: make the cell the median box shape and enter every box again."""
        ext = np.array(self.stops, dtype=np.int64) - np.array(self.starts, dtype=np.int64)
        self.cell = tuple(max(1, int(v)) for v in np.median(ext, axis=0))
        self._rebuilt_at = self.n
        self.loose = False  # every box is entered again below
        self.grid = {}
        self.big = []
        starts, stops = self.starts, self.stops
        self.starts, self.stops, self.n = [], [], 0
        for a, b in zip(starts, stops, strict=True):
            self._append(a, b, self._cells(a, b))


def apart(starts: np.ndarray, stops: np.ndarray) -> bool:
    """Whether boxes ``[starts[k], stops[k])`` lie apart along one of the axes (their
    intervals on it, sorted, each begin where the ones before end or later): then no two
    meet.  False says nothing (boxes apart along no single axis may still not meet)."""
    for d in range(starts.shape[1]):
        lo = starts[:, d]
        order = np.argsort(lo, kind="stable")
        hi = stops[order, d]
        if bool((np.maximum.accumulate(hi)[:-1] <= lo[order][1:]).all()):
            return True
    return False


#: the last batch of boxes entered into an empty index with numpy (BoxIndex._insert_lazy),
#: as ``(cell, dataset shape, batch shape, starts' bytes, stops' bytes)``, and its sorted
#: cells: a step that writes the boxes of the step before it (a simulation's decomposition)
#: holds no overlap among them for the same reasons, and finding that cost 10-15 numpy calls
_lazy_last: tuple | None = None


def enter_boxes(
    boxes: dict[int, BoxIndex],
    spec: DatasetSpec,
    starts: np.ndarray,
    stops: np.ndarray,
    step: int,
    lent_by: int | None = None,
) -> BoxIndex:
    """Enter a batch of boxes (``(n, ndim)`` arrays) like :func:`enter_box`, all or none.

    OverlapError, naming both boxes (and the batch position of the new one),
    if one meets a box entered before or an earlier box of the batch.  With
    *lent_by* (a rank), the batch is the blocks that rank's writes lent with
    ``copy=False``, entered at the commit: the error says so instead.
    """
    idx = boxes.get(spec.id)
    if idx is None:
        idx = boxes[spec.id] = BoxIndex(spec.ndim, spec.shape)
    base = idx.n
    got = idx.insert_many(starts, stops)
    if got is not None:
        k, j = got
        box = Box(tuple(starts[k].tolist()), tuple(stops[k].tolist()))
        if j < base:
            other = Box(idx.starts[j], idx.stops[j])
        else:
            other = Box(tuple(starts[j - base].tolist()), tuple(stops[j - base].tolist()))
        if lent_by is not None:
            raise _lent_overlap(spec, step, box, other, lent_by)
        where = (
            "already written by this rank in this step"
            if j < base
            else f"block {j - base} of the same call"
        )
        raise OverlapError(
            f"dataset {spec.path!r}, step {step}: box {box} (block {k} of {len(starts)}) "
            f"overlaps box {other} {where}"
        )
    return idx


def _lent_overlap(spec: DatasetSpec, step: int, box: Box, other: Box, rank: int) -> OverlapError:
    return OverlapError(
        f"dataset {spec.path!r}, step {step}: box {box} overlaps box {other}, both "
        f"written by rank {rank} in this step (a write with copy=False is checked "
        "for overlap when its step is committed; this step is not committed)"
    )


def _meets(a0, a1, b0, b1) -> bool:
    for s, e, t, u in zip(a0, a1, b0, b1, strict=True):
        if s >= u or t >= e:
            return False
    return True


def enter_box(
    boxes: dict[int, BoxIndex], spec: DatasetSpec, box: Box, step: int, lent_by: int | None = None
) -> BoxIndex:
    """Enter *box* among one rank's boxes of *spec* in *step* (*boxes*: dataset id -> index).

    OverlapError, naming both boxes, if it meets one; the caller takes it out
    again (``pop`` of the index returned) if its put fails afterwards.  With
    *lent_by*, as for :func:`enter_boxes`: the box of a lent block, entered at
    the commit.
    """
    idx = boxes.get(spec.id)
    if idx is None:
        idx = boxes[spec.id] = BoxIndex(spec.ndim, spec.shape)
    j = idx.insert(box.start, box.stop)
    if j >= 0:
        other = Box(idx.starts[j], idx.stops[j])
        if lent_by is not None:
            raise _lent_overlap(spec, step, box, other, lent_by)
        raise OverlapError(
            f"dataset {spec.path!r}, step {step}: box {box} overlaps box {other} "
            "already written by this rank in this step"
        )
    return idx
