"""What a query needs of an open file at one step: datasets, their blocks, reads, costs.

The query code talks to the engine stack of the file (never to the API's
File objects) only through this class, so that what it assumes of the interface is in one place:
``catalog``, ``check_step``, ``blocks``, ``get``, ``bytes_read``, and, for
derived quantities, ``definition``, ``definitions`` and ``coverage``.
"""

from __future__ import annotations

import math
import numbers
import time

import numpy as np

from .. import codecs
from ..catalog import CODEC_STATS_ONLY, BlockTable
from ..derived import Interval, needed_boxes
from ..derived.bounds import f64_of
from ..errors import BoundsError, StepError
from ..geometry import Box, rows_less, rows_prod
from ..layouts.spec import Layout
from .result import Units

INF = math.inf
#: any value, possibly NaN
FULL = Interval(-INF, INF, True)
#: no value at all
EMPTY = Interval(INF, -INF, False)
#: most nesting of derived quantities followed when counting the blocks a read touches
MAX_CHAIN = 32


def lower(v) -> float:
    """A float <= *v* (ints beyond 2**53 do not convert exactly, nor long doubles: a fill of
    1 + 2**-60 bounded by 1.0 let ``x > 1`` skip the elements it fills)."""
    if isinstance(v, np.floating):
        return f64_of(v, up=False)
    if isinstance(v, float):
        return float(v)
    x = int(v)
    f = float(x)
    return math.nextafter(f, -INF) if f > x else f


def upper(v) -> float:
    """A float >= *v*."""
    if isinstance(v, np.floating):
        return f64_of(v, up=True)
    if isinstance(v, float):
        return float(v)
    x = int(v)
    f = float(x)
    return math.nextafter(f, INF) if f < x else f


def exact_range(a: np.ndarray) -> Interval:
    """The range of the values of *a* (complex data: unknown, as comparisons do not order it)."""
    kind = a.dtype.kind
    if kind == "c":
        return FULL
    if a.size == 0:
        return EMPTY
    if kind == "f":
        nan = bool(np.isnan(a).any())
        if nan:
            if bool(np.isnan(a).all()):
                return Interval(INF, -INF, True)
            return Interval(lower(np.nanmin(a)), upper(np.nanmax(a)), True)
        # outward: a long double's nearest float64 can lie inside its range (1 + 2**-60 as
        # 1.0 let ``x > 1`` skip it)
        return Interval(lower(a.min()), upper(a.max()), False)
    return Interval(int(a.min()), int(a.max()), False)  # integers and booleans: exact


def start_order(starts: np.ndarray) -> np.ndarray:
    """The order of the boxes with corners *starts* (``(n, ndim)``) by their starts, as tuples
    compare (stable: equal starts keep their order)."""
    n, ndim = starts.shape
    if n < 2 or ndim == 0:
        return np.arange(n, dtype=np.int64)
    return np.lexsort(starts.T[::-1])


class Ranges:
    """The range of one dataset over every unit of a query, as columns: ``lo``, ``hi`` (object
    arrays of Python ints for integer data, else float64), ``nan``, and ``known`` (False: only
    reading can tell, the None of :meth:`Source.stat_range`).

    Units are judged by these columns; :meth:`at` makes the :class:`Interval` of one unit, for
    the units judged one by one.
    """

    __slots__ = ("lo", "hi", "nan", "known", "exact")

    def __init__(
        self, lo: np.ndarray, hi: np.ndarray, nan: np.ndarray, known: np.ndarray, exact: bool
    ) -> None:
        self.lo, self.hi, self.nan, self.known, self.exact = lo, hi, nan, known, exact

    @classmethod
    def filled(cls, n: int, iv: Interval | None, exact: bool) -> Ranges:
        """*n* units, each of range *iv* (None: unknown)."""
        dt = np.dtype(object) if exact else np.dtype(np.float64)
        lo, hi, nan = (EMPTY.lo, EMPTY.hi, False) if iv is None else (iv.lo, iv.hi, iv.nan)
        return cls(
            np.full(n, lo, dtype=dt),
            np.full(n, hi, dtype=dt),
            np.full(n, nan, dtype=bool),
            np.full(n, iv is not None, dtype=bool),
            exact,
        )

    @classmethod
    def of(cls, ivs: list[Interval | None], exact: bool) -> Ranges:
        """The columns of a list of ranges (None: unknown)."""
        got = cls.filled(len(ivs), EMPTY, exact)
        for k, iv in enumerate(ivs):
            if iv is None:
                got.known[k] = False
            else:
                got.lo[k], got.hi[k], got.nan[k] = iv.lo, iv.hi, iv.nan
        return got

    def at(self, k: int) -> Interval | None:
        """The range over unit *k*, as :meth:`Source.stat_range` gives it."""
        if not self.known[k]:
            return None
        if self.exact:
            return Interval(self.lo[k], self.hi[k], bool(self.nan[k]))
        return Interval(float(self.lo[k]), float(self.hi[k]), bool(self.nan[k]))


class Table:
    """The blocks of one dataset at one step, as arrays for vectorized overlap tests and bounds."""

    def __init__(
        self,
        blocks: BlockTable | None,
        ndim: int,
        dtype: np.dtype | None = None,
        widen: float = 0.0,
    ) -> None:
        """*widen*: how far values read may lie from those the statistics describe (the tolerance
        of a lossy multiresolution dataset, whose statistics are of the values written)."""
        if blocks is None:
            blocks = BlockTable.empty(ndim, np.dtype(dtype if dtype is not None else "f8"))
        n = len(blocks)
        exact = dtype is not None and dtype.kind in "biu"  # integer bounds stay Python ints
        self.blocks = blocks
        self.n = n
        self.starts = blocks.start
        self.stops = blocks.stop
        self.has_stats = np.asarray(blocks.has_stats, dtype=bool)
        self.stored = blocks.codec != CODEC_STATS_ONLY
        some = self.has_stats & (blocks.count > 0)
        if exact:
            self.lo = np.where(some, blocks.smin.astype(object), INF)
            self.hi = np.where(some, blocks.smax.astype(object), -INF)
        else:  # float statistics are the values themselves (complex: of |z|, not used for bounds)
            self.lo = np.where(some, blocks.smin.astype(np.float64) - widen, INF)
            self.hi = np.where(some, blocks.smax.astype(np.float64) + widen, -INF)
        size = rows_prod(self.stops - self.starts)
        self.nan = self.has_stats & (blocks.count < size)

    @property
    def boxes(self) -> list[Box]:
        return [self.blocks.box(i) for i in range(self.n)]

    def hits(self, box: Box) -> tuple[np.ndarray, np.ndarray]:
        """Indices of the blocks that overlap *box*, and the size of each overlap."""
        idx, lo, hi = self.blocks.hits(box.start, box.stop)
        return idx, rows_prod(hi - lo)


class DatasetInfo:
    """Shape, dtype, fill value and derived definition (or None) of one dataset path."""

    __slots__ = ("path", "shape", "dtype", "fill", "definition")

    def __init__(self, path, shape, dtype, fill, definition) -> None:
        self.path = path
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.fill = fill
        self.definition = definition


class Source:
    """An open file (or a view of it) at one step, as the query sees it."""

    def __init__(self, engine, filename: str, step, level: int = 0) -> None:
        # an engine that cannot read (a producer of the memory transport) refuses every query,
        # not only those its statistics cannot answer
        engine.check_can_read()
        self.eng = engine
        self.filename = filename
        if step is not None and (not isinstance(step, numbers.Integral) or isinstance(step, bool)):
            raise StepError(f"a step is an integer (negative counts from the end), not {step!r}")
        if not isinstance(level, numbers.Integral) or isinstance(level, bool) or level < 0:
            raise BoundsError(f"a level is an integer >= 0 (0: full resolution), not {level!r}")
        self.step: int = self.eng.check_step(None if step is None else int(step))
        #: the resolution the query runs at: every dataset it names is read at this level
        #: (multiresolution datasets, docs/multires.md), in that level's coordinates
        self.level: int = int(level)
        self._tables: dict[str, Table] = {}
        self._covers: dict[str, tuple[list[Box], np.ndarray, np.ndarray]] = {}
        self._same: dict[tuple[str, str], np.ndarray | None] = {}
        self._infos: dict[str, DatasetInfo] = {}
        self.touched: set[tuple[str, int]] = set()
        #: elements read through :meth:`read`, and the seconds those reads took
        self.elements_read: int = 0
        self.read_seconds: float = 0.0

    # -- catalog ---------------------------------------------------------------
    def definitions(self) -> dict:
        return dict(self.eng.definitions())

    def definition(self, path: str):
        return self.eng.definition(path)

    def available(self) -> set[str]:
        """Every dataset path the query may name: primary datasets and derived components."""
        names = set(self.eng.catalog.datasets)
        for d in self.definitions().values():
            names.update(d.components)
        return names

    def info(self, path: str) -> DatasetInfo:
        got = self._infos.get(path)
        if got is None:
            spec = self.eng.catalog.datasets.get(path)
            d = self.definition(path)
            if self.level:
                got = self._level_info(path, spec, d)
            elif spec is not None:
                got = DatasetInfo(path, spec.shape, spec.dtype, spec.fill_scalar(), d)
            else:
                dt = np.dtype(d.dtype)
                got = DatasetInfo(path, d.shape, dt, np.zeros((), dtype=dt)[()], d)
            self._infos[path] = got
        return got

    def _level_info(self, path: str, spec, d) -> DatasetInfo:
        """A dataset seen at :attr:`level`: a multiresolution dataset with that level, or an error."""
        at = f"a query at level {self.level}"
        if d is not None:
            raise BoundsError(
                f"{at} reads multiresolution datasets at that level; {path!r} is a derived "
                "quantity, computed at level 0 only"
            )
        layout = Layout.of(spec)
        if layout is None:
            raise BoundsError(f"{at}: dataset {path!r} has one level (0), not level {self.level}")
        layout.check_level(self.level, path)
        lspec = self.eng.catalog.level(path, self.level)
        return DatasetInfo(path, lspec.shape, spec.dtype, spec.fill_scalar(), None)

    def table(self, path: str) -> Table:
        got = self._tables.get(path)
        if got is None:
            info = self.info(path)
            # at a level > 0, that level's own blocks: a band per patch, statistics at that level
            blocks = (
                self.eng.block_table(path, self.step, level=self.level)
                if path in self.eng.catalog.datasets
                else None
            )
            spec = self.eng.catalog.datasets.get(path)
            layout = Layout.of(spec) if spec is not None else None
            got = Table(blocks, len(info.shape), info.dtype, layout.tolerance if layout else 0.0)
            if blocks is not None and info.definition is not None and self._lossy(info.definition):
                # the statistics of values computed at write came from the inputs as written,
                # which a lossy codec did not keep: values recomputed from the stored inputs may
                # lie outside them, so only reading can tell
                got.has_stats = got.has_stats & got.stored
            self._tables[path] = got
        return got

    def _lossy(self, d, depth: int = 0) -> bool:
        """Whether derived quantity *d* is computed from inputs whose stored values may differ
        from those written (a lossy codec or a lossy multiresolution layout), directly or
        through quantities recomputed when read."""
        if depth > MAX_CHAIN:
            return True
        for p in d.inputs:
            spec = self.eng.catalog.datasets.get(p)
            if spec is not None:
                layout = Layout.of(spec)
                if codecs.lossy(spec.codecs) or (layout is not None and layout.tolerance > 0):
                    return True
            inner = self.definition(p)
            if inner is not None and inner.strategy != "store" and self._lossy(inner, depth + 1):
                return True
        return False

    def coverage(self, path: str) -> tuple[np.ndarray, np.ndarray]:
        """The starts and stops (``(n, ndim)``) of the boxes of the coverage of *path*."""
        _, starts, stops = self._cover(path)
        return starts, stops

    def _cover(self, path: str) -> tuple[list[Box], np.ndarray, np.ndarray]:
        """The coverage of *path* at this step (asked of the engine once), with its starts and
        stops as arrays for vectorized overlap tests."""
        got = self._covers.get(path)
        if got is None:
            boxes = list(self.eng.coverage(path, self.step))
            nd = boxes[0].ndim if boxes else 0
            starts = np.array([b.start for b in boxes], dtype=np.int64).reshape(len(boxes), nd)
            stops = np.array([b.stop for b in boxes], dtype=np.int64).reshape(len(boxes), nd)
            got = self._covers[path] = (boxes, starts, stops)
        return got

    def covered_parts(self, path: str, box: Box) -> list[Box]:
        """The parts of *box* in the coverage of *path*: each covered box that meets *box*, cut
        to it, in the order of :meth:`coverage`."""
        boxes, starts, stops = self._cover(path)
        if not boxes:
            return []
        lo = np.maximum(starts, np.asarray(box.start, dtype=np.int64))
        hi = np.minimum(stops, np.asarray(box.stop, dtype=np.int64))
        rows = np.flatnonzero(rows_less(lo, hi))
        return [
            Box(tuple(a), tuple(b))
            for a, b in zip(lo[rows].tolist(), hi[rows].tolist(), strict=True)
        ]

    # -- ranges ----------------------------------------------------------------
    def stat_range(self, path: str, box: Box) -> Interval | None:
        """Range of *path* over *box* from block statistics, or None if only reading can tell."""
        info = self.info(path)
        if info.dtype.kind == "c":
            return (
                FULL  # statistics are of |z|; comparisons of complex values are not bounded by them
            )
        t = self.table(path)
        if t.n == 0 and info.definition is not None:
            return None  # computed when read (strategy "expression")
        idx, sizes = t.hits(box)
        if idx.size and not bool(t.has_stats[idx].all()):
            return None
        exact = info.dtype.kind in "biu"  # integers: exact Python ints
        lo = t.lo[idx].min() if idx.size else INF
        hi = t.hi[idx].max() if idx.size else -INF
        nan = bool(t.nan[idx].any()) if idx.size else False
        if int(sizes.sum()) < box.size:  # partly unwritten: the fill value is there too
            fv = info.fill
            if exact:
                lo, hi = min(lo, int(fv)), max(hi, int(fv))
            elif isinstance(fv, float | np.floating) and math.isnan(fv):
                nan = True
            else:
                lo, hi = min(lo, lower(fv)), max(hi, upper(fv))
        if not exact:
            lo, hi = float(lo), float(hi)
        return Interval(lo, hi, nan)

    def unit_rows(
        self, path: str, grid: str | None, rows: np.ndarray | None, n: int
    ) -> np.ndarray | None:
        """The block of *path* each of *n* units lies in (-1: it meets none), given *rows*, the
        grid's block of each unit; None where only a search per unit can tell.

        A dataset without blocks meets no unit; the grid's own blocks are *rows*;
        a dataset whose blocks are the grid's, in any order (datasets written
        together), has the grid's rows mapped onto its own.
        """
        t = self.table(path)
        if t.n == 0:
            return np.full(n, -1, dtype=np.int64)
        if rows is None or grid is None:
            return None
        if path == grid:
            return rows
        to = self._same_blocks(path, grid)
        if to is None:
            return None
        return np.where(rows >= 0, to[np.maximum(rows, 0)], -1)

    def _same_blocks(self, path: str, grid: str) -> np.ndarray | None:
        """Row of *path*'s block with the same box as each of *grid*'s blocks, or None if
        their blocks differ (asked once a pair)."""
        key = (path, grid)
        if key in self._same:
            return self._same[key]
        t, g = self.table(path), self.table(grid)
        to = None
        if t.n == g.n:
            if np.array_equal(t.starts, g.starts) and np.array_equal(t.stops, g.stops):
                to = np.arange(t.n, dtype=np.int64)
            elif t.starts.shape[1]:
                ot, og = start_order(t.starts), start_order(g.starts)
                if np.array_equal(t.starts[ot], g.starts[og]) and np.array_equal(
                    t.stops[ot], g.stops[og]
                ):
                    to = np.empty(t.n, dtype=np.int64)
                    to[og] = ot
        self._same[key] = to
        return to

    def unit_ranges(self, path: str, units: Units, rows: np.ndarray | None) -> Ranges:
        """:meth:`stat_range` of each unit, as columns: unit *k* lies inside block ``rows[k]``
        of *path* (-1: it meets no block of *path*).

        Vectorized over the units (the statistics of the one block a unit lies
        in; the fill value for a unit outside every block); the same ranges as
        :meth:`stat_range`.  *rows* None (blocks that do not follow the grid's):
        :meth:`stat_range` unit by unit.
        """
        info = self.info(path)
        t = self.table(path)
        n = len(units)
        exact = info.dtype.kind in "biu"  # integers: exact Python ints
        if info.dtype.kind == "c":  # no statistics bound comparisons of complex values
            return Ranges.filled(n, FULL, exact)
        if t.n == 0 and info.definition is not None:  # computed when read
            return Ranges.filled(n, None, exact)
        if rows is None:
            return Ranges.of([self.stat_range(path, u) for u in units], exact)
        inside = rows >= 0
        at = rows[inside]
        got = Ranges.filled(n, EMPTY, exact)
        got.known[inside] = t.has_stats[at]
        got.lo[inside] = t.lo[at]
        got.hi[inside] = t.hi[at]
        got.nan[inside] = t.nan[at]
        if not inside.all():  # unwritten: the fill value alone, the same in every such unit
            fill = self.stat_range(path, units[int(np.argmin(inside))])
            assert fill is not None  # no block: the fill value is known
            out = ~inside
            got.lo[out], got.hi[out], got.nan[out] = fill.lo, fill.hi, fill.nan
        return got

    # -- reading ---------------------------------------------------------------
    @property
    def bytes_read(self) -> int:
        return int(self.eng.bytes_read)

    def read(self, path: str, box: Box) -> np.ndarray:
        """Values of *path* over *box* (one ``get``, or a read of :attr:`level`); notes the blocks it touches."""
        info = self.info(path)
        out = np.empty(box.shape, dtype=info.dtype)
        if not box.empty:
            t0 = time.perf_counter()
            if self.level:
                self.eng.get_level(path, box, self.step, out, self.level)
            else:
                self.eng.get(path, box, self.step, out)
            self.read_seconds += time.perf_counter() - t0
            self.elements_read += box.size
            self._touch(path, box, 0)
        return out

    def _touch(self, path: str, box: Box, depth: int) -> None:
        """Record the stored blocks a read of *box* of *path* moves (inputs of computed values too)."""
        if box.empty or depth > MAX_CHAIN:
            return
        t = self.table(path)
        idx, _ = t.hits(box)
        computed = False
        for i in idx:
            if t.stored[i]:
                self.touched.add((path, int(i)))
            else:
                computed = True
        info = self.info(path)
        d = info.definition
        if d is None or not (computed or t.n == 0):
            return
        # recomputed where its anchor has values (as the derived layer does), from the inputs
        parts = self.covered_parts(d.anchor, box)
        if sum(b.size for b in parts) == box.size:
            parts = [box]
        for part in parts:
            for p, b in needed_boxes(d.expr, part, info.shape).items():
                self._touch(p, b, depth + 1)
