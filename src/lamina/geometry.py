"""N-D boxes and decompositions.  Pure: no MPI, no files.

A :class:`Box` is a half-open region ``[start, stop)`` in every dimension, the
unit in which ranks write and read.  Decompositions split a global shape into
boxes for a number of ranks; :func:`dims_create` factors a rank count into
near-equal factors per dimension (like ``MPI_Dims_create``) and is the
"common decomposition" later layers agree on.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import Any

import numpy as np

from .errors import BoundsError, OverlapError, ShapeError


@dataclass(frozen=True, slots=True)
class Box:
    """Half-open N-D box ``[start, stop)``; immutable and hashable."""

    start: tuple[int, ...]
    stop: tuple[int, ...]

    def __post_init__(self) -> None:
        start, stop = self.start, self.stop
        if (
            type(start) is not tuple
            or type(stop) is not tuple
            or not _INT.issuperset(map(type, start + stop))
        ):
            # numpy arrays or integers, lists: as tuples of Python ints (a corner of floats,
            # strings or bools is refused, as corners of writes are); tuples of ints, the
            # boxes lamina makes at every read, pass with this one test
            start, stop = _corner(start, "start"), _corner(stop, "stop")
            object.__setattr__(self, "start", start)
            object.__setattr__(self, "stop", stop)
        if len(start) != len(stop):
            raise ShapeError(f"box start {start} and stop {stop} differ in rank")
        # checked with C-level iteration: boxes are made at every put and read
        if len(start) and (min(start) < 0 or not all(map(operator.le, start, stop))):
            raise BoundsError(f"invalid box {start}..{stop}: need 0 <= start <= stop")

    # -- construction -----------------------------------------------------
    @classmethod
    def from_shape(cls, shape: Sequence[int]) -> Box:
        """The box covering a whole array of *shape* (integers: a float, a string or a bool is
        a TypeError, as in a corner; int() took 1.7 as 1 and '12' as 1 and 2)."""
        stop = _corner(shape, "shape")
        return cls((0,) * len(stop), stop)

    @classmethod
    def from_offset(cls, offset: Sequence[int], shape: Sequence[int]) -> Box:
        """The box of *shape* placed at *offset* (integers, as :meth:`from_shape`)."""
        start, extent = _corner(offset, "offset"), _corner(shape, "shape")
        if len(start) != len(extent):
            raise ShapeError(f"offset {start} and shape {extent} differ in rank")
        return cls(start, tuple(map(operator.add, start, extent)))

    @classmethod
    def from_slices(cls, slices: Sequence[slice], shape: Sequence[int]) -> Box:
        """Box of basic (step 1) slices into an array of *shape*."""
        start, stop = [], []
        for s, n in zip(slices, shape, strict=True):
            a, b, st = s.indices(n)
            if st != 1:
                raise BoundsError(f"slice {s} has step {st}; boxes need step 1")
            start.append(a)
            stop.append(max(a, b))
        return cls(tuple(start), tuple(stop))

    # -- properties -------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.start)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(map(operator.sub, self.stop, self.start))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def empty(self) -> bool:
        return any(map(operator.le, self.stop, self.start))

    @property
    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(a, b) for a, b in zip(self.start, self.stop, strict=True))

    # -- relations --------------------------------------------------------
    def intersect(self, other: Box) -> Box | None:
        """The common part of two boxes, or None if they do not overlap."""
        if self.ndim != other.ndim:
            raise ShapeError(f"cannot intersect a {self.ndim}-D box with a {other.ndim}-D box")
        start = tuple(max(a, b) for a, b in zip(self.start, other.start, strict=True))
        stop = tuple(min(a, b) for a, b in zip(self.stop, other.stop, strict=True))
        if any(b <= a for a, b in zip(start, stop, strict=True)):
            return None
        return Box(start, stop)

    def overlaps(self, other: Box) -> bool:
        return self.intersect(other) is not None

    def contains(self, other: Box) -> bool:
        """True if *other* lies entirely inside this box (ShapeError for another rank)."""
        if len(other.start) != len(self.start):
            raise ShapeError(f"a {self.ndim}-D box cannot contain a {other.ndim}-D box")
        return all(
            a <= c and d <= b
            for a, b, c, d in zip(self.start, self.stop, other.start, other.stop, strict=True)
        )

    def relative_to(self, outer: Box) -> tuple[slice, ...]:
        """Slices that select this box inside an array holding *outer*: BoundsError where
        it leaves *outer* (slices would wrap around or stop short without a word)."""
        out = []
        for a, b, o, p in zip(self.start, self.stop, outer.start, outer.stop, strict=False):
            if a < o or b > p:
                raise BoundsError(f"box {self} is not inside {outer}")
            out.append(slice(a - o, b - o))
        if len(out) != len(self.start) or len(outer.start) != len(self.start):
            raise ShapeError(f"a {self.ndim}-D box is not inside a {outer.ndim}-D box")
        return tuple(out)

    def within(self, outer: Box) -> tuple[slice | EllipsisType, ...]:
        """An index that selects this box inside an array holding *outer* as an array (also when 0-D).

        Like :meth:`relative_to` with a trailing ``...``, so that a 0-D box
        gives a 0-D view to write into rather than a scalar.
        """
        return (*self.relative_to(outer), Ellipsis)

    def shift(self, offset: Sequence[int]) -> Box:
        """This box moved by *offset* (one integer per dimension)."""
        if len(offset) != len(self.start):
            raise ShapeError(
                f"cannot shift a {self.ndim}-D box by {len(offset)} offsets ({tuple(offset)})"
            )
        return Box(
            tuple(a + o for a, o in zip(self.start, offset, strict=True)),
            tuple(b + o for b, o in zip(self.stop, offset, strict=True)),
        )

    def inside(self, shape: Sequence[int]) -> bool:
        """Whether this box lies in ``[0, shape)`` (cheap: callers build :meth:`check_inside`'s
        message only when it does not)."""
        return len(shape) == len(self.stop) and all(map(operator.le, self.stop, shape))

    def check_inside(self, shape: Sequence[int], what: str = "dataset") -> None:
        """Raise BoundsError naming *what* if this box leaves ``[0, shape)``."""
        if len(shape) != self.ndim:
            raise BoundsError(
                f"box {self} has {self.ndim} dimensions but {what} has {len(shape)} (shape {tuple(shape)})"
            )
        for d, (a, b, n) in enumerate(zip(self.start, self.stop, shape, strict=True)):
            if b > n:
                raise BoundsError(
                    f"box {self} is out of bounds for {what} of shape {tuple(shape)}: "
                    f"dimension {d} reaches {b} > {n}"
                )
            if a < 0:
                raise BoundsError(f"box {self} starts below 0 in dimension {d}")

    def __str__(self) -> str:
        if not self.start:  # (the one element of a 0-D dataset, as numpy indexes it: x[()])
            return "[()]"
        return "[" + ", ".join(f"{a}:{b}" for a, b in zip(self.start, self.stop, strict=True)) + "]"


#: the one type of a corner's entries that :class:`Box` takes without converting them
_INT = frozenset({int})


def _corner(v: Any, which: str) -> tuple[int, ...]:
    """Corner *v* of a box (``which``: start or stop) as a tuple of Python ints; TypeError
    naming it for anything but a sequence (or 1-D array) of integers."""
    if isinstance(v, np.ndarray):
        sequence = v.ndim == 1
    else:
        sequence = isinstance(v, Sequence) and not isinstance(v, str | bytes)
    if not sequence:
        raise TypeError(f"box {which} {v!r} is not a sequence of integers (one per dimension)")
    out = []
    for x in v:
        try:
            out.append(as_int(x))
        except TypeError:
            raise TypeError(f"box {which} {tuple(v)!r} holds {x!r}, not an integer") from None
    return tuple(out)


_new_box = object.__new__
_set_start = Box.__dict__["start"].__set__  # the slot itself: no frozen-class __setattr__
_set_stop = Box.__dict__["stop"].__set__


def box_of(offset: tuple[int, ...], shape: tuple[int, ...]) -> Box:
    """The box of *shape* at *offset* (tuples of Python ints, of one length, the shape's
    entries >= 0), checked as :class:`Box` checks but without its generic checks: for
    the paths that make a box per write of a small block.  3-D and 1-D boxes, the
    common ones, are spelled out: half the cost of ``map`` and ``min``."""
    n = len(offset)
    if n == 3:
        a, b, c = offset
        x, y, z = shape
        stop: tuple[int, ...] = (a + x, b + y, c + z)
        negative = a < 0 or b < 0 or c < 0
    elif n == 1:
        stop = (offset[0] + shape[0],)
        negative = offset[0] < 0
    else:
        stop = tuple(map(operator.add, offset, shape))
        negative = bool(offset) and min(offset) < 0
    if negative:
        return Box(offset, stop)  # BoundsError, as Box says
    box = _new_box(Box)
    _set_start(box, offset)
    _set_stop(box, stop)
    return box


def as_int(v: Any) -> int:
    """*v* as an int if it is an integer as numpy takes one for an index (Python's, numpy's,
    or a 0-D array of one); TypeError for anything else: a float, a string or a bool is
    not rounded, parsed or taken as 0 and 1.  The rule of shapes, corners and steps."""
    if isinstance(v, bool | np.bool_):
        raise TypeError(f"{v!r} is a bool, not an integer")
    return operator.index(v)


def fits(start: tuple, shape: tuple[int, ...], extent: tuple[int, ...]) -> bool:
    """Whether *start* is a corner of Python ints at which a box of *shape* lies in
    ``[0, extent)``: what ``box_of(start, shape).inside(extent)`` tests, without making
    the box, for the write of a small block.  False where the three differ in length or
    *start* holds anything but ints (bool included)."""
    n = len(extent)
    if len(start) != n or len(shape) != n:
        return False
    for a, x, e in zip(start, shape, extent, strict=True):
        if type(a) is not int or a < 0 or a + x > e:
            return False
    return True


# -- columns of corners ------------------------------------------------------------
#
# Many blocks' corners are (n, ndim) int64 arrays.  numpy reduces their short last
# axis (and their first axis into ndim values) ten or more times slower than it
# reduces a column: 0.8 ms against 0.06 ms for 65,536 rows of 3.  These reduce a
# column at a time and give what the axis reductions give.


def rows_all(m: np.ndarray) -> np.ndarray:
    """``m.all(axis=1)`` of an ``(n, ndim)`` boolean array."""
    out = np.ones(m.shape[0], dtype=bool)
    for k in range(m.shape[1]):
        out &= m[:, k]
    return out


def rows_any(m: np.ndarray) -> np.ndarray:
    """``m.any(axis=1)`` of an ``(n, ndim)`` boolean array."""
    out = np.zeros(m.shape[0], dtype=bool)
    for k in range(m.shape[1]):
        out |= m[:, k]
    return out


def rows_less(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``(lo < hi).all(axis=1)``: the boxes ``[lo, hi)`` that are not empty."""
    out = np.ones(lo.shape[0], dtype=bool)
    for k in range(lo.shape[1]):
        out &= lo[:, k] < hi[:, k]
    return out


def rows_prod(a: np.ndarray) -> np.ndarray:
    """``a.prod(axis=1)`` of an ``(n, ndim)`` int64 array (the cells of each box's extent)."""
    a = np.asarray(a, dtype=np.int64)  # no copy for int64 (the corners' dtype)
    out = np.ones(a.shape[0], dtype=np.int64)
    for k in range(a.shape[1]):
        out *= a[:, k]
    return out


#: up to this many rows a reduction along axis 0 is one numpy call (1-2 us up to 64 rows);
#: more rows are reduced a column at a time (one reduction along axis 0 of 16,384 rows of 3
#: columns: 220-250 us, against 16 us a column at a time)
AXIS_ROWS = 256


def cols_min(a: np.ndarray) -> np.ndarray:
    """``a.min(axis=0)`` of a non-empty ``(n, ndim)`` array of ints."""
    if len(a) <= AXIS_ROWS:
        return np.minimum.reduce(a, axis=0)
    return np.array([a[:, k].min() for k in range(a.shape[1])], dtype=a.dtype)


def cols_max(a: np.ndarray) -> np.ndarray:
    """``a.max(axis=0)`` of a non-empty ``(n, ndim)`` array of ints."""
    if len(a) <= AXIS_ROWS:
        return np.maximum.reduce(a, axis=0)
    return np.array([a[:, k].max() for k in range(a.shape[1])], dtype=a.dtype)


def find_overlap(boxes: Sequence[Box]) -> tuple[int, int] | None:
    """Indices (i, j), i < j, of a pair of overlapping boxes, or None.

    Parameters
    ----------
    boxes
        Boxes with the same number of dimensions; empty boxes never overlap
        anything, and two 0-D boxes always overlap.

    Returns
    -------
    tuple of int or None
        Some overlapping pair, or None when the boxes are pairwise disjoint.

    Raises
    ------
    ShapeError
        If the boxes differ in their number of dimensions.

    See Also
    --------
    find_overlap_arrays : the same search on corner arrays; this function calls it.
    """
    n = len(boxes)
    if n < 2:
        return None
    ndim = boxes[0].ndim
    if any(len(b.start) != ndim for b in boxes):
        raise ShapeError(
            f"boxes of different numbers of dimensions: {sorted({b.ndim for b in boxes})}"
        )
    lo = np.fromiter(
        itertools.chain.from_iterable(b.start for b in boxes), dtype=np.int64, count=n * ndim
    )
    hi = np.fromiter(
        itertools.chain.from_iterable(b.stop for b in boxes), dtype=np.int64, count=n * ndim
    )
    return find_overlap_arrays(lo.reshape(n, ndim), hi.reshape(n, ndim))


# A round sweeps every dimension once.  After a round that split off less
# than 1/_STALL of the pieces and added less than 1/_STALL groups, the
# groups of at most _SMALL pieces are tested pair by pair and the others
# are cut in two, unless the pieces outnumber the boxes _BUDGET times (as
# clusters of overlapping boxes can make them): then all groups are tested
# pair by pair.  Pairs are tested up to _CHUNK at a time.
_STALL = 8
_SMALL = 16
_BUDGET = 8
_CHUNK = 1 << 20


def find_overlap_arrays(lo: np.ndarray, hi: np.ndarray) -> tuple[int, int] | None:
    """Indices (i, j), i < j, of a pair of overlapping boxes given as corner arrays, or None.

    Box ``k`` is ``[lo[k], hi[k])``; a box with ``hi <= lo`` in some
    dimension is empty and overlaps nothing.  With 0 dimensions every box
    is a single element, so any two overlap.

    The search is exact for any input, vectorized, and stops at the first
    overlap found.  It splits the boxes into ever smaller groups such that
    boxes of different groups cannot overlap, until every group holds one
    box (no overlap) or an overlap turns up:

    - *Sweep*: sorted by start along one dimension, the boxes of a group
      fall into runs whose extents along it chain together (each box starts
      before the furthest stop of the boxes before it); boxes of different
      runs cannot overlap, so each run becomes a group.  Sweeping the
      dimensions in turn splits any layout that some plane cuts in two,
      each side again, and so on (grids, slabs, bisections, block trees with
      blocks of many sizes) down to single boxes in a few sweeps.  Each box
      is also tested against the box that reaches furthest before it: in
      1-D that finds every overlap, and it finds one at once where many
      boxes overlap.
    - *Cut*: when a round of sweeps over all dimensions makes little
      progress (layouts no plane cuts, such as pinwheels), every group is
      cut in two at the middle of its bounding box, across the dimension
      along which it holds the most boxes side by side; a box across the
      cut goes to both sides, clipped.  Clipping keeps every overlap: the
      pieces of two boxes that hold a common point stay in one group.  A
      group whose bounding box is a single element holds pieces that all
      overlap.

    Sorting dominates: O(n log n) per round, with few rounds for the
    layouts parallel codes write (regular and irregular decompositions,
    slabs, block hierarchies, a few huge boxes among small ones).

    Parameters
    ----------
    lo, hi
        Integer arrays of shape ``(n, ndim)``: the start and stop corners.
        Coordinates may be negative; the largest minus the smallest must be
        below ``2**63``.

    Returns
    -------
    tuple of int or None
        Some pair ``(i, j)``, ``i < j``, of overlapping boxes, or None when
        the non-empty boxes are pairwise disjoint.

    Raises
    ------
    ShapeError
        If *lo* and *hi* are not 2-D arrays of the same shape.
    BoundsError
        If the coordinates span ``2**63`` or more.
    """
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    if lo.ndim != 2 or lo.shape != hi.shape:
        raise ShapeError(
            f"box corners need two (n, ndim) arrays of one shape, got {lo.shape} and {hi.shape}"
        )
    n, ndim = lo.shape
    if n < 2:
        return None
    if ndim == 0:  # 0-D boxes always overlap
        return (0, 1)
    keep = np.flatnonzero(rows_less(lo, hi))
    if keep.size < 2:
        return None
    # one row per dimension: sweeps read one dimension at a time
    lo_t, hi_t = np.ascontiguousarray(lo[keep].T), np.ascontiguousarray(hi[keep].T)
    if int(hi_t.max()) - int(lo_t.min()) >= 1 << 63:
        raise BoundsError("box coordinates span 2**63 or more; overlaps are computed in int64")
    pair = _search(lo_t, hi_t)
    if pair is None:
        return None
    i, j = int(keep[pair[0]]), int(keep[pair[1]])
    return (min(i, j), max(i, j))


def check_ranks_disjoint(lo: np.ndarray, hi: np.ndarray, rank: np.ndarray, where: str) -> None:
    """OverlapError naming both boxes and the ranks that wrote them if two boxes overlap.

    *lo*, *hi*: the boxes of one dataset in one step from every rank (as
    :func:`find_overlap_arrays` takes them); *rank*: the writer of each;
    *where* starts the message (``dataset 'T', step 3``).
    """
    pair = find_overlap_arrays(lo, hi)
    if pair is None:
        return
    i, j = pair
    a = Box(tuple(lo[i].tolist()), tuple(hi[i].tolist()))
    b = Box(tuple(lo[j].tolist()), tuple(hi[j].tolist()))
    raise OverlapError(
        f"{where}: box {a} written by rank {int(rank[i])} overlaps box {b} written by rank "
        f"{int(rank[j])}; boxes of one step may not overlap"
    )


def _search(lo_t: np.ndarray, hi_t: np.ndarray) -> tuple[int, int] | None:
    """Two overlapping boxes among non-empty boxes (columns of lo_t, hi_t), or None."""
    ndim, m = lo_t.shape
    box = np.arange(m)  # the box each piece comes from
    piece_lo, piece_hi = lo_t, hi_t  # the corners of each piece
    active = np.arange(m)  # the pieces in groups of two or more, by group
    group = np.zeros(m, dtype=np.int64)
    ngroups = 1
    check = True  # look for overlaps while sweeping: in the first round and after each cut
    while active.size:
        size0, groups0 = active.size, ngroups
        for axis in range(ndim):
            found, active, group, ngroups = _sweep(
                active, group, ngroups, piece_lo, piece_hi, axis, check
            )
            if found is not None:
                return int(box[found[0]]), int(box[found[1]])
            if not active.size:
                return None
        stalled = _STALL * (size0 - active.size) < size0 and _STALL * (ngroups - groups0) < groups0
        check = stalled
        if not stalled:
            continue
        if active.size > _BUDGET * m:
            found = _pairwise(active, group, piece_lo, piece_hi)
            return None if found is None else (int(box[found[0]]), int(box[found[1]]))
        count = np.bincount(group)
        small = count[group] <= _SMALL
        if small.any():
            found = _pairwise(active[small], group[small], piece_lo, piece_hi)
            if found is not None:
                return int(box[found[0]]), int(box[found[1]])
            active, group = active[~small], group[~small]
            if not active.size:
                return None
            ngroups = int(np.count_nonzero(count > _SMALL))
        found, box, piece_lo, piece_hi, group = _cut(box, piece_lo, piece_hi, active, group)
        if found is not None:
            return found
        active, ngroups = np.arange(box.size), 2 * ngroups
    return None


def _sweep(
    active: np.ndarray,
    group: np.ndarray,
    ngroups: int,
    piece_lo: np.ndarray,
    piece_hi: np.ndarray,
    axis: int,
    check: bool,
) -> tuple[tuple[int, int] | None, np.ndarray, np.ndarray, int]:
    """Split each group of *active* pieces into its runs along *axis*; drop runs of one.

    Returns two overlapping pieces if *check* found some, else the pieces
    left, their groups (numbered 0, 1, ... in order) and the group count.
    """
    start, stop = piece_lo[axis, active], piece_hi[axis, active]
    origin = int(start.min())
    span = int(stop.max()) - origin + 1
    if ngroups * span < 1 << 62:
        start, stop = start - origin, stop - origin
    else:  # renumber the coordinates densely, keeping their order
        values = np.unique(np.concatenate([start, stop]))
        start, stop = np.searchsorted(values, start), np.searchsorted(values, stop)
        span = values.size
    # sort keys: the group, then the coordinate; the keys of a group all lie below the next's
    key_start = group * span + start
    order = np.argsort(key_start)
    active, key_start = active[order], key_start[order]
    key_stop = (group * span + stop)[order]
    reach = np.maximum.accumulate(key_stop)
    # a piece that starts before the reach of the pieces before it (in its group) joins their run
    joins = np.flatnonzero(key_start[1:] < reach[:-1]) + 1
    if check:  # against the piece that reaches furthest, which it overlaps along this axis
        holder = np.maximum.accumulate(np.where(key_stop == reach, np.arange(reach.size), 0))
        a, b = active[joins], active[holder[joins - 1]]
        hit = np.ones(joins.size, dtype=bool)
        for lo_d, hi_d in zip(piece_lo, piece_hi, strict=True):
            hit &= (lo_d[a] < hi_d[b]) & (lo_d[b] < hi_d[a])
        if hit.any():
            k = int(np.argmax(hit))
            return (int(a[k]), int(b[k])), active, group, ngroups
    first = np.ones(active.size, dtype=bool)
    first[joins] = False
    run = np.cumsum(first) - 1
    shared = np.bincount(run)[run] > 1
    active, run = active[shared], run[shared]
    if not active.size:
        return None, active, run, 0
    group = np.cumsum(np.r_[True, run[1:] != run[:-1]]) - 1
    return None, active, group, int(group[-1]) + 1


def _cut(
    box: np.ndarray,
    piece_lo: np.ndarray,
    piece_hi: np.ndarray,
    active: np.ndarray,
    group: np.ndarray,
) -> tuple[tuple[int, int] | None, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut every group of *active* pieces (sorted by group) in two at the middle of its bounding box.

    The cut goes across the dimension along which the group holds the most
    pieces side by side (its width over the mean extent of its pieces).
    Returns two overlapping boxes if a group's bounding box is a single
    element, else the new pieces: their boxes, corners and groups (the two
    halves of the k-th group are groups 2k and 2k + 1).
    """
    lo, hi = piece_lo[:, active], piece_hi[:, active]
    first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    count = np.diff(np.append(first, active.size))
    glo = np.minimum.reduceat(lo, first, axis=1)
    width = np.maximum.reduceat(hi, first, axis=1) - glo
    extent = np.add.reduceat((hi - lo).astype(np.float64), first, axis=1)
    score = np.where(width >= 2, width * (count / extent), -1.0)
    axis = np.argmax(score, axis=0)
    g = np.arange(first.size)
    single = np.flatnonzero(score[axis, g] < 0)
    if single.size:  # every piece of the group covers the same one element
        k = int(first[single[0]])
        return (int(box[active[k]]), int(box[active[k + 1]])), box, piece_lo, piece_hi, group
    middle = glo[axis, g] + width[axis, g] // 2
    axis, middle, g = np.repeat(axis, count), np.repeat(middle, count), np.repeat(g, count)
    e = np.arange(active.size)
    start, stop = lo[axis, e], hi[axis, e]
    left, right = np.flatnonzero(start < middle), np.flatnonzero(stop > middle)
    left_hi, right_lo = hi[:, left], lo[:, right]
    left_hi[axis[left], np.arange(left.size)] = np.minimum(stop[left], middle[left])
    right_lo[axis[right], np.arange(right.size)] = np.maximum(start[right], middle[right])
    return (
        None,
        box[active[np.concatenate([left, right])]],
        np.concatenate([lo[:, left], right_lo], axis=1),
        np.concatenate([left_hi, hi[:, right]], axis=1),
        np.concatenate([2 * g[left], 2 * g[right] + 1]),
    )


def _pairwise(
    active: np.ndarray, group: np.ndarray, piece_lo: np.ndarray, piece_hi: np.ndarray
) -> tuple[int, int] | None:
    """Two overlapping pieces of one group, testing every pair; *active* is sorted by group.

    Pairs are expanded and tested a chunk at a time, so that memory stays
    bounded and the first chunk with an overlap ends the search.
    """
    n = active.size
    first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    end = np.repeat(np.append(first[1:], n), np.diff(np.append(first, n)))
    count = end - np.arange(n) - 1  # the later pieces of the group
    cum = np.cumsum(count)
    e = 0
    while e < n:
        done = int(cum[e] - count[e])
        f = max(int(np.searchsorted(cum, done + _CHUNK, side="right")), e + 1)
        c = count[e:f]
        i = np.repeat(np.arange(e, f), c)
        j = i + 1 + np.arange(i.size) - np.repeat(cum[e:f] - c - done, c)
        a, b = active[i], active[j]
        hit = np.ones(a.size, dtype=bool)
        for lo_d, hi_d in zip(piece_lo, piece_hi, strict=True):
            hit &= (lo_d[a] < hi_d[b]) & (lo_d[b] < hi_d[a])
        if hit.any():
            k = int(np.argmax(hit))
            return int(a[k]), int(b[k])
        e = f
    return None


def prime_factors(n: int) -> list[int]:
    """The prime factors of *n* >= 1 with multiplicity, ascending (``[]`` for 1)."""
    primes: list[int] = []
    p = 2
    while p * p <= n:
        while n % p == 0:
            primes.append(p)
            n //= p
        p += 1
    if n > 1:
        primes.append(n)
    return primes


def dims_create(nparts: int, ndim: int) -> tuple[int, ...]:
    """Factor *nparts* into *ndim* near-equal factors, largest first (like MPI_Dims_create)."""
    if nparts < 1 or ndim < 1:
        raise ValueError(f"need nparts >= 1 and ndim >= 1, got {nparts}, {ndim}")
    dims = [1] * ndim
    for p in sorted(prime_factors(nparts), reverse=True):
        i = dims.index(min(dims))
        dims[i] *= p
    return tuple(sorted(dims, reverse=True))


def split_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """The *index*-th of *parts* near-equal pieces of range(n): (start, stop)."""
    q, r = divmod(n, parts)
    start = index * q + min(index, r)
    return start, start + q + (1 if index < r else 0)


def decompose(shape: Sequence[int], nparts: int, dims: Sequence[int] | None = None) -> list[Box]:
    """Split *shape* into *nparts* boxes on a grid of *dims* (default: dims_create).

    Boxes are returned in row-major order of the process grid.  Without *dims*, where the
    usual grid would cut a dimension into more parts than it has cells, the grid of the
    most non-empty boxes is taken (some stay empty where no grid of *nparts* fits the
    shape: (3, 3) over 8 parts); with *dims*, a dimension shorter than its number of parts
    has empty boxes.
    """
    shape = tuple(int(s) for s in shape)
    if not shape:
        if nparts != 1:
            raise ValueError("a 0-D (scalar) shape cannot be split into several parts")
        return [Box((), ())]
    if dims is None:
        dims = _fit_dims(shape, nparts)
    if math.prod(dims) != nparts or len(dims) != len(shape):
        raise ValueError(
            f"process grid {tuple(dims)} does not match {nparts} parts of a {len(shape)}-D shape"
        )
    boxes = []
    for idx in _grid_indices(dims):
        start, stop = [], []
        for n, p, i in zip(shape, dims, idx, strict=True):
            a, b = split_range(n, p, i)
            start.append(a)
            stop.append(b)
        boxes.append(Box(tuple(start), tuple(stop)))
    return boxes


def _fit_dims(shape: tuple[int, ...], nparts: int) -> tuple[int, ...]:
    """dims_create, with the largest factors given to the longest dimensions; where that
    cuts a dimension into more parts than it has cells (ranks left empty: (1, 1, 64) over
    8 parts as 2 x 2 x 2), the grid of *nparts* with the most non-empty boxes instead, the
    smallest largest box among those."""
    dims = dims_create(nparts, len(shape))
    order = sorted(range(len(shape)), key=lambda d: -shape[d])
    out = [1] * len(shape)
    for d, f in zip(order, dims, strict=True):
        out[d] = f
    if all(p <= n for p, n in zip(out, shape, strict=True)) or 0 in shape:
        return tuple(out)

    def score(grid: tuple[int, ...]) -> tuple[int, int]:
        used = math.prod(min(p, n) for p, n in zip(grid, shape, strict=True))
        largest = math.prod(-(-n // p) for p, n in zip(grid, shape, strict=True))
        return -used, largest

    return min(_grids(nparts, len(shape)), key=score, default=tuple(out))


def _grids(nparts: int, ndim: int) -> Iterator[tuple[int, ...]]:
    """Every grid of *ndim* factors whose product is *nparts*."""
    if ndim == 1:
        yield (nparts,)
        return
    small = [f for f in range(1, math.isqrt(nparts) + 1) if nparts % f == 0]
    for f in small + [nparts // f for f in reversed(small) if f * f != nparts]:
        for rest in _grids(nparts // f, ndim - 1):
            yield (f, *rest)


def _grid_indices(dims: Sequence[int]) -> Iterator[tuple[int, ...]]:
    if not dims:
        yield ()
        return
    for i in range(dims[0]):
        for rest in _grid_indices(dims[1:]):
            yield (i, *rest)


def morton_key(point: Sequence[int], bits: int = 21) -> int:
    """Interleave the bits of a non-negative integer point (Z-order key): at least *bits* of
    each coordinate, all of the largest one's."""
    key = 0
    nd = len(point)
    bits = max(bits, *(int(x).bit_length() for x in point)) if nd else 0
    for b in range(bits):
        for d, x in enumerate(point):
            key |= ((int(x) >> b) & 1) << (b * nd + d)
    return key


def morton_order(boxes: Iterable[Box]) -> list[Box]:
    """Boxes sorted along a Z-order curve of their start corners."""
    return sorted(boxes, key=lambda b: morton_key(b.start))


def covered_volume(boxes: Iterable[Box], within: Box) -> int:
    """Number of cells of *within* covered by pairwise disjoint *boxes*."""
    total = 0
    for b in boxes:
        c = b.intersect(within)
        if c is not None:
            total += c.size
    return total
