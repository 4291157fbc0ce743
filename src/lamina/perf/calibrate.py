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
``fresh_copy_bandwidth``  a copy into a new array (the gathering of a derived quantity's
                       inputs): bytes read and written, page faults of the new memory included
``block_seconds``      seconds per block at several block sizes (below)

The kernels return new arrays, as the derived layer does; timed after an
untimed run, they get memory the allocator kept, so their rates leave out
the page faults of new memory.  ``fresh_copy_bandwidth`` measures those (the
allocator hands its free memory back before each run), and the model adds
them where the layer touches new memory.

The rates above are measured on large arrays.  lamina works block by block,
and a block costs more than its bytes at those rates: each kernel call, each
statistics pass and each read or write of a block has a fixed cost, and the
kernels start a second thread only on large arrays.  ``block_seconds`` holds,
per kind of work, the seconds one block takes at :data:`BLOCK_ELEMENTS`
float64 elements (``kernel``: ``a + b``, ``stencil``: ``gradient(u, 0)``,
``magnitude``: ``magnitude(vx, vy, vz)``, ``curl``: ``curl(u, v, w)``,
``stats``: the statistics pass) or :data:`BLOCK_BYTES` bytes (``write``: one
block of a step of several written through the engine, ``read``: one block
read back alone), and ``query``, a query's own time besides its reads by the
blocks of the dataset it judges (:data:`QUERY_BLOCKS`); :func:`block_time`
interpolates between them (see :mod:`lamina.perf.model` for where the model
uses them).

The query engine sits above this package, so it measures itself: it
registers a probe (:func:`register_probe`) that :func:`calibrate` calls.

:func:`load_calibration` keeps the result at ``$LAMINA_CALIBRATION``, else
``$XDG_CACHE_HOME/lamina/calibration.json`` (``~/.cache`` by default), and
measures again when the file is missing, does not parse, holds no
calibration of this host, or was made by another version of the calibration;
a file of a newer version (a newer lamina's) is neither read nor replaced
(:func:`newer_file`).
Hosts that share the path keep theirs side by side (:func:`save_calibration`).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import math
import os
import platform
import stat
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # no flock (Windows): saves go on unlocked
    fcntl = None  # type: ignore[assignment]

from ..catalog.wire import load_json
from ..errors import FormatError, LaminaWarning, warn_caller

#: bumped when what is measured changes: older files are measured again
#: (2: the copy into new memory and the per-block tables; 3: a query's own time)
CALIBRATION_VERSION = 3
#: bytes of the arrays measured (quick: a quarter)
SIZE = 64 << 20
QUICK_SIZE = 16 << 20
#: largest calibration file read (a real one is about two kilobytes a host)
MAX_FILE_BYTES = 1 << 16
#: deepest nesting of a calibration (an object of tables of [size, seconds] pairs)
DEPTH = 4
#: block sizes of the per-block tables: float64 elements (kernels, statistics) and bytes
#: (the engine's writes and reads); quick calibrations leave out the largest
BLOCK_ELEMENTS = (1 << 12, 1 << 15, 1 << 18, 1 << 21)
BLOCK_BYTES = (1 << 15, 1 << 18, 1 << 21, 1 << 24)
#: the kinds of work timed per block, and what their sizes count
TABLES = {
    "kernel": "elements",
    "stencil": "elements",
    "magnitude": "elements",
    "curl": "elements",
    "stats": "elements",
    "write": "bytes",
    "read": "bytes",
    "query": "blocks",  # a query's own time by blocks of the dataset it judges (a probe's)
}
#: blocks of the dataset a query judges, for the ``query`` table (quick: the first two)
QUERY_BLOCKS = (16, 256, 4096)
#: the kernel each table of kernels times, and whether over a cube (a stencil) or a line
TABLE_KERNELS = {
    "kernel": ("a + b", False),
    "stencil": ("gradient(u, 0)", True),
    "magnitude": ("magnitude(vx, vy, vz)", False),
    "curl": ("curl(u, v, w)", True),
}
#: the tables whose kernels are bound by the operation rate (their sum: the roofline's)
FLOP_TABLES = ("magnitude", "curl")
#: most points of one table in a calibration file
MAX_POINTS = 16
#: bytes a step of the write table writes at least (in blocks of each size, 4 blocks or more;
#: quick: a quarter)
TABLE_STEP_BYTES = 8 << 20

#: the rates, the block sizes and the seconds per block a calibration may hold: what no
#: machine measures (a file damaged or made by hand) would make a prediction overflow, divide
#: by zero or come out NaN, and the file is refused
RATE_RANGE = (1e3, 1e16)  # bytes or operations per second
SIZE_RANGE = (1.0, 1e18)  # elements, bytes or blocks
SECONDS_RANGE = (1e-12, 1e6)  # seconds per block

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
    #: 0 where not measured (a calibration made by hand): the model takes ``memcpy_bandwidth``
    fresh_copy_bandwidth: float = 0.0
    #: kind -> ((block size, seconds per block), ...), sizes increasing; a kind left out (a
    #: calibration made by hand) is predicted from the rate of large arrays alone
    block_seconds: Mapping[str, tuple[tuple[float, float], ...]] = field(
        default_factory=dict, hash=False
    )

    def __post_init__(self) -> None:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        _check(doc)
        # read-only: a frozen calibration whose tables could change would not be one
        tables = {
            k: tuple((float(n), float(t)) for n, t in v) for k, v in doc["block_seconds"].items()
        }
        object.__setattr__(self, "block_seconds", _ReadOnly(tables))

    def to_json(self) -> str:
        return json.dumps(self.as_doc(), indent=1, sort_keys=True) + "\n"

    def as_doc(self) -> dict[str, Any]:
        """The calibration as a JSON object holds it."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["block_seconds"] = {k: [list(p) for p in v] for k, v in self.block_seconds.items()}
        return doc

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
            # the shared reader bounds its length and nesting before parsing (tables: 4 deep)
            doc = load_json(
                text, "calibration", limit=MAX_FILE_BYTES, max_depth=DEPTH, constants=False
            )
        except FormatError as e:
            raise ValueError(str(e)) from None
        if not isinstance(doc, dict):
            raise ValueError(f"calibration: expected a JSON object, got {type(doc).__name__}")
        _check(doc)
        return cls(**doc)


class _ReadOnly(dict):
    """A dict that refuses changes: the tables of a frozen :class:`Calibration` (still a dict to
    ``dataclasses.asdict``, ``json`` and ``copy``)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("the tables of a Calibration are read-only (use dataclasses.replace)")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))


class _OtherVersion(ValueError):
    """A calibration of another version: measured again without a word, as one of another host."""


class _NewerFile(_OtherVersion):
    """A calibration file of a newer version, a newer lamina's: neither read nor replaced."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"calibration: version {version} of the calibration, newer than {CALIBRATION_VERSION}"
        )
        self.version = version


def _check(doc: dict[str, Any]) -> None:
    names = [f.name for f in fields(Calibration)]
    v = doc.get("version")
    if (
        set(doc) != set(names)
        and isinstance(v, int)
        and not isinstance(v, bool)
        and v != CALIBRATION_VERSION
    ):
        raise _OtherVersion(
            f"calibration: made by version {v} of the calibration, not {CALIBRATION_VERSION} "
            "(its fields differ): measure again"
        )
    for key in doc:
        if key not in names:
            raise ValueError(f"calibration: unknown key {key!r}")
    for key in names:
        if key not in doc:
            raise ValueError(f"calibration: missing key {key!r}")
    for key in RATES:
        if not _number(doc[key]):
            raise ValueError(f"calibration: {key!r} must be a finite number > 0, got {doc[key]!r}")
        if not _within(doc[key], RATE_RANGE):
            raise ValueError(
                f"calibration: {key!r} must be in {_range(RATE_RANGE)}, got {doc[key]!r}"
            )
    if not isinstance(doc["host"], str):
        raise ValueError(f"calibration: 'host' must be text, got {type(doc['host']).__name__}")
    c = doc["created"]
    if not (_number(c) or _zero(c)):
        raise ValueError(f"calibration: 'created' must be a time in seconds >= 0, got {c!r}")
    v = doc["version"]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"calibration: 'version' must be an integer >= 1, got {v!r}")
    c = doc["fresh_copy_bandwidth"]
    if not (_number(c) or _zero(c)):
        raise ValueError(f"calibration: 'fresh_copy_bandwidth' must be finite and >= 0, got {c!r}")
    if not (_zero(c) or _within(c, RATE_RANGE)):
        raise ValueError(
            f"calibration: 'fresh_copy_bandwidth' must be 0 or in {_range(RATE_RANGE)}, got {c!r}"
        )
    _check_tables(doc["block_seconds"])


def _zero(v: Any) -> bool:
    return type(v) in (int, float) and v == 0


def _within(v: float, bounds: tuple[float, float]) -> bool:
    """Whether the number *v* (a finite one: :func:`_number`) is within *bounds*."""
    return bounds[0] <= v <= bounds[1]


def _range(bounds: tuple[float, float]) -> str:
    return f"[{bounds[0]:g}, {bounds[1]:g}]"


def finite_number(v: Any) -> float | None:
    """*v*, a number a JSON file gave, as a finite float; None for anything else: a bool, a
    string, NaN, an infinity, an integer too large for a float (the files lamina reads back:
    calibration, history, model checks)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _number(v: Any) -> bool:
    """A finite number > 0 that is not a bool (an integer too large for a float is not one)."""
    f = finite_number(v)
    return f is not None and f > 0


def _check_tables(tables: Any) -> None:
    if not isinstance(tables, Mapping):
        raise ValueError(
            f"calibration: 'block_seconds' must be an object, got {type(tables).__name__}"
        )
    for kind, points in tables.items():
        what = f"calibration: block_seconds[{kind!r}]"
        if kind not in TABLES:
            raise ValueError(
                f"calibration: unknown kind {kind!r} in 'block_seconds' (known: {', '.join(TABLES)})"
            )
        if not isinstance(points, list | tuple) or not 1 <= len(points) <= MAX_POINTS:
            raise ValueError(f"{what} must be a list of 1 to {MAX_POINTS} [size, seconds] pairs")
        last = 0.0
        for pt in points:
            if not isinstance(pt, list | tuple) or len(pt) != 2 or not all(map(_number, pt)):
                raise ValueError(f"{what}: {pt!r} is not a pair of finite numbers > 0")
            if not (_within(pt[0], SIZE_RANGE) and _within(pt[1], SECONDS_RANGE)):
                raise ValueError(
                    f"{what}: {pt!r}: a block size must be in {_range(SIZE_RANGE)}, its "
                    f"seconds in {_range(SECONDS_RANGE)}"
                )
            if pt[0] <= last:
                raise ValueError(f"{what}: sizes must increase, got {pt[0]!r} after {last!r}")
            last = pt[0]


def block_time(cal: Calibration, kind: str, size: float) -> float | None:
    """Seconds one block of *size* (elements or bytes, see :data:`TABLES`) takes for *kind* of
    work, from the calibration's table; None where it has none.

    Between two measured sizes the time is interpolated linearly in log-log; below the
    smallest, ``seconds = a + size / rate`` through the two smallest points (the fixed cost
    of a block stays); above the largest, the line through the two largest points (a query's
    fixed cost stays too), or the largest point's time per unit where that line does not
    rise.
    """
    points = cal.block_seconds.get(kind)
    if not points:
        return None
    if not size > 0:  # also nan
        return 0.0
    if size >= points[-1][0]:
        n1, t1 = points[-1]
        per = (t1 - points[-2][1]) / (n1 - points[-2][0]) if len(points) > 1 else 0.0
        return t1 + (per if per > 0 else t1 / n1) * (size - n1)
    if size <= points[0][0]:
        n0, t0 = points[0]
        if len(points) == 1:
            return t0 * size / n0
        n1, t1 = points[1]
        per = max(0.0, (t1 - t0) / (n1 - n0))
        return max(t0 - per * (n0 - size), t0 * size / n0)
    for (n0, t0), (n1, t1) in itertools.pairwise(points):
        if size <= n1:
            w = math.log(size / n0) / math.log(n1 / n0)
            return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
    raise AssertionError("unreachable")  # pragma: no cover


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


def _kernel_inputs(e: Any, n: int, cube: bool, rng) -> tuple[dict[str, np.ndarray], int]:
    """Inputs of expression *e* of about *n* elements each (a line, or a cube for a stencil),
    values in [0.5, 1.5), and their elements."""
    shape: tuple[int, ...] = (n,)
    if cube:
        side = max(3, round(n ** (1 / 3)))
        shape = (side, side, side)
    return {p: rng.random(shape) + 0.5 for p in sorted(e.inputs)}, math.prod(shape)


def _kernel_rates(size: int, repeat: int, rng) -> dict[str, float]:
    from ..derived import evaluate, parse

    out: dict[str, float] = {}

    def run(text: str, cube: bool) -> tuple[float, int, Any]:
        e = parse(text)
        arrays, n = _kernel_inputs(e, size // 8 // len(e.inputs), cube, rng)
        return _best(lambda: evaluate(e, arrays), repeat), n, e

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
    import shutil
    import tempfile

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


def _fresh_copy_rate(src: np.ndarray, repeat: int) -> float:
    """Bytes read and written per second copying *src* into new memory, as the derived layer
    gathers the inputs of an expression at the end of a step: three arrays, each new, all
    alive until the last is copied.  Before each run the allocator hands its free memory back
    to the system (glibc's ``malloc_trim``, as it does itself between steps once freed memory
    passes its threshold), so that every run faults its pages in: without it the runs after
    the first reuse the same pages and time a plain memcpy."""
    parts = np.array_split(src, 3)
    times = []
    for r in range(repeat + 1):  # the first run untimed
        _trim()
        t = time.perf_counter()
        held = []
        for p in parts:
            held.append(np.empty_like(p))
            np.copyto(held[-1], p)
        if r:
            times.append(time.perf_counter() - t)
        del held
    return 2 * src.nbytes / max(min(times), 1e-9)


def _trim() -> None:
    """Hand the C allocator's free memory back to the system (glibc; elsewhere nothing)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim  # glibc
            _malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError, TypeError):  # no such C library (TypeError: Windows)
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None


def _times(repeat: int, n: int) -> int:
    """Timed runs of a block of *n* units: more for small blocks, whose times are short and
    scattered by the scheduler (at most 5 times *repeat*)."""
    return max(repeat, min(5 * repeat, (1 << 20) // max(1, n)))


def _kernel_tables(
    sizes: tuple[int, ...], repeat: int, rng
) -> dict[str, list[tuple[float, float]]]:
    """Seconds per block of the kernels and of the statistics pass at *sizes* float64 elements."""
    from .. import stats
    from ..derived import evaluate, parse

    def timed(text: str, n: int, cube: bool) -> float:
        e = parse(text)
        arrays, m = _kernel_inputs(e, n, cube, rng)
        return _best(lambda: evaluate(e, arrays), _times(repeat, n)) * n / m

    tables: dict[str, list[tuple[float, float]]] = {k: [] for k in TABLE_KERNELS}
    tables["stats"] = []
    for n in sizes:
        for kind, (text, cube) in TABLE_KERNELS.items():
            tables[kind].append((n, timed(text, n, cube)))
        a = rng.random(n)
        tables["stats"].append(
            (n, _best(partial(stats.compute, a, checksum=False), _times(repeat, n)))
        )
    return tables


def _io_tables(
    sizes: tuple[int, ...], repeat: int, directory: str | None, rng, step_bytes: int
) -> dict[str, list[tuple[float, float]]]:
    """Seconds per block of a step written through the engine and of a block read alone, at
    *sizes* bytes of float64 per block (:func:`_io_block`)."""
    import shutil
    import tempfile

    tables: dict[str, list[tuple[float, float]]] = {"write": [], "read": []}
    base = tempfile.mkdtemp(prefix="lamina-calibrate-", dir=directory)
    try:
        for size in sizes:
            w, r = _io_block(os.path.join(base, f"b{size}.lam"), size, repeat, rng, step_bytes)
            tables["write"].append((size, w))
            tables["read"].append((size, r))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return tables


def _io_block(path: str, size: int, repeat: int, rng, step_bytes: int) -> tuple[float, float]:
    """(write, read) seconds per block of *size* bytes: steps of at least 4 blocks and
    *step_bytes* written to one file opened once (each step timed, the first not), then every
    block read alone (each pass timed)."""
    import shutil

    from .. import comm as comm_mod
    from ..catalog import DatasetSpec
    from ..engines.native import NativeEngine
    from ..geometry import Box

    n = size // 8
    k = max(4, step_bytes // size)
    arr = rng.random(n * k)
    boxes = [Box((i * n,), ((i + 1) * n,)) for i in range(k)]
    runs = _times(repeat, size // 64)
    eng = NativeEngine()
    eng.open(path, "w", comm_mod.self_comm(), {"durable": False})
    try:
        eng.define(DatasetSpec("x", arr.shape, arr.dtype))
        times = []
        for r in range(runs + 1):  # the first step untimed: fresh file, fresh memory
            t = time.perf_counter()
            eng.begin_step()
            for b in boxes:
                eng.put("x", b, arr[b.start[0] : b.stop[0]])
            eng.end_step()
            if r:
                times.append(time.perf_counter() - t)
    finally:
        eng.close()
    reader = NativeEngine()
    reader.open(path, "r", comm_mod.self_comm(), {})
    try:
        out = np.empty(n)

        def read() -> None:
            for b in boxes:
                reader.get("x", b, None, out)

        t_read = _best(read, runs)
    finally:
        reader.close()
    shutil.rmtree(path, ignore_errors=True)
    return max(min(times), 1e-9) / k, t_read / k


#: measurements made by packages above this one: name -> ``probe(directory, quick)``, which
#: returns tables to add to ``block_seconds`` (:func:`register_probe`)
PROBES: dict[str, Callable[[str | None, bool], dict[str, list[tuple[float, float]]]]] = {}


def register_probe(
    name: str, probe: Callable[[str | None, bool], dict[str, list[tuple[float, float]]]]
) -> None:
    """Have :func:`calibrate` call *probe(directory, quick)* and keep the tables it returns
    (kinds of :data:`TABLES`): how a package above this one (the query engine) is timed."""
    PROBES[name] = probe


def calibrate(quick: bool = False, directory: str | None = None) -> Calibration:
    """Measure this machine (a few seconds; ``quick``: a fraction of that).

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
        "stats_bandwidth": src.nbytes / _best(partial(stats.compute, src, checksum=False), repeat),
    }
    rates.update(_kernel_rates(size, repeat, rng))
    rates.update(_io_rates(size, repeat, directory, rng))
    fresh = _fresh_copy_rate(src, repeat)
    del src
    keep = -1 if quick else None
    tables = _kernel_tables(BLOCK_ELEMENTS[:keep], repeat, rng)
    step_bytes = TABLE_STEP_BYTES // 4 if quick else TABLE_STEP_BYTES
    tables.update(_io_tables(BLOCK_BYTES[:keep], repeat, directory, rng, step_bytes))
    for name, probe in PROBES.items():
        try:
            tables.update(probe(directory, quick))
        except Exception as e:  # noqa: BLE001 - the other rates are still good
            warnings.warn(
                f"calibration: the {name!r} probe failed ({type(e).__name__}: {e}); "
                "its table is left out",
                stacklevel=2,
            )
    return Calibration(
        **rates,
        host=host(),
        created=time.time(),
        version=CALIBRATION_VERSION,
        fresh_copy_bandwidth=fresh,
        block_seconds={k: tuple(v) for k, v in tables.items()},
    )


# ------------------------------------------------------------- the cache
def cache_path(env: str, name: str) -> str:
    """``$env``, else ``$XDG_CACHE_HOME/lamina/name`` (default ``~/.cache``): where a model keeps
    what it measured on this machine."""
    given = os.environ.get(env)
    if given:
        return os.path.expanduser(given)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "lamina", name)


class NotRegularFile(ValueError):
    """A cache file's path names something other than a regular file (a device, a FIFO, a
    directory): it is neither read nor replaced."""


#: the paths (their targets) of cache files warned about as not regular files: once each
_NOT_REGULAR: set[str] = set()
#: the files written by a newer lamina warned about (:func:`newer_file`)
_NEWER: set[str] = set()


def discards(path: str) -> bool:
    """Whether *path* names the null device (through links too): a cache there keeps nothing,
    without a word (``LAMINA_HISTORY=/dev/null``)."""
    return os.path.realpath(path) == os.devnull


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name

    return "not a file"


def not_kept(path: str, what: str, mode: int) -> None:
    """Warn once per process (a :class:`~lamina.errors.LaminaWarning`) that *what* at *path*
    is not a regular file and so is neither read nor replaced; nothing for the null device
    (:func:`discards`)."""
    if discards(path):
        return
    key = os.path.realpath(path)
    if key in _NOT_REGULAR:
        return
    _NOT_REGULAR.add(key)
    warnings.warn(
        f"{what} {path} is {_kind(mode)}, not a regular file: it is neither read nor "
        "replaced, and nothing measured is kept there (give a regular file's path, or "
        f"{os.devnull} to keep nothing)",
        LaminaWarning,
        stacklevel=3,
    )


def newer_file(path: str, what: str, version: int, mine: int, env: str) -> None:
    """Warn once per process (a :class:`~lamina.errors.LaminaWarning`, at the program's call)
    that *what* at *path* was written by a newer lamina (its *version*, this lamina's *mine*)
    and so is neither read nor replaced: two lamina versions may share one home directory,
    and the newer one's file is not this lamina's to write over (*env*: the variable that
    gives another path)."""
    key = os.path.realpath(path)
    if key in _NEWER:
        return
    _NEWER.add(key)
    warn_caller(
        f"{what} {path} was written by a newer lamina (version {version}, this lamina keeps "
        f"version {mine}): it is neither read nor replaced, and nothing measured here is kept "
        f"there (set ${env} to another file to keep this lamina's)"
    )


def read_cache_file(path: str, what: str, limit: int) -> bytes:
    """At most *limit* + 1 bytes of the file at *path* (OSError, ValueError).

    Only a regular file is read (a FIFO or a device would block or never
    end): anything else is a :class:`NotRegularFile` naming *path*.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(f"{what}: {path} is {_kind(mode)}, not a regular file")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        return f.read(limit + 1)


def writable_path(path: str, what: str) -> str | None:
    """The path a cache file at *path* is written to: the file a symbolic link names (the
    link stays, as an editor keeps it), else *path*; None where something other than a
    regular file is there (a device, a FIFO, a directory: not replaced, see
    :func:`not_kept`)."""
    target = os.path.realpath(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    if stat.S_ISREG(mode):
        return target
    not_kept(path, what, mode)
    return None


def write_cache_file(path: str, text: str, what: str = "cache file") -> os.stat_result | None:
    """Write *text* to *path* atomically (a temporary file renamed over it); the status of the
    file written, taken before the rename (a stat after it could see another process's file).

    A symbolic link is followed (the file it names is replaced, the link
    stays); where *path* names something other than a regular file (the
    null device, a FIFO, a directory) nothing is written and this returns
    None (:func:`writable_path`).
    """
    import tempfile

    target = writable_path(path, what)
    if target is None:
        return None
    d = os.path.dirname(target)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(target) + "-", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            st = os.fstat(f.fileno())
        os.replace(tmp, target)
        return st
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


# ------------------------------------------------------------- one file, many hosts
# A cache file under a home directory shared by the hosts of a cluster (the default place) is
# one path for all of them: each keeps its part side by side with the others' (the part of
# the host that saved last at the top, as a file of one host was; the others' under
# OTHERS), and a save replaces its own part only.

#: hosts a cache file keeps: this one and the most recently saved others
MAX_HOSTS = 16
#: the key of the other hosts' parts in a cache file
OTHERS = "others"
#: longest wait (seconds) for another process's save of the same file; then saved unlocked
LOCK_WAIT = 10.0


def others_of(doc: Any) -> dict[str, Any]:
    """The other hosts' parts of a cache file's JSON *doc*: host name -> part (an object);
    none where there are none or they are not that."""
    got = doc.get(OTHERS) if isinstance(doc, dict) else None
    if not isinstance(got, dict):
        return {}
    return {h: part for h, part in got.items() if isinstance(part, dict) and h}


def with_others(
    doc: dict[str, Any],
    others: Mapping[str, Any],
    recency: Callable[[Any], float],
    limit: int,
    **dumps: Any,
) -> tuple[str, dict[str, Any]]:
    """The JSON of *doc* (this host's part) with the parts of *others* beside it, and those
    kept: the most recent (*recency* of a part, larger: newer) at most :data:`MAX_HOSTS` - 1,
    and as many as keep the text within *limit* bytes (the least recent left out first)."""

    def newness(item: tuple[str, Any]) -> float:
        try:
            t = float(recency(item[1]))
        except (TypeError, ValueError, OverflowError):
            return 0.0
        return t if math.isfinite(t) else 0.0

    order = sorted(others.items(), key=newness, reverse=True)[: MAX_HOSTS - 1]
    while True:
        kept = dict(order)
        text = json.dumps({**doc, OTHERS: kept} if kept else doc, **dumps)
        if not order or len(text.encode()) <= limit:
            return text, kept
        order.pop()


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path + '.lock'`` (``fcntl.flock``) while a cache file is
    read, merged and replaced, waiting for another process's at most :data:`LOCK_WAIT`
    seconds; without locks (no ``fcntl``, a lock file that cannot be made, a file system
    without them, a wait too long) unlocked.  The lock file is removed before the lock is let
    go, so none is left beside the file: a process that locked a file no longer at that path
    locks again."""
    fd = _lock(path + ".lock") if fcntl is not None else None
    try:
        yield
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.remove(path + ".lock")
            os.close(fd)  # and the lock with it


def _lock(path: str) -> int | None:
    """A descriptor of the file at *path* (made if missing) holding its exclusive lock; None
    where it cannot be had (see :func:`locked`)."""
    assert fcntl is not None
    deadline = time.monotonic() + LOCK_WAIT
    pause = 1e-3
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd  # the lock of the file at that path
        except BlockingIOError:  # another process saves: wait for it, a while
            pass
        except FileNotFoundError:  # removed by the process that held it: lock the next
            pass
        except OSError:  # no locks on this file system
            os.close(fd)
            return None
        os.close(fd)
        if time.monotonic() >= deadline:
            return None
        time.sleep(pause)
        pause = min(2 * pause, 0.01)


def default_path() -> str:
    """``$LAMINA_CALIBRATION``, else ``$XDG_CACHE_HOME/lamina/calibration.json`` (default ``~/.cache``)."""
    return cache_path("LAMINA_CALIBRATION", "calibration.json")


def read_calibration(path: str) -> Calibration:
    """The calibration in file *path*: this host's where the file holds one, else that of
    the host that saved last (OSError, ValueError).

    Only a regular file is read, and at most :data:`MAX_FILE_BYTES` + 1 bytes of it.
    """
    doc = _file_doc(read_cache_file(path, "calibration", MAX_FILE_BYTES))
    mine = others_of(doc).get(host()) if doc.get("host") != host() else None
    if mine is not None:
        _not_newer(mine)  # (this host's part a newer lamina's, another host's at the top)
    return _of_doc(mine if mine is not None else doc)


def newer_version(doc: Any, mine: int) -> int | None:
    """The ``version`` of the JSON object *doc* (a cache file, or one host's part of one)
    where it is an integer larger than *mine*, this lamina's: a newer lamina's, which is
    neither read nor replaced (:func:`newer_file`); else None."""
    v = doc.get("version") if isinstance(doc, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > mine else None


def _not_newer(part: dict[str, Any]) -> None:
    """_NewerFile where the calibration *part* is of a version newer than this lamina's."""
    v = newer_version(part, CALIBRATION_VERSION)
    if v is not None:
        raise _NewerFile(v)


def _file_doc(text: str | bytes) -> dict[str, Any]:
    """The JSON object of a calibration file (ValueError): a calibration at the top, the other
    hosts' beside it (:data:`OTHERS`, each as deep as the top one)."""
    try:
        doc = load_json(
            text, "calibration", limit=MAX_FILE_BYTES, max_depth=DEPTH + 2, constants=False
        )
    except FormatError as e:
        raise ValueError(str(e)) from None
    if not isinstance(doc, dict):
        raise ValueError(f"calibration: expected a JSON object, got {type(doc).__name__}")
    _not_newer(doc)  # (its host's calibration at the top: the file is a newer lamina's)
    return doc


def _of_doc(doc: dict[str, Any]) -> Calibration:
    """The calibration at the top of a calibration file's object (ValueError)."""
    return Calibration.from_json(json.dumps({k: v for k, v in doc.items() if k != OTHERS}))


def save_calibration(cal: Calibration, path: str) -> None:
    """Write *cal* to *path* atomically (a temporary file renamed over it), beside the other
    hosts' calibrations the file holds (at most :data:`MAX_HOSTS` hosts, the least recently
    made left out first); nothing where *path* is not a regular file (see
    :func:`write_cache_file`)."""
    target = writable_path(path, "calibration")
    if target is None:
        return
    with locked(target):  # no other host's save between the read and the rename
        try:
            doc = _file_doc(read_cache_file(path, "calibration", MAX_FILE_BYTES))
        except _NewerFile as e:  # a newer lamina's: left as it is
            newer_file(path, "calibration", e.version, CALIBRATION_VERSION, "LAMINA_CALIBRATION")
            return
        except (OSError, ValueError):  # none, or not usable: written over
            doc = {}
        others = others_of(doc)
        if isinstance(doc.get("host"), str) and doc["host"]:  # the top one is a host's too
            others[doc["host"]] = {k: v for k, v in doc.items() if k != OTHERS}
        try:  # this host's part, a newer lamina's (another host's at the top): left as it is
            _not_newer(others.pop(cal.host, {}))
        except _NewerFile as e:
            newer_file(path, "calibration", e.version, CALIBRATION_VERSION, "LAMINA_CALIBRATION")
            return
        text, _ = with_others(
            cal.as_doc(),
            others,
            lambda part: part.get("created", 0.0),
            MAX_FILE_BYTES,
            indent=1,
            sort_keys=True,
        )
        write_cache_file(path, text + "\n", "calibration")


def cached(path: str | None = None) -> Calibration | None:
    """The cached calibration if it is usable here (this host, this version), else None (a
    file that is there but refused, with a warning)."""
    path = path or default_path()
    try:
        cal = read_calibration(path)
    except _NewerFile as e:  # measured here, and not saved there
        newer_file(path, "calibration", e.version, CALIBRATION_VERSION, "LAMINA_CALIBRATION")
        return None
    except (FileNotFoundError, _OtherVersion):
        return None
    except NotRegularFile:  # a device, a FIFO: measured, and not saved there
        with contextlib.suppress(OSError):
            not_kept(path, "calibration", os.stat(path).st_mode)
        return None
    except (OSError, ValueError) as e:
        warnings.warn(f"calibration {path} ignored: {e}", LaminaWarning, stacklevel=2)
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
        warnings.warn(
            f"could not cache the calibration at {path}: {e}", LaminaWarning, stacklevel=2
        )
    return cal
