"""``lamina bench multires``: the multiresolution layout's pipeline, balance, compression and reads.

In one run, on the same data:

``write``     an MPI job of ``--ranks`` ranks writes each field once per
              configuration: distribution balanced or greedy, aggregation
              balanced, counts (equal patches per aggregator) or local
              (file per process), aggregators F = N, N/2, ..., down to N/8.
              Each phase of ``end_step`` is timed (distribution, assembly,
              transform + compression, aggregation, exchange, put) and the
              load reported: patches per rank (max - min), bytes per
              aggregator (max / mean).
``compress``  compression ratio, PSNR and largest error per tolerance:
              lamina's patches (every level readable) next to zfp on the
              whole array (one level) and lossless zstd; and the transform
              + compression speed per core.
``read``      a region at every level: bytes and time, next to reading the
              same region at full resolution from a plain dataset.
``simulate``  distribution and aggregation alone for 10^4 and 10^5 virtual
              ranks (:func:`lamina.multires.balance.simulate`).

Fields: ``cth`` (the CTH shock pressure of the shared data, tiled to the
size asked for; skipped when absent), ``uneven`` (a synthetic field whose
compressibility varies about 100x across the domain: smooth on one side,
noisy on the other).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from ..text import fmt_bytes, table
from . import common

CTH = "cth_shock_128x64x64.npz"
PATCH = (32, 32, 32)


def find_cth() -> str | None:
    for base in (
        os.environ.get("LAMINA_TEST_DATA", ""),
        os.path.join(os.getcwd(), "..", "shared", "data"),
        os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "data"),
    ):
        p = os.path.join(base, CTH)
        if base and os.path.exists(p):
            return os.path.abspath(p)
    return None


def field(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The benchmark's fields, float32, deterministic (every rank builds the same)."""
    if name == "cth":
        path = find_cth()
        if path is None:
            raise FileNotFoundError(f"{CTH} not found (set LAMINA_TEST_DATA)")
        p = np.load(path)["pressure"].astype(np.float32)
        reps = [-(-n // m) for n, m in zip(shape, p.shape, strict=True)]
        return np.ascontiguousarray(np.tile(p, reps)[tuple(slice(0, n) for n in shape)])
    rng = np.random.default_rng(3)
    axes = np.meshgrid(*(np.linspace(0, 1, n, dtype=np.float32) for n in shape), indexing="ij")
    smooth = np.sin(6 * axes[0]) * np.cos(4 * axes[1]) + axes[-1]
    # noise grows 100x from one side of the domain to the other
    noise = rng.standard_normal(shape).astype(np.float32) * (1e-3 * 100 ** axes[0])
    return (smooth + noise).astype(np.float32)


def _tolerance(x: np.ndarray, rel: float) -> float:
    return float(np.ptp(x)) * rel


# --------------------------------------------------------------------------
# worker: the parallel write


def worker(args) -> None:
    from mpi4py import MPI

    import lamina

    comm = MPI.COMM_WORLD
    r, n = comm.rank, comm.size
    shape = tuple(args.shape)
    results = []
    aggs = sorted({max(1, n // d) for d in (1, 2, 4, 8)}, reverse=True)
    configs = [("balanced", "balanced"), ("greedy", "balanced"), ("balanced", "counts")]
    for name in args.fields:
        x = field(name, shape)
        tol = _tolerance(x, args.rel)
        # uneven slabs: rank r holds rows cut at jittered places (patches are shared)
        rng = np.random.default_rng(11)
        cuts = np.sort(rng.integers(1, shape[0], n - 1)) if n > 1 else np.zeros(0, dtype=int)
        cuts = np.concatenate([[0], cuts, [shape[0]]]).astype(int)
        lo, hi = int(cuts[r]), int(cuts[r + 1])
        runs = [(d, a, f) for d, a in configs for f in aggs] + [("balanced", "local", n)]
        for dist, agg, naggs in runs:
            best = None
            for _ in range(args.repeat):
                path = os.path.join(args.dir, "mr.lam")
                comm.Barrier()
                with lamina.open(path, "w", comm=comm, aggregators=naggs, durable=False) as f:
                    layout = lamina.Multires(
                        patch=PATCH, tolerance=tol, distribution=dist, aggregation=agg
                    )
                    ds = f.create_dataset("T", shape, np.float32, layout=layout)
                    eng = f.engine.stack()[-1]
                    f.begin_step()
                    if hi > lo:
                        ds.write(x[lo:hi], offset=(lo, 0, 0), copy=False)
                    comm.Barrier()
                    t0 = time.perf_counter()
                    f.end_step()
                    total = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                    rep = eng.layout_reports["T"]
                    phases = {
                        k: comm.allreduce(v, op=MPI.MAX) for k, v in sorted(rep.seconds.items())
                    }
                if r == 0:
                    shutil.rmtree(path, ignore_errors=True)
                row = {
                    "field": name,
                    "distribution": dist,
                    "aggregation": agg,
                    "aggregators": naggs,
                    "seconds": total,
                    "phases": phases,
                    "patches_spread": int(rep.patches.max() - rep.patches.min()),
                    "agg_balance": float(rep.agg_bytes.max() / rep.agg_bytes.mean())
                    if rep.agg_bytes is not None and rep.agg_bytes.mean() > 0
                    else 1.0,
                    "stored": rep.stored_bytes,
                    "raw": x.nbytes,
                    "moved_cells": rep.moved_cells,
                }
                if best is None or row["seconds"] < best["seconds"]:
                    best = row
            if r == 0:
                print(f"{common.PROGRESS}step {name} {dist}/{agg} F={naggs}", flush=True)
                results.append(best)
    if r == 0:
        with open(args.out, "w") as fh:
            json.dump({"ranks": n, "rows": results}, fh)


# --------------------------------------------------------------------------
# serial parts


def _psnr(x: np.ndarray, y: np.ndarray) -> float:
    mse = float(np.mean((x.astype(np.float64) - y) ** 2))
    rng = float(np.ptp(x))
    return float("inf") if mse == 0 else 10 * np.log10(rng * rng / mse)


def compression(x: np.ndarray, rels: list[float]) -> list[dict]:
    import numcodecs
    import zfpy

    from ..multires import compress

    rows = []
    zstd = len(numcodecs.Zstd(level=3).encode(x))
    for rel in rels:
        tol = _tolerance(x, rel)
        t0 = time.perf_counter()
        enc = compress.encode_array(x, PATCH, tol)
        t_enc = time.perf_counter() - t0
        back = compress.decode_array(enc, 0)
        blob = zfpy.compress_numpy(x, tolerance=tol)
        zback = zfpy.decompress_numpy(blob)
        rows.append(
            {
                "rel": rel,
                "tolerance": tol,
                "lamina_ratio": x.nbytes / enc.nbytes(0),
                "lamina_psnr": _psnr(x, back),
                "lamina_maxerr": float(np.abs(back.astype(np.float64) - x).max()),
                "lamina_mibps": x.nbytes / t_enc / 2**20,
                "zfp_ratio": x.nbytes / len(blob),
                "zfp_psnr": _psnr(x, zback),
                "zfp_maxerr": float(np.abs(zback.astype(np.float64) - x).max()),
                "zstd_ratio": x.nbytes / zstd,
            }
        )
    return rows


def reads(x: np.ndarray, rel: float, directory: str, repeat: int) -> list[dict]:
    import lamina
    from lamina.geometry import Box

    path = os.path.join(directory, "read.lam")
    tol = _tolerance(x, rel)
    with lamina.open(path, "w", durable=False) as f:
        f.create_dataset("T", x.shape, x.dtype, layout=lamina.Multires(patch=PATCH, tolerance=tol))
        f.create_dataset("P", x.shape, x.dtype)
        f["T"][...] = x
        f["P"][...] = x
    region = Box(tuple(n // 4 for n in x.shape), tuple(n // 4 + max(1, n // 2) for n in x.shape))
    rows = []
    with lamina.open(path) as f:
        t, p = f["T"], f["P"]
        plain = min(_timed(lambda: p.read(region)) for _ in range(repeat))
        for k in range(len(t.levels)):
            from lamina.layouts.read import scale_box

            box = scale_box(region, k)
            sec = min(_timed(lambda box=box, k=k: t.read(box, level=k)) for _ in range(repeat))
            rows.append(
                {
                    "level": k,
                    "shape": list(box.shape),
                    "bytes": t.last_read_bytes,
                    "seconds": sec,
                    "plain_bytes": region.size * x.dtype.itemsize,
                    "plain_seconds": plain,
                }
            )
    shutil.rmtree(path, ignore_errors=True)
    return rows


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def simulations(quick: bool) -> list[dict]:
    from ..multires import balance

    rows = []
    for n in (10_000,) if quick else (10_000, 100_000):
        shape = (2048, 2048, 1024) if n == 10_000 else (4096, 4096, 2048)
        got = balance.simulate(n, shape, (32, 32, 32), max(1, n // 8))
        rows.append({"ranks": n, "shape": list(shape), "aggregators": max(1, n // 8), **got})
    return rows


# --------------------------------------------------------------------------
# parent


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lamina bench multires", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4, help="writer ranks of the MPI job (default 4)")
    p.add_argument(
        "--shape",
        type=int,
        nargs=3,
        default=[256, 128, 128],
        help="field shape (default 256 128 128)",
    )
    p.add_argument("--fields", nargs="+", default=["cth", "uneven"], choices=["cth", "uneven"])
    p.add_argument("--rel", type=float, default=1e-3, help="tolerance relative to the range (1e-3)")
    p.add_argument("--repeat", type=int, default=3, help="runs per configuration; the best counts")
    p.add_argument("--quick", action="store_true", help="small shape, one repeat, 10^4 ranks only")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.quick:
        args.shape, args.repeat = [64, 64, 64], 1
    if "cth" in args.fields and find_cth() is None:
        print(f"lamina bench multires: {CTH} not found; skipping the cth field", file=sys.stderr)
        args.fields = [x for x in args.fields if x != "cth"]
    from .launch import run_json_job

    directory = tempfile.mkdtemp(prefix="lamina-bench-multires-")
    try:
        shape = tuple(args.shape)

        def command(out: str) -> list[str]:
            from ..launch import find_mpiexec

            return [
                find_mpiexec(),
                "-n",
                str(args.ranks),
                sys.executable,
                "-m",
                "mpi4py",
                "-m",
                "lamina.bench",
                "multires",
                "--worker",
                "--dir",
                directory,
                "--out",
                out,
                "--shape",
                *map(str, shape),
                "--rel",
                str(args.rel),
                "--repeat",
                str(args.repeat),
                "--fields",
                *args.fields,
            ]

        write = run_json_job(
            command,
            f"multires write job with {args.ranks} ranks",
            1800,
            lambda text: print(f"  {text}", file=sys.stderr),
            lambda line: print(line.rstrip("\n"), file=sys.stderr),
        )
        doc: dict = {"machine": common.machine(), "argv": argv, "write": write}
        doc["compress"] = {
            name: compression(field(name, shape), [1e-2, 1e-3, 1e-4]) for name in args.fields
        }
        doc["read"] = {
            name: reads(field(name, shape), args.rel, directory, args.repeat)
            for name in args.fields
        }
        doc["simulate"] = simulations(args.quick)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    common.emit(args.json, report(doc), doc)
    return 0


def report(doc: dict) -> str:
    out = []
    w = doc["write"]
    out.append(f"write, {w['ranks']} ranks (best of the runs; phases are the slowest rank's)")
    rows = []
    base: dict = {}
    for r in w["rows"]:
        if (r["distribution"], r["aggregation"]) == ("balanced", "counts"):
            base[(r["field"], r["aggregators"])] = r["seconds"]
    for r in w["rows"]:
        ph = r["phases"]
        nb = base.get((r["field"], r["aggregators"]))
        rows.append(
            [
                r["field"],
                f"{r['distribution']}/{r['aggregation']}",
                str(r["aggregators"]),
                f"{ph.get('distribution', 0) * 1e3:.1f}",
                f"{(ph.get('assembly', 0) + ph.get('transform', 0)) * 1e3:.1f}",
                f"{(ph.get('aggregation', 0) + ph.get('exchange', 0)) * 1e3:.1f}",
                f"{ph.get('put', 0) * 1e3:.1f}",
                f"{r['seconds'] * 1e3:.1f}",
                f"{r['raw'] / r['seconds'] / 2**20:.0f}",
                str(r["patches_spread"]),
                f"{r['agg_balance']:.3f}",
                f"{nb / r['seconds']:.2f}" if nb and r["aggregation"] == "balanced" else "",
            ]
        )
    out.append(
        table(
            [
                "field",
                "distribution/aggregation",
                "F",
                "distr ms",
                "transform ms",
                "aggr ms",
                "put ms",
                "end_step ms",
                "MiB/s",
                "patches max-min",
                "agg max/mean",
                "vs counts",
            ],
            rows,
            align="llrrrrrrrrrr",
        )
    )
    out.append("\ncompression (lamina: every level readable; zfp: whole array, one level)")
    rows = []
    for name, rs in doc["compress"].items():
        for r in rs:
            rows.append(
                [
                    name,
                    f"{r['rel']:g}",
                    f"{r['lamina_ratio']:.1f}",
                    f"{r['lamina_psnr']:.1f}",
                    f"{r['lamina_maxerr'] / r['tolerance']:.2f}",
                    f"{r['zfp_ratio']:.1f}",
                    f"{r['zfp_psnr']:.1f}",
                    f"{r['zstd_ratio']:.2f}",
                    f"{r['lamina_mibps']:.0f}",
                ]
            )
    out.append(
        table(
            [
                "field",
                "tol/range",
                "lamina ratio",
                "PSNR",
                "maxerr/tol",
                "zfp ratio",
                "zfp PSNR",
                "zstd ratio",
                "encode MiB/s",
            ],
            rows,
            align="lrrrrrrrr",
        )
    )
    out.append("\nread of the central region (half the extent per axis) at every level")
    rows = []
    for name, rs in doc["read"].items():
        for r in rs:
            rows.append(
                [
                    name,
                    str(r["level"]),
                    "x".join(map(str, r["shape"])),
                    fmt_bytes(r["bytes"]),
                    f"{r['seconds'] * 1e3:.2f}",
                    f"{r['plain_bytes'] / max(r['bytes'], 1):.1f}",
                    f"{r['plain_seconds'] / r['seconds']:.2f}",
                ]
            )
    out.append(
        table(
            ["field", "level", "region", "bytes", "ms", "plain/lamina bytes", "plain/lamina time"],
            rows,
            align="lrlrrrr",
        )
    )
    out.append("\nsimulated distribution and aggregation (F = N/8, 32^3 patches)")
    rows = []
    for r in doc["simulate"]:
        for scheme, v in r.items():
            if not isinstance(v, dict):
                continue
            rows.append([str(r["ranks"]), scheme, ", ".join(f"{k} {v[k]:.4g}" for k in sorted(v))])
    out.append(table(["ranks", "scheme", "result"], rows, align="lll"))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
