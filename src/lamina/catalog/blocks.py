"""Block records as columns: the blocks of one dataset at one step, and the blocks of one step.

A :class:`BlockTable` holds n blocks as arrays (boxes as ``(n, ndim)``
int64 corners, rank, subfile, offset, length, codec, checksums,
statistics), from the ``put`` that makes them to the commit that records
them, the catalog that keeps them and the reads and queries that use
them.  It is encoded and decoded as whole arrays, so a block costs a few
bytes of numpy work and no Python object; :meth:`BlockTable.record`
builds the :class:`~.model.BlockRecord` of one block where a user asks
for it.

:class:`StepBlocks` holds the tables of one committed step, by dataset,
each decoded the first time it is used: a reader opening a file of many
steps reads the small record heads and none of the block sections until a
step is read.  The sections of one block each (a step of many datasets
written once) are encoded together and decoded together, layout by layout.

Memory: a section stores ``16 ndim + 86`` bytes a block (134 bytes for a
3-D dataset): two int64 corners per dimension, offset, length, checksum
segment, min, max, sum (16 bytes for complex data) and count (8 bytes
each), rank, session, aggregator and checksum count (4 each), its
checksum (4 bytes per segment) and codec and statistics flags (1 each).
A decoded table of :data:`FOLD_MIN` blocks or more holds its columns in
memory of its own and each column whose rows all hold one value as that
value once (:meth:`BlockTable._fold`): blocks of one shape from one writer
cost their corners, offset, checksum and statistics, ``16 ndim + 36``
bytes (84 for 3-D), and less where the statistics are the same too.
Smaller tables stay views of their section's bytes.  A checksum pointer
(8 bytes a block) is made when first needed.  ``docs/format.md`` gives
the section layout.
"""

from __future__ import annotations

import functools
import math
import struct
import types
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..checksum import crc32c
from ..errors import FormatError, StepError
from ..geometry import Box, cols_max, cols_min, find_overlap_arrays, rows_any, rows_less, rows_prod
from .model import (
    CODEC_MULTIRES,
    CODEC_RAW,
    CODEC_STATS_ONLY,
    SEGMENT_UNIT,
    BlockCodec,
    BlockRecord,
    DatasetSpec,
    Stats,
)

#: offsets, lengths and checksum segments read from a file must stay below this
LIMIT = 1 << 62
_MAX_CODEC = int(max(BlockCodec))  # an int: an IntEnum member takes numpy's slow path


#: the stored dtypes of statistics (made once: a call of np.dtype costs as much as the rest
#: of these functions, which an open calls for every section of every step)
_STAT_I8, _STAT_U8, _STAT_F8, _SUM_C16 = (np.dtype(t) for t in ("<i8", "<u8", "<f8", "<c16"))


def stat_dtype(dt: np.dtype) -> np.dtype:
    """The dtype of the min/max columns of a dataset of dtype *dt* (8 bytes each, as stored)."""
    kind = dt.kind
    if kind == "i":
        return _STAT_I8
    if kind in "ub":
        return _STAT_U8
    return _STAT_F8


def sum_dtype(dt: np.dtype) -> np.dtype:
    """The dtype of the sum column: complex128 for complex datasets, else float64."""
    return _SUM_C16 if dt.kind == "c" else _STAT_F8


def row_bytes(ndim: int, dt: np.dtype) -> int:
    """Bytes one block takes in a section, without its checksums: corners (16 a dimension),
    offset, length, segment (24), min and max (16), the sum (8, complex 16), count (8),
    rank, session, aggregator and checksum count (16), codec and flag (2)."""
    return 16 * ndim + (82 if dt.kind == "c" else 74)


#: the columns of a section in the order they are stored (docs/format.md)
_FIELDS = (
    "start",
    "stop",
    "offset",
    "length",
    "seg",
    "smin",
    "smax",
    "ssum",
    "count",
    "rank",
    "session",
    "agg",
    "ncrc",
    "crcs",
    "codec",
    "has",
    "amax",
)
#: the columns of a section its checks do not judge (:func:`_section`)
_SECTION_REST = ("smin", "smax", "ssum", "rank", "session", "agg", "crcs")


@functools.lru_cache(maxsize=256)
def _section_dtype(n: int, nd: int, dt: np.dtype, ncrcs: int, amax: bool) -> np.dtype:
    """A section's columns after its head as the fields of one packed record, the way
    :meth:`BlockTable.decode` reads them with one call (the dtypes of the sizes met last
    are kept: a file's steps often hold the same number of blocks)."""
    sd, md = stat_dtype(dt), sum_dtype(dt)
    shapes = [(_I8, (n, nd)), (_I8, (n, nd)), *[(_U8, (n,))] * 3, (sd, (n,)), (sd, (n,))]
    shapes += [(md, (n,)), (_U8, (n,)), *[(_U4, (n,))] * 4, (_U4, (ncrcs,)), (_U1, (n,))]
    shapes += [(_U1, (n,))] + ([(_F8, (n,))] if amax else [])
    offsets, pos = [], 0
    for t, shape in shapes:
        offsets.append(pos)
        pos += t.itemsize * math.prod(shape)
    return np.dtype(
        {
            "names": list(_FIELDS[: len(shapes)]),
            "formats": [(t, shape) for t, shape in shapes],
            "offsets": offsets,
            "itemsize": pos,
        }
    )


@functools.lru_cache(maxsize=64)
def _judged_ranges(sec: np.dtype) -> tuple[tuple[int, int], ...]:
    """The byte ranges of a section (after its head) that :func:`_check_columns` judges,
    the offsets apart: boxes, lengths and segments, counts, checksum counts, codecs, flags
    and magnitudes (statistics, ranks, offsets and checksums are not judged)."""
    fields, names = sec.fields, sec.names
    assert fields is not None and names is not None  # a section's record dtype
    at = {name: fields[name][1] for name in names}
    return (
        (at["start"], at["offset"]),
        (at["length"], at["smin"]),
        (at["count"], at["rank"]),
        (at["ncrc"], at["crcs"]),
        (at["codec"], sec.itemsize),
    )


def _judged_bytes(mv: memoryview, sec: np.dtype, spec: DatasetSpec, ncrcs: int) -> tuple:
    """What :func:`_check_columns` judges a section on, but for its offsets: the dataset's
    shape, dtype and kind, the section's checksum count, and the bytes of the columns it
    looks at.  Two sections with equal values get the same verdict."""
    parts = b"".join([mv[16 + a : 16 + b] for a, b in _judged_ranges(sec)])
    return (spec.shape, spec.dtype.str, spec.layout is not None, sec, ncrcs, parts)


#: what the last section found sound was judged on (:func:`_judged_bytes`): a step written
#: like the one before it (a simulation's decomposition) is sound for the same reasons, and
#: its checks cost two thirds of decoding a table of 64 blocks; its offsets are checked
_sound_last: tuple | None = None
#: sections of more blocks are always checked: the bytes a verdict is kept on are copied,
#: and at 32,768 blocks their copy into new memory costs as much as the checks
JUDGED_MAX = 4096


def _remember_sound(judged: tuple) -> None:
    global _sound_last
    _sound_last = judged


#: what the last group of one-block sections found sound was judged on
#: (:meth:`StepBlocks._decode_ones`): their record layout, checksum count, the datasets'
#: definitions (the objects: a definition is never changed in place) and the bytes
#: :func:`_ones_mask` keeps.  A step of many datasets written like the one before it is
#: sound for the same reasons; its offsets are checked
_ones_sound_last: tuple | None = None


def _grid_cells_apart(start: np.ndarray, stop: np.ndarray) -> bool:
    """Whether blocks ``[start[k], stop[k])`` are cells of one grid (one non-empty shape, corners
    a whole number of shapes apart), each cell at most once: then no two overlap.  The common
    decomposition, judged a dimension at a time with a few whole-column operations and a
    count of cells instead of :func:`~lamina.geometry.find_overlap_arrays` (5-10x the cost);
    False when the blocks are not such cells, or two are the same cell (the full search then
    names them)."""
    n, nd = start.shape
    if not nd:
        return False
    key = np.zeros(n, dtype=np.int64)  # each block's cell, numbered over the grid's hull
    cells = 1
    for j in range(nd):
        s, e = start[:, j], stop[:, j]
        w = int(e[0]) - int(s[0])
        if w <= 0 or not bool((e - s == w).all()):
            return False
        c, rest = np.divmod(s - s[0], w)
        if bool(rest.any()):
            return False
        c -= c.min()
        span = int(c.max()) + 1
        cells *= span
        if cells >= 1 << 62:
            return False
        key *= span
        key += c
    if cells <= 8 * n + 4096:  # a dense grid: counted
        return int(np.bincount(key, minlength=1).max()) <= 1
    key.sort()
    return not bool((key[1:] == key[:-1]).any())


#: the boxes (start and stop bytes) of the last table found to hold no overlapping blocks
#: (:meth:`BlockTable.check_disjoint`)
_disjoint_last: tuple | None = None


def _remember_disjoint(boxes: tuple) -> None:
    global _disjoint_last
    _disjoint_last = boxes


def _remember_ones(judged: tuple) -> None:
    global _ones_sound_last
    _ones_sound_last = judged


#: the fields of a one-block section :meth:`_OnesColumns.sound` judges
_ONES_JUDGED = tuple("n c start stop length seg count ncrc codec has amax".split())


@functools.lru_cache(maxsize=64)
def _ones_mask(rdt: np.dtype) -> np.ndarray:
    """A byte mask over one record of :func:`_ones_dtype`: 0xFF on the bytes
    :meth:`_OnesColumns.sound` judges (the head, boxes, lengths, segments, counts, checksum
    counts, codec, flag and magnitude), 0 on the others (offsets, statistics, ranks,
    subfiles and checksums)."""
    fields = rdt.fields
    assert fields is not None  # a record dtype
    mask = np.zeros(rdt.itemsize, dtype=np.uint8)
    for name in _ONES_JUDGED:
        if name in fields:
            t, at = fields[name][:2]
            mask[at : at + t.itemsize] = 0xFF
    mask.flags.writeable = False
    return mask


def _col(a: np.ndarray, dtype) -> memoryview:
    """Column *a* as little-endian *dtype*, C order, without a copy where it is one already."""
    return np.ascontiguousarray(a.astype(dtype, copy=False)).reshape(-1).data.cast("B")


#: tables of at most this many rows encode their columns as copies (fewer calls than views)
SMALL_TABLE = 256
#: decoded tables of at least this many rows hold their columns in memory of their own,
#: folded where every row holds one value (BlockTable._fold); smaller ones stay views of
#: their section's bytes (a few hundred bytes, and a fold costs a few numpy calls a column)
FOLD_MIN = 256
#: steps of at most this many blocks are grouped by dataset as Python ints (dataset_runs):
#: 0.4-3.6 us against numpy's 7-14 for 2-256 blocks of one dataset
RUNS_IN_PYTHON = 256
#: the columns a decoded table folds where every row holds one value
_FOLDABLE = (
    "length",
    "seg",
    "count",
    "rank",
    "session",
    "agg",
    "ncrc",
    "codec",
    "has_stats",
    "smin",
    "smax",
    "ssum",
    "amax",
)
#: a section's first 16 bytes: its number of blocks and of checksums
_HEAD = struct.Struct("<QQ")
#: unsigned integers of each item size, to compare a column bit for bit
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}
#: the column types of a section (docs/format.md), made once
_I8, _U8, _U4, _U1, _F8 = (np.dtype(t) for t in ("<i8", "<u8", "<u4", "u1", "<f8"))


#: the slots of a :class:`BlockTable` that hold no column (its dtype, shape and search state)
_NOT_COLUMNS = frozenset("dtype ndim _sorted _hull _whole _last _disjoint".split())


class BlockTable:
    """n blocks of one dataset as columns (see the module docstring).

    Row order is the order blocks were committed (rank by rank, each rank's
    in ``put`` order).  Tables are immutable once built, but for statistics
    that arrive after the record (:meth:`set_stats`); columns may be
    read-only views of the bytes they were decoded from.

    Readers of one table in several threads (dask's threaded scheduler): what a table
    makes at its first use (the search order, the checksum pointer, the hull) is made
    whole in local variables and then stored with one assignment, so that a thread finds
    it whole or not at all (then makes its own); no lock is taken on a read.
    """

    __slots__ = (
        "dtype",
        "ndim",
        "start",
        "stop",
        "rank",
        "session",
        "agg",
        "offset",
        "length",
        "codec",
        "seg",
        "ncrc",
        "_crc_ptr",
        "crcs",
        "has_stats",
        "smin",
        "smax",
        "ssum",
        "count",
        "amax",
        "_sorted",
        "_hull",
        "_whole",
        "_last",
        "_disjoint",
    )

    def __init__(
        self,
        dtype: np.dtype,
        start: np.ndarray,
        stop: np.ndarray,
        *,
        rank: np.ndarray,
        session: np.ndarray,
        agg: np.ndarray,
        offset: np.ndarray,
        length: np.ndarray,
        codec: np.ndarray,
        seg: np.ndarray,
        ncrc: np.ndarray,
        crcs: np.ndarray,
        has_stats: np.ndarray,
        smin: np.ndarray,
        smax: np.ndarray,
        ssum: np.ndarray,
        count: np.ndarray,
        amax: np.ndarray | None = None,
    ) -> None:
        self.dtype = np.dtype(dtype)
        self.ndim = start.shape[1]
        self.start, self.stop = start, stop
        self.rank, self.session, self.agg = rank, session, agg
        self.offset, self.length, self.codec, self.seg = offset, length, codec, seg
        self.ncrc, self.crcs = ncrc, crcs
        self._crc_ptr: np.ndarray | None = None  # made when first asked for (crc_ptr)
        self.has_stats = has_stats
        self.smin, self.smax, self.ssum, self.count = smin, smax, ssum, count
        #: bands of multiresolution datasets (format 4): the largest magnitude of each band's
        #: decoded coefficients (inf: unknown); None for other tables
        self.amax = amax
        # (hits) the rows sorted by start in dimension 0, their starts in dimension 0 and the
        # widest block's extent in dimension 0, made whole before they are stored: a thread
        # sees none of them or all three (one half-made searched with the extent 0)
        self._sorted: tuple[np.ndarray, np.ndarray, int] | None = None
        # the box around every block, as tuples of ints; the answer of a search that holds it
        self._hull: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self._whole: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # the last search that was not of everything: (box, its answer); None before any
        # (the first search scans, the next ones build and use the sorted order)
        self._last: tuple | None = None
        self._disjoint = False  # found to hold no two overlapping blocks (check_disjoint)

    def layout_key(self, rows: np.ndarray) -> tuple:
        """What a read of blocks *rows* (ascending, as :meth:`hits` gives them) is planned
        on: their number, dimensions and dtype, and as bytes their boxes, lengths, codecs,
        checksum counts and subfiles, and their offsets from the first one's.  Steps written
        alike (a simulation's decomposition, step after step) give equal keys and are read
        alike: the native engine keeps the plan of a read with this key (and the box and the
        output's geometry) for the next step.  Statistics and checksums are not in it: a
        plan takes them from the table it reads.  Made at each call, not kept (a key held by
        every table read would double the catalog's memory per block)."""
        cols: tuple[np.ndarray, ...]
        where: tuple[np.ndarray, ...]
        if len(rows) == len(self):  # every block (rows ascend, each once)
            cols = (self.start, self.stop, self.length, self.codec, self.ncrc)
            where = (self.session, self.agg, self.offset)
        else:
            # rows one after the other (a rank's own blocks, read back by it): slices
            at: slice | np.ndarray = rows
            if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1:
                at = slice(int(rows[0]), int(rows[-1]) + 1)
            cols = tuple(c[at] for c in (self.start, self.stop, self.length, self.codec, self.ncrc))
            where = tuple(c[at] for c in (self.session, self.agg, self.offset))
        session, agg, off = where
        return (
            cols[0].shape,
            self.dtype.str,
            *(c.tobytes() for c in cols),
            session.tobytes(),
            agg.tobytes(),
            (off - off[0]).tobytes() if len(off) else b"",
        )

    @property
    def crc_ptr(self) -> np.ndarray:
        """Where each block's checksums start in :attr:`crcs` (``n + 1`` entries, the last the
        total).  Made at the first use: a commit encodes tables that never need it, and its
        cumulative sum costs a few microseconds a table.  Stored once summed: another
        thread finds it whole or not at all (one stored zeroed, then summed, gave a block
        no checksums, and a read of it failed as corrupt)."""
        p = self._crc_ptr
        if p is None:
            p = np.zeros(len(self.ncrc) + 1, dtype=np.int64)
            np.cumsum(self.ncrc, out=p[1:])
            self._crc_ptr = p
        return p

    def set_stats(
        self,
        rows: np.ndarray,
        has: np.ndarray,
        smin: np.ndarray,
        smax: np.ndarray,
        ssum: np.ndarray,
        count: np.ndarray,
    ) -> None:
        """Fill in the statistics of *rows*, which the record carried without them.

        The in situ transport commits a step before its producers have
        reduced their blocks; their statistics follow on request.  Columns
        are copied before the first change (they may be read-only views).
        """
        for name in ("has_stats", "smin", "smax", "ssum", "count"):
            col = getattr(self, name)
            if not col.flags.writeable:
                setattr(self, name, col.copy())
        self.has_stats[rows] = has
        self.smin[rows], self.smax[rows] = smin, smax
        self.ssum[rows], self.count[rows] = ssum, count

    # -- construction -----------------------------------------------------
    @classmethod
    def empty(cls, ndim: int, dtype: np.dtype) -> BlockTable:
        return cls.build(dtype, np.zeros((0, ndim), np.int64), np.zeros((0, ndim), np.int64))

    @classmethod
    def build(
        cls,
        dtype,
        start,
        stop,
        *,
        rank=0,
        session=0,
        agg=0,
        offset=0,
        length=None,
        codec=BlockCodec.RAW,
        seg=0,
        crcs: Sequence[Sequence[int]] | None = None,
        has_stats=False,
        smin=0,
        smax=0,
        ssum=0,
        count=0,
    ) -> BlockTable:
        """A table from columns (arrays, or scalars broadcast to every row); lengths default to raw sizes.

        *crcs* is one sequence of checksums per block (default: one 0 each).
        """
        dt = np.dtype(dtype)
        start = np.ascontiguousarray(start, dtype=np.int64)
        stop = np.ascontiguousarray(stop, dtype=np.int64)
        n = start.shape[0]

        def col(v, t) -> np.ndarray:
            return np.ascontiguousarray(np.broadcast_to(np.asarray(v, dtype=t), (n,)))

        if length is None:
            length = rows_prod(stop - start) * dt.itemsize
        if crcs is None:
            ncrc = np.ones(n, dtype=np.uint32)
            flat = np.zeros(n, dtype=np.uint32)
        else:
            ncrc = np.fromiter((len(c) for c in crcs), dtype=np.uint32, count=n)
            flat = np.fromiter(
                (int(v) for c in crcs for v in c), dtype=np.uint32, count=int(ncrc.sum())
            )
        return cls(
            dt,
            start,
            stop,
            rank=col(rank, np.uint32),
            session=col(session, np.uint32),
            agg=col(agg, np.uint32),
            offset=col(offset, np.int64),
            length=col(length, np.int64),
            codec=col(codec, np.uint8),
            seg=col(seg, np.int64),
            ncrc=ncrc,
            crcs=flat,
            has_stats=col(has_stats, np.bool_),
            smin=col(smin, stat_dtype(dt)),
            smax=col(smax, stat_dtype(dt)),
            ssum=col(ssum, sum_dtype(dt)),
            count=col(count, np.int64),
        )

    @classmethod
    def from_records(cls, records: Sequence[BlockRecord], spec: DatasetSpec) -> BlockTable:
        """A table of per-block records (files of format versions 1 and 2 store blocks that way)."""
        n, nd, dt = len(records), spec.ndim, spec.dtype
        stats = [r.stats for r in records]
        has = [s is not None for s in stats]
        zero = Stats(0, 0, 0.0, 0)
        st = [s if s is not None else zero for s in stats]
        return cls.build(
            dt,
            np.array([r.box.start for r in records], dtype=np.int64).reshape(n, nd),
            np.array([r.box.stop for r in records], dtype=np.int64).reshape(n, nd),
            rank=[r.rank for r in records],
            session=[r.session for r in records],
            agg=[r.agg for r in records],
            offset=[r.offset for r in records],
            length=[r.length for r in records],
            codec=[r.codec for r in records],
            seg=[r.seg for r in records],
            crcs=[r.crcs for r in records],
            has_stats=has,
            smin=[s.min for s in st],
            smax=[s.max for s in st],
            ssum=[s.sum for s in st],
            count=[s.count for s in st],
        )

    @classmethod
    def concat(cls, tables: Sequence[BlockTable], ndim: int, dtype) -> BlockTable:
        """The rows of *tables* one after the other."""
        if len(tables) == 1 and len(tables[0].length):  # one part (one rank's): as it is
            return tables[0]
        tables = [t for t in tables if len(t.length)]
        if not tables:
            return cls.empty(ndim, np.dtype(dtype))
        if len(tables) == 1:
            return tables[0]

        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(t, name) for t in tables])

        return cls(
            tables[0].dtype,
            cat("start"),
            cat("stop"),
            rank=cat("rank"),
            session=cat("session"),
            agg=cat("agg"),
            offset=cat("offset"),
            length=cat("length"),
            codec=cat("codec"),
            seg=cat("seg"),
            ncrc=cat("ncrc"),
            crcs=cat("crcs"),
            has_stats=cat("has_stats"),
            smin=cat("smin"),
            smax=cat("smax"),
            ssum=cat("ssum"),
            count=cat("count"),
            amax=(
                np.concatenate(
                    [t.amax if t.amax is not None else np.full(len(t), np.inf) for t in tables]
                )
                if any(t.amax is not None for t in tables)
                else None
            ),
        )

    def take(self, idx: np.ndarray) -> BlockTable:
        """The rows *idx* (in that order) as a new table."""
        idx = np.asarray(idx, dtype=np.int64)
        flat = _take_crcs(self.crcs, self.crc_ptr, idx)
        return BlockTable(
            self.dtype,
            self.start[idx],
            self.stop[idx],
            rank=self.rank[idx],
            session=self.session[idx],
            agg=self.agg[idx],
            offset=self.offset[idx],
            length=self.length[idx],
            codec=self.codec[idx],
            seg=self.seg[idx],
            ncrc=self.ncrc[idx],
            crcs=flat,
            has_stats=self.has_stats[idx],
            smin=self.smin[idx],
            smax=self.smax[idx],
            ssum=self.ssum[idx],
            count=self.count[idx],
            amax=None if self.amax is None else self.amax[idx],
        )

    # -- rows ---------------------------------------------------------------
    def __len__(self) -> int:
        return self.start.shape[0]

    @property
    def nbytes(self) -> int:
        """Memory the columns take (the measure of the catalog's cost per block; a folded
        column, one value for every row, counts that value once)."""
        return sum(
            _held(getattr(self, name))
            for name in self.__slots__
            if name not in _NOT_COLUMNS and getattr(self, name) is not None
        )

    def stored_bytes(self) -> int:
        """Bytes the blocks take in storage (after compression), summed from the column."""
        return int(self.length.sum(dtype=np.int64))

    def value_bytes(self, itemsize: int) -> int:
        """Bytes of the blocks' values uncompressed, *itemsize* bytes each."""
        if not len(self):
            return 0
        sizes = (self.stop - self.start).prod(axis=1, dtype=np.int64)  # (0-D: the empty product)
        return int(sizes.sum(dtype=np.int64)) * itemsize

    def box(self, i: int) -> Box:
        return Box(tuple(self.start[i].tolist()), tuple(self.stop[i].tolist()))

    def check_disjoint(self, what: str) -> None:
        """FormatError naming two blocks of this table that overlap, if any (*what* starts the
        message).  A writer never commits such a table (every step's boxes are checked), so
        only damaged or forged metadata holds one; a read that puts several blocks together
        asks first, so that it never returns values of one block where another's belong, or
        memory no block wrote.  Checked once a table (O(n log n),
        :func:`~lamina.geometry.find_overlap_arrays`), and not again for a table whose boxes
        are those of the last table found disjoint (a step written like the one before)."""
        if self._disjoint or len(self.length) < 2:
            return
        # the corners' shape too: 2 blocks of 2-D corners have the bytes of 4 blocks of 1-D ones
        boxes = (self.start.shape, self.start.tobytes(), self.stop.tobytes())
        if boxes != _disjoint_last:
            pair = None
            if not _grid_cells_apart(self.start, self.stop):
                pair = find_overlap_arrays(self.start, self.stop)
            if pair is not None:
                i, j = pair
                raise FormatError(
                    f"{what}: blocks {self.box(i)} and {self.box(j)} overlap: the metadata is "
                    "corrupt (a writer never commits overlapping blocks)"
                )
            _remember_disjoint(boxes)
        self._disjoint = True

    def block_crcs(self, i: int) -> tuple[int, ...]:
        if len(self.ncrc) == 1:  # a table of one block: its checksums are all there are
            return tuple(self.crcs.tolist())
        return tuple(self.crcs[self.crc_ptr[i] : self.crc_ptr[i + 1]].tolist())

    def stats(self, i: int) -> Stats | None:
        if not self.has_stats[i]:
            return None
        return Stats.of_row(self.smin[i], self.smax[i], self.ssum[i], self.count[i])

    def record(self, i: int, dataset: int, stats: bool = True) -> BlockRecord:
        """Block *i* as a :class:`BlockRecord` (built on demand: tables keep no objects);
        without its statistics unless *stats* (a read of its values needs none)."""
        return BlockRecord(
            dataset,
            self.box(i),
            int(self.rank[i]),
            int(self.session[i]),
            int(self.agg[i]),
            int(self.offset[i]),
            int(self.length[i]),
            int(self.codec[i]),
            int(self.seg[i]),
            self.block_crcs(i),
            self.stats(i) if stats else None,
        )

    def records(self, dataset: int) -> list[BlockRecord]:
        return [self.record(i, dataset) for i in range(len(self))]

    # -- search ---------------------------------------------------------------
    def hits(
        self, start: Sequence[int], stop: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The blocks that meet the box ``[start, stop)``: row indices (ascending) and the common parts.

        Returns ``(idx, lo, hi)`` (read-only): block ``idx[k]`` meets the box
        in ``[lo[k], hi[k])``.  The first search of a table scans dimension 0
        of every block (one pass: a step opened to read one block pays no
        sort); later ones keep the rows sorted by their start in dimension 0,
        so only blocks that start within the widest block's extent before the
        box are tested: a box among many blocks costs a binary search and a
        test of its slab, not of every block.  The same box asked again gets
        the same answer without a search.
        """
        n = len(self)
        nd = self.ndim
        if n == 0:
            z = np.zeros((0, nd), dtype=np.int64)
            return _read_only(np.zeros(0, dtype=np.int64), z, z)
        if nd == 0:  # a 0-D box is one element: every 0-D block holds it
            z = np.zeros((n, 0), dtype=np.int64)
            return _read_only(np.arange(n, dtype=np.int64), z, z)
        # the box's own tests on its values: a read is often of everything in a small table
        if any(b <= a for a, b in zip(start, stop, strict=True)):
            z = np.zeros((0, nd), dtype=np.int64)
            return _read_only(np.zeros(0, dtype=np.int64), z, z)
        low, high = self.hull
        if all(a <= h for a, h in zip(start, low, strict=True)) and all(
            b >= h for b, h in zip(stop, high, strict=True)
        ):
            # the box holds every block (a read of everything): no search, no clipping
            if self._whole is None:
                self._whole = _read_only(np.arange(n, dtype=np.int64), self.start, self.stop)
            return self._whole
        s = np.asarray(start, dtype=np.int64)
        e = np.asarray(stop, dtype=np.int64)
        key = (s.tobytes(), e.tobytes())
        last = self._last
        if last and last[0] == key:
            return last[1]
        if last is None:  # the first search: one scan of dimension 0, ascending rows
            cand = np.flatnonzero((self.start[:, 0] < e[0]) & (self.stop[:, 0] > s[0]))
        else:
            by_start = self._sorted
            if by_start is None:
                order = np.argsort(self.start[:, 0], kind="stable")
                reach = int((self.stop[:, 0] - self.start[:, 0]).max())
                by_start = self._sorted = (order, self.start[order, 0], reach)
            order, first, reach = by_start
            a = int(np.searchsorted(first, int(s[0]) - reach, side="right"))
            b = int(np.searchsorted(first, int(e[0]), side="left"))
            cand = np.sort(order[a:b])
        lo = np.maximum(self.start[cand], s)
        hi = np.minimum(self.stop[cand], e)
        sel = np.flatnonzero(rows_less(lo, hi))
        got = _read_only(cand[sel], lo[sel], hi[sel])
        self._last = (key, got)
        return got

    @property
    def hull(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(start, stop)`` of the box around every block, made at the first use (non-empty tables)."""
        h = self._hull
        if h is None:
            if len(self) == 1:
                h = (tuple(self.start[0].tolist()), tuple(self.stop[0].tolist()))
            else:
                h = (tuple(cols_min(self.start).tolist()), tuple(cols_max(self.stop).tolist()))
            self._hull = h
        return h

    def read_cost(self, idx: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[int, int]:
        """``(elements, stored bytes)`` of reading the parts ``[lo[k], hi[k])`` of blocks
        ``idx[k]`` (as :meth:`hits` gives them): the elements they cover and the bytes a
        read takes, the part's bytes of a raw block, the whole stored block of a coded one."""
        k = len(idx)
        if k == 0:
            return 0, 0
        item = self.dtype.itemsize
        if k == 1:  # a dataset written as one block: on its values
            part = math.prod((hi[0] - lo[0]).tolist())
            i = int(idx[0])
            raw = int(self.codec[i]) == CODEC_RAW
            return part, part * item if raw else int(self.length[i])
        parts = rows_prod(hi - lo)
        raw = self.codec[idx] == CODEC_RAW
        covered = int(parts.sum())
        if bool(raw.all()):
            return covered, covered * item
        return covered, int(np.where(raw, parts * item, self.length[idx]).sum())

    # -- encoding ---------------------------------------------------------------
    def encode(self) -> bytes:
        """The section of this table (``docs/format.md``, versions 3 and 4: a table with
        :attr:`amax` ends with that column, which version 4 keeps for multiresolution datasets)."""
        n = len(self.length)
        sd, md = stat_dtype(self.dtype), sum_dtype(self.dtype)
        cols = [
            (self.start, _I8),
            (self.stop, _I8),
            (self.offset, _U8),
            (self.length, _U8),
            (self.seg, _U8),
            (self.smin, sd),
            (self.smax, sd),
            (self.ssum, md),
            (self.count, _U8),
            (self.rank, _U4),
            (self.session, _U4),
            (self.agg, _U4),
            (self.ncrc, _U4),
            (self.crcs, _U4),
            (self.codec, _U1),
            (self.has_stats, _U1),
        ]
        if self.amax is not None:
            cols.append((self.amax, _F8))
        head = _HEAD.pack(n, len(self.crcs))
        if n <= SMALL_TABLE:  # a few rows: copies cost less than views
            return head + b"".join([a.astype(t, copy=False).tobytes() for a, t in cols])
        # each column as it is (or converted) into the one join: a single copy
        return b"".join([head, *(_col(a, t) for a, t in cols)])

    @classmethod
    def decode(cls, buf, spec: DatasetSpec, what: str, amax: bool | None = False) -> BlockTable:
        """The table a section encodes, checked against *spec*; FormatError for anything else.

        *amax*: whether the section ends with the ``amax`` column; None where
        either may be (a multiresolution dataset in format 4, whose first
        writers did not write it): the section's size, with the block and
        checksum counts of its head, tells (a section of n blocks is 8 n
        bytes longer with it; of no blocks, the same: read as without it).
        Without the column the table has no magnitudes (unknown).

        Every check is on whole columns: boxes inside the dataset, known
        codecs, raw lengths equal to the box's bytes, offsets and lengths
        below 2**62, checksum segments that are multiples of 256 KiB and
        checksum counts that match them.
        """
        sec, cols = _section(buf, spec, what, amax)
        start, stop, offset, length, seg, ncrc, _, codec, has, count, mags = cols
        smin, smax, ssum, rank, session, agg, crcs = [sec[k] for k in _SECTION_REST]
        n = len(offset)
        off64, len64, seg64 = offset.view("<i8"), length.view("<i8"), seg.view("<i8")
        table = cls(
            spec.dtype,
            start,
            stop,
            rank=rank,
            session=session,
            agg=agg,
            offset=off64,
            length=len64,
            codec=codec,
            seg=seg64,
            ncrc=ncrc,
            crcs=crcs,
            has_stats=has.view(np.bool_),
            smin=smin,
            smax=smax,
            ssum=ssum,
            count=count.view("<i8"),
            amax=mags,
        )
        if n >= FOLD_MIN:
            table._fold()
        return table

    def _fold(self) -> None:
        """Hold the columns in memory of their own, a column whose rows are all the same value
        as that value once (a read-only view of stride 0): the section's bytes can go.

        A decoded table's columns are views of its section, ``16 ndim + 86`` bytes a block
        whatever they hold; most columns of a step are the same in every row (segment,
        count and length of blocks of one shape, session, aggregator and rank of one
        writer, codec, statistics flag, checksum count; min, max and sum of a constant
        field), and a column is compared bit for bit, so a folded float keeps its sign of
        zero and its NaN payload.
        """
        for name in _FOLDABLE:
            col = getattr(self, name)
            if col is None:
                continue
            setattr(self, name, _folded(col))
        self.start, self.stop = _frozen_copy(self.start), _frozen_copy(self.stop)
        self.offset, self.crcs = _frozen_copy(self.offset), _frozen_copy(self.crcs)


def _folded(col: np.ndarray) -> np.ndarray:
    """*col* (1-D) read-only in memory of its own: its one value at stride 0 when every row
    holds the same bits, else a copy.  The last row is compared first: a column that
    varies mostly says so there.

    Up to 64 KiB the column goes through bytes (arrays over bytes are read-only as they
    are), compared with themselves one row on: two copies and a memcmp, where numpy took a
    few calls of a microsecond or two each (folding a table of 1,000 rows: 22 us against
    88).  Larger columns are compared with numpy and copied only when they vary: bytes
    that large take new pages.
    """
    item = col.itemsize
    if col.nbytes <= 1 << 16:
        raw = col.tobytes()
        if raw[-item:] == raw[:item] and raw[item:] == raw[:-item]:
            return np.ndarray(col.shape, col.dtype, raw[:item], 0, (0,))
        return np.frombuffer(raw, col.dtype)
    bits = col.view(_BITS[item]).reshape(len(col), -1)
    if bool((bits[-1] == bits[0]).all()) and bool((bits == bits[0]).all()):
        return np.ndarray(col.shape, col.dtype, col[:1].tobytes(), 0, (0,))
    return _frozen_copy(col)


def _frozen_copy(col: np.ndarray) -> np.ndarray:
    """A read-only copy of *col* (decoded columns are read-only, copied or not)."""
    out = col.copy()
    out.flags.writeable = False
    return out


def _held(col: np.ndarray) -> int:
    """Bytes *col* holds: an item for a column of one value broadcast (stride 0)."""
    return col.itemsize if col.ndim == 1 and len(col) > 1 and col.strides[0] == 0 else col.nbytes


def _read_only(
    idx: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read-only views of an answer of :meth:`BlockTable.hits` (it may be kept and returned
    again, or be the table's own columns)."""
    out = (idx.view(), lo.view(), hi.view())
    for a in out:
        a.flags.writeable = False
    return out


def _crc_counts(seg: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Checksums a block of *length* bytes has with segments of *seg* bytes (0: one for
    the whole block; else one per segment begun, at least one).  The common table, every
    block with the same power-of-two segment, takes a shift instead of a division."""
    if not len(seg):
        return np.zeros(0, dtype=np.int64)
    s0 = int(seg[0])
    if bool((seg == s0).all()):
        if s0 == 0:
            return np.ones(len(seg), dtype=np.int64)
        if s0 & (s0 - 1) == 0:
            return np.maximum(1, (length + (s0 - 1)) >> (s0.bit_length() - 1))
    safe = np.where(seg > 0, seg, 1)
    return np.where(seg == 0, 1, np.maximum(1, -(-length // safe)))


class _Columns(NamedTuple):
    """The columns of a decoded section that its checks look at (:func:`_check_columns`,
    :func:`_check_one`), as :meth:`BlockTable.decode` reads them from the bytes."""

    start: np.ndarray  # (n, ndim) int64
    stop: np.ndarray
    offset: np.ndarray  # uint64
    length: np.ndarray
    seg: np.ndarray
    ncrc: np.ndarray  # uint32
    ncrcs: int  # the checksums the section's head says it holds
    codec: np.ndarray  # uint8
    has: np.ndarray
    counts: np.ndarray  # uint64: the values each block counts
    mags: np.ndarray | None  # float64, the bands' magnitudes (multiresolution), else None


def _section(buf, spec: DatasetSpec, what: str, amax: bool | None) -> tuple[np.void, _Columns]:
    """A section's columns as one packed record (the fields :meth:`BlockTable.decode` makes
    its table of) and those its checks judged (:class:`_Columns`), every check passed;
    FormatError for anything else.  *amax* as :meth:`BlockTable.decode` takes it."""
    mv = memoryview(buf).cast("B")
    dt, nd = spec.dtype, spec.ndim
    where = f"{what}: blocks of dataset {spec.path!r}"
    if len(mv) < 16:
        raise FormatError(f"{where}: section of {len(mv)} bytes is shorter than its 16-byte head")
    n, ncrcs = _HEAD.unpack_from(mv)
    if amax is None:
        amax = n > 0 and len(mv) == 16 + n * (row_bytes(nd, dt) + 8) + 4 * ncrcs
        either = True
    else:
        either = False
    row = row_bytes(nd, dt) + (8 if amax else 0)
    if n > (len(mv) - 16) // row or ncrcs > (len(mv) - 16) // 4:
        raise FormatError(
            f"{where}: {n} blocks and {ncrcs} checksums cannot fit in a section of {len(mv)} bytes"
        )
    if 16 + n * row + 4 * ncrcs != len(mv):
        also = f" (or {16 + n * (row + 8) + 4 * ncrcs} with magnitudes)" if either else ""
        raise FormatError(
            f"{where}: section of {len(mv)} bytes, {16 + n * row + 4 * ncrcs}{also} expected "
            f"for {n} blocks and {ncrcs} checksums"
        )
    # every column a field of one record: one frombuffer (count=1: an empty table's
    # record may have no bytes at all)
    sec = np.frombuffer(mv, dtype=_section_dtype(n, nd, dt, ncrcs, amax), count=1, offset=16)[0]
    offset = sec["offset"]
    cols = _Columns(
        sec["start"],
        sec["stop"],
        offset,
        sec["length"],
        sec["seg"],
        sec["ncrc"],
        ncrcs,
        sec["codec"],
        sec["has"],
        sec["count"],
        sec["amax"] if amax else None,
    )
    if n == 1:  # one block (a dataset written once a step): the same checks, on its values
        _check_one(spec, where, cols)
    elif n > JUDGED_MAX:
        _check_columns(spec, where, cols)
    else:
        judged = _judged_bytes(mv, sec.dtype, spec, ncrcs)
        if judged != _sound_last or (n and int(offset.max()) >= LIMIT):
            _check_columns(spec, where, cols)
            _remember_sound(judged)
    return sec, cols


def _check_columns(spec: DatasetSpec, where: str, cols: _Columns) -> None:
    """FormatError, naming the first bad block, unless the columns of a decoded section
    (as :meth:`BlockTable.decode` reads them) describe blocks of *spec*.  Every check is on
    whole columns; :func:`_check_one` makes the same checks on the values of one block."""
    start, stop, offset, length, seg, ncrc, ncrcs, codec, has, count, mags = cols
    n, nd, dt = len(offset), spec.ndim, spec.dtype

    def fail(mask: np.ndarray, why: str) -> None:
        """Raise naming the first block where *mask* (one row per block) holds."""
        if n and bool(mask.any()):  # the rows are looked at only when something is wrong
            i = int(np.argmax(rows_any(mask.reshape(n, -1))))
            box = f"{tuple(start[i].tolist())}..{tuple(stop[i].tolist())}"
            raise FormatError(f"{where}: block {i} (box {box}) {why}")

    shape = np.asarray(spec.shape, dtype=np.int64)
    ext = stop - start
    # a column at a time: a sound table costs a few reductions, a bad one names its row
    if nd and n and (bool((ext < 0).any()) or int(start.min()) < 0 or bool((stop > shape).any())):
        fail(
            (start < 0) | (ext < 0) | (stop > shape),
            f"is outside the dataset's shape {spec.shape}",
        )
    size = rows_prod(ext)  # elements per box
    big = LIMIT
    layered = spec.layout is not None
    if n and _looks_sound(cols, size, dt.itemsize, layered):
        return  # else each check below, row by row, names the first bad block
    len64, seg64 = length.view("<i8"), seg.view("<i8")
    # every row check as a mask, in the order their errors are reported; looked at one by
    # one only when their union holds anywhere
    checks = [
        ((offset >= big) | (length >= big), "has an impossible offset or length"),
        (codec > _MAX_CODEC, "has an unknown codec id"),
        (has > 1, "has a bad statistics flag"),
        (
            (codec == CODEC_MULTIRES) != layered,
            "is a multiresolution band of a plain dataset"
            if not layered
            else "of a multiresolution dataset is not a band",
        ),
        ((codec == CODEC_STATS_ONLY) & (len64 != 0), "keeps statistics only but claims bytes"),
        (
            (codec == CODEC_RAW) & (len64 != size * dt.itemsize),
            "is raw but its length is not its box's bytes",
        ),
        (
            (seg >= big) | (seg64 & (SEGMENT_UNIT - 1) != 0),  # SEGMENT_UNIT: a power of 2
            f"has a checksum segment that is not a multiple of {SEGMENT_UNIT}",
        ),
    ]
    bad = checks[0][0]
    for mask, _ in checks[1:]:
        bad = bad | mask
    if n and bool(bad.any()):
        for mask, why in checks:
            fail(mask, why)
    fail(
        ncrc.astype(np.int64) != _crc_counts(seg64, len64),
        "has the wrong number of checksums for its length",
    )
    if int(ncrc.sum(dtype=np.int64)) != ncrcs:
        raise FormatError(
            f"{where}: checksum counts add up to {int(ncrc.sum())}, the section holds {ncrcs}"
        )
    fail((has == 1) & (count > size.astype(np.uint64)), "counts more values than its box holds")
    if mags is not None:
        fail(~(mags >= 0), "has a coefficient magnitude that is negative or NaN")


def _looks_sound(cols: _Columns, size: np.ndarray, itemsize: int, layered: bool) -> bool:
    """True only when every row check of :func:`_check_columns` after the bounds passes, judged
    on reductions of whole columns (no mask a check, no union of masks): a table of one
    codec and one statistics flag, nearly every table.  False for a table it cannot judge
    so (codecs or flags that differ between rows) as for a bad one."""
    start, stop, offset, length, seg, ncrc, ncrcs, codec, has, count, mags = cols
    if max(int(offset.max()), int(length.max()), int(seg.max())) >= LIMIT:
        return False
    c, h = int(codec[0]), int(has[0])
    if int(codec.min()) != int(codec.max()) or int(has.min()) != int(has.max()):
        return False
    if c > _MAX_CODEC or h > 1 or (c == CODEC_MULTIRES) != layered:
        return False
    len64, seg64 = length.view("<i8"), seg.view("<i8")
    if c == CODEC_STATS_ONLY and int(length.max()) != 0:
        return False
    if c == CODEC_RAW and not np.array_equal(len64, size * itemsize):
        return False
    if bool((seg64 & (SEGMENT_UNIT - 1)).any()):
        return False
    if not np.array_equal(ncrc, _crc_counts(seg64, len64)):
        return False
    if int(ncrc.sum(dtype=np.int64)) != ncrcs:
        return False
    if (
        h == 1
        and int(count.max()) > int(size.min())
        and bool((count > size.astype(np.uint64)).any())
    ):
        return False
    return mags is None or bool((mags >= 0).all())


def _check_one(spec: DatasetSpec, where: str, cols: _Columns) -> None:
    """:func:`_check_columns` of a section of one block, on its values as Python numbers:
    the same checks in the same order with the same messages, at a tenth of the cost of
    twenty numpy calls on arrays of one element (a test holds the two to each other)."""
    start, stop, offset, length, seg, ncrc, ncrcs, codec, has, count, mags = cols
    _check_one_values(
        spec,
        where,
        start[0].tolist(),
        stop[0].tolist(),
        (int(offset[0]), int(length[0]), int(seg[0])),
        (int(codec[0]), int(has[0]), int(ncrc[0]), ncrcs, int(count[0])),
        None if mags is None else float(mags[0]),
    )


def _check_one_values(
    spec: DatasetSpec,
    where: str,
    s: list[int],
    e: list[int],
    place: tuple[int, int, int],
    kind: tuple[int, int, int, int, int],
    mag: float | None,
) -> None:
    """:func:`_check_one` of the block's values: corner *s*, end *e*, *place* (offset,
    length, segment), *kind* (codec, statistics flag, checksums, the section's checksums,
    count) and *mag* (its magnitude, a band's; None for a plain dataset's section)."""

    def fail(why: str) -> None:
        raise FormatError(f"{where}: block 0 (box {tuple(s)}..{tuple(e)}) {why}")

    for a, b, top in zip(s, e, spec.shape, strict=True):
        if a < 0 or b < a or b > top:
            fail(f"is outside the dataset's shape {spec.shape}")
    size = math.prod(b - a for a, b in zip(s, e, strict=True))
    off, ln, sg = place
    c, h, nc, ncrcs, count = kind
    layered = spec.layout is not None
    if off >= LIMIT or ln >= LIMIT:
        fail("has an impossible offset or length")
    if c > _MAX_CODEC:
        fail("has an unknown codec id")
    if h > 1:
        fail("has a bad statistics flag")
    if (c == CODEC_MULTIRES) != layered:
        fail(
            "is a multiresolution band of a plain dataset"
            if not layered
            else "of a multiresolution dataset is not a band"
        )
    if c == CODEC_STATS_ONLY and ln != 0:
        fail("keeps statistics only but claims bytes")
    if c == CODEC_RAW and ln != size * spec.dtype.itemsize:
        fail("is raw but its length is not its box's bytes")
    if sg >= LIMIT or sg & (SEGMENT_UNIT - 1):
        fail(f"has a checksum segment that is not a multiple of {SEGMENT_UNIT}")
    if nc != (1 if sg == 0 else max(1, -(-ln // sg))):
        fail("has the wrong number of checksums for its length")
    if nc != ncrcs:
        raise FormatError(f"{where}: checksum counts add up to {nc}, the section holds {ncrcs}")
    if h == 1 and count > size:
        fail("counts more values than its box holds")
    if mag is not None and not mag >= 0:
        fail("has a coefficient magnitude that is negative or NaN")


#: the fields of a one-block section :func:`_one_sizes` unpacks, by their struct codes
_ONE_FIELDS = {"start": "q", "stop": "q", "offset": "Q", "length": "Q", "seg": "Q"}
_ONE_FIELDS |= {"count": "Q", "ncrc": "I", "codec": "B", "has": "B", "amax": "d"}


@functools.lru_cache(maxsize=64)
def _one_struct(sec: np.dtype) -> struct.Struct:
    """The fields of :data:`_ONE_FIELDS` of a one-block section of record dtype *sec*, in
    order (the others skipped over), as one struct."""
    fields, names = sec.fields, sec.names
    assert fields is not None and names is not None  # a section's record dtype
    codes = []
    for name in names:
        t = fields[name][0]
        code = _ONE_FIELDS.get(name)
        if code is None:
            codes.append(f"{t.itemsize}x")
        else:
            codes.append(f"{t.itemsize // t.base.itemsize}{code}")
    return struct.Struct("<" + "".join(codes))


def _one_sizes(buf, spec: DatasetSpec, what: str, amax: bool | None) -> tuple[int, int] | None:
    """(bytes stored, bytes of values) of the one block a section of *spec* holds, every
    check of :func:`_section` passed, unpacked with one struct call (no array); None where
    the section is not one plain block of the size its head says (then :func:`_section`
    decodes it, and raises for what is wrong).  *amax* as :meth:`BlockTable.decode` takes it."""
    if amax is None or len(buf) < 16:
        return None
    mv = memoryview(buf).cast("B")
    n, ncrcs = _HEAD.unpack_from(mv)
    nd, dt = spec.ndim, spec.dtype
    if n != 1 or 16 + row_bytes(nd, dt) + 8 * amax + 4 * ncrcs != len(mv):
        return None
    v = _one_struct(_section_dtype(1, nd, dt, ncrcs, amax)).unpack_from(mv, 16)
    s, e = list(v[:nd]), list(v[nd : 2 * nd])
    off, ln, sg, count, nc, c, h = v[2 * nd : 2 * nd + 7]
    where = f"{what}: blocks of dataset {spec.path!r}"
    _check_one_values(
        spec, where, s, e, (off, ln, sg), (c, h, nc, ncrcs, count), v[-1] if amax else None
    )
    return ln, math.prod(b - a for a, b in zip(s, e, strict=True)) * dt.itemsize


# --------------------------------------------------------------------------
# the blocks of one step


#: reads *length* bytes at *offset* of a step's block area (a file, or bytes in memory)
Loader = Callable[[int, int], bytes | memoryview]


class Section(NamedTuple):
    """Where the blocks of one dataset at one step lie in the step's block area (a named
    tuple: a commit makes one per dataset, at a fraction of a frozen dataclass's cost)."""

    dataset: int
    nblocks: int
    offset: int  # bytes from the start of the area
    length: int
    crc: int  # CRC-32C of the section's bytes (as stored)
    raw: int = 0  # format 4: the table's length before zlib (0: stored as it is)


def extents_of(tables: dict[int, BlockTable]) -> list[tuple[int, int, int]]:
    """``(session, aggregator, end)`` for every subfile the blocks of *tables* lie in: the bytes they need."""
    ts = [t for t in tables.values() if len(t.length)]
    if not ts:
        return []

    def cat(name: str) -> np.ndarray:  # every table's blocks at once: one grouping for the step
        cols = [getattr(t, name) for t in ts]
        return cols[0] if len(cols) == 1 else np.concatenate(cols)

    return column_extents(cat("length"), cat("session"), cat("agg"), cat("offset"))


#: zlib level of the sections format 4 compresses (level 1: about 150 MB/s, most of the gain)
SQUEEZE_LEVEL = 1
#: tables shorter than this are stored as they are
SQUEEZE_MIN = 512


#: one-block tables of one layout are encoded together from this many; a step of at least
#: this many sections decodes its one-block sections together
ONES_MIN = 4
#: a step's one-block sections are decoded together once a reader has taken this share
#: (1 in ONES_SHARE) of its tables one at a time: one alone costs about what decoding this
#: many together does
ONES_SHARE = 8


@functools.lru_cache(maxsize=64)
def _ones_dtype(nd: int, dt: np.dtype, ncrcs: int, amax: bool) -> np.dtype:
    """The whole section of a table of one block (its 16-byte head, then its columns) as one
    packed record: many such sections are encoded (:func:`_encode_sections`) and decoded
    (:meth:`StepBlocks.table`) as one array of these."""
    sec = _section_dtype(1, nd, dt, ncrcs, amax)
    names = list(sec.names or ())
    fields = [sec.fields[k] for k in names] if sec.fields else []
    return np.dtype(
        {
            "names": ["n", "c", *names],
            "formats": [_U8, _U8, *(f[0] for f in fields)],
            "offsets": [0, 8, *(16 + f[1] for f in fields)],
            "itemsize": 16 + sec.itemsize,
        }
    )


#: the table's columns in the order of a section's fields (:data:`_FIELDS`)
_ATTRS = tuple("has_stats" if f == "has" else f for f in _FIELDS)


def encode_area(
    tables: dict[int, BlockTable], squeeze: Collection[int] = ()
) -> tuple[list[Section], bytes]:
    """The sections of *tables* (ascending dataset id) and the block area holding them back to back.

    The tables of the datasets in *squeeze* (format 4: the bands of
    multiresolution datasets, many small blocks with regular columns) are
    stored zlib-compressed where that is shorter.  Tables of one block (a
    step of many datasets written once each) are encoded together, layout
    by layout (:func:`_encode_sections`); the bytes are those each would encode.
    """
    dids = [d for d in sorted(tables) if len(tables[d])]
    ts = [tables[d] for d in dids]
    return _encode_sections(
        StepTable.of_tables(dids, ts),
        [t.ndim for t in ts],
        [t.dtype for t in ts],
        [t.amax is not None for t in ts],
        [d in squeeze for d in dids],
    )


def merge_extents(extents: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """``(session, aggregator, end)`` extents of parts of a step as :func:`extents_of` gives
    them for the whole: the furthest end in each subfile, in order.  A writer that stored a
    stream of blocks back to back knows where the stream ends without a look at each block
    (and :func:`column_extents` gives the rest)."""
    ends: dict[tuple[int, int], int] = {}
    for s, a, e in extents:
        if e > ends.get((s, a), -1):
            ends[(s, a)] = e
    return [(s, a, e) for (s, a), e in sorted(ends.items())]


def column_extents(
    length: np.ndarray, session: np.ndarray, agg: np.ndarray, offset: np.ndarray
) -> list[tuple[int, int, int]]:
    """``(session, aggregator, end)`` of every subfile the blocks of these columns lie in."""
    if len(length) <= 8:  # a few blocks: a loop costs less than numpy's calls
        ends: dict[tuple[int, int], int] = {}
        cols = (session.tolist(), agg.tolist(), offset.tolist(), length.tolist())
        for s, a, o, n in zip(*cols, strict=True):
            if n > 0 and o + n > ends.get((s, a), -1):
                ends[(s, a)] = o + n
        return [(s, a, e) for (s, a), e in sorted(ends.items())]
    stored = np.flatnonzero(length > 0)
    if not stored.size:
        return []
    key = session[stored].astype(np.int64) << 32 | agg[stored].astype(np.int64)
    end = offset[stored].astype(np.int64) + length[stored]
    if bool((key == key[0]).all()):  # one subfile (one aggregator): no grouping
        uniq, top = key[:1], end.max(keepdims=True)
    else:
        uniq, inv = np.unique(key, return_inverse=True)
        top = np.zeros(len(uniq), dtype=np.int64)
        np.maximum.at(top, inv, end)
    return [(k >> 32, k & 0xFFFFFFFF, e) for k, e in zip(uniq.tolist(), top.tolist(), strict=True)]


def dataset_runs(did: np.ndarray) -> tuple[np.ndarray | None, list[int], list[int]]:
    """Rows of datasets *did* grouped by dataset: ``(order, bounds, ids)``, *order* the
    rows sorted by dataset (stably; None when they already are), and run k rows
    ``bounds[k]:bounds[k + 1]`` of that order, the blocks of dataset ``ids[k]``."""
    n = len(did)
    if n < 2:  # no block or one: one run at most
        return None, [0, *([n] if n else [])], did.tolist()
    if n <= RUNS_IN_PYTHON:  # a few rows: as Python ints, a tenth of numpy's calls
        ids = did.tolist()
        if ids[0] == ids[-1] and ids.count(ids[0]) == n:  # one dataset (most steps)
            return None, [0, n], ids[:1]
        if ids == sorted(ids):
            bounds = [0, *[k for k in range(1, n) if ids[k] != ids[k - 1]], n]
            return None, bounds, [ids[b] for b in bounds[:-1]]
    order = None
    if bool((did[1:] < did[:-1]).any()):
        order = np.argsort(did, kind="stable")
        did = did[order]
    bounds = [0, *(np.flatnonzero(did[1:] != did[:-1]) + 1).tolist(), n]
    return order, bounds, did[bounds[:-1]].tolist()


def _take_crcs(crcs: np.ndarray, ptr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The checksums of rows *idx* (in that order) of flat checksums *crcs* whose rows start
    at *ptr* (``n + 1`` entries): one arange per row, flattened."""
    lo, hi = ptr[idx], ptr[idx + 1]
    counts = hi - lo
    if not counts.size:
        return crcs[:0]
    pos = np.repeat(lo - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    return crcs[pos + np.arange(int(counts.sum()))]


#: the columns of no block, as :meth:`StepTable.join` takes a part
_NO_ROWS: dict[str, Any] = {
    "did": np.zeros(0, np.int64),
    "start": np.zeros((0, 0), np.int64),
    "stop": np.zeros((0, 0), np.int64),
    **{name: np.zeros(0, np.int64) for name in ("offset", "length", "seg", "count")},
    **{name: np.zeros(0, np.uint32) for name in ("rank", "session", "agg", "ncrc", "crcs")},
    "smin": np.zeros(0, "<u8"),
    "smax": np.zeros(0, "<u8"),
    "ssum": np.zeros(0, "<f8"),
    "codec": np.zeros(0, np.uint8),
    "has_stats": np.zeros(0, bool),
    "amax": None,
}


def _widened(corners: np.ndarray, width: int) -> np.ndarray:
    """*corners* ``(n, d)`` as ``(n, width)``, zeros after its own columns."""
    if corners.shape[1] == width:
        return corners
    out = np.zeros((len(corners), width), dtype=np.int64)
    out[:, : corners.shape[1]] = corners
    return out


def _sum_as(col: np.ndarray, md: np.dtype) -> np.ndarray:
    """A sums column (float64 or complex128) as *md*, the sum dtype of one dataset."""
    if col.dtype == md:
        return col
    return col.real if md.kind == "f" else col.astype(md)


class StepTable:
    """The blocks of one step, every dataset's, as one set of columns: what a commit builds
    from every rank's columns and encodes as the step's sections.

    Rows come by dataset id, then rank, then put order: section k holds rows
    ``bounds[k]:bounds[k + 1]``, the blocks of dataset ``dids[k]``.  The columns are those
    of :class:`BlockTable`, but for three: the corners are ``(n, width)`` int64, *width*
    the most dimensions of the step's datasets (a dataset's own first, zeros after); min
    and max are their 8 stored bytes as ``<u8`` (int64, uint64 or float64 by dataset); sums
    are float64, or complex128 where any dataset is complex.  A commit of many datasets
    thereby makes no table per dataset: :func:`encode_step` writes the sections of one
    block together from these columns, and :meth:`table` cuts the others.
    """

    __slots__ = (*_ATTRS, "dids", "bounds", "_ptr", "ends")
    start: np.ndarray
    stop: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    seg: np.ndarray
    smin: np.ndarray
    smax: np.ndarray
    ssum: np.ndarray
    count: np.ndarray
    rank: np.ndarray
    session: np.ndarray
    agg: np.ndarray
    ncrc: np.ndarray
    crcs: np.ndarray
    codec: np.ndarray
    has_stats: np.ndarray
    amax: np.ndarray | None
    bounds: list[int]  # section k: rows bounds[k]:bounds[k + 1]
    dids: list[int]  # section k: dataset dids[k]
    #: :meth:`extents`, where whoever built the table knew them (None: from the columns)
    ends: list[tuple[int, int, int]] | None

    def __init__(self, did: np.ndarray, **cols: np.ndarray | None) -> None:
        """A table of the rows given as *cols* (every name of :data:`_ATTRS`, ``amax``
        None where no dataset has one), of datasets *did*; sorted by dataset here (stably)
        when they are not already."""
        for name in _ATTRS:
            setattr(self, name, cols[name])
        self._ptr: np.ndarray | None = None
        self.ends = None
        order, self.bounds, self.dids = dataset_runs(did)
        if order is not None:  # ranks' rows interleave: by dataset
            self.crcs = _take_crcs(self.crcs, self.crc_ptr, order)
            for name in _ATTRS:
                col = getattr(self, name)
                if name != "crcs" and col is not None:
                    setattr(self, name, col[order])
            self._ptr = None

    @classmethod
    def join(cls, parts: Sequence[Mapping[str, Any]]) -> StepTable:
        """The rows of *parts* one after the other (then by dataset), each part the columns
        ``did`` and :data:`_ATTRS` of some blocks: corners of any width (padded to the
        widest), sums float64 or complex128, ``amax`` None where a part has none (inf)."""
        if not parts:
            parts = [_NO_ROWS]
        if len(parts) == 1:  # one rank's rows (every step of one rank): its columns as they are
            p = parts[0]
            return cls(p["did"], **{name: p[name] for name in _ATTRS})

        def cat(cols: list[np.ndarray]) -> np.ndarray:
            return cols[0] if len(cols) == 1 else np.concatenate(cols)

        width = max(p["start"].shape[1] for p in parts)
        sums = [p["ssum"] for p in parts]
        if len({c.dtype for c in sums}) > 1:  # float and complex datasets in different parts
            sums = [c.astype("<c16") for c in sums]
        cols: dict[str, np.ndarray | None] = {
            name: cat([p[name] for p in parts])
            for name in _ATTRS
            if name not in ("start", "stop", "ssum", "amax")
        }
        cols["start"] = cat([_widened(p["start"], width) for p in parts])
        cols["stop"] = cat([_widened(p["stop"], width) for p in parts])
        cols["ssum"] = cat(sums)
        cols["amax"] = (
            cat([np.full(len(p["did"]), np.inf) if p["amax"] is None else p["amax"] for p in parts])
            if any(p["amax"] is not None for p in parts)
            else None
        )
        return cls(cat([p["did"] for p in parts]), **cols)

    @classmethod
    def of_tables(cls, dids: Sequence[int], tables: Sequence[BlockTable]) -> StepTable:
        """The rows of *tables*, the blocks of datasets *dids* (ascending)."""
        return cls.join(
            [
                {
                    **{name: getattr(t, name) for name in _ATTRS},
                    "did": np.full(len(t), did, dtype=np.int64),
                    "smin": t.smin.view("<u8"),
                    "smax": t.smax.view("<u8"),
                }
                for did, t in zip(dids, tables, strict=True)
            ]
        )

    def __len__(self) -> int:
        return len(self.length)

    @property
    def crc_ptr(self) -> np.ndarray:
        """Where each row's checksums start in :attr:`crcs` (``n + 1`` entries)."""
        p = self._ptr
        if p is None:
            p = np.zeros(len(self.ncrc) + 1, dtype=np.int64)
            self.ncrc.cumsum(out=p[1:])  # the method: np.cumsum's wrapper costs as much again
            self._ptr = p
        return p

    def table(self, k: int, spec: DatasetSpec, amax: bool) -> BlockTable:
        """Section *k* (dataset ``dids[k]``, described by *spec*) as a :class:`BlockTable`,
        with its coefficient magnitudes (inf where unknown) if *amax*."""
        return self._cut(k, spec.ndim, spec.dtype, amax)

    def _cut(self, k: int, nd: int, dt: np.dtype, amax: bool) -> BlockTable:
        lo, hi = self.bounds[k], self.bounds[k + 1]
        sd = stat_dtype(dt)
        if lo == 0 and hi == len(self.length):  # the step's only section: every checksum
            crcs = self.crcs
        else:
            ptr = self.crc_ptr
            crcs = self.crcs[int(ptr[lo]) : int(ptr[hi])]
        mags = None
        if amax:
            mags = np.full(hi - lo, np.inf) if self.amax is None else self.amax[lo:hi]
        return BlockTable(
            dt,
            np.ascontiguousarray(self.start[lo:hi, :nd]),
            np.ascontiguousarray(self.stop[lo:hi, :nd]),
            rank=self.rank[lo:hi],
            session=self.session[lo:hi],
            agg=self.agg[lo:hi],
            offset=self.offset[lo:hi],
            length=self.length[lo:hi],
            codec=self.codec[lo:hi],
            seg=self.seg[lo:hi],
            ncrc=self.ncrc[lo:hi],
            crcs=crcs,
            has_stats=self.has_stats[lo:hi],
            smin=self.smin[lo:hi].view(sd),
            smax=self.smax[lo:hi].view(sd),
            ssum=_sum_as(self.ssum[lo:hi], sum_dtype(dt)),
            count=self.count[lo:hi],
            amax=mags,
        )

    def tables(self, specs: Sequence[DatasetSpec], amax: bool = True) -> dict[int, BlockTable]:
        """Every section as a table (by dataset id); multiresolution datasets' with their
        coefficient magnitudes if *amax*."""
        return {
            did: self.table(k, specs[did], amax and specs[did].layout is not None)
            for k, did in enumerate(self.dids)
        }

    def extents(self) -> list[tuple[int, int, int]]:
        """:func:`extents_of` the step's blocks (:attr:`ends` where they were known)."""
        if self.ends is not None:
            return self.ends
        return column_extents(self.length, self.session, self.agg, self.offset)


def encode_step(
    st: StepTable, specs: Sequence[DatasetSpec], version: int
) -> tuple[list[Section], bytes]:
    """:func:`encode_area` of ``st.tables(specs)`` (version 4 keeps the coefficient
    magnitudes of multiresolution datasets and compresses their sections where that is
    shorter; version 3 neither): the same bytes, without a table per one-block section."""
    mine = [specs[did] for did in st.dids]
    layered = [version >= 4 and s.layout is not None for s in mine]
    return _encode_sections(st, [s.ndim for s in mine], [s.dtype for s in mine], layered, layered)


def _encode_sections(
    st: StepTable,
    ndims: Sequence[int],
    dtypes: Sequence[np.dtype],
    amax: Sequence[bool],
    squeeze: Sequence[bool],
) -> tuple[list[Section], bytes]:
    """The sections of *st* and the block area holding them back to back, section k of
    ``ndims[k]`` dimensions and dtype ``dtypes[k]``, ending with its coefficient
    magnitudes if ``amax[k]``, zlib-compressed where shorter if ``squeeze[k]``.  The
    one-block sections of one layout, at least :data:`ONES_MIN` of them, are packed from
    the step's columns at once (one indexed copy per column); the bytes are those each
    section's table would encode."""
    bounds = st.bounds
    n = len(st.dids)
    grouped = n >= ONES_MIN  # else no layout can have enough sections
    first_ncrc = st.ncrc[bounds[:-1]].tolist() if grouped else []
    ones: dict[tuple, list[int]] = {}  # layout -> sections of one block of that layout
    if (
        grouped
        and bounds[-1] == n  # a block each
        and not any(squeeze)
        and ndims.count(ndims[0]) == n
        and dtypes.count(dtypes[0]) == n
        and amax.count(amax[0]) == n
        and first_ncrc.count(first_ncrc[0]) == n
    ):  # every section of one layout (a simulation's variables): one group, found without a loop
        ones[(ndims[0], stat_dtype(dtypes[0]), sum_dtype(dtypes[0]), first_ncrc[0], amax[0])] = (
            list(range(n))
        )
    elif grouped:
        kinds: dict[np.dtype, tuple] = {}
        for k in range(n):
            if bounds[k + 1] - bounds[k] != 1 or squeeze[k]:
                continue
            dt = dtypes[k]
            kind = kinds.get(dt)
            if kind is None:
                kind = kinds[dt] = (stat_dtype(dt), sum_dtype(dt))
            key = (ndims[k], *kind, first_ncrc[k], amax[k])
            group = ones.get(key)
            if group is None:
                ones[key] = [k]
            else:
                group.append(k)
    together: dict[int, memoryview] = {}  # section -> its bytes, from a group
    for (nd, sd, md, c, mags), group in ones.items():
        if len(group) < ONES_MIN:
            continue
        rows = np.array([bounds[k] for k in group], dtype=np.int64)
        dt = _ones_dtype(nd, dtypes[group[0]], c, mags)
        rec = np.zeros(len(group), dtype=dt)
        rec["n"] = 1
        rec["c"] = c
        shape = (len(group), 1)
        if nd:
            rec["start"] = st.start[rows, :nd].reshape(*shape, nd)
            rec["stop"] = st.stop[rows, :nd].reshape(*shape, nd)
        for name, attr in (
            ("offset", "offset"),
            ("length", "length"),
            ("seg", "seg"),
            ("count", "count"),
            ("rank", "rank"),
            ("session", "session"),
            ("agg", "agg"),
            ("ncrc", "ncrc"),
            ("codec", "codec"),
            ("has", "has_stats"),
        ):
            rec[name] = getattr(st, attr)[rows].reshape(shape)
        rec["smin"] = st.smin[rows].view(sd).reshape(shape)
        rec["smax"] = st.smax[rows].view(sd).reshape(shape)
        rec["ssum"] = _sum_as(st.ssum[rows], md).reshape(shape)
        if mags:
            rec["amax"] = (
                np.full(len(rows), np.inf) if st.amax is None else st.amax[rows]
            ).reshape(shape)
        first = st.crc_ptr[rows]
        rec["crcs"] = st.crcs[first[:, None] + np.arange(c)].reshape(len(group), c)
        flat, size = rec.view(np.uint8).reshape(-1).data, dt.itemsize
        if len(group) == len(st.dids):  # every section (of one layout): the area is rec's bytes
            return _back_to_back(st.dids, flat, size), bytes(flat)
        together.update((k, flat[j * size : (j + 1) * size]) for j, k in enumerate(group))
    sections: list[Section] = []
    parts: list[bytes | memoryview] = []
    pos = 0
    for k, did in enumerate(st.dids):
        raw: bytes | memoryview | None = together.get(k)
        size = 0
        if raw is None:
            raw = st._cut(k, ndims[k], dtypes[k], amax[k]).encode()
            if squeeze[k] and len(raw) >= SQUEEZE_MIN:
                packed = zlib.compress(raw, SQUEEZE_LEVEL)
                if len(packed) < len(raw):
                    raw, size = packed, len(raw)
        sections.append(Section(did, bounds[k + 1] - bounds[k], pos, len(raw), crc32c(raw), size))
        parts.append(raw)
        pos += len(raw)
    return sections, b"".join(parts)


def _back_to_back(dids: Sequence[int], flat, size: int) -> list[Section]:
    """The directory of one-block sections of datasets *dids*, *size* bytes each, back to
    back in *flat*: made column by column, each checksum taken of a row of one 2-D view
    (no slice object or Python frame per section)."""
    n = len(dids)
    rows: Any = np.frombuffer(flat, np.uint8, n * size).reshape(n, size)  # rows are buffers
    crcs = list(map(crc32c, rows))
    at = range(0, n * size, size)
    return list(map(Section._make, zip(dids, [1] * n, at, [size] * n, crcs, [0] * n, strict=True)))


def unsqueeze(raw, size: int, what: str, head: Callable[[bytes], None] | None = None) -> bytes:
    """The *size* bytes a compressed section holds; FormatError unless it holds exactly that.

    *head*, if given, judges the first 16 bytes (a table's head: its counts) before the rest
    is inflated, so that a few compressed bytes claiming more than the table can hold are
    refused without inflating them.
    """
    z = zlib.decompressobj()
    try:
        out = b""
        if head is not None:
            out = z.decompress(raw, min(16, size))
            if len(out) == min(16, size):  # (short: judged below, as any short stream)
                head(out)
            raw = z.unconsumed_tail
        out += z.decompress(raw, size - len(out))
    except zlib.error as e:
        raise FormatError(f"{what}: compressed blocks do not decompress ({e})") from None
    if len(out) != size or not z.eof or z.unconsumed_tail or z.unused_data:
        raise FormatError(f"{what}: compressed blocks do not hold the {size} bytes they claim")
    return out


class _OnesColumns:
    """The columns of many one-block sections of one layout, decoded as one array of records
    (:meth:`StepBlocks._decode_ones`): row k is the block of one dataset."""

    __slots__ = (*_FIELDS, "head")

    def __init__(self, rec: np.ndarray, amax: bool) -> None:
        k = len(rec)
        self.head = (rec["n"], rec["c"])
        self.start, self.stop = rec["start"], rec["stop"]  # (k, 1, ndim)
        self.offset, self.length, self.seg = (
            rec[f].view("<i8") for f in ("offset", "length", "seg")
        )
        self.smin, self.smax, self.ssum = rec["smin"], rec["smax"], rec["ssum"]
        self.count = rec["count"].view("<i8")
        self.rank, self.session, self.agg = rec["rank"], rec["session"], rec["agg"]
        self.ncrc, self.crcs, self.codec = rec["ncrc"], rec["crcs"].reshape(k, -1), rec["codec"]
        self.has = rec["has"]
        self.amax = rec["amax"] if amax else None

    def sound(self, specs: Sequence[DatasetSpec], ncrcs: int) -> np.ndarray:
        """Per row, whether its block passes every check :func:`_check_one` makes for its
        dataset (row k of dataset ``specs[k]``), and its head says one block and *ncrcs*
        checksums.  Rows that fail are decoded alone, where the check names them."""
        k = len(specs)
        nd = self.start.shape[2]
        start, stop = self.start.reshape(k, nd), self.stop.reshape(k, nd)
        shape = np.array([s.shape for s in specs], dtype=np.int64).reshape(k, nd)
        item = np.array([s.dtype.itemsize for s in specs], dtype=np.int64)
        layered = np.array([s.layout is not None for s in specs], dtype=bool)
        ext = stop - start
        ok = (self.head[0] == 1) & (self.head[1] == ncrcs)
        for j in range(nd):  # a column at a time (the short axis of a (k, nd) array is slow)
            ok &= (start[:, j] >= 0) & (ext[:, j] >= 0) & (stop[:, j] <= shape[:, j])
        size = rows_prod(np.maximum(ext, 0)) if nd else np.ones(k, dtype=np.int64)
        off, ln, sg = self.offset[:, 0], self.length[:, 0], self.seg[:, 0]
        codec, has = self.codec[:, 0], self.has[:, 0]
        ok &= (off >= 0) & (off < LIMIT) & (ln >= 0) & (ln < LIMIT)
        ok &= (codec <= _MAX_CODEC) & (has <= 1) & ((codec == CODEC_MULTIRES) == layered)
        ok &= ~((codec == CODEC_STATS_ONLY) & (ln != 0))
        ok &= ~((codec == CODEC_RAW) & (ln != size * item))
        ok &= (sg >= 0) & (sg < LIMIT) & (sg & (SEGMENT_UNIT - 1) == 0)
        ncrc = self.ncrc[:, 0].astype(np.int64)
        ok &= (ncrc == ncrcs) & (ncrc == _crc_counts(np.where(ok, sg, 0), np.where(ok, ln, 0)))
        ok &= ~((has == 1) & (self.count[:, 0].view("<u8") > size.astype(np.uint64)))
        if self.amax is not None:
            ok &= self.amax[:, 0] >= 0
        return ok

    def table(self, k: int, dtype: np.dtype) -> BlockTable:
        """Row *k* as the table of one block its section decodes to."""
        return BlockTable(
            dtype,
            self.start[k],
            self.stop[k],
            rank=self.rank[k],
            session=self.session[k],
            agg=self.agg[k],
            offset=self.offset[k],
            length=self.length[k],
            codec=self.codec[k],
            seg=self.seg[k],
            ncrc=self.ncrc[k],
            crcs=self.crcs[k],
            has_stats=self.has[k].view(np.bool_),
            smin=self.smin[k],
            smax=self.smax[k],
            ssum=self.ssum[k],
            count=self.count[k],
            amax=None if self.amax is None else self.amax[k],
        )


class StepBlocks:
    """The blocks of one committed step, by dataset: each section decoded the first time it is used.

    *load* reads bytes of the step's block area (None when every table is
    given already, as for files of format versions 1 and 2).  A section
    that fails its checksum or its checks raises FormatError naming the
    step and the dataset, when it is first used.
    """

    __slots__ = ("sections", "extents", "_load", "_tables", "what", "version", "_ones")

    def __init__(
        self,
        sections: dict[int, Section],
        extents: list[tuple[int, int, int]],
        load: Loader | None,
        what: str,
        tables: dict[int, BlockTable] | None = None,
        version: int = 4,
    ) -> None:
        self.sections = sections
        self.extents = extents
        self._load = load
        self._tables: dict[int, BlockTable] = dict(tables or {})
        self.what = what
        self.version = version  # the format of the sections (4: band tables end with amax)
        # one-block sections decoded together (_decode_ones): dataset -> (columns, row); None
        # until then
        self._ones: dict[int, tuple[_OnesColumns, int]] | None = None

    @classmethod
    def of_tables(cls, tables: dict[int, BlockTable], what: str = "step") -> StepBlocks:
        """A step whose tables are decoded already."""
        tables = {d: t for d, t in tables.items() if len(t)}
        sections = {d: Section(d, len(t), 0, 0, 0) for d, t in tables.items()}
        return cls(sections, extents_of(tables), None, what, tables)

    def datasets(self) -> list[int]:
        return sorted(self.sections)

    def nblocks(self, dataset: int) -> int:
        """How many blocks *dataset* has in this step (without decoding them)."""
        s = self.sections.get(dataset)
        return 0 if s is None else s.nblocks

    @property
    def together(self) -> bool:
        """Whether its one-block sections were decoded together (a reader of many of them)."""
        return self._ones is not None

    def loaded(self, dataset: int) -> bool:
        return dataset in self._tables

    def table(
        self, spec: DatasetSpec, specs: Sequence[DatasetSpec] | None = None, eager: bool = False
    ) -> BlockTable:
        """The blocks of dataset *spec* in this step (an empty table if it has none).

        With *specs* (every dataset, by id), once a reader has taken one in
        :data:`ONES_SHARE` of a step's tables alone, the next one-block dataset
        it asks for decodes all the step's one-block sections at once
        (:meth:`_decode_ones`): a reader of every variable of a step pays one
        load and one set of checks for them, a reader of a few of many pays
        for those few (each decode of all of them, at the second table, made
        reading 2 of 4000 datasets a step 80 times the cost of reading 1),
        and a reader of any share pays at most about twice what the better
        way would have cost.  With *eager* (the step read before was decoded
        together) the first one does.
        """
        t = self._tables.get(spec.id) if spec.id >= 0 else None
        if t is not None:
            return t
        sec = self.sections.get(spec.id) if spec.id >= 0 else None
        if sec is None:
            return BlockTable.empty(spec.ndim, spec.dtype)
        # read once: another thread's release() may drop them meanwhile (dict.pop is atomic)
        ones = self._ones
        if (
            ones is None
            and specs is not None
            and (eager or len(self._tables) >= max(1, len(self.sections) // ONES_SHARE))
            and self._load is not None
            and sec.nblocks == 1
            and len(self.sections) >= ONES_MIN
        ):
            ones = self._ones = self._decode_ones(specs)
        got = ones.pop(spec.id, None) if ones else None
        if got is not None:
            t = self._tables[spec.id] = got[0].table(got[1], spec.dtype)
            return t
        # format 4: a multiresolution dataset's section has the amax column or, written by
        # the first writers of format 4, not: its size tells (BlockTable.decode)
        t = BlockTable.decode(self._section_bytes(spec, sec), spec, self.what, self._amax(spec))
        self._check_count(spec, sec, len(t))
        self._tables[spec.id] = t
        return t

    def _section_bytes(self, spec: DatasetSpec, sec: Section):
        """The bytes of *spec*'s section *sec* (loaded, checked against the section's CRC-32C,
        decompressed), as :meth:`BlockTable.decode` takes them."""
        if self._load is None:
            raise FormatError(f"{self.what}: the blocks of dataset {spec.path!r} are not available")
        raw = self._load(sec.offset, sec.length)
        if len(raw) != sec.length:
            raise FormatError(
                f"{self.what}: blocks of dataset {spec.path!r} truncated ({len(raw)} of {sec.length} bytes)"
            )
        if crc32c(raw) != sec.crc:
            raise FormatError(
                f"{self.what}: blocks of dataset {spec.path!r} fail their checksum: the metadata is corrupt"
            )
        if sec.raw:
            raw = unsqueeze(
                raw, sec.raw, f"{self.what}: dataset {spec.path!r}", self._head_check(sec, spec)
            )
        return raw

    def _amax(self, spec: DatasetSpec) -> bool | None:
        """Whether *spec*'s sections end with the amax column (None: their size tells)."""
        return None if self.version >= 4 and spec.layout is not None else False

    def _check_count(self, spec: DatasetSpec, sec: Section, n: int) -> None:
        """FormatError unless *n*, the blocks *spec*'s section holds, is what the directory says."""
        if n != sec.nblocks:
            raise FormatError(
                f"{self.what}: dataset {spec.path!r} has {n} blocks, its record says {sec.nblocks}"
            )

    def _one_storage(self, spec: DatasetSpec, sec: Section) -> tuple[int, int, int]:
        """:meth:`storage` of a section of one block: its section loaded and checked as
        :meth:`table` does, its sizes taken from the columns with no table made or kept
        (``lamina ls`` of a file of 100,000 steps of two such datasets: 17.2 s with a
        table each, 7.3 s now)."""
        raw, amax = self._section_bytes(spec, sec), self._amax(spec)
        got = _one_sizes(raw, spec, self.what, amax)
        if got is not None:
            return 1, *got
        _, cols = _section(raw, spec, self.what, amax)  # (raises for what is wrong)
        self._check_count(spec, sec, len(cols.offset))
        size = math.prod((cols.stop[0] - cols.start[0]).tolist())
        return 1, int(cols.length[0]), size * spec.dtype.itemsize

    def _head_check(self, sec: Section, spec: DatasetSpec) -> Callable[[bytes], None]:
        """What a compressed section's head must say: its directory entry's block count, and
        a size that those blocks' columns and checksums take (a block of the dataset has at
        most a checksum per 256 KiB of the dataset's bytes, and one), with the amax column of a
        multiresolution dataset's section in format 4 or without it (its first writers')."""
        amax = self.version >= 4 and spec.layout is not None
        row = row_bytes(spec.ndim, spec.dtype)
        most_crcs = 2 + 2 * math.prod(spec.shape) * spec.dtype.itemsize // SEGMENT_UNIT

        def check(head: bytes) -> None:
            n, ncrcs = _HEAD.unpack_from(head)
            size = 16 + n * row + 4 * ncrcs
            if (
                n != sec.nblocks
                or ncrcs > n * most_crcs
                or sec.raw not in ((size, size + 8 * n) if amax else (size,))
            ):
                raise FormatError(
                    f"{self.what}: blocks of dataset {spec.path!r}: a compressed section of "
                    f"{sec.raw} bytes whose head counts {n} blocks and {ncrcs} checksums (its "
                    f"record says {sec.nblocks} blocks)"
                )

        return check

    def _decode_ones(self, specs: Sequence[DatasetSpec]) -> dict[int, tuple[_OnesColumns, int]]:
        """The step's one-block sections not decoded yet, read with one load and checked
        layout by layout as whole columns: ``{dataset: (columns, row)}``.

        A section that fails its checksum or any check of :func:`_check_one`
        is left out: decoded alone when it is asked for, it raises the error
        that names it.  Nothing is loaded when other sections would take
        most of the bytes between the first one-block section and the last.
        """
        version = self.version
        groups: dict[tuple, list[Section]] = {}
        for sec in self.sections.values():
            if sec.nblocks != 1 or sec.raw or sec.dataset in self._tables:
                continue
            spec = specs[sec.dataset]
            # (a section of the first format-4 writers, without the amax column, taken for one
            # with it fails the head's checksum count in sound(): it is decoded alone)
            amax = version >= 4 and spec.layout is not None
            c, rest = divmod(sec.length - 16 - row_bytes(spec.ndim, spec.dtype) - 8 * amax, 4)
            if c >= 1 and not rest:
                groups.setdefault((spec.ndim, spec.dtype, c, amax), []).append(sec)
        secs = [s for g in groups.values() for s in g]
        if len(secs) < ONES_MIN:
            return {}
        lo = min(s.offset for s in secs)
        hi = max(s.offset + s.length for s in secs)
        if hi - lo > 2 * sum(s.length for s in secs) + (64 << 10):
            return {}
        assert self._load is not None
        try:
            area = memoryview(self._load(lo, hi - lo)).cast("B")
        except FormatError:
            return {}  # each section says what is wrong with it when asked for
        if len(area) != hi - lo:
            return {}  # cut short: each section says so when asked for
        flat = np.frombuffer(area, dtype=np.uint8)
        out: dict[int, tuple[_OnesColumns, int]] = {}
        for (nd, dt, c, amax), grp in groups.items():
            good = [
                s for s in grp if crc32c(area[s.offset - lo : s.offset - lo + s.length]) == s.crc
            ]
            if not good:
                continue
            rdt = _ones_dtype(nd, dt, c, amax)
            at = np.array([s.offset - lo for s in good], dtype=np.int64)
            if bool((np.diff(at) == rdt.itemsize).all()):  # back to back: a view of the bytes
                rows = flat[at[0] : at[0] + len(good) * rdt.itemsize]
            else:
                rows = flat[(at[:, None] + np.arange(rdt.itemsize)).reshape(-1)]
                rows.flags.writeable = False
            rec = rows.view(rdt)
            dspecs = [specs[s.dataset] for s in good]
            cols = _OnesColumns(rec, amax)
            judged = (
                rdt,
                c,
                tuple(dspecs),
                (rows.reshape(len(good), -1) & _ones_mask(rdt)).tobytes(),
            )
            if judged == _ones_sound_last and bool((cols.offset.view("<u8") < LIMIT).all()):
                ok = np.ones(len(good), dtype=bool)  # judged like the last sound group
            else:
                ok = cols.sound(dspecs, c)
                if bool(ok.all()):
                    _remember_ones(judged)
            for k in np.flatnonzero(ok).tolist():
                out[good[k].dataset] = (cols, k)
        return out

    def storage(
        self, specs: Sequence[DatasetSpec], ids: Collection[int]
    ) -> dict[int, tuple[int, int, int]]:
        """``{dataset: (blocks, bytes stored, bytes of the values)}`` of each dataset of *ids*
        (by id, a set) that has blocks in this step, as the dataset's table gives them
        (``len``, :meth:`BlockInfos.stored_bytes`, ``raw_bytes``), without a table for each.

        Block counts are the section directory's; the bytes are summed from the columns
        of the one-block sections decoded together (one load and one set of checks for
        the step, :meth:`_decode_ones`, kept nowhere), or of a one-block section alone
        (:meth:`_one_storage`, kept nowhere either), the other sections' tables decoded
        one by one (and kept, as :meth:`table` keeps them).  A section that fails its
        checks raises the error :meth:`table` raises for it."""
        secs = self.sections
        if len(ids) < len(secs):
            todo = [d for d in ids if d in secs and secs[d].nblocks]
        else:
            todo = [d for d, sec in secs.items() if sec.nblocks and d in ids]
        ones: dict[int, tuple[_OnesColumns, int]] = {}
        alone = sum(1 for d in todo if secs[d].nblocks == 1 and d not in self._tables)
        # all of the step's one-block sections decoded together where those asked for are
        # enough of them (as table() judges it: one alone costs about ONES_SHARE together)
        if (
            self._load is not None
            and len(secs) >= ONES_MIN
            and alone >= max(ONES_MIN, len(secs) // ONES_SHARE)
        ):
            ones = self._decode_ones(specs)
        out: dict[int, tuple[int, int, int]] = {}
        together: dict[int, tuple[_OnesColumns, list[int], list[int]]] = {}
        for d in todo:
            got = ones.get(d) if d not in self._tables else None
            if got is not None:
                cols, k = got
                _, dids, rows = together.setdefault(id(cols), (cols, [], []))
                dids.append(d)
                rows.append(k)
                continue
            sec = secs[d]
            if sec.nblocks == 1 and d not in self._tables:
                out[d] = self._one_storage(specs[d], sec)
                continue
            t = self.table(specs[d])
            out[d] = (len(t), t.stored_bytes(), t.value_bytes(specs[d].dtype.itemsize))
        for cols, dids, rows in together.values():
            at = np.asarray(rows, dtype=np.int64)
            stored = cols.length[at, 0].tolist()
            size = (cols.stop[at, 0] - cols.start[at, 0]).prod(axis=1, dtype=np.int64).tolist()
            for d, n, v in zip(dids, stored, size, strict=True):
                out[d] = (1, n, v * specs[d].dtype.itemsize)
        return out

    def release(self) -> None:
        """Forget the decoded tables that can be loaded again (they are read back when next used)."""
        if self._load is not None:
            self._tables.clear()
            self._ones = None

    @property
    def nbytes(self) -> int:
        """Memory held by the decoded tables."""
        # (a copy of the tables, made at once: a reader's thread may add one meanwhile)
        return sum(t.nbytes for t in tuple(self._tables.values()))


#: the empty sections, extents and tables every :class:`ReleasedStep` shares (never changed)
_NOTHING: Any = types.MappingProxyType({})
_NO_EXTENTS: Any = ()


class ReleasedStep(StepBlocks):
    """A step whose blocks are gone from memory (the memory transport released it): its
    tables are a StepError saying *why*, not the empty tables of a step that wrote nothing.

    *why* is the message, or a function of *step* that makes it when it is raised: one
    function shared by every step of a long stream, where a message each took 250 bytes a
    step."""

    __slots__ = ("step",)

    def __init__(self, why: str | Callable[[int], str], step: int = -1) -> None:
        # one per step of a long stream: no containers of its own (the empty ones shared,
        # never changed)
        self.sections = _NOTHING
        self.extents = _NO_EXTENTS
        self._load = None
        self._tables = _NOTHING
        self.what = why  # type: ignore[assignment]
        self.version = 4
        self._ones = None
        self.step = step

    def _gone(self) -> StepError:
        why: Any = self.what
        return StepError(why if isinstance(why, str) else why(self.step))

    def nblocks(self, dataset: int) -> int:
        raise self._gone()

    def storage(
        self, specs: Sequence[DatasetSpec], ids: Collection[int]
    ) -> dict[int, tuple[int, int, int]]:
        raise self._gone()

    def table(
        self, spec: DatasetSpec, specs: Sequence[DatasetSpec] | None = None, eager: bool = False
    ) -> BlockTable:
        raise self._gone()
