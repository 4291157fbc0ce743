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
from ..errors import BoundsError, StepError
from ..geometry import Box, rows_less, rows_prod
from ..layouts.spec import Layout

INF = math.inf
#: any value, possibly NaN
FULL = Interval(-INF, INF, True)
#: no value at all
EMPTY = Interval(INF, -INF, False)
#: most nesting of derived quantities followed when counting the blocks a read touches
MAX_CHAIN = 32


def lower(v) -> float:
    """A float <= *v* (ints beyond 2**53 do not convert exactly)."""
    if isinstance(v, float | np.floating):
        return float(v)
    x = int(v)
    f = float(x)
    return math.nextafter(f, -INF) if f > x else f


def upper(v) -> float:
    """A float >= *v*."""
    if isinstance(v, float | np.floating):
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
            return Interval(float(np.nanmin(a)), float(np.nanmax(a)), True)
        return Interval(float(a.min()), float(a.max()), False)
    return Interval(int(a.min()), int(a.max()), False)  # integers and booleans: exact


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

    def coverage(self, path: str) -> list[Box]:
        return list(self._cover(path)[0])

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

    def unit_ranges(self, path: str, units: list[Box], rows: np.ndarray) -> list[Interval | None]:
        """:meth:`stat_range` of each unit, where unit *k* lies inside block ``rows[k]`` of *path*.

        ``rows[k] == -1``: unit *k* meets no block of *path*.  Vectorized
        over the units (the statistics of the one block a unit lies in); the
        same Intervals as :meth:`stat_range`.
        """
        info = self.info(path)
        t = self.table(path)
        if info.dtype.kind == "c" or (t.n == 0 and info.definition is not None):
            return [self.stat_range(path, u) for u in units]  # no statistics to look up
        inside = rows >= 0
        r = np.where(inside, rows, 0)
        known = np.where(inside, t.has_stats[r] if t.n else False, True)
        exact = info.dtype.kind in "biu"
        lo = np.where(inside, t.lo[r] if t.n else INF, INF).tolist()
        hi = np.where(inside, t.hi[r] if t.n else -INF, -INF).tolist()
        nan = (inside & (t.nan[r] if t.n else False)).tolist()
        out: list[Interval | None] = []
        fill = None
        for k, ok in enumerate(known.tolist()):
            if not ok:
                out.append(None)
            elif inside[k]:
                a, b = lo[k], hi[k]
                out.append(
                    Interval(a, b, nan[k]) if exact else Interval(float(a), float(b), nan[k])
                )
            else:  # unwritten: the fill value alone
                if fill is None:
                    fill = self.stat_range(path, units[k])
                out.append(fill)
        return out

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
