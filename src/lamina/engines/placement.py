"""Putting many blocks of values into an output array: one copy per group of blocks where
numpy can do it, instead of a slice assignment per block (a few microseconds each).

Blocks of one shape that tile a box of the output are placed through a view of that box
split into cells (:func:`grid_plan_for`, :func:`grid_view`); small blocks of one shape that
do not, with one scatter of an index per element (:data:`SCATTER_ELEMENTS`).  The native
engine's reads plan with these (and keep the plans); the in situ consumer places the pieces
a producer rank sent packed in one message with :func:`place_pieces`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..geometry import cols_max, cols_min

#: blocks of at most this many elements, of one shape, go into place with one scatter per piece
#: (an index per element); larger ones a copy each (16^3 blocks scattered: 1.4-1.7x the copies)
SCATTER_ELEMENTS = 512


class GridPlan(NamedTuple):
    """How blocks of one shape tile a box of the output without gaps (:func:`grid_plan_for`),
    apart from the output array (:func:`grid_view` makes the view into one)."""

    cells: np.ndarray  # (n, ndim): each block's cell, blocks in their order
    order: np.ndarray | None  # the blocks in C order of their cells; None when they come so
    slices: tuple[slice, ...]  # the box of the output
    split: list[int]  # the box's shape as (cells, block) pairs, axis by axis


#: the last plan found, with its key: a reader of one region step after step meets the
#: same blocks at the same corners every step (kept whole, so threads see a key and its plan)
_last_plan: tuple[tuple, GridPlan | None] | None = None


def grid_plan_for(out: np.ndarray, corner: np.ndarray, shape) -> GridPlan | None:
    """How blocks of one *shape* (block k at ``corner[k]`` of *out*) tile a box of *out*,
    or None when they do not (a hole, a cell twice, off the grid's phase, out of bounds):
    the same for any output of *out*'s shape and strides."""
    global _last_plan
    n = len(corner)
    shape = np.asarray(shape, dtype=np.int64)
    if n < 2 or out.ndim == 0 or bool(np.any(shape <= 0)):
        return None
    key = (corner.dtype.str, corner.shape, corner.tobytes(), shape.tobytes(), out.shape)
    last = _last_plan
    if last is not None and last[0] == key:
        plan = last[1]
    else:
        plan = _search(corner, shape, out.shape)
        _last_plan = (key, plan)
    if plan is None:
        return None
    if not np.may_share_memory(grid_view(out, plan), out):
        return None  # splitting axes is a view for any strides; be sure
    return plan


def grid_view(out: np.ndarray, plan: GridPlan) -> np.ndarray:
    """The box of *out* that *plan* found, split as (cells along each axis..., block shape...)."""
    nd = out.ndim
    view = out[plan.slices].reshape(plan.split)
    return view.transpose([*range(0, 2 * nd, 2), *range(1, 2 * nd, 2)])


def _search(corner: np.ndarray, shape: np.ndarray, out_shape: tuple) -> GridPlan | None:
    """:func:`grid_plan_for`'s search, for an output of *out_shape* (its cells are read-only)."""
    n = len(corner)
    cell, phase = np.divmod(corner, shape)
    if bool(np.any(phase != phase[0])):
        return None
    low = cols_min(cell)
    extent = cols_max(cell) - low + 1
    if int(np.prod(extent)) != n:
        return None
    cell -= low
    lin = np.ravel_multi_index(tuple(cell.T), tuple(int(v) for v in extent))
    in_order = bool(np.array_equal(lin, np.arange(n)))
    order = None
    if not in_order:
        order = np.argsort(lin, kind="stable")
        if not bool(np.array_equal(lin[order], np.arange(n))):
            return None  # a cell twice (overlapping blocks): not a tiling
        order.flags.writeable = False
    start = phase[0] + low * shape
    stop = start + extent * shape
    if bool(np.any(stop > np.asarray(out_shape))):
        return None
    cell.flags.writeable = False
    box = tuple(slice(int(a), int(b)) for a, b in zip(start, stop, strict=True))
    split = [int(v) for pair in zip(extent, shape, strict=True) for v in pair]
    return GridPlan(cell, order, box, split)


#: fewer pieces of one shape than this are put in place one by one
GROUP_MIN = 4
#: pieces of whole rows go a copy per stretch of them where a stretch holds this many on average
RUNS_PER_GROUP = 8
#: outputs of more dimensions take their pieces one by one (a shape is grouped by one int64
#: key below the product of (extent + 1) over the axes: at most 2^ndim times the output's
#: elements, within int64 for any output that fits in memory up to this many dimensions)
GROUP_NDIM_MAX = 16


def place_pieces(values: np.ndarray, at: np.ndarray, shapes: np.ndarray, out: np.ndarray) -> None:
    """Boxes of *shapes* (rows), their values one after another in *values* (1-D, C order
    within each box), into *out* at the corners *at* (rows, relative to *out*, in bounds).

    Pieces of whole rows of a C-contiguous *out* (every axis but the first whole) are
    stretches of its memory: those that follow each other there are copied together.
    Otherwise pieces of one shape go together: those that tile a box of *out* through its
    grid view, small ones through one scatter (C-contiguous *out*), the rest (and shapes of
    fewer than :data:`GROUP_MIN` pieces) one by one.  The pieces do not overlap (parts of the
    blocks of one step, which never do): the result is that of a slice assignment per piece."""
    n = len(at)
    if not n:
        return
    if type(out) is not np.ndarray:  # a subclass (np.matrix) reshapes its own way
        out = out.view(np.ndarray)
    sizes = np.prod(shapes, axis=1, dtype=np.int64)
    ends = np.cumsum(sizes)
    if n < GROUP_MIN or out.ndim == 0 or out.ndim > GROUP_NDIM_MAX:
        _one_by_one(values, at, shapes, ends, range(n), out)
        return
    if out.flags.c_contiguous and bool((shapes[:, 1:] == out.shape[1:]).all()):
        # whole rows: stretches of out's memory; those that follow each other, one copy
        dest = at[:, 0] * math.prod(out.shape[1:])
        cut = np.flatnonzero(dest[1:] != dest[:-1] + sizes[:-1]) + 1
        if len(cut) * RUNS_PER_GROUP < n:
            _runs(values, dest, cut, sizes, ends, out.reshape(-1))
            return
    groups, rest = _by_shape(shapes, out.shape)
    for sel in groups:
        kind = shapes[int(sel[0])].tolist()
        m = math.prod(kind)
        if m == 0:
            continue  # pieces of no element: nothing to place
        if len(sel) == n:
            vals = values[: n * m].reshape(n, *kind)
        else:
            first = ends[sel] - m
            vals = values[first[:, None] + np.arange(m)].reshape(len(sel), *kind)
        corner = at[sel]
        grid = grid_plan_for(out, corner, kind)
        if grid is not None:  # the blocks in C order of their cells, then one copy
            view = grid_view(out, grid)
            view[...] = (vals if grid.order is None else vals[grid.order]).reshape(view.shape)
        elif m <= SCATTER_ELEMENTS and out.flags.c_contiguous:
            strides = np.asarray(out.strides, dtype=np.int64) // out.itemsize
            cells = np.indices(tuple(kind)).reshape(len(kind), -1)
            within = (cells.T @ strides).astype(np.int64)
            flat = out.reshape(-1)
            flat[((corner @ strides)[:, None] + within[None, :]).reshape(-1)] = vals.reshape(-1)
        else:
            rest.append(sel)
    if rest:
        _one_by_one(values, at, shapes, ends, np.sort(np.concatenate(rest)).tolist(), out)


def _by_shape(shapes: np.ndarray, out_shape: tuple) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The pieces (rows of *shapes*, each within *out_shape*) by shape: the groups of at least
    :data:`GROUP_MIN` pieces, and the pieces of the other shapes (none or one array)."""
    n = len(shapes)
    if bool((shapes == shapes[0]).all()):
        return [np.arange(n)], []
    # a shape as one integer (np.unique of rows sorts them as bytes: 30x slower): each extent
    # at most the output's, so the key is exact (GROUP_NDIM_MAX)
    mult = np.cumprod([1, *(v + 1 for v in out_shape[:0:-1])], dtype=np.int64)[::-1]
    keys = shapes @ mult
    order = np.argsort(keys, kind="stable")
    bounds = np.flatnonzero(keys[order][1:] != keys[order][:-1]) + 1
    first = np.concatenate(([0], bounds))
    last = np.concatenate((bounds, [n]))
    big = last - first >= GROUP_MIN
    groups = [order[a:b] for a, b in zip(first[big].tolist(), last[big].tolist(), strict=True)]
    few = order[np.repeat(~big, last - first)]
    return groups, [few] if len(few) else []


def _runs(values, dest, cut, sizes, ends, flat) -> None:
    """Pieces at *dest* of *flat* (elements), cut into stretches that follow each other there as
    in *values* where *cut* says: one copy a stretch."""
    firsts, lasts = [0, *cut.tolist()], [*cut.tolist(), len(dest)]
    dest_l, ends_l, sizes_l = dest.tolist(), ends.tolist(), sizes.tolist()
    for a, b in zip(firsts, lasts, strict=True):
        src = ends_l[a] - sizes_l[a]
        length = ends_l[b - 1] - src
        flat[dest_l[a] : dest_l[a] + length] = values[src : src + length]


def _one_by_one(values, at, shapes, ends, rows, out) -> None:
    at_l, shapes_l, ends_l = at.tolist(), shapes.tolist(), ends.tolist()
    for k in rows:
        corner, shape = at_l[k], shapes_l[k]
        n = math.prod(shape)
        e = ends_l[k]
        out[tuple(slice(c, c + s) for c, s in zip(corner, shape, strict=True))] = values[
            e - n : e
        ].reshape(shape)
