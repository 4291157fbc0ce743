"""``to_lamina``: an xarray Dataset (or DataTree) as a lamina file, from one rank or many.

Each variable becomes a dataset with a ``dims`` attribute; coordinates that
are not named like their only dimension are listed in the group's
``coordinates`` attribute; attributes are copied.  A ``step`` dimension
becomes lamina's steps: variables with it are written once per step,
variables without it once (in the first step), marked ``static``.  A
Dataset without a ``step`` dimension is one step, every variable static, so
that ``xr.open_dataset`` gives it back without a ``step`` dimension.

In parallel every rank passes the same Dataset (typically lazy: dask, or
opened from a file) and writes its part: the dask chunks of a variable are
dealt out to the ranks in turn (each chunk a block), a variable in memory is
cut with :func:`lamina.geometry.decompose` (one block per rank), and small
variables are written whole by one rank each.  Only the parts a rank writes
are computed there.
"""

from __future__ import annotations

import itertools
import os
import warnings
from typing import Any

import numpy as np
import xarray as xr

import lamina
from lamina import codecs as codec_mod
from lamina import comm as comm_mod
from lamina.catalog import checked_attr, normpath
from lamina.engines.native.engine import read_here
from lamina.engines.registry import ON_DISK
from lamina.errors import CodecError, ExistsError, LaminaError
from lamina.geometry import Box, decompose

from . import conventions as cv

#: variables smaller than this (bytes) are written whole by one rank
SMALL = 1 << 16


def to_lamina(
    obj: xr.Dataset | xr.DataTree | xr.DataArray,
    path: str | os.PathLike,
    *,
    mode: str = "w",
    comm=None,
    compression=None,
    **options,
) -> None:
    """Collective: write *obj* as the lamina file *path*.

    Parameters
    ----------
    obj : xarray.Dataset, DataTree or DataArray
        A DataTree writes each node as a group; a DataArray is a Dataset of
        one variable (its name, else ``data``).
    path : str or path-like
        The ``.lam`` file to create.
    mode : {'w', 'a'}
        Create (truncate), or add to a file that does not hold these names yet.
    comm : mpi4py communicator, optional
        The ranks that write (default: the task's, as :func:`lamina.open`);
        every rank passes the same *obj* and writes its part.
    compression : optional
        Codec of every dataset (see ``create_dataset``); a variable's
        ``encoding["lamina_compression"]`` (what reading a lamina file gives)
        or ``encoding["compression"]`` takes precedence.
    **options
        Passed to :func:`lamina.open` (``aggregators=``, ``durable=`` ...).
    """
    nodes = _nodes(obj)
    nsteps = _step_count(nodes)
    _check_names(nodes, nsteps)
    _check_values(nodes, compression)
    if mode == "w":
        _check_not_reading(nodes, path)
    elif mode == "a":
        _check_append(nodes, path)
    # a file of static variables alone is one step; a step dimension of length 0, none
    steps = nsteps if any(cv.STEP in ds.dims for _, ds in nodes) else 1
    with lamina.open(path, mode, comm=comm, **options) as f:
        plan: list[tuple[lamina.Dataset, xr.Variable, bool]] = []
        for gpath, ds in nodes:
            g = f if gpath.strip("/") == "" else f.require_group(gpath)
            _copy_attrs(g, ds.attrs, f"group {gpath!r}")
            listed = sorted(str(c) for c in ds.coords if ds[c].dims != (c,))
            if cv.COORDINATES in g.attrs:  # (mode 'a': the file's stay coordinates)
                listed = sorted(set(cv.names(g.attrs[cv.COORDINATES])) | set(listed))
            if listed:
                g.attrs[cv.COORDINATES] = listed
            for name, var in ds.variables.items():
                plan.append(_define(g, str(name), var, nsteps, compression))
        rank, size = f.comm.rank, f.comm.size
        turn = itertools.count()
        parts = [(d, v, stepped, _parts(v, stepped, size, turn)) for d, v, stepped in plan]
        for k in range(steps):
            with f.step():
                for d, var, stepped, boxes in parts:
                    if not stepped and k > 0:
                        continue
                    data = var[k] if stepped else var
                    for owner, box in boxes:
                        if owner != rank:
                            continue
                        values = np.asarray(data[box.slices].values if box.ndim else data.values)
                        if box.ndim:
                            d[box.slices] = values
                        else:
                            d[()] = values


def _nodes(obj) -> list[tuple[str, xr.Dataset]]:
    if isinstance(obj, xr.DataTree):
        return [(node.path, node.to_dataset(inherit=False)) for node in obj.subtree]
    if isinstance(obj, xr.DataArray):
        return [("/", obj.to_dataset(name=obj.name if obj.name is not None else "data"))]
    if isinstance(obj, xr.Dataset):
        return [("/", obj)]
    raise TypeError(
        f"to_lamina takes an xarray Dataset, DataTree or DataArray, not {type(obj).__name__}"
    )


def _check_names(nodes: list[tuple[str, xr.Dataset]], nsteps: int) -> None:
    """ValueError for what the mapping cannot write as it is read back: a variable whose
    name holds '/' (a dataset of another group), attributes with the names the mapping uses
    itself, and static variables beside a ``step`` dimension of length 0 (no step to write
    them in)."""
    for gpath, ds in nodes:
        where = f"group {gpath!r}: " if gpath.strip("/") else ""
        if cv.COORDINATES in ds.attrs:
            raise ValueError(
                f"{where}attribute {cv.COORDINATES!r} is the name the lamina mapping keeps the "
                "non-index coordinates under; rename it"
            )
        for name, var in ds.variables.items():
            if "/" in str(name):
                raise ValueError(
                    f"{where}variable {str(name)!r}: a name with '/' would be a dataset of "
                    "another group; rename it (or write a DataTree)"
                )
            if str(name) in ("", "."):
                raise ValueError(
                    f"{where}variable {str(name)!r}: a dataset needs a name ({str(name)!r} "
                    "names the group itself); rename it"
                )
            try:
                normpath(str(name), gpath.strip("/"))
            except ValueError as e:
                raise ValueError(f"{where}variable {str(name)!r}: {e}; rename it") from None
            for key in (cv.DIMS, cv.STATIC):
                if key in var.attrs:
                    raise ValueError(
                        f"{where}variable {str(name)!r}: attribute {key!r} is a name the lamina "
                        "mapping uses itself; rename it"
                    )
            if nsteps == 0 and cv.STEP not in var.dims and any(cv.STEP in d.dims for _, d in nodes):
                raise ValueError(
                    f"{where}variable {str(name)!r} has no {cv.STEP!r} dimension, whose length "
                    "is 0: there is no step to write it in"
                )


def _check_values(nodes: list[tuple[str, xr.Dataset]], compression) -> None:
    """TypeError for a variable or an attribute lamina cannot store, CodecError for a codec
    it does not have, before the file is opened (an existing file is left as it was)."""
    for gpath, ds in nodes:
        _check_attrs(ds.attrs, f"group {gpath!r}")
        for name, var in ds.variables.items():
            what = f"variable {str(name)!r}"
            if var.dtype.kind not in "biufc":
                raise TypeError(
                    f"{what} has dtype {var.dtype}: lamina stores numbers only (bool, int, float, "
                    "complex); encode it first (e.g. datetimes as numbers with units)"
                )
            _check_attrs(var.attrs, what)
            ndim = var.ndim - (cv.STEP in var.dims)
            comp = _compression_of(var, compression)
            try:  # as create_dataset takes it (an integer: the gzip level)
                comp = codec_mod.h5py_compression(str(name), comp)
                codec_mod.normalize(comp, var.dtype, ndim)
            except (CodecError, TypeError, ValueError) as e:
                raise CodecError(f"{what}: {e}") from None


def _compression_of(var: xr.Variable, compression):
    """The codec of *var*'s dataset: its ``lamina_compression`` encoding (a lamina file's),
    its ``compression`` encoding, else *compression*."""
    enc = var.encoding
    if "lamina_compression" in enc:
        return enc["lamina_compression"]
    return enc.get("compression", compression)


def _check_not_reading(nodes: list[tuple[str, xr.Dataset]], path) -> None:
    """ValueError where a variable reads, lazily, from the file at *path*: creating it
    ('w') would remove what the variable still has to read (h5py refuses to truncate an
    open file; a lamina file is a directory any number of readers may hold)."""
    target = os.path.realpath(os.fspath(path))
    for _, ds in nodes:
        for name, var in ds.variables.items():
            source = var.encoding.get("source")
            if not isinstance(source, str) or os.path.realpath(source) != target:
                continue
            if getattr(var, "_in_memory", False):  # loaded: nothing left to read from the file
                continue
            raise ValueError(
                f"variable {str(name)!r} is read lazily from {os.fspath(path)!r}: writing that "
                "file in mode 'w' would remove it first; load() the data, or write another "
                "file and move it"
            )
    # a result computed from the file (ds * 2, a reduction) has lost its source, but its
    # dask graph reads the file still: refused while this process has the file open and a
    # variable is not in memory
    lazy = [
        str(name)
        for _, ds in nodes
        for name, var in ds.variables.items()
        if not getattr(var, "_in_memory", True)
    ]
    if lazy and read_here(target):
        raise ValueError(
            f"{os.fspath(path)!r} is open for reading in this process and variable {lazy[0]!r} "
            "is not loaded: it may still read from that file, which writing it in mode 'w' "
            "would remove first; close the Datasets read from it, load() the data, or write "
            "another file and move it"
        )


def _check_append(nodes: list[tuple[str, xr.Dataset]], path) -> None:
    """Mode 'a': a name the file's group holds already (ExistsError), or a dimension of
    another length than the group's in the file (ValueError: the group would no longer open
    in xarray, as ``to_zarr(mode="a")`` refuses it), refused before the file is opened for
    writing: a refusal leaves the file as it was (it was refused midway, the group's
    attributes and the datasets defined before the clash written)."""
    from .backend import group_dataset

    where = os.fspath(path)
    try:
        f = lamina.open(where, "r", comm=comm_mod.self_comm(), **ON_DISK)
    except (OSError, LaminaError):  # none yet (created), or what opening to write says
        return
    with f:
        for gpath, ds in nodes:
            g = f.get(gpath) if gpath.strip("/") else f
            if not isinstance(g, lamina.Group):
                continue  # (a group made now; a dataset there: the write says so)
            for name in ds.variables:
                if str(name) in g:
                    raise ExistsError(
                        f"{where}: group {g.name!r} holds {str(name)!r} already; mode 'a' adds "
                        "names the file does not hold (rename the variable, or write the file "
                        "in mode 'w')"
                    )
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    have = dict(group_dataset(f, g.name).sizes)
            except (ValueError, LaminaError):  # (a group xarray cannot open as it is)
                continue
            for name, var in ds.variables.items():
                for d, n in var.sizes.items():
                    if d != cv.STEP and have.get(d, n) != n:
                        raise ValueError(
                            f"variable {str(name)!r}: dimension {str(d)!r} has length {n}, and "
                            f"{have[d]} in group {g.name!r} of {where}; xarray would no longer "
                            "open the group: rename the dimension"
                        )


def _check_attrs(attrs: dict, what: str) -> None:
    for k, v in attrs.items():
        try:
            if not str(k):
                raise ValueError("attribute names are non-empty strings")
            checked_attr(str(k), _attr_value(v))  # (as the file would refuse it once open)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{what}: attribute {k!r} = {v!r} cannot be stored: {e}") from None


def _step_count(nodes: list[tuple[str, xr.Dataset]]) -> int:
    """The length of the ``step`` dimension (0 if no variable has one); the same in every node."""
    found = {ds.sizes[cv.STEP] for _, ds in nodes if cv.STEP in ds.dims}
    if len(found) > 1:
        raise ValueError(f"the {cv.STEP!r} dimension has different lengths: {sorted(found)}")
    return found.pop() if found else 0


def _define(g, name: str, var: xr.Variable, nsteps: int, compression):
    what = f"variable {name!r}"
    stepped = cv.STEP in var.dims
    if stepped:
        var = var.transpose(cv.STEP, ...)
    dims = [str(d) for d in var.dims if d != cv.STEP]
    shape = tuple(var.shape[1:] if stepped else var.shape)
    comp = _compression_of(var, compression)
    fill = var.encoding.get("lamina_fill", 0)
    try:
        d = g.create_dataset(name, shape, var.dtype, fill=fill, compression=comp)
    except lamina.DTypeError:  # a fill value read from another file that does not fit this dtype
        d = g.create_dataset(name, shape, var.dtype, compression=comp)
    if dims:
        d.attrs[cv.DIMS] = dims
    if not stepped:
        d.attrs[cv.STATIC] = 1
    _copy_attrs(d, var.attrs, what)
    return d, var, stepped


def _copy_attrs(obj, attrs: dict, what: str) -> None:
    for k, v in attrs.items():
        if obj.file.comm.rank != 0:
            break
        try:
            obj.attrs[str(k)] = _attr_value(v)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{what}: attribute {k!r} = {v!r} cannot be stored: {e}") from None


def _attr_value(v: Any):
    if isinstance(v, bool | np.bool_):
        return np.bool_(v)
    if isinstance(v, list | tuple) and v and all(isinstance(x, str) for x in v):
        return list(v)
    if isinstance(v, np.ndarray) and v.dtype.kind == "U" and v.ndim <= 1:
        # numpy strings (netCDF's flag_meanings and the like, as xarray reads them): a
        # string, or a list of them (lamina's attributes, like h5py's, take no '<U' array)
        return str(v[()]) if v.ndim == 0 else [str(x) for x in v.tolist()] or v
    return v


def _parts(var: xr.Variable, stepped: bool, size: int, turn) -> list[tuple[int, Box]]:
    """(owner rank, box) of each block this variable is written as (per step)."""
    shape = tuple(var.shape[1:] if stepped else var.shape)
    if 0 in shape:
        return []
    if not shape:
        return [(next(turn) % size, Box((), ()))]
    chunks = var.chunks
    if chunks is not None:
        per_axis = chunks[1:] if stepped else chunks
        edges = [np.concatenate(([0], np.cumsum(c))).tolist() for c in per_axis]
        boxes = [
            Box(
                tuple(e[i] for e, i in zip(edges, idx, strict=True)),
                tuple(e[i + 1] for e, i in zip(edges, idx, strict=True)),
            )
            for idx in itertools.product(*(range(len(c)) for c in per_axis))
        ]
        return [(next(turn) % size, b) for b in boxes]
    nbytes = int(np.prod(shape, dtype=np.int64)) * var.dtype.itemsize
    if size == 1 or nbytes < SMALL:
        return [(next(turn) % size, Box.from_shape(shape))]
    return [(r, b) for r, b in enumerate(decompose(shape, size)) if not b.empty]
