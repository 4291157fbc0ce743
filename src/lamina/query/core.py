"""Predicates -> candidate blocks -> exact selection."""

from __future__ import annotations

import numbers
import time
from collections.abc import Iterable, Sequence

import numpy as np

from .. import selection as selection_mod
from ..catalog import normpath
from ..derived import (
    Bounds,
    check,
    check_inputs,
    check_stencils,
    evaluate,
    needed_boxes,
    parse,
)
from ..derived.kernels import chunks
from ..derived.nodes import Expr
from ..errors import (
    BoundsError,
    ExpressionError,
    NotFoundError,
    SelectionError,
    ShapeError,
    suggest,
)
from ..geometry import Box, rows_less, rows_prod
from ..machine import usable_memory
from ..text import fmt_bytes
from .result import QueryResult, Units
from .source import FULL, INF, Interval, Ranges, Source, exact_range, start_order

#: most bytes of values read while pruning (datasets without statistics) that are kept for the
#: exact phase instead of being read again
CACHE_BYTES = 256 << 20
#: most elements of a unit read or evaluated at once (for an exact range, for the exact answer):
#: a larger unit is taken part by part, so memory does not grow with the size of the domain
PART_ELEMENTS = 1 << 22
#: the largest exact answer (coordinates and selected values) a query makes, in bytes: half
#: the memory this process may use (:func:`answer_limit`); an answer past it is a MemoryError that says
#: so before it is made, where it ended the process (a predicate true on the fill value of
#: a huge dataset holding a few blocks)
ANSWER_FRACTION = 0.5


def answer_limit() -> int:
    """Bytes an exact answer may take: :data:`ANSWER_FRACTION` of the memory this process may
    use (physical memory, or its job's control group limit where smaller:
    :func:`lamina.machine.usable_memory`; 1 TiB where neither can be asked)."""
    mem = usable_memory()
    return int((2 << 40 if mem is None else mem) * ANSWER_FRACTION)


def _too_large(what: str, n: int, per: int) -> MemoryError:
    return MemoryError(
        f"query {what}: the exact answer holds {n} elements at least, "
        f"{fmt_bytes(n * per)} as coordinates and selected values, more than "
        f"{fmt_bytes(answer_limit())} (half the memory this process may use); ask exact=False for the "
        "blocks that may match, or a smaller region"
    )


def query(
    f,
    where: str | Expr,
    select: str | Iterable[str] | None = (),
    region=None,
    step: int | None = None,
    exact: bool = True,
    level: int = 0,
) -> QueryResult:
    """Independent: ``f.query(where, ...)`` for a lamina File or a view of one step (``f.at(k)``)."""
    method = getattr(f, "query", None)
    if method is None:
        raise TypeError(f"a query needs a lamina File or step view, not {type(f).__name__}")
    return method(where, select=select, region=region, step=step, exact=exact, level=level)


def run(
    engine,
    filename: str,
    where: str | Expr,
    select: str | Iterable[str] | None = (),
    region=None,
    step: int | None = None,
    exact: bool = True,
    level: int = 0,
) -> QueryResult:
    """Independent: the elements of the datasets of an open file where predicate *where* holds.

    Parameters
    ----------
    engine
        The file's engine stack (:attr:`lamina.File.engine`); *filename*
        names the file in messages.
    where
        A predicate in the expression language of :mod:`lamina.derived`,
        e.g. ``"T > 1200 & vmag < 0.3"`` or ``"magnitude(curl(u, v, w)) > 1"``;
        paths with ``/`` in backticks (```grp/T` > 3``).  Primary and derived
        datasets may be named; all must have one shape.
    select
        Dataset paths whose values to return (a vector derived name stands
        for its components).
    region
        The part of the domain to search: a :class:`~lamina.geometry.Box`,
        a numpy-style key (ints, slices, ``...``), a ``(start, stop)`` pair,
        or text such as ``"0:10,:,5:"``.  Default: everything.
    step
        Step to search (default: the last; negative counts from the end).
    exact
        Also compute the exact element answer (default); False stops after
        the candidate blocks.
    level
        The resolution to answer at (multiresolution datasets, docs/multires.md):
        0 (default) is full resolution; at level ``k`` every dataset named
        must be a multiresolution dataset with that level, the region and the
        coordinates are in level-``k`` coordinates, the values are those
        ``ds.level(k)`` reads, and only the bands of level ``k`` and coarser
        are read.

    Returns
    -------
    QueryResult
        Candidate boxes (from block statistics: never misses a match),
        optionally the exact mask, coordinates and selected values, and the
        blocks and bytes each answer read.

    Raises
    ------
    ExpressionError
        A malformed predicate, not a predicate, an unknown dataset (with
        close names suggested), a stencil the shape does not allow.
    NotFoundError
        An unknown dataset in *select*.
    ShapeError
        Datasets of different shapes.
    StepError, BoundsError, SelectionError
        A step that does not exist, a region outside the domain, a level a
        dataset does not have (or a derived quantity at a level above 0).
    """
    t0 = time.perf_counter()
    src = Source(engine, filename, step, level)
    text, pred = _predicate(where)
    available = src.available()
    check_inputs(pred, available, text)
    refs = list(dict.fromkeys(r.path for r in pred.refs()))
    sel = _select(select, src, available)
    shape = _shape(src, refs + [p for p in sel if p not in refs], text)
    check_stencils(pred, shape, text)
    names = ", ".join(repr(p) for p in dict.fromkeys(refs + sel))
    box, keyed = _region(region, shape, f"the query domain (shape {shape} of {names})")
    grid, units, rows = _units(src, refs, box)

    result = QueryResult(
        where=text,
        step=src.step,
        level=src.level,
        region=box,
        grid=grid,
        select=tuple(sel),
        unit_boxes=units,
        candidates=[],
        certain=[],
        candidate_values=[],
        mask_shape=keyed,
    )
    cache = _block_answer(src, pred, refs, (grid, units, rows), sel, exact, result)
    if src.elements_read and units:
        # what the block answer costs besides its reads (statistics, ranges, judging, cutting
        # values out of runs): a sample of the measured history, per element read and per unit
        engine.note_query(
            src.elements_read,
            box.size / len(units),
            time.perf_counter() - t0 - src.read_seconds,
            refs,
        )
    if exact:
        _exact_answer(src, pred, shape, cache, result)
    return result


#: units judged together by the hull of their ranges, split this many ways when undecided
FANOUT = 16
#: fewest units (with statistics) judged in groups; fewer are judged one by one
GROUP_MIN = 2 * FANOUT


def _block_answer(
    src: Source, pred: Expr, refs, layout, sel, exact: bool, result: QueryResult
) -> dict:
    """Prune the units of *layout* (grid, units, rows) with statistics; read the selected values
    over the candidates.

    Returns the values read to find exact ranges that the exact phase may reuse.
    """
    t0, b0 = time.perf_counter(), src.bytes_read
    src.touched = set()
    cache: dict[tuple[str, Box], np.ndarray] = {}
    cached = 0
    grid, units, rows = layout
    n = len(units)
    # the bounds follow the dtypes' own arithmetic (wrapping integers, float16 and float32
    # rounding, literals cast to the data's dtype): pruning and "certain" are proven
    bounds = Bounds(pred, {p: src.info(p).dtype for p in refs})
    per_ref = {p: src.unit_ranges(p, units, src.unit_rows(p, grid, rows, n)) for p in refs}
    decided = _decide(bounds, refs, per_ref, n)
    # the units judged here one by one, as boxes: those that may need a read (a dataset without
    # statistics there), or all of a few units; the others were judged as columns, and become
    # boxes only if they are candidates
    rest = np.flatnonzero(~decided[0])
    found: list[int] = []
    found_certain: list[bool] = []
    made: dict[int, Box] = {}
    # consecutive undecided units that read the same datasets and together make a box of at
    # most PART_ELEMENTS elements (a run) are read at once: one read per run, not one per unit,
    # so that the cost of a read does not grow with the number of blocks
    pending: list[tuple[int, Box, dict]] = []
    unknown_of_pending: list[str] = []
    run: Box | None = None

    def judge(k: int, u: Box, can: bool, can_fail: bool, arrays: dict) -> list[str]:
        """Take unit *k* (box *u*) as a candidate or not; the datasets whose *arrays* are kept."""
        nonlocal cached
        kept = []
        if can:
            found.append(k)
            found_certain.append(not can_fail)
            made[k] = u
            for p, a in arrays.items():
                if (p in sel or (exact and can_fail)) and cached + a.nbytes <= CACHE_BYTES:
                    cache[(p, u)] = a
                    cached += a.nbytes
                    kept.append(p)
        return kept

    def flush() -> None:
        """Read the pending run once per dataset; judge its units in order."""
        nonlocal run
        if run is None:
            return
        values = {p: src.read(p, run) for p in unknown_of_pending}
        kept: dict[str, list[Box]] = {p: [] for p in values}
        for k, u, ranges in pending:
            arrays = {p: _part(v, u, run) for p, v in values.items()}
            for p, a in arrays.items():
                ranges[p] = exact_range(a)
            for p in judge(k, u, *bounds.truth(ranges), arrays):
                kept[p].append(u)
        for p, us in kept.items():
            if len(us) < len(pending):  # views would keep all of the run's values alive
                for u in us:
                    a = cache[(p, u)]
                    if a.base is not None:
                        cache[(p, u)] = a.copy()
        pending.clear()
        run = None

    last = -1
    for k in rest.tolist():
        if k != last + 1:  # a unit judged by its statistics lies between: the run ends there
            flush()
        last = k
        u = units[k]
        ranges = {}
        unknown = []
        for p in refs:
            r = per_ref[p].at(k)
            if r is None:
                unknown.append(p)
                r = FULL
            ranges[p] = r
        can, can_fail = bounds.truth(ranges)
        if unknown and can and can_fail:  # undecided: read what has no statistics
            if u.size <= PART_ELEMENTS:
                joined = (
                    _join(run, u) if run is not None and unknown == unknown_of_pending else None
                )
                if joined is None or joined.size > PART_ELEMENTS:
                    flush()
                    joined = u
                pending.append((k, u, ranges))
                unknown_of_pending = unknown
                run = joined
                continue
            for p in unknown:  # a large unit: part by part, not kept
                ranges[p] = _range_by_parts(src, p, u)
            can, can_fail = bounds.truth(ranges)
        flush()
        judge(k, u, can, can_fail, {})
    flush()
    # the candidates in the order of the units: those judged as columns, made boxes now, with
    # those judged one by one
    judged, can_be, can_fail_be = decided
    by_stats = np.flatnonzero(judged & can_be)
    ks = np.concatenate((by_stats, np.asarray(found, dtype=np.int64)))
    sure = np.concatenate((~can_fail_be[by_stats], np.asarray(found_certain, dtype=bool)))
    order = np.argsort(ks, kind="stable")
    ks, sure = ks[order], sure[order]
    boxes = units.boxes(ks)
    for i, k in enumerate(ks.tolist()):
        if k in made:  # the box its cached values are keyed by
            boxes[i] = made[k]
    result.candidates.extend(boxes)
    result.certain.extend(sure.tolist())
    cands = result.candidates
    got: list[dict[str, np.ndarray]] = [{} for _ in cands]
    for _, group in _runs(cands) if sel else ():
        for p in sel:  # the components of a vector one after the other: computed once per run
            todo = []
            for i in group:
                kept = cache.get((p, cands[i]))
                if kept is not None:
                    got[i][p] = kept
                else:
                    todo.append(i)
            for box, idx in _runs([cands[i] for i in todo]):
                a = src.read(p, box)
                for j in idx:
                    got[todo[j]][p] = _part(a, cands[todo[j]], box)
    result.candidate_values.extend(got)
    result.candidate_blocks_read = len(src.touched)
    result.candidate_bytes_read = src.bytes_read - b0
    result.candidate_seconds = time.perf_counter() - t0
    return cache


def _join(run: Box, u: Box) -> Box | None:
    """The box *run* and *u* make together, or None if they do not make one (they never overlap)."""
    start = tuple(map(min, run.start, u.start))
    stop = tuple(map(max, run.stop, u.stop))
    joined = Box(start, stop)
    return joined if joined.size == run.size + u.size else None


def _runs(boxes: Sequence[Box], limit: int = PART_ELEMENTS) -> list[tuple[Box, list[int]]]:
    """Consecutive *boxes* grouped into runs that make a box of at most *limit* elements (a
    larger box is a run of its own): ``[(run, indices of its boxes)]``, in order."""
    out: list[tuple[Box, list[int]]] = []
    for i, b in enumerate(boxes):
        if out:
            joined = _join(out[-1][0], b)
            if joined is not None and joined.size <= limit:
                out[-1][1].append(i)
                out[-1] = (joined, out[-1][1])
                continue
        out.append((b, [i]))
    return out


def _part(values: np.ndarray, u: Box, run: Box) -> np.ndarray:
    """The values of unit *u* out of *values*, read over the *run* of units it is in: *values*
    itself for a run of one unit, else a view of them, or a copy where the view would not be
    contiguous."""
    if u == run:
        return values
    v = values[u.within(run)]
    return v if v.flags.c_contiguous else v.copy()


def _decide(
    bounds: Bounds, refs, per_ref: dict[str, Ranges], n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(decided, can, can_fail)``, boolean arrays over the *n* units: the units judged by
    their statistics alone, in groups, and the verdict of each.

    A group of units is judged by the hull of its units' ranges: when the
    predicate cannot hold anywhere in the hull, it holds in none of them
    (and likewise when it cannot fail), since each unit's values lie in the
    hull.  Undecided groups split :data:`FANOUT` ways down to single units,
    which get exactly the verdict of their own ranges.  Units are ordered
    by their ranges first, so that alike units share groups: a query that
    matches few of many blocks judges tens of groups, not every block.

    Units whose inputs all have statistics are decided so.  Units where some
    input has none (only reading tells its range: any value meanwhile) are
    decided only where the others prove that the predicate cannot hold, the
    verdict that needs no read; the rest is left to be judged one by one.
    """
    decided = np.zeros(n, dtype=bool)
    can_be = np.zeros(n, dtype=bool)
    can_fail_be = np.zeros(n, dtype=bool)
    known = np.ones(n, dtype=bool)
    some = np.zeros(n, dtype=bool)
    for p in refs:
        known &= per_ref[p].known
        some |= per_ref[p].known
    verdicts = (decided, can_be, can_fail_be)
    _judge_groups(bounds, refs, per_ref, np.flatnonzero(known), True, verdicts)
    _judge_groups(bounds, refs, per_ref, np.flatnonzero(some & ~known), False, verdicts)
    return verdicts


def _judge_groups(
    bounds: Bounds,
    refs,
    per_ref: dict[str, Ranges],
    index: np.ndarray,
    whole: bool,
    verdicts: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """:func:`_decide` over the units at *index*: with *whole*, every unit (their inputs all
    have statistics); else only those proven not to match (unknown ranges taken as any value)."""
    if len(index) < max(GROUP_MIN, 2):
        return  # few units: one by one
    decided, can_be, can_fail_be = verdicts
    cols = {}
    for p in refs:
        r = per_ref[p]
        lo, hi, nan = r.lo[index], r.hi[index], r.nan[index]
        if not whole:  # no statistics: any value, NaN too (FULL); lo, hi are copies
            unknown = ~r.known[index]
            lo[unknown], hi[unknown], nan = -INF, INF, nan | unknown
        if lo.dtype == object and not any(isinstance(v, int) for v in lo.tolist()):
            lo, hi = lo.astype(np.float64), hi.astype(np.float64)  # no Python int bound: floats
        cols[p] = (lo, hi, nan)
    # ordered by the first dataset's ranges (when pruning, the first with statistics there)
    first = refs[0] if whole else next(p for p in refs if per_ref[p].known[index].any())
    lo0, hi0, _ = cols[first]
    order = np.lexsort((lo0.astype(np.float64), hi0.astype(np.float64)))
    index = index[order]
    cols = {p: (lo[order], hi[order], nan[order]) for p, (lo, hi, nan) in cols.items()}
    stack = [(0, len(index))]
    while stack:
        a, b = stack.pop()
        if b - a == 1:
            k = int(index[a])
            ranges = {p: per_ref[p].at(k) for p in refs}
            can, can_fail = bounds.truth({p: FULL if r is None else r for p, r in ranges.items()})
            if whole or not can:
                decided[k], can_be[k], can_fail_be[k] = True, can, can_fail
            continue
        hull = {
            p: Interval(lo[a:b].min(), hi[a:b].max(), bool(nan[a:b].any()))
            for p, (lo, hi, nan) in cols.items()
        }
        can, can_fail = bounds.truth(hull)
        if (can and can_fail) or (can and not whole):
            step = -(-(b - a) // FANOUT)
            stack.extend((c, min(c + step, b)) for c in range(a, b, step))
            continue
        group = index[a:b]
        decided[group] = True
        can_be[group] = can
        can_fail_be[group] = can_fail


def _exact_answer(src: Source, pred: Expr, shape, cache: dict, result: QueryResult) -> None:
    """Evaluate the predicate over the candidates that need it: coordinates and values.

    Unit by unit, and a large unit part by part (:data:`PART_ELEMENTS`), so that memory holds
    one part's inputs and result and the matches found so far: never an array of the whole
    region (``result.mask`` is made from the coordinates only when asked for).
    """
    t1, b1 = time.perf_counter(), src.bytes_read
    src.touched = set()
    box, sel = result.region, result.select
    per = 8 * box.ndim + sum(src.info(p).dtype.itemsize for p in sel)  # bytes an element
    limit = answer_limit() // max(per, 1)
    sure = sum(u.size for u, s in zip(result.candidates, result.certain, strict=True) if s)
    if sure > limit:  # matches known whole (their statistics say so), counted before any
        raise _too_large(repr(result.where), sure, per)
    total = 0
    found: list[np.ndarray] = []
    picked: dict[str, list[np.ndarray]] = {p: [] for p in sel}
    for u, sure, got in zip(
        result.candidates, result.certain, result.candidate_values, strict=True
    ):
        # values already read over the whole unit (for its exact range, or selected)
        kept = {p: cache.pop((p, u), None) for p in pred.inputs}
        for p in pred.inputs:
            if kept[p] is None and p in got:
                kept[p] = got[p]
        for part in chunks(u, PART_ELEMENTS):
            local = None if sure else _evaluate_part(src, pred, shape, u, part, kept)
            total += part.size if local is None else int(np.count_nonzero(local))
            if total > limit:
                raise _too_large(repr(result.where), total, per)
            found.append(_coords(part, local))
            rel = part.relative_to(u)
            for p in sel:
                v = got[p][rel]
                picked[p].append(v.reshape(-1) if local is None else v[local])
    ndim = box.ndim
    coords = np.concatenate(found) if found else np.zeros((0, ndim), dtype=np.int64)
    order = None
    if ndim and coords.shape[0] > 1 and len(found) > 1:
        # C order over the region (units may interleave; each part's coordinates are in order)
        lin = np.ravel_multi_index(tuple((coords - np.asarray(box.start)).T), box.shape)
        if not bool(np.all(lin[1:] > lin[:-1])):
            order = np.argsort(lin, kind="stable")
            coords = coords[order]
    values: dict[str, np.ndarray] = {}
    for p in sel:
        parts = picked[p]
        v = np.concatenate(parts) if parts else np.zeros(0, dtype=src.info(p).dtype)
        values[p] = v[order] if order is not None else v
    result.exact = True
    result.coords = coords
    result.values = values
    result.count = int(coords.shape[0])
    result.exact_blocks_read = len(src.touched)
    result.exact_bytes_read = src.bytes_read - b1
    result.exact_seconds = time.perf_counter() - t1


def _evaluate_part(src: Source, pred: Expr, shape, unit: Box, part: Box, kept: dict) -> np.ndarray:
    """The predicate over *part* of *unit*: inputs from *kept* (values over the unit) or read."""
    need = needed_boxes(pred, part, shape)
    arrays = {}
    for p in sorted(pred.inputs):
        b = need[p]
        a = kept.get(p)
        arrays[p] = a[b.relative_to(unit)] if a is not None and unit.contains(b) else src.read(p, b)
    origin = {p: need[p].start for p in arrays}
    local = evaluate(pred, arrays, region=part, global_shape=shape, origin=origin)[0]
    return np.asarray(local, dtype=bool)


def _coords(part: Box, local: np.ndarray | None) -> np.ndarray:
    """Global indices (n x ndim, C order) of the elements of *part* where *local* is True (all
    of them for None)."""
    ndim = part.ndim
    if ndim == 0:  # a 0-D domain: one element
        n = 1 if local is None or bool(local) else 0
        return np.zeros((n, 0), dtype=np.int64)
    if local is None:
        idx = np.indices(part.shape, dtype=np.int64).reshape(ndim, -1).T
    else:
        idx = np.argwhere(local).astype(np.int64, copy=False)
    idx += np.asarray(part.start, dtype=np.int64)
    return idx


def _range_by_parts(src: Source, path: str, unit: Box) -> Interval:
    """The exact range of *path* over a large *unit*, read part by part (nothing kept)."""
    lo, hi, nan = INF, -INF, False
    for part in chunks(unit, PART_ELEMENTS):
        r = exact_range(src.read(path, part))
        lo, hi, nan = min(lo, r.lo), max(hi, r.hi), nan or r.nan
    return Interval(lo, hi, nan)


# ---------------------------------------------------------------------------
# checking the question


def _predicate(where) -> tuple[str, Expr]:
    if isinstance(where, Expr):
        text = where.source if where.source is not None else str(where)
        check(where, "predicate", text)
        pred = where
    elif isinstance(where, str):
        text = where
        pred = parse(where, mode="predicate")
    else:
        raise ExpressionError(
            f"a query condition is text such as 'T > 1200', not {type(where).__name__}"
        )

    def norm(path: str) -> str:
        try:
            return normpath(path)
        except (ValueError, TypeError):
            return path  # check_inputs reports it as unknown

    if any(norm(r.path) != r.path for r in pred.refs()):
        pred = pred.map_refs(norm)
    return text, pred


def _select(select, src: Source, available: set[str]) -> list[str]:
    if select is None:
        select = ()
    elif isinstance(select, str):
        select = [select]
    out: list[str] = []
    defs = None
    for name in select:
        if not isinstance(name, str):
            raise NotFoundError(f"select names datasets by path, got {name!r}")
        try:
            path = normpath(name)
        except ValueError as e:
            raise NotFoundError(f"select: {e}") from None
        if path in available:
            out.append(path)
            continue
        defs = src.definitions() if defs is None else defs
        if path in defs:  # a vector: its components
            out.extend(defs[path].components)
            continue
        if src.eng.catalog.kind_of(path) == "group":
            raise NotFoundError(f"select: {name!r} is a group, not a dataset")
        raise NotFoundError(f"select: unknown dataset {name!r}.{suggest(path, available)}")
    return list(dict.fromkeys(out))


def _shape(src: Source, paths: Sequence[str], text: str) -> tuple[int, ...]:
    if not paths:
        raise ExpressionError(
            "the condition names no dataset and nothing is selected, so the query has no domain",
            None,
            text,
        )
    first = paths[0]
    shape = src.info(first).shape
    for p in paths[1:]:
        s = src.info(p).shape
        if s != shape:
            raise ShapeError(
                f"datasets of different shapes in the query: {p!r} has shape {s} but {first!r} "
                f"has shape {shape} (a query compares datasets element by element)"
            )
    return shape


def _region(region, shape: tuple[int, ...], what: str) -> tuple[Box, tuple[int, ...] | None]:
    """The box of *region* and, for a numpy-style key with integer indices, the shape numpy
    gives that key (the axes they index dropped: the shape of ``r.mask``); else None."""
    if region is None:
        return Box.from_shape(shape), None
    if isinstance(region, str):
        region = selection_mod.parse_text(region)
    if isinstance(region, Box):
        if region.ndim != len(shape):
            raise BoundsError(
                f"region {region} has {region.ndim} dimensions but {what} has {len(shape)}"
            )
        region.check_inside(shape, what)
        return region, None
    if (
        isinstance(region, tuple | list)
        and len(region) == 2
        and all(isinstance(x, tuple | list) for x in region)
        and all(isinstance(v, numbers.Integral) for x in region for v in x)
    ):
        return _region(Box(tuple(map(int, region[0])), tuple(map(int, region[1]))), shape, what)
    if isinstance(region, list):  # (numpy: an index array, rows 1 and 2 for [1, 2], no box)
        raise SelectionError(
            f"{what}: a query region is a box: a list {region!r} indexes numpy's way (an "
            "index array); give slices, a Box, (start, stop) or text such as '0:10,:'"
        )
    sel = selection_mod.parse(region, shape, what)
    if sel.strided:
        raise SelectionError(f"{what}: a query region takes slices of step 1")
    return sel.box, (sel.result_shape if sel.squeeze else None)


# ---------------------------------------------------------------------------
# units


def _units(
    src: Source, refs: Sequence[str], region: Box
) -> tuple[str | None, Units, np.ndarray | None]:
    """The grid dataset, the units (its blocks in the region, then the rest of the region, in
    order of their starts) and, per unit, the grid's block it lies in (-1: none; None when the
    grid is the coverage of a derived quantity without blocks).

    Made as columns of the grid's block table (corners clipped to the region, the holes
    between them, :func:`numpy.lexsort` for the order): a step of many blocks costs no Python
    object per block here.
    """
    nd = region.ndim
    for p in refs:
        t = src.table(p)
        if t.n:
            break
    else:
        for p in refs:  # derived without blocks: the blocks they follow
            starts, stops = src.coverage(p)
            if len(starts):
                if region.empty:
                    return p, Units.of([], nd), None
                lo, hi, _ = _clip(starts, stops, region)
                return p, _with_holes(region, lo, hi)[0], None
        return None, Units.of([region] if not region.empty else [], nd), None
    if region.empty:
        return p, Units.of([], nd), np.zeros(0, dtype=np.int64)
    lo, hi, rows = _clip(t.starts, t.stops, region)
    units, order = _with_holes(region, lo, hi)
    rows = np.concatenate((rows, np.full(len(units) - len(rows), -1, dtype=np.int64)))
    return p, units, rows[order]


def _clip(
    starts: np.ndarray, stops: np.ndarray, region: Box
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The boxes ``[starts, stops)`` cut to *region*: the corners of those that meet it, and
    their rows."""
    lo = np.maximum(starts, np.asarray(region.start, dtype=np.int64))
    hi = np.minimum(stops, np.asarray(region.stop, dtype=np.int64))
    rows = np.flatnonzero(rows_less(lo, hi))
    return lo[rows], hi[rows], rows


def _with_holes(region: Box, lo: np.ndarray, hi: np.ndarray) -> tuple[Units, np.ndarray]:
    """The units of the boxes ``[lo, hi)`` in *region* and the parts of *region* outside them,
    in order of their starts, and that order (indices into the boxes, then the parts).

    The boxes are blocks of one step, which never overlap: when their sizes add up to the
    region's, there are no parts outside them to look for.
    """
    if int(rows_prod(hi - lo).sum()) < region.size:
        s, e = _subtract(region, lo, hi)
        lo, hi = np.concatenate((lo, s)), np.concatenate((hi, e))
    order = start_order(lo)
    return Units(lo[order], hi[order]), order


def subtract(box: Box, holes: Iterable[Box]) -> list[Box]:
    """Disjoint boxes covering the part of *box* outside every hole (holes may overlap).

    The box is cut in two at a median hole boundary, again and again, until each part
    meets at most one hole, which leaves at most two slabs a dimension: about
    ``n log n`` work for *n* holes.  (Each hole taken from every piece left so far cost
    a scan of all the pieces a hole: a query over 8,000 blocks with holes between them
    took 82 s.)
    """
    hs = list(holes)
    if box.empty:
        return []
    if not hs:
        return [box]
    units = Units.of(hs, box.ndim)
    return Units(*_subtract(box, units.starts, units.stops)).boxes()


def _subtract(box: Box, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`subtract` of the holes ``[starts, stops)`` (``(n, ndim)`` corners) from a
    non-empty *box*, as the corners of the parts left."""
    lo0 = np.asarray(box.start, dtype=np.int64)
    hi0 = np.asarray(box.stop, dtype=np.int64)
    s = np.maximum(starts, lo0)
    e = np.minimum(stops, hi0)
    keep = rows_less(s, e)
    out: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    _cut_out(lo0, hi0, s[keep], e[keep], out)
    n, nd = len(out), box.ndim
    return (
        np.array([a for a, _ in out], dtype=np.int64).reshape(n, nd),
        np.array([b for _, b in out], dtype=np.int64).reshape(n, nd),
    )


def _cut_out(
    lo: np.ndarray,
    hi: np.ndarray,
    s: np.ndarray,
    e: np.ndarray,
    out: list[tuple[tuple[int, ...], tuple[int, ...]]],
) -> None:
    """:func:`subtract` of the holes ``[s, e)`` (clipped to the box, non-empty) from the box
    ``[lo, hi)``, into *out* as ``(start, stop)`` pairs."""
    n = len(s)
    if n == 0:
        out.append((tuple(lo.tolist()), tuple(hi.tolist())))
        return
    if n == 1:  # the box less one hole: slabs before and after it, a dimension at a time
        start, stop = lo.tolist(), hi.tolist()
        a, b = s[0].tolist(), e[0].tolist()
        for d in range(len(start)):
            if start[d] < a[d]:
                top = list(stop)
                top[d] = a[d]
                out.append((tuple(start), tuple(top)))
            if b[d] < stop[d]:
                bottom = list(start)
                bottom[d] = b[d]
                out.append((tuple(bottom), tuple(stop)))
            start[d], stop[d] = a[d], b[d]
        return
    # the dimension with the most hole boundaries strictly inside the box, cut at their median
    best, at = -1, 0
    for d in range(len(lo)):
        edges = np.concatenate((s[:, d], e[:, d]))
        inside = np.unique(edges[(edges > lo[d]) & (edges < hi[d])])
        if len(inside) > best:
            best, at = len(inside), d
            cut = int(inside[len(inside) // 2]) if len(inside) else 0
    if best <= 0:
        return  # every hole spans the whole box (a 0-D box too): nothing of it is left
    left = s[:, at] < cut
    right = e[:, at] > cut
    hi_l, lo_r = hi.copy(), lo.copy()
    hi_l[at] = lo_r[at] = cut
    e_l = e[left].copy()
    e_l[:, at] = np.minimum(e_l[:, at], cut)
    s_r = s[right].copy()
    s_r[:, at] = np.maximum(s_r[:, at], cut)
    _cut_out(lo, hi_l, s[left], e_l, out)
    _cut_out(lo_r, hi, s_r, e[right], out)
