"""Groups: the nodes of the hierarchy, and views of the file at one step."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, ItemsView, Iterator, KeysView, ValuesView
from typing import Any

import numpy as np

from .. import codecs as codec_mod
from .. import comm as comm_mod
from ..catalog import DatasetSpec, check_dtype, normpath
from ..engines import batch
from ..engines.block import BlockEngine, RefusedSpec
from ..errors import (
    CodecError,
    DTypeError,
    ModeError,
    NotFoundError,
    RangeError,
    ShapeError,
    suggest,
)
from ..geometry import as_int
from ..layouts.spec import Multires
from ..text import plural
from .attrs import Attributes
from .dataset import OpenFileView, cast_by_value, takes_by_value


class _Keys(KeysView):
    def __repr__(self) -> str:
        return f"<KeysView {list(self)!r}>"

    def __reversed__(self):  # (as h5py's and dict's keys)
        return reversed(list(self))


class _Values(ValuesView):
    def __repr__(self) -> str:
        return f"<ValuesView {list(self)!r}>"


class _Items(ItemsView):
    def __repr__(self) -> str:
        return f"<ItemsView {list(self)!r}>"


class Group(OpenFileView):
    """A group: holds groups and datasets, like an h5py group.

    A group reached through ``File.at(k)`` reads step *k*; otherwise reads
    see the latest committed step.
    """

    def __init__(self, file, path: str, step: int | None = None):
        self._file = file
        self._path = path
        self._step = step

    # -- identity -----------------------------------------------------------
    @property
    def file(self):
        return self._file

    @property
    def name(self) -> str:
        """Absolute path, '/' for the root."""
        return "/" + self._path

    @property
    def attrs(self) -> Attributes:
        return Attributes(self._file, self._path, self._step)

    @property
    def parent(self) -> Group:
        """The group holding this one (the root's is the root), at this view's step, as h5py's."""
        return Group(self._file, self._path.rpartition("/")[0], self._step)

    @property
    def step(self) -> int | None:
        """The step this view reads (None: the latest committed step)."""
        return self._step

    def __repr__(self) -> str:
        return f"<lamina.Group {self.name!r} ({plural(len(self), 'member')})>"

    def __eq__(self, other) -> bool:
        """The same group of the same open file, at the same step, as h5py compares objects
        (``f["g"] == f["g"]``, ``f == f["/"]``)."""
        if not isinstance(other, Group):
            return NotImplemented
        return other._file is self._file and (other._path, other._step) == (self._path, self._step)

    def __hash__(self) -> int:
        return hash((id(self._file), self._path, self._step))

    def _repr_html_(self) -> str:
        """Jupyter: the tree below this group, with shapes, steps and sizes (no data read)."""
        from .html import group_html

        return group_html(self)

    # -- navigation ---------------------------------------------------------
    def _abs(self, name: str) -> str:
        """*name* as an absolute path (no leading slash).  As in h5py, '.' components name the
        group they are in and an empty name names nothing (ValueError)."""
        if name == "":
            raise ValueError("an empty name (the group itself is '.')")
        if isinstance(name, str) and "." in name:
            # absolute by its own leading '/' alone: './/x' in group 'g' is 'g/x', not '/x'
            rest = "/".join(p for p in name.split("/") if p != ".").lstrip("/")
            name = "/" + rest if name.startswith("/") else rest
        return normpath(name, self._path)

    def __delitem__(self, name: str) -> None:
        """TypeError: lamina keeps every member it defined (docs/api.md, "Differences from
        h5py"), where Python's own word would be a bare ``AttributeError: __delitem__``."""
        raise TypeError(
            f"cannot delete {name!r} from {self.name!r}: lamina does not delete or move members "
            "(a file's steps are appended, never rewritten); leave it unwritten: it reads as "
            "its fill value"
        )

    def __getitem__(self, name: str):
        from .dataset import Dataset

        if not isinstance(name, str | bytes):  # g[...], g[0]: a group holds members, not values
            raise TypeError(
                f"group {self.name!r} of {self._file.filename!r} is indexed by the name of a "
                f"member (a string), got {name!r}; a group holds no values to select"
            )
        try:
            path = self._abs(name)
        except ValueError as e:  # '..', '.', NUL: no node has such a name
            raise NotFoundError(
                f"no group or dataset {name!r} in {self._file.filename!r}: {e}"
            ) from None
        cat = self._file._engine.catalog
        kind = cat.kind_of(path)
        if kind == "dataset":
            return Dataset(self._file, path, self._step)
        if kind == "group":
            return Group(self._file, path, self._step)
        raise NotFoundError(
            f"no group or dataset {'/' + path!r} in {self._file.filename!r}.{suggest(path, cat.all_paths())}"
        )

    def get(self, name: str, default=None, getclass: bool = False):
        """The member *name*, or *default* where there is none; with *getclass* its class
        (:class:`lamina.Dataset` or :class:`lamina.Group`), as h5py's ``get``."""
        try:
            obj = self[name]
        except NotFoundError:
            return default
        return type(obj) if getclass else obj

    def __setitem__(self, name: str, value) -> None:
        """Collective: ``g[name] = array`` creates dataset *name* holding *array*, as h5py
        does (``create_dataset(name, data=array)``: the values join the current step).  A
        group or dataset assigned is a TypeError: lamina has no links."""
        from .dataset import Dataset

        if isinstance(value, Dataset | Group):
            raise TypeError(
                f"cannot make {name!r} in group {self.name!r} another name of {value.name!r}: "
                "lamina has no hard or soft links (copy the values with g[name] = ds[...])"
            )
        self.create_dataset(name, data=value)

    def __contains__(self, name: str) -> bool:
        try:
            return self._file._engine.catalog.kind_of(self._abs(name)) is not None
        except ValueError:
            return False

    def _names(self) -> list[str]:
        return self._file._engine.catalog.children(self._path)

    def keys(self) -> KeysView[str]:
        """The members' names, sorted, as a set-like view (h5py's ``KeysViewHDF5``:
        ``g.keys() - {"a"}``, ``g.keys() == {"a", "b"}``)."""
        return _Keys(self)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return self._file._engine.catalog.nchildren(self._path)

    def __bool__(self) -> bool:
        """Whether the file is open (as h5py's: a group without members is still a group)."""
        return not self._file._engine.closed

    def values(self) -> ValuesView:
        """The members, in the order of :meth:`keys` (a view, as h5py's)."""
        return _Values(self)

    def items(self) -> ItemsView:
        """(name, member) pairs, in the order of :meth:`keys` (a view, as h5py's)."""
        return _Items(self)

    def walk(self) -> Iterator[tuple[str, object]]:
        """Every group and dataset below this one, depth first: (path, object), each member
        (sorted by name) followed by everything below it.

        With a stack of the members still to visit, not a generator per level: a tree
        may be deeper than Python's recursion limit (a path has up to 2,048 parts), and
        each object passes through one generator, not one per level above it."""
        todo: list[Iterator[str]] = [iter(self.keys())]
        groups: list[Group] = [self]
        while todo:
            k = next(todo[-1], None)
            if k is None:
                todo.pop()
                groups.pop()
                continue
            obj = groups[-1][k]
            yield obj.name, obj
            if isinstance(obj, Group):
                todo.append(iter(obj.keys()))
                groups.append(obj)

    def visit(self, func: Callable[[str], Any]) -> Any:
        """``func(name)`` for every group and dataset below this one, depth first in
        :meth:`walk`'s order, *name* relative to this group (``"g/v"``), as h5py's ``visit``:
        the first value other than None that *func* returns stops the walk and is returned."""
        return self.visititems(lambda name, _obj: func(name))

    def visititems(self, func: Callable[[str, Any], Any]) -> Any:
        """``func(name, obj)`` for every group and dataset below this one, as :meth:`visit`
        (h5py's ``visititems``)."""
        cut = len(self.name.rstrip("/")) + 1  # "/g/v" below "/" is "g/v", below "/g" is "v"
        for path, obj in self.walk():
            got = func(path[cut:], obj)
            if got is not None:
                return got
        return None

    # -- creation (collective) ---------------------------------------------
    def _writable(self, what: str) -> None:
        """ModeError if this group is a view of a committed step (``f.at(k)``, a step of
        ``iter_steps``): a view reads; groups, datasets and attributes are made through the file."""
        if self._step is not None:
            raise ModeError(
                f"cannot {what}: {self.name!r} of {self._file.filename!r} is seen at committed "
                f"step {self._step} (f.at({self._step}), a step of iter_steps), read-only; "
                "create groups, datasets and attributes through the file (f, f[name])"
            )

    def create_group(self, name: str) -> Group:
        """Collective: create a group (and missing parents)."""
        self._writable(f"create group {name!r}")
        path = self._abs(name)
        self._file._engine.make_group(path)
        return Group(self._file, path, self._step)

    def require_group(self, name: str) -> Group:
        """Collective: the group *name*, created if missing (a view of a step has the groups
        the file has, and creates none: ModeError)."""
        if name in self:
            g = self[name]
            if not isinstance(g, Group):
                raise TypeError(f"{g.name!r} is a dataset, not a group")
            return g
        return self.create_group(name)

    def require_dataset(self, name: str, shape, dtype, exact: bool = False, **kwds):
        """Collective: the dataset *name*, defined as ``create_dataset(name, shape, dtype,
        **kwds)`` if missing, as h5py's ``require_dataset``.  One that exists must have
        *shape* and a dtype *dtype* casts to safely (``np.can_cast``; the same dtype with
        *exact*): TypeError otherwise (DTypeError for the dtype), naming it and both; the
        other keywords are used only to define it."""
        from .dataset import Dataset

        if name not in self:
            return self.create_dataset(name, shape, dtype, **kwds)
        ds = self[name]
        if not isinstance(ds, Dataset):
            raise TypeError(f"{ds.name!r} is a group, not a dataset")
        want = _shape(shape, name)  # (an int is a shape of one dimension)
        if want != ds.shape:
            raise TypeError(
                f"dataset {ds.name!r} exists with shape {ds.shape}, not the shape {want} asked"
            )
        try:
            dt = check_dtype(dtype)
        except DTypeError as e:
            raise DTypeError(f"dataset {ds.name!r}: {e}") from None
        if dt != ds.dtype and (exact or not np.can_cast(dt, ds.dtype)):
            how = "is not" if exact else "does not cast safely to"
            raise DTypeError(
                f"dataset {ds.name!r} exists with dtype {ds.dtype}: the dtype {dt} asked {how} it"
            )
        return ds

    def create_dataset(
        self,
        name: str,
        shape=None,
        dtype=None,
        data=None,
        *,
        fill=0,
        compression=None,
        layout=None,
        fillvalue=None,
        compression_opts=None,
        **h5py_only,
    ):
        """Collective: define a dataset of fixed global *shape* and *dtype*.

        Parameters
        ----------
        name : str
            Path relative to this group; parents are created.
        shape : tuple of int, optional
            Global shape, the same on every rank (default: the shape of *data*).
        dtype : numpy dtype, optional
            Any numeric dtype: bool, int, uint, float, complex (default: the
            dtype of *data*, else float64).
        data : array, optional
            Written by rank 0 only, in the current (or an implicit) step (the
            fourth positional argument, as h5py's; the ones after it are
            keywords only).
        fill : scalar
            Value returned wherever nothing was written (default 0).
        compression : None, str, tuple, dict or list
            Codec pipeline: ``"zstd"``, ``"blosc"``, ``"lz4"``, ``"zlib"``,
            ``("zfp", tolerance)``, or numcodecs-style dicts.  Off by default.
        layout : lamina.Multires, optional
            Store the dataset as patches of wavelet levels compressed with
            zfp, readable by level and region (docs/multires.md); float32
            or float64 only, and without *compression* (the layout has its
            own).
        fillvalue, compression_opts :
            h5py's spellings, taken as h5py takes them: ``fillvalue`` is
            *fill*; ``compression_opts`` the level of ``compression="gzip"``.
            h5py's other keywords (``chunks``, ``maxshape``, ``shuffle``,
            ``fletcher32``, ...) are taken at their defaults only; any other
            value is a TypeError saying what lamina does instead.

        Every rank checks its arguments (and *data*'s dtype against *dtype*, as
        the write of *data* does) before anything is defined; where a rank
        refuses them, every rank raises the error of the lowest such rank
        (named by rank on the others) and nothing is defined.  The write of
        *data* comes after the definition, on rank 0 alone, as
        ``ds[...] = data`` would: where it fails (an I/O error, a codec
        failing), rank 0 raises that write's error, and the dataset remains
        defined on every rank (recorded with the next step committed), holding
        nothing from *data*.
        """
        from .dataset import Dataset

        eng = self._file._engine
        spec: DatasetSpec | None = None
        g = comm_mod.Guard()
        with g:
            self._writable(f"create dataset {name!r}")
            fill, compression = _h5py_keywords(
                name, fill, fillvalue, compression, compression_opts, h5py_only
            )
            spec, data = self._definition(name, shape, dtype, fill, compression, data, layout)
        if g.error is not None:
            if self._file.comm.size > 1 and isinstance(eng.stack()[-1], BlockEngine):
                # the other ranks wait in the agreement their definition begins with: this
                # rank's refusal joins it, and every rank raises
                where = name if isinstance(name, str) else repr(name)
                eng.define(RefusedSpec(where, (), np.dtype("f8"), error=g.error))
            raise g.error
        assert spec is not None
        spec = eng.define(spec)
        ds = Dataset(self._file, spec.path, self._step)
        if data is not None and self._file.comm.rank == 0:
            ds[...] = data
        return ds

    def _definition(
        self, name: str, shape, dtype, fill, compression, data, layout
    ) -> tuple[DatasetSpec, np.ndarray | None]:
        """The definition :meth:`create_dataset` makes of its arguments, and *data* as the
        array it writes; the error of the first argument refused otherwise."""
        by_value = data is not None and takes_by_value(data)
        given = data
        if data is not None:
            try:
                data = np.asarray(data)
            except ValueError as e:  # a ragged nested list
                raise ShapeError(
                    f"dataset {name!r}: data is not an array of one shape (numpy: {e})"
                ) from None
            shape = data.shape if shape is None else shape
            dtype = data.dtype if dtype is None else dtype
        if shape is None:
            raise ShapeError(f"dataset {name!r}: give its shape (or data to take it from)")
        shape = _shape(shape, name)
        reshape = False
        if data is not None:  # before anything is defined (h5py checks it first too)
            d = data
            while d.ndim > len(shape) and d.shape[0] == 1:  # as a write takes it
                d = d[0]
            try:
                fits = np.broadcast_shapes(d.shape, shape) == shape
            except ValueError:
                fits = False
            # data of as many elements in another shape is taken in C order, as h5py takes it
            # (data=np.arange(6), shape=(3, 2)); data that broadcasts to the shape, as a write
            reshape = not fits and data.size == math.prod(shape)
            if not fits and not reshape:
                raise ShapeError(
                    f"dataset {name!r}: data of shape {data.shape} does not fit its shape {shape} "
                    f"(it must broadcast to it, or hold {math.prod(shape)} elements)"
                )
        try:
            dt = check_dtype("f8" if dtype is None else dtype)
        except DTypeError as e:
            raise DTypeError(f"dataset {name!r}: {e}") from None
        fill_v = _fill_value(fill, dt, name)
        try:
            codecs = codec_mod.normalize(compression, dt, len(shape))
        except CodecError as e:
            raise CodecError(f"dataset {name!r}: {e}") from None
        described = None
        if layout is not None:
            if not isinstance(layout, Multires):
                raise TypeError(
                    f"dataset {name!r}: layout must be a lamina.Multires, got {layout!r}"
                )
            if codecs:
                raise ValueError(
                    f"dataset {name!r}: a multiresolution layout compresses with zfp itself; "
                    "give no compression"
                )
            described = layout.describe(self._abs(name), shape, dt)
        spec = DatasetSpec(self._abs(name), shape, dt, fill_v, codecs, layout=described)
        if by_value and data is not None and data.dtype != dt:
            # Python numbers, numpy scalars and lists of them are cast to the dtype by value,
            # as a write casts them (Dataset._values): 5 fits uint8, 300 does not (RangeError)
            data = cast_by_value(given, dt, f"dataset {name!r}", "data ")
        if data is not None:  # the cast its write makes, refused before the definition
            batch.check_dtype(spec, data.dtype)
            if reshape:
                data = data.reshape(shape)
        return spec, data


#: h5py's keywords of create_dataset that lamina has no use for: (their defaults, what
#: lamina does instead)
_H5PY_ONLY: dict[str, tuple[tuple, str]] = {
    "chunks": (
        (None, True),  # (True: chunked, the sizes left to the library, as lamina's blocks are)
        "lamina stores each write as a block: the writers' decomposition is the chunking "
        "(ds.write_blocks writes many at once)",
    ),
    "maxshape": ((None,), "a dataset's shape is fixed; time goes into steps (f.step())"),
    "shuffle": ((False,), "byte shuffling is a parameter of compression=('blosc', {...})"),
    "fletcher32": ((False,), "every block is stored with CRC-32C checksums already"),
    "scaleoffset": ((None,), "lossy compression is compression=('zfp', tolerance)"),
    "track_times": ((None, False), "lamina records no times of objects (each commit has its time)"),
    "track_order": ((None, False), "members are listed sorted by name"),
    "external": ((None, False), "the values are stored in the file's own subfiles"),
}


def _h5py_keywords(name, fill, fillvalue, compression, opts, others: dict) -> tuple:
    """(fill, compression) of create_dataset's h5py spellings: ``fillvalue`` for *fill*,
    ``compression_opts`` (or an integer *compression*) the gzip level; h5py's other
    keywords at their defaults only (TypeError naming what lamina does instead), any other
    keyword a TypeError."""
    where = f"create_dataset({name!r})"
    for k, v in others.items():
        if k not in _H5PY_ONLY:
            raise TypeError(f"{where} got an unexpected keyword argument {k!r}")
        defaults, instead = _H5PY_ONLY[k]
        if not any(v is d or (type(v) is type(d) and v == d) for d in defaults):
            raise TypeError(f"{where}: h5py's {k}={v!r} has no use in lamina: {instead}")
    if fillvalue is not None:
        if not (isinstance(fill, int) and not isinstance(fill, bool) and fill == 0):
            raise TypeError(f"{where}: give fill= or h5py's fillvalue=, not both")
        fill = fillvalue
    return fill, codec_mod.h5py_compression(name, compression, opts)


def _shape(shape, name: str) -> tuple[int, ...]:
    """*shape* as a tuple of ints >= 0; ShapeError for anything else (2.5 is not 2)."""
    if isinstance(shape, np.ndarray) and shape.ndim <= 1:  # (h5py takes one: np.array([2, 3]))
        shape = shape.tolist()
    dims: list[Any] | None = (
        [shape] if np.isscalar(shape) else list(shape) if isinstance(shape, tuple | list) else None
    )
    if dims is None:
        raise ShapeError(f"dataset {name!r}: shape {shape!r} is not an int or a sequence of ints")
    out = []
    for n in dims:
        try:
            v = as_int(n)
        except TypeError:
            raise ShapeError(
                f"dataset {name!r}: shape {tuple(dims)!r} has a dimension {n!r} that is not an integer"
            ) from None
        if v < 0:
            raise ShapeError(f"dataset {name!r}: shape {tuple(dims)!r} has a negative dimension")
        out.append(v)
    return tuple(out)


def _fill_value(fill, dt: np.dtype, name: str):
    """*fill* as a scalar of *dt*, or DTypeError if it does not fit.

    Judged by value, not by dtype kind, so the default ``0`` fits bool and
    unsigned datasets while ``-1`` (uint), ``1.5`` or NaN (int) and ``1j``
    (float) do not.  Float and complex targets take the nearest value.
    """
    arr = np.asarray(fill)
    ok = arr.ndim == 0 and arr.dtype.kind in "biufc"
    if ok:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # ComplexWarning, invalid-cast RuntimeWarning
            v = arr.astype(dt)
            if not (dt.kind == "c" or (dt.kind == "f" and arr.dtype.kind != "c")):
                ok = bool(v.astype(arr.dtype) == arr) and bool(v == arr)
    if not ok:
        raise DTypeError(f"dataset {name!r}: fill value {fill!r} does not fit dtype {dt}")
    if dt.kind in "fc" and np.isfinite(arr) and not np.isfinite(v):
        # (as a write of the value is refused: a finite fill is never stored as inf)
        raise RangeError(f"dataset {name!r}: fill value {fill!r} is beyond the range of dtype {dt}")
    return v[()]
