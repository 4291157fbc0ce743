"""OME-Zarr interchange: lamina files to OME-Zarr multiscale images and back.  Serial (one rank).

``docs/omezarr.md`` describes the layout in prose.  In short: the output is
OME-NGFF 0.4 on Zarr format 2.  Every lamina group becomes a Zarr group and
every lamina dataset an image group holding one array per level (``"0"``
the full resolution; a plain dataset has one level), of shape
``(steps, *level shape)``, chunked one step and (multiresolution datasets)
one patch per chunk, with ``multiscales`` metadata: a time axis, then the
space axes (``z``, ``y``, ``x``), and per level a scale of ``2**k`` along
each space axis.  lamina's own description (steps, step times, layout,
dtype, fill value, codecs, attribute types) is the ``"lamina"`` attribute
of the root, of each group and of each image; user attributes are copied
as JSON.

Converting back recreates every dataset with its layout and writes level 0
of every step (lamina recomputes the coarser levels).  An OME-Zarr image
not made by lamina (NGFF 0.4 on Zarr format 2, 0.5 on format 3) becomes a
plain dataset holding its level 0; a time axis becomes the steps; the
coarser levels of its pyramid are not kept (a warning says so).

Data moves in slabs of at most 64 MiB (one chunk when a chunk is larger),
aligned on the chunks of the arrays written.  Reading a Zarr store, the
work is bounded by what the store holds: the chunks copied are the ones
found on disk, never every chunk its metadata could describe, and at most
MAX_EMPTY_STEPS steps holding no stored data are committed.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import numbers
import os
import re
import stat
import time
import warnings as warnings_mod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .catalog.model import MAX_CODEC_DEPTH, MAX_CODEC_JSON
from .engines.registry import ON_DISK
from .errors import FormatError, LaminaError
from .geometry import Box
from .hdf5 import (
    SLAB_BYTES,
    USER_PREFIX,
    ZARR_MARKERS,
    ConvertError,
    ConvertResult,
    _bar,
    _check_distinct,
    _created,
    _require_serial,
    _staged,
    check_rank,
    chunk_shape,
    detect,
    not_kept,
    split_box,
)

FORMAT = "lamina-zarr"
FORMAT_VERSION = 1
#: the OME-NGFF version written
NGFF_VERSION = "0.4"
#: the attribute holding lamina's own description (root, groups, images)
KEY = "lamina"
#: largest chunk of a plain dataset's arrays (viewers read whole chunks)
CHUNK_BYTES = 4 << 20
#: values of the time points a chunk spans, read at once and kept for the next steps (bytes)
CACHE_BYTES = SLAB_BYTES
#: most steps holding no stored data a conversion from a store not made by lamina commits
MAX_EMPTY_STEPS = 1 << 16
#: names Zarr keeps its metadata under, which no group or array may take
ZARR_NAMES = frozenset({*ZARR_MARKERS, ".zmetadata"})
#: names of the space axes, by the number of dimensions (where no ``dims`` attribute names them)
SPACE_AXES = {1: ("x",), 2: ("y", "x"), 3: ("z", "y", "x")}
#: a dataset's attributes that describe its space axes in NGFF metadata: names, units, and
#: level 0's scale and translation; an image not made by lamina gives them to its dataset
CALIBRATION = ("dims", "axis_units", "scale", "translation")
#: attributes OME-Zarr readers give a meaning to: not copied from a store
OME_KEYS = frozenset(
    {
        "multiscales",
        "ome",
        "omero",
        "labels",
        "image-label",
        "plate",
        "well",
        "bioformats2raw.layout",
    }
)
#: a user attribute of such a name (or starting with USER_PREFIX) is stored as USER_PREFIX + name
RESERVED = OME_KEYS | {KEY}
#: the parameters of lamina.Multires, as the image's lamina attribute lists them
LAYOUT_PARAMS = ("patch", "tolerance", "order", "distribution", "aggregation", "verify", "optimism")
#: how JSON writes the floats it has no numbers for (as Zarr writes fill values)
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


# --------------------------------------------------------------------------
# entry points


#: destination names taken for HDF5 files, which a Zarr store does not convert to
HDF5_SUFFIXES = (".h5", ".hdf5", ".he5", ".hdf")


def wants_zarr(path) -> bool:
    """Whether *path* names an OME-Zarr destination: its name ends in ``.zarr``."""
    return os.fsdecode(path).rstrip("/" + os.sep).lower().endswith(".zarr")


def convert(
    src, dst, *, overwrite: bool = False, progress: bool | None = None, gzip: int | None = None
) -> ConvertResult:
    """Convert between lamina and OME-Zarr or HDF5, by the kind of *src* and the name of *dst*.

    A lamina *src* is written as OME-Zarr when *dst* ends in ``.zarr``,
    else as HDF5; an OME-Zarr store or an HDF5 file is written as lamina.
    The arguments are those of :func:`lamina.hdf5.convert`; *gzip* applies
    to HDF5 output only.
    """
    from . import hdf5

    kind = detect(src)
    if kind == "zarr":
        if wants_zarr(dst):
            raise ConvertError(
                f"{os.fsdecode(src)!r} is a Zarr store and {os.fsdecode(dst)!r} ends in .zarr: "
                "conversion goes to or from lamina; give a lamina destination"
            )
        if gzip is not None:
            raise ConvertError("gzip applies to HDF5 output only (the source is a Zarr store)")
        if os.fsdecode(dst).rstrip("/" + os.sep).lower().endswith(HDF5_SUFFIXES):
            raise ConvertError(
                f"{os.fsdecode(src)!r} is a Zarr store, which converts to lamina, and "
                f"{os.fsdecode(dst)!r} names an HDF5 file: convert the store to lamina first, "
                "then the lamina file to HDF5"
            )
        return zarr_to_lamina(src, dst, overwrite=overwrite, progress=progress)
    if wants_zarr(dst):
        if kind != "lamina":
            raise ConvertError(
                f"{os.fsdecode(src)!r} is an HDF5 file: convert it to lamina first, then the "
                "lamina file to OME-Zarr"
            )
        if gzip is not None:
            raise ConvertError("gzip applies to HDF5 output only (the destination is OME-Zarr)")
        return lamina_to_zarr(src, dst, overwrite=overwrite, progress=progress)
    return hdf5.convert(src, dst, overwrite=overwrite, progress=progress, gzip=gzip)


def _zarr():
    try:
        import zarr
    except ImportError:
        raise ConvertError(
            "OME-Zarr conversion needs zarr-python 3.0.8 or newer: pip install 'lamina[zarr]'"
        ) from None
    return zarr


# --------------------------------------------------------------------------
# lamina -> OME-Zarr


@dataclass
class _Out:
    """One lamina dataset to write: its arrays' chunks and the (step, level, box) slabs to move."""

    path: str
    ds: Any  # a lamina.Dataset
    levels: list[tuple[int, ...]]
    chunks: list[tuple[int, ...]]
    moves: list[tuple[int, int, Box]] = field(default_factory=list)


def lamina_to_zarr(
    src, dst, *, overwrite: bool = False, progress: bool | None = None
) -> ConvertResult:
    """Write the lamina file *src* as the OME-Zarr store *dst* (layout: docs/omezarr.md)."""
    zarr = _zarr()

    import lamina

    from . import __version__
    from .api import Dataset

    src, dst = os.fsdecode(src), os.fsdecode(dst)  # (bytes paths too, as lamina.open)
    _check_distinct(src, dst)
    t0 = time.perf_counter()
    res = ConvertResult(src, dst, "lamina->zarr")
    with lamina.open(src, "r", **ON_DISK) as f:
        _require_serial(f, "OME-Zarr")
        nsteps = f.steps
        res.steps = nsteps
        nodes = [(p.lstrip("/"), obj) for p, obj in f.walk()]
        plan: list[_Out] = []
        for path, obj in nodes:
            _check_zarr_name(path, "dataset" if isinstance(obj, Dataset) else "group", src)
            if isinstance(obj, Dataset):
                check_rank(src, path, obj, "Zarr")
                plan.append(_plan_out(path, obj, nsteps))
                res.warnings += not_kept(f, path, obj, layout=True)
                res.datasets += 1
            else:
                res.groups += 1
        total = sum(b.size * o.ds.dtype.itemsize for o in plan for _, _, b in o.moves)
        with _staged(dst, overwrite, "zarr") as tmp:
            root = zarr.open_group(tmp, mode="w", zarr_format=2)
            attrs, types = _attrs_to_json(f)
            attrs[KEY] = {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "version": __version__,
                "steps": nsteps,
                "step_times": [float(t) for t in f.engine.catalog.step_times[:nsteps]],
                "attrs": types,
            }
            root.update_attributes(attrs)
            for path, obj in nodes:
                if not isinstance(obj, Dataset):
                    attrs, types = _attrs_to_json(obj)
                    attrs[KEY] = {"kind": "group", "attrs": types}
                    _zgroup(root, path, src).update_attributes(attrs)
            with _bar(total, os.path.basename(dst.rstrip("/")) or dst, progress) as bar:
                for o in plan:
                    arrays = _write_image(root, o, nsteps, src, res.warnings)
                    for k, level, box in o.moves:
                        data = o.ds.read(box, step=k, level=level)
                        arrays[level][(k, *box.slices)] = data
                        bar.update(data.nbytes)
                        res.nbytes += data.nbytes
                        res.blocks += 1
    res.seconds = time.perf_counter() - t0
    return res


def _plan_out(path: str, ds, nsteps: int) -> _Out:
    """The arrays of dataset *ds* and the slabs to copy: those meeting what each step wrote."""
    levels = [tuple(s) for s in ds.levels]
    layout = ds.layout
    if layout is None:
        chunks = [chunk_shape(tuple(ds.shape), ds.dtype.itemsize, CHUNK_BYTES)[1:]]
    else:
        chunks = [tuple(max(1, int(p) >> k) for p in layout.patch) for k in range(len(levels))]
    out = _Out(path, ds, levels, chunks)
    for k in range(nsteps):
        written = [b for b in ds.coverage(k) if b.size]
        if not written:
            continue  # never written in step k: its chunks stay absent and read as the fill value
        for level, (shape, chunk) in enumerate(zip(levels, chunks, strict=True)):
            scaled = [_scale(b, level) for b in written]
            for box in _slabs_meeting(scaled, shape, chunk, ds.dtype.itemsize):
                out.moves.append((k, level, box))
    return out


def _write_image(root, o: _Out, nsteps: int, src: str, warnings: list[str]) -> list:
    """Create the image group of *o* (attributes, multiscales) and its arrays; returns the arrays."""
    ds = o.ds
    nd = len(ds.shape)
    group = _zgroup(root, o.path, src)
    arrays = []
    for k, (shape, chunk) in enumerate(zip(o.levels, o.chunks, strict=True)):
        try:
            arrays.append(
                group.create_array(
                    str(k),
                    shape=(nsteps, *shape),
                    chunks=(1, *chunk),
                    dtype=ds.dtype,
                    fill_value=ds.fill,
                    chunk_key_encoding={"name": "v2", "separator": "/"},  # NGFF 0.4 asks for '/'
                )
            )
        except (ValueError, TypeError) as e:
            raise ConvertError(
                f"{src!r}: dataset /{o.path}: cannot write it as Zarr: {e}"
            ) from None
    layout = ds.layout
    attrs, types = _attrs_to_json(ds)
    attrs[KEY] = {
        "kind": "dataset",
        "shape": list(ds.shape),
        "dtype": ds.dtype.str,
        "fill": _json_numbers(np.asarray(ds.fill)),
        "compression": list(ds.compression) if layout is None else [],
        "layout": None if layout is None else _layout_params(layout),
        "levels": [list(s) for s in o.levels],
        "attrs": types,
    }
    if nd in SPACE_AXES:
        attrs["multiscales"] = _multiscales(
            o.path.rsplit("/", 1)[-1], nd, o.levels, layout, _calibration(ds, warnings)
        )
    else:
        warnings.append(
            f"dataset /{o.path} has {nd} dimensions: an OME-Zarr image has 1 to 3 space axes, so "
            "it is written without multiscales metadata (viewers will not show it; converting "
            "back restores it)"
        )
    group.update_attributes(attrs)
    return arrays


def _layout_params(layout) -> dict:
    params = dataclasses.asdict(layout)
    params["patch"] = [int(p) for p in params["patch"]]
    return params


def _finite_numbers(values) -> bool:
    """Whether every one of *values* is a finite real number (not a bool): what a scale or
    translation of NGFF holds, read from an attribute or from a store's JSON."""
    return all(
        isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) for x in values
    )


def _calibration(ds, warnings: list[str]) -> dict:
    """What a dataset's attributes say of its space axes, for NGFF: ``dims`` (their names),
    ``axis_units``, ``scale`` and ``translation`` (one entry per axis, at level 0), each kept
    where it is well formed and warned about where it is not (the default is used then)."""
    nd = len(ds.shape)
    out: dict[str, list] = {}
    for key in CALIBRATION:
        if key not in ds.attrs:
            continue
        v = ds.attrs[key]
        v = list(v) if isinstance(v, list | tuple | np.ndarray) else None
        why = None
        if v is None or len(v) != nd:
            why = f"not a list of {nd} entries, one per axis"
        elif key in ("dims", "axis_units") and not all(isinstance(x, str) for x in v):
            why = "not a list of strings"
        elif key == "dims" and (len(set(v)) != nd or "" in v or "t" in v):
            why = "NGFF axis names must be distinct and non-empty, and 't' names the time axis"
        elif key in ("scale", "translation") and not _finite_numbers(v):
            why = "not a list of finite numbers"
        elif key == "scale" and not all(x > 0 for x in v):
            why = "a scale must be > 0"
        if why is None:
            out[key] = [x if isinstance(x, str) else float(x) for x in v]
        else:
            warnings.append(
                f"dataset {ds.name}: its attribute {key!r} ({ds.attrs[key]!r}) does not describe "
                f"its axes in the OME-Zarr metadata: {why}"
            )
    return out


def _multiscales(
    name: str, nd: int, levels: list[tuple[int, ...]], layout, calib: dict | None = None
) -> list[dict]:
    calib = calib or {}
    names = calib.get("dims") or SPACE_AXES[nd]
    units = calib.get("axis_units") or [""] * nd
    axes: list[dict] = [{"name": "t", "type": "time"}]
    for a, u in zip(names, units, strict=True):
        axes.append({"name": a, "type": "space", **({"unit": u} if u else {})})
    scale = calib.get("scale") or [1.0] * nd
    datasets = []
    for k in range(len(levels)):
        transforms: list[dict] = [
            {"type": "scale", "scale": [1.0] + [float(s * 2**k) for s in scale]}
        ]
        if "translation" in calib:
            transforms.append({"type": "translation", "translation": [0.0, *calib["translation"]]})
        datasets.append({"path": str(k), "coordinateTransformations": transforms})
    ms: dict[str, Any] = {"version": NGFF_VERSION, "name": name, "axes": axes, "datasets": datasets}
    if layout is not None:
        ms["type"] = "CDF 5/3 wavelet"
        ms["metadata"] = {
            "description": "level k is the approximation of a CDF 5/3 lifting wavelet per patch; "
            "coarse sample i sits at fine sample 2**k * i",
            "tolerance": layout.tolerance,
        }
    return [ms]


def _check_zarr_name(path: str, kind: str, src: str) -> None:
    """ConvertError if a name in *path* is one of Zarr's metadata files, or holds a backslash
    (Zarr takes it for a separator): Zarr could not hold it under that name."""
    for name in path.split("/"):
        if "\\" in name:
            raise ConvertError(
                f"{src!r}: {kind} /{path}: {name!r} holds a backslash, which Zarr takes for a "
                "path separator, so Zarr cannot hold it under that name; rename it first"
            )
        if name in ZARR_NAMES:
            raise ConvertError(
                f"{src!r}: {kind} /{path}: {name!r} is the name of a Zarr metadata file, so "
                "Zarr cannot hold it under that name; rename it first"
            )


def _zgroup(root, path: str, src: str):
    """The Zarr group *path* below *root*, created if missing; ConvertError if Zarr cannot name it."""
    try:
        return root.require_group(path)
    except (ValueError, TypeError, KeyError) as e:
        raise ConvertError(f"{src!r}: /{path}: cannot write it as a Zarr group: {e}") from None


def _scale(box: Box, level: int) -> Box:
    """*box* in the coordinates of *level* (the cells it touches)."""
    return Box(tuple(a >> level for a in box.start), tuple(-((-b) >> level) for b in box.stop))


# --------------------------------------------------------------------------
# slabs aligned on chunks


def _slab_grid(
    chunks: tuple[int, ...], grid: tuple[int, ...], itemsize: int, limit: int = SLAB_BYTES
) -> tuple[int, ...]:
    """Chunks per slab along each axis: whole trailing axes while the slab fits *limit* bytes."""
    sg = [1] * len(chunks)
    nbytes = math.prod(chunks) * itemsize
    for d in reversed(range(len(chunks))):
        n = max(1, grid[d])
        if nbytes * n <= limit:
            sg[d] = n
            nbytes *= n
        else:
            sg[d] = max(1, limit // max(1, nbytes))
            break
    return tuple(sg)


def _grid(shape: tuple[int, ...], chunks: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(-(-n // c) for n, c in zip(shape, chunks, strict=True))


def _slabs_meeting(
    boxes: list[Box], shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int
) -> list[Box]:
    """The chunk-aligned slabs (of at most SLAB_BYTES, or one chunk) that meet *boxes*, C-ordered."""
    span = [
        s * c
        for s, c in zip(_slab_grid(chunks, _grid(shape, chunks), itemsize), chunks, strict=True)
    ]
    idxs: set[tuple[int, ...]] = set()
    for b in boxes:
        if b.size:
            idxs.update(
                itertools.product(
                    *(
                        range(a // s, (z - 1) // s + 1)
                        for a, z, s in zip(b.start, b.stop, span, strict=True)
                    )
                )
            )
    return [
        Box(
            tuple(i * s for i, s in zip(idx, span, strict=True)),
            tuple(min((i + 1) * s, n) for i, s, n in zip(idx, span, shape, strict=True)),
        )
        for idx in sorted(idxs)
    ]


def _slabs_of_chunks(
    coords, shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int
) -> list[Box]:
    """Boxes covering the chunks at grid *coords*: a whole slab when it holds all of its chunks.

    Each box is at most SLAB_BYTES, or one chunk split by :func:`split_box`.
    """
    grid = _grid(shape, chunks)
    sg = _slab_grid(chunks, grid, itemsize)
    by_slab: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
    for c in coords:
        by_slab.setdefault(tuple(i // s for i, s in zip(c, sg, strict=True)), set()).add(c)
    out: list[Box] = []
    for idx in sorted(by_slab):
        members = by_slab[idx]
        lo = [i * s for i, s in zip(idx, sg, strict=True)]
        hi = [min((i + 1) * s, g) for i, s, g in zip(idx, sg, grid, strict=True)]
        if len(members) == math.prod(b - a for a, b in zip(lo, hi, strict=True)):
            ranges = [(lo, hi)]
        else:
            ranges = [(list(c), [i + 1 for i in c]) for c in sorted(members)]
        for a, b in ranges:
            box = Box(
                tuple(i * c for i, c in zip(a, chunks, strict=True)),
                tuple(min(i * c, n) for i, c, n in zip(b, chunks, shape, strict=True)),
            )
            out.extend(split_box(box, itemsize, SLAB_BYTES))
    return out


# --------------------------------------------------------------------------
# OME-Zarr -> lamina


@dataclass
class _Image:
    """One image to copy into one lamina dataset."""

    path: str  # the lamina dataset's path
    where: str  # '/path' in the store, for messages
    group: Any  # the zarr.Group holding the image (its attributes are the dataset's)
    array: Any  # the zarr.Array of level 0
    dtype: np.dtype
    shape: tuple[int, ...]
    fill: object
    time_axis: int | None
    space_axes: list[int]
    layout: dict | None = None
    codecs: list = field(default_factory=list)
    types: dict = field(default_factory=dict)
    steps: int = 0  # the time points it has (1 without a time axis)
    #: boxes holding data, by time chunk
    boxes: dict[int, list[Box]] = field(default_factory=dict)
    time_chunk: int = 1
    made: bool = False
    #: bytes the values of several time points, read at once, may take (0: one at a time)
    cache_bytes: int = 0
    #: box (start, stop) -> (first time point, its values at that and the next time points)
    cache: dict = field(default_factory=dict)
    #: attributes describing the space axes (CALIBRATION), of an image not made by lamina
    calibration: dict = field(default_factory=dict)

    def boxes_at(self, k: int) -> list[Box]:
        if self.time_axis is None:
            return self.boxes.get(0, []) if k == 0 else []
        return self.boxes.get(k // self.time_chunk, []) if k < self.steps else []

    def spans(self) -> list[tuple[int, int, list[Box]]]:
        """(first step, stop step, boxes) of each time chunk holding stored data."""
        if self.time_axis is None:
            return [(0, 1, self.boxes[0])] if 0 in self.boxes and self.steps else []
        tc = self.time_chunk
        return [
            (c * tc, min((c + 1) * tc, self.steps), boxes)
            for c, boxes in sorted(self.boxes.items())
            if c * tc < self.steps
        ]

    def read(self, k: int, box: Box, src: str) -> np.ndarray:
        """The values of *box* at time point *k*.

        A chunk spanning several time points is decoded whole at each read:
        the values of the next time points are read along with *k* (as many
        as *cache_bytes* holds for all the boxes of the chunk) and kept for
        the next steps, so that each chunk is decoded about once.
        """
        if self.time_axis is None or self.time_chunk == 1 or not self.cache_bytes:
            return self._read(k, k + 1, box, src)[0]
        key = (box.start, box.stop)
        hit = self.cache.get(key)
        if hit is None or not hit[0] <= k < hit[0] + len(hit[1]):
            stop = min((k // self.time_chunk + 1) * self.time_chunk, self.steps)
            per_step = sum(b.size for b in self.boxes_at(k)) * self.dtype.itemsize
            n = min(stop - k, self.cache_bytes // max(1, per_step))
            if n <= 1:
                return self._read(k, k + 1, box, src)[0]
            # the values of earlier time points are never read again (steps go forward)
            for old in [o for o, (t, v) in self.cache.items() if t + len(v) <= k]:
                del self.cache[old]
            hit = self.cache[key] = (k, self._read(k, k + n, box, src))
        return hit[1][k - hit[0]]

    def _read(self, k0: int, k1: int, box: Box, src: str) -> np.ndarray:
        """The values of *box* at time points *k0* to *k1* - 1, shape ``(k1 - k0, *box.shape)``."""
        sel: list[Any] = [0] * self.array.ndim
        if self.time_axis is not None:
            sel[self.time_axis] = slice(k0, k1)
        for ax, s in zip(self.space_axes, box.slices, strict=True):
            sel[ax] = s
        try:
            data = np.asarray(self.array[tuple(sel)])
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
            steps = f"step {k0}" if k1 == k0 + 1 else f"steps {k0} to {k1 - 1}"
            raise FormatError(
                f"{src!r}: image {self.where}: cannot read {box} of {steps}: {e}"
            ) from None
        return data.astype(self.dtype, copy=False).reshape((k1 - k0, *box.shape))


def zarr_to_lamina(
    src, dst, *, overwrite: bool = False, progress: bool | None = None
) -> ConvertResult:
    """Write the OME-Zarr store *src* as the lamina file *dst*.

    A store made by :func:`lamina_to_zarr` gets back its datasets with
    their layouts (level 0 of every step is written; lamina recomputes the
    coarser levels); every other OME-Zarr image becomes a plain dataset
    holding its level 0, its time axis (if any) the steps.
    """
    zarr = _zarr()

    import lamina

    src, dst = os.fsdecode(src), os.fsdecode(dst)  # (bytes paths too, as lamina.open)
    _check_distinct(src, dst)
    _require_serial(None, "OME-Zarr")
    t0 = time.perf_counter()
    res = ConvertResult(src, dst, "zarr->lamina")
    root = _open_root(zarr, src)
    root_attrs = root.attrs.asdict()
    meta = root_attrs.get(KEY)
    made = isinstance(meta, dict) and meta.get("format") == FORMAT
    res.source_kind = "lamina" if made else "plain"
    nsteps = 0
    root_types: dict = {}
    if made:
        assert isinstance(meta, dict)
        version = _meta_int(meta, "format_version", f"{src!r}: attribute {KEY}")
        if version > FORMAT_VERSION:
            raise FormatError(
                f"{src!r} uses lamina-zarr layout version {version}; this lamina reads up to {FORMAT_VERSION}"
            )
        nsteps = _meta_int(meta, "steps", f"{src!r}: attribute {KEY}")
        times = meta.get("step_times")
        if not isinstance(times, list) or len(times) != nsteps:
            raise FormatError(
                f"{src!r}: attribute {KEY}: 'steps' says {nsteps} steps, 'step_times' "
                f"holds {len(times) if isinstance(times, list) else 'no list'}: the store is inconsistent"
            )
        root_types = _types(meta, f"{src!r}: attribute {KEY}")
    groups: list[tuple[str, dict]] = []
    images: list[_Image] = []
    one_image = not made and _multiscales_of(root_attrs) is not None
    if one_image:
        name = _root_name(src)
        img = _image(zarr, src, name, "/", root, root_attrs, False, 0, res.warnings)
        if img is not None:
            images.append(img)
    else:
        _walk(zarr, src, root, "", made, nsteps, groups, images, res.warnings)
    if not images and not made:
        skipped = [w for w in res.warnings if w.startswith("skipped image ")]
        if skipped:
            raise ConvertError(
                f"{src!r} holds no OME-Zarr image lamina can convert: {'; '.join(skipped)}"
            )
        raise ConvertError(
            f"{src!r} holds no OME-Zarr image: no group has 'multiscales' metadata "
            "(in .zattrs, or under 'ome' in zarr.json)"
        )
    for img in images:
        if not img.made:
            _bound_steps(img)
    plain_steps = [img.steps for img in images if not img.made]
    nsteps = max([nsteps, *plain_steps])
    if not made:
        _check_empty_steps(images, nsteps, src)
    spanning = [img for img in images if img.time_axis is not None and img.time_chunk > 1]
    for img in spanning:
        img.cache_bytes = CACHE_BYTES // len(spanning)
    for img in images:
        if not img.made and img.time_axis is not None:
            declared = int(img.array.shape[img.time_axis])
            if declared > img.steps:
                res.warnings.append(
                    f"image {img.where}: time points {img.steps} to {declared - 1} hold no stored "
                    "data: not converted"
                )
    res.steps = nsteps
    res.groups, res.datasets = len(groups), len(images)
    total = sum(
        b.size * img.dtype.itemsize * (stop - first)
        for img in images
        for first, stop, boxes in img.spans()
        for b in boxes
    )
    with _staged(dst, overwrite, "lamina") as tmp, lamina.open(tmp, "w", **ON_DISK) as f:
        _require_serial(f, "OME-Zarr")
        if not one_image:  # (a store that is one image: its attributes are the dataset's)
            _attrs_from_json(root_attrs, f.attrs, "/", made, root_types, res.warnings)
        for path, attrs in groups:
            where = "/" + path
            try:
                g = f.require_group(path)
            except (LaminaError, ValueError, TypeError) as e:
                raise ConvertError(f"{src!r}: group {where}: {e}") from None
            lm = attrs.get(KEY) if made else None
            types = _types(lm, f"{src!r}: group {where}") if isinstance(lm, dict) else {}
            _attrs_from_json(attrs, g.attrs, where, made, types, res.warnings)
        targets = {}
        for img in images:
            targets[img.path] = _create(f, img, src, res.warnings)
        with _bar(total, os.path.basename(dst.rstrip("/")) or dst, progress) as bar:
            for k in range(nsteps):
                with f.step():
                    for img in images:
                        for box in img.boxes_at(k):
                            data = img.read(k, box, src)
                            targets[img.path].write(data, offset=box.start)
                            bar.update(data.nbytes)
                            res.nbytes += data.nbytes
                            res.blocks += 1
    res.seconds = time.perf_counter() - t0
    return res


def _open_root(zarr, src: str):
    try:
        node = zarr.open(store=src, mode="r")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConvertError(f"{src!r}: cannot open it as a Zarr store: {e}") from None
    if not isinstance(node, zarr.Group):
        raise ConvertError(f"{src!r} is a Zarr array, not a group of OME-Zarr images")
    return node


def _root_name(src: str) -> str:
    """The dataset name of a store that is one image: its directory name without '.zarr'."""
    base = os.path.basename(os.path.abspath(src))
    stem = base[: -len(".zarr")] if base.lower().endswith(".zarr") else base
    return stem if stem and stem not in (".", "..") else "image"


def _members(group, where: str, src: str) -> list[tuple[str, Any]]:
    try:
        return sorted(group.members(), key=lambda m: m[0])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConvertError(f"{src!r}: group {where}: cannot list its members: {e}") from None


def _walk(
    zarr,
    src: str,
    group,
    path: str,
    made: bool,
    nsteps: int,
    groups: list,
    images: list,
    warnings: list[str],
) -> None:
    """Collect groups and images below *group*, depth first (each member, sorted by name,
    then what is below it), with a stack of the members still to visit: a store's groups
    may nest deeper than Python's recursion limit."""
    todo = [(path, iter(_members(group, "/" + path, src)))]
    while todo:
        path, members = todo[-1]
        member = next(members, None)
        if member is None:
            todo.pop()
            continue
        name, child = member
        cpath = f"{path}/{name}" if path else name
        if isinstance(child, zarr.Array):
            warnings.append(f"skipped array /{cpath}: it is not part of an OME-Zarr image")
            continue
        attrs = child.attrs.asdict()
        lm = attrs.get(KEY)
        is_made = made and isinstance(lm, dict) and lm.get("kind") == "dataset"
        if is_made or _multiscales_of(attrs) is not None:
            img = _image(zarr, src, cpath, "/" + cpath, child, attrs, is_made, nsteps, warnings)
            if img is not None:
                images.append(img)
        else:
            groups.append((cpath, attrs))
            todo.append((cpath, iter(_members(child, "/" + cpath, src))))


def _multiscales_of(attrs: dict):
    """The ``multiscales`` metadata of a group's attributes (NGFF 0.4, or 0.5 under 'ome'), else None."""
    if "multiscales" in attrs:
        return attrs["multiscales"]
    ome = attrs.get("ome")
    if isinstance(ome, dict) and "multiscales" in ome:
        return ome["multiscales"]
    return None


def _image(
    zarr,
    src: str,
    path: str,
    where: str,
    group,
    attrs: dict,
    made: bool,
    nsteps: int,
    warnings: list[str],
) -> _Image | None:
    """The image of *group*, checked; None (with a warning) if lamina cannot hold its values."""
    if made:
        img = _made_image(zarr, src, path, where, group, attrs, nsteps)
        levels = attrs[KEY].get("levels")
        used = {str(k) for k in range(len(levels) if isinstance(levels, list) else 1)}
    else:
        found = _plain_image(zarr, src, path, where, group, attrs, warnings)
        if found is None:
            return None
        img, used = found
    for name, _ in _members(group, where, src):
        if name not in used:
            warnings.append(
                f"skipped {where.rstrip('/')}/{name}: a member of image {where} "
                "(a lamina dataset holds no members)"
            )
    _find_boxes(img, src, warnings)
    return img


def _made_image(zarr, src: str, path: str, where: str, group, attrs: dict, nsteps: int) -> _Image:
    from .catalog import check_dtype
    from .errors import DTypeError

    what = f"{src!r}: dataset {where}"
    lm = attrs[KEY]
    shape = lm.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise FormatError(f"{what}: attribute {KEY}: 'shape' is not a list of sizes: {shape!r}")
    try:
        dt = check_dtype(lm.get("dtype"))
    except (DTypeError, TypeError) as e:
        raise FormatError(f"{what}: attribute {KEY}: 'dtype': {e}") from None
    ok, fill, why = _numbers_from_json(lm.get("fill"), {"dtype": dt.str, "shape": []})
    if not ok:
        raise FormatError(f"{what}: attribute {KEY}: 'fill': {why}")
    codecs = lm.get("compression") or []
    text = json.dumps(codecs)
    if (
        not isinstance(codecs, list)
        or not all(isinstance(c, dict) for c in codecs)
        or len(text) > MAX_CODEC_JSON
        or _depth(codecs) > MAX_CODEC_DEPTH
    ):
        raise FormatError(
            f"{what}: attribute {KEY}: 'compression' is not a list of codec objects "
            f"(at most {MAX_CODEC_JSON} bytes of JSON)"
        )
    layout = lm.get("layout")
    if layout is not None and (
        not isinstance(layout, dict)
        or not set(layout) <= set(LAYOUT_PARAMS)
        or "patch" not in layout
    ):
        raise FormatError(
            f"{what}: attribute {KEY}: 'layout' must hold lamina.Multires parameters "
            f"({', '.join(LAYOUT_PARAMS)}), got {layout!r}"
        )
    arr = _array(zarr, group, "0", where, src)
    want = (nsteps, *shape)
    if tuple(arr.shape) != want or np.dtype(arr.dtype) != dt:
        raise FormatError(
            f"{what}: array 0 is {np.dtype(arr.dtype)} of shape {tuple(arr.shape)}; the dataset "
            f"({dt}, shape {tuple(shape)}) over {nsteps} steps needs {dt} of shape {want}"
        )
    return _Image(
        path,
        where,
        group,
        arr,
        dt,
        tuple(shape),
        fill,
        0,
        list(range(1, 1 + len(shape))),
        layout=layout,
        codecs=codecs,
        types=_types(lm, f"{what}: attribute {KEY}"),
        steps=nsteps,
        made=True,
    )


def _plain_image(
    zarr, src: str, path: str, where: str, group, attrs: dict, warnings: list[str]
) -> tuple[_Image, set[str]] | None:
    """An OME-Zarr image not made by lamina: its multiscales checked, level 0 to copy."""
    from .catalog import check_dtype
    from .errors import DTypeError

    what = f"{src!r}: image {where}"
    ms = _multiscales_of(attrs)
    if not isinstance(ms, list) or not ms or not isinstance(ms[0], dict):
        raise ConvertError(f"{what}: 'multiscales' must be a non-empty list of objects, got {ms!r}")
    if len(ms) > 1:
        warnings.append(f"image {where} has {len(ms)} multiscales: the first is converted")
    m = ms[0]
    dsets = m.get("datasets")
    if (
        not isinstance(dsets, list)
        or not dsets
        or not all(isinstance(d, dict) and isinstance(d.get("path"), str) for d in dsets)
    ):
        raise ConvertError(
            f"{what}: multiscales 'datasets' must be a non-empty list of objects with a 'path'"
        )
    axes = m.get("axes")
    if not isinstance(axes, list) or not axes:
        raise ConvertError(
            f"{what}: multiscales has no 'axes' (OME-NGFF 0.3 or newer names them); "
            "lamina needs to know which axes are space and time"
        )
    names, kinds = [], []
    for a in axes:
        if isinstance(a, str):  # NGFF 0.3: names only
            names.append(a)
            kinds.append(
                {"t": "time", "c": "channel"}.get(a, "space" if a in ("x", "y", "z") else None)
            )
        elif isinstance(a, dict) and isinstance(a.get("name"), str):
            names.append(a["name"])
            kinds.append(a.get("type"))
        else:
            raise ConvertError(f"{what}: multiscales axis {a!r} has no name")
    arr = _array(zarr, group, dsets[0]["path"], where, src)
    if len(axes) != arr.ndim:
        raise ConvertError(
            f"{what}: multiscales has {len(axes)} axes ({', '.join(names)}) but its array "
            f"{dsets[0]['path']!r} has {arr.ndim} dimensions (shape {tuple(arr.shape)})"
        )
    if len(set(names)) != len(names):
        raise ConvertError(
            f"{what}: multiscales axes {names}: axis names must be unique (OME-NGFF)"
        )
    scale, translation = _calibrated(m, len(axes), what)
    times = [i for i, k in enumerate(kinds) if k == "time"]
    space = [i for i, k in enumerate(kinds) if k == "space"]
    if len(times) > 1 or (times and times[0] != 0):
        raise ConvertError(
            f"{what}: axes {names}: a time axis must be the first, and there may be only one"
        )
    if not 1 <= len(space) <= 3:
        raise ConvertError(
            f"{what}: axes {names} have {len(space)} space axes; lamina converts images "
            "with 1 to 3 space axes"
        )
    for i, (name, kind) in enumerate(zip(names, kinds, strict=True)):
        if kind in ("time", "space"):
            continue
        n = int(arr.shape[i])
        if n != 1:
            raise ConvertError(
                f"{what}: axis {name!r} of type {kind!r} has {n} entries: lamina datasets have "
                "no channel axis (split the channels into images of their own first)"
            )
        warnings.append(f"image {where}: its axis {name!r} of type {kind!r} (length 1) is dropped")
    try:
        dt = check_dtype(np.dtype(arr.dtype))
    except (DTypeError, TypeError):
        warnings.append(f"skipped image {where}: dtype {arr.dtype} is not numeric")
        return None
    fill = arr.fill_value
    try:
        # null (Zarr format 2): zarr-python reads missing chunks as 0 (False), not as NaN
        fill = np.zeros((), dt)[()] if fill is None else np.asarray(fill).astype(dt)[()]
    except (TypeError, ValueError):
        fill = np.zeros((), dt)[()]
    if len(dsets) > 1:
        warnings.append(
            f"image {where}: the {len(dsets) - 1} coarser levels of its pyramid are not kept; "
            f"lamina keeps level 0 ({dsets[0]['path']!r}) as a plain dataset"
        )
    calib: dict[str, list] = {"dims": [names[i] for i in space]}
    units = [a.get("unit") if isinstance(a, dict) else None for a in axes]
    if times:
        t = times[0]
        said = [
            f"{k} {v[t]:g}"
            for k, v, default in (("scale", scale, 1.0), ("translation", translation, 0.0))
            if v is not None and v[t] != default
        ] + ([f"unit {units[t]!r}"] if isinstance(units[t], str) and units[t] else [])
        if said:
            warnings.append(
                f"image {where}: its time axis's {', '.join(said)} is not kept (a lamina file "
                "numbers its steps; the step times are when they were written)"
            )
    if any(isinstance(units[i], str) and units[i] for i in space):
        calib["axis_units"] = [units[i] if isinstance(units[i], str) else "" for i in space]
    if scale is not None and any(scale[i] != 1 for i in space):
        calib["scale"] = [scale[i] for i in space]
    if translation is not None and any(translation[i] != 0 for i in space):
        calib["translation"] = [translation[i] for i in space]
    img = _Image(
        path,
        where,
        group,
        arr,
        dt,
        tuple(int(arr.shape[i]) for i in space),
        fill,
        times[0] if times else None,
        space,
        calibration=calib,
    )
    used = {d["path"].strip("/").split("/", 1)[0] for d in dsets}
    return img, used


def _calibrated(m: dict, n: int, what: str) -> tuple[list | None, list | None]:
    """Level 0's scale and translation in the image's physical space: its dataset's, then
    the multiscales' own (NGFF 0.4 applies those after each dataset's), composed."""
    scale, translation = _transforms(
        m["datasets"][0], n, f"{what}: multiscales dataset {m['datasets'][0]['path']!r}"
    )
    outer_scale, outer_translation = _transforms(m, n, f"{what}: multiscales")
    if outer_scale is None and outer_translation is None:
        return scale, translation
    s2 = outer_scale or [1.0] * n
    s1, t1 = scale or [1.0] * n, translation or [0.0] * n
    t2 = outer_translation or [0.0] * n
    return [a * b for a, b in zip(s2, s1, strict=True)], [
        a * b + c for a, b, c in zip(s2, t1, t2, strict=True)
    ]


def _transforms(obj: dict, n: int, what: str) -> tuple[list | None, list | None]:
    """The scale and translation of a multiscales dataset, or of the multiscales (NGFF 0.4:
    one number per axis, a scale > 0); (None, None) where it gives none (NGFF 0.3 has no
    transformations)."""
    ct = obj.get("coordinateTransformations")
    if ct is None:
        return None, None
    where = f"{what}: coordinateTransformations"
    if not isinstance(ct, list) or not all(isinstance(t, dict) for t in ct):
        raise ConvertError(f"{where} must be a list of objects, got {ct!r}")
    found: dict[str, list] = {}
    for t in ct:
        kind = t.get("type")
        if kind not in ("scale", "translation") or kind not in t:
            continue  # identity, or given by a 'path' (a file of its own): nothing to keep
        v = t[kind]
        if not isinstance(v, list) or len(v) != n or not _finite_numbers(v):
            raise ConvertError(f"{where}: {kind} {v!r} must be {n} finite numbers, one per axis")
        if kind == "scale" and not all(x > 0 for x in v):
            raise ConvertError(f"{where}: scale {v!r} must be > 0 on every axis")
        found[kind] = [float(x) for x in v]
    return found.get("scale"), found.get("translation")


def _array(zarr, group, path: str, where: str, src: str):
    try:
        arr = group[path]
    except KeyError:
        arr = None
    except (ValueError, OSError, TypeError) as e:  # e.g. a codec this installation lacks
        raise ConvertError(
            f"{src!r}: image {where}: cannot open {path!r}, its level 0: {type(e).__name__}: {e}"
        ) from None
    if not isinstance(arr, zarr.Array):
        raise ConvertError(
            f"{src!r}: image {where}: {path!r}, its level 0, is not an array in the store"
        )
    return arr


def _find_boxes(img: _Image, src: str, warnings: list[str]) -> None:
    """The boxes of *img* that hold data, by time chunk, from the chunks the store holds."""
    arr = img.array
    outer, stored = _stored_chunks(arr, src, warnings)
    space_chunks = tuple(outer[i] for i in img.space_axes)
    by_time: dict[int, set[tuple[int, ...]]] = {}
    for c in stored:
        tc = c[img.time_axis] if img.time_axis is not None else 0
        by_time.setdefault(tc, set()).add(tuple(c[i] for i in img.space_axes))
    img.time_chunk = outer[img.time_axis] if img.time_axis is not None else 1
    img.boxes = {
        tc: _slabs_of_chunks(sorted(cs), img.shape, space_chunks, img.dtype.itemsize)
        for tc, cs in sorted(by_time.items())
    }


def _bound_steps(img: _Image) -> None:
    """The steps of a plain image: its time points up to the last that holds stored data.

    An image that holds no stored data (every chunk the fill value) is one
    step in which it is not written: it reads as its fill value.
    """
    if img.time_axis is None:
        img.steps = 1
        return
    declared = int(img.array.shape[img.time_axis])
    held = (max(img.boxes) + 1) * img.time_chunk if img.boxes else 1
    img.steps = min(declared, held)


def _check_empty_steps(images: list[_Image], nsteps: int, src: str) -> None:
    """ConvertError if more than MAX_EMPTY_STEPS of the *nsteps* steps hold no stored data.

    Each such step is still a commit: a time point far along the time axis
    (the only one stored, say) must not make a conversion of a few bytes
    commit millions of steps.
    """
    spans = sorted((first, stop) for img in images for first, stop, _ in img.spans())
    held, reach = 0, 0
    for first, stop in spans:
        held += max(0, stop - max(first, reach))
        reach = max(reach, stop)
    empty = nsteps - held
    if empty > MAX_EMPTY_STEPS:
        far = max((img for img in images if img.time_axis is not None), key=lambda img: img.steps)
        raise ConvertError(
            f"{src!r}: image {far.where}: its stored data reaches time point {far.steps - 1}, "
            f"but only {held} of the {nsteps} time points hold any: converting would commit "
            f"{empty} steps holding nothing (at most {MAX_EMPTY_STEPS}); copy the time points "
            "wanted into a store of their own first"
        )


def _stored_chunks(
    arr, src: str, warnings: list[str]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """(the array's chunk or shard shape, the grid coordinates of the chunks found on disk).

    The array's directory is listed and each file name decoded with the
    array's chunk key encoding; names that do not encode a chunk of the
    grid (metadata, strays) are ignored.  Directories reached through
    symlinks are listed too, each one once (a link back to a directory
    already listed, a loop say, is not followed).
    """
    shape = tuple(int(n) for n in arr.shape)
    outer = tuple(int(c) for c in (getattr(arr, "shards", None) or arr.chunks))
    grid = _grid(shape, outer)
    md = arr.metadata
    enc = getattr(md, "chunk_key_encoding", None)
    if enc is not None:
        sep, prefixed = enc.separator, getattr(enc, "name", "default") == "default"
    else:
        sep, prefixed = getattr(md, "dimension_separator", None) or ".", False
    top = os.path.join(src, *arr.path.split("/"))
    found = []
    seen = set()
    try:
        st = os.stat(top)
        seen.add((st.st_dev, st.st_ino))
    except OSError:
        pass
    # directories reached through symlinks are followed (zarr reads them), each directory once
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        rel = os.path.relpath(dirpath, top)
        parts = [] if rel == "." else rel.split(os.sep)
        if len(parts) >= len(shape):  # deeper than any chunk key reaches
            dirnames[:] = []
        for d in list(dirnames):
            try:
                st = os.stat(os.path.join(dirpath, d))
            except OSError:  # a dangling link: no chunk there
                dirnames.remove(d)
                continue
            if (st.st_dev, st.st_ino) in seen:
                dirnames.remove(d)
                warnings.append(
                    f"array {'/' + arr.path}: directory {'/'.join([*parts, d])!r} is a link to "
                    "a directory already listed: its chunks are not read again"
                )
                continue
            seen.add((st.st_dev, st.st_ino))
        for fn in filenames:
            key = "/".join([*parts, fn])
            coords = _decode_key(key, sep, prefixed, len(shape))
            if (
                coords is not None
                and all(0 <= c < g for c, g in zip(coords, grid, strict=True))
                and md.encode_chunk_key(coords) == key
            ):
                if _check_regular(os.path.join(dirpath, fn), src):
                    found.append(coords)
    return outer, found


def _check_regular(path: str, src: str) -> bool:
    """Whether the chunk file *path* is there (a dangling link is not: as zarr-python reads
    it, a chunk not stored); FormatError unless it is a regular file (reading a FIFO would
    block for ever, a device might never end)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise FormatError(f"{src!r}: chunk {path!r} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(
            f"{src!r}: chunk {path!r} is not a regular file (a FIFO or a device): "
            "the store is not converted"
        )
    return True


def _decode_key(key: str, sep: str, prefixed: bool, ndim: int) -> tuple[int, ...] | None:
    parts = key.split(sep)
    if prefixed:
        if not parts or parts[0] != "c":
            return None
        parts = parts[1:]
    if len(parts) != ndim or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def _create(f, img: _Image, src: str, warnings: list[str]):
    """The lamina dataset of *img* (with its attributes)."""
    import lamina

    what = f"{src!r}: dataset {img.where}"
    layout = None
    if img.layout is not None:
        params = dict(img.layout)
        params["patch"] = (
            tuple(params["patch"]) if isinstance(params["patch"], list) else params["patch"]
        )
        try:
            layout = lamina.Multires(**params)
        except TypeError as e:
            raise FormatError(f"{what}: attribute {KEY}: 'layout': {e}") from None
    ds = _created(
        what,
        img.made,
        f.create_dataset,
        img.path,
        shape=img.shape,
        dtype=img.dtype,
        fill=img.fill,
        compression=img.codecs or None,
        layout=layout,
    )
    _attrs_from_json(img.group.attrs.asdict(), ds.attrs, img.where, img.made, img.types, warnings)
    for key, value in img.calibration.items():
        if key in ds.attrs:
            warnings.append(
                f"image {img.where}: its axes' {key} ({value!r}) is not kept: the image has an "
                "attribute of that name"
            )
        else:
            ds.attrs[key] = value
    return ds


# --------------------------------------------------------------------------
# attributes


def _attrs_to_json(obj) -> tuple[dict, dict]:
    """The attributes of a lamina object as JSON values, and the types of the numeric ones."""
    out: dict[str, Any] = {}
    types: dict[str, dict] = {}
    for name in obj.attrs:
        value = obj.attrs[name]
        zname = USER_PREFIX + name if name in RESERVED or name.startswith(USER_PREFIX) else name
        if isinstance(value, str):
            out[zname] = value
            continue
        arr = np.asarray(value)
        if arr.dtype.kind == "O":  # a list of strings
            out[zname] = [str(v) for v in arr.reshape(-1).tolist()]
            continue
        out[zname] = _json_numbers(arr)
        types[zname] = {"dtype": arr.dtype.str, "shape": list(arr.shape)}
        if _wider_than_f8(arr.dtype):  # (JSON numbers are float64: the exact digits beside)
            types[zname]["exact"] = _exact_digits(arr)
    return out, types


#: a long double as :func:`_exact_digits` writes it: at most 40 characters of a decimal
#: number in scientific notation (NumPy's shortest digits of a 128-bit float take 36)
_DECIMAL = re.compile(r"[+-]?[0-9](\.[0-9]*)?e[+-][0-9]{1,5}")


def _decimal(v) -> bool:
    return isinstance(v, str) and len(v) <= 40 and _DECIMAL.fullmatch(v) is not None


def _wider_than_f8(dt: np.dtype) -> bool:
    """Whether *dt* is a long double (complex) type, whose values float64 would round."""
    return (dt.kind == "f" and dt.itemsize > 8) or (dt.kind == "c" and dt.itemsize > 16)


def _exact_digits(arr: np.ndarray):
    """Long double values as the shortest decimal strings that read back exactly (complex as
    [re, im]), in nested lists; NaN and infinities as :func:`_json_numbers` writes them."""
    if arr.dtype.kind == "c":
        arr = np.stack([arr.real, arr.imag], axis=-1)
    flat = [
        np.format_float_scientific(v, unique=True)
        if np.isfinite(v)
        else ("NaN" if np.isnan(v) else "Infinity" if v > 0 else "-Infinity")
        for v in arr.reshape(-1)
    ]
    return np.array(flat, dtype=object).reshape(arr.shape).tolist()


def _json_numbers(arr: np.ndarray):
    """Numbers as JSON: nested lists; complex as [re, im]; NaN and infinities as strings."""
    if arr.dtype.kind == "c":
        arr = np.stack([arr.real, arr.imag], axis=-1)
    if arr.dtype.kind == "f":
        out = arr.astype(np.float64).astype(object)
        bad = ~np.isfinite(arr)
        if bad.any():
            out[bad] = [
                ("NaN" if np.isnan(v) else "Infinity" if v > 0 else "-Infinity") for v in arr[bad]
            ]
        return out.tolist()
    return arr.tolist()


def _unjson(v):
    if isinstance(v, list):
        return [_unjson(x) for x in v]
    if isinstance(v, str):
        return NONFINITE.get(v, v)
    return v


def _numbers_from_json(value, typ) -> tuple[bool, Any, str]:
    """A value written by :func:`_json_numbers` with its recorded type -> (ok, numpy value, why not)."""
    from .catalog import check_dtype
    from .errors import DTypeError

    if not isinstance(typ, dict):
        return False, None, f"type {typ!r} is not an object"
    try:
        dt = check_dtype(typ.get("dtype"))
        shape = tuple(int(n) for n in typ.get("shape", ()))
        exact = typ.get("exact")
        if exact is not None and _wider_than_f8(dt):
            # (strings NumPy parses to the type's full precision; "NaN", "Infinity" among them)
            raw = np.asarray(_unjson(exact), dtype=object)
            part = np.dtype(f"f{dt.itemsize // 2}") if dt.kind == "c" else dt
            flat = raw.reshape(-1).tolist()
            if any(not isinstance(v, float) and not _decimal(v) for v in flat):
                return False, None, "exact values are not decimal strings of a long double"
            with warnings_mod.catch_warnings():  # (NumPy warns of overflow at the largest)
                warnings_mod.simplefilter("ignore", RuntimeWarning)
                parsed = [v if isinstance(v, float) else part.type(v) for v in flat]
            if any(
                not isinstance(v, float) and not np.isfinite(x)
                for v, x in zip(flat, parsed, strict=True)
            ):
                return False, None, "an exact value is past the range of a long double"
            raw = np.array(parsed, dtype=part).reshape(raw.shape)
        else:
            raw = np.asarray(_unjson(value), dtype=object)  # (Python ints kept exact)
        if 0 in shape:  # no values: nothing to check but the shape
            if raw.size:
                return False, None, f"values {value!r} for the empty shape {shape}"
            return True, np.zeros(shape, dtype=dt), ""
        if dt.kind == "c":
            if raw.dtype == object:
                raw = raw.astype(np.float64)
            if raw.shape[-1:] != (2,):
                return False, None, "a complex value is not a list of [re, im] pairs"
            arr = np.empty(raw.shape[:-1], dtype=dt)
            arr.real, arr.imag = raw[..., 0], raw[..., 1]  # (re + 1j * im made inf * 0 = NaN)
        elif dt.kind == "f":
            arr = (raw.astype(np.float64) if raw.dtype == object else raw).astype(dt)
        else:
            if any(
                not isinstance(v, int) or (isinstance(v, bool) and dt.kind != "b")
                for v in raw.reshape(-1).tolist()
            ):
                return False, None, f"values {value!r} are not integers"
            arr = raw.astype(dt)  # (OverflowError for a value outside the type)
    except (DTypeError, TypeError, ValueError, OverflowError, FloatingPointError) as e:
        return False, None, str(e)
    except RecursionError:  # (lists nested past what the walk takes)
        return False, None, "values nested too deeply"
    if arr.shape != shape:
        return False, None, f"shape {arr.shape} does not match the recorded {shape}"
    return True, arr[()] if arr.ndim == 0 else arr, ""


def _from_json(value) -> tuple[bool, Any, str]:
    """A JSON attribute without a recorded type -> (ok, lamina value, why not)."""
    if isinstance(value, str):
        return True, value, ""
    if isinstance(value, bool):
        return True, np.bool_(value), ""
    if isinstance(value, int):
        for dt in (np.int64, np.uint64):
            try:
                return True, np.asarray(value, dtype=dt)[()], ""
            except OverflowError:
                continue
        return False, None, f"integer {value} does not fit 64 bits"
    if isinstance(value, float):
        return True, np.float64(value), ""
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return True, list(value), ""
    if isinstance(value, list) and value:
        try:
            arr = np.asarray(value)
            if arr.dtype.kind == "f" and not _any_float(value):  # integers past int64
                arr = np.asarray(value, dtype=np.uint64)  # (OverflowError past uint64)
        except (ValueError, OverflowError):
            arr = None
        if arr is not None and arr.dtype.kind in "biuf":
            return True, arr, ""
        return False, None, "a list that is not an array of numbers or a list of strings"
    kind = "null" if value is None else type(value).__name__
    return False, None, f"a JSON {kind} (lamina attributes are numbers, strings and arrays of them)"


def _any_float(value) -> bool:
    """Whether nested lists of JSON numbers hold a float (integers past int64 alone make
    NumPy choose float64, rounding them)."""
    if isinstance(value, list):
        return any(_any_float(v) for v in value)
    return isinstance(value, float)


def _attrs_from_json(
    attrs: dict, target, where: str, made: bool, types: dict, warnings: list[str]
) -> None:
    for name, value in attrs.items():
        if name in RESERVED:
            continue
        lname = name[len(USER_PREFIX) :] if made and name.startswith(USER_PREFIX) else name
        if made and name in types:
            ok, v, why = _numbers_from_json(value, types[name])
        else:
            ok, v, why = _from_json(value)
        if not ok:
            warnings.append(f"skipped attribute {name!r} of {where}: {why}")
            continue
        try:
            target[lname] = v
        except (LaminaError, ValueError, TypeError) as e:
            warnings.append(f"skipped attribute {name!r} of {where}: {e}")


def _types(meta, what: str) -> dict:
    types = meta.get("attrs") if isinstance(meta, dict) else None
    if types is None:
        return {}
    if not isinstance(types, dict):
        raise FormatError(f"{what}: 'attrs' is not an object")
    return types


def _meta_int(meta: dict, key: str, what: str) -> int:
    v = meta.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise FormatError(f"{what}: {key!r} must be an integer >= 0, got {v!r}")
    return v


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "NGFF_VERSION",
    "convert",
    "lamina_to_zarr",
    "wants_zarr",
    "zarr_to_lamina",
]
