"""Compression pipeline for dataset blocks, on numcodecs (zstd, blosc, lz4, zlib) and zfpy.

A dataset's pipeline is a list of numcodecs configuration dicts, recorded in
the file.  Only the codec ids in :data:`ALLOWED` are ever instantiated, with
parameters type-checked, so a file cannot make lamina build an arbitrary
codec (numcodecs also has a *pickle* codec, which lamina never accepts).

Decoding never trusts the bytes it is given: the size of a block is known
(its box times the item size), so each stage of :meth:`Pipeline.decode`
reads the size its codec's header declares (zstd's frame content size,
blosc's and lz4's headers, zfp's shape and mode) and refuses one larger
than the block before anything is allocated, then decompresses into a
buffer of the declared size (zlib: with a bounded output), so data that
claims a small size but expands further is cut off and refused.  A
decompression bomb gives a :class:`~lamina.errors.CodecError` naming the
dataset and the block, never a huge allocation.
"""

from __future__ import annotations

import json
import math
import numbers
import struct
import zlib
from typing import Any

import numpy as np

from .catalog.model import MAX_CODEC_JSON
from .errors import CodecError
from .multires.compress import zfp_max_extent  # (a layer down: its bands are zfp fields too)
from .zfpstream import zfp_bound, zfp_header, zfp_need

#: codec id -> {parameter: accepted python types}
ALLOWED: dict[str, dict[str, tuple[type, ...]]] = {
    "zstd": {"level": (int,), "checksum": (bool,)},
    "blosc": {"cname": (str,), "clevel": (int,), "shuffle": (int,), "blocksize": (int,)},
    "lz4": {"acceleration": (int,)},
    "zlib": {"level": (int,)},
    "zfpy": {"mode": (int,), "tolerance": (float, int), "rate": (float, int), "precision": (int,)},
}

_ALIASES = {"zfp": "zfpy", "gzip": "zlib"}

#: the most bytes numcodecs' LZ4 (LZ4_MAX_INPUT_SIZE) and Blosc (BLOSC_MAX_BUFFERSIZE: INT_MAX
#: less its 16-byte header) take in one buffer; they refuse anything larger
MAX_INPUT = {"lz4": 0x7E000000, "blosc": 2**31 - 1 - 16}


class CodecLimitError(CodecError):
    """A block beyond what a codec's format or library can encode (an axis longer than zfp's
    header records, a buffer larger than LZ4 or Blosc take): stored raw instead."""


def h5py_compression(name: str, compression: Any, opts: Any = None) -> Any:
    """*compression* of dataset *name* with h5py's spellings read as lamina's: an integer
    is the gzip level (0-9), ``compression_opts`` *opts* the level of ``"gzip"``; anything
    else as given (:func:`normalize` judges it).  CodecError for an integer out of range or
    *opts* beside another codec."""
    if isinstance(compression, int | np.integer) and not isinstance(compression, bool):
        if not 0 <= compression <= 9:  # (h5py: an integer is the gzip level)
            raise CodecError(
                f"dataset {name!r}: compression={compression!r}: an integer is the gzip level "
                "(0-9, as in h5py); else give a codec name, tuple or dict"
            )
        compression, opts = "gzip", int(compression) if opts is None else opts
    if opts is not None:
        if compression not in ("gzip", "zlib"):
            raise CodecError(
                f"dataset {name!r}: compression_opts={opts!r} is the level of "
                f"compression='gzip' (0-9), not of {compression!r}: give other codecs' "
                "parameters in a dict, {'id': 'zstd', 'level': 5}"
            )
        compression = {"id": "zlib", "level": opts}
    return compression


def limit_refusal(cid: str, shape: tuple[int, ...], nbytes: int) -> str | None:
    """Why codec *cid* cannot encode an input of *shape* and *nbytes* bytes (a limit of its
    format or of numcodecs), or None where it can."""
    if cid == "zfpy" and 1 <= len(shape) <= 4:
        most = zfp_max_extent(len(shape))
        if max(shape) > most:
            return (
                f"zfp's header records axes of at most {most} values in {len(shape)}-D, "
                f"the block's shape is {tuple(shape)}"
            )
    largest = MAX_INPUT.get(cid)
    if largest is not None and nbytes > largest:
        return f"numcodecs' {cid} takes buffers of at most {largest} bytes, not {nbytes}"
    return None


def normalize(compression, dtype: np.dtype, ndim: int) -> tuple[dict, ...]:
    """User compression argument -> tuple of validated codec configs.

    Accepts None, a codec name ("zstd", "blosc", "lz4", "zlib"), ``("zfp",
    tolerance)`` or ``{"id": "zfpy", "tolerance": 1e-3}``, or a list of
    those applied in order.  zfp needs a float or 32/64-bit int dtype and 1-4
    dimensions, and one of an absolute error bound (``tolerance``, floats
    only), a rate or a precision.  On integers zfp's lossy modes hold only
    for values of magnitude below 2**30 (int32) or 2**62 (int64): beyond,
    its transform overflows and values read back wrong (docs/api.md); the
    values are not checked.
    """
    if compression is None or compression is False or compression == ():
        return ()
    items = compression if isinstance(compression, list) else [compression]
    out = []
    for item in items:
        cfg: dict[str, Any]
        if isinstance(item, str):
            cfg = {"id": _ALIASES.get(item, item)}
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            name = _ALIASES.get(item[0], item[0])
            if isinstance(item[1], dict):
                cfg = {"id": name, **item[1]}
            elif name == "zfpy" and isinstance(item[1], numbers.Number | np.generic):
                cfg = {"id": "zfpy", "tolerance": item[1]}  # judged as a dict's: bool refused
            else:
                raise CodecError(
                    f"compression {item!r}: expected (name, params-dict) or ('zfp', tolerance)"
                )
        elif isinstance(item, dict):
            cfg = dict(item)
            ident = cfg.get("id")
            cfg["id"] = _ALIASES.get(ident, ident) if isinstance(ident, str) else ident
        else:
            raise CodecError(f"compression must be a codec name, tuple or dict, got {item!r}")
        out.append(_validate(cfg, dtype, ndim))
    configs = tuple(out)
    if len(json.dumps(list(configs), sort_keys=True, separators=(",", ":"))) > MAX_CODEC_JSON:
        raise CodecError(f"compression pipeline of {len(configs)} codecs is too long to record")
    # numcodecs checks some parameters (blosc cname/clevel/shuffle, zlib level) only when it
    # compresses: try a one-value block now rather than define a dataset nobody can write
    probe = np.zeros((1,) * ndim, dtype=dtype)
    try:
        p = pipeline(configs)
        p.decode(p.encode(probe), dtype, probe.shape, "a test block")
    except CodecError as e:
        raise CodecError(
            f"compression {compression!r} does not work for {dtype} data: {e}"
        ) from None
    return configs


def _check_params(cfg: dict) -> dict:
    """Each parameter of an allowed codec's *cfg* is one it has, of an accepted type: its
    parameters as plain Python values (numpy numbers are numbers too; bool is no number)."""
    cid = cfg["id"]
    params = ALLOWED[cid]
    plain = {}
    for k, v in cfg.items():
        if k == "id":
            continue
        if k not in params:
            raise CodecError(f"codec {cid!r} has no parameter {k!r} (accepted: {sorted(params)})")
        plain[k] = _plain(v, params[k])
        if plain[k] is None:
            raise CodecError(
                f"codec {cid!r} parameter {k!r} must be {params[k][0].__name__}, got {v!r}"
            )
    return plain


def _plain(v, types: tuple[type, ...]) -> Any:
    """*v* as the plain Python value of one of *types* (None if it is none of them): numpy
    integers and floats are taken as Python's, bools only where bool is asked for."""
    if isinstance(v, bool | np.bool_):
        return bool(v) if bool in types else None
    if float in types and isinstance(v, numbers.Real):
        return int(v) if isinstance(v, numbers.Integral) else float(v)
    if int in types and isinstance(v, numbers.Integral):
        return int(v)
    return v if isinstance(v, types) else None


def zfp_min_rate(dtype: np.dtype, ndim: int) -> float:
    """The smallest zfp rate (bits per value) of *ndim*-D blocks of *dtype*: zfp keeps at
    least 1 + the exponent's bits (9 for float32, 12 for float64) for each block of 4**ndim
    values, and zfpy, which sizes its buffer by the rate asked for, overruns it below that
    (a crash or a hang); 0 for integers."""
    if dtype.kind != "f":
        return 0.0
    return (1 + (8 if dtype.itemsize == 4 else 11)) / 4**ndim


#: zfp's parameter of each mode lamina runs -> numcodecs' (zfp's) number of that mode
_ZFP_MODES = {"tolerance": 4, "rate": 2, "precision": 3}
_ZFP_MODE_NAMES = {4: "fixed-accuracy", 2: "fixed-rate", 3: "fixed-precision"}


def _validate(cfg: dict, dtype: np.dtype, ndim: int) -> dict:
    cid = cfg.get("id")
    if not isinstance(cid, str) or cid not in ALLOWED:
        raise CodecError(f"unknown codec {cid!r}; lamina accepts {sorted(ALLOWED) + ['zfp']}")
    cfg.update(_check_params(cfg))  # (recorded as JSON: numpy numbers become Python's)
    if cid == "zfpy":
        if dtype.kind not in "fi" or dtype.itemsize not in (4, 8):
            raise CodecError(f"zfp compresses float32/float64/int32/int64 data, not {dtype}")
        if not dtype.isnative:
            raise CodecError(f"zfp compresses native byte order data, not {dtype.str}")
        if not 1 <= ndim <= 4:
            raise CodecError(f"zfp compresses 1-4 dimensional blocks, not {ndim}-D")
        given = [k for k in _ZFP_MODES if k in cfg]
        if not given:
            raise CodecError(
                "zfp needs an error bound: ('zfp', tolerance) or {'id': 'zfpy', 'tolerance': ...}"
            )
        # numcodecs takes any of these together and runs the mode it is given (fixed accuracy
        # without one), silently dropping the other parameters: refused rather than guessed
        if len(given) > 1:
            raise CodecError(
                "zfp takes one of tolerance, rate and precision (one mode), got "
                + ", ".join(f"{k}={cfg[k]!r}" for k in given)
            )
        want = _ZFP_MODES[given[0]]
        if "mode" in cfg and cfg["mode"] != want:
            raise CodecError(
                f"zfp mode {cfg['mode']!r} contradicts {given[0]}={cfg[given[0]]!r}, which runs "
                f"zfp's {_ZFP_MODE_NAMES[want]} mode ({want}); give mode {want} or none"
            )
        # without a mode numcodecs' ZFPY runs fixed-accuracy and ignores rate/precision
        cfg.setdefault("mode", want)
        if "tolerance" in cfg:
            if dtype.kind != "f":
                # zfp ignores the tolerance for integer data: the bound would silently not hold
                raise CodecError(
                    f"zfp's error bound (tolerance) applies to float data only, not {dtype}; "
                    "use {'id': 'zfpy', 'precision': ...} or 'rate' for integers"
                )
            cfg["tolerance"] = float(cfg["tolerance"])
            if not (cfg["tolerance"] > 0 and math.isfinite(cfg["tolerance"])):
                raise CodecError(
                    f"zfp tolerance must be a positive finite number, got {cfg['tolerance']}"
                )
        else:
            key = given[0]
            if not 0 < cfg[key] <= 64:  # bits per value / bit planes; more only wastes memory
                raise CodecError(
                    f"zfp {key} must be a positive number of at most 64 bits, got {cfg[key]}"
                )
            least = zfp_min_rate(dtype, ndim) if key == "rate" else 0.0
            if cfg[key] < least:
                raise CodecError(
                    f"zfp rate must be at least {least:g} bits per value for {ndim}-D blocks "
                    f"of {dtype} (zfp's smallest block), got {cfg[key]}"
                )
    return cfg


def lossy(configs: tuple[dict, ...]) -> bool:
    """Whether blocks stored through codecs *configs* may read back other values than those
    written (zfp, in every mode: a tolerance bounds the difference, rate and precision do not)."""
    return any(cfg.get("id") == "zfpy" for cfg in configs)


def within(decoded: np.ndarray, written: np.ndarray, tolerance: float) -> bool:
    """Whether every value of *decoded* lies within *tolerance* of *written* (finite values of
    one shape; the difference taken in float64, so that float32 rounds no error away)."""
    if not decoded.size:
        return True
    diff = np.subtract(decoded, written, dtype=np.float64)
    return float(np.abs(diff, out=diff).max()) <= tolerance


class Pipeline:
    """Encode/decode a block through a validated codec list."""

    def __init__(self, configs: tuple[dict, ...]):
        import numcodecs  # lazy: only files with compression pay the import

        self.configs = configs
        #: zfp maps NaN and inf to finite numbers: blocks holding them must not go through it
        self.finite_only = any(cfg.get("id") == "zfpy" for cfg in configs)
        #: whether a decoded block may differ from the one encoded
        self.lossy = lossy(configs)
        #: the absolute error bound of zfp's accuracy mode (None in its other modes, or without zfp)
        self.tolerance: float | None = next(
            (float(c["tolerance"]) for c in configs if c.get("id") == "zfpy" and "tolerance" in c),
            None,
        )
        self.codecs = []
        for i, cfg in enumerate(configs):
            cid = cfg.get("id")
            if not isinstance(cid, str) or cid not in ALLOWED:  # re-check: configs from disk
                raise CodecError(
                    f"refusing codec {cfg.get('id')!r}: not in the allowed list {sorted(ALLOWED)}"
                )
            _check_params(cfg)
            if cfg["id"] == "zfpy" and i:
                # zfp compresses typed arrays: after another codec it would get bytes
                raise CodecError(f"refusing pipeline {list(configs)}: zfp must be its first codec")
            try:
                if cfg["id"] == "zfpy":
                    from numcodecs.zfpy import ZFPY

                    kw = {k: v for k, v in cfg.items() if k != "id"}
                    self.codecs.append(ZFPY(**kw))
                else:
                    self.codecs.append(numcodecs.get_codec(dict(cfg)))
            except (ImportError, TypeError, ValueError, KeyError) as e:
                raise CodecError(f"cannot build codec {cfg!r}: {e}") from e
        #: zfp's fixed rate (bits per value), where it runs in that mode (its type checked above)
        self.rate: float | None = next(
            (float(c["rate"]) for c in configs if c["id"] == "zfpy" and "rate" in c), None
        )

    def encode(self, arr: np.ndarray, what: str = "a block") -> bytes:
        """The stored bytes of *arr*; *what* names it in errors.

        CodecLimitError where a codec cannot take its input by the limits of its format or
        library (checked before each stage: the block is then to be stored raw), CodecError
        naming *what* and the codec where a codec fails otherwise.
        """
        buf = np.ascontiguousarray(arr)
        if self.rate is not None and self.rate < zfp_min_rate(buf.dtype, buf.ndim):
            # (checked at create_dataset for the dataset's blocks; zfpy would overrun its buffer)
            raise CodecError(
                f"zfp rate {self.rate} is below the {zfp_min_rate(buf.dtype, buf.ndim):g} bits "
                f"per value of {buf.ndim}-D blocks of {buf.dtype}"
            )
        data: Any = buf
        for cfg, c in zip(self.configs, self.codecs, strict=True):
            shape = data.shape if cfg["id"] == "zfpy" else ()  # (zfp comes first: the block)
            why = limit_refusal(cfg["id"], shape, memoryview(data).nbytes)
            if why is not None:
                raise CodecLimitError(f"{what}: {why}")
            try:
                data = c.encode(data)
            except Exception as e:  # codec libraries raise assorted types
                raise CodecError(
                    f"{what}: compression with {cfg['id']} {cfg} failed "
                    f"(pipeline {list(self.configs)}): {e}"
                ) from e
        return bytes(data) if not isinstance(data, bytes) else data

    def decode(self, raw: bytes, dtype: np.dtype, shape: tuple[int, ...], what: str) -> np.ndarray:
        """Stored bytes of a block -> its array of *shape* and *dtype*; *what* names it in errors.

        No stage produces more than the block can hold (:meth:`limits`): a
        codec header that declares more is refused before decompressing,
        and data that expands beyond what its header declares is cut off.
        Raises CodecError.
        """
        nbytes = math.prod(shape) * dtype.itemsize
        limits = self.limits(dtype, shape)
        data: Any = raw
        for i in reversed(range(len(self.codecs))):
            data = self._decode_stage(i, data, limits[i], dtype, shape, what)
        arr = np.asarray(data)
        if arr.dtype != dtype:
            arr = arr.reshape(-1).view(np.uint8)
            if arr.nbytes != nbytes:
                raise CodecError(f"{what}: decompressed {arr.nbytes} bytes, expected {nbytes}")
            arr = arr.view(dtype)
        if arr.size != math.prod(shape):
            raise CodecError(f"{what}: decompressed {arr.size} values, expected {math.prod(shape)}")
        return arr.reshape(shape)

    def limits(self, dtype: np.dtype, shape: tuple[int, ...]) -> list[int]:
        """Per codec, the most bytes decoding it may give for a block of *shape* and *dtype*.

        The first codec gives the block itself (its size exactly); each
        later one gives what the codec before it encodes, at most a little
        more than its input (:func:`encoded_bound`).
        """
        out = [math.prod(shape) * dtype.itemsize]
        for cfg in self.configs[:-1]:
            out.append(encoded_bound(cfg["id"], out[-1], shape))
        return out

    def _decode_stage(
        self, i: int, data, limit: int, dtype: np.dtype, shape: tuple[int, ...], what: str
    ) -> np.ndarray:
        cid = self.configs[i]["id"]
        buf = data if isinstance(data, bytes) else memoryview(data).cast("B")
        try:
            if cid == "zlib":
                return _inflate(buf, limit, what)
            if cid == "zfpy":
                return _zfp_decode(self.codecs[i], buf, dtype, shape, limit, what)
            size = _declared_size(cid, buf, what)
            if size is None:
                if i:
                    raise CodecError(
                        f"{what}: the {cid} data does not declare its size (lamina always records it)"
                    )
                size = limit  # the block itself: numcodecs insists on exactly this size
            if size > limit:
                raise CodecError(
                    f"{what}: the {cid} header declares {size} bytes, more than the {limit} "
                    f"this block can hold"
                )
            out = np.empty(size, np.uint8)
            if size:
                self.codecs[i].decode(buf, out=out)
            return out
        except CodecError:
            raise
        except Exception as e:  # codec libraries raise assorted types
            raise CodecError(f"{what}: decompression with {self.configs} failed: {e}") from e


def encoded_bound(cid: str, nbytes: int, shape: tuple[int, ...]) -> int:
    """Most bytes codec *cid* gives for *nbytes* of input (a block of *shape* for zfp).

    Lossless codecs add a header and at most a small fraction for data they
    cannot compress (zstd 1/256, lz4 1/255, deflate 1/1000 and blosc only
    its 16-byte header); zfp at most :func:`zfp_bound`.
    """
    if cid == "zfpy":
        return zfp_bound(shape)
    return nbytes + nbytes // 64 + 1024


# --------------------------------------------------------------------------
# codec headers: the size each declares, read before anything is decompressed

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_BLOSC_HEADER = struct.Struct(
    "<BBBBIII"
)  # version, versionlz, flags, typesize, nbytes, blocksize, cbytes


def _declared_size(cid: str, buf, what: str) -> int | None:
    """Bytes the zstd, blosc or lz4 data in *buf* says it decompresses to (None: zstd does not say)."""
    n = len(buf)
    if cid == "zstd":
        # frame header: magic, descriptor, [window], [dictionary id], [content size]
        if n < 6 or bytes(buf[:4]) != _ZSTD_MAGIC:
            raise CodecError(f"{what}: not zstd data (no zstd frame at the start)")
        fhd = buf[4]
        single = bool(fhd & 0x20)
        pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
        size_bytes = (1 if single else 0, 2, 4, 8)[fhd >> 6]
        if size_bytes == 0:
            return None
        if n < pos + size_bytes:
            raise CodecError(f"{what}: zstd frame header truncated ({n} bytes)")
        return int.from_bytes(bytes(buf[pos : pos + size_bytes]), "little") + (
            256 if size_bytes == 2 else 0
        )
    if cid == "blosc":
        if n < _BLOSC_HEADER.size:
            raise CodecError(f"{what}: blosc data of {n} bytes is shorter than its header")
        _, _, _, _, nbytes, _, cbytes = _BLOSC_HEADER.unpack(bytes(buf[: _BLOSC_HEADER.size]))
        if cbytes != n:  # blosc reads as many bytes as its header says
            raise CodecError(
                f"{what}: the blosc header declares {cbytes} compressed bytes, the block has {n}"
            )
        return nbytes
    if cid == "lz4":  # numcodecs' LZ4: a u32 of the decompressed size, then an LZ4 block
        if n < 4:
            raise CodecError(f"{what}: lz4 data of {n} bytes is shorter than its header")
        return int.from_bytes(bytes(buf[:4]), "little")
    raise CodecError(f"{what}: no header reader for codec {cid!r}")


def _inflate(buf, limit: int, what: str) -> np.ndarray:
    """zlib data -> at most *limit* bytes; CodecError if it would give more, or is cut short."""
    d = zlib.decompressobj()
    out = d.decompress(buf, limit + 1)
    if len(out) > limit:
        raise CodecError(
            f"{what}: the zlib data expands beyond the {limit} bytes this block can hold"
        )
    if not d.eof:
        raise CodecError(f"{what}: the zlib data is truncated (no end of stream)")
    if d.unused_data:
        raise CodecError(f"{what}: {len(d.unused_data)} bytes after the end of the zlib stream")
    return np.frombuffer(out, np.uint8)


def _zfp_decode(
    codec, buf, dtype: np.dtype, shape: tuple[int, ...], limit: int, what: str
) -> np.ndarray:
    """zfp data -> an array of at most *limit* bytes, its header checked against the block first.

    zfp reads its stream without bounds checks, as far as the header's shape
    and mode take it: data shorter than that is padded with zeros (at most
    :func:`zfp_bound` of the block) instead of letting it read past the end.
    """
    dt, hshape, per_block, header_bits = zfp_header(buf, what)
    count = math.prod(hshape)
    if dt != dtype:
        raise CodecError(f"{what}: the zfp data holds {dt} values, the dataset {dtype}")
    if count * dt.itemsize > limit:
        raise CodecError(
            f"{what}: the zfp header declares {hshape} values ({count * dt.itemsize} bytes), "
            f"more than the {limit} this block can hold"
        )
    need = zfp_need(hshape, per_block, header_bits)
    # another shape of as many values would decode and be reshaped: other values in place
    if hshape != tuple(shape) or need > zfp_bound(shape):
        raise CodecError(
            f"{what}: the zfp header (shape {hshape}, {per_block} bits a block) does not fit "
            f"a block of shape {shape}"
        )
    data = bytes(buf)
    if len(data) < need:
        data += bytes(need - len(data))
    return codec.decode(data)


_CACHE: dict[str, Pipeline] = {}


def pipeline(configs: tuple[dict, ...]) -> Pipeline:
    """A cached :class:`Pipeline` for *configs*."""
    import json

    key = json.dumps(list(configs), sort_keys=True)
    p = _CACHE.get(key)
    if p is None:
        p = _CACHE[key] = Pipeline(configs)
    return p
