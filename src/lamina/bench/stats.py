"""``lamina bench stats``: the statistics and checksum pass against a memcpy, one process.

Every block lamina writes carries its min, max, sum, count (NaN-aware) and
CRC-32C, taken in one pass (:func:`lamina.stats.compute`).  The issue that
asked for it set the bar: at least memcpy speed on one core, for float,
integer and complex data.  For each dtype of ``--dtypes`` this program makes
one array of ``--mib`` MiB (floats and complex numbers normal, integers
uniform within +-10^6 (counts, indices and labels; 64-bit values too large
for an exact 64-bit sum are summed in float64 and cost more), bool even) and
times, in rounds of rotating order after one untimed run of each:

``memcpy``   ``numpy.copyto`` of the array into one of the same size touched before
``compute``  ``lamina.stats.compute`` of the array (statistics and checksums)

Times are the best of ``--repeat`` rounds; the ratio compute / memcpy is the
median over rounds of the ratio within a round (best case, min over min, in
parentheses).  The target is a ratio of at most 1.0.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .. import stats
from ..text import table
from . import common

DEFAULT_DTYPES = "f8,f4,c16,i8,i4,i2,u1,?"
#: integers drawn within +- this
INT_RANGE = 10**6


def _data(dt: np.dtype, nbytes: int, rng: np.random.Generator) -> np.ndarray:
    n = max(1, nbytes // dt.itemsize)
    if dt.kind == "b":
        return rng.random(n) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -INT_RANGE), min(info.max, INT_RANGE), n, dtype=dt)
    if dt.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    return rng.standard_normal(n).astype(dt)


def _timed(a: np.ndarray, repeat: int) -> dict[str, list[float]]:
    """Times of a memcpy of *a* and of its statistics, in rounds (:func:`common.rounds`)."""
    dst = np.empty_like(a)
    dst[...] = a  # touched before: the copy writes to pages that exist
    return common.rounds(
        {"memcpy": lambda: np.copyto(dst, a), "compute": lambda: stats.compute(a)}, repeat
    )


def run(dtypes: list[np.dtype], nbytes: int, repeat: int) -> list[dict]:
    """One row per dtype: the times of both and the ratio."""
    rng = np.random.default_rng(12345)
    rows = []
    for dt in dtypes:
        a = _data(dt, nbytes, rng)
        times = _timed(a, repeat)
        copy, comp = common.summarize(times["memcpy"]), common.summarize(times["compute"])
        # compute / memcpy: a speed-up of memcpy over compute
        med, best = common.speedup(comp, copy)
        rows.append(
            {
                "dtype": dt.name,
                "bytes": int(a.nbytes),
                "memcpy": copy,
                "compute": comp,
                "ratio": med,
                "ratio_best": best,
            }
        )
    return rows


def report(rows: list[dict], nbytes: int, repeat: int) -> str:
    out = [
        f"lamina bench stats: statistics and checksums (lamina.stats.compute) of {nbytes >> 20} "
        f"MiB against numpy.copyto of it, one process, best of {repeat} rounds; ratio = compute "
        "/ memcpy, paired median (best case min/min in parentheses)",
        "",
    ]
    cells = []
    for r in rows:
        cells.append(
            [
                r["dtype"],
                f"{r['memcpy']['min'] * 1e3:.2f}",
                f"{r['compute']['min'] * 1e3:.2f}",
                f"{common.gibps(r['bytes'], r['compute']['min']):.2f}",
                common.ratio_cell((r["ratio"], r["ratio_best"])),
                common.verdict(r["ratio"], 1.0, higher_is_better=False, best=r["ratio_best"]),
            ]
        )
    out.append(
        table(
            ["dtype", "memcpy ms", "compute ms", "compute GiB/s", "compute / memcpy", "<= 1.0x"],
            cells,
        )
    )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="lamina bench stats", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument("--mib", type=int, default=64, help="MiB of each array (default 64)")
    p.add_argument(
        "--dtypes", default=DEFAULT_DTYPES, help=f"numpy dtypes (default {DEFAULT_DTYPES})"
    )
    p.add_argument("--repeat", type=int, default=5, help="timed rounds (default 5)")
    p.add_argument("--json", action="store_true", help="the results as JSON on stdout")
    ns = p.parse_args(argv)
    if ns.mib < 1 or ns.repeat < 1:
        p.error("--mib and --repeat must be at least 1")
    try:  # the array and the copy a memcpy makes of it
        common.check_memory(2 * (ns.mib << 20), f"--mib {ns.mib}")
    except ValueError as e:
        p.error(str(e))
    try:
        dtypes = common.parse_list(ns.dtypes, "--dtypes", np.dtype, "dtypes")
    except ValueError as e:
        p.error(str(e))
    bad = [dt.str for dt in dtypes if dt.kind not in "biufc"]
    if bad:
        p.error(f"--dtypes: numeric dtypes only, got {', '.join(bad) or 'none'}")
    nbytes = ns.mib << 20
    rows = run(dtypes, nbytes, ns.repeat)
    doc = {
        "command": "lamina bench stats " + " ".join(argv),
        "machine": common.machine(),
        "rows": rows,
    }
    common.emit(ns.json, report(rows, nbytes, ns.repeat), doc)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
