"""Attributes of files, groups and datasets (a dict-like view)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, MutableMapping

import numpy as np

from ..catalog import present_attr
from ..errors import DTypeError, ModeError, NotFoundError, RangeError, ShapeError, suggest


def _strings(values, n: int | None = None) -> bool:
    """Whether *values* is a sequence (or array) of strings only (*n* of them, if given)."""
    if isinstance(values, str | bytes) or not isinstance(values, list | tuple | np.ndarray):
        return False
    items = values.reshape(-1).tolist() if isinstance(values, np.ndarray) else list(values)
    return (n is None or len(items) == n) and all(isinstance(v, str) for v in items)


class Attributes(MutableMapping):
    """``obj.attrs``: scalars, small arrays and strings.

    Setting or deleting may be done by any subset of ranks (rank 0 alone,
    say); the change is committed with the next step or close and then seen
    on every rank.  Ranks that change one attribute in a step must leave it
    the same (else CollectiveMismatchError on every rank, naming them).
    Those of a view of a committed step (``f.at(k)``) are read-only.
    """

    def __init__(self, file, path: str, step: int | None = None):
        self._file = file
        self._path = path
        self._step = step  # the step of the view they were reached through (None: the file)

    def _d(self) -> dict:
        return self._file._engine.attrs_of(self._path)

    def _name(self, name) -> str:
        """*name* as a str (bytes decoded as UTF-8, as h5py takes them); TypeError else."""
        if isinstance(name, bytes):
            try:
                return name.decode("utf-8")
            except UnicodeDecodeError:
                pass
        elif isinstance(name, str):
            return name
        raise TypeError(f"attribute names are strings, got {name!r} on {'/' + self._path!r}")

    def __getitem__(self, name: str):
        name = self._name(name)
        d = self._d()
        if name not in d:
            raise NotFoundError(f"no attribute {name!r} on {'/' + self._path!r}.{suggest(name, d)}")
        return present_attr(d[name])

    def __setitem__(self, name: str, value) -> None:
        """Independent: set attribute *name* (committed with the next step or close)."""
        name = self._name(name)
        self._writable(f"set attribute {name!r}")
        self._file._engine.set_attr(self._path, name, value)

    def create(self, name: str, data, shape=None, dtype=None) -> None:
        """Independent: set attribute *name* to *data* made an array of *dtype* and *shape*
        (defaults: the data's), as h5py's ``create``: ``attrs.create("n", 3, dtype="i2")``.
        A shape of another size than the data's is a ShapeError (h5py: ValueError)."""
        name = self._name(name)
        if shape is None and dtype is None:
            self[name] = data
            return
        a = np.asarray(data, dtype=dtype)
        if shape is not None:
            want = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
            if math.prod(want) != a.size:
                raise ShapeError(
                    f"cannot create attribute {name!r} on {'/' + self._path!r}: shape {want} "
                    f"holds {math.prod(want)} values, the data {a.size}"
                )
            a = a.reshape(want)
        if a.dtype.kind in "US" or (a.dtype.kind == "O" and a.size and _strings(a)):
            # strings: a string, or a list of them, as attributes hold them
            if a.ndim > 1:
                raise ShapeError(
                    f"cannot create attribute {name!r} on {'/' + self._path!r}: strings are "
                    f"held as a string or a list of them, not of shape {a.shape}"
                )
            self[name] = a.tolist()
            return
        self[name] = a

    def modify(self, name: str, value) -> None:
        """Independent: set attribute *name* to *value* keeping the dtype and shape of the
        value it has (a new one is set as given), as h5py's ``modify``: *value* cast to that
        dtype as numpy casts (a Python number or list is made an array of it directly), a
        1-element value fits a 1-element attribute of either shape; another shape is a
        ShapeError (h5py: TypeError).  A string attribute takes the value as given."""
        name = self._name(name)
        if name not in self._d():
            self[name] = value
            return
        old = self[name]
        if isinstance(old, str) or (
            isinstance(old, np.ndarray) and old.dtype.kind == "O" and _strings(old)
        ):  # strings stay strings, as many as there are (h5py cannot convert numbers to them)
            fits = isinstance(value, str) if isinstance(old, str) else _strings(value, old.size)
            if not fits:
                what = "a string" if isinstance(old, str) else f"a list of {old.size} strings"
                raise DTypeError(
                    f"cannot modify attribute {name!r} on {'/' + self._path!r}: it holds "
                    f"{what}, the value is {value!r}"
                )
            self[name] = value if isinstance(value, str) else [str(v) for v in value]
            return
        if not isinstance(old, np.ndarray | np.generic) or old.dtype.kind not in "biufc":
            self[name] = value
            return
        if isinstance(value, str | bytes) or (
            isinstance(value, np.ndarray | list | tuple) and np.asarray(value).dtype.kind in "USO"
        ):  # (numpy parses '5' into 5, and 'x' is its bare ValueError)
            raise DTypeError(
                f"cannot modify attribute {name!r} on {'/' + self._path!r}: it holds numbers "
                f"({old.dtype}), the value is {value!r}"
            )
        try:
            a = np.asarray(value, dtype=None if isinstance(value, np.ndarray) else old.dtype)
        except OverflowError:  # a Python number beyond the dtype's range, as a write says it
            raise RangeError(
                f"cannot modify attribute {name!r} on {'/' + self._path!r}: {value!r} is beyond "
                f"the range of its dtype {old.dtype}"
            ) from None
        if a.shape != old.shape and not (a.size == 1 and old.size == 1):
            raise ShapeError(
                f"cannot modify attribute {name!r} on {'/' + self._path!r}: it has shape "
                f"{old.shape}, the value {a.shape}"
            )
        self[name] = a.astype(old.dtype, copy=False).reshape(old.shape)

    def __delitem__(self, name: str) -> None:
        """Independent: delete attribute *name* (committed with the next step or close)."""
        name = self._name(name)
        self._writable(f"delete attribute {name!r}")
        self._file._engine.del_attr(self._path, name)

    def _writable(self, what: str) -> None:
        if self._step is not None:
            raise ModeError(
                f"cannot {what} on {'/' + self._path!r}: seen at committed step {self._step} "
                f"(f.at({self._step}), a step of iter_steps), read-only; set attributes "
                "through the file (f.attrs, f[name].attrs)"
            )

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._d()))

    def __len__(self) -> int:
        return len(self._d())

    def __repr__(self) -> str:
        return f"<Attributes of {'/' + self._path!r}: {sorted(self._d())}>"
