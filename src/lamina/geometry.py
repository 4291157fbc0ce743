"""N-D boxes and decompositions.  Pure: no MPI, no files.

A :class:`Box` is a half-open region ``[start, stop)`` in every dimension, the
unit in which ranks write and read.  Decompositions split a global shape into
boxes for a number of ranks; :func:`dims_create` factors a rank count into
near-equal factors per dimension (like ``MPI_Dims_create``) and is the
"common decomposition" later layers agree on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import EllipsisType

import numpy as np

from .errors import BoundsError, ShapeError


@dataclass(frozen=True, slots=True)
class Box:
    """Half-open N-D box ``[start, stop)``; immutable and hashable."""

    start: tuple[int, ...]
    stop: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.start) != len(self.stop):
            raise ShapeError(f"box start {self.start} and stop {self.stop} differ in rank")
        for a, b in zip(self.start, self.stop, strict=True):
            if a < 0 or b < a:
                raise BoundsError(f"invalid box {self.start}..{self.stop}: need 0 <= start <= stop")

    # -- construction -----------------------------------------------------
    @classmethod
    def from_shape(cls, shape: Sequence[int]) -> Box:
        """The box covering a whole array of *shape*."""
        return cls(tuple(0 for _ in shape), tuple(int(s) for s in shape))

    @classmethod
    def from_offset(cls, offset: Sequence[int], shape: Sequence[int]) -> Box:
        """The box of *shape* placed at *offset*."""
        return cls(
            tuple(int(o) for o in offset),
            tuple(int(o) + int(s) for o, s in zip(offset, shape, strict=True)),
        )

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
        return tuple(b - a for a, b in zip(self.start, self.stop, strict=True))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def empty(self) -> bool:
        return any(b <= a for a, b in zip(self.start, self.stop, strict=True))

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
        """True if *other* lies entirely inside this box."""
        return all(
            a <= c and d <= b
            for a, b, c, d in zip(self.start, self.stop, other.start, other.stop, strict=True)
        )

    def relative_to(self, outer: Box) -> tuple[slice, ...]:
        """Slices that select this box inside an array holding *outer*."""
        return tuple(
            slice(a - o, b - o) for a, b, o in zip(self.start, self.stop, outer.start, strict=True)
        )

    def within(self, outer: Box) -> tuple[slice | EllipsisType, ...]:
        """An index that selects this box inside an array holding *outer* as an array (also when 0-D).

        Like :meth:`relative_to` with a trailing ``...``, so that a 0-D box
        gives a 0-D view to write into rather than a scalar.
        """
        return (*self.relative_to(outer), Ellipsis)

    def shift(self, offset: Sequence[int]) -> Box:
        return Box(
            tuple(a + o for a, o in zip(self.start, offset, strict=True)),
            tuple(b + o for b, o in zip(self.stop, offset, strict=True)),
        )

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
        return "[" + ", ".join(f"{a}:{b}" for a, b in zip(self.start, self.stop, strict=True)) + "]"


def find_overlap(boxes: Sequence[Box]) -> tuple[int, int] | None:
    """Indices (i, j), i < j, of a pair of overlapping boxes, or None.

    Sorted by start along dimension 0, each box is tested against all boxes
    before it at once (numpy), so a few thousand blocks cost milliseconds.
    """
    items = [(i, b) for i, b in enumerate(boxes) if not b.empty]
    if len(items) < 2:
        return None
    if items[0][1].ndim == 0:  # 0-D boxes always overlap
        return (items[0][0], items[1][0])
    idx = np.array([i for i, _ in items], dtype=np.int64)
    lo = np.array([b.start for _, b in items], dtype=np.int64)
    hi = np.array([b.stop for _, b in items], dtype=np.int64)
    order = np.argsort(lo[:, 0], kind="stable")
    idx, lo, hi = idx[order], lo[order], hi[order]
    for k in range(1, len(idx)):
        hit = np.all((lo[:k] < hi[k]) & (hi[:k] > lo[k]), axis=1)
        if hit.any():
            j = int(idx[int(np.argmax(hit))])
            i = int(idx[k])
            return (min(i, j), max(i, j))
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

    Boxes are returned in row-major order of the process grid; some may be
    empty when a dimension is shorter than its number of parts.
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
    """dims_create, with the largest factors given to the longest dimensions."""
    dims = dims_create(nparts, len(shape))
    order = sorted(range(len(shape)), key=lambda d: -shape[d])
    out = [1] * len(shape)
    for d, f in zip(order, dims, strict=True):
        out[d] = f
    return tuple(out)


def _grid_indices(dims: Sequence[int]) -> Iterator[tuple[int, ...]]:
    if not dims:
        yield ()
        return
    for i in range(dims[0]):
        for rest in _grid_indices(dims[1:]):
            yield (i, *rest)


def morton_key(point: Sequence[int], bits: int = 21) -> int:
    """Interleave the bits of a non-negative integer point (Z-order key)."""
    key = 0
    nd = len(point)
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


def find_overlap_arrays(lo: np.ndarray, hi: np.ndarray) -> tuple[int, int] | None:
    """:func:`find_overlap` of boxes given as ``(n, ndim)`` corner arrays (box k: ``[lo[k], hi[k])``)."""
    n = len(lo)
    boxes = [Box(tuple(int(v) for v in lo[i]), tuple(int(v) for v in hi[i])) for i in range(n)]
    return find_overlap(boxes)
