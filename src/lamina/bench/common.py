"""Pieces shared by the benchmark programs: options, sizes, data, machine, statistics, reporting.

The parent side (``lamina bench write|read``) parses options, launches one
MPI job per rank count (:mod:`.launch`), shows a progress bar and prints the
table.  The worker side (:mod:`.worker`, :mod:`.harness`) runs every method
on the same per-rank array in that one job.

Nothing here imports mpi4py: the worker gets MPI from :mod:`lamina.comm`.
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import launch, text
from ..text import finite_json, positive_seconds

KiB, MiB, GiB = text.KiB, text.MiB, text.GiB
#: worker -> parent progress lines start with this
PROGRESS = "@@lamina-bench "
ITEM = 8  # float64


# --------------------------------------------------------------- options
def parse_size(size: str) -> int:
    """'64MiB', '1GiB', '512k', '1048576' -> bytes (:func:`lamina.text.parse_size`), at least one float64."""
    n = text.parse_size(size)
    if n < ITEM:
        raise ValueError(f"size {size!r} is smaller than one float64")
    return n


def parse_list(
    text: str, what: str, item: Callable[[str], Any] = str, expected: str = "names"
) -> list:
    """'a,b' -> [item('a'), item('b')], each entry stripped; ValueError naming *what* (the
    option) and *text* for an empty list, an empty entry ('a,,b', 'a,b,': a typo is refused,
    not read as another list) or an entry *item* refuses (``expected`` says what an entry is)."""
    entries = [t.strip() for t in str(text).split(",")]
    if entries == [""]:
        raise ValueError(f"{what}: expected comma-separated {expected}, got {text!r}")
    if not all(entries):
        raise ValueError(f"{what}: empty entry in {text!r}; expected comma-separated {expected}")
    try:
        return [item(t) for t in entries]
    except (ValueError, TypeError):
        raise ValueError(f"{what}: expected comma-separated {expected}, got {text!r}") from None


def parse_choices(text: str, what: str, choices: Sequence[str]) -> list[str]:
    """'a,B' -> ['a', 'b'] (:func:`parse_list`), each one of *choices*, matched without
    regard to case and returned as *choices* spells it."""
    spelled = {c.lower(): c for c in choices}
    names = parse_list(text, what)
    bad = [n for n in names if n.lower() not in spelled]
    if bad:
        raise ValueError(f"{what}: unknown {bad}; choose from {', '.join(choices)}")
    return [spelled[n.lower()] for n in names]


def parse_int_list(text: str, what: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4], positive integers (:func:`parse_list`).  Rank counts:
    :func:`parse_ranks`."""
    out = parse_list(text, what, int, "integers")
    if any(v < 1 for v in out):
        raise ValueError(f"{what}: expected positive integers, got {text!r}")
    return out


def parse_ranks(text: str, what: str = "--ranks") -> list[int]:
    """Rank counts, one MPI job each: :func:`parse_int_list` below :data:`launch.MAX_RANKS`."""
    return [launch.check_ranks(n, what) for n in parse_int_list(text, what)]


def int_list_type(what: str) -> Callable[[str], list[int]]:
    """An argparse ``type`` of :func:`parse_int_list` for option *what*: its message, not
    argparse's 'invalid value'."""

    def parse(text: str) -> list[int]:
        try:
            return parse_int_list(text, what)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def add_timeout_argument(
    p, default: float | None = None, help: str = "seconds per MPI job"
) -> None:
    """``--timeout``: seconds per MPI job before it is killed, a number > 0."""
    p.add_argument("--timeout", type=positive_seconds, default=default, help=help)


def parse_aggregators(text: str) -> list[str]:
    """'1,all' -> ['1', 'all']; each entry an integer or 'all' (one per rank)."""
    out = []
    for t in str(text).split(","):
        t = t.strip().lower()
        if not t:
            raise ValueError(f"--aggregators: empty entry in {text!r}")
        if t != "all" and not (t.isdigit() and int(t) >= 1):
            raise ValueError(f"--aggregators: entries are positive integers or 'all', got {t!r}")
        out.append(t)
    if not out:
        raise ValueError("--aggregators: give at least one entry")
    return out


def resolve_aggregators(spec: Sequence[str], ranks: int) -> list[int]:
    """Aggregator counts for a job of *ranks* ranks: 'all' -> ranks; too-large counts clipped; deduplicated."""
    out: list[int] = []
    for t in spec:
        a = ranks if t == "all" else min(int(t), ranks)
        if a not in out:
            out.append(a)
    return out


# ------------------------------------------------------------------ data
def block_shape(nbytes: int) -> tuple[int, int, int]:
    """A 3-D float64 block of about *nbytes* (planes of up to 256 x 256)."""
    n = max(1, nbytes // ITEM)
    side = 256
    while side > 1 and side * side * 4 > n:
        side //= 2
    return (max(1, n // (side * side)), side, side)


def make_local(shape: Sequence[int], rank: int, seed: int = 12345) -> np.ndarray:
    """The block a rank writes: smooth-ish random float64, different on every rank."""
    rng = np.random.default_rng([seed, rank])
    a = rng.random(tuple(shape))
    a += rank
    return a


def crc_array(a: np.ndarray) -> int:
    from ..stats import crc

    return crc(memoryview(np.ascontiguousarray(a)).cast("B"))


# ------------------------------------------------------------- machine
def drop_caches() -> bool:
    """Write back dirty pages and drop the page cache (needs root); False if not permitted."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def proc_io() -> dict[str, int]:
    """This process's I/O counters (rchar, read_bytes, ...) from /proc/self/io; {} if unavailable.

    Read with one ``read`` call; ``own_rchar`` is the length of the text it
    returned, which the *next* snapshot counts (the text grows by a digit
    now and then, so a difference must subtract this, not a constant).
    """
    try:
        fd = os.open("/proc/self/io", os.O_RDONLY)
        try:
            raw = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
    except OSError:
        return {}
    text = raw.decode("ascii", "replace")
    out = {
        k.strip(): int(v) for k, v in (line.split(":") for line in text.splitlines() if ":" in line)
    }
    out["own_rchar"] = len(raw)
    return out


def memory_bytes() -> int | None:
    """This machine's memory (``MemTotal``), None where /proc/meminfo cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * KiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_disk(need: int, directory: str | None, what: str) -> None:
    """ValueError when *what* writes *need* bytes, more than the file system of *directory*
    (None: the temporary directory) has free: refused at the command line, not after filling
    the disk."""
    where = directory or tempfile.gettempdir()
    while where and not os.path.isdir(where):  # (a directory to be made: its parent's space)
        where = os.path.dirname(where.rstrip(os.sep))
    try:
        free = shutil.disk_usage(where or ".").free
    except OSError:
        return
    if need > free:
        raise ValueError(
            f"{what} writes at least {text.fmt_bytes(need)}; {where} has {text.fmt_bytes(free)} free"
        )


def check_memory(need: int, what: str, ranks: int = 0) -> None:
    """ValueError when *what* needs *need* bytes at once, more than this machine has: a
    benchmark refused at its command line, not killed by the kernel, a traceback or an
    MPI_Abort of every job after the files were made.  *need* is a lower bound (the data
    the benchmark makes before it times anything), to which a job of *ranks* ranks adds
    :data:`lamina.launch.RANK_MEMORY` a rank; a run under it may still run short."""
    need += ranks * launch.RANK_MEMORY
    total = memory_bytes()
    if total is not None and need > total:
        raise ValueError(
            f"{what} needs at least {text.fmt_bytes(need)} of memory at once; "
            f"this machine has {text.fmt_bytes(total)}"
        )


def machine() -> dict:
    info: dict = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "numpy": np.__version__}
    total = memory_bytes()
    if total is not None:
        info["mem_gib"] = round(total / GiB, 1)
    return info


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        _remove_listed_profiles(path)
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


#: profiles ADIOS2's BP5 reader left in /tmp for this process (adios2_reader)
_ADIOS2_PROFILES: set[str] = set()
#: the list, in the directory of a BP5 file read (or beside another), of the profiles its
#: readers leave
ADIOS2_PROFILE_LIST = ".adios2-profiles"


def _remove_adios2_profiles() -> None:
    for name in _ADIOS2_PROFILES:
        remove(name)


def _remove_listed_profiles(top: str) -> None:
    """The ADIOS2 profiles that readers of files under *top* listed there: a worker killed
    (a timeout, Ctrl-C, SIGTERM, the kernel) never ran its exit's removal, and left them in
    /tmp, whatever $TMPDIR said."""
    for where, _, names in os.walk(top):
        if ADIOS2_PROFILE_LIST not in names:
            continue
        try:
            with open(os.path.join(where, ADIOS2_PROFILE_LIST)) as f:
                listed = f.read().split("\n")
        except OSError:
            continue
        for name in listed:
            if name.startswith("/tmp/") and name.endswith("_profiling.json"):
                remove(name)


def adios2_reader(path: str):
    """``adios2.FileReader(path)``, for a baseline's reads.

    ADIOS2's BP5 reader writes ``/tmp/<name>_<pid in hex>_profiling.json`` at
    every close, whatever the IO's ``Profile`` parameter says
    (``BP5Reader::FlushProfiler``, ADIOS2 2.10-2.12).  The file is removed when
    this process exits, not after each read, so that the read's time does not
    include it.
    """
    import adios2

    name = f"/tmp/{os.path.basename(path)}_{os.getpid():x}_profiling.json"
    if name not in _ADIOS2_PROFILES:
        if not _ADIOS2_PROFILES:
            atexit.register(_remove_adios2_profiles)
        _ADIOS2_PROFILES.add(name)
        # listed in the file's own directory (a BP5 file is one) too: the removal of the
        # file removes it where this process is killed before its exit (one line, appended
        # at once: ranks share the list)
        where = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        listing = os.path.join(where, ADIOS2_PROFILE_LIST)
        try:
            fd = os.open(listing, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, (name + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # (the exit's removal is still there)
    return adios2.FileReader(path)


def fsync_path(path: str) -> None:
    """fsync a file, or every file in a directory and the directory itself."""
    paths = [path]
    if os.path.isdir(path):
        paths = [os.path.join(path, n) for n in sorted(os.listdir(path))] + [path]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class DataCheckError(Exception):
    """What a benchmark read back differs from what it wrote."""


# ------------------------------------------------------------ statistics
def rounds(
    fns: dict[str, Callable[[], object]],
    repeat: int,
    check: Callable[[str, object], None] | None = None,
) -> dict[str, list[float]]:
    """Times of each function of one process: one untimed run each, then *repeat* rounds that
    run them all.

    The order rotates between rounds, and every round runs every function, so
    that a burst of load on a shared machine hits all of them alike.  *check*,
    if given, is called untimed with the name and the result of each function's
    last timed run.
    """
    names = list(fns)
    for n in names:
        fns[n]()  # untimed: first touch of new memory, imports, GPU start-up
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeat):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            out = fns[n]()
            times[n].append(time.perf_counter() - t)
            if check is not None and r == repeat - 1:
                check(n, out)
            del out
    return times


def summarize(times: Sequence[float]) -> dict:
    ts = sorted(float(t) for t in times)
    n = len(ts)
    med = ts[n // 2] if n % 2 else 0.5 * (ts[n // 2 - 1] + ts[n // 2])
    return {"median": med, "min": ts[0], "max": ts[-1], "times": list(times)}


def speedup(base: dict | None, row: dict | None) -> tuple[float | None, float | None]:
    """How much faster *row* is than *base*: (paired median, best case).

    Paired: the median over repetitions of base time / row time within the
    same repetition (all methods of a repetition run back to back, so a
    burst of load on a shared machine hits both).  Best case: min / min.
    """
    if not base or not row:
        return None, None
    pairs = [b / t for b, t in zip(base["times"], row["times"], strict=False) if t > 0]
    best = base["min"] / row["min"] if row["min"] > 0 else None
    return (summarize(pairs)["median"] if pairs else None), best


def paired_fraction(on: dict | None, off: dict | None) -> float | None:
    """Median over repetitions of (on - off) / on: the share of *on*'s time that *off* does not spend."""
    if not on or not off:
        return None
    fr = [(a - b) / a for a, b in zip(on["times"], off["times"], strict=False) if a > 0]
    return summarize(fr)["median"] if fr else None


def gibps(nbytes: int, seconds: float) -> float:
    return nbytes / GiB / seconds if seconds > 0 else math.inf


# ---------------------------------------------------------- reporting
def ratio_str(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}x"


def verdict(
    value: float | None, target: float, higher_is_better: bool = True, best: float | None = None
) -> str:
    """'met' / 'NOT met' for *value* (the paired median); 'met in best case' if only *best* reaches *target*."""
    if value is None or not math.isfinite(value):
        return "n/a"

    def ok(v):
        return v >= target if higher_is_better else v <= target

    if ok(value):
        return "met"
    if best is not None and math.isfinite(best) and ok(best):
        return "NOT met (met in best case)"
    return "NOT met"


def ratio_cell(pair: tuple[float | None, float | None]) -> str:
    med, best = pair
    if med is None:
        return "-"
    return f"{ratio_str(med)} ({ratio_str(best)})"


@dataclass
class CommonOptions:
    size: int
    ranks: list[int]
    repeat: int
    warmup: int
    aggregators: list[str]
    dir: str
    keep: bool
    fsync: bool
    drop_caches: bool
    methods: list[str]
    json: bool
    seed: int
    timeout: float


FAMILIES = ("numpy", "h5py", "adios2", "lamina")


def add_job_arguments(p) -> None:
    """The options of a benchmark that runs one MPI job per rank count: files, output, seed
    and time limit (``lamina bench async``, ``lamina bench blocks``)."""
    p.add_argument("--dir", default=None, help="directory for the files (default: under $TMPDIR)")
    p.add_argument("--json", action="store_true", help="JSON on stdout, the table on stderr")
    p.add_argument("--seed", type=int, default=12345, help=argparse.SUPPRESS)
    add_timeout_argument(p)


def add_common_arguments(p) -> None:
    p.add_argument(
        "--size",
        default="64MiB",
        help="bytes per rank (3-D float64 block), e.g. 64MiB, 1GiB (default 64MiB)",
    )
    p.add_argument(
        "--ranks",
        default="1,2,4",
        help="comma-separated rank counts, one MPI job each (default 1,2,4)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="timed repetitions of every method (default 3; median and min reported)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed runs of every method before the timed ones (default 1)",
    )
    p.add_argument(
        "--aggregators",
        default="1,all",
        help="lamina aggregator counts: integers or 'all' = one per rank (default 1,all)",
    )
    p.add_argument(
        "--dir",
        default=None,
        help="directory for the files (default: a new one under $TMPDIR, removed afterwards)",
    )
    p.add_argument("--keep", action="store_true", help="keep the files written")
    p.add_argument(
        "--fsync",
        action="store_true",
        help="make every write durable: lamina durable=True, baselines fsync their files (default: page cache only)",
    )
    p.add_argument(
        "--drop-caches",
        action="store_true",
        help="sync and drop the page cache (/proc/sys/vm/drop_caches, needs root) before every timed read",
    )
    p.add_argument(
        "--methods",
        default=",".join(FAMILIES),
        help=f"comma-separated method families to run (default {','.join(FAMILIES)}; numpy is the reference)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the results as JSON on stdout (the table goes to stderr)",
    )
    p.add_argument("--seed", type=int, default=12345, help=argparse.SUPPRESS)
    add_timeout_argument(p, help="seconds per MPI job before it is killed (default: from the size)")


def common_options(ns) -> CommonOptions:
    ranks = parse_ranks(ns.ranks)
    if ns.repeat < 1:
        raise ValueError("--repeat must be at least 1")
    methods = parse_choices(ns.methods, "--methods", FAMILIES)
    if "lamina" not in methods:
        methods.append("lamina")
    if ns.warmup < 0:
        raise ValueError(f"--warmup must be at least 0, got {ns.warmup}")
    size = parse_size(ns.size)
    check_memory(size * max(ranks), f"--size {ns.size} on {max(ranks)} ranks", max(ranks))
    timeout = ns.timeout
    if timeout is None:
        # generous: ~20 s per GiB touched per method and repetition, plus start-up
        timeout = 120 + 20 * size / GiB * max(ranks) * (ns.repeat + ns.warmup + 2) * 12
    return CommonOptions(
        size=size,
        ranks=ranks,
        repeat=ns.repeat,
        warmup=ns.warmup,
        aggregators=parse_aggregators(ns.aggregators),
        dir=ns.dir,
        keep=ns.keep,
        fsync=ns.fsync,
        drop_caches=ns.drop_caches,
        methods=methods,
        json=ns.json,
        seed=ns.seed,
        timeout=timeout,
    )


def add_dir_json(p: argparse.ArgumentParser) -> None:
    """``--dir`` (where the files go) and ``--json``, as one-process benchmarks take them."""
    p.add_argument(
        "--dir", default=None, help="directory for the files (default: a new one under $TMPDIR)"
    )
    p.add_argument(
        "--json", action="store_true", help="print the results as JSON on stdout (table on stderr)"
    )


def emit(as_json: bool, text: str, doc: dict) -> None:
    """Print the table (stdout, or stderr with --json) and the JSON document (stdout with --json)."""
    if as_json:
        print(text, file=sys.stderr)
        print(json.dumps(finite_json(doc), indent=1, default=str, allow_nan=False))
    else:
        print(text)
    sys.stdout.flush()


def options_doc(o: CommonOptions, mode: str, argv: list[str]) -> dict:
    return {
        "size": o.size,
        "ranks": o.ranks,
        "repeat": o.repeat,
        "warmup": o.warmup,
        "aggregators": o.aggregators,
        "fsync": o.fsync,
        "drop_caches": o.drop_caches,
        "methods": o.methods,
        "machine": machine(),
        "command": f"lamina bench {mode} " + " ".join(argv),
    }
