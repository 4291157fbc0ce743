"""Text for people and JSON for programs: sizes, rates, durations, times, tables, values.

The one place where lamina's commands, benchmarks and reports format what
they print, so that a size reads the same in ``lamina ls``, in a benchmark
table and in a query summary.  Pure: numpy only, no lamina imports.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

# ----------------------------------------------------------------- sizes and rates

_BINARY = (("PiB", 1 << 50), ("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB))


def fmt_bytes(n: float) -> str:
    """A byte count in binary units: ``512`` -> ``'512 B'``, ``1536`` -> ``'1.5 KiB'``, ``2**26`` -> ``'64 MiB'``."""
    n = float(n)
    for unit, k in _BINARY:
        if abs(n) >= k:
            v = f"{n / k:.1f}"
            return f"{v[:-2] if v.endswith('.0') else v} {unit}"
    return f"{int(n)} B"


def fmt_rate(bytes_per_second: float) -> str:
    """A bandwidth in decimal gigabytes per second (as storage vendors quote them): ``'1.23 GB/s'``."""
    return f"{bytes_per_second / 1e9:.3g} GB/s"


#: units of :func:`parse_size`: binary multiples, and decimal ones spelled kB, MB, GB
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "kb": 1000,
    "m": MiB,
    "mib": MiB,
    "mb": 1000**2,
    "g": GiB,
    "gib": GiB,
    "gb": 1000**3,
    "t": TiB,
    "tib": TiB,
    "tb": 1000**4,
}
#: units of :func:`parse_rate`: decimal multiples (k, M, G, T, kB, ...) and binary ones (KiB, ...)
_RATE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "t": 1e12,
    "tb": 1e12,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
}
_NUMBER = r"([0-9]+\.?[0-9]*(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?)"


def parse_size(text: str) -> int:
    """``'64MiB'``, ``'1GiB'``, ``'512k'`` (k, M, G alone are binary), ``'1048576'`` -> bytes; ValueError otherwise."""
    m = re.fullmatch(rf"\s*{_NUMBER}\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 64MiB, 1GiB)")
    v = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if not math.isfinite(v) or v >= 2**63:
        raise ValueError(f"size {text!r} is too large")
    return int(v)


def parse_rate(text: str) -> float:
    """``'500MB/s'``, ``'0.5GB/s'``, ``'2GiB/s'``, ``'1e9'`` -> bytes per second (> 0); ValueError otherwise.

    Decimal units (kB, MB, GB, TB, or k, M, G, T) count powers of 1000,
    binary ones (KiB, MiB, GiB, TiB) powers of 1024; ``/s`` is optional; a
    plain number is bytes per second.
    """
    m = re.fullmatch(rf"\s*{_NUMBER}\s*([a-zA-Z]*)\s*(/\s*s)?\s*", str(text))
    if not m or m.group(2).lower() not in _RATE_UNITS:
        raise ValueError(f"not a bandwidth: {text!r} (use e.g. 500MB/s, 0.5GB/s, 2GiB/s)")
    v = float(m.group(1)) * _RATE_UNITS[m.group(2).lower()]
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"a bandwidth must be > 0, got {text!r}")
    return v


# ----------------------------------------------------------------- times


def as_seconds(value: Any) -> float:
    """``float(value)`` of a number of seconds, an int too large for a float as infinity
    (longer than any wait lasts) instead of an OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def parse_seconds(text: str, zero: bool = False, finite: bool = False) -> float:
    """*text* as a number of seconds: ``'2.5'``, ``'1e-3'``, ``'inf'`` -> float, > 0 (>= 0
    with *zero*; below infinity with *finite*); otherwise ValueError ``must be a number of
    seconds > 0`` (``>= 0``; ``a finite number`` with *finite*), to which the caller adds what it read and the value.  The one
    reading of a timeout in an environment variable (:func:`lamina.comm.env_seconds`) and
    of one ``lamina run`` passes to a task (``lamina.workflow.file``)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not ((seconds >= 0 if zero else seconds > 0) and (seconds < math.inf or not finite)):
        kind = "a finite number" if finite else "a number"
        raise ValueError(f"must be {kind} of seconds {'>= 0' if zero else '> 0'}")
    return seconds


def positive_seconds(text: str) -> float:
    """A ``--timeout`` option's type: a number of seconds, more than 0 (``inf``: no limit);
    ``argparse.ArgumentTypeError`` otherwise, NaN included (argparse reports the error).
    The commands that launch MPI jobs (``lamina bench``, ``lamina demo``) all read it so."""
    import argparse

    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not seconds > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return seconds


def fmt_duration(seconds: float) -> str:
    """A duration: ``'0'``, ``'12.5 us'``, ``'3.1 ms'``, ``'2.40 s'``."""
    s = float(seconds)
    if s == 0:
        return "0"
    if abs(s) < 1e-3:
        return f"{s * 1e6:.1f} us"
    if abs(s) < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_timestamp(t: float) -> str:
    """Seconds since the epoch as local time, ``'2026-11-24 10:31:07'`` (the number itself if out of range)."""
    try:
        return datetime.datetime.fromtimestamp(t).isoformat(sep=" ", timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return str(t)


# ----------------------------------------------------------------- words and numbers


def plural(n: int, word: str) -> str:
    """``plural(1, 'step')`` -> ``'1 step'``, ``plural(3, 'step')`` -> ``'3 steps'``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def fmt_steps_written(written: Sequence[int], nsteps: int, computed: bool) -> str:
    """Which steps a dataset holds values at: ``'steps 0-2 (3 of 4)'``, or why none."""
    if written:
        return f"steps {fmt_ranges(written)} ({len(written)} of {nsteps})"
    return "computed when read" if computed else "never written"


def fmt_stored(stored: int, raw: int) -> str:
    """Bytes stored, and the raw size beside them when compression changed it."""
    return fmt_bytes(stored) + (f" (raw {fmt_bytes(raw)})" if stored != raw else "")


def fmt_ranges(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``'0-2,5,7-8'``."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)


def fmt_steps(indexes: Sequence[int]) -> str:
    """``[4]`` -> ``'step 4'``, ``[4, 5, 6, 7]`` -> ``'steps 4-7'``, ``[4, 6]`` -> ``'steps 4,6'``
    (*indexes* in increasing order)."""
    return f"step{'s' if len(indexes) > 1 else ''} {fmt_ranges(indexes)}"


def fmt_name(name: str) -> str:
    """*name* (a group's, a dataset's, an attribute's, a path) as text output shows it, on
    one line and read back unambiguously: as it is, but for each character Python's repr
    escapes (``str.isprintable``: a newline, a tab, other control and format characters, a
    line separator, a lone surrogate), written as repr writes it (``\\n``, ``\\x1b``,
    ``\\u2028``, ``\\udc80``), and backslashes doubled (``ls --escape`` of coreutils)."""
    if name.isprintable() and "\\" not in name:
        return name
    return "".join(_escaped(c) for c in name)


def _escaped(c: str) -> str:
    if c == "\\":
        return "\\\\"
    return c if c.isprintable() else repr(c)[1:-1]


def fmt_box(box) -> str:
    """A box as numpy-style slices: ``'[0:4, 2:8]'``."""
    return "[" + ", ".join(f"{a}:{b}" for a, b in zip(box.start, box.stop, strict=True)) + "]"


def fmt_codecs(codecs: Iterable[dict]) -> str:
    """A codec pipeline: ``'zstd(level=3)+...'``, or ``'none'``; its names and values as
    :func:`fmt_name` shows names (they come from the file: a newline or a terminal escape
    in one would make or colour lines of the output)."""
    out = []
    for c in codecs:
        params = ",".join(
            f"{fmt_name(str(k))}={fmt_name(str(v))}" for k, v in sorted(c.items()) if k != "id"
        )
        out.append(fmt_name(str(c.get("id", "?"))) + (f"({params})" if params else ""))
    return "+".join(out) if out else "none"


def fmt_num(v) -> str:
    """A statistic or value: ints exactly, floats and complex numbers to 6 significant digits."""
    if isinstance(v, bool | np.bool_):
        return str(bool(v))
    if isinstance(v, int | np.integer):
        return str(int(v))
    if isinstance(v, complex | np.complexfloating):
        return format(complex(v), ".6g")
    return format(float(v), ".6g")


def fmt_value(v) -> str:
    """An attribute or fill value on one line (long arrays elided, with dtype and shape)."""
    if isinstance(v, str | list):
        return repr(v)
    a = np.asarray(v)
    if a.ndim == 0:
        return str(a[()])
    with np.printoptions(threshold=16, edgeitems=3, linewidth=sys.maxsize):
        body = " ".join(np.array2string(a, separator=", ").split()).replace("[ ", "[")
    return f"{body} ({a.dtype}, shape {a.shape})"


# ----------------------------------------------------------------- tables


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    align: str | None = None,
    markdown: bool = True,
) -> str:
    """Rows under *headers*, column widths fitted; *align* has one ``'l'`` or ``'r'`` per column.

    Default alignment: the first column left, the others right.  With
    ``markdown`` (the default) the table uses markdown's pipe syntax,
    readable as is, and ends with a blank line (a note right after it stays a
    paragraph); otherwise the columns are separated by two spaces and lines
    carry no trailing blanks.
    """
    align = align or ("l" + "r" * (len(headers) - 1))
    cells = [[str(c) for c in headers], *([str(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> list[str]:
        return [
            c.ljust(w) if a == "l" else c.rjust(w)
            for c, w, a in zip(row, widths, align, strict=True)
        ]

    if not markdown:
        return "\n".join("  ".join(line(r)).rstrip() for r in cells)
    sep = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2))
            for w, a in zip(widths, align, strict=True)
        )
        + "|"
    )
    body = ["| " + " | ".join(line(r)) + " |" for r in cells]
    return "\n".join([body[0], sep, *body[1:]]) + "\n"


# ----------------------------------------------------------------- JSON


def json_value(v):
    """A value (str, list of str, number, numpy scalar or array) -> plain JSON data.

    Complex numbers become ``[re, im]``; NaN and infinities become the
    strings ``'nan'``, ``'inf'``, ``'-inf'`` (JSON has no such numbers).
    """
    if isinstance(v, str) or v is None:
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    if isinstance(v, complex):
        v = np.complex128(v)
    a = np.asarray(v)
    if a.dtype.kind in "fc" and a.dtype.itemsize > (8 if a.dtype.kind == "f" else 16):
        a = a.astype(np.float64 if a.dtype.kind == "f" else np.complex128)  # long double
    if a.dtype.kind == "c":
        a = np.stack([a.real, a.imag], axis=-1)
    out = a.tolist()
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        out = _fix_nonfinite(out)
    return out


def _fix_nonfinite(x):
    if isinstance(x, list):
        return [_fix_nonfinite(y) for y in x]
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    return x


def finite_json(v: Any) -> Any:
    """*v* (JSON's types) with every number that is not finite as None: strict JSON, for
    measurements (a fit of one point has no r^2)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: finite_json(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [finite_json(x) for x in v]
    return v


def print_json(obj, indent: int | None = 2, file=None) -> None:
    """Print *obj* as strict JSON (no NaN); keys starting with ``_`` are left out (private to
    the text form), except the names of attributes (under ``attrs``: ``_FillValue`` is data)."""

    def strip(o, names: bool = False):
        if isinstance(o, dict):
            return {
                k: strip(v, k == "attrs")
                for k, v in o.items()
                if names or not (isinstance(k, str) and k.startswith("_"))
            }
        if isinstance(o, list):
            return [strip(v) for v in o]
        return o

    print(json.dumps(strip(obj), indent=indent, allow_nan=False), file=file or sys.stdout)
