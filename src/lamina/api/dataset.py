"""Datasets: N-D arrays of fixed global shape, written and read by boxes, per step."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from .. import buffers
from .. import comm as comm_mod
from ..engines.base import step_number
from ..errors import (
    BoundsError,
    CollectiveMismatchError,
    ConfigError,
    DTypeError,
    ModeError,
    RangeError,
    SelectionError,
    ShapeError,
    StepError,
    error_from_wire,
    error_to_wire,
    mark_collective,
)
from ..geometry import Box, as_int, box_of
from ..layouts import read as layout_read
from ..layouts.spec import Layout, Multires
from ..selection import Vector, parse, slice_bound, vector
from ..stats import crc
from .attrs import Attributes


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized array whose data starts on a page boundary (:mod:`lamina.buffers`:
    copies from the page cache run several times slower into memory a few bytes into a
    page, where numpy's own allocations start)."""
    n = math.prod(shape) * dtype.itemsize
    if n < buffers.PLACED_MIN:  # numpy's own: an array that owns its memory, as numpy gives
        return np.empty(shape, dtype=dtype)
    return buffers.empty(n).view(dtype).reshape(shape)


#: the most bytes of a stepped selection's span (``ds[::k]``) read at once: the span is read
#: in pieces of about this size and only the selected elements kept
STRIDED_PIECE = 64 << 20
#: the least bytes of one index of a stepped first axis read straight into the result (a
#: checksum segment, stats.SEGMENT: a read of less reads and checks the whole segment)
STRIDED_DIRECT = 4 << 20


def _strided(read, box: Box, steps: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``read(box)[::steps]`` (``read(box, out)`` fills *out*), reading at most about
    :data:`STRIDED_PIECE` bytes at once, each piece into one buffer used again (into a new
    buffer a piece paid a page fault every 4 KiB: 7.2 against 3.8 ms for 15.5 MiB): the
    box is cut along its first axis longer than one into pieces of whole steps (and a
    piece of one index still too large along the next axis, and so on)."""
    # (placed on a page: copies from the page cache run several times slower a few bytes in)
    out = _aligned_empty(tuple(-(-n // s) for n, s in zip(box.shape, steps, strict=True)), dtype)
    _fill_strided(read, box, steps, out, [])
    return out


def _fill_strided(read, box: Box, steps: tuple[int, ...], out: np.ndarray, scratch: list) -> None:
    """*out* = ``read(box)[::steps]``, a piece at a time (:func:`_strided`); *scratch* holds
    the pieces' buffer.  A box strided along no axis it is longer than one on is read into
    *out* as it is; so is each index of a stepped first axis whose indices are at least
    :data:`STRIDED_DIRECT` bytes apiece (``ds[::2]``: half the bytes read, no copy)."""
    shape = box.shape
    if all(st == 1 or m <= 1 for st, m in zip(steps, shape, strict=True)):
        read(box, out)  # (of the box's shape: every extent selected whole)
        return
    n = math.prod(shape)
    if n * out.itemsize <= STRIDED_PIECE:
        if not scratch or scratch[0].size < n:
            scratch[:] = [_aligned_empty((n,), out.dtype)]  # (pages: copies from the cache)
        piece = scratch[0][:n].reshape(shape)
        read(box, piece)
        out[...] = piece[tuple(slice(None, None, st) for st in steps)]
        return
    ax = next(d for d, m in enumerate(shape) if m > 1)
    st = steps[ax]
    slab = n // shape[ax] * out.itemsize  # the bytes of one index along ax
    if st > 1 and slab >= STRIDED_DIRECT and all(x == 1 for x in steps[ax + 1 :]):
        per = 1  # each selected index read where it goes
    else:
        per = max(1, STRIDED_PIECE // (slab * st))  # selected indices a piece
    for j in range(0, out.shape[ax], per):
        lo = box.start[ax] + j * st
        hi = min(lo + (per - 1) * st + 1, box.stop[ax])
        sub = Box(
            box.start[:ax] + (lo,) + box.start[ax + 1 :], box.stop[:ax] + (hi,) + box.stop[ax + 1 :]
        )
        _fill_strided(read, sub, steps, out[(slice(None),) * ax + (slice(j, j + per),)], scratch)


def _select(key, shape: tuple[int, ...], what: str, read, dtype: np.dtype) -> np.ndarray:
    """A numpy-style selection *key* of an array of *shape* and *dtype*, read with
    ``read(box, out)`` (*out* None: a new array).

    A stepped selection (``ds[::k]``) is read a piece at a time and its result owns its
    memory, as h5py's does: a view of the whole span read at once held every byte of it
    for as long as the program kept a few selected values."""
    vec = vector(key, shape, what)
    if vec is not None:
        return _select_vector(vec, shape, what, read, dtype)
    sel = parse(key, shape, what)
    if sel.strided:
        out = _strided(read, sel.box, sel.steps, dtype)
    else:
        out = read(sel.box, None)
    if sel.squeeze:
        out = out.reshape(sel.result_shape)
    ellipsis = key is Ellipsis or (isinstance(key, tuple) and any(k is Ellipsis for k in key))
    return out[()] if out.ndim == 0 and not (ellipsis and not shape) else out


#: a list of indices is read in runs; rows between two runs closer than this many bytes are
#: read with them rather than apart (a read costs about what 256 KiB more of a block does);
#: a run spans at most STRIDED_PIECE bytes
VECTOR_GAP = 256 << 10


def _runs(uniq: np.ndarray, gap: int, span: int) -> list[np.ndarray]:
    """Sorted distinct positions *uniq* cut into runs read at once: apart where two are more
    than *gap* apart, and a run spanning at most *span* positions (a read of evenly spread
    indices took the whole span at once: twice the dataset's memory for 1e5 of 1e7)."""
    if not uniq.size:
        return [uniq]
    out = []
    for run in np.split(uniq, np.flatnonzero(np.diff(uniq) > gap) + 1):
        while int(run[-1]) - int(run[0]) >= span:
            k = int(np.searchsorted(run, run[0] + span))
            out.append(run[:k])
            run = run[k:]
        out.append(run)
    return out


def _select_vector(vec: Vector, shape: tuple[int, ...], what: str, read, dtype: np.dtype):
    """:func:`_select` of a key with a list of indices or a boolean mask (:class:`Vector`):
    the positions it takes are read as boxes, a run of them at a time (a mask of several
    axes: the box around its true elements), and picked out as numpy would."""
    ax, pts = vec.axis, vec.points
    # where the vector's axis lies in a basic read's result: after the axes before it that
    # an integer index does not remove
    pos = sum(1 for k in vec.key[:ax] if isinstance(k, slice))

    def with_axes(parts: tuple[slice, ...]) -> np.ndarray:
        return _select(vec.key[:ax] + parts + vec.key[ax + len(parts) :], shape, what, read, dtype)

    if len(pts) > 1:  # a mask of several axes, first in the key (pos 0)
        lo = [int(p.min()) if p.size else 0 for p in pts]
        hi = [int(p.max()) + 1 if p.size else 0 for p in pts]
        sub = with_axes(tuple(slice(a, b) for a, b in zip(lo, hi, strict=True)))
        out = sub[tuple(p - a for p, a in zip(pts, lo, strict=True))]
    else:
        idx = pts[0]
        uniq, inv = np.unique(idx, return_inverse=True)
        one = slice(0, min(1, shape[ax]))  # (an axis of size 0 has no row)
        row = parse(vec.key[:ax] + (one,) + vec.key[ax + 1 :], shape, what).box.size
        row_bytes = max(1, row * dtype.itemsize)
        gap = max(1, VECTOR_GAP // row_bytes)
        span = max(1, STRIDED_PIECE // row_bytes)  # rows a read may span
        parts = []
        for run in _runs(uniq, gap, span):
            a, b = (int(run[0]), int(run[-1]) + 1) if run.size else (0, 0)
            sub = with_axes((slice(a, b),))
            parts.append(sub if b - a == run.size else np.take(sub, run - a, axis=pos))
        # (concatenate makes big-endian parts native: the dataset's dtype, as numpy and h5py give)
        out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=pos, dtype=parts[0].dtype)
        if uniq.size != idx.size or not np.array_equal(uniq, idx):
            out = np.take(out, inv.reshape(-1), axis=pos)
    return np.moveaxis(out, pos, 0) if vec.front and pos else out


#: what the agreements of a collective read carry: a key of the dataset, step and level below
#: _KEY, or above it a rank's refusal of its arguments (:func:`_refusal`); the largest wins
_KEY = (1 << 31) - 1
#: ranks a refusal names (the lowest refusing one wins; higher ones are said as this one)
_RANKS = (1 << 22) - 1
#: the errors a refusal is raised as on the other ranks, by wire name (errors.error_to_wire)
_REFUSALS = (
    "RemoteError",
    "Remote:TypeError",
    "Remote:ValueError",
    "Remote:IndexError",
    "Remote:OverflowError",
    "Remote:MemoryError",
    "BoundsError",
    "SelectionError",
    "ShapeError",
    "DTypeError",
    "RangeError",
    "StepError",
    "ModeError",
    "ConfigError",
    "NotFoundError",
)


def _refusal(error: BaseException, rank: int) -> int:
    """The flag of rank *rank*'s refusal *error*, for an agreement: above any key, larger
    for a lower rank, its class in the low byte (those beyond :data:`_REFUSALS` said as
    RemoteError).  Below 2**32, as the background layer's agreements need."""
    name = error_to_wire(error)[0]
    code = _REFUSALS.index(name) if name in _REFUSALS else 0
    return _KEY + 1 + ((_RANKS - min(rank, _RANKS)) << 8) + code


def _refused_on(flag: int, what: str) -> BaseException:
    """The error a rank raises for another rank's refusal, *flag* (:func:`_refusal`)."""
    v = flag - _KEY - 1
    rank, name = _RANKS - (v >> 8), _REFUSALS[v & 0xFF]
    said = name.removeprefix("Remote:")
    who = f"rank {rank}" if rank < _RANKS else f"a rank >= {_RANKS}"  # (the field is full)
    return mark_collective(
        error_from_wire(
            name,
            f"{who} refused its arguments to {what} ({said}: see the error raised there); "
            "no rank read anything",
        )
    )


def takes_by_value(value) -> bool:
    """Whether a write casts *value* to the dataset's dtype by value (Python numbers, numpy
    scalars, lists, tuples and ranges of them, and what numpy makes of a string or None)
    rather than as an array of its own dtype: a numpy array, and an array-like that carries
    a dtype (memoryview, array.array, an xarray or pandas object), which take the same-kind
    rule."""
    return value is None or isinstance(
        value, numbers.Number | np.generic | list | tuple | range | str | bytes
    )


def cast_by_value(value, dtype: np.dtype, what: str, said: str | None = None) -> np.ndarray:
    """Python numbers and (nested) lists of them as an array of *dtype*, cast by value as
    numpy casts them: ``5`` fits uint8, ``300`` does not fit int8 (RangeError, an
    OverflowError), a string no number (DTypeError).  *what* names the dataset in the
    messages; *said* names the values (``"data "``) in the message of one beyond the
    dtype's range, which without it gives numpy's words (the one integer that does not
    fit) where numpy has them."""
    given = value
    if isinstance(value, np.generic) and value.dtype != dtype:
        # one numpy value (np.int64(5), np.float64(2.0)): by value, as the Python number it
        # holds and as numpy assigns it (an array cast would wrap np.int64(300) into int8)
        value = value.item()
        if isinstance(value, np.generic):  # a long double: no Python number holds it
            if np.iscomplexobj(value):
                value = complex(value)  # (into a real dtype: refused as a Python complex is)
            elif dtype.kind == "b":
                value = bool(value)  # nonzero (0.5 included) is True, as numpy casts it
            elif dtype.kind in "iu" and np.isfinite(value):
                value = int(value)  # truncated and range-checked as a Python float is
            elif dtype.kind in "iu":
                value = float(value)  # NaN or an infinity: no integer, as for a Python float
    try:
        with np.errstate(over="raise"):
            return np.asarray(value, dtype=dtype)
    except OverflowError as e:
        if said is None:
            raise RangeError(f"{what} of dtype {dtype}: {e}") from None
        raise RangeError(f"{what}: {said}{given!r} is beyond the range of dtype {dtype}") from None
    except FloatingPointError:
        raise RangeError(
            f"{what}: {said or ''}{given!r} is beyond the range of dtype {dtype}"
        ) from None
    except (TypeError, ValueError) as e:
        if isinstance(value, list | tuple):
            try:  # (numpy's ValueError without a dtype: rows of different lengths)
                np.asarray(value)
            except ValueError:
                # (a ValueError in numpy and h5py: a ShapeError, as create_dataset's data)
                raise ShapeError(
                    f"{what}: the value is not an array of one shape (numpy: {e})"
                ) from None
        raise DTypeError(f"{what} of dtype {dtype}: cannot write {given!r} ({e})") from None


class OpenFileView:
    """What a file, group or dataset is to pickle and copy: a view of an open file.  Pickling
    or deep-copying one is a TypeError saying so, as h5py's; its copy is the same view."""

    def __reduce_ex__(self, protocol):
        what = f"{type(self).__name__} {self.name!r} of {self.file.filename!r}"  # type: ignore[attr-defined]
        raise TypeError(
            f"{what} cannot be pickled or deep-copied: it is a view of an open file (pass the "
            "path and open it again, or the values read)"
        )

    def __copy__(self):
        return self


class LevelView:
    """One level of a dataset (:meth:`Dataset.level`): shape, dtype and numpy-style reads."""

    def __init__(self, ds: Dataset, level: int) -> None:
        self.dataset = ds
        self.level = level

    @property
    def shape(self) -> tuple[int, ...]:
        return self.dataset.levels[self.level]

    @property
    def dtype(self) -> np.dtype:
        return self.dataset.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"<lamina level {self.level} of {self.dataset.name!r}: shape {self.shape}, dtype {self.dtype}>"

    def __getitem__(self, key) -> np.ndarray:
        """Independent: a selection in this level's coordinates."""
        at = f" at level {self.level}" if self.level else ""  # (level 0: the dataset's own)
        what = f"{self.dataset._what()}{at}"
        return _select(
            key,
            self.shape,
            what,
            lambda box, out: self.dataset.read(box, out=out, level=self.level),
            self.dataset.dtype,
        )

    def __iter__(self):
        return _rows(self, f"level {self.level} of {self.dataset._what()}")

    def __array__(self, dtype=None, copy=None):
        if copy is False:  # (as the dataset's own)
            raise ValueError(
                f"{self.dataset._what()}: np.array(ds.level(k), copy=False) cannot avoid a copy"
            )
        out = self[...]
        return out if dtype is None else out.astype(dtype)


def _rows(view, what: str):
    """The rows of *view* along its first axis, each read when reached (as h5py iterates); a
    0-D view has none (TypeError).  Without an ``__iter__`` Python indexes until an
    IndexError, which a missing step (StepError) and a 0-D view's index (BoundsError) are
    too: iteration gave [] instead of the error."""
    if not view.shape:
        raise TypeError(f"{what}: cannot iterate over a 0-D dataset")
    return (view[i] for i in range(view.shape[0]))


class AsType:
    """``ds.astype(dtype)``: reads of *ds* cast to *dtype* (``[sel]``, ``len``, numpy's
    ``__array__``), as h5py's ``AstypeWrapper``."""

    def __init__(self, ds: Dataset, dtype) -> None:
        try:
            dt = np.dtype(dtype)
        except TypeError as e:
            raise DTypeError(f"{ds._what()}: astype({dtype!r}) is not a dtype: {e}") from None
        if dt.kind not in "biufc":
            raise DTypeError(
                f"{ds._what()}: astype({dt}): values are read as numeric scalars "
                "(bool, int, uint, float, complex)"
            )
        self._ds, self.dtype = ds, dt

    @property
    def shape(self) -> tuple[int, ...]:
        return self._ds.shape

    @property
    def ndim(self) -> int:
        return self._ds.ndim

    @property
    def size(self) -> int:
        return self._ds.size

    def __getitem__(self, key):
        return self._ds[key].astype(self.dtype)

    def __len__(self) -> int:
        return len(self._ds)

    def __iter__(self):
        return _rows(self, f"{self._ds._what()} as {self.dtype}")

    def __repr__(self) -> str:
        return f"<lamina.AsType of {self._ds!r} as {self.dtype}>"

    def __array__(self, dtype=None, copy=None):
        if copy is False:  # (as the dataset's own)
            raise ValueError(
                f"{self._ds._what()}: np.array(ds.astype(...), copy=False) cannot avoid a copy"
            )
        a = self._ds.read().astype(self.dtype, copy=False)
        return a if dtype is None else a.astype(dtype, copy=False)


class Dataset(OpenFileView):
    """A dataset, like an h5py dataset but parallel and stepped.

    ``ds[sel] = array`` (independent) writes a box in the current step;
    ``ds[sel]`` (independent) reads a box of this view's step.
    """

    def __init__(self, file, path: str, step: int | None = None):
        self._file = file
        self._path = path
        self._step = step
        self._spec = file._engine.catalog.datasets[path]
        self._whole: Box | None = None  # the box of everything, made at the first read of it

    # -- description ----------------------------------------------------
    @property
    def name(self) -> str:
        return "/" + self._path

    @property
    def file(self):
        return self._file

    @property
    def shape(self) -> tuple[int, ...]:
        return self._spec.shape

    @property
    def dtype(self) -> np.dtype:
        return self._spec.dtype

    @property
    def ndim(self) -> int:
        return len(self._spec.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self._spec.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes of the values at one step, uncompressed (``size * itemsize``, as h5py's and
        numpy's ``nbytes``); what a step stores is in ``lamina info``."""
        return self.size * self.dtype.itemsize

    @property
    def maxshape(self) -> tuple[int, ...]:
        """The shape: a dataset's shape is fixed (as h5py gives it for a dataset made without
        ``maxshape``); time goes into steps."""
        return self._spec.shape

    @property
    def parent(self):
        """The group holding this dataset, at this view's step (as h5py's ``parent``)."""
        from .group import Group

        return Group(self._file, self._path.rpartition("/")[0], self._step)

    @property
    def fill(self):
        return self._spec.fill_scalar()

    @property
    def compression(self) -> tuple[dict, ...]:
        return self._spec.codecs

    @property
    def attrs(self) -> Attributes:
        return Attributes(self._file, self._path, self._step)

    @property
    def step(self) -> int | None:
        return self._step

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-D dataset")
        return self.shape[0]

    def __iter__(self):
        """Independent: the rows along the first axis, each read when reached (as h5py's);
        a 0-D dataset has none to iterate over (TypeError).  Without an ``__iter__`` Python
        indexed until an IndexError, which a missing step (StepError) is too: it gave []."""
        return _rows(self, self._what())

    def __bool__(self) -> bool:
        """Whether the file is open (as h5py's: a dataset of length 0, or 0-D, is still one)."""
        return not self._file._engine.closed

    def __repr__(self) -> str:
        return f"<lamina.Dataset {self.name!r}: shape {self.shape}, dtype {self.dtype}>"

    def __eq__(self, other) -> bool:
        """The same dataset of the same open file, at the same step (as h5py compares them:
        ``f["d"] == f["d"]``; a view at another step, ``f.at(k)["d"]``, is another)."""
        if not isinstance(other, Dataset):
            return NotImplemented
        return other._file is self._file and (other._path, other._step) == (self._path, self._step)

    def __hash__(self) -> int:
        return hash((id(self._file), self._path, self._step))

    def _repr_html_(self) -> str:
        """Jupyter: shape, dtype, steps written, blocks, sizes, compression, attributes (no data read)."""
        from .html import dataset_html

        return dataset_html(self)

    def _what(self) -> str:
        return f"dataset {self.name!r}"

    # -- reading (independent) ------------------------------------------
    def __getitem__(self, key) -> np.ndarray:
        """Independent: read a selection (ints, slices, '...', and one list of indices or
        boolean mask, as h5py) of this view's step.

        As h5py: a selection of one element gives a numpy scalar (``ds[()]``
        of a 0-D dataset too), except ``ds[...]`` of a 0-D dataset, which
        gives a 0-D array.
        """
        return _select(
            key, self.shape, self._what(), lambda box, out: self.read(box, out=out), self.dtype
        )

    def read_direct(self, dest: np.ndarray, source_sel=None, dest_sel=None) -> None:
        """Independent: read selection *source_sel* of this view's step (default everything;
        as ``ds[...]`` takes it, or a :class:`~lamina.Box`) into ``dest[dest_sel]`` (default
        all of *dest*; numpy's indexing, lists and masks too), as h5py's ``read_direct``:
        *dest* a writeable numpy array, the values cast to its dtype as numpy assigns them
        and broadcast to the part as numpy broadcasts (ShapeError naming both shapes where
        they do not broadcast; h5py's is a TypeError).  A box of step-1 slices read into a
        part of its shape and of the dataset's dtype goes straight into *dest*, any
        strides, no copy."""
        if not isinstance(dest, np.ndarray):
            raise TypeError(
                f"read_direct() of {self._what()}: dest must be a numpy array, "
                f"not {type(dest).__name__}"
            )
        if not dest.flags.writeable:
            raise ValueError(f"read_direct() of {self._what()}: dest is read-only")
        where: tuple = (...,)
        if dest_sel is not None:  # (an Ellipsis kept last: integers alone give a 0-D view)
            where = np.index_exp[dest_sel]
            if not any(k is Ellipsis for k in where):
                where = (*where, ...)
        part = dest[where]  # a view of dest, or a copy of the elements a list or mask picks
        key = ... if source_sel is None else source_sel
        box = None
        if isinstance(key, Box):  # (lamina's own box: read as read() reads it)
            box = key = self._box(key, self.shape, "read_direct")
        elif isinstance(key, tuple) and all(isinstance(k, slice) for k in key):
            if len(key) == self.ndim and all(k.step in (None, 1) for k in key):
                box = self._box(key, self.shape, "read_direct")
        elif key is ...:
            box = Box.from_shape(self.shape)
        if (
            box is not None
            and part.dtype == self.dtype
            and part.shape == box.shape
            and (part.size == 0 or np.may_share_memory(part, dest))
        ):
            self.read(box, out=part)
            return
        values = np.asarray(self.read(box) if isinstance(key, Box) else self[key])
        try:
            fits = np.broadcast_shapes(values.shape, part.shape) == part.shape
        except ValueError:
            fits = False
        if not fits:
            raise ShapeError(
                f"read_direct() of {self._what()}: the selection {key!r} has shape "
                f"{values.shape}, which does not broadcast to "
                + ("dest" if dest_sel is None else f"dest[{dest_sel!r}]")
                + f" of shape {part.shape}"
            )
        dest[where] = values

    def astype(self, dtype) -> AsType:
        """A view reading this dataset's values as *dtype* (``ds.astype(np.float64)[0:4]``,
        ``np.asarray(ds.astype(...))``), cast as numpy's ``astype`` casts, as h5py's
        ``astype``.  *dtype* must be one a dataset may hold (DTypeError otherwise)."""
        return AsType(self, dtype)

    def read(
        self,
        box: Box | None = None,
        step: int | None = None,
        out: np.ndarray | None = None,
        *,
        level: int = 0,
        tolerance: float | None = None,
        collective: bool = False,
    ) -> np.ndarray:
        """Independent: read *box* (default: everything) at *step* (default: this view's step).

        *box* is a :class:`~lamina.Box` or a tuple of slices of step 1, one per
        dimension (``np.s_[0:16, :]``; negative bounds count from the end, a bound past
        either end is a BoundsError, as in ``ds[...]``).

        With ``collective=True`` the call is collective: every rank calls it
        for the same dataset and step, each with its own *box* (possibly
        empty), and a block that several ranks need is read once, by one of
        them, and its parts sent to the others over MPI (two-phase I/O, as
        MPI-IO's collective reads): for reading with another decomposition
        than the one written.  Plain datasets only (a multiresolution one
        reads as without it).

        For a multiresolution dataset, *level* picks the resolution (0: full;
        *box* is then in that level's coordinates, see :attr:`levels`), and
        *tolerance* the error a caller accepts: no tighter than the one
        written; a looser one leaves out the bands whose largest
        coefficients (recorded per patch and band) cannot move a value by
        more than the difference, so smooth regions read fewer bytes.  The
        stored bytes the read took are in :attr:`last_read_bytes`.
        """
        if collective:
            return self._read_collective(box, step, out, level, tolerance)
        layout, level, box = self._read_args(box, level, tolerance)
        step = self._step if step is None else step
        if out is None and layout is None:
            ahead = self._file._engine.take_read_ahead(self._path, box, step)
            if ahead is not None:  # read ahead (iter_steps(prefetch=True)): no copy
                return ahead
        if out is None:
            out = _aligned_empty(box.shape, self.dtype)
        return self._read_into(self._file._engine.get, layout, box, step, out, level, tolerance)

    def _read_into(self, get, layout, box, step, out, level, tolerance) -> np.ndarray:
        """*out* filled: a plain dataset's *box* by *get* (the engine's ``get`` or
        ``get_collective``), a multiresolution one's by level (its bytes in
        :attr:`last_read_bytes`)."""
        if layout is None:
            get(self._path, box, step, out)
        else:
            self.last_read_bytes = self._file._engine.get_level(
                self._path, box, step, out, level, None, tolerance
            )
        return out

    def _read_args(
        self, box, level, tolerance, bounds: bool = True
    ) -> tuple[Layout | None, int, Box]:
        """(layout, level, box) of a read: the level and the tolerance checked, *box* as a
        :class:`Box` of that level, with *bounds* inside it (BoundsError before anything is
        allocated for it)."""
        layout, level = self._level(level)
        if layout is None and tolerance is not None:
            raise ValueError(
                f"{self._what()} is not a multiresolution dataset: a read has no tolerance"
            )
        if layout is not None:
            layout.check_read_tolerance(tolerance, self._path)
        if layout is None:
            shape = self._spec.shape
            if box is None:  # everything: the box made once
                box = self._whole
                if box is None:
                    box = self._whole = Box.from_shape(shape)
            else:
                box = self._box(box, shape, bounds=bounds)
        else:
            shape = layout.shapes(self._spec.shape)[level]
            box = Box.from_shape(shape) if box is None else self._box(box, shape, level=level)
        return layout, level, box

    def _read_collective(self, box, step, out, level, tolerance) -> np.ndarray:
        """:meth:`read` with ``collective=True``: every rank checks its arguments, then the
        ranks agree on the dataset, step and level; a rank that refused its arguments makes
        every rank raise, before anything is read or allocated."""
        # (a closed file has no communicator left to agree on: every rank raises this alike)
        self._file._open_for("read")
        layout: Layout | None = None
        g = comm_mod.Guard()
        with g:
            layout, level, box = self._read_args(box, level, tolerance, bounds=False)
            if out is None:
                if box.inside(self._spec.shape) or layout is not None:
                    out = _aligned_empty(box.shape, self.dtype)
                else:  # outside: the engine's first agreement says so on every rank
                    out = np.empty((0,) * box.ndim, dtype=self.dtype)
        step = self._step if step is None else step
        self._same_everywhere(step, level, g.error)
        engine = self._file._engine
        return self._read_into(engine.get_collective, layout, box, step, out, level, tolerance)

    def prefetch(self, box: Box | None = None, step: int | None = None) -> bool:
        """Independent: read *box* (as :meth:`read` takes it; default everything) at *step*
        (default: this view's step) ahead, on the read-ahead thread of a file opened for
        reading with ``io='async'``, while the program works; a later read of that box at that
        step (``ds.read(box, step)``, ``ds[...]``) takes it without waiting for the storage.

        Returns whether it is being read ahead: False when it would exceed the file's
        ``max_inflight_bytes`` with what is read ahead already (the later read then reads as
        usual), for a multiresolution dataset (read by level, not ahead), and for a step
        not there yet while its writer (or in situ producer) goes on, and on a file opened
        with ``io='async'`` where MPI lacks ``MPI_THREAD_MULTIPLE`` (its open warned).
        ConfigError on a file opened without read-ahead (docs/background.md); BoundsError for a box outside the dataset,
        as :meth:`read` raises it (nothing is read ahead); StepError for a step the file does
        not have.  It releases no step of an in situ consumer.
        """
        self._file._open_for("read ahead")
        bg = self._file._background()
        if bg is not None and bg.mode == "r" and bg.without_thread:
            return False  # opened with io='async' where MPI has no thread support (warned)
        if bg is None or bg.mode != "r" or not bg.asynchronous:
            raise ConfigError(
                f"{self._what()}: prefetch reads ahead on a background thread: open the file "
                "for reading with io='async' (or $LAMINA_IO=async)"
            )
        if Layout.of(self._spec) is not None:
            return False
        shape = self._spec.shape
        box = Box.from_shape(shape) if box is None else self._box(box, shape)
        return bg.prefetch(self._path, box, self._step if step is None else step)

    def _box(
        self,
        box,
        shape: tuple[int, ...],
        call: str = "read",
        bounds: bool = True,
        level: int = 0,
    ) -> Box:
        """*box* as a :class:`Box`: one already, inside *shape* (that of *level*) with
        *bounds* (BoundsError naming the dataset, the box and the shape, before anything is
        allocated for it), or a tuple of slices of step 1 (``np.s_[a:b, :]``, one per
        dimension, inside *shape*: :meth:`_slices_box`); TypeError naming *call* otherwise."""
        if isinstance(box, Box):
            if bounds and not box.inside(shape):
                at = f" at level {level}" if level else ""
                box.check_inside(shape, f"dataset {self._path!r}{at}")
            return box
        if isinstance(box, slice):
            box = (box,)
        if isinstance(box, tuple) and all(isinstance(s, slice) for s in box):
            if len(box) != len(shape):
                raise BoundsError(
                    f"{len(box)} slices for {self._what()} of {len(shape)} dimensions {shape}"
                )
            return self._slices_box(box, shape, call, level)
        raise TypeError(
            f"{call}() of {self._what()} takes a lamina.Box or a tuple of slices (np.s_[...]), "
            f"got {type(box).__name__} {box!r}"
        )

    def _slices_box(
        self, slices: tuple[slice, ...], shape: tuple[int, ...], call: str, level: int
    ) -> Box:
        """The box of *slices* (step 1, integer bounds, one per dimension of *shape*): negative
        bounds count from the end as numpy's do; a bound past either end is a BoundsError
        naming the dataset, the dimension and its size, as ``ds[...]`` gives it (a slab that
        does not fit is a decomposition bug: not clipped); TypeError naming *call* for a
        step other than 1 or a bound that is not an integer."""
        at = f" at level {level}" if level else ""
        start, stop = [], []
        for d, (s, n) in enumerate(zip(slices, shape, strict=True)):
            a = self._slice_bound(s.start, 0, n, d, shape, call, at)
            b = self._slice_bound(s.stop, n, n, d, shape, call, at)
            if not (s.step is None or (isinstance(s.step, numbers.Integral) and s.step == 1)):
                raise TypeError(
                    f"{call}() of {self._what()} takes slices of step 1 with integer bounds "
                    f"(np.s_[a:b, ...]): slice {s} has step {s.step!r}"
                )
            start.append(a)
            stop.append(max(a, b))
        return Box(tuple(start), tuple(stop))

    def _slice_bound(self, v, default: int, n: int, d: int, shape, call: str, at: str) -> int:
        """Bound *v* of a slice of dimension *d* as :func:`~lamina.selection.slice_bound`
        gives it (BoundsError past either end, as ``ds[...]``); TypeError naming *call* for
        a bound that is not an integer."""
        if v is not None and (not isinstance(v, numbers.Integral) or isinstance(v, bool)):
            raise TypeError(
                f"{call}() of {self._what()} takes slices of step 1 with integer bounds "
                f"(np.s_[a:b, ...]): bound {v!r} in dimension {d}"
            )
        return slice_bound(v, default, n, d, f"{self._what()}{at}", shape)

    def _same_everywhere(self, step, level: int, refused: BaseException | None = None) -> None:
        """Collective: CollectiveMismatchError on every rank unless all read this dataset at
        the same step and level (a collective read); where a rank *refused* its arguments,
        every rank raises (that rank its error, the others one of its class naming it)."""
        eng = self._file._engine
        bad = ""
        try:  # one step however it is named (-1 and the last step's number are the same)
            n = eng.steps
            k = n - 1 if step is None else int(step_number(step))
            at = k + n if k < 0 else k
            resolved: object = at
            if not 0 <= at < n:
                bad = f", which does not exist (the file has {n} step{'' if n == 1 else 's'})"
        except (StepError, TypeError, ValueError):
            resolved = repr(step)  # a bad step: read alone, it says what is wrong
        key = crc(f"{self._path}\0{resolved}\0{level}".encode()) & _KEY
        mine = key if refused is None else _refusal(refused, self._file.comm.rank)
        top, low = eng.agree(mine, comm_mod.CALL_READ), -eng.agree(-mine)
        if top > _KEY:
            # the lowest refusing rank's error on every rank: that rank raises its own, the
            # others (those that refused too among them) one of its class naming it
            if refused is not None and top == mine:
                raise mark_collective(refused)
            raise _refused_on(top, f"a collective read of {self._what()}")
        if top != low:
            raise mark_collective(
                CollectiveMismatchError(
                    f"{self._what()}: ranks made a collective read of different datasets, steps "
                    f"or levels (rank {self._file.comm.rank} read it at step {resolved}{bad}, "
                    f"level {level})"
                )
            )

    # -- multiresolution ----------------------------------------------------
    #: stored bytes the last read of a multiresolution dataset took (through this object)
    last_read_bytes: int = 0

    @property
    def layout(self) -> Multires | None:
        """The dataset's layout (:class:`lamina.Multires`), None for a plain dataset."""
        layout = Layout.of(self._spec)
        return None if layout is None else layout.user()

    @property
    def levels(self) -> list[tuple[int, ...]]:
        """The shape at every level, finest (0) first: ``ceil(shape / 2**k)``; one level for a plain dataset."""
        layout = Layout.of(self._spec)
        return [self.shape] if layout is None else layout.shapes(self.shape)

    def level(self, level: int) -> LevelView:
        """Level *level* as an array-like: ``ds.level(2)[0:10, :]`` reads in that level's coordinates."""
        return LevelView(self, self._level(level)[1])

    def _level(self, level) -> tuple[Layout | None, int]:
        """The layout (None: plain) and *level* checked: BoundsError naming the levels there are."""
        layout = Layout.of(self._spec)
        if layout is not None:
            return layout, layout.check_level(level, self._path)
        if level != 0:
            raise BoundsError(f"{self._what()} has one level (0); level {level} does not exist")
        return None, 0

    def stored_bytes(
        self,
        box: Box | None = None,
        level: int = 0,
        step: int | None = None,
        tolerance: float | None = None,
    ) -> int:
        """Independent: the stored bytes a read of *box* (level-*level* coordinates) at *level*
        (and *tolerance*) takes, from the catalog alone."""
        layout = Layout.of(self._spec)
        if layout is None:
            raise ValueError(f"{self._what()} is not a multiresolution dataset")
        layout.check_read_tolerance(tolerance, self._path)
        level = layout.check_level(level, self._path)
        shape = self.levels[level]
        box = (
            Box.from_shape(shape)
            if box is None
            else self._box(box, shape, "stored_bytes", level=level)
        )
        layout_read.check_box(self._spec, layout, box, level)
        eng = self._file._engine
        k = eng.check_step(self._step if step is None else step)
        return layout_read.nbytes(eng.catalog, self._spec, layout, box, k, level, tolerance)

    def progressive(self, box: Box | None = None, step: int | None = None):
        """Independent: yield ``(level, array)`` for *box* (level-0 coordinates), coarsest level first.

        Each refinement reads only the bands the coarser ones did not: all
        of them together read the bytes of one read of level 0.  A plain
        dataset yields level 0 alone.
        """
        layout = Layout.of(self._spec)
        box = (
            Box.from_shape(self.shape) if box is None else self._box(box, self.shape, "progressive")
        )
        box.check_inside(self.shape, self._what())
        if layout is None:
            yield 0, self.read(box, step)
            return
        eng = self._file._engine
        step = eng.check_step(self._step if step is None else step)
        cache: dict = {}
        total = 0
        for k in reversed(range(layout.levels)):
            part = layout_read.scale_box(box, k)
            out = _aligned_empty(part.shape, self.dtype)
            total += eng.get_level(self._path, part, step, out, k, cache)
            self.last_read_bytes = total
            yield k, out

    def __array__(self, dtype=None, copy=None):
        if copy is False:  # as h5py: reading always makes new memory, there is nothing to view
            raise ValueError(
                f"{self._what()}: np.array(ds, copy=False) cannot avoid a copy; reading makes one"
            )
        a = self.read()
        return a if dtype is None else a.astype(dtype)

    def blocks(self, step: int | None = None):
        """Independent: blocks written in *step*: box, statistics, stored size, location."""
        eng = self._file._engine
        return eng.blocks(self._path, eng.check_step(self._step if step is None else step))

    def coverage(self, step: int | None = None) -> list[Box]:
        """Independent: the boxes that hold values in *step*; everything else reads as the fill
        value.  The boxes written, or for a derived quantity those of the dataset it follows
        (its anchor): one kept as its expression has values there without blocks of its own."""
        eng = self._file._engine
        return eng.coverage(self._path, eng.check_step(self._step if step is None else step))

    # -- writing (independent) ------------------------------------------
    def __setitem__(self, key, value) -> None:
        """Independent: write *value* (broadcast to the selection) in the current step."""
        f = self._file
        if f._writing:  # the last write call never returned: an interrupt cut it short
            f._cut_short()
        f._writing = True  # until it returns (File._writing)
        try:
            if self._step is not None:
                self._read_only()
            sel = parse(key, self.shape, self._what())
            if sel.strided:
                raise ShapeError(f"{self._what()}: writes need contiguous boxes (slice step 1)")
            arr = self._values(value)
            shape = sel.box.shape
            if sel.squeeze or arr.shape != shape:  # (else the selection's shape is the box's)
                want = sel.result_shape
                if arr.shape != want:
                    # numpy's assignment: leading axes of length 1 may go, the rest broadcasts
                    lead = 0
                    while arr.ndim - lead > len(want) and arr.shape[lead] == 1:
                        lead += 1
                    try:
                        arr = np.broadcast_to(arr.reshape(arr.shape[lead:]), want)
                    except ValueError:
                        raise ShapeError(
                            f"{self._what()}: cannot write an array of shape {arr.shape} to "
                            f"selection {sel.box} (shape {want})"
                        ) from None
                arr = arr.reshape(shape)
            self._file._engine.put(self._path, sel.box, arr, copy=True)
        except Exception:  # its checks' (nothing written), or the engine's (which keeps what
            f._writing = False  # must fail the step)
            raise
        f._writing = False

    def _values(self, value) -> np.ndarray:
        """*value* as an array for this dataset.

        numpy arrays and array-likes of a dtype (a memoryview, an xarray
        DataArray: :func:`takes_by_value`) keep their dtype (the engine casts
        within a kind and refuses other casts); Python numbers, numpy scalars
        and lists of them are cast to the dataset's dtype by value, as numpy
        assigns them: ``5`` and ``np.int64(5)`` fit uint8, ``300`` does not
        fit int8 (RangeError, an OverflowError).
        """
        if isinstance(value, np.ndarray):
            # (a matrix stays 2-D under reshape: as the array it holds, leading 1s may go)
            return np.asarray(value) if isinstance(value, np.matrix) else value
        if not takes_by_value(value):  # an array-like of its own dtype, as an array
            arr = np.asarray(value)
            if arr.dtype.kind != "O":
                return arr
        # (a numpy scalar beyond the dtype is named as given: np.int64(300))
        said = "" if isinstance(value, np.generic) else None
        return cast_by_value(value, self.dtype, self._what(), said)

    def write(self, data, offset=None, copy: bool = True) -> None:
        """Independent: write *data* with its corner at *offset* (default: origin).

        With ``copy=False`` lamina may keep a reference to *data* until the
        step ends; do not modify it before ``end_step``.  A small raw block so
        lent is staged by ``end_step``, which also finds its overlaps with the
        step's other blocks of this rank (docs/api.md).
        """
        f = self._file
        if f._writing:  # as __setitem__
            f._cut_short()
        f._writing = True
        try:
            if self._step is not None:
                self._read_only()
            if not copy and type(data) is np.ndarray:
                # a block lent: kept by the engine if it can, as put would (the common case of
                # many small blocks); a corner of ints as a tuple or a list, or the origin
                start: tuple | None = None
                if type(offset) is tuple:
                    start = offset
                elif offset is None:
                    start = (0,) * len(self._spec.shape)
                elif type(offset) is list:
                    start = tuple(offset)
                if start is not None and f._engine.lend(self._path, start, data):
                    f._writing = False
                    return
            if type(data) is not np.ndarray:  # a plain array is taken as it is
                data = self._values(data)
            shape = data.shape
            nd = len(self._spec.shape)
            if len(shape) != nd:
                raise ShapeError(
                    f"{self._what()}: data has {data.ndim} dimensions, dataset has {nd} (shape {self.shape})"
                )
            offset = (0,) * nd if offset is None else self._corner(offset)
            if len(offset) != nd:
                raise ShapeError(
                    f"{self._what()}: offset {offset} has {len(offset)} entries, dataset has {nd} dimensions"
                )
            try:
                box = box_of(offset, shape)
            except BoundsError as e:
                raise BoundsError(
                    f"{self._what()} of shape {self.shape}: offset {offset}: {e}"
                ) from None
            f._engine.put(self._path, box, data, copy=copy)
        except Exception:
            f._writing = False
            raise
        f._writing = False

    def _read_only(self) -> None:
        raise ModeError(
            f"{self._what()} is seen at committed step {self._step} (f.at({self._step}), a step "
            "of iter_steps): read-only; write through the file (f[name]) in the current step"
        )

    def _corner(self, offset) -> tuple[int, ...]:
        """A write's *offset* as a tuple of ints: SelectionError for anything but a sequence
        of integers (numpy's too; a float, a string or a bool is not rounded or parsed)."""
        if isinstance(offset, str | bytes) or not isinstance(offset, Sequence | np.ndarray):
            raise SelectionError(
                f"{self._what()}: offset {offset!r} is not a sequence of integers (one per dimension)"
            )
        out = []
        for v in offset:
            try:
                out.append(as_int(v))
            except TypeError:
                raise SelectionError(
                    f"{self._what()}: offset {tuple(offset)!r} holds {v!r}, not an integer"
                ) from None
        return tuple(out)

    def write_blocks(self, blocks, offsets, copy: bool = True) -> None:
        """Independent: write many blocks in one call, block ``k`` with its corner at ``offsets[k]``.

        *blocks*: one array of shape ``(n, *block_shape)`` (``n`` blocks of
        one shape; the fast case) or a sequence of ``n`` arrays; *offsets*:
        an ``(n, ndim)`` integer array.  The same as ``n`` calls of
        ``write(blocks[k], offset=offsets[k], copy=copy)``, except that the
        blocks are checked as a whole: a bad one (shape, dtype, bounds,
        overlap) raises, naming its position, before any block of the call
        is stored.  Small blocks given stacked cost a fraction of a
        ``write`` each (docs/api.md).
        """
        f = self._file
        if f._writing:  # as __setitem__
            f._cut_short()
        f._writing = True
        try:
            if self._step is not None:
                self._read_only()
            if not isinstance(blocks, np.ndarray):
                if isinstance(blocks, str | bytes) or not isinstance(blocks, Sequence):
                    raise TypeError(
                        f"{self._what()}: blocks must be one stacked array or a sequence of arrays, "
                        f"got {type(blocks).__name__}"
                    )
                blocks = [self._values(b) for b in blocks]
            try:
                corners = np.asarray(offsets)
            except (ValueError, TypeError):  # ragged lists of corners
                corners = None
            if corners is None or corners.ndim == 0 or corners.dtype.kind == "O":
                raise ShapeError(
                    f"{self._what()}: block offsets must be an array of shape (blocks, "
                    f"{len(self.shape)}) of integers, one corner a block; got {offsets!r:.80}"
                )
            self._file._engine.put_many(self._path, corners, blocks, copy=copy)
        except Exception:
            f._writing = False
            raise
        f._writing = False
