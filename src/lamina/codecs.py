"""Compression pipeline for dataset blocks, on numcodecs (zstd, blosc, lz4, zlib) and zfpy.

A dataset's pipeline is a list of numcodecs configuration dicts, recorded in
the file.  Only the codec ids in :data:`ALLOWED` are ever instantiated, with
parameters type-checked, so a file cannot make lamina build an arbitrary
codec (numcodecs also has a *pickle* codec, which lamina never accepts).
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

import numpy as np

from .catalog.model import MAX_CODEC_JSON
from .errors import CodecError

#: codec id -> {parameter: accepted python types}
ALLOWED: dict[str, dict[str, tuple[type, ...]]] = {
    "zstd": {"level": (int,), "checksum": (bool,)},
    "blosc": {"cname": (str,), "clevel": (int,), "shuffle": (int,), "blocksize": (int,)},
    "lz4": {"acceleration": (int,)},
    "zlib": {"level": (int,)},
    "zfpy": {"mode": (int,), "tolerance": (float, int), "rate": (float, int), "precision": (int,)},
}

_ALIASES = {"zfp": "zfpy", "gzip": "zlib"}


def normalize(compression, dtype: np.dtype, ndim: int) -> tuple[dict, ...]:
    """User compression argument -> tuple of validated codec configs.

    Accepts None, a codec name ("zstd", "blosc", "lz4", "zlib"), ``("zfp",
    tolerance)`` or ``{"id": "zfpy", "tolerance": 1e-3}``, or a list of
    those applied in order.  zfp needs a float or 32/64-bit int dtype and 1-4
    dimensions, and an absolute error bound (``tolerance``) unless rate or
    precision is given.
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
            if name == "zfpy" and isinstance(item[1], numbers.Real):
                cfg = {"id": "zfpy", "tolerance": float(item[1])}
            elif isinstance(item[1], dict):
                cfg = {"id": name, **item[1]}
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


def _validate(cfg: dict, dtype: np.dtype, ndim: int) -> dict:
    cid = cfg.get("id")
    if cid not in ALLOWED:
        raise CodecError(f"unknown codec {cid!r}; lamina accepts {sorted(ALLOWED) + ['zfp']}")
    params = ALLOWED[cid]
    for k, v in cfg.items():
        if k == "id":
            continue
        if k not in params:
            raise CodecError(f"codec {cid!r} has no parameter {k!r} (accepted: {sorted(params)})")
        if not isinstance(v, params[k]) or isinstance(v, bool) and bool not in params[k]:
            raise CodecError(
                f"codec {cid!r} parameter {k!r} must be {params[k][0].__name__}, got {v!r}"
            )
    if cid == "zfpy":
        if dtype.kind not in "fi" or dtype.itemsize not in (4, 8):
            raise CodecError(f"zfp compresses float32/float64/int32/int64 data, not {dtype}")
        if not dtype.isnative:
            raise CodecError(f"zfp compresses native byte order data, not {dtype.str}")
        if not 1 <= ndim <= 4:
            raise CodecError(f"zfp compresses 1-4 dimensional blocks, not {ndim}-D")
        if not any(k in cfg for k in ("tolerance", "rate", "precision")):
            raise CodecError(
                "zfp needs an error bound: ('zfp', tolerance) or {'id': 'zfpy', 'tolerance': ...}"
            )
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
            cfg.setdefault("mode", 4)  # zfp fixed-accuracy mode
        else:
            # without a mode numcodecs' ZFPY runs fixed-accuracy and ignores rate/precision
            key, mode = ("rate", 2) if "rate" in cfg else ("precision", 3)
            if not 0 < cfg[key] <= 64:  # bits per value / bit planes; more only wastes memory
                raise CodecError(
                    f"zfp {key} must be a positive number of at most 64 bits, got {cfg[key]}"
                )
            cfg.setdefault("mode", mode)  # zfp fixed-rate / fixed-precision mode
    return cfg


class Pipeline:
    """Encode/decode a block through a validated codec list."""

    def __init__(self, configs: tuple[dict, ...]):
        import numcodecs  # lazy: only files with compression pay the import

        self.configs = configs
        #: zfp maps NaN and inf to finite numbers: blocks holding them must not go through it
        self.finite_only = any(cfg.get("id") == "zfpy" for cfg in configs)
        self.codecs = []
        for cfg in configs:
            if cfg.get("id") not in ALLOWED:  # re-check: configs may come from disk
                raise CodecError(
                    f"refusing codec {cfg.get('id')!r}: not in the allowed list {sorted(ALLOWED)}"
                )
            try:
                if cfg["id"] == "zfpy":
                    from numcodecs.zfpy import ZFPY

                    kw = {k: v for k, v in cfg.items() if k != "id"}
                    self.codecs.append(ZFPY(**kw))
                else:
                    self.codecs.append(numcodecs.get_codec(dict(cfg)))
            except (ImportError, TypeError, ValueError, KeyError) as e:
                raise CodecError(f"cannot build codec {cfg!r}: {e}") from e

    def encode(self, arr: np.ndarray) -> bytes:
        buf = np.ascontiguousarray(arr)
        data = buf
        try:
            for c in self.codecs:
                data = c.encode(data)
        except Exception as e:  # codec libraries raise assorted types
            raise CodecError(f"compression with {self.configs} failed: {e}") from e
        return bytes(data) if not isinstance(data, bytes) else data

    def decode(self, raw: bytes, dtype: np.dtype, shape: tuple[int, ...], what: str) -> np.ndarray:
        data = raw
        try:
            for c in reversed(self.codecs):
                data = c.decode(data)
        except Exception as e:
            raise CodecError(f"{what}: decompression with {self.configs} failed: {e}") from e
        arr = np.asarray(data)
        if arr.dtype != dtype:
            arr = np.frombuffer(
                arr.data.cast("B") if arr.dtype.kind != "V" else arr, dtype=np.uint8
            )
            if arr.nbytes != math.prod(shape) * dtype.itemsize:
                raise CodecError(
                    f"{what}: decompressed {arr.nbytes} bytes, expected {math.prod(shape) * dtype.itemsize}"
                )
            arr = arr.view(dtype)
        if arr.size != math.prod(shape):
            raise CodecError(f"{what}: decompressed {arr.size} values, expected {math.prod(shape)}")
        return arr.reshape(shape)


_CACHE: dict[str, Pipeline] = {}


def pipeline(configs: tuple[dict, ...]) -> Pipeline:
    """A cached :class:`Pipeline` for *configs*."""
    import json

    key = json.dumps(list(configs), sort_keys=True)
    p = _CACHE.get(key)
    if p is None:
        p = _CACHE[key] = Pipeline(configs)
    return p
