"""Measure the rates the cost models need on this machine, and cache them as JSON.

:func:`calibrate` measures, on 64 MiB of float64 (16 MiB with ``quick``),
each rate the best of a few runs after an untimed one (the first touch of
fresh memory is slow in a virtual machine and says nothing of the steady
state):

``memcpy_bandwidth``   ``numpy.copyto``, counting bytes read and written
``kernel_bandwidth``   :func:`lamina.derived.evaluate` of ``a + b`` (memory bound), compulsory
                       bytes per second (inputs read once, output written once)
``stencil_bandwidth``  the same for ``gradient(u, 0)``, the cheapest stencil
``flop_rate``          operations per second of ``magnitude(vx, vy, vz)`` and
                       ``curl(u, v, w)`` together (bound by the operation rate)
``stats_bandwidth``    :func:`lamina.stats.compute` without checksums (the statistics pass)
``write_bandwidth``    a native lamina file written with ``durable=False`` (page cache)
``read_bandwidth``     the same file read back into a new array

The kernels return fresh arrays, as the derived layer does, so the rates
include the page faults of new results.

:func:`load_calibration` keeps the result at ``$LAMINA_CALIBRATION``, else
``$XDG_CACHE_HOME/lamina/calibration.json`` (``~/.cache`` by default), and
measures again when the file is missing, does not parse, or was made on
another host or by another version of the calibration.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from ..catalog.wire import load_json
from ..errors import FormatError

#: bumped when what is measured changes: older files are measured again
CALIBRATION_VERSION = 1
#: bytes of the arrays measured (quick: a quarter)
SIZE = 64 << 20
QUICK_SIZE = 16 << 20
#: largest calibration file read (a real one is a few hundred bytes)
MAX_FILE_BYTES = 1 << 16

RATES = (
    "memcpy_bandwidth",
    "kernel_bandwidth",
    "stencil_bandwidth",
    "flop_rate",
    "stats_bandwidth",
    "write_bandwidth",
    "read_bandwidth",
)


@dataclass(frozen=True)
class Calibration:
    """Measured rates of this machine: bandwidths in bytes/s, ``flop_rate`` in operations/s.

    See :mod:`lamina.perf.calibrate` for what each rate measures.
    """

    memcpy_bandwidth: float
    kernel_bandwidth: float
    stencil_bandwidth: float
    flop_rate: float
    stats_bandwidth: float
    write_bandwidth: float
    read_bandwidth: float
    host: str
    created: float
    version: int = CALIBRATION_VERSION

    def __post_init__(self) -> None:
        _check(asdict(self))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Calibration:
        """Parse a calibration file, strictly.

        Raises ValueError (naming the key at fault) for anything but a JSON
        object with exactly the fields of :class:`Calibration`, each of its
        type, the rates finite and > 0.
        """
        if not isinstance(text, str | bytes | bytearray):
            raise ValueError(f"calibration: expected text, got {type(text).__name__}")
        try:
            # a flat object: the shared reader bounds its length and nesting before parsing
            doc = load_json(text, "calibration", limit=MAX_FILE_BYTES, max_depth=2, constants=False)
        except FormatError as e:
            raise ValueError(str(e)) from None
        if not isinstance(doc, dict):
            raise ValueError(f"calibration: expected a JSON object, got {type(doc).__name__}")
        _check(doc)
        return cls(**doc)


def _check(doc: dict[str, Any]) -> None:
    names = [f.name for f in fields(Calibration)]
    for key in doc:
        if key not in names:
            raise ValueError(f"calibration: unknown key {key!r}")
    for key in names:
        if key not in doc:
            raise ValueError(f"calibration: missing key {key!r}")
    for key in RATES:
        v = doc[key]
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"calibration: {key!r} must be a number, got {type(v).__name__}")
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"calibration: {key!r} must be finite and > 0, got {v!r}")
    if not isinstance(doc["host"], str):
        raise ValueError(f"calibration: 'host' must be text, got {type(doc['host']).__name__}")
    c = doc["created"]
    if isinstance(c, bool) or not isinstance(c, int | float) or not math.isfinite(c) or c < 0:
        raise ValueError(f"calibration: 'created' must be a time in seconds >= 0, got {c!r}")
    v = doc["version"]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"calibration: 'version' must be an integer >= 1, got {v!r}")


def host() -> str:
    """The name this machine's calibration is filed under."""
    return platform.node() or "unknown"


# ------------------------------------------------------------- measuring
def _best(fn: Callable[[], object], repeat: int) -> float:
    fn()  # untimed: first touch of fresh memory, imports
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return max(min(times), 1e-9)


def _memcpy_rate(src: np.ndarray, repeat: int) -> float:
    dst = np.empty_like(src)
    return 2 * src.nbytes / _best(lambda: np.copyto(dst, src), repeat)


def _kernel_rates(size: int, repeat: int, rng) -> dict[str, float]:
    from ..derived import evaluate, parse

    out: dict[str, float] = {}

    def run(text: str, cube: bool) -> tuple[float, int, Any]:
        e = parse(text)
        n = size // 8 // len(e.inputs)
        shape: tuple[int, ...] = (n,)
        if cube:
            side = max(3, round(n ** (1 / 3)))
            shape = (side, side, side)
        arrays = {p: rng.random(shape) + 0.5 for p in sorted(e.inputs)}
        t = _best(lambda: evaluate(e, arrays), repeat)
        return t, math.prod(shape), e

    t, n, e = run("a + b", False)
    out["kernel_bandwidth"] = e.bytes_per_element(8) * n / t
    t, n, e = run("gradient(u, 0)", True)
    out["stencil_bandwidth"] = e.bytes_per_element(8) * n / t
    t1, n1, e1 = run("magnitude(vx, vy, vz)", False)
    t2, n2, e2 = run("curl(u, v, w)", True)
    out["flop_rate"] = (e1.flops_per_element * n1 + e2.flops_per_element * n2) / (t1 + t2)
    return out


def _io_rates(size: int, repeat: int, directory: str | None, rng) -> dict[str, float]:
    """Write and read rates of a native file on this process alone, through the engine (no layers)."""
    from .. import comm as comm_mod
    from ..catalog import DatasetSpec
    from ..engines.native import NativeEngine
    from ..geometry import Box

    arr = rng.random(size // 8)
    box = Box.from_shape(arr.shape)
    base = tempfile.mkdtemp(prefix="lamina-calibrate-", dir=directory)
    try:
        path = os.path.join(base, "c.lam")

        def write() -> None:
            shutil.rmtree(path, ignore_errors=True)
            eng = NativeEngine()
            eng.open(path, "w", comm_mod.self_comm(), {"durable": False})
            try:
                eng.define(DatasetSpec("x", arr.shape, arr.dtype))
                eng.begin_step()
                eng.put("x", box, arr)
                eng.end_step()
            finally:
                eng.close()

        def read() -> None:
            eng = NativeEngine()
            eng.open(path, "r", comm_mod.self_comm(), {})
            try:
                eng.get("x", box, None, np.empty_like(arr))
            finally:
                eng.close()

        tw = _best(write, repeat)
        tr = _best(read, repeat)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {"write_bandwidth": arr.nbytes / tw, "read_bandwidth": arr.nbytes / tr}


def calibrate(quick: bool = False, directory: str | None = None) -> Calibration:
    """Measure this machine (a second or two; ``quick``: a fraction of that).

    Files go to a temporary directory under *directory* (default: the
    system's), removed afterwards.  Nothing is cached: see
    :func:`load_calibration`.
    """
    from .. import stats

    size = QUICK_SIZE if quick else SIZE
    repeat = 2 if quick else 3
    rng = np.random.default_rng(0)
    src = rng.random(size // 8)
    rates: dict[str, float] = {
        "memcpy_bandwidth": _memcpy_rate(src, repeat),
        "stats_bandwidth": src.nbytes / _best(lambda: stats.compute(src, checksum=False), repeat),
    }
    rates.update(_kernel_rates(size, repeat, rng))
    rates.update(_io_rates(size, repeat, directory, rng))
    return Calibration(**rates, host=host(), created=time.time(), version=CALIBRATION_VERSION)


# ------------------------------------------------------------- the cache
def cache_path(env: str, name: str) -> str:
    """``$env``, else ``$XDG_CACHE_HOME/lamina/name`` (default ``~/.cache``): where a model keeps
    what it measured on this machine."""
    given = os.environ.get(env)
    if given:
        return os.path.expanduser(given)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "lamina", name)


def read_cache_file(path: str, what: str, limit: int) -> bytes:
    """At most *limit* + 1 bytes of the file at *path* (OSError, ValueError).

    Only a regular file is read (a FIFO or a device would block or never
    end).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{what}: {path} is not a regular file")
        return f.read(limit + 1)


def write_cache_file(path: str, text: str) -> os.stat_result:
    """Write *text* to *path* atomically (a temporary file renamed over it); the status of the
    file written, taken before the rename (a stat after it could see another process's file)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + "-", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            st = os.fstat(f.fileno())
        os.replace(tmp, path)
        return st
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def default_path() -> str:
    """``$LAMINA_CALIBRATION``, else ``$XDG_CACHE_HOME/lamina/calibration.json`` (default ``~/.cache``)."""
    return cache_path("LAMINA_CALIBRATION", "calibration.json")


def read_calibration(path: str) -> Calibration:
    """The calibration in file *path*, whatever host made it (OSError, ValueError).

    Only a regular file is read, and at most :data:`MAX_FILE_BYTES` + 1 bytes of it.
    """
    return Calibration.from_json(read_cache_file(path, "calibration", MAX_FILE_BYTES))


def save_calibration(cal: Calibration, path: str) -> None:
    """Write *cal* to *path* atomically (a temporary file renamed over it)."""
    write_cache_file(path, cal.to_json())


def cached(path: str | None = None) -> Calibration | None:
    """The cached calibration if it is usable here (this host, this version), else None."""
    try:
        cal = read_calibration(path or default_path())
    except (OSError, ValueError):
        return None
    if cal.host != host() or cal.version != CALIBRATION_VERSION:
        return None
    return cal


def load_calibration(
    path: str | None = None,
    measure: bool = True,
    quick: bool = False,
    on_measure: Callable[[str], None] | None = None,
) -> Calibration:
    """This machine's calibration, from the cache at *path* (default :func:`default_path`).

    When the file is missing, does not parse, or comes from another host or
    version, it is measured (:func:`calibrate`, *quick* if asked) and saved
    there, after calling *on_measure* with the path; with ``measure=False``
    the problem is raised instead (FileNotFoundError or ValueError).  A
    cache that cannot be written only warns.
    """
    path = path or default_path()
    cal = cached(path)
    if cal is not None:
        return cal
    if not measure:
        found = read_calibration(path)  # raises what is wrong with the file
        raise ValueError(
            f"calibration {path}: made on host {found.host!r} with version {found.version}, "
            f"not on {host()!r} with version {CALIBRATION_VERSION}"
        )
    if on_measure is not None:
        on_measure(path)
    cal = calibrate(quick=quick)
    try:
        save_calibration(cal, path)
    except OSError as e:
        warnings.warn(f"could not cache the calibration at {path}: {e}", stacklevel=2)
    return cal
