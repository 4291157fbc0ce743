"""The metadata data model: dataset definitions, block records, statistics.

Pure (no MPI, no files).  Encoding to bytes lives next to each type so the
format is defined in one place; ``docs/format.md`` describes the same
layout in prose.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from ..errors import DTypeError, FormatError, ShapeError
from ..geometry import Box
from .wire import Decoder, Encoder, load_json

MAX_NDIM = 32
MAX_PATH = 4096
MAX_ATTR_BYTES = 1 << 20
MAX_CODEC_JSON = 1 << 12
#: nesting of a codec description: a list of objects, whose values may be lists
MAX_CODEC_DEPTH = 4
#: checksum segments are multiples of this many bytes (the statistics chunk)
SEGMENT_UNIT = 1 << 18

#: dtype kinds a dataset may have: bool, signed, unsigned, float, complex
NUMERIC_KINDS = "biufc"


# --------------------------------------------------------------------------
# paths


def normpath(path: str, base: str = "") -> str:
    """Canonical form of a node path: 'a/b/c' (no leading slash; '' is the root).

    Relative paths are resolved against *base*; bytes are decoded as UTF-8 (as h5py takes
    them).  Components may not be empty,
    '.', '..', contain NUL, or hold a character UTF-8 cannot encode (a lone surrogate,
    as ``os.fsdecode`` makes of bytes that are not UTF-8).
    """
    if isinstance(path, bytes):  # (UTF-8, as h5py takes a name given as bytes)
        try:
            path = path.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"node name {path!r} is not UTF-8: {e.reason} at byte {e.start}"
            ) from None
    if not isinstance(path, str):
        raise TypeError(f"node names are strings, got {type(path).__name__}")
    absolute = path.startswith("/")
    parts = [p for p in path.split("/") if p != ""]
    for p in parts:
        if p in (".", "..") or "\0" in p:
            raise ValueError(f"invalid path component {p!r} in {path!r}")
        if not p.isascii():
            try:
                p.encode()
            except UnicodeEncodeError as e:
                raise ValueError(
                    f"invalid path component {p!r} in {path!r}: {p[e.start]!r} at position "
                    f"{e.start} is a lone surrogate, which UTF-8 cannot encode"
                ) from None
    if not absolute and base:
        parts = base.split("/") + parts
    out = "/".join(parts)
    size = len(out.encode())
    if size > MAX_PATH:
        raise ValueError(f"path of {size} bytes (UTF-8) exceeds the limit of {MAX_PATH} bytes")
    return out


def parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


# --------------------------------------------------------------------------
# dtypes


def check_dtype(dtype) -> np.dtype:
    """Normalize *dtype* to a numpy dtype lamina can store, or raise DTypeError."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise DTypeError(f"not a numpy dtype: {dtype!r}") from e
    if dt.kind not in NUMERIC_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise DTypeError(
            f"dtype {dt} is not supported: datasets hold numeric scalars "
            "(bool, int, uint, float, complex)"
        )
    return dt


def encode_dtype(e: Encoder, dt: np.dtype) -> None:
    e.str(dt.str)


#: what encode_dtype writes (numpy's ``dtype.str`` of a numeric scalar dtype, e.g. '<f8', '|b1')
_DTYPE_STR = re.compile(r"[<>|=]?[biufc][0-9]{1,2}")


#: the dtypes decode_dtype accepted, by their string (a few dozen at most: numpy parses only
#: the numeric scalar dtypes of _DTYPE_STR's form): a record of attribute changes names one each
_DECODED_DTYPES: dict[str, np.dtype] = {}


def decode_dtype(d: Decoder) -> np.dtype:
    s = d.str()
    dt = _DECODED_DTYPES.get(s)
    if dt is not None:
        return dt
    if len(s) > 8:
        raise FormatError(f"{d.what}: dtype string {s!r} is too long")
    # only hand numpy strings of the form lamina writes: np.dtype() of arbitrary
    # text can raise ValueError or even SyntaxError, and warn
    if not _DTYPE_STR.fullmatch(s):
        raise FormatError(f"{d.what}: unknown dtype {s!r}")
    try:
        dt = np.dtype(s)
    except (TypeError, ValueError) as e:
        raise FormatError(f"{d.what}: unknown dtype {s!r}") from e
    if dt.kind not in NUMERIC_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise FormatError(f"{d.what}: dtype {s!r} is not a numeric scalar dtype")
    _DECODED_DTYPES[s] = dt
    return dt


# --------------------------------------------------------------------------
# attribute values


def normalize_attr(value):
    """Python/numpy value -> the form stored (str, list[str] or numpy array)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return [str(v) for v in value]
    if (
        isinstance(value, np.ndarray)
        and value.dtype == object
        and value.ndim == 1
        and value.size
        and all(isinstance(v, str) for v in value.tolist())
    ):
        # a list of strings as it reads back (a 1-D array of str objects, as h5py gives it):
        # stored as the list (numpy's own strings, dtype '<U', are refused, as h5py refuses them)
        return [str(v) for v in value.tolist()]
    try:
        arr = np.asarray(value)
    except ValueError as e:  # a ragged nested list (numpy's words say so)
        raise ShapeError(f"attribute value is not an array of one shape (numpy: {e})") from None
    if arr.dtype.kind == "S":
        raise DTypeError(
            "attribute values may be numbers, arrays or strings; decode bytes to str first"
        )
    if arr.dtype.kind == "U":  # (h5py refuses numpy's strings too)
        what = (
            f"a nested list of them ({arr.ndim}-D)"
            if isinstance(value, list | tuple)
            else f"an array of numpy strings (dtype {arr.dtype}): give .tolist()"
        )
        raise DTypeError(f"attribute strings are one str or a flat list of str, not {what}")
    if arr.dtype.kind not in NUMERIC_KINDS:
        raise DTypeError(
            f"attribute value of dtype {arr.dtype} is not supported: use numbers, numeric arrays or strings"
        )
    if arr.ndim > MAX_NDIM:  # readers refuse more (decode_attr)
        raise ValueError(f"attribute with {arr.ndim} dimensions exceeds the limit of {MAX_NDIM}")
    if arr.nbytes > MAX_ATTR_BYTES:
        raise ValueError(
            f"attribute of {arr.nbytes} bytes exceeds the limit of {MAX_ATTR_BYTES}; store it as a dataset"
        )
    if math.prod(max(1, n) for n in arr.shape) * arr.itemsize >= 1 << 62:  # as decode_attr
        raise ValueError(
            f"attribute of shape {arr.shape} cannot be stored: with each empty dimension "
            "counted as 1 it spans 2**62 bytes or more, which readers refuse"
        )
    return np.array(arr, order="C")  # a copy; unlike ascontiguousarray, keeps 0-D scalars 0-D


def present_attr(value):
    """Stored form -> what users get back, as h5py gives it.

    0-D arrays become numpy scalars; a list of strings comes back as a 1-D
    numpy array of ``str`` objects (dtype object), as h5py returns it.
    """
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value[()]
    if isinstance(value, list):
        out = np.empty(len(value), dtype=object)
        out[:] = value
        return out
    if isinstance(value, np.ndarray):  # a copy: the caller may change it (h5py's is fresh too)
        return value.copy()
    return value


def encode_attr(e: Encoder, value) -> None:
    value = normalize_attr(value)
    if isinstance(value, str):
        e.u8(1)
        e.str(value)
    elif isinstance(value, list):
        e.u8(3)
        e.u32(len(value))
        for s in value:
            e.str(s)
    else:
        e.u8(2)
        encode_dtype(e, value.dtype)
        e.u8(value.ndim)
        for n in value.shape:
            e.u64(n)
        e.blob(value.tobytes())


def checked_attr(name: str, value):
    """*value* as attribute *name* holds it (:func:`normalize_attr`), refused now as a commit
    would refuse it: ValueError (a name or string of more than ``MAX_STR`` bytes of UTF-8, a
    lone surrogate) or DTypeError."""
    e = Encoder()
    e.str(name)
    value = normalize_attr(value)
    encode_attr(e, value)
    return value


def decode_attr(d: Decoder):
    tag = d.u8()
    if tag == 1:
        return d.str()
    if tag == 3:
        n = d.count(4, name="strings")
        return [d.str() for _ in range(n)]
    if tag == 2:
        dt = decode_dtype(d)
        nd = d.u8()
        if nd > MAX_NDIM:
            raise FormatError(f"{d.what}: attribute has {nd} dimensions (limit {MAX_NDIM})")
        shape = tuple(d.u64() for _ in range(nd))
        if math.prod(max(1, n) for n in shape) * dt.itemsize >= 1 << 62:
            raise FormatError(f"{d.what}: attribute has an impossible shape {shape}")
        raw = d.blob(limit=MAX_ATTR_BYTES)
        if math.prod(shape) * dt.itemsize != len(raw):
            raise FormatError(
                f"{d.what}: attribute of shape {shape} and dtype {dt} does not match its {len(raw)} bytes"
            )
        return np.frombuffer(raw, dtype=dt).reshape(shape).copy()
    raise FormatError(f"{d.what}: unknown attribute type tag {tag}")


# --------------------------------------------------------------------------
# datasets


#: the layout of a multiresolution dataset (``lamina.layouts``)
LAYOUT_MULTIRES = "multires"
#: the layout of one of its coarser levels (an internal definition)
LAYOUT_LEVEL = "multires-level"


@dataclass(slots=True)
class DatasetSpec:
    """Definition of one dataset: path, global shape, dtype, fill value, codec pipeline, layout.

    *layout* is None for a plain dataset, else a flat JSON object whose
    ``"layout"`` key names it (:data:`LAYOUT_MULTIRES`, or
    :data:`LAYOUT_LEVEL` for a coarser level of one, see
    ``lamina.layouts``).  On disk it is the first element of the codec
    list, so that files without layouts read unchanged.
    """

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fill: object = 0
    codecs: tuple[dict, ...] = ()
    id: int = -1
    layout: dict | None = None
    #: where a definition read from a file was read (its file and record, for messages about
    #: it found later, as a layout's); no part of the definition
    origin: str = field(default="", compare=False, repr=False)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def fill_scalar(self):
        return np.array(self.fill, dtype=self.dtype)[()]

    def encode(self, e: Encoder) -> None:
        e.u32(self.id)
        e.str(self.path)
        encode_dtype(e, self.dtype)
        e.u8(self.ndim)
        for n in self.shape:
            e.u64(n)
        e.raw(value_bytes(np.array(self.fill, dtype=self.dtype)))
        described = ([self.layout] if self.layout is not None else []) + list(self.codecs)
        e.str(json.dumps(described, sort_keys=True, separators=(",", ":")))

    @classmethod
    def decode(cls, d: Decoder) -> DatasetSpec:
        did = d.u32()
        path = d.str()
        dt = decode_dtype(d)
        nd = d.u8()
        if nd > MAX_NDIM:
            raise FormatError(f"{d.what}: dataset {path!r} has {nd} dimensions (limit {MAX_NDIM})")
        shape = tuple(d.u64() for _ in range(nd))
        if math.prod(max(1, n) for n in shape) * dt.itemsize >= 1 << 62:
            raise FormatError(f"{d.what}: dataset {path!r} has an impossible shape {shape}")
        fill = np.frombuffer(d.raw(dt.itemsize), dtype=dt)[0]
        codec_json = d.str()
        if len(codec_json) > MAX_CODEC_JSON:
            raise FormatError(f"{d.what}: codec description of dataset {path!r} is too long")
        # a list of flat objects: deeper nesting is never written
        codecs = load_json(
            codec_json,
            f"{d.what}: codec description of dataset {path!r}",
            limit=MAX_CODEC_JSON,
            max_depth=MAX_CODEC_DEPTH,
        )
        if not isinstance(codecs, list) or not all(isinstance(c, dict) for c in codecs):
            raise FormatError(
                f"{d.what}: codec description of dataset {path!r} is not a list of objects"
            )
        layout = None
        if codecs and "layout" in codecs[0]:
            layout = codecs.pop(0)
            if layout["layout"] not in (LAYOUT_MULTIRES, LAYOUT_LEVEL):
                raise FormatError(
                    f"{d.what}: dataset {path!r} has an unknown layout {layout['layout']!r}"
                )
        if not all(isinstance(c.get("id"), str) for c in codecs):  # (unknown ids: at a read)
            raise FormatError(
                f"{d.what}: codec description of dataset {path!r} has a codec without a name ('id')"
            )
        try:
            p = normpath(path)
        except ValueError as e:
            raise FormatError(f"{d.what}: bad dataset path {path!r}") from e
        return cls(p, shape, dt, fill[()], tuple(codecs), did, layout, origin=d.what)

    def digest_bytes(self) -> bytes:
        e = Encoder()
        self.encode(e)
        return e.getvalue()


#: bytes of a long double that hold its value where it is x87's 80-bit format in 12 or 16
#: bytes (x86): the rest is padding nobody writes
_LONGDOUBLE_VALUE = 10 if np.finfo(np.longdouble).nmant == 63 else None


def value_bytes(a: np.ndarray) -> bytes:
    """``a.tobytes()`` with a long double's padding zeroed: the same value gives the same
    bytes on every rank and in every run (a fill value's padding held whatever the stack
    had, and ranks creating one dataset disagreed on its definition)."""
    raw = a.tobytes()
    if _LONGDOUBLE_VALUE is None or a.dtype.kind not in "fc":
        return raw
    part = a.dtype.itemsize // (2 if a.dtype.kind == "c" else 1)
    if part != np.dtype(np.longdouble).itemsize:
        return raw
    buf = np.frombuffer(bytearray(raw), np.uint8).reshape(-1, part)
    buf[:, _LONGDOUBLE_VALUE:] = 0
    return buf.tobytes()


# --------------------------------------------------------------------------
# block statistics


@dataclass(slots=True)
class Stats:
    """Statistics of one block: NaN-aware min, max, sum and count of non-NaN values.

    For complex data, min and max are of the magnitude ``|z|``.  Integer
    min/max are exact; sums are float64 (complex128 for complex data).
    """

    min: float | int
    max: float | int
    sum: float | complex
    count: int

    def encode(self, e: Encoder, dt: np.dtype) -> None:
        e.raw(_stat_slot(self.min, dt))
        e.raw(_stat_slot(self.max, dt))
        s = complex(self.sum)
        e.f64(s.real)
        e.f64(s.imag)
        e.u64(self.count)

    @classmethod
    def of_row(cls, mn, mx, total, count) -> Stats:
        """One row of statistics columns (numpy scalars): integer minima and maxima stay exact
        ints, complex sums complex, the rest floats."""
        if isinstance(mn, np.integer):
            return cls(int(mn), int(mx), float(total), int(count))
        return cls(
            float(mn),
            float(mx),
            complex(total) if np.iscomplexobj(total) else float(total),
            int(count),
        )

    @classmethod
    def decode(cls, d: Decoder, dt: np.dtype) -> Stats:
        mn = _stat_value(d.raw(8), dt)
        mx = _stat_value(d.raw(8), dt)
        re, im = d.f64(), d.f64()
        cnt = d.u64()
        return cls(mn, mx, complex(re, im) if dt.kind == "c" else re, cnt)

    def as_dict(self) -> dict:
        s = self.sum
        return {
            "min": _jsonable(self.min),
            "max": _jsonable(self.max),
            "sum": [s.real, s.imag] if isinstance(s, complex) else _jsonable(s),
            "count": int(self.count),
        }


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


def _stat_slot(v, dt: np.dtype) -> bytes:
    """A minimum or maximum as its 8 little-endian bytes (whatever the host's byte order)."""
    if dt.kind == "i":
        return np.array(v, "<i8").tobytes()
    if dt.kind in "ub":
        return np.array(v, "<u8").tobytes()
    return np.array(v, "<f8").tobytes()


def _stat_value(b: bytes, dt: np.dtype):
    if dt.kind == "i":
        return int(np.frombuffer(b, "<i8")[0])
    if dt.kind in "ub":
        return int(np.frombuffer(b, "<u8")[0])
    return float(np.frombuffer(b, "<f8")[0])


# --------------------------------------------------------------------------
# blocks


class BlockCodec(IntEnum):
    """How a block's bytes are stored: the codec id of a block record (one byte on disk)."""

    #: the block's values in C order, in the dataset's dtype
    RAW = 0
    #: the dataset's codec pipeline (compression) applied to the raw bytes
    PIPELINE = 1
    #: no bytes at all: only the statistics (derived quantities kept with strategy ``stats``)
    STATS_ONLY = 2
    #: one band of one patch of a multiresolution dataset (``lamina.layouts``): a header, then
    #: zfp or deflated bytes
    MULTIRES = 3


#: the codecs as plain ints, for comparisons with numpy columns: numpy takes a slow path for
#: an IntEnum member (3.2 against 0.8 us to compare 64 codecs here)
CODEC_RAW, CODEC_STATS_ONLY, CODEC_MULTIRES = (
    int(BlockCodec.RAW),
    int(BlockCodec.STATS_ONLY),
    int(BlockCodec.MULTIRES),
)


@dataclass(slots=True)
class BlockRecord:
    """Where one written block lives and what it holds."""

    dataset: int
    box: Box
    rank: int = 0
    session: int = 0
    agg: int = 0
    offset: int = 0
    length: int = 0
    codec: int = (
        0  # 0: raw bytes in C order; 1: the dataset's codec pipeline; 2: statistics only, no data
    )
    seg: int = 0  # checksum segment size in bytes (0: one checksum over the whole block)
    crcs: tuple[int, ...] = ()
    stats: Stats | None = None

    @property
    def subfile(self) -> str:
        return subfile_name(self.session, self.agg)

    def encode(self, e: Encoder, dt: np.dtype) -> None:
        e.u32(self.dataset)
        for a in self.box.start:
            e.u64(a)
        for b in self.box.stop:
            e.u64(b)
        e.u32(self.rank)
        e.u32(self.session)
        e.u32(self.agg)
        e.u64(self.offset)
        e.u64(self.length)
        e.u8(self.codec)
        e.u64(self.seg)
        e.u32(len(self.crcs))
        for c in self.crcs:
            e.u32(c)
        if self.stats is None:
            e.u8(0)
        else:
            e.u8(1)
            self.stats.encode(e, dt)

    @classmethod
    def decode(cls, d: Decoder, specs: list[DatasetSpec]) -> BlockRecord:
        did = d.u32()
        if did >= len(specs):
            raise FormatError(
                f"{d.what}: block refers to dataset id {did}, only {len(specs)} defined"
            )
        spec = specs[did]
        start = tuple(d.u64() for _ in range(spec.ndim))
        stop = tuple(d.u64() for _ in range(spec.ndim))
        if any(b < a for a, b in zip(start, stop, strict=True)) or any(
            b > n for b, n in zip(stop, spec.shape, strict=True)
        ):
            raise FormatError(
                f"{d.what}: block box {start}..{stop} is outside dataset {spec.path!r} of shape {spec.shape}"
            )
        box = Box(start, stop)
        rank, session, agg = d.u32(), d.u32(), d.u32()
        offset, length = d.u64(), d.u64()
        codec = d.u8()
        if codec > max(BlockCodec):
            raise FormatError(f"{d.what}: block of {spec.path!r} has unknown codec id {codec}")
        if codec == BlockCodec.STATS_ONLY and length != 0:
            raise FormatError(
                f"{d.what}: statistics-only block of {spec.path!r} at {box} claims {length} bytes"
            )
        if (codec == BlockCodec.MULTIRES) != (spec.layout is not None):
            raise FormatError(
                f"{d.what}: block of {spec.path!r} at {box} has codec {codec}, which its layout "
                "does not take"
            )
        raw = box.size * spec.dtype.itemsize
        if codec == BlockCodec.RAW and length != raw:
            raise FormatError(
                f"{d.what}: raw block of {spec.path!r} at {box} claims {length} bytes, its box holds {raw}"
            )
        if offset >= 1 << 62 or length >= 1 << 62:
            raise FormatError(f"{d.what}: block of {spec.path!r} has an impossible offset/length")
        seg = d.u64()
        if seg % SEGMENT_UNIT or seg >= 1 << 62:
            raise FormatError(
                f"{d.what}: block of {spec.path!r} has checksum segment {seg}, not a multiple of "
                f"{SEGMENT_UNIT} below 2^62"
            )
        ncrc = d.count(4, name="checksums")
        expect = 1 if seg == 0 else max(1, -(-length // seg))
        if ncrc != expect:
            raise FormatError(
                f"{d.what}: block of {spec.path!r} has {ncrc} checksums, expected {expect}"
            )
        crcs = tuple(d.u32() for _ in range(ncrc))
        has = d.u8()
        if has > 1:
            raise FormatError(f"{d.what}: bad statistics flag {has}")
        stats = Stats.decode(d, spec.dtype) if has else None
        if stats is not None and not 0 <= stats.count <= box.size:
            raise FormatError(
                f"{d.what}: block of {spec.path!r} at {box} counts {stats.count} values, its box "
                f"holds {box.size}"
            )
        return cls(did, box, rank, session, agg, offset, length, codec, seg, crcs, stats)


def subfile_name(session: int, agg: int) -> str:
    return f"data.{session}.{agg}"


# --------------------------------------------------------------------------
# metadata records

KIND_STEP = 1
KIND_META = 2
KIND_CLOSE = 3
KIND_NAMES = {KIND_STEP: "step", KIND_META: "meta", KIND_CLOSE: "close"}

OP_GROUP = 1
OP_DATASET = 2
OP_ATTR = 3
OP_DELATTR = 4
OP_EXT = 5


def encode_op(e: Encoder, op: tuple) -> None:
    code = op[0]
    e.u8(code)
    if code == OP_GROUP:
        e.str(op[1])
    elif code == OP_DATASET:
        op[1].encode(e)
    elif code == OP_ATTR:
        e.str(op[1])
        e.str(op[2])
        encode_attr(e, op[3])
    elif code == OP_DELATTR:
        e.str(op[1])
        e.str(op[2])
    elif code == OP_EXT:
        e.str(op[1])
        e.blob(op[2])
    else:
        raise ValueError(f"unknown metadata operation {code}")


def decode_op(d: Decoder) -> tuple:
    code = d.u8()
    if code == OP_GROUP:
        return (OP_GROUP, _path(d))
    if code == OP_DATASET:
        return (OP_DATASET, DatasetSpec.decode(d))
    if code == OP_ATTR:
        return (OP_ATTR, _path(d), d.str(), decode_attr(d))
    if code == OP_DELATTR:
        return (OP_DELATTR, _path(d), d.str())
    if code == OP_EXT:
        return (OP_EXT, d.str(), d.blob(limit=MAX_ATTR_BYTES))
    raise FormatError(f"{d.what}: unknown metadata operation {code}")


def _path(d: Decoder) -> str:
    s = d.str()
    try:
        return normpath(s)
    except ValueError as e:
        raise FormatError(f"{d.what}: bad node path {s!r}") from e
