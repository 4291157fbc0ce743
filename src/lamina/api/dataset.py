"""Datasets: N-D arrays of fixed global shape, written and read by boxes, per step."""

from __future__ import annotations

import operator

import numpy as np

from ..errors import DTypeError, RangeError, ShapeError
from ..geometry import Box
from ..selection import parse
from .attrs import Attributes

PAGE = 4096


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized array whose data starts on a page boundary.

    Copies from the page cache into a buffer that starts a few bytes into a
    page run several times slower on common x86 CPUs (4K aliasing);
    numpy's own allocations start 16 bytes in.
    """
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if n < 1 << 16:
        return np.empty(shape, dtype=dtype)
    raw = np.empty(n + PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw[start : start + n].view(dtype).reshape(shape)


class Dataset:
    """A dataset, like an h5py dataset but parallel and stepped.

    ``ds[sel] = array`` (independent) writes a box in the current step;
    ``ds[sel]`` (independent) reads a box of this view's step.
    """

    def __init__(self, file, path: str, step: int | None = None):
        self._file = file
        self._path = path
        self._step = step
        self._spec = file._engine.catalog.datasets[path]

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
    def fill(self):
        return self._spec.fill_scalar()

    @property
    def compression(self) -> tuple[dict, ...]:
        return self._spec.codecs

    @property
    def attrs(self) -> Attributes:
        return Attributes(self._file, self._path)

    @property
    def step(self) -> int | None:
        return self._step

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-D dataset")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<lamina.Dataset {self.name!r}: shape {self.shape}, dtype {self.dtype}>"

    def _repr_html_(self) -> str:
        """Jupyter: shape, dtype, steps written, blocks, sizes, compression, attributes (no data read)."""
        from .html import dataset_html

        return dataset_html(self)

    def _what(self) -> str:
        return f"dataset {self.name!r}"

    # -- reading (independent) ------------------------------------------
    def __getitem__(self, key) -> np.ndarray:
        """Independent: read a selection (ints, slices, '...') of this view's step.

        As h5py: a selection of one element gives a numpy scalar (``ds[()]``
        of a 0-D dataset too), except ``ds[...]`` of a 0-D dataset, which
        gives a 0-D array.
        """
        sel = parse(key, self.shape, self._what())
        out = self.read(sel.box)
        if sel.strided:
            out = out[tuple(slice(None, None, s) for s in sel.steps)]
        if sel.squeeze:
            out = out.reshape(sel.result_shape)
        ellipsis = key is Ellipsis or (isinstance(key, tuple) and any(k is Ellipsis for k in key))
        return out[()] if out.ndim == 0 and not (ellipsis and not self.shape) else out

    def read(
        self, box: Box | None = None, step: int | None = None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Independent: read *box* (default: everything) at *step* (default: this view's step)."""
        box = Box.from_shape(self.shape) if box is None else box
        if out is None:
            out = _aligned_empty(box.shape, self.dtype)
        step = self._step if step is None else step
        self._file._engine.get(self._path, box, step, out)
        return out

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
        """Independent: the boxes written in *step*; everything else reads as the fill value."""
        return [b.box for b in self.blocks(step)]

    # -- writing (independent) ------------------------------------------
    def __setitem__(self, key, value) -> None:
        """Independent: write *value* (broadcast to the selection) in the current step."""
        sel = parse(key, self.shape, self._what())
        if sel.strided:
            raise ShapeError(f"{self._what()}: writes need contiguous boxes (slice step 1)")
        arr = self._values(value)
        if arr.shape != sel.result_shape:
            # numpy's assignment: leading axes of length 1 may go, the rest broadcasts
            lead = 0
            while arr.ndim - lead > len(sel.result_shape) and arr.shape[lead] == 1:
                lead += 1
            try:
                arr = np.broadcast_to(arr.reshape(arr.shape[lead:]), sel.result_shape)
            except ValueError:
                raise ShapeError(
                    f"{self._what()}: cannot write an array of shape {arr.shape} to selection {sel.box} "
                    f"(shape {sel.result_shape})"
                ) from None
        self._file._engine.put(self._path, sel.box, arr.reshape(sel.box.shape), copy=True)

    def _values(self, value) -> np.ndarray:
        """*value* as an array for this dataset.

        numpy arrays and scalars keep their dtype (the engine casts within a
        kind and refuses other casts); Python numbers and lists of them are
        cast to the dataset's dtype by value, as numpy does: ``5`` fits
        uint8, ``300`` does not fit int8 (RangeError, an OverflowError).
        """
        if isinstance(value, np.ndarray | np.generic):
            return np.asarray(value)
        try:
            with np.errstate(over="raise"):
                return np.asarray(value, dtype=self.dtype)
        except OverflowError as e:
            raise RangeError(f"{self._what()} of dtype {self.dtype}: {e}") from None
        except FloatingPointError:
            raise RangeError(
                f"{self._what()}: {value!r} is beyond the range of dtype {self.dtype}"
            ) from None
        except (TypeError, ValueError) as e:
            raise DTypeError(
                f"{self._what()} of dtype {self.dtype}: cannot write {value!r} ({e})"
            ) from None

    def write(self, data, offset=None, copy: bool = True) -> None:
        """Independent: write *data* with its corner at *offset* (default: origin).

        With ``copy=False`` lamina may keep a reference to *data* until the
        step ends; do not modify it before ``end_step``.
        """
        data = self._values(data)
        if data.ndim != self.ndim:
            raise ShapeError(
                f"{self._what()}: data has {data.ndim} dimensions, dataset has {self.ndim} (shape {self.shape})"
            )
        offset = (0,) * data.ndim if offset is None else tuple(map(int, offset))
        if len(offset) != self.ndim:
            raise ShapeError(
                f"{self._what()}: offset {offset} has {len(offset)} entries, dataset has {self.ndim} dimensions"
            )
        box = Box(offset, tuple(map(operator.add, offset, data.shape)))
        self._file._engine.put(self._path, box, data, copy=copy)
