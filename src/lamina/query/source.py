"""What a query needs of an open file at one step: datasets, their blocks, reads, costs.

The query code talks to the engine stack of the file (never to the API's
File objects) only through this class, so that what it assumes of the interface is in one place:
``catalog``, ``check_step``, ``blocks``, ``get``, ``bytes_read``, and, for
derived quantities, ``definition``, ``definitions`` and ``coverage``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..derived import Interval, needed_boxes
from ..errors import StepError
from ..geometry import Box

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
    """The blocks of one dataset at one step, as arrays for vectorized overlap tests."""

    def __init__(self, infos: list, ndim: int, dtype: np.dtype | None = None) -> None:
        n = len(infos)
        exact = dtype is not None and dtype.kind in "biu"  # integer bounds stay Python ints
        self.infos = infos
        self.n = n
        self.boxes = [b.box for b in infos]
        self.starts = np.array([b.box.start for b in infos], dtype=np.int64).reshape(n, ndim)
        self.stops = np.array([b.box.stop for b in infos], dtype=np.int64).reshape(n, ndim)
        self.has_stats = np.array([b.stats is not None for b in infos], dtype=bool)
        self.stored = np.array([b.codec != "stats-only" for b in infos], dtype=bool)
        self.lo = np.full(n, INF, dtype=object if exact else np.float64)
        self.hi = np.full(n, -INF, dtype=object if exact else np.float64)
        self.nan = np.zeros(n, dtype=bool)
        for i, b in enumerate(infos):
            st = b.stats
            if st is None:
                continue
            if st.count > 0:
                if exact:
                    self.lo[i], self.hi[i] = int(st.min), int(st.max)
                else:
                    self.lo[i], self.hi[i] = lower(st.min), upper(st.max)
            self.nan[i] = st.count < b.box.size

    def hits(self, box: Box) -> tuple[np.ndarray, np.ndarray]:
        """Indices of the blocks that overlap *box*, and the size of each overlap."""
        if self.n == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        ext = np.minimum(self.stops, box.stop) - np.maximum(self.starts, box.start)
        idx = np.nonzero(np.all(ext > 0, axis=1))[0]
        return idx, np.prod(ext[idx], axis=1, dtype=np.int64)


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

    def __init__(self, engine, filename: str, step) -> None:
        self.eng = engine
        self.filename = filename
        if step is not None and (not isinstance(step, numbers.Integral) or isinstance(step, bool)):
            raise StepError(f"a step is an integer (negative counts from the end), not {step!r}")
        self.step = self.eng.check_step(None if step is None else int(step))
        self._tables: dict[str, Table] = {}
        self._infos: dict[str, DatasetInfo] = {}
        self.touched: set[tuple[str, int]] = set()

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
            if spec is not None:
                got = DatasetInfo(path, spec.shape, spec.dtype, spec.fill_scalar(), d)
            else:
                dt = np.dtype(d.dtype)
                got = DatasetInfo(path, d.shape, dt, np.zeros((), dtype=dt)[()], d)
            self._infos[path] = got
        return got

    def table(self, path: str) -> Table:
        got = self._tables.get(path)
        if got is None:
            info = self.info(path)
            got = Table(list(self.eng.blocks(path, self.step)), len(info.shape), info.dtype)
            self._tables[path] = got
        return got

    def coverage(self, path: str) -> list[Box]:
        return list(self.eng.coverage(path, self.step))

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

    # -- reading ---------------------------------------------------------------
    @property
    def bytes_read(self) -> int:
        return int(self.eng.bytes_read)

    def read(self, path: str, box: Box) -> np.ndarray:
        """Values of *path* over *box* (one ``get``); notes the blocks it touches."""
        info = self.info(path)
        out = np.empty(box.shape, dtype=info.dtype)
        if not box.empty:
            self.eng.get(path, box, self.step, out)
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
        parts = [b for b in (c.intersect(box) for c in self.coverage(d.anchor)) if b is not None]
        if sum(b.size for b in parts) == box.size:
            parts = [box]
        for part in parts:
            for p, b in needed_boxes(d.expr, part, info.shape).items():
                self._touch(p, b, depth + 1)
