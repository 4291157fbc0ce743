"""The xarray backend: ``xr.open_dataset("run.lam")``, ``xr.open_datatree(...)``, lazily.

Registered through the ``xarray.backends`` entry point as ``lamina``.  A
group becomes a :class:`xarray.Dataset` (a node of the tree for
``open_datatree``), each lamina dataset a variable whose data is a
:class:`LaminaArray`: nothing is read until values are asked for, and then
only the blocks that the selection touches (``Dataset.read`` of the
bounding box).  Steps are the leading ``step`` dimension; ``step=K`` opens
one.  The attributes the mapping uses are in :mod:`.conventions`.

The file is opened on this process alone (``MPI.COMM_SELF``): every rank of
an analysis may open it and read its own part, as with any lamina reader.
"""

from __future__ import annotations

import atexit
import os
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.core import indexing

import lamina

from .. import comm as comm_mod
from ..engines.registry import ON_DISK
from . import conventions as cv

#: the file-name ending of native lamina files
SUFFIX = ".lam"


class LaminaArray(BackendArray):
    """One lamina dataset seen by xarray: ``(step, *shape)``, or ``shape`` at one step.

    Indexing is xarray's basic and outer indexing
    (:class:`~xarray.core.indexing.IndexingSupport.OUTER`): per axis an
    integer, a slice (any step, negative too) or an array of integers.  A
    read asks lamina for the bounding box of the selection in each step it
    touches, so only blocks that meet the selection are read; strides and
    index arrays are then taken from that box in memory.
    """

    def __init__(
        self,
        dataset: lamina.Dataset,
        steps: list[int] | None,
        at: int | None,
        level: int = 0,
        stride: int = 1,
    ):
        self._ds = dataset
        self._path = os.path.abspath(dataset.file.filename)  # (opened again by it: _dataset)
        self._steps = steps  # the steps along the leading axis; None: no step axis
        self._at = at  # the step read when there is no step axis
        self._level = level  # a multiresolution dataset's level (its own coordinates)
        self._stride = stride  # every stride-th element (a coordinate seen at a coarse level)
        if level:
            base = tuple(dataset.levels[level])
        else:
            base = tuple(-(-n // stride) for n in dataset.shape)
        self._base = base
        self.shape = base if steps is None else (len(steps), *base)
        self.dtype = np.dtype(dataset.dtype)

    def __reduce__(self):
        """Pickled (dask's processes and distributed schedulers, ``copy.deepcopy``) as the
        file's path and the dataset's name, opened again where unpickled (:func:`_reopened`),
        as xarray's netCDF backends reopen theirs; a file not on disk (in memory, in situ)
        cannot be opened again: a TypeError says so."""
        f = self._ds.file
        if f.engine.stack()[-1].name != "native":
            raise TypeError(
                f"variable {self._ds.name!r} of {f.filename!r} cannot be pickled: its file is "
                f"not on disk (engine {f.engine.stack()[-1].name!r}) and cannot be opened "
                "again elsewhere; load() it first, or use dask's threaded scheduler"
            )
        args = (self._path, self._ds.name, self._steps, self._at, self._level, self._stride)
        return (_reopened, args)

    def _dataset(self) -> lamina.Dataset:
        """The dataset read: where its file (on disk) was closed, the file opened again by
        path (:func:`_reopened_file`), as xarray's netCDF backends reopen theirs: a selection
        made inside ``with xr.open_dataset(...)`` reads after it, and so do the other groups
        of ``open_groups`` once one is closed (a ValueError, "file is closed")."""
        ds = self._ds
        f = ds.file
        if f.engine.closed and f.engine.stack()[-1].name == "native":
            ds = self._ds = _reopened_file(self._path, self._last_step())[ds.name]
        return ds

    def _last_step(self) -> int | None:
        """The last step this variable reads (None: the file's last, whatever it is)."""
        return _last_step(self._steps, self._at)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(
            _empty_slices_forward(key, self.shape),
            self.shape,
            indexing.IndexingSupport.OUTER,
            self._raw,
        )

    def _raw(self, key: tuple) -> np.ndarray:
        if self._steps is None:
            return self._read_at(self._at, key)
        sk, rest = key[0], key[1:]
        picked = _positions(sk, len(self._steps))
        parts = [self._read_at(self._steps[i], rest) for i in np.ravel(picked)]
        if isinstance(picked, int):
            return parts[0]
        base = self._read_shape(rest)
        out = np.empty((len(parts), *base), dtype=self.dtype)
        for i, p in enumerate(parts):
            out[i] = p
        return out

    def _read_shape(self, key: tuple) -> tuple[int, ...]:
        lo, hi, post = _bounds(key, self._base)
        probe = np.empty(tuple(h - lo_ for lo_, h in zip(lo, hi, strict=True)), dtype=np.uint8)
        return _apply(probe, post).shape

    def _read_at(self, step: int | None, key: tuple) -> np.ndarray:
        lo, hi, post = _bounds(key, self._base)
        shape = tuple(h - lo_ for lo_, h in zip(lo, hi, strict=True))
        s = self._stride
        if 0 in shape:
            block = np.empty(shape, dtype=self.dtype)
        elif self._level:
            block = self._dataset().read(
                lamina.Box(tuple(lo), tuple(hi)), step=step, level=self._level
            )
        elif s > 1:  # the fine elements the coarse ones sit on: every s-th, from lo * s
            box = lamina.Box(tuple(a * s for a in lo), tuple((b - 1) * s + 1 for b in hi))
            block = self._dataset().read(box, step=step)[(slice(None, None, s),) * len(lo)]
        else:
            block = self._dataset().read(lamina.Box(tuple(lo), tuple(hi)), step=step)
        return _apply(block, post)


def _empty_slices_forward(key: indexing.ExplicitIndexer, shape: tuple[int, ...]):
    """*key* with every empty slice as ``slice(0, 0)``.

    xarray's decomposition of outer keys fails on an empty slice with a
    negative step (``5:5:-1``: it asks for the last element of an empty
    range); the selection is the same.
    """
    if not isinstance(key, indexing.BasicIndexer | indexing.OuterIndexer):
        return key
    parts = list(key.tuple)
    changed = False
    for i, (k, n) in enumerate(zip(parts, shape, strict=True)):
        if isinstance(k, slice) and not range(*k.indices(n)):
            parts[i] = slice(0, 0, 1)
            changed = True
    return type(key)(tuple(parts)) if changed else key


def _positions(k, n: int):
    """A key of the ``step`` axis (of *n* steps) -> an int, or an array of positions;
    IndexError naming the axis and its length for a position outside it (as zarr's)."""
    if isinstance(k, slice):
        return np.arange(n)[k]
    a = np.asarray(k, dtype=np.int64)
    bad = (a < -n) | (a >= n)
    if bad.any():
        raise IndexError(
            f"index {int(a[bad].flat[0])} is out of bounds for dimension 'step' of length {n}"
        )
    a = np.where(a < 0, a + n, a)
    return int(a) if isinstance(k, int | np.integer) else a


def _bounds(key: tuple, shape: tuple[int, ...]) -> tuple[list[int], list[int], list[Any]]:
    """Per axis: the bounding range [lo, hi) of the key, and what to take from it afterwards."""
    lo: list[int] = []
    hi: list[int] = []
    post: list[Any] = []
    for k, n in zip(key, shape, strict=True):
        if isinstance(k, int | np.integer):
            i = int(k) + (n if int(k) < 0 else 0)
            lo.append(i)
            hi.append(i + 1)
            post.append(0)
        elif isinstance(k, slice):
            start, stop, step = k.indices(n)
            r = range(start, stop, step)
            if not r:
                lo.append(0)
                hi.append(0)
                post.append(slice(None))
                continue
            a, b = min(r[0], r[-1]), max(r[0], r[-1])
            lo.append(a)
            hi.append(b + 1)
            # the box holds r exactly at its ends: a negative step starts from its far end
            post.append(slice(None, None, step))
        else:
            idx = np.asarray(k, dtype=np.int64)
            idx = np.where(idx < 0, idx + n, idx)
            if idx.size == 0:
                lo.append(0)
                hi.append(0)
                post.append(idx)
                continue
            a, b = int(idx.min()), int(idx.max())
            lo.append(a)
            hi.append(b + 1)
            post.append(idx - a)
    return lo, hi, post


def _apply(block: np.ndarray, post: list) -> np.ndarray:
    """Take strides, index arrays and integers from *block*, axis by axis (outer indexing)."""
    out = block
    for ax in range(len(post) - 1, -1, -1):  # from the last axis: integers drop axes behind us
        p = post[ax]
        if isinstance(p, slice) and p == slice(None):
            continue
        out = out[(slice(None),) * ax + (p,)]
    return out


# ----------------------------------------------------------------------- groups -> Datasets


#: files opened again where variables were unpickled, by path: one reader per process and
#: file, closed at exit (:func:`_reopened`)
_REOPENED: dict[str, lamina.File] = {}
_REOPENED_LOCK = threading.Lock()


def _reopened(
    path: str, name: str, steps: list[int] | None, at: int | None, level: int, stride: int
) -> LaminaArray:
    """A :class:`LaminaArray` unpickled: its dataset *name* of the file at *path* opened
    again (:func:`_reopened_file`)."""
    return LaminaArray(_reopened_file(path, _last_step(steps, at))[name], steps, at, level, stride)


def _last_step(steps: list[int] | None, at: int | None) -> int | None:
    """The last step a variable of *steps* (every one) or *at* (one) reads; None: the file's
    last, whatever it is."""
    return max(steps, default=None) if steps is not None else at


def _reopened_file(path: str, step: int | None = None) -> lamina.File:
    """The file at *path* opened again for variables whose own is not open here (unpickled,
    or closed): once in this process, kept open for every variable that needs it, and
    refreshed where a variable reads a *step* it opened before (a file a run goes on
    writing, followed with dask's process or distributed workers)."""
    with _REOPENED_LOCK:
        f = _REOPENED.get(path)
        if f is None or f.engine.closed:
            if not _REOPENED:
                atexit.register(_close_reopened)
            f = _REOPENED[path] = lamina.open(path, "r", comm=comm_mod.self_comm(), **ON_DISK)
        elif step is not None and step >= f.steps:
            f.refresh()
        return f


def _close_reopened() -> None:
    with _REOPENED_LOCK:
        for f in _REOPENED.values():
            f.close()
        _REOPENED.clear()


class _Closer:
    """Closes the lamina file once, when the last object that uses it is closed.  Unpickled,
    it closes nothing: the variables unpickled read from a file opened again there
    (:func:`_reopened`), kept open for them."""

    def __init__(self, f: lamina.File | None, owned: bool):
        self._f = f
        self._owned = owned
        self._lock = threading.Lock()

    def __reduce__(self):
        return (_Closer, (None, False))

    def __call__(self) -> None:
        with self._lock:
            if self._owned and self._f is not None and not self._f.engine.closed:
                self._f.close()


def _open(filename_or_obj, step: int | None = None) -> tuple[lamina.File, str, bool, int | None]:
    """(file, group path, whether we opened it, the step to read) for a path or an open
    lamina File/Group: a view of one step (``f.at(k)``) reads that step, as *step=k* does
    (a *step* that names another one is a ValueError)."""
    if isinstance(filename_or_obj, lamina.Group):
        g = filename_or_obj
        seen = g._step  # (a File's .step is its step() context manager)
        if seen is not None:
            if step is not None and g.file.at(step).index != seen:
                raise ValueError(
                    f"step={step} given for a view of step {seen} ({g.name!r} of "
                    f"{g.file.filename!r}): give one of them"
                )
            step = seen
        return g.file, g.name, False, step
    if isinstance(filename_or_obj, lamina.Dataset):
        raise TypeError("open a lamina File or Group (a Dataset is one variable)")
    path = os.fspath(filename_or_obj)
    # a path is a file on disk, whatever $LAMINA_ENGINE/_TRANSPORT/_IO say to the job's own
    # programs (as for the `lamina` commands); an in-memory file is passed as its File
    f = lamina.open(path, "r", comm=comm_mod.self_comm(), **ON_DISK)
    return f, "/", True, step


def _steps_of(f: lamina.File, step: int | None) -> tuple[list[int] | None, int | None]:
    if step is None:
        return list(range(f.steps)), None
    return None, f.at(step).index


def _written(ds: lamina.Dataset, steps: Iterable[int]) -> list[int]:
    return [k for k in steps if ds.blocks(k)]


def _chunks(
    ds: lamina.Dataset, steps: Iterable[int], down: int = 0
) -> list[tuple[int, ...] | None]:
    """Per axis, the chunk sizes that follow the boundaries of the stored blocks in *steps*
    (seen *down* levels coarser: edges at ``ceil(edge / 2**down)``)."""
    cuts: list[set[int]] = [set() for _ in ds.shape]
    seen = False
    for k in steps:
        for b in ds.blocks(k):
            seen = True
            for ax, (a, z) in enumerate(zip(b.box.start, b.box.stop, strict=True)):
                cuts[ax].update((-(-a >> down), -(-z >> down)))
    out: list[tuple[int, ...] | None] = []
    for ax, n in enumerate(-(-m >> down) for m in ds.shape):
        if not seen or n == 0:
            out.append(None)
            continue
        edges = sorted({0, n, *(c for c in cuts[ax] if 0 < c < n)})
        out.append(tuple(b - a for a, b in zip(edges, edges[1:], strict=False)))
    return out


def _definition(f: lamina.File, path: str):
    """The derived definition of dataset *path* (a component of a vector too), or None."""
    defs = f.derived
    p = path.strip("/")
    if p in defs:
        return defs[p]
    parent = p.rsplit("/", 1)[0] if "/" in p else ""
    d = defs.get(parent)
    if d is not None and len(getattr(d, "components", ())) > 1:
        return d
    return None


def _inputs_like(f: lamina.File, d, shape: tuple[int, ...]) -> list[lamina.Dataset]:
    """The inputs of derived definition *d* that have *shape*, by name."""
    out = []
    for name in sorted(d.inputs):
        if name in f:
            obj = f[name]
            if isinstance(obj, lamina.Dataset) and obj.shape == shape:
                out.append(obj)
    return out


def _input_dims(f: lamina.File, d, shape: tuple[int, ...]) -> dict:
    """``{"dims": names}`` of the first input of derived definition *d* that has *shape* and names."""
    for obj in _inputs_like(f, d, shape):
        if cv.DIMS in obj.attrs:
            return {cv.DIMS: obj.attrs[cv.DIMS]}
    return {}


def _per_step_source(
    f: lamina.File, gpath: str, inherit: bool, what: str = cv.TIME
) -> lamina.Dataset | None:
    """The 0-D dataset ``time`` (or *what*) of the group (or, with *inherit*, of a parent), if
    written per step.

    A group whose datasets have the ``step`` dimension takes its parents'
    ``time``: xarray's trees pass only indexed coordinates down to children.
    """
    parts = [p for p in gpath.strip("/").split("/") if p]
    candidates = ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]
    if not inherit:
        candidates = candidates[:1]
    for g in candidates:
        name = f"{g}/{what}" if g else what
        if name in f:
            obj = f[name]
            if isinstance(obj, lamina.Dataset) and obj.shape == () and not cv.is_static(obj.attrs):
                return obj
    return None


def _per_step_variable(
    f: lamina.File, src: lamina.Dataset, steps: list[int] | None, at: int | None
) -> xr.Variable:
    """The 0-D dataset *src* (:func:`_per_step_source`) as a variable: over *steps*, or its
    value at step *at*."""
    return xr.Variable(
        () if steps is None else (cv.STEP,),
        indexing.LazilyIndexedArray(LaminaArray(src, steps, at)),
        attrs=cv.plain_attrs({k: src.attrs[k] for k in src.attrs}, cv.DATASET_KEYS),
        encoding={"source": f.filename, "lamina_path": src.name},
    )


@dataclass(slots=True)
class _Member:
    """A dataset of a group as :func:`group_dataset` sees it before its variable is made."""

    name: str
    obj: lamina.Dataset
    attrs: dict
    what: str  # how messages name it
    d: Any  # its derived definition, or None
    dims: list[str]
    explicit: bool  # dims named by its attribute
    at_level: int
    stride: int
    shape: tuple[int, ...]


def group_dataset(
    f: lamina.File,
    gpath: str,
    step: int | None = None,
    drop_variables: Iterable[str] | None = None,
    inherit_time: bool = True,
    level: int = 0,
    inherited: dict[str, int] | None = None,
) -> xr.Dataset:
    """The datasets of group *gpath* of *f* as a lazy :class:`xarray.Dataset`.

    At *level* > 0 the group's multiresolution datasets are seen at that
    level (:meth:`lamina.Dataset.level`); 1-D coordinates keep every
    ``2**level``-th value (where the coarse samples sit); other datasets
    have no such level and are left out, with a warning naming them.
    *inherited*: the sizes of the dimensions of the groups above (a node of a
    tree): a default name (``dim_0``) of another size here is made distinct,
    as within a group, for a tree's nodes must agree with their parents.
    """
    g = f if gpath.strip("/") == "" else f[gpath]
    if not isinstance(g, lamina.Group):
        raise TypeError(f"{gpath!r} in {f.filename!r} is a dataset, not a group")
    drop = set([drop_variables] if isinstance(drop_variables, str) else drop_variables or ())
    if level:
        drop |= _without_level(f, g, level, drop)
    steps, at = _steps_of(f, step)
    all_steps = list(range(f.steps)) if steps is None else steps
    gattrs = {k: g.attrs[k] for k in g.attrs}
    coord_names = set(cv.names(gattrs.get(cv.COORDINATES)))
    sizes: dict[str, int] = {}
    variables: dict[str, xr.Variable] = {}
    stepped = False
    members = [(n, o) for n, o in g.items() if isinstance(o, lamina.Dataset) and n not in drop]
    planned = []
    for name, obj in members:
        attrs = {k: obj.attrs[k] for k in obj.attrs}
        what = f"{f.filename}:{obj.name}"
        d = _definition(f, obj.name)
        if cv.DIMS not in attrs and d is not None:  # a derived quantity: the dims of its inputs
            attrs = {**attrs, **_input_dims(f, d, obj.shape)}
        dims, problem = cv.dims_of(attrs, obj.shape, what)
        if problem:
            warnings.warn(problem, stacklevel=4)
        explicit = cv.DIMS in attrs and problem is None
        at_level = level if level and obj.layout is not None else 0
        stride = 1 << level if level and not at_level else 1
        shape = (
            tuple(obj.levels[at_level]) if at_level else tuple(-(-n // stride) for n in obj.shape)
        )
        planned.append(_Member(name, obj, attrs, what, d, dims, explicit, at_level, stride, shape))
    # names given ('dims') first: a default name (dim_0) of another size is the one made
    # distinct, whichever dataset comes first
    for m in sorted(planned, key=lambda m: not m.explicit):
        m.dims = _fit_dims(m.dims, m.shape, sizes, m.explicit, m.what, inherited or {})
    taken = {name for name, _ in members}
    for m in planned:
        name, obj, attrs, what, d, dims = m.name, m.obj, m.attrs, m.what, m.d, m.dims
        at_level, stride = m.at_level, m.stride
        static = cv.is_static(attrs) and f.steps > 0
        var_steps: list[int] | None
        var_at: int | None
        if static:
            written = _written(obj, range(f.steps))
            var_steps, var_at = None, (written[0] if written else 0)
            chunk_steps = [var_at]
        else:
            var_steps, var_at = steps, at
            chunk_steps = all_steps if at is None else [at]
        array = LaminaArray(obj, var_steps, var_at, at_level, stride)
        vdims = tuple(dims) if var_steps is None else (cv.STEP, *dims)
        chunks = _chunks(obj, chunk_steps, level)
        if d is not None and all(c is None for c in chunks):  # computed when read: as its inputs
            for src in _inputs_like(f, d, obj.shape):
                chunks = _chunks(src, chunk_steps)
                if any(c is not None for c in chunks):
                    break
        preferred: dict[str, int | tuple[int, ...]] = {
            dim: c for dim, c in zip(dims, chunks, strict=True) if c is not None
        }
        if var_steps is not None:
            preferred[cv.STEP] = 1
        encoding: dict[str, Any] = {
            "preferred_chunks": preferred,
            "lamina_fill": obj.fill,
            "source": f.filename,
            "lamina_path": obj.name,
        }
        if level:
            encoding["lamina_level"] = level
        if obj.compression:
            # (not "compression": xarray's netCDF backends take that key, as a string)
            encoding["lamina_compression"] = list(obj.compression)
        if d is not None:
            encoding["lamina_derived"] = {"expression": d.text, "strategy": d.strategy}
        component = d is not None and obj.name.strip("/") != d.name.strip("/")
        if component or (name in dims and tuple(dims) != (name,)):
            # a vector's component x (over dims x, y, z xarray would take it for a coordinate):
            # NAME_x, whatever the dims are called; NAME_x_2 ... where the group holds NAME_x
            renamed = f"{gpath.strip('/').rsplit('/', 1)[-1] or 'var'}_{name}"
            if renamed in taken or renamed in variables:
                k = 2
                while f"{renamed}_{k}" in taken or f"{renamed}_{k}" in variables:
                    k += 1
                free = f"{renamed}_{k}"
                warnings.warn(
                    f"{what} is named like one of its dimensions, and {renamed!r} is taken in "
                    f"the group: it is the variable {free!r}",
                    stacklevel=4,
                )
                renamed = free
            name = renamed
            if name in drop:  # (named as the Dataset shows it)
                continue
        variables[name] = xr.Variable(
            vdims,
            indexing.LazilyIndexedArray(array),
            attrs=cv.plain_attrs(attrs, cv.DATASET_KEYS),
            encoding=encoding,
        )
        stepped = stepped or not static
        if len(dims) == 1 and dims[0] == name:
            coord_names.add(name)
    # (not where a dimension of the group is named 'time': a probe's history over its own)
    if (
        cv.TIME not in variables
        and cv.TIME not in drop
        and not any(cv.TIME in v.dims for v in variables.values())
    ):
        tsrc = _per_step_source(f, gpath, inherit_time and stepped)
        if tsrc is not None:
            variables[cv.TIME] = _per_step_variable(f, tsrc, steps, at)
    if cv.TIME in variables and variables[cv.TIME].dims in ((), (cv.STEP,)):
        coord_names.add(cv.TIME)
    if at is not None and cv.STEP in variables:
        # a dataset named 'step' (to_lamina's step coordinate, a program's step counter) is
        # the coordinate over all steps; at one step it is the scalar one, not the index
        if variables[cv.STEP].dims == ():
            coord_names.add(cv.STEP)
    elif at is not None:
        # a parent's 'step' is this group's too, as a tree passes it down when every step is
        # open (the group of a node labelled step=1 where its root said step=20)
        ssrc = _per_step_source(f, gpath, inherit_time and stepped, cv.STEP)
        variables[cv.STEP] = (
            xr.Variable((), np.int64(at))
            if ssrc is None
            else _per_step_variable(f, ssrc, steps, at)  # (steps is None: at one step)
        )
        coord_names.add(cv.STEP)
    elif stepped and cv.STEP in variables and variables[cv.STEP].dims == ():
        # a static 0-D 'step' (the same at every step) beside the step dimension: xarray
        # takes no variable and dimension of one name; the file opens without it
        warnings.warn(
            f"{f.filename}:{variables[cv.STEP].encoding.get('lamina_path', cv.STEP)} is static "
            "(one value for every step) and is left out beside the dimension 'step'; open "
            "one step (step=k) to read it",
            stacklevel=3,
        )
        del variables[cv.STEP]
        coord_names.discard(cv.STEP)
    coords = {k: v for k, v in variables.items() if k in coord_names}
    data_vars = {k: v for k, v in variables.items() if k not in coord_names}
    ds = xr.Dataset(data_vars, coords=coords, attrs=cv.plain_attrs(gattrs, cv.GROUP_KEYS))
    return ds


def _without_level(f: lamina.File, g, level: int, drop: set[str]) -> set[str]:
    """Names of the datasets of *g* that a view at *level* leaves out (with one warning): all
    but multiresolution datasets with that level, 0-D datasets and 1-D coordinates."""
    out = []
    listed = set(cv.names(g.attrs[cv.COORDINATES])) if cv.COORDINATES in g.attrs else set()
    for name, obj in g.items():
        if not isinstance(obj, lamina.Dataset) or name in drop:
            continue
        if obj.layout is not None and level < len(obj.levels):
            continue
        dims = cv.names(obj.attrs[cv.DIMS]) if cv.DIMS in obj.attrs else []
        # (an index coordinate, or one the group lists: lat over y, as to_lamina writes it)
        coordinate = obj.ndim == 1 and (list(dims) == [name] or name in listed)
        if obj.ndim == 0 or (coordinate and _definition(f, obj.name) is None):
            continue
        out.append(name)
    if out:
        warnings.warn(
            f"level {level}: {', '.join(repr(n) for n in out)} in {f.filename!r} "
            f"{'has' if len(out) == 1 else 'have'} no level {level} (not multiresolution "
            "datasets with that many levels): left out",
            stacklevel=5,
        )
    return set(out)


def _fit_dims(
    dims: list[str],
    shape: tuple[int, ...],
    sizes: dict[str, int],
    explicit: bool,
    what: str,
    inherited: dict[str, int],
) -> list[str]:
    """Dimension names that agree with those already used in the group (a name has one size),
    and default names with those of the groups above (*inherited*)."""
    out = []
    for d, n in zip(dims, shape, strict=True):
        have = sizes.get(d)
        if have is not None and have != n:
            if explicit:
                raise ValueError(
                    f"{what}: dimension {d!r} has size {n} here and {have} in another dataset of "
                    "the group; one name must have one size (fix the 'dims' attribute)"
                )
            d = f"{d}_{n}"
        elif not explicit and inherited.get(d, n) != n:
            d = f"{d}_{n}"
        sizes[d] = n
        out.append(d)
    return out


# ----------------------------------------------------------------------------- entry point


#: xarray's CF decoders, which xarray hands a backend where they are given
DECODERS = (
    "mask_and_scale",
    "decode_times",
    "decode_timedelta",
    "concat_characters",
    "use_cftime",
    "decode_coords",
)


class LaminaBackendEntrypoint(BackendEntrypoint):
    """``engine="lamina"``: lamina files (``*.lam``) as xarray Datasets and DataTrees.

    Arguments besides xarray's own:

    - ``group``: the group to open (default: the root) for ``open_dataset``;
    - ``step``: open one committed step (negative counts from the end);
      default: every step, along the dimension ``step``;
    - ``level``: the resolution level of multiresolution datasets (0 or
      None: full resolution; see :func:`group_dataset`).
    """

    description = "Open lamina files (.lam) lazily: blocks read on demand, steps as a dimension"
    url = ""
    open_dataset_parameters = (
        "filename_or_obj",
        "drop_variables",
        "group",
        "step",
        "level",
        *DECODERS,
    )
    supports_groups = True

    def guess_can_open(self, filename_or_obj) -> bool:
        if isinstance(filename_or_obj, lamina.Group):
            return True
        try:
            path = os.fspath(filename_or_obj)
        except TypeError:
            return False
        if isinstance(path, bytes):
            return False
        return path.rstrip("/").endswith(SUFFIX)

    def open_dataset(
        self,
        filename_or_obj,
        *,
        drop_variables: str | Iterable[str] | None = None,
        group: str | None = None,
        step: int | None = None,
        level: int | None = None,
        **decoders: Any,
    ) -> xr.Dataset:
        level = _check_level(level)
        _check_decoders(decoders)
        f, base, owned, step = _open(filename_or_obj, step)
        close = _Closer(f, owned)
        try:
            gpath = _join(base, group)
            ds = group_dataset(f, gpath, step, drop_variables, level=level)
            ds = _decoded(ds, decoders)
        except BaseException:
            close()
            raise
        ds.set_close(close)
        return ds

    def open_groups_as_dict(
        self,
        filename_or_obj,
        *,
        drop_variables: str | Iterable[str] | None = None,
        group: str | None = None,
        step: int | None = None,
        level: int | None = None,
        **decoders: Any,
    ) -> dict[str, xr.Dataset]:
        level = _check_level(level)
        _check_decoders(decoders)
        f, base, owned, step = _open(filename_or_obj, step)
        close = _Closer(f, owned)
        try:
            top = _join(base, group)
            g = f if top.strip("/") == "" else f[top]
            if not isinstance(g, lamina.Group):  # (as open_dataset says it)
                raise TypeError(f"{top!r} in {f.filename!r} is a dataset, not a group")
            paths = [top] + [p for p, o in g.walk() if isinstance(o, lamina.Group)]
            out = {}
            above: dict[str, dict[str, int]] = {}  # dimension sizes of each group and its own
            for p in paths:  # a group after the groups above it
                rel = "/" + p[len(top) :].strip("/") if p != top else "/"
                parent = above.get(p.rstrip("/").rsplit("/", 1)[0] or "/", {}) if p != top else {}
                ds = group_dataset(f, p, step, drop_variables, level=level, inherited=parent)
                ds = _decoded(ds, decoders)
                above[p.rstrip("/") or "/"] = {
                    **parent,
                    **{str(k): int(v) for k, v in ds.sizes.items()},
                }
                ds.set_close(close)
                out[rel] = ds
        except BaseException:
            close()
            raise
        return out

    def open_datatree(
        self,
        filename_or_obj,
        *,
        drop_variables: str | Iterable[str] | None = None,
        group: str | None = None,
        step: int | None = None,
        level: int | None = None,
        **decoders: Any,
    ) -> xr.DataTree:
        groups = self.open_groups_as_dict(
            filename_or_obj,
            drop_variables=drop_variables,
            group=group,
            step=step,
            level=level,
            **decoders,
        )
        tree = xr.DataTree.from_dict(groups)
        closer = next(iter(groups.values()))._close
        if closer is not None:
            tree.set_close(closer)
        return tree


def _check_decoders(given: dict[str, Any]) -> None:
    """TypeError for a keyword that is none of xarray's decoders, as Python says it."""
    for k in given:
        if k not in DECODERS:
            raise TypeError(f"open_dataset() got an unexpected keyword argument {k!r}")


def _decoded(ds: xr.Dataset, given: dict[str, Any]) -> xr.Dataset:
    """*ds* decoded by the CF decoders *given* true (``decode_times=True``, as
    ``xr.decode_cf`` decodes).  lamina decodes nothing by default (its fill is a value, not a
    missing-data mark: docs/xarray.md): a decoder not given, or given False, is off."""
    on = {k: given.get(k) for k in DECODERS}
    if not any(v for k, v in on.items() if k != "use_cftime"):
        return ds
    out = xr.decode_cf(
        ds,
        concat_characters=on["concat_characters"] or False,
        mask_and_scale=on["mask_and_scale"] or False,
        decode_times=on["decode_times"] or False,
        decode_coords=on["decode_coords"] or False,
        use_cftime=on["use_cftime"],
        decode_timedelta=on["decode_timedelta"] or False,
    )
    out.set_close(ds._close)
    return out


def _check_level(level: int | None) -> int:
    """*level* as an int >= 0 (None: 0); ValueError otherwise."""
    if level is None:
        return 0
    if isinstance(level, bool) or not isinstance(level, int | np.integer) or level < 0:
        raise ValueError(f"level={level!r}: a level is an integer >= 0 (0: full resolution)")
    return int(level)


def _join(base: str, group: str | None) -> str:
    if not group:
        return base
    if group.startswith("/"):
        return group
    return base.rstrip("/") + "/" + group
