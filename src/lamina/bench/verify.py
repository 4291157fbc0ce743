"""``lamina bench verify``: ``lamina verify`` against reading the same bytes, one process.

``lamina verify FILE`` reads every stored block once and checks it against
its checksums.  What no checker can beat is reading those bytes (a
``cat`` of the file's subfiles), and then taking their CRC-32C; the peer is
HDF5's ``fletcher32`` filter, a checksum per chunk that h5py checks as it
reads.  This program writes, once, one lamina file (``--steps`` steps of
``--mib`` MiB of float64 each, one rank, blocks of ``--block-mib`` MiB) and
an HDF5 file of the same values (a step axis first, one chunk per block,
``fletcher32``), then times, in rounds of rotating order after one untimed
run of each (page cache: both files were just written and nobody drops it;
every method opens its file inside its time):

``read``          every file of the lamina file's directory read whole,
                  64 MiB at a time into one buffer (a ``cat``)
``read+crc``      the same, and the CRC-32C of every piece read
                  (:func:`lamina.stats.crc`, the checksum lamina keeps)
``h5py``          every step of the HDF5 dataset read (each chunk's
                  fletcher32 checked)
``verify``        ``lamina verify``: :func:`lamina.check.verify` of the
                  file opened for reading
``verify-stats``  ``lamina verify --stats``: also each block's statistics
                  taken again from its values and compared

Ratios are each method's time over ``read``'s, and verify's over h5py's:
paired medians over rounds (best case, min over min, in parentheses).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

from .. import stats
from ..text import fmt_bytes, table
from . import common

METHODS = ("read", "read+crc", "h5py", "verify", "verify-stats")
#: bytes read at a time by read and read+crc (verify reads at most this many in one request)
PIECE = 64 << 20


def _write(lam: str, h5: str, steps: int, n: int, block: int) -> None:
    """The same values, step by step, as a lamina file and as an HDF5 file."""
    import h5py

    import lamina

    rng = np.random.default_rng(2024)
    with (
        lamina.open(lam, "w", durable=False) as f,
        h5py.File(h5, "w") as h,
    ):
        ds = f.create_dataset("u", (n,), "f8")
        hd = h.create_dataset("u", (steps, n), "f8", chunks=(1, block), fletcher32=True)
        for s in range(steps):
            values = rng.standard_normal(n)
            with f.step():
                for start in range(0, n, block):
                    ds.write(values[start : start + block], offset=(start,))
            hd[s] = values


def _read(lam: str, buf: np.ndarray, crc: bool) -> int:
    """Every file of *lam*'s directory read whole into *buf*, piece by piece; the CRCs of
    the pieces folded into one number when *crc* (so that they are taken)."""
    folded = 0
    for name in sorted(os.listdir(lam)):
        full = os.path.join(lam, name)
        if not os.path.isfile(full):
            continue
        fd = os.open(full, os.O_RDONLY)
        try:
            while (got := os.readv(fd, [buf])) > 0:
                if crc:
                    folded ^= stats.crc(buf[:got])
        finally:
            os.close(fd)
    return folded


def _h5py_read(h5: str, out: np.ndarray) -> float:
    import h5py

    with h5py.File(h5, "r") as h:
        d = h["u"]
        for s in range(d.shape[0]):
            d.read_direct(out, np.s_[s])
    return float(out[-1])


def _verify(lam: str, with_stats: bool) -> dict:
    import lamina
    from lamina.check import verify

    with lamina.open(lam, "r") as f:
        return verify(f, stats=with_stats)


def run(steps: int, nbytes: int, block_bytes: int, repeat: int, where: str) -> dict:
    """The times of every method (``common.summarize`` each) and the ratios."""
    n, block = nbytes // 8, block_bytes // 8
    os.makedirs(where, exist_ok=True)  # (--dir made where missing, as the other benchmarks do)
    d = tempfile.mkdtemp(prefix="lamina-bench-verify-", dir=where)
    try:
        lam, h5 = os.path.join(d, "v.lam"), os.path.join(d, "v.h5")
        _write(lam, h5, steps, n, block)
        on_disk = sum(
            os.path.getsize(os.path.join(lam, x))
            for x in os.listdir(lam)
            if os.path.isfile(os.path.join(lam, x))
        )
        buf = np.empty(PIECE, np.uint8)
        out = np.empty(n, np.float64)
        fns = {
            "read": lambda: _read(lam, buf, False),
            "read+crc": lambda: _read(lam, buf, True),
            "h5py": lambda: _h5py_read(h5, out),
            "verify": lambda: _verify(lam, False),
            "verify-stats": lambda: _verify(lam, True),
        }

        def check(name: str, got) -> None:
            if name.startswith("verify") and (
                got["problems"] or got["blocks"] != steps * -(-n // block)
            ):
                raise AssertionError(f"lamina verify of an intact file said: {got}")

        times = common.rounds(fns, repeat, check)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    rows = {m: common.summarize(times[m]) for m in METHODS}
    ratios = {m: common.speedup(rows[m], rows["read"]) for m in METHODS}
    return {
        "steps": steps,
        "bytes": steps * n * 8,
        "on_disk": on_disk,
        "block_bytes": block * 8,
        "times": rows,
        "over_read": ratios,
        "verify_over_h5py": common.speedup(rows["verify"], rows["h5py"]),
        "verify_stats_over_h5py": common.speedup(rows["verify-stats"], rows["h5py"]),
    }


def report(o: dict, repeat: int) -> str:
    out = [
        f"lamina bench verify: {fmt_bytes(o['bytes'])} of float64 in {o['steps']} steps, blocks "
        f"of {fmt_bytes(o['block_bytes'])} ({fmt_bytes(o['on_disk'])} in the lamina file), one "
        f"process, page cache, {repeat} rounds; ratio = time / read's (or h5py's), paired "
        "median (best case min/min in parentheses)",
        "",
    ]
    cells = []
    for m in METHODS:
        t = o["times"][m]
        cells.append(
            [
                m,
                f"{t['min'] * 1e3:.1f}",
                f"{t['median'] * 1e3:.1f}",
                f"{common.gibps(o['bytes'], t['min']):.2f}",
                common.ratio_cell(o["over_read"][m]),
                common.ratio_cell(o["verify_over_h5py"])
                if m == "verify"
                else common.ratio_cell(o["verify_stats_over_h5py"])
                if m == "verify-stats"
                else "",
            ]
        )
    out.append(table(["method", "min ms", "median ms", "GiB/s (min)", "/ read", "/ h5py"], cells))
    return "\n".join(out)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="lamina bench verify", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument("--mib", type=int, default=256, help="MiB per step (default 256)")
    p.add_argument("--steps", type=int, default=2, help="steps (default 2)")
    p.add_argument("--block-mib", type=int, default=4, help="MiB per block (default 4)")
    p.add_argument("--repeat", type=int, default=5, help="timed rounds (default 5)")
    p.add_argument("--dir", default=None, help="directory for the files (default: $TMPDIR)")
    p.add_argument("--json", action="store_true", help="the results as JSON on stdout")
    ns = p.parse_args(argv)
    if min(ns.mib, ns.steps, ns.block_mib, ns.repeat) < 1:
        p.error("--mib, --steps, --block-mib and --repeat must be at least 1")
    if ns.block_mib > ns.mib:
        p.error(f"--block-mib {ns.block_mib} is more than a step (--mib {ns.mib})")
    try:  # a step's values as written and as h5py reads them, and the read buffer
        common.check_memory(2 * (ns.mib << 20) + PIECE, f"--mib {ns.mib}")
        # the lamina file and the HDF5 file
        common.check_disk(
            2 * ns.steps * (ns.mib << 20), ns.dir, f"--steps {ns.steps} of --mib {ns.mib}"
        )
    except ValueError as e:
        p.error(str(e))
    o = run(ns.steps, ns.mib << 20, ns.block_mib << 20, ns.repeat, ns.dir or tempfile.gettempdir())
    doc = {
        "command": "lamina bench verify " + " ".join(argv),
        "machine": common.machine(),
        **o,
    }
    common.emit(ns.json, report(o, ns.repeat), doc)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
