"""numpy-style selections (ints, slices, Ellipsis) -> boxes, and their text form.  Pure.

:func:`parse` turns a ``__getitem__`` key into a :class:`Selection` (a box,
the axes an integer index removes, per-axis steps); :func:`parse_text` turns
the text form of a key (``'0:4,:,7'``, as ``lamina dump --select`` and query
regions take it) into such a key.

Unlike numpy, a slice that reaches past a dimension is an error rather than
silently clipped: in parallel I/O a box that does not fit is almost always a
decomposition bug, and a clear error beats a short read.
"""

from __future__ import annotations

import numbers
import operator
import re
from dataclasses import dataclass

import numpy as np

from .errors import BoundsError, SelectionError
from .geometry import Box


@dataclass(frozen=True, slots=True)
class Selection:
    """A parsed selection: the box to move, the axes an int index removes, per-axis steps."""

    box: Box
    squeeze: tuple[int, ...]
    steps: tuple[int, ...]

    @property
    def strided(self) -> bool:
        return any(s != 1 for s in self.steps)

    @property
    def result_shape(self) -> tuple[int, ...]:
        shape = []
        for d, (n, s) in enumerate(zip(self.box.shape, self.steps, strict=True)):
            if d in self.squeeze:
                continue
            shape.append(-(-n // s) if n else 0)
        return tuple(shape)


def parse(key, shape: tuple[int, ...], what: str = "dataset") -> Selection:
    """Parse a ``__getitem__`` key against *shape*; *what* names the dataset in errors."""
    # the common keys first, without the general loop (a put of a small block is about 5 us
    # of Python in all: the general parse took as much): the whole dataset ('...', ':'), and
    # slices with Python int bounds, one per dimension
    if key is Ellipsis or (
        type(key) is slice
        and key.start is None
        and key.stop is None
        and key.step is None
        and len(shape)
    ):
        nd = len(shape)
        return Selection(Box((0,) * nd, tuple(shape)), (), (1,) * nd)
    quick = _slices(key, shape)
    if quick is not None:
        return quick
    return _parse(key, shape, what)


@dataclass(frozen=True, slots=True)
class Vector:
    """A read selection with one list of indices or boolean mask (numpy's advanced indexing
    with one index vector, as h5py allows): *key* is the rest, basic (the vector's axes a
    full slice each); *axis* the first of the dataset axes the vector takes (one for a list
    or a 1-D mask, ``len(points)`` for an N-D mask); *points* the positions it selects, one
    int64 array per axis it takes; *front*: numpy puts the result's vector axis first (the
    vector and the integer indices are not side by side)."""

    key: tuple
    axis: int
    points: tuple[np.ndarray, ...]
    front: bool


def _is_vector(k) -> bool:
    """Whether *k*, an item of a key, is a list of indices or a mask, as numpy takes it: a
    list, tuple or range, or an array of at least one dimension (a subclass, such as a
    memory map or a masked array, or anything numpy makes one of: an xarray DataArray)."""
    if isinstance(k, list | tuple | range):
        return True
    if isinstance(k, np.ndarray):
        return k.ndim >= 1
    return hasattr(k, "__array__") and not isinstance(k, np.generic) and np.ndim(k) >= 1


def _int_array(k) -> bool:
    """Whether *k* is a 0-d integer array (numpy takes it as an integer index)."""
    return isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype.kind in "iu"


def vector(key, shape: tuple[int, ...], what: str = "dataset") -> Vector | None:
    """The :class:`Vector` of a read key holding a list of indices or a boolean mask, else
    None (the key is basic: :func:`parse`).  As numpy: indices may repeat, come in any order
    and count from the end; a 1-D boolean mask picks along one axis and must have its
    length, an N-D one (first in the key) picks along N axes and gives them as one.  As
    h5py: one vector a selection, and a 1-D one (SelectionError otherwise)."""
    if not isinstance(key, tuple):
        key = (key,)
    vecs = [i for i, k in enumerate(key) if _is_vector(k)]
    if not vecs:
        return None
    if len(vecs) > 1:
        raise SelectionError(
            f"{what}: one list of indices or boolean mask per selection (as h5py), got "
            f"{len(vecs)} (items {', '.join(str(i) for i in vecs)})"
        )
    i = vecs[0]
    arr = np.asarray(key[i])
    if arr.dtype.kind == "b":
        points = np.nonzero(arr)
    elif arr.size == 0 and arr.dtype.kind == "f":  # [] is a float array to numpy, and an index
        points = (arr.astype(np.int64),)
    elif arr.dtype.kind in "iu":
        points = (arr,)  # (to int64 once in bounds: np.uint64(2**64 - 1) is not -1)
    else:
        raise SelectionError(
            f"{what}: item {i} of the selection is a list of {arr.dtype} values; indices are integers "
            "(or booleans, a mask)"
        )
    if arr.dtype.kind != "b" and arr.ndim != 1:
        raise SelectionError(
            f"{what}: item {i} of the selection is a {arr.ndim}-D array of indices; lamina takes a "
            "1-D list (h5py too)"
        )
    if arr.dtype.kind == "b" and arr.ndim > 1 and i != 0:
        raise SelectionError(
            f"{what}: a {arr.ndim}-D boolean mask must come first in the selection, it is item {i}"
        )
    # the rest of the key, one entry per dimension: a full slice on each axis the vector
    # takes, the first marked to find where the Ellipsis put it
    full = _whole(
        key[:i] + (_VECTOR,) + (slice(None),) * (arr.ndim - 1) + key[i + 1 :], shape, what
    )
    axis = next(d for d, k in enumerate(full) if k is _VECTOR)
    full = full[:axis] + (slice(None),) + full[axis + 1 :]
    for j, p in enumerate(points):
        n = shape[axis + j]
        if arr.dtype.kind == "b":
            if arr.shape[j] != n:
                raise BoundsError(
                    f"{what}: boolean mask of shape {arr.shape} does not match dimension {axis + j} "
                    f"of size {n} (shape {shape})"
                )
            continue
        bad = (p >= n) if p.dtype.kind == "u" else (p < -n) | (p >= n)
        if bad.any():
            raise BoundsError(
                f"{what}: index {int(p[bad][0])} is out of bounds for dimension {axis + j} of size "
                f"{n} (shape {shape})"
            )
    if arr.dtype.kind != "b":
        n = shape[axis]
        p = points[0].astype(np.int64)
        points = (np.where(p < 0, p + n, p),)
    # numpy: integer indices are advanced too; apart from the vector, its axis goes first.
    # Apart in the key as written: an Ellipsis between them parts them, even one that
    # stands for no axis (a[:, 0, ..., [0, 1]] of 3 axes), as a slice does
    adv = [j for j, k in enumerate(key) if j == i or not (k is Ellipsis or isinstance(k, slice))]
    front = len(adv) > 1 and adv[-1] - adv[0] + 1 != len(adv)
    return Vector(tuple(full), axis, tuple(points), front)


#: where a vector lies in its key while :func:`_whole` places the key's Ellipsis
_VECTOR = object()


def _whole(key: tuple, shape: tuple[int, ...], what: str) -> tuple:
    """*key* with one entry per dimension: its Ellipsis expanded, full slices added at the end;
    np.newaxis, a boolean scalar (numpy adds an axis for either: refused before indices are
    counted), two ellipses and too many indices refused."""
    if any(k is None for k in key):
        raise SelectionError(
            f"{what}: np.newaxis (None) is not supported in a selection; add the axis to the "
            "array read (a[None])"
        )
    for k in key:
        if isinstance(k, bool | np.bool_) or (
            isinstance(k, np.ndarray) and k.ndim == 0 and k.dtype == bool
        ):
            raise SelectionError(
                f"{what}: unsupported index {k!r}; a boolean scalar adds an axis in numpy "
                "(a[None] of the array read does that)"
            )
    nd = len(shape)
    n_ell = sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise SelectionError(f"{what}: an index can only have a single ellipsis ('...')")
    if n_ell:
        i = next(j for j, k in enumerate(key) if k is Ellipsis)
        fill = nd - (len(key) - 1)
        if fill < 0:
            raise BoundsError(f"{what}: too many indices ({len(key) - 1}) for {nd} dimensions")
        key = key[:i] + (slice(None),) * fill + key[i + 1 :]
    if len(key) > nd:
        raise BoundsError(
            f"{what}: too many indices ({len(key)}) for {nd} dimensions (shape {shape})"
        )
    return key + (slice(None),) * (nd - len(key))


def _parse(key, shape: tuple[int, ...], what: str) -> Selection:
    """:func:`parse` of any key, the general way."""
    key = _whole(key if isinstance(key, tuple) else (key,), shape, what)
    # a 0-d integer array is an integer index, as numpy takes it
    key = tuple(int(k) if _int_array(k) else k for k in key)
    start, stop, squeeze, steps = [], [], [], []
    for d, (k, n) in enumerate(zip(key, shape, strict=True)):
        if isinstance(k, (numbers.Integral,)) and not isinstance(k, bool):
            i = int(k)
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise BoundsError(
                    f"{what}: index {i} is out of bounds for dimension {d} of size {n} (shape {shape})"
                )
            start.append(j)
            stop.append(j + 1)
            squeeze.append(d)
            steps.append(1)
        elif isinstance(k, slice):
            st = 1 if k.step is None else k.step
            if not isinstance(st, numbers.Integral) or st <= 0:
                raise SelectionError(
                    f"{what}: slice step must be a positive integer, got {k.step!r} in dimension {d}"
                )
            a = slice_bound(k.start, 0, n, d, what, shape)
            b = slice_bound(k.stop, n, n, d, what, shape)
            b = max(a, b)
            start.append(a)
            stop.append(b)
            steps.append(int(st))
        else:
            also = " (lists of indices and boolean masks: reads only)" if _is_vector(k) else ""
            raise SelectionError(
                f"{what}: unsupported index {k!r} in dimension {d}; use ints, slices and '...'{also}"
            )
    return Selection(Box(tuple(start), tuple(stop)), tuple(squeeze), tuple(steps))


def _slices(key, shape: tuple[int, ...]) -> Selection | None:
    """The selection of *key* if it is a slice or a tuple of slices, one per dimension, whose
    bounds are None or Python ints within their dimensions and whose steps are None or 1;
    otherwise None (:func:`parse` then takes it the general way, with its errors)."""
    if type(key) is slice:
        key = (key,)
    elif type(key) is not tuple:
        return None
    if len(key) != len(shape):
        return None
    start, stop = [], []
    for k, n in zip(key, shape, strict=True):
        if type(k) is not slice or not (k.step is None or (type(k.step) is int and k.step == 1)):
            return None
        a, b = k.start, k.stop
        if a is None:
            a = 0
        elif type(a) is not int or not -n <= a <= n:
            return None
        elif a < 0:
            a += n
        if b is None:
            b = n
        elif type(b) is not int or not -n <= b <= n:
            return None
        elif b < 0:
            b += n
        start.append(a)
        stop.append(b if b > a else a)
    nd = len(shape)
    return Selection(Box(tuple(start), tuple(stop)), (), (1,) * nd)


def slice_bound(v, default: int, n: int, d: int, what: str, shape) -> int:
    """Bound *v* of a slice of dimension *d* (size *n*) as an index 0..n (*default* for None,
    negative from the end); SelectionError if not an integer, BoundsError past either end."""
    if v is None:
        return default
    if isinstance(v, bool | np.bool_) or not (
        isinstance(v, numbers.Integral) or (isinstance(v, np.ndarray) and v.ndim == 0)
    ):
        raise SelectionError(f"{what}: slice bounds must be integers, got {v!r} in dimension {d}")
    try:
        v = operator.index(v)  # (a 0-D integer array as numpy takes it; a 0-D float is not)
    except TypeError:
        raise SelectionError(
            f"{what}: slice bounds must be integers, got {v!r} in dimension {d}"
        ) from None
    j = v + n if v < 0 else v
    if not 0 <= j <= n:
        raise BoundsError(
            f"{what}: slice bound {v} is out of bounds for dimension {d} of size {n} (shape {tuple(shape)})"
        )
    return j


_INT = re.compile(r"[+-]?\d{1,19}")


def parse_text(text: str) -> tuple:
    """Parse a selection string like ``'0:4,:,7'`` or ``'...,-1'`` into ints, slices and Ellipsis.

    No ``eval``: the string is split at commas; each item is an int, ``...``,
    or a slice ``a:b`` / ``a:b:c`` with optional int parts.  Surrounding
    brackets are allowed; an empty string selects everything.  Raises
    :class:`~lamina.errors.SelectionError` naming the bad item.
    """
    if not isinstance(text, str):
        raise SelectionError(f"selection must be a string, got {type(text).__name__}")
    s = text.strip()
    if s.startswith("[") and s.endswith("]"):
        s = s[1:-1].strip()
    if s == "":
        return ()
    items = [p.strip() for p in s.split(",")]
    if len(items) > 1 and items[-1] == "":  # a trailing comma, as in numpy's a[0,]
        items.pop()
    out: list = []
    for i, item in enumerate(items, 1):
        where = f"bad selection {text!r}: item {i} ({item!r})"
        if item == "":
            raise SelectionError(f"bad selection {text!r}: item {i} is empty")
        if item == "...":
            if Ellipsis in out:
                raise SelectionError(f"bad selection {text!r}: only one '...' is allowed")
            out.append(Ellipsis)
        elif ":" in item:
            parts = [p.strip() for p in item.split(":")]
            if len(parts) > 3:
                raise SelectionError(f"{where}: a slice has at most two ':' (start:stop:step)")
            vals = [None if p == "" else _int(p, where) for p in parts]
            vals += [None] * (3 - len(vals))
            if vals[2] is not None and vals[2] <= 0:
                raise SelectionError(f"{where}: the slice step must be a positive integer")
            out.append(slice(*vals))
        else:
            out.append(_int(item, where))
    return tuple(out)


def _int(tok: str, where: str) -> int:
    if not _INT.fullmatch(tok):
        raise SelectionError(f"{where}: expected an integer, a slice a:b:c or '...'")
    return int(tok)


def format_key(key: tuple) -> str:
    """The text form of a key (inverse of :func:`parse_text`): ``(slice(0, 4), 7)`` -> ``'0:4, 7'``."""
    if not key:
        return "..."
    parts = []
    for k in key:
        if k is Ellipsis:
            parts.append("...")
        elif isinstance(k, slice):
            a = "" if k.start is None else str(k.start)
            b = "" if k.stop is None else str(k.stop)
            parts.append(f"{a}:{b}" + ("" if k.step is None else f":{k.step}"))
        else:
            parts.append(str(k))
    return ", ".join(parts)
