"""HDF5 interchange: convert lamina files to HDF5 files and back.  Serial (one rank).

``docs/hdf5.md`` describes the layout in prose.  In short: every lamina group
becomes an HDF5 group and every lamina dataset of shape ``S`` an HDF5 dataset
of shape ``(steps, *S)``, chunked one step per chunk, whose HDF5 fill value is
the dataset's fill value.  Attributes are copied.  Bookkeeping lives in
attributes whose names start with ``lamina_``: the root records the format,
the step count and the commit times; each dataset records its codec pipeline,
the steps it was written in and every written box (``lamina_blocks``), so
that converting back restores the same blocks in the same steps, and regions
that were never written stay unwritten (they read as the fill value).

Any HDF5 file not made by lamina converts too: each numeric dataset becomes a
lamina dataset of the same shape written in one step (datasets and attributes
lamina cannot hold are skipped with a warning).  A dataset of an HDF5 enum type keeps
its values as integers and its labels in its attribute ``hdf5_enum`` (:data:`A_ENUM`),
from which an export to HDF5 makes the enum type again; of an enum attribute only the
labels are dropped, with a warning.

Data is streamed: one block (or a slab of at most 64 MiB of one) at a time.

Nothing read from an HDF5 file is trusted to size a loop or an allocation:
a step count must match the step times the file really holds, every
recorded block must lie on chunks the file really stores, a plain dataset
is copied where its storage holds data (stored chunks, the regions a
virtual dataset maps, external files that exist and are long enough), and
an attribute too large for lamina is skipped before it is read.  A file
that claims more than it holds is refused with one FormatError.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import stat
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import comm as comm_mod
from .catalog.model import MAX_ATTR_BYTES, MAX_CODEC_DEPTH, MAX_CODEC_JSON
from .catalog.wire import load_json
from .engines.native.engine import is_hdf5_file
from .engines.registry import ON_DISK
from .errors import FormatError, LaminaError, register
from .geometry import Box

FORMAT = "lamina-hdf5"
FORMAT_VERSION = 1

#: attribute names starting with this are lamina's bookkeeping
PREFIX = "lamina_"
#: a user attribute whose name starts with PREFIX is stored under USER_PREFIX + name
USER_PREFIX = "lamina_user_"

A_FORMAT = "lamina_format"
A_FORMAT_VERSION = "lamina_format_version"
A_VERSION = "lamina_version"
A_STEPS = "lamina_steps"
A_STEP_TIMES = "lamina_step_times"
A_COMPRESSION = "lamina_compression"
A_STEPS_WRITTEN = "lamina_steps_written"
A_BLOCKS = "lamina_blocks"
BOOKKEEPING = {
    A_FORMAT,
    A_FORMAT_VERSION,
    A_VERSION,
    A_STEPS,
    A_STEP_TIMES,
    A_COMPRESSION,
    A_STEPS_WRITTEN,
    A_BLOCKS,
}

#: the lamina attribute of a dataset holding the labels of its HDF5 enum type: JSON, an
#: object of label -> integer value (docs/hdf5.md)
A_ENUM = "hdf5_enum"

#: largest piece of data held in memory at once when a block can be split (bytes)
SLAB_BYTES = 64 << 20
#: largest HDF5 chunk (a step is split into several chunks beyond this)
CHUNK_BYTES = 64 << 20
#: HDF5 chunk cache per open dataset while writing (holds partially written chunks)
CHUNK_CACHE_BYTES = 2 * CHUNK_BYTES
#: largest HDF5 chunk when the HDF5 copy is gzip-compressed
GZIP_CHUNK_BYTES = 4 << 20


@register
class ConvertError(LaminaError, ValueError):
    """A conversion cannot be done as asked (wrong kind of file, run on several ranks, ...)."""


@dataclass
class ConvertResult:
    """What a conversion did."""

    src: str
    dst: str
    direction: str  # 'lamina->hdf5', 'hdf5->lamina', 'lamina->zarr' or 'zarr->lamina'
    groups: int = 0
    datasets: int = 0
    steps: int = 0
    blocks: int = 0
    nbytes: int = 0  # bytes of array data moved
    seconds: float = 0.0
    source_kind: str = ""  # for hdf5/zarr->lamina: 'lamina' (made by lamina) or 'plain'
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------
# entry points


#: files whose presence in a directory makes it a Zarr store (format 2: the first three; 3: the last)
ZARR_MARKERS = (".zgroup", ".zattrs", ".zarray", "zarr.json")


def is_zarr_store(path) -> bool:
    """Whether *path* is a directory holding Zarr metadata (a Zarr store, not a lamina file)."""
    path = os.fsdecode(path)
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, m)) for m in ZARR_MARKERS)


def detect(path) -> str:
    """'lamina', 'hdf5' or 'zarr': what kind of file *path* is; raises if none or missing.

    A directory holding ``.zgroup``, ``.zattrs``, ``.zarray`` or
    ``zarr.json`` is a Zarr store (:mod:`lamina.omezarr` converts it); any
    other directory is taken for a lamina file.
    """
    path = os.fsdecode(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path!r}")
    if is_zarr_store(path):
        return "zarr"
    if os.path.isdir(path):
        return "lamina"  # lamina.open says precisely what is wrong if it is not one
    if not os.path.isfile(path):  # a FIFO or a device: reading it would block or never end
        raise ConvertError(f"{path!r} is not a regular file")
    if is_hdf5_file(path):
        return "hdf5"
    raise ConvertError(f"{path!r} is neither a lamina file (a .lam directory) nor an HDF5 file")


def convert(
    src, dst, *, overwrite: bool = False, progress: bool | None = None, gzip: int | None = None
) -> ConvertResult:
    """Convert a lamina file to HDF5 or an HDF5 file to lamina, by the kind of *src*.

    Parameters
    ----------
    src, dst : path-like
        Source and destination.  The destination is written under a
        temporary name and renamed when complete.
    overwrite : bool
        Replace an existing destination (a file, or a lamina directory).
    progress : bool or None
        Show a progress bar on stderr; None: only when stderr is a terminal.
    gzip : int or None
        lamina -> HDF5 only: gzip level 0-9 for the HDF5 datasets (default: none).
    """
    kind = detect(src)
    if kind == "zarr":
        raise ConvertError(
            f"{os.fsdecode(src)!r} is a Zarr store: lamina.omezarr.convert converts it "
            "(as 'lamina convert' does)"
        )
    if kind == "lamina":
        return lamina_to_hdf5(src, dst, overwrite=overwrite, progress=progress, gzip=gzip)
    if gzip is not None:
        raise ConvertError("gzip applies to HDF5 output only (the source is already HDF5)")
    return hdf5_to_lamina(src, dst, overwrite=overwrite, progress=progress)


# --------------------------------------------------------------------------
# lamina -> HDF5


def lamina_to_hdf5(
    src, dst, *, overwrite: bool = False, progress: bool | None = None, gzip: int | None = None
) -> ConvertResult:
    """Write the lamina file *src* as the HDF5 file *dst* (layout: docs/hdf5.md)."""
    import h5py

    import lamina

    from . import __version__
    from .api import Dataset

    src, dst = os.fsdecode(src), os.fsdecode(dst)  # (bytes paths too, as lamina.open)
    _check_distinct(src, dst)
    if gzip is not None and not (isinstance(gzip, int) and 0 <= gzip <= 9):
        raise ConvertError(f"gzip level must be an integer 0-9, got {gzip!r}")
    t0 = time.perf_counter()
    res = ConvertResult(src, dst, "lamina->hdf5")
    with lamina.open(src, "r", **ON_DISK) as f:
        _require_serial(f)
        nsteps = f.steps
        res.steps = nsteps
        nodes = list(f.walk())
        # path, dataset, (step, box) it holds values in, the labels of its HDF5 enum type
        plan: list[tuple[str, Dataset, list[tuple[int, Box]], dict[str, int] | None]] = []
        for path, obj in nodes:
            if isinstance(obj, Dataset):
                check_rank(src, path, obj, "HDF5")
                # where it holds values: its blocks, or a derived quantity's computed ones
                boxes = [(k, b) for k in range(nsteps) for b in obj.coverage(k)]
                res.warnings += not_kept(f, path, obj, layout=False)
                enum, why = _enum_labels(obj)
                if why:
                    res.warnings.append(f"dataset /{path.lstrip('/')}: {why}")
                plan.append((path, obj, boxes, enum))
                res.datasets += 1
            else:
                res.groups += 1
        total = sum(b.size * ds.dtype.itemsize for _, ds, boxes, _ in plan for _, b in boxes)
        with (
            _staged(dst, overwrite, "hdf5") as tmp,
            h5py.File(tmp, "w", libver=("v108", "v110"), rdcc_nbytes=CHUNK_CACHE_BYTES) as h,
        ):
            h.attrs[A_FORMAT] = FORMAT
            h.attrs[A_FORMAT_VERSION] = np.int64(FORMAT_VERSION)
            h.attrs[A_VERSION] = __version__
            h.attrs[A_STEPS] = np.int64(nsteps)
            h.attrs[A_STEP_TIMES] = np.asarray(
                f.engine.catalog.step_times[:nsteps], dtype=np.float64
            )
            _copy_attrs_to_h5(f, h.attrs)
            # each group made in its parent, made before it (the walk's order), not by its
            # path from the root: h5py looks up each part of a path, O(depth) a group
            made = {"": h}
            for path, obj in nodes:
                if not isinstance(obj, Dataset):
                    up, _, name = path.rpartition("/")
                    made[path] = made[up].require_group(name)
                    _copy_attrs_to_h5(obj, made[path].attrs)
            with _bar(total, os.path.basename(dst.rstrip("/")) or dst, progress) as bar:
                for path, ds, boxes, enum in plan:
                    hd = _create_h5_dataset(h, path, ds, nsteps, gzip, enum)
                    by_step: dict[int, list[Box]] = {}
                    for k, box in boxes:
                        by_step.setdefault(k, []).append(box)
                    itemsize = ds.dtype.itemsize
                    for k, step_boxes in by_step.items():
                        moved = sum(b.size for b in step_boxes) * itemsize
                        if ds.size * itemsize <= SLAB_BYTES:
                            # small enough: the whole step (fill included) in one write, one chunk
                            hd[k] = ds.read(step=k)
                        else:
                            for box in step_boxes:
                                for piece in split_box(box, itemsize, SLAB_BYTES):
                                    hd[(k, *piece.slices)] = ds.read(piece, step=k)
                        bar.update(moved)
                        res.nbytes += moved
                        res.blocks += len(step_boxes)
    res.seconds = time.perf_counter() - t0
    return res


#: the most dimensions an HDF5 dataset (``H5S_MAX_RANK``) or a Zarr array written through
#: numpy has: an exported dataset has one more than in lamina, its step axis
MAX_EXPORT_NDIM = 32


def check_rank(src: str, path: str, ds, kind: str) -> None:
    """ConvertError if dataset *ds* with its step axis has more dimensions than *kind* holds."""
    if ds.ndim + 1 > MAX_EXPORT_NDIM:
        raise ConvertError(
            f"{src!r}: dataset /{path.lstrip('/')} has {ds.ndim} dimensions; with the step "
            f"axis that is {ds.ndim + 1}, more than {kind} holds ({MAX_EXPORT_NDIM})"
        )


def not_kept(f, path: str, ds, layout: bool) -> list[str]:
    """Warnings for what an export of dataset *ds* of *f* writes as plain data: a derived
    quantity's definition, and a multiresolution layout unless the destination keeps
    *layout*s."""
    out = []
    d = f.engine.definition(path)
    if d is not None:
        out.append(
            f"dataset /{path.lstrip('/')}: derived quantity ({d.text!r}, strategy "
            f"{d.strategy!r}) written as its values; the definition is not kept"
        )
    if not layout and ds.layout is not None:
        out.append(
            f"dataset /{path.lstrip('/')}: multiresolution layout written at full resolution "
            f"(level 0); the layout (patch, tolerance, levels) is not kept"
        )
    return out


def _enum_labels(ds) -> tuple[dict[str, int] | None, str]:
    """(labels, "") of the HDF5 enum type dataset *ds* is written as: its attribute
    :data:`A_ENUM`, a JSON object of distinct labels -> distinct integers its dtype holds;
    (None, "") where it has none; (None, why) where it is no such labels (it is written as
    a plain attribute, over a plain dataset)."""
    if A_ENUM not in ds.attrs:
        return None, ""
    text = ds.attrs[A_ENUM]
    dt = np.dtype(ds.dtype)
    plain = f"attribute {A_ENUM!r} written as a plain attribute of a plain {dt} dataset: "
    if dt.kind not in "iu":
        return None, plain + f"an HDF5 enum holds integers, not {dt}"
    try:
        labels = load_json(text, f"attribute {A_ENUM!r}") if isinstance(text, str) else None
    except FormatError:
        labels = None
    if not isinstance(labels, dict) or not labels:
        return None, plain + "it is not a JSON object of labels -> values"
    info = np.iinfo(dt)
    for label, value in labels.items():
        if not label or "\x00" in label:
            return None, plain + f"label {label!r} is empty or holds a NUL character"
        if type(value) is not int or not info.min <= value <= info.max:
            return None, plain + f"the value of {label!r}, {value!r}, is no {dt} integer"
    if len(set(labels.values())) < len(labels):
        return None, plain + "two labels have the same value"
    return labels, ""


def _create_h5_dataset(
    h, path: str, ds, nsteps: int, gzip: int | None, enum: dict[str, int] | None = None
):
    """The HDF5 dataset of *ds* (of its dtype, or the enum type of labels *enum* over it)."""
    import h5py

    shape = tuple(ds.shape)
    cap = GZIP_CHUNK_BYTES if gzip is not None else CHUNK_BYTES
    kw = {}
    if gzip is not None:
        kw = {"compression": "gzip", "compression_opts": gzip, "shuffle": ds.dtype.itemsize > 1}
    hd = h.create_dataset(
        path,
        shape=(nsteps, *shape),
        maxshape=(None, *(None if n == 0 else n for n in shape)),
        chunks=chunk_shape(shape, ds.dtype.itemsize, cap),
        dtype=ds.dtype if enum is None else h5py.enum_dtype(enum, basetype=ds.dtype),
        fillvalue=ds.fill,
        **kw,
    )
    # the labels are the dataset's type: not an attribute too
    _copy_attrs_to_h5(ds, hd.attrs, skip=A_ENUM if enum is not None else None)
    nd = len(shape)
    rows = [(k, *b.start, *b.stop) for k in range(nsteps) for b in ds.coverage(k)]
    blocks = np.array(rows, dtype=np.int64).reshape(len(rows), 1 + 2 * nd)
    hd.attrs[A_COMPRESSION] = json.dumps(list(ds.compression), sort_keys=True)
    hd.attrs[A_STEPS_WRITTEN] = np.unique(blocks[:, 0]).astype(np.int64)
    hd.attrs[A_BLOCKS] = blocks
    return hd


def chunk_shape(shape: tuple[int, ...], itemsize: int, cap: int = CHUNK_BYTES) -> tuple[int, ...]:
    """HDF5 chunk of a ``(steps, *shape)`` dataset: one step, halved along its largest axis while over *cap* bytes."""
    chunk = [1] + [max(1, int(n)) for n in shape]
    while math.prod(chunk) * itemsize > cap:
        i = max(range(1, len(chunk)), key=lambda j: chunk[j])
        if chunk[i] == 1:
            break
        chunk[i] = -(-chunk[i] // 2)
    return tuple(chunk)


def split_box(box: Box, itemsize: int, limit: int = SLAB_BYTES) -> list[Box]:
    """Split *box* into C-ordered pieces of at most *limit* bytes (or single elements)."""
    if box.size * itemsize <= limit or box.size == 0:
        return [box]
    axis = next((d for d, n in enumerate(box.shape) if n > 1), None)
    if axis is None:
        return [box]
    unit = math.prod(box.shape[axis + 1 :]) * itemsize  # bytes per index along axis
    step = max(1, limit // max(1, unit))
    out = []
    for a in range(box.start[axis], box.stop[axis], step):
        b = min(a + step, box.stop[axis])
        piece = Box(
            box.start[:axis] + (a,) + box.start[axis + 1 :],
            box.stop[:axis] + (b,) + box.stop[axis + 1 :],
        )
        out.extend(split_box(piece, itemsize, limit))
    return out


def _has_nul(value) -> bool:
    """Whether a string attribute value (a str, a list or an array of them) holds a NUL."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "UO":  # (lists of str read back as O)
        return any(isinstance(v, str) and "\x00" in v for v in value.reshape(-1).tolist())
    return False


def _copy_attrs_to_h5(obj, h5attrs, skip: str | None = None) -> None:
    import h5py

    for name in obj.attrs:
        if name == skip:
            continue
        value = obj.attrs[name]
        hname = USER_PREFIX + name if name.startswith(PREFIX) else name
        # HDF5 ends a name at a NUL (the attribute would overwrite another) and its variable-
        # length strings hold none: refused, naming them, before the output is kept
        if "\x00" in name:
            raise ConvertError(
                f"{obj.name!r}: attribute {name!r} has a NUL character in its name, which "
                "HDF5 cannot hold (it would end the name there)"
            )
        if _has_nul(value):
            raise ConvertError(
                f"{obj.name!r}: attribute {name!r} holds a string with a NUL character, "
                "which HDF5's variable-length strings cannot hold"
            )
        if isinstance(value, list):
            h5attrs.create(hname, data=value, dtype=h5py.string_dtype())
        else:
            h5attrs[hname] = value


# --------------------------------------------------------------------------
# HDF5 -> lamina


@dataclass
class _Src:
    """One HDF5 dataset to copy: where it goes and which (step, box) pieces to move."""

    path: str
    h5: Any  # an h5py.Dataset
    dtype: np.dtype
    shape: tuple[int, ...]
    fill: object
    codecs: list
    stepped: bool  # True: made by lamina, leading step axis
    boxes: list[tuple[int, Box]]
    enum: dict[str, int] | None = None  # the labels of its HDF5 enum type (bool's excepted)


def hdf5_to_lamina(
    src, dst, *, overwrite: bool = False, progress: bool | None = None
) -> ConvertResult:
    """Write the HDF5 file *src* as the lamina file *dst*.

    A file made by :func:`lamina_to_hdf5` gets back its steps, blocks and
    codecs; any other HDF5 file becomes one step holding every numeric dataset.
    """
    import h5py

    import lamina

    src, dst = os.fsdecode(src), os.fsdecode(dst)  # (bytes paths too, as lamina.open)
    _check_distinct(src, dst)
    _require_serial(None)
    t0 = time.perf_counter()
    res = ConvertResult(src, dst, "hdf5->lamina")
    try:
        h5 = h5py.File(src, "r")
    except OSError as e:  # a truncated or damaged file: HDF5's words name no file
        raise ConvertError(f"{src!r}: HDF5 cannot open it ({e})") from None
    with h5 as h:
        fmt = _h5_str(h.attrs.get(A_FORMAT))
        made = fmt == FORMAT
        res.source_kind = "lamina" if made else "plain"
        if made:
            version = _h5_int(h.attrs.get(A_FORMAT_VERSION), f"{src}: attribute {A_FORMAT_VERSION}")
            if version > FORMAT_VERSION:
                raise FormatError(
                    f"{src!r} uses lamina-hdf5 layout version {version}; this lamina reads up to {FORMAT_VERSION}"
                )
            nsteps = _h5_int(h.attrs.get(A_STEPS), f"{src}: attribute {A_STEPS}")
            if nsteps < 0:
                raise FormatError(f"{src!r}: negative step count {nsteps}")
            _check_step_times(h, nsteps, src)
        else:
            nsteps = 1
        groups: list[tuple[str, object]] = []
        sources: list[_Src] = []
        _walk_h5(h, groups, sources, made, nsteps, res.warnings, src)
        if any(not s.stepped and s.boxes for s in sources):
            nsteps = max(nsteps, 1)
        res.steps = nsteps
        res.groups, res.datasets = len(groups), len(sources)
        total = sum(b.size * s.dtype.itemsize for s in sources for _, b in s.boxes)
        by_step: dict[int, list[tuple[_Src, Box]]] = {}
        for s in sources:
            for k, b in s.boxes:
                by_step.setdefault(k, []).append((s, b))
        with _staged(dst, overwrite, "lamina") as tmp, lamina.open(tmp, "w", **ON_DISK) as f:
            _require_serial(f)
            _copy_attrs_from_h5(h, f.attrs, "/", made, res.warnings)
            for name, g in groups:
                lg = _created(f"{src!r}: group /{name}", made, f.require_group, name)
                _copy_attrs_from_h5(g, lg.attrs, "/" + name, made, res.warnings)
            targets = {}
            for s in sources:
                ds = _created(
                    f"{src!r}: dataset /{s.path}",
                    made,
                    f.create_dataset,
                    s.path,
                    shape=s.shape,
                    dtype=s.dtype,
                    fill=s.fill,
                    compression=s.codecs or None,
                )
                _copy_attrs_from_h5(
                    s.h5, ds.attrs, "/" + s.path, made, res.warnings, s.enum is not None
                )
                if s.enum is not None:
                    _keep_enum(ds, s, res.warnings)
                targets[s.path] = ds
            with _bar(total, os.path.basename(dst.rstrip("/")) or dst, progress) as bar:
                for k in range(nsteps):
                    with f.step():
                        for s, box in by_step.get(k, []):
                            sel = ((k,) if s.stepped else ()) + box.slices
                            try:
                                data = np.asarray(s.h5[sel]).astype(s.dtype, copy=False)
                            except OSError as e:  # a damaged chunk, a filter that fails
                                raise FormatError(
                                    f"{src!r}: dataset /{s.path}: cannot read {box} "
                                    f"of step {k}: {e}"
                                ) from None
                            targets[s.path].write(data.reshape(box.shape), offset=box.start)
                            bar.update(data.nbytes)
                            res.nbytes += data.nbytes
                            res.blocks += 1
    res.seconds = time.perf_counter() - t0
    return res


def _check_step_times(h, nsteps: int, src: str) -> None:
    """The step count of a lamina-made file must be the length of its step times (data it holds).

    A few bytes could otherwise claim 10^12 steps, each committed in turn.
    """
    if A_STEP_TIMES not in h.attrs:
        raise FormatError(f"{src!r}: attribute {A_STEP_TIMES} is missing ({A_STEPS} = {nsteps})")
    times = h.attrs.get_id(A_STEP_TIMES)
    shape = times.shape
    if shape is None or len(shape) != 1 or times.dtype.kind != "f":
        raise FormatError(
            f"{src!r}: attribute {A_STEP_TIMES} must be a 1-D array of floats, "
            f"got {times.dtype} of shape {shape}"
        )
    if shape[0] != nsteps:
        raise FormatError(
            f"{src!r}: attribute {A_STEPS} says {nsteps} steps, {A_STEP_TIMES} holds {shape[0]}: "
            "the file is inconsistent"
        )


def _stored_chunks(obj) -> set[tuple[int, ...]]:
    """Offsets of the chunks of the chunked HDF5 dataset *obj* that hold data in the file."""
    out: set[tuple[int, ...]] = set()
    dsid = obj.id
    try:
        dsid.chunk_iter(lambda info: out.add(tuple(info.chunk_offset)))
    except (AttributeError, NotImplementedError):  # HDF5 older than 1.12.3: one call per chunk
        for i in range(dsid.get_num_chunks()):
            out.add(tuple(dsid.get_chunk_info(i).chunk_offset))
    return out


def _on_stored_chunks(box: Box, chunks: tuple[int, ...], stored: set[tuple[int, ...]]) -> bool:
    """Whether every chunk *box* touches is stored (checking at most len(stored) + 1 chunks)."""
    if box.size == 0:
        return True
    ranges = [
        range(a // c, (b - 1) // c + 1) for a, b, c in zip(box.start, box.stop, chunks, strict=True)
    ]
    if math.prod(len(r) for r in ranges) > len(stored):
        return False
    return all(
        tuple(i * c for i, c in zip(idx, chunks, strict=True)) in stored
        for idx in itertools.product(*ranges)
    )


def _layout(obj) -> str:
    """'virtual', 'external', 'chunked', 'contiguous' or 'compact'."""
    import h5py

    if obj.is_virtual:
        return "virtual"
    if obj.external:
        return "external"
    if obj.chunks is not None:
        return "chunked"
    compact = obj.id.get_create_plist().get_layout() == h5py.h5d.COMPACT
    return "compact" if compact else "contiguous"


def _walk_h5(
    h, groups: list, sources: list, made: bool, nsteps: int, warnings: list[str], src: str = ""
) -> None:
    """Collect groups and convertible datasets (each hard-linked object once)."""
    import h5py

    from .catalog import check_dtype
    from .errors import DTypeError

    # object -> the name it is converted under (the first visited); visititems never visits
    # the root, so a link back to it (a loop) must find it here
    first: dict = {h.id: ""}

    def visit(name: str, obj) -> None:
        first.setdefault(obj.id, name)
        if isinstance(obj, h5py.Group):
            groups.append((name, obj))
        elif isinstance(obj, h5py.Dataset):
            try:
                dt = check_dtype(np.dtype(obj.dtype.str))  # drops h5py's enum/vlen metadata
            except (DTypeError, TypeError):
                warnings.append(f"skipped dataset /{name}: dtype {obj.dtype} is not numeric")
                return
            if obj.shape is None:
                warnings.append(f"skipped dataset /{name}: it has no dataspace (empty)")
                return
            fill = obj.fillvalue
            try:
                fill = np.asarray(fill).astype(dt)[()]
            except (TypeError, ValueError):
                fill = np.zeros((), dt)[()]
            if made and A_BLOCKS in obj.attrs:
                sources.append(_lamina_made(name, obj, dt, fill, nsteps, src))
            else:
                if made:
                    warnings.append(
                        f"dataset /{name} has no {A_BLOCKS} attribute: copied whole into step 0"
                    )
                plain = _plain(name, obj, dt, fill, warnings, src)
                if plain is None:
                    return
                sources.append(plain)
            # kept in the attribute A_ENUM (_keep_enum); None for bool (h5py's own enum)
            sources[-1].enum = h5py.check_enum_dtype(obj.dtype) or None
        else:
            warnings.append(f"skipped /{name}: a named datatype")

    h.visititems(visit)
    if hasattr(h, "visititems_links"):

        def links(name: str, link) -> None:
            if isinstance(link, h5py.HardLink):
                seen = first.get(h[name].id)
                if seen is not None and seen != name:
                    warnings.append(
                        f"skipped /{name}: a hard link to the object at /{seen}, "
                        f"converted once, as /{seen}"
                    )
            elif isinstance(link, h5py.SoftLink):
                warnings.append(f"skipped soft link /{name} -> {link.path}")
            elif isinstance(link, h5py.ExternalLink):
                warnings.append(f"skipped external link /{name} -> {link.filename}:{link.path}")

        h.visititems_links(links)


def _lamina_made(name: str, obj, dt: np.dtype, fill, nsteps: int, src: str = "") -> _Src:
    what = f"{src!r}: dataset /{name}" if src else f"dataset /{name}"
    if obj.ndim < 1 or obj.shape[0] != nsteps:
        raise FormatError(f"{what}: shape {obj.shape} has no leading step axis of length {nsteps}")
    shape = tuple(int(n) for n in obj.shape[1:])
    nd = len(shape)
    table = obj.attrs.get_id(A_BLOCKS)
    tshape = table.shape
    if (
        table.dtype.kind not in "iu"
        or tshape is None
        or len(tshape) != 2
        or tshape[1] != 1 + 2 * nd
    ):
        raise FormatError(
            f"{what}: attribute {A_BLOCKS} must be integers of shape (n, {1 + 2 * nd}), got {table.dtype} {tshape}"
        )
    raw = np.asarray(obj.attrs[A_BLOCKS])
    layout = _layout(obj)
    if layout in ("virtual", "external"):
        raise FormatError(f"{what}: a {layout} dataset: lamina writes its datasets chunked")
    stored = _stored_chunks(obj) if layout == "chunked" else None
    allocated = layout == "compact" or obj.id.get_storage_size() > 0
    boxes = []
    for row in raw.tolist():
        k, start, stop = row[0], tuple(row[1 : 1 + nd]), tuple(row[1 + nd :])
        if not 0 <= k < nsteps:
            raise FormatError(f"{what}: block in step {k}, file has {nsteps} steps")
        if any(not 0 <= a <= b <= n for a, b, n in zip(start, stop, shape, strict=True)):
            raise FormatError(f"{what}: block {start}..{stop} does not fit shape {shape}")
        box = Box(start, stop)
        # a block's data is in the file: the chunks it was written to exist
        in_file = Box((k, *start), (k + 1, *stop))
        if box.size and not (
            _on_stored_chunks(in_file, obj.chunks, stored) if stored is not None else allocated
        ):
            raise FormatError(
                f"{what}: block {start}..{stop} of step {k} is not stored in the file "
                f"(its chunks were never written): {A_BLOCKS} does not match the dataset"
            )
        boxes.append((k, box))
    codecs: list = []
    if A_COMPRESSION in obj.attrs:
        text = _h5_str(obj.attrs[A_COMPRESSION])
        codecs = (
            load_json(
                text,
                f"{what}: attribute {A_COMPRESSION}",
                limit=MAX_CODEC_JSON,
                max_depth=MAX_CODEC_DEPTH,
            )
            if text
            else []
        )
        if not isinstance(codecs, list) or not all(isinstance(c, dict) for c in codecs):
            raise FormatError(f"{what}: attribute {A_COMPRESSION} is not a list of codec objects")
    return _Src(name, obj, dt, shape, fill, codecs, True, boxes)


def _plain(name: str, obj, dt: np.dtype, fill, warnings: list[str], src: str = "") -> _Src | None:
    """A dataset not made by lamina, copied where the file holds its data (None: skipped).

    The regions copied are found from what the file stores, never from the
    shape alone: the stored chunks of a chunked dataset (the whole dataset
    when every chunk is stored), the regions a virtual dataset maps, the
    whole of a contiguous one once allocated (its bytes are in the file), or
    of one in external files that exist and hold all of its bytes.
    """
    shape = tuple(int(n) for n in obj.shape)
    whole = Box.from_shape(shape)
    regions: list[Box] = []
    layout = _layout(obj)
    if whole.size == 0:
        pass
    elif layout == "chunked":
        stored = _stored_chunks(obj)
        grid = math.prod(-(-n // c) for n, c in zip(shape, obj.chunks, strict=True))
        if len(stored) >= grid:
            regions = [whole]
        else:  # partly written: only the chunks that hold data
            regions = [
                Box(
                    off,
                    tuple(min(o + c, n) for o, c, n in zip(off, obj.chunks, shape, strict=True)),
                )
                for off in sorted(stored)
                if len(off) == len(shape)
                and all(0 <= o < n for o, n in zip(off, shape, strict=True))
            ]
    elif layout == "virtual":
        why = _virtual_refused(obj, src)
        if why:
            warnings.append(f"skipped dataset /{name}: {why}")
            return None
        regions = _virtual_regions(obj, shape)
    elif layout == "external":
        held, why = _external_bytes(obj, src)
        if held < whole.size * dt.itemsize:
            warnings.append(f"skipped dataset /{name}: {why}")
            return None
        regions = [whole]
    elif layout == "compact" or obj.id.get_storage_size() > 0:
        regions = [whole]
    boxes = [(0, b) for r in regions for b in split_box(r, dt.itemsize, SLAB_BYTES)]
    return _Src(name, obj, dt, shape, fill, [], False, boxes)


#: verdicts of :func:`_virtual_refused` that found nothing wrong, by (the file's device,
#: inode and modification time, dataset name)
_CLEAN: set[tuple[int, int, int, str]] = set()


def _virtual_refused(obj, src: str) -> str:
    """Why the mappings of the virtual dataset *obj* must not be read (empty: they may).

    A source file that is not a regular file (a FIFO blocks the read for ever, a device
    may never end), looked up where HDF5 looks (``HDF5_VDS_PREFIX``, the directory of
    *src*, the name as given); a dataset of this file (named ``.`` or by any path to it)
    that maps itself, directly or through other virtual datasets of it (HDF5 recurses
    until it crashes).  Walked without recursion, a dataset found clean once not again (a
    chain of thousands, or mappings that branch, cost one visit each).
    """
    here = os.stat(src)
    tag = (here.st_dev, here.st_ino, here.st_mtime_ns)
    if (*tag, obj.name) in _CLEAN:
        return ""
    if len(_CLEAN) > 1 << 20:
        _CLEAN.clear()
    path: list[str] = [obj.name]  # the datasets being walked, outermost first
    stack: list[tuple[Any, Any]] = [(obj, iter(obj.virtual_sources()))]
    while stack:
        node, mappings = stack[-1]
        m = next(mappings, None)
        if m is None:  # every mapping of it walked: clean
            stack.pop()
            path.pop()
            _CLEAN.add((*tag, node.name))
            continue
        same, why = _mapped_file(m.file_name, src, here)
        if why:
            return why
        if not same:
            continue
        name = m.dset_name if m.dset_name.startswith("/") else "/" + m.dset_name
        target = obj.file.get(name)
        if target is None or not getattr(target, "is_virtual", False):
            continue
        if target.name in path:
            loop = " -> ".join((*path[path.index(target.name) :], target.name))
            return f"it maps itself through a loop of virtual datasets ({loop})"
        if (*tag, target.name) not in _CLEAN:
            stack.append((target, iter(target.virtual_sources())))
            path.append(target.name)
    return ""


def _mapped_file(fname: str, src: str, here: os.stat_result) -> tuple[bool, str]:
    """(whether a mapping's source file *fname* is *src* itself, why it must not be read)."""
    if fname == ".":
        return True, ""
    places = [fname]
    if not os.path.isabs(fname):
        places.append(os.path.join(os.path.dirname(os.path.abspath(src)), fname))
        prefix = os.environ.get("HDF5_VDS_PREFIX", "")
        if prefix:
            places.append(os.path.join(prefix, fname))
    for place in places:
        try:
            st = os.stat(place)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            return False, f"its source file {place!r} is not a regular file (a FIFO or a device)"
        if (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino):
            return True, ""
    return False, ""


def _virtual_regions(obj, shape: tuple[int, ...]) -> list[Box]:
    """The regions of a virtual dataset its mappings cover (bounding boxes, overlaps merged)."""
    boxes: list[Box] = []
    for m in obj.virtual_sources():
        try:
            lo, hi = m.vspace.get_select_bounds()
        except (ValueError, RuntimeError, OSError):  # an empty selection
            continue
        start = tuple(max(0, int(a)) for a in lo)
        stop = tuple(min(n, int(b) + 1) for b, n in zip(hi, shape, strict=True))
        if all(a < b for a, b in zip(start, stop, strict=True)):
            boxes.append(Box(start, stop))
    merged = True
    while merged:  # blocks of one step may not overlap: merge overlapping regions
        merged = False
        for i, j in itertools.combinations(range(len(boxes)), 2):
            a, b = boxes[i], boxes[j]
            if all(
                x0 < y1 and y0 < x1
                for x0, x1, y0, y1 in zip(a.start, a.stop, b.start, b.stop, strict=True)
            ):
                hull = Box(tuple(map(min, a.start, b.start)), tuple(map(max, a.stop, b.stop)))
                boxes = [x for k, x in enumerate(boxes) if k not in (i, j)] + [hull]
                merged = True
                break
    return boxes


def _external_bytes(obj, src: str) -> tuple[int, str]:
    """(bytes the external files of *obj* really hold for it, why fewer than it needs).

    Each must be a regular file (a device such as /dev/zero never ends); a
    file is looked up as HDF5 does, against the external file prefix of the
    dataset (by default the current directory).
    """
    prefix = b""
    try:
        prefix = obj.id.get_access_plist().get_efile_prefix() or b""
    except (AttributeError, OSError):
        pass
    base = os.fsdecode(prefix).replace("${ORIGIN}", os.path.dirname(os.path.abspath(src)))
    held = 0
    for fname, offset, size in obj.external:
        path = os.path.join(base, os.fsdecode(fname))
        if not os.path.isfile(path):
            return held, f"its external file {path!r} is missing or not a regular file"
        avail = max(0, os.path.getsize(path) - int(offset))
        held += min(avail, int(size))  # size: H5F_UNLIMITED (2^64 - 1) for "to the end"
    need = math.prod(obj.shape) * obj.dtype.itemsize
    return held, f"its external files hold {held} of its {need} bytes"


def _keep_enum(ds, s: _Src, warnings: list[str]) -> None:
    """The labels of *s*'s HDF5 enum type kept in the attribute :data:`A_ENUM` of its lamina
    dataset *ds*, ordered by value (a warning where lamina refuses them: too large)."""
    assert s.enum is not None
    pairs = sorted(s.enum.items(), key=lambda kv: kv[1])
    try:
        ds.attrs[A_ENUM] = json.dumps(dict(pairs), ensure_ascii=False)
    except (LaminaError, ValueError, TypeError) as e:
        warnings.append(f"dataset /{s.path}: {_enum_dropped(s.enum, s.dtype)} ({e})")


def _copy_attrs_from_h5(
    h5obj, attrs, where: str, made: bool, warnings: list[str], enum: bool = False
) -> None:
    """The attributes of *h5obj* copied into lamina's *attrs* (of *where*); an object of an
    *enum* type keeps its labels in :data:`A_ENUM`, which no attribute of it may replace."""
    import h5py

    for hname in h5obj.attrs:
        if enum and hname == A_ENUM:
            warnings.append(
                f"skipped attribute {hname!r} of {where}: the name holds the labels "
                "of its HDF5 enum type"
            )
            continue
        if made and hname.startswith(PREFIX):
            if hname.startswith(USER_PREFIX):
                name = hname[len(USER_PREFIX) :]
            elif hname in BOOKKEEPING:
                continue
            else:
                name = hname
        else:
            name = hname
        try:
            aid = h5obj.attrs.get_id(hname)
            nbytes = math.prod(aid.shape or ()) * aid.dtype.itemsize
            if nbytes > MAX_ATTR_BYTES:  # lamina would refuse it: do not read it at all
                warnings.append(
                    f"skipped attribute {hname!r} of {where}: {nbytes} bytes, more than "
                    f"lamina's limit of {MAX_ATTR_BYTES}"
                )
                continue
            labels = h5py.check_enum_dtype(aid.dtype)  # None for bool (h5py's own enum)
            value = h5obj.attrs[hname]
        except (OSError, TypeError, ValueError) as e:  # e.g. a datatype h5py cannot read
            warnings.append(f"skipped attribute {hname!r} of {where}: {e}")
            continue
        ok, value, why = _from_h5_attr(value)
        if not ok:
            warnings.append(f"skipped attribute {hname!r} of {where}: {why}")
            continue
        try:
            attrs[name] = value
        except (LaminaError, ValueError, TypeError) as e:
            warnings.append(f"skipped attribute {hname!r} of {where}: {e}")
            continue
        if labels:
            warnings.append(
                f"attribute {hname!r} of {where}: {_enum_dropped(labels, np.asarray(value).dtype)}"
            )


def _enum_dropped(labels: dict, dt: np.dtype) -> str:
    """Why an HDF5 enum comes over as plain integers: its labels, which lamina cannot keep
    (those of an attribute; a dataset's too large for :data:`A_ENUM`)."""
    pairs = sorted(labels.items(), key=lambda kv: kv[1])
    shown = ", ".join(f"{k}={v}" for k, v in pairs[:8])
    if len(pairs) > 8:
        shown += f", ... ({len(pairs)} labels)"
    return (
        f"an HDF5 enum ({shown}) kept as its {dt} values; "
        "the labels are dropped (lamina has no enum type)"
    )


def _from_h5_attr(value) -> tuple[bool, object, str]:
    """An attribute value as h5py returns it -> (convertible, lamina value, why not)."""
    import h5py

    if isinstance(value, h5py.Empty):
        return False, None, "it has a null dataspace (no value)"
    if isinstance(value, (bytes, np.bytes_)):
        return True, _decode(bytes(value)), ""
    if isinstance(value, str):
        return True, _vlen_str(value), ""
    arr = np.asarray(value)
    if arr.dtype.kind in "SUO":
        items = arr.reshape(-1).tolist()
        if not all(isinstance(v, (str, bytes)) for v in items):
            return False, None, f"dtype {arr.dtype} is not numeric or string"
        strs = [_decode(v) if isinstance(v, bytes) else _vlen_str(v) for v in items]
        if arr.ndim == 0:
            return True, strs[0], ""
        if arr.ndim == 1 and not strs:
            return (
                False,
                None,
                "an empty array of strings: lamina keeps no empty list of strings "
                "(an empty list is stored as an empty float64 array, not as strings)",
            )
        if arr.ndim != 1:
            return (
                False,
                None,
                f"a string array of shape {arr.shape} (lamina keeps 1-D lists of strings)",
            )
        return True, strs, ""
    if arr.dtype.kind not in "biufc" or arr.dtype.fields is not None:
        return False, None, f"dtype {arr.dtype} is not numeric or string"
    return True, arr.astype(np.dtype(arr.dtype.str), copy=False), ""


def _decode(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("latin-1")


def _vlen_str(s: str) -> str:
    """A variable-length HDF5 string as h5py reads it, decoded as :func:`_decode` does.

    h5py decodes the bytes as UTF-8 whatever the string's declared encoding,
    with bytes that are not UTF-8 (a Latin-1 byte in an ASCII string, say) as
    lone surrogates, which no str stored by lamina may hold: such a string is
    taken back to its bytes and decoded as fixed-length ones are (UTF-8, else
    Latin-1).
    """
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return _decode(s.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:  # a surrogate that stands for no byte: lamina says why
            return s
    return s


def _h5_str(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, (bytes, np.bytes_)):
        return _decode(bytes(v))
    if isinstance(v, str):
        return v
    a = np.asarray(v)
    if a.ndim == 0 and a.dtype.kind in "SUO":
        return _h5_str(a[()])
    return None


def _h5_int(v, what: str) -> int:
    a = np.asarray(v) if v is not None else None
    if a is None or a.ndim != 0 or a.dtype.kind not in "iu":
        raise FormatError(f"{what}: expected an integer, got {v!r}")
    return int(a)


# --------------------------------------------------------------------------
# helpers


def _created(what: str, made: bool, create, *args, **kw):
    """``create(*args, **kw)``: a lamina group or dataset made for *what* of the source.

    lamina's refusal (a name or a fill value it cannot hold) is one error
    naming *what*: a FormatError if the source was *made* by lamina, else a
    ConvertError.
    """
    try:
        return create(*args, **kw)
    except (LaminaError, ValueError, TypeError) as e:
        err = FormatError if made else ConvertError
        raise err(f"{what}: cannot create it: {e}") from None


def _check_distinct(src: str, dst: str) -> None:
    if os.path.exists(dst) and os.path.exists(src) and os.path.samefile(src, dst):
        raise ConvertError(f"source and destination are the same file: {src!r}")


def _require_serial(f, what: str = "HDF5") -> None:
    """ConvertError unless the conversion runs on one rank: that of the open file *f*, or
    (None) of the file lamina.open would open (checked before a destination is staged: its
    temporary name differs from rank to rank)."""
    size = (f.comm if f is not None else comm_mod.resolve(None)).size  # (MPI usable: said)
    if size != 1:
        raise ConvertError(
            f"{what} conversion runs on one rank; it was started on {size} (run it without mpiexec)"
        )


class _staged:
    """Write to a temporary sibling of *dst*; on success move it to *dst*, on failure remove it."""

    def __init__(self, dst: str, overwrite: bool, kind: str):
        if not dst.strip():
            raise ConvertError("no destination given (an empty path)")
        if kind == "hdf5" and dst.endswith(("/", os.sep)):
            raise ConvertError(f"an HDF5 destination is a file: {dst!r} ends with a slash")
        dst = dst.rstrip("/" + os.sep) or dst  # a directory's name, whichever way it is spelled
        self.dst = dst
        self.kind = kind
        parent = os.path.dirname(os.path.abspath(dst))
        if not os.path.isdir(parent):
            raise FileNotFoundError(f"cannot write {dst!r}: directory {parent!r} does not exist")
        if os.path.lexists(dst):
            if not overwrite:
                raise FileExistsError(
                    f"{dst!r} exists; pass --force (overwrite=True) to replace it"
                )
            if kind == "zarr" and os.path.isdir(dst):
                if not is_zarr_store(dst):
                    raise FileExistsError(
                        f"{dst!r} is a directory that is not a Zarr store; not replacing it"
                    )
            elif os.path.isdir(dst) and not os.path.exists(os.path.join(dst, "lamina.commit")):
                raise FileExistsError(
                    f"{dst!r} is a directory that is not a lamina file; not replacing it"
                )
            if kind == "hdf5" and os.path.isdir(dst):
                raise FileExistsError(
                    f"{dst!r} is a lamina directory; not replacing it with an HDF5 file"
                )
            if not os.path.isdir(dst) and (kind != "hdf5" or not is_hdf5_file(dst)):
                # (a file of something else, or a link to nothing: what --force replaces is
                # the kind of thing it writes, as for directories)
                want = {"hdf5": "an HDF5 file", "zarr": "a Zarr store"}.get(kind, "a lamina file")
                raise FileExistsError(f"{dst!r} is not {want}; not replacing it")
        self.parent = parent
        self.stem = f".{os.path.basename(os.path.abspath(dst))}.partial-{_host()}-"
        self.tmp = os.path.join(parent, f"{self.stem}{os.getpid()}")

    def __enter__(self) -> str:
        _remove(self.tmp)
        self._remove_stale()
        return self.tmp

    def _remove_stale(self) -> None:
        """Remove what conversions to the same destination, killed on this host, left behind.

        Only names of this host are looked at: a conversion running on
        another host (a shared file system) is never touched, nor one whose
        process is alive here.
        """
        try:
            names = os.listdir(self.parent)
        except OSError:
            return
        for name in names:
            pid = name[len(self.stem) :]
            if name.startswith(self.stem) and pid.isdigit() and not _alive(int(pid)):
                _remove(os.path.join(self.parent, name))

    def __exit__(self, et, ev, tb) -> None:
        if ev is not None:
            _remove(self.tmp)
            return
        try:
            if os.path.lexists(self.dst):
                _remove(self.dst)
            os.replace(self.tmp, self.dst)
        except OSError as e:  # nothing half-written is left behind, whatever failed
            _remove(self.tmp)
            raise ConvertError(
                f"cannot put the converted file in place as {self.dst!r}: {e.strerror or e}"
            ) from e


def _host() -> str:
    """This host's name as a file name may hold it."""
    import socket

    return "".join(c if c.isalnum() or c in "._" else "_" for c in socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
    """Whether process *pid* of this host exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OverflowError, OSError):  # PermissionError: another user's
        return True
    return True


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _bar(total: int, desc: str, progress: bool | None):
    if progress is None:
        progress = sys.stderr.isatty()
    if not progress:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        leave=False,
    )


__all__ = [
    "ConvertError",
    "ConvertResult",
    "FORMAT",
    "FORMAT_VERSION",
    "chunk_shape",
    "convert",
    "detect",
    "hdf5_to_lamina",
    "is_zarr_store",
    "lamina_to_hdf5",
    "split_box",
]
