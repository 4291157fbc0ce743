"""Many blocks of one dataset in one call (``Dataset.write_blocks``, ``Engine.put_many``).

A program holding thousands of small blocks (AMR patches, particles in
cells) pays the Python of a ``put`` per block, about 10 us.  A batch is
checked as a whole with a few numpy calls (:func:`check_batch`) and
stored without building a :class:`~lamina.geometry.Box` per block.

The blocks come either *stacked*, one array of shape ``(n, *block_shape)``
whose ``k``-th entry is block ``k`` (the common case: patches of one size),
or as a list of ``n`` arrays of any shapes; their corners are an ``(n,
ndim)`` integer array.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..catalog import DatasetSpec
from ..errors import BoundsError, DTypeError, ShapeError
from ..geometry import Box, rows_any, rows_prod


@dataclass(slots=True)
class Batch:
    """Blocks checked against a dataset: corners, ends and the arrays, in the dataset's dtype.

    ``arrays`` is one C-contiguous array of shape ``(n, *shape)`` when
    *stacked*, else a list of C-contiguous arrays.  *owned*: every array is a
    private copy made by a cast or a reordering (a caller's ``copy=True``
    need not copy them again); *copied*: at least one is.  *lent*: the caller's own
    array objects whose memory ``arrays`` are (not copied): what a write with
    ``copy=False`` makes read-only while it keeps them (an ``np.memmap``, not the
    plain view of it ``arrays`` holds).  Blocks of no element are left out.
    """

    starts: np.ndarray  # (n, ndim) int64
    stops: np.ndarray  # (n, ndim) int64
    arrays: np.ndarray | list[np.ndarray]
    stacked: bool
    owned: bool
    copied: bool
    nbytes: np.ndarray  # (n,) int64, bytes of each block
    lent: list[np.ndarray] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.starts)

    def block(self, k: int) -> np.ndarray:
        return self.arrays[k]

    def boxes(self) -> list[Box]:
        return [
            Box(a, b)
            for a, b in zip(
                map(tuple, self.starts.tolist()), map(tuple, self.stops.tolist()), strict=True
            )
        ]


def check_dtype(spec: DatasetSpec, dtype: np.dtype, what: str | None = None) -> None:
    """DTypeError unless data of *dtype* may be written to *spec*: the same kind or a safe
    cast within numbers, as numpy's ``same_kind``, or integers (and bools) to any integer
    or bool type, as numpy's ``astype`` makes them (int64 -1 into uint8 is 255, 2 into bool
    True; numpy's and h5py's assignments take them too); *what* says which block, if any."""
    dt = spec.dtype
    if (
        dtype != dt
        and not (dtype.kind in "biu" and dt.kind in "biu")
        and (dtype.kind not in "biufc" or not np.can_cast(dtype, dt, casting="same_kind"))
    ):
        raise DTypeError(
            f"cannot write {dtype} data to dataset {spec.path!r} of dtype {dt} "
            f"(unsafe cast{'; ' + what if what else ''})"
        )


def cast(spec: DatasetSpec, arr: np.ndarray, what: str | None = None) -> tuple[np.ndarray, bool]:
    """*arr* in the dataset's dtype, C-contiguous (:func:`check_dtype`); whether that made a
    copy (the caller's ``copy=True`` need not copy it again)."""
    copied = False
    if arr.dtype != spec.dtype:
        check_dtype(spec, arr.dtype, what)
        arr = arr.astype(spec.dtype)
        copied = True
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
        copied = True
    return arr, copied


def corners(spec: DatasetSpec, offsets, n: int | None = None) -> np.ndarray:
    """*offsets* as an ``(n, ndim)`` int64 array; ShapeError, DTypeError (a TypeError: offsets
    that are not integers) or BoundsError (past int64) naming the dataset if it is not one."""
    o = np.asarray(offsets)
    if o.size == 0 and not (o.ndim == 2 and o.shape[0]):  # no offsets (a 0-D dataset has (n, 0))
        if n:
            raise ShapeError(f"dataset {spec.path!r}: {n} blocks but no offsets")
        return np.zeros((0, spec.ndim), dtype=np.int64)
    if o.size and o.dtype.kind not in "iu":
        raise DTypeError(
            f"dataset {spec.path!r}: block offsets must be integers, got an array of {o.dtype}"
        )
    if o.size and o.dtype.kind == "u" and int(o.max()) > np.iinfo(np.int64).max:
        raise BoundsError(
            f"dataset {spec.path!r}: block offset {int(o.max())} is past the largest corner "
            f"({np.iinfo(np.int64).max})"
        )
    if o.ndim != 2 or o.shape[1] != spec.ndim:
        raise ShapeError(
            f"dataset {spec.path!r} has {spec.ndim} dimensions: block offsets must have shape "
            f"(blocks, {spec.ndim}), got {o.shape}"
        )
    if n is not None and len(o) != n:
        raise ShapeError(f"dataset {spec.path!r}: {n} blocks but {len(o)} offsets")
    return o.astype(np.int64, copy=False)


def check_batch(spec: DatasetSpec, starts, arrays) -> Batch:
    """The checks ``put`` makes on each block, made on the whole batch; nothing is stored.

    *starts*: ``(n, ndim)`` corners; *arrays*: ``(n, *shape)`` stacked
    blocks or a sequence of ``n`` arrays.  Raises what ``put`` raises for
    the first bad block (ShapeError, DTypeError, BoundsError), naming its
    position in the batch, its box and the dataset.
    """
    nd = spec.ndim
    if isinstance(arrays, np.ndarray):
        if arrays.ndim != nd + 1:
            raise ShapeError(
                f"dataset {spec.path!r} has {nd} dimensions: stacked blocks need {nd + 1} "
                f"(blocks first), got an array of shape {arrays.shape}"
            )
        n = arrays.shape[0]
        st = corners(spec, starts, n)
        arr, owned = cast(spec, arrays, f"{n} stacked blocks")
        shape = np.array(arr.shape[1:], dtype=np.int64)
        # (checked before empty blocks are dropped: an empty box past the end is refused,
        # as write() and the list form refuse it)
        _check_bounds(spec, st, np.broadcast_to(shape, st.shape))
        if arr.size == 0:  # every block is empty: nothing to store, nothing to overlap
            st = st[:0]
            arr = arr[:0]
        stops = st + shape  # within the dataset's shape: no int64 wraps
        nbytes = np.full(len(st), int(np.prod(shape)) * spec.dtype.itemsize, dtype=np.int64)
        return Batch(st, stops, arr, True, owned, owned, nbytes, [] if owned else [arrays])
    if not isinstance(arrays, Sequence):
        raise TypeError(
            f"dataset {spec.path!r}: blocks must be one stacked array or a sequence of arrays, "
            f"got {type(arrays).__name__}"
        )
    n = len(arrays)
    st = corners(spec, starts, n)
    out: list[np.ndarray] = []
    shape_rows: list[tuple[int, ...]] = []
    owned, any_copy = True, False
    lent: list[np.ndarray] = []
    dt = spec.dtype
    for k, given in enumerate(arrays):
        if type(given) is np.ndarray and given.dtype == dt and given.flags.c_contiguous:
            a, copied = given, False  # (cast's answer, without its calls: the common block)
        else:
            a = np.asarray(given)
            if a.ndim == nd:
                a, copied = cast(spec, a, f"block {k} of {n}")
        if a.ndim != nd:
            raise ShapeError(
                f"dataset {spec.path!r}: block {k} of {n} has {a.ndim} dimensions "
                f"(shape {a.shape}), the dataset {nd}"
            )
        owned = owned and copied
        any_copy = any_copy or copied
        if not copied and isinstance(given, np.ndarray):
            lent.append(given)
        shape_rows.append(a.shape)
        out.append(a)
    shapes = np.array(shape_rows, dtype=np.int64).reshape(n, nd)
    _check_bounds(spec, st, shapes)
    stops = st + shapes  # within the dataset's shape: no int64 wraps
    cells = rows_prod(shapes)
    keep = np.flatnonzero(cells > 0) if n else np.zeros(0, dtype=np.int64)
    if len(keep) < n:
        st, stops, shapes, cells = st[keep], stops[keep], shapes[keep], cells[keep]
        out = [out[k] for k in keep.tolist()]
    nbytes = cells * spec.dtype.itemsize
    return Batch(st, stops, out, False, owned and n > 0, any_copy, nbytes, lent)


def _check_bounds(spec: DatasetSpec, starts: np.ndarray, shapes: np.ndarray) -> None:
    """BoundsError naming the dataset and the first block of corners *starts* and *shapes* that
    leaves the dataset.  Judged as ``start > extent - block``: a corner near the int64 limit
    plus its block would wrap around and pass a test of ``start + block > extent``."""
    if not len(starts):
        return
    shape = np.array(spec.shape, dtype=np.int64)
    bad = rows_any((starts < 0) | (starts > shape - shapes))
    if bad.any():
        k = int(np.argmax(bad))
        a, b = starts[k].tolist(), shapes[k].tolist()
        where = f"dataset {spec.path!r} (block {k} of {len(starts)})"
        if min(a) < 0:
            raise BoundsError(f"{where}: corner {tuple(a)} is negative")
        stop = tuple(x + y for x, y in zip(a, b, strict=True))  # Python ints: no wrap
        Box(tuple(a), stop).check_inside(spec.shape, where)


def elements(arrays) -> int:
    """Elements of the blocks of a batch as ``put_many`` takes it (stacked, or a sequence)."""
    if isinstance(arrays, np.ndarray):
        return int(arrays.size)
    return sum(int(np.asarray(a).size) for a in arrays)


__all__ = ["Batch", "cast", "check_batch", "check_dtype", "corners", "elements"]
