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
              ranks (:func:`lamina.multires.balance.simulate`): patches per
              rank, messages, bytes per aggregator, balanced vs counts; with
              the synthetic sizes of :mod:`lamina.multires.balance` and, when
              the size grid was measured (not with ``--quick``), with the
              measured sizes interpolated to the simulated grid.
``size-grid`` (``--size-grid P1,P2,...``) reaching more ranks than the
              machine has cores: the compressed bytes of every patch of each
              field are measured with the real compressor on a small grid of
              "measured ranks" (``--measure-grid``, default 2 x 2 x 2),
              interpolated trilinearly to a grid of P virtual ranks
              (``--grid-box`` patches each), and an MPI job of P ranks
              (oversubscribed) allocates those bytes and runs the
              aggregation and write alone: allgather of the sizes,
              :func:`lamina.multires.balance.aggregate` (balanced, counts,
              or local: file per process) with F = P down to P/8,
              :func:`lamina.comm.exchange_pairs` to the aggregators, and one
              subfile per aggregator written with ``pwrite`` and ``fsync``
              (so that the page cache does not hide the imbalance).  Each
              run is checked: the subfiles hold every patch once, in place.

``--parts`` picks what runs (default: all but ``size-grid``, which
``--size-grid`` adds).

What is written is read back, untimed: each configuration's file of the
``write`` part once (every rank its rows at full resolution), the
``compress`` part's lamina encoding at full resolution, and every read of
the ``read`` part (the plain dataset's region equal to the data; each
level within the tolerance of the exact approximation of that level,
:func:`lamina.multires.compress.reference_array`).  A failed check is
reported (``DATA CHECK FAILED``) and the exit status is 1.

Fields: ``cth`` (the CTH shock pressure of the shared data, tiled to the
size asked for; skipped when absent), ``uneven`` (a synthetic field whose
noise grows 100x across the domain: smooth on one side, noisy on the
other; at a tolerance of 1e-3 of the range its patches' compressed sizes
differ by about 1.6x, the CTH field's by about 150x), ``flame`` (the
temperature of ``lamina demo``'s premixed flame, its front across the
middle: uniform 300 K and 1800 K on either side, all the structure in a
thin wrinkled sheet) and ``steep`` (a constant under noise whose amplitude
grows 10^6x across the domain: its patches' compressed sizes differ about
50x at 1e-3).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..launch import check_ranks
from ..text import fmt_bytes, plural, table
from . import common

CTH = "cth_shock_128x64x64.npz"
PATCH = (32, 32, 32)
PARTS = ("write", "compress", "read", "simulate", "size-grid")


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


#: the benchmark's fields (module docstring)
FIELDS = ("cth", "uneven", "flame", "steep")


def _job(nranks: int, *args: str) -> list[str]:
    """The command of an MPI job of *nranks* running this benchmark's worker with *args*."""
    from ..launch import find_mpiexec, mpi_command

    return mpi_command(str(find_mpiexec()), nranks, "lamina.bench", ["multires", *args])


def field(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The benchmark's fields, float32, deterministic (every rank builds the same)."""
    if name == "cth":
        path = find_cth()
        if path is None:
            raise FileNotFoundError(f"{CTH} not found (set LAMINA_TEST_DATA)")
        p = np.load(path)["pressure"].astype(np.float32)
        reps = [-(-n // m) for n, m in zip(shape, p.shape, strict=True)]
        return np.ascontiguousarray(np.tile(p, reps)[tuple(slice(0, n) for n in shape)])
    if name == "flame":  # the demo's flame temperature, its front across the middle
        from ..demo import simulation
        from ..geometry import Box

        grid = tuple(reversed(shape))  # the demo's axes are (x, y, z), z the longest
        t = (0.5 - simulation.FRONT_START) * grid[2] * simulation.H / simulation.S_T
        temp = simulation.fields(Box.from_shape(grid), grid, t)["T"]
        return np.ascontiguousarray(temp.transpose().astype(np.float32))
    rng = np.random.default_rng(3)
    axes = np.meshgrid(*(np.linspace(0, 1, n, dtype=np.float32) for n in shape), indexing="ij")
    noise = rng.standard_normal(shape).astype(np.float32)
    if name == "steep":  # a constant under noise growing 10^6x: patches compress 50x apart
        return (1 + noise * 10 ** (-6 + 6 * axes[0])).astype(np.float32)
    smooth = np.sin(6 * axes[0]) * np.cos(4 * axes[1]) + axes[-1]
    # noise grows 100x from one side of the domain to the other
    return (smooth + noise * (1e-3 * 100 ** axes[0])).astype(np.float32)


def _tolerance(x: np.ndarray, rel: float) -> float:
    return float(np.ptp(x)) * rel


def _within(got: np.ndarray, want: np.ndarray, tol: float) -> bool:
    """Whether *got* has *want*'s shape and lies within *tol* of it (and the rounding of
    *got*'s dtype: the layout's values are within *tol* before they are rounded to it)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or not np.isfinite(got).all():
        return False
    if not got.size:
        return True
    top = np.abs(want).max().astype(got.dtype) if got.dtype.kind == "f" else 0
    err = np.abs(got.astype(np.float64) - want).max()
    return bool(err <= tol + float(np.spacing(top)))


#: the tolerances, relative to the range, of the compress part (--rel is not one of them)
COMPRESS_RELS = (1e-2, 1e-3, 1e-4)


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
            checked = True
            for i in range(args.repeat):
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
                if i == 0:  # the file read back once per configuration, untimed
                    checked = _check_write(comm, path, x, (lo, hi), tol)
                comm.Barrier()
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
                    "checked": checked,
                }
                if best is None or row["seconds"] < best["seconds"]:
                    best = row
            if r == 0:
                print(f"{common.PROGRESS}step {name} {dist}/{agg} F={naggs}", flush=True)
                results.append(best)
    if r == 0:
        with open(args.out, "w") as fh:
            json.dump({"ranks": n, "rows": results}, fh)


def _check_write(comm, path: str, x: np.ndarray, rows: tuple[int, int], tol: float) -> bool:
    """Collective: whether the file at *path* holds, at full resolution, this rank's *rows*
    of *x* within *tol* (on every rank)."""
    import lamina
    from lamina.geometry import Box

    lo, hi = rows
    ok = True
    with lamina.open(path, "r", comm=comm) as f:
        if hi > lo:
            got = f["T"].read(Box((lo, 0, 0), (hi, *x.shape[1:])))
            ok = _within(got, x[lo:hi], tol)
    return comm.allreduce(int(not ok)) == 0


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
        ok = _within(back, x, tol)
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
                "ok": ok,
            }
        )
    return rows


def reads(x: np.ndarray, rel: float, directory: str, repeat: int) -> list[dict]:
    import lamina
    from lamina.geometry import Box
    from lamina.layouts.read import scale_box

    from ..multires import compress

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
        plain, got = _best(lambda: p.read(region), repeat)
        plain_ok = bool(np.array_equal(got, x[region.slices]))
        for k in range(len(t.levels)):
            box = scale_box(region, k)
            sec, got = _best(lambda box=box, k=k: t.read(box, level=k), repeat)
            # untimed: the level's exact approximation, which the read is within tol of
            want = compress.reference_array(x, PATCH, k, tol)[box.slices]
            rows.append(
                {
                    "level": k,
                    "shape": list(box.shape),
                    "bytes": t.last_read_bytes,
                    "seconds": sec,
                    "plain_bytes": region.size * x.dtype.itemsize,
                    "plain_seconds": plain,
                    "ok": plain_ok and _within(got, want, tol),
                }
            )
    shutil.rmtree(path, ignore_errors=True)
    return rows


def _best(fn, repeat: int) -> tuple[float, Any]:
    """The shortest time of *repeat* calls of *fn*, and what the last call returned."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def simulations(quick: bool, measured: dict[str, np.ndarray] | None = None) -> list[dict]:
    """:func:`lamina.multires.balance.simulate` for 10^4 (and, unless *quick*, 10^5) ranks.

    Sizes: the synthetic ones, and each of *measured* (a field's measured
    patch sizes, :func:`measure`) resampled to the simulated patch grid
    (:func:`trilinear`).  F = N / 8.
    """
    from ..multires import balance

    rows = []
    for n in (10_000,) if quick else (10_000, 100_000):
        shape = (2048, 2048, 1024) if n == 10_000 else (4096, 4096, 2048)
        naggs = max(1, n // 8)
        grid = balance.Grid.of(shape, PATCH)
        for name, patch_sizes in [("synthetic", None), *(measured or {}).items()]:
            if patch_sizes is None:
                sizes = balance.synthetic_sizes(grid, 0)  # simulate's default
            else:
                sizes = np.maximum(np.rint(trilinear(patch_sizes, grid.counts)), 1).astype(
                    np.int64
                )[tuple(grid.coords.T)]
            got = balance.simulate(n, shape, PATCH, naggs, sizes=sizes)
            for scheme in ("balanced", "counts"):  # the plan, as every rank computes it
                t0 = time.perf_counter()
                balance.aggregate(sizes, naggs, n, scheme=scheme)
                got[f"aggregate/{scheme}"]["plan_seconds"] = time.perf_counter() - t0
            rows.append(
                {"ranks": n, "shape": list(shape), "aggregators": naggs, "sizes": name, **got}
            )
    return rows


# --------------------------------------------------------------------------
# size grid: measured sizes, interpolated to P ranks, aggregated and written


def measure(x: np.ndarray, rel: float, ranks: Sequence[int]) -> dict:
    """Compressed bytes of every patch of *x*, and of each rank of a grid of measured ranks.

    Every patch is encoded as the layout's write encodes it
    (:func:`lamina.multires.compress.encode`, tolerance *rel* of the
    range); a patch's bytes are its bands and their headers, what the write
    moves to an aggregator.  The patch grid is cut into ``ranks`` blocks
    along each axis (as even as the grid allows), one per measured rank.

    Returns
    -------
    dict
        ``sizes``: int64 bytes per patch on the patch grid (an array);
        ``rank_grid``; ``rank_box`` (patches of the first measured rank
        along each axis); ``rank_bytes`` and ``rank_patches`` per measured
        rank (row-major lists).
    """
    from ..layouts.write import HEADER
    from ..multires import compress, patches

    enc = compress.encode_array(x, PATCH, _tolerance(x, rel))
    sizes = np.zeros(patches.grid(x.shape, PATCH), dtype=np.int64)
    for batch, e in enc.batches:
        sizes[tuple(batch.coords.T)] = e.sizes().sum(axis=1) + e.levels * HEADER.size
    grid = tuple(max(1, min(int(m), n)) for m, n in zip(ranks, sizes.shape, strict=True))
    cuts = [(np.arange(m) * n) // m for m, n in zip(grid, sizes.shape, strict=True)]
    per_rank, count = sizes, np.ones(sizes.shape, dtype=np.int64)
    for d, c in enumerate(cuts):
        per_rank = np.add.reduceat(per_rank, c, axis=d)
        count = np.add.reduceat(count, c, axis=d)
    box = tuple(int(c[1]) if len(c) > 1 else n for c, n in zip(cuts, sizes.shape, strict=True))
    return {
        "sizes": sizes,
        "rank_grid": list(grid),
        "rank_box": list(box),
        "rank_bytes": per_rank.reshape(-1).tolist(),
        "rank_patches": count.reshape(-1).tolist(),
    }


def trilinear(values: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """*values* resampled to *shape*, linearly along each axis in turn (trilinear in 3-D).

    Corners are aligned: the first and last samples along an axis keep
    their values, so a grid of the same shape comes back unchanged, and
    every value lies between the samples around it.  An axis resampled to
    length 1 takes its middle.
    """
    out = np.asarray(values, dtype=np.float64)
    for d, n in enumerate(int(k) for k in shape):
        g = out.shape[d]
        if n == 1 or g == 1:
            x = np.full(n, (g - 1) / 2)
        else:
            x = np.arange(n) * ((g - 1) / (n - 1))
        i0 = np.minimum(np.floor(x).astype(np.int64), g - 1)
        i1 = np.minimum(i0 + 1, g - 1)
        w = (x - i0).reshape([n if k == d else 1 for k in range(out.ndim)])
        out = np.take(out, i0, axis=d) * (1 - w) + np.take(out, i1, axis=d) * w
    return out


def virtual_ranks(sizes: np.ndarray, nranks: int, box: Sequence[int]) -> dict:
    """The patches of *nranks* virtual ranks of *box* patches each, sized from *sizes*.

    The ranks form a grid of ``dims_create(nranks, ndim)`` (its largest
    factor along the axis with the most measured patches); the measured
    patch sizes *sizes* are resampled to the virtual patch grid
    (:func:`trilinear`), so that a virtual rank's patches have the sizes
    the measured field has at that place.

    Returns
    -------
    dict
        ``sizes``: int64 bytes per patch in Morton order; ``owner``: the
        virtual rank of each patch; ``dims``: the rank grid; ``counts``:
        the patch grid.
    """
    from ..geometry import dims_create
    from ..multires import balance

    nd = sizes.ndim
    dims = [1] * nd
    by_size = sorted(range(nd), key=lambda d: -sizes.shape[d])
    for d, f in zip(by_size, dims_create(nranks, nd), strict=True):
        dims[d] = f
    counts = tuple(f * int(b) for f, b in zip(dims, box, strict=True))
    resampled = np.maximum(np.rint(trilinear(sizes, counts)), 1).astype(np.int64)
    grid = balance.Grid.of(tuple(c * p for c, p in zip(counts, PATCH, strict=True)), PATCH)
    owner = np.ravel_multi_index(tuple((grid.coords // np.asarray(box)).T), dims)
    return {
        "sizes": resampled[tuple(grid.coords.T)],
        "owner": np.asarray(owner, dtype=np.int64),
        "dims": dims,
        "counts": list(counts),
    }


def _pwrite_all(fd: int, data: np.ndarray, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


#: bytes at the start of a patch that name it (patch number, size; int64 each)
STAMP = 16


def _grid_run(
    comm, buf: np.ndarray, mine: np.ndarray, offs: np.ndarray, sums: np.ndarray, run: tuple
) -> dict:
    """One aggregation + write of every rank's patches (collective); the row of rank 0.

    *buf* holds this rank's patches *mine* (Morton order) at *offs*;
    *sums* is the sum of the bytes of every patch (for the check); *run*
    is ``(scheme, aggregators, directory)``.  Phases are the slowest
    rank's; the subfiles are checked, then removed.
    """
    from mpi4py import MPI

    from .. import comm as comm_mod
    from ..layouts.write import plan_aggregation

    scheme, naggs, directory = run
    r, n, npatches = comm.rank, comm.size, sums.size
    if r == 0:
        os.sync()  # earlier runs' writes must not land in this one's fsync
    comm.Barrier()
    t0 = time.perf_counter()
    # plan: every rank's patch numbers and sizes to everyone, then the runs per aggregator
    msg = np.concatenate([mine, np.diff(offs)]).astype(np.int64).tobytes()
    sizes = np.zeros(npatches, dtype=np.int64)
    owner = np.full(npatches, -1, dtype=np.int64)
    for src, got in enumerate(comm_mod.allgather_bytes(comm, msg)):
        a = np.frombuffer(got, dtype=np.int64)
        k = a.size // 2
        sizes[a[:k]] = a[k:]
        owner[a[:k]] = src
    if scheme == "local":
        dest, writers = owner, np.arange(n, dtype=np.int64)
    else:
        agg = plan_aggregation(comm, sizes, naggs, scheme)  # as layouts/write.py: rank 0 plans
        dest, writers = agg.ranks[agg.of_patch()], agg.ranks
    t1 = time.perf_counter()
    # exchange: a rank's patches for one aggregator are one run of the Morton order,
    # so one contiguous piece of its buffer
    sends: dict[int, np.ndarray] = {}
    recvs: dict[int, np.ndarray] = {}
    mine_dest = dest[mine]
    for d in np.unique(mine_dest).tolist():
        if d != r:
            k = np.flatnonzero(mine_dest == d)
            assert k[-1] - k[0] + 1 == k.size, "an aggregator's patches are not one run"
            sends[d] = buf[offs[k[0]] : offs[k[-1] + 1]]
    incoming = np.flatnonzero((dest == r) & (owner != r))
    for src in np.unique(owner[incoming]).tolist():
        recvs[src] = np.empty(int(sizes[incoming[owner[incoming] == src]].sum()), np.uint8)
    comm_mod.exchange_pairs(comm, sends, recvs, comm_mod.Tag.PATCH_BYTES)
    t2 = t3 = t4 = time.perf_counter()
    # write: each aggregator its patches, in Morton order, into a subfile of its own
    path = os.path.join(directory, f"sub.{r}")
    ps = np.flatnonzero(dest == r)
    writer = bool((writers == r).any())
    if writer:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            pos, taken = 0, dict.fromkeys(recvs, 0)
            own = np.searchsorted(mine, ps)
            for p, k in zip(ps.tolist(), own.tolist(), strict=True):
                size, o = int(sizes[p]), int(owner[p])
                if o == r:
                    data = buf[offs[k] : offs[k + 1]]
                else:
                    data = recvs[o][taken[o] : taken[o] + size]
                    taken[o] += size
                _pwrite_all(fd, data, pos)
                pos += size
            t3 = time.perf_counter()
            os.fsync(fd)
        finally:
            os.close(fd)
        t4 = time.perf_counter()
    mine_s = {"plan": t1 - t0, "exchange": t2 - t1, "write": t3 - t2, "fsync": t4 - t3}
    phases = {k: comm.allreduce(v, op=MPI.MAX) for k, v in mine_s.items()}
    seconds = comm.allreduce(t4 - t0, op=MPI.MAX)
    moving = comm.allreduce(t4 - t1, op=MPI.MAX)  # exchange + write + fsync
    # check: every patch once, whole, where its aggregator's run puts it
    nbytes, ok = _check_subfile(path, ps, sizes, sums) if writer else (0, True)
    if writer:
        os.remove(path)
    file_bytes = comm.allreduce(nbytes)
    ok = comm.allreduce(int(not ok)) == 0
    away = dest != owner
    pairs = np.unique(owner[away] * n + dest[away])
    per_writer = np.bincount(dest, weights=sizes, minlength=n)[writers]
    return {
        "aggregation": scheme,
        "aggregators": int(len(writers)),
        "seconds": seconds,
        "data_seconds": moving,
        "phases": phases,
        "bytes": int(sizes.sum()),
        "file_bytes": int(file_bytes),
        "checked": bool(ok),
        "agg_bytes_max": int(per_writer.max()),
        "agg_bytes_min": int(per_writer.min()),
        "agg_balance": float(per_writer.max() / per_writer.mean()) if per_writer.sum() else 1.0,
        "messages": int(pairs.size),
        "bytes_moved": int(sizes[away].sum()),
    }


def grid_worker(args) -> None:
    """The size-grid job: allocate this rank's patches, then aggregate and write them per scheme."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    r, n = comm.rank, comm.size
    data = np.load(args.sizes)
    aggs = sorted({max(1, n // d) for d in (1, 2, 4, 8)}, reverse=True)
    runs = [(a, f) for a in ("balanced", "counts") for f in aggs] + [("local", n)]
    rows = []
    for name in args.fields:
        sizes, owner = data[f"{name}_sizes"], data[f"{name}_owner"]
        mine = np.flatnonzero(owner == r)  # Morton order
        offs = np.concatenate([[0], np.cumsum(sizes[mine])]).astype(np.int64)
        # random bytes (nothing on the way can compress them), each patch stamped
        # with its number and size for the check
        buf = np.random.default_rng([7, r]).integers(0, 256, int(offs[-1]), dtype=np.uint8)
        for k, p in enumerate(mine.tolist()):
            if sizes[p] >= STAMP:
                stamp = np.array([p, sizes[p]], dtype=np.int64).view(np.uint8)
                buf[offs[k] : offs[k] + STAMP] = stamp
        sums = np.zeros(sizes.size, dtype=np.uint64)
        if mine.size:
            sums[mine] = np.add.reduceat(buf, offs[:-1], dtype=np.uint64)
        sums = comm.allreduce(sums)  # each patch's sum comes from its one owner
        for scheme, naggs in runs:
            tries = [
                _grid_run(comm, buf, mine, offs, sums, (scheme, naggs, args.dir))
                for _ in range(args.repeat)
            ]
            best = min(tries, key=lambda t: t["seconds"])
            best["field"] = name
            best["all_seconds"] = [t["seconds"] for t in tries]
            best["checked"] = all(t["checked"] for t in tries)
            if r == 0:
                print(f"{common.PROGRESS}step size-grid {name} {scheme} F={naggs}", flush=True)
                rows.append(best)
        del buf
    if r == 0:
        with open(args.out, "w") as fh:
            json.dump({"ranks": n, "rows": rows}, fh)


def _check_subfile(
    path: str, ps: np.ndarray, sizes: np.ndarray, sums: np.ndarray
) -> tuple[int, bool]:
    """Bytes of an aggregator's subfile and whether it holds its patches *ps*, whole and in place.

    In place: the file is the patches one after another in Morton order,
    each starting with its stamp (number and size) and its bytes adding
    up to its sum in *sums*.
    """
    nbytes = os.path.getsize(path)
    if nbytes != int(sizes[ps].sum()):
        return nbytes, False
    if not ps.size:
        return nbytes, True
    with open(path, "rb") as fh:
        raw = np.frombuffer(fh.read(), dtype=np.uint8)
    start = np.concatenate([[0], np.cumsum(sizes[ps])])[:-1]
    ok = bool((np.add.reduceat(raw, start, dtype=np.uint64) == sums[ps]).all())
    big = sizes[ps] >= STAMP
    stamps = raw[start[big, None] + np.arange(STAMP)].copy().view(np.int64)
    ok = ok and (stamps[:, 0] == ps[big]).all() and (stamps[:, 1] == sizes[ps[big]]).all()
    return nbytes, bool(ok)


def _plan_alone(sizes: np.ndarray, scheme: str, naggs: int, nranks: int) -> float:
    """Seconds of :func:`lamina.multires.balance.aggregate` in one process (best of 3).

    In the size-grid job every rank computes the plan, P ranks sharing the
    machine's cores; alone is what it costs a rank with a core of its own.
    """
    from ..multires import balance

    if scheme == "local":
        return 0.0
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        balance.aggregate(sizes, naggs, nranks, scheme=scheme)
        best = min(best, time.perf_counter() - t0)
    return best


def size_grid(args, fields: list[str], directory: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Measure the fields' patch sizes, then run one size-grid job per rank count of ``--size-grid``.

    Returns the document's ``size_grid`` part and the measured patch sizes
    per field.
    """
    from .launch import run_json_job

    shape = tuple(args.shape)
    measured: dict[str, np.ndarray] = {}
    doc: dict = {"shape": list(shape), "rel": args.rel, "measured": {}, "jobs": []}
    for name in fields:
        m = measure(field(name, shape), args.rel, args.measure_grid)
        measured[name] = m.pop("sizes")
        s = measured[name]
        doc["measured"][name] = {
            **m,
            "patches": int(s.size),
            "bytes": int(s.sum()),
            "patch_min": int(s.min()),
            "patch_max": int(s.max()),
        }
    first = doc["measured"][fields[0]]
    box = list(args.grid_box or first["rank_box"])
    doc["grid_box"] = box
    for nranks in args.size_grid:
        arrays, info = {}, {}
        for name in fields:
            v = virtual_ranks(measured[name], nranks, box)
            arrays[f"{name}_sizes"], arrays[f"{name}_owner"] = v["sizes"], v["owner"]
            per_rank = np.bincount(v["owner"], weights=v["sizes"], minlength=nranks)
            info[name] = {
                "dims": v["dims"],
                "counts": v["counts"],
                "patches": int(v["sizes"].size),
                "bytes": int(v["sizes"].sum()),
                "patch_min": int(v["sizes"].min()),
                "patch_max": int(v["sizes"].max()),
                "rank_bytes_min": int(per_rank.min()),
                "rank_bytes_max": int(per_rank.max()),
                "rank_bytes_mean": float(per_rank.mean()),
            }
        sizes_path = os.path.join(directory, f"sizes-{nranks}.npz")
        np.savez(sizes_path, **arrays)
        job_dir = os.path.join(directory, f"grid-{nranks}")
        os.makedirs(job_dir, exist_ok=True)

        def command(out: str, nranks: int = nranks, sizes_path: str = sizes_path, d=job_dir):
            return _job(
                nranks,
                "--grid-worker",
                "--sizes",
                sizes_path,
                "--dir",
                d,
                "--out",
                out,
                "--repeat",
                str(args.repeat),
                "--fields",
                *fields,
            )

        job = run_json_job(
            command,
            f"size-grid job with {nranks} ranks",
            args.timeout,
            lambda text: print(f"  {text.rstrip()}", file=sys.stderr),
            lambda line: print(line.rstrip("\n"), file=sys.stderr),
        )
        for row in job["rows"]:
            row["plan_alone"] = _plan_alone(
                arrays[f"{row['field']}_sizes"], row["aggregation"], row["aggregators"], nranks
            )
        doc["jobs"].append({"ranks": nranks, "fields": info, "rows": job["rows"]})
        shutil.rmtree(job_dir, ignore_errors=True)
    return doc, measured


# --------------------------------------------------------------------------
# parent


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lamina bench multires", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4, help="writer ranks of the MPI job (default 4)")
    p.add_argument(
        "--shape",
        type=int,
        nargs=3,
        default=None,
        help=f"field shape, at least {' '.join(map(str, PATCH))} (a patch) "
        f"(default {' '.join(map(str, SHAPE))}; {' '.join(map(str, QUICK_SHAPE))} with --quick)",
    )
    p.add_argument("--fields", nargs="+", default=["cth", "uneven"], choices=list(FIELDS))
    p.add_argument(
        "--rel",
        type=float,
        default=None,
        help=f"tolerance relative to the range of the write, read and size-grid parts (default "
        f"{REL:g}; the compress part sweeps {', '.join(f'{r:g}' for r in COMPRESS_RELS)})",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help=f"runs per configuration; the best counts (default {REPEAT}; 1 with --quick)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small shape, one repeat (unless --shape, --repeat say otherwise), 10^4 ranks only, "
        "2 x 2 x 2 patches per size-grid rank",
    )
    p.add_argument(
        "--parts",
        nargs="+",
        default=list(PARTS[:4]),
        choices=PARTS,
        help="what to run (default: write compress read simulate; --size-grid adds size-grid)",
    )
    p.add_argument(
        "--size-grid",
        type=common.int_list_type("--size-grid"),
        metavar="P1,P2,...",
        help="run the size-grid benchmark with these rank counts (oversubscribed)",
    )
    p.add_argument(
        "--measure-grid",
        type=int,
        nargs=3,
        default=[2, 2, 2],
        help="measured ranks along each axis of the field (default 2 2 2)",
    )
    p.add_argument(
        "--grid-box",
        type=int,
        nargs=3,
        help="patches per size-grid rank along each axis (default: a measured rank's)",
    )
    common.add_timeout_argument(p, default=1800, help="seconds per MPI job (1800)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--grid-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sizes", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p


#: the defaults of --shape, --rel and --repeat (--quick: QUICK_SHAPE and one repeat)
SHAPE, QUICK_SHAPE, REL, REPEAT = (256, 128, 128), (64, 64, 64), 1e-3, 3
#: the parts that take --rel
REL_PARTS = ("write", "read", "size-grid")


def options(p: argparse.ArgumentParser, args: argparse.Namespace) -> set[str]:
    """Check the options and fill in the defaults (``p.error`` on nonsense); the parts to run."""
    parts = set(args.parts)
    if args.size_grid:
        parts.add("size-grid")
    if args.rel is not None and not parts & set(REL_PARTS):
        p.error(
            f"--rel: the compress part sweeps {', '.join(f'{r:g}' for r in COMPRESS_RELS)} of "
            f"the range; --rel is the tolerance of the {', '.join(REL_PARTS)} parts"
        )
    if args.rel is None:
        args.rel = REL
    if not (math.isfinite(args.rel) and args.rel >= 0):
        p.error(f"--rel: expected a number >= 0 (0: lossless), got {args.rel:g}")
    if args.shape is None:
        args.shape = list(QUICK_SHAPE if args.quick else SHAPE)
    if any(n < m for n, m in zip(args.shape, PATCH, strict=True)):
        p.error(
            f"--shape: every extent must be at least the patch's, {' '.join(map(str, PATCH))}; "
            f"got {' '.join(map(str, args.shape))}"
        )
    try:  # every rank builds the whole float32 field, and its noise beside it
        shape = " ".join(map(str, args.shape))
        need = 2 * math.prod(args.shape) * 4 * max(1, args.ranks)
        common.check_memory(need, f"--shape {shape} on {plural(args.ranks, 'rank')}", args.ranks)
        for n in args.size_grid or ():  # a job of n ranks, each with its patches' bytes
            common.check_memory(0, f"--size-grid {n}", check_ranks(n, "--size-grid"))
    except ValueError as e:
        p.error(str(e))
    if args.repeat is None:
        args.repeat = 1 if args.quick else REPEAT
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.ranks < 1:
        p.error(f"--ranks must be at least 1, got {args.ranks}")
    try:
        check_ranks(args.ranks, "--ranks")
    except ValueError as e:
        p.error(str(e))
    for name in ("measure_grid", "grid_box"):
        v = getattr(args, name)
        if v is not None and min(v) < 1:
            p.error(
                f"--{name.replace('_', '-')}: expected positive integers, got {' '.join(map(str, v))}"
            )
    return parts


def main(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    parts = options(p, args)
    if args.worker:
        worker(args)
        return 0
    if args.grid_worker:
        grid_worker(args)
        return 0
    if args.quick:
        args.grid_box = args.grid_box or [2, 2, 2]
    if "size-grid" in parts and not args.size_grid:
        args.size_grid = [4] if args.quick else [8]
    if "cth" in args.fields and find_cth() is None:
        print(f"lamina bench multires: {CTH} not found; skipping the cth field", file=sys.stderr)
        args.fields = [x for x in args.fields if x != "cth"]
        if not args.fields:
            p.error("--fields: no field left to run")
    from .launch import run_json_job

    directory = tempfile.mkdtemp(prefix="lamina-bench-multires-")
    doc: dict = {"machine": common.machine(), "argv": argv}
    try:
        shape = tuple(args.shape)

        def command(out: str) -> list[str]:
            return _job(
                args.ranks,
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
            )

        if "write" in parts:
            doc["write"] = run_json_job(
                command,
                f"multires write job with {args.ranks} ranks",
                args.timeout,
                lambda text: print(f"  {text.rstrip()}", file=sys.stderr),
                lambda line: print(line.rstrip("\n"), file=sys.stderr),
            )
        if "compress" in parts:
            doc["compress"] = {
                name: compression(field(name, shape), list(COMPRESS_RELS)) for name in args.fields
            }
        if "read" in parts:
            doc["read"] = {
                name: reads(field(name, shape), args.rel, directory, args.repeat)
                for name in args.fields
            }
        measured = None
        if "size-grid" in parts:
            doc["size_grid"], measured = size_grid(args, args.fields, directory)
        if "simulate" in parts:
            doc["simulate"] = simulations(args.quick, None if args.quick else measured)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    doc["failed_checks"] = failed_checks(doc)
    common.emit(args.json, report(doc), doc)
    return 1 if doc["failed_checks"] else 0


def failed_checks(doc: dict) -> list[str]:
    """What read back differently from what was written, by part and field."""
    bad = []
    for r in doc.get("write", {}).get("rows", []):
        if not r["checked"]:
            bad.append(
                f"write {r['field']} {r['distribution']}/{r['aggregation']} F={r['aggregators']}"
            )
    for name, rs in doc.get("compress", {}).items():
        bad += [f"compress {name} rel={r['rel']:g}" for r in rs if not r["ok"]]
    for name, rs in doc.get("read", {}).items():
        bad += [f"read {name} level {r['level']}" for r in rs if not r["ok"]]
    for job in doc.get("size_grid", {}).get("jobs", []):
        bad += [
            f"size-grid {r['field']} P={job['ranks']} {r['aggregation']} F={r['aggregators']}"
            for r in job["rows"]
            if not (r["checked"] and r["file_bytes"] == r["bytes"])
        ]
    return bad


def report(doc: dict) -> str:
    """The tables of every part that ran."""
    out: list[str] = []
    for part, fn in (
        ("write", _report_write),
        ("compress", _report_compress),
        ("read", _report_read),
        ("size_grid", _report_size_grid),
        ("simulate", _report_simulate),
    ):
        if part in doc:
            if out:
                out.append("")
            fn(doc, out)
    if doc.get("failed_checks"):
        out.append(f"DATA CHECK FAILED for: {', '.join(doc['failed_checks'])}")
    return "\n".join(out)


def _report_write(doc: dict, out: list[str]) -> None:
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


def _report_compress(doc: dict, out: list[str]) -> None:
    out.append("compression (lamina: every level readable; zfp: whole array, one level)")
    rows = []
    for name, rs in doc["compress"].items():
        for r in rs:
            rows.append(
                [
                    name,
                    f"{r['rel']:g}",
                    f"{r['lamina_ratio']:.1f}",
                    f"{r['lamina_psnr']:.1f}",
                    # (a constant field's tolerance is 0: written exactly)
                    f"{r['lamina_maxerr'] / r['tolerance']:.2f}" if r["tolerance"] > 0 else "-",
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


def _report_read(doc: dict, out: list[str]) -> None:
    out.append("read of the central region (half the extent per axis) at every level")
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


def _report_simulate(doc: dict, out: list[str]) -> None:
    sims = doc["simulate"]
    out.append("simulated distribution (32^3 patches; rank boxes on a process grid, cuts jittered)")
    rows = []
    for r in sims:
        if r.get("sizes", "synthetic") != "synthetic":
            continue
        for scheme in ("balanced", "balanced-piece", "greedy"):
            v = r.get(f"distribute/{scheme}")
            if v is None:
                continue
            rows.append(
                [
                    f"{r['ranks']:,}",
                    f"{v['patches']:,}",
                    scheme,
                    str(v["patches_max_minus_min"]),
                    f"{100 * v['cells_moved_fraction']:.0f}%",
                    f"{v['messages']:,}",
                ]
            )
    out.append(
        table(
            ["ranks", "patches", "distribution", "patches max-min", "cells moved", "messages"],
            rows,
            align="rrlrrr",
        )
    )
    out.append("simulated aggregation (F = N/8; messages: distinct rank -> aggregator pairs)")
    rows = []
    for r in sims:
        for scheme in ("balanced", "counts"):
            v = r[f"aggregate/{scheme}"]
            rows.append(
                [
                    f"{r['ranks']:,}",
                    r.get("sizes", "synthetic"),
                    f"{r['aggregators']:,}",
                    scheme,
                    f"{v['bytes_max_over_mean']:.3f}",
                    f"{v['bytes_min_over_mean']:.3f}",
                    f"{v['messages']:,}",
                    fmt_bytes(v["bytes_sent"]),
                    str(v["max_destinations_per_rank"]),
                    f"{v['plan_seconds'] * 1e3:.1f}" if "plan_seconds" in v else "",
                ]
            )
    out.append(
        table(
            [
                "ranks",
                "sizes",
                "F",
                "aggregation",
                "bytes max/mean",
                "bytes min/mean",
                "messages",
                "bytes sent",
                "aggregators per rank max",
                "plan ms (per rank)",
            ],
            rows,
            align="rlrlrrrrrr",
        )
    )


def _report_size_grid(doc: dict, out: list[str]) -> None:
    g = doc["size_grid"]
    first = next(iter(g["measured"].values()))
    out.append(
        f"size grid: patch sizes measured on {'x'.join(map(str, first['rank_grid']))} ranks of "
        f"the {'x'.join(map(str, g['shape']))} field (tolerance {g['rel']:g} of the range)"
    )
    rows = []
    for name, m in g["measured"].items():
        rb = m["rank_bytes"]
        rows.append(
            [
                name,
                "x".join(map(str, m["rank_box"])),
                f"{fmt_bytes(min(rb))} .. {fmt_bytes(max(rb))}",
                f"{max(rb) / max(min(rb), 1):.2f}",
                f"{fmt_bytes(m['patch_min'])} .. {fmt_bytes(m['patch_max'])}",
                f"{m['patch_max'] / m['patch_min']:.3g}",
            ]
        )
    out.append(
        table(
            [
                "field",
                "patches per rank",
                "bytes per rank",
                "max/min",
                "bytes per patch",
                "max/min",
            ],
            rows,
            align="lrrrrr",
        )
    )
    out.append(
        f"interpolated (trilinear) to P ranks of {'x'.join(map(str, g['grid_box']))} patches each"
    )
    rows = []
    for job in g["jobs"]:
        for name, v in job["fields"].items():
            rows.append(
                [
                    name,
                    str(job["ranks"]),
                    "x".join(map(str, v["dims"])),
                    f"{v['patches']:,}",
                    fmt_bytes(v["bytes"]),
                    f"{v['rank_bytes_max'] / v['rank_bytes_mean']:.3f}",
                    f"{v['rank_bytes_max'] / max(v['rank_bytes_min'], 1):.2f}",
                    f"{v['patch_max'] / v['patch_min']:.3g}",
                ]
            )
    out.append(
        table(
            [
                "field",
                "P",
                "rank grid",
                "patches",
                "bytes",
                "bytes per rank max/mean",
                "max/min",
                "patch max/min",
            ],
            rows,
            align="lrlrrrrr",
        )
    )
    out.append(
        "aggregation + write of those bytes (P ranks oversubscribed; write = pwrite of each "
        "patch into the aggregator's subfile, then fsync; phases are the slowest rank's; best "
        "of the runs; alone: the plan computed by one process; moving: exchange + write + fsync; "
        "vs counts: counts' time at the same F over this one's)"
    )
    rows = []
    for job in g["jobs"]:
        counts = {
            (r["field"], r["aggregators"]): r for r in job["rows"] if r["aggregation"] == "counts"
        }
        for r in job["rows"]:
            ph = r["phases"]
            base = counts.get((r["field"], r["aggregators"]))
            vs = vs_moving = ""
            if base is not None and r["aggregation"] != "counts":
                vs = f"{base['seconds'] / r['seconds']:.2f}"
                vs_moving = f"{base['data_seconds'] / r['data_seconds']:.2f}"
            rows.append(
                [
                    r["field"],
                    str(job["ranks"]),
                    r["aggregation"],
                    str(r["aggregators"]),
                    f"{ph['plan'] * 1e3:.1f}",
                    f"{r['plan_alone'] * 1e3:.1f}",
                    f"{ph['exchange'] * 1e3:.1f}",
                    f"{ph['write'] * 1e3:.1f}",
                    f"{ph['fsync'] * 1e3:.1f}",
                    f"{r['seconds'] * 1e3:.1f}",
                    f"{r['bytes'] / r['seconds'] / 2**20:.0f}",
                    f"{r['bytes'] / r['data_seconds'] / 2**20:.0f}",
                    f"{r['agg_balance']:.3f}",
                    fmt_bytes(r["agg_bytes_max"]),
                    fmt_bytes(r["bytes_moved"]),
                    str(r["messages"]),
                    vs,
                    vs_moving,
                    "yes" if r["checked"] and r["file_bytes"] == r["bytes"] else "NO",
                ]
            )
    out.append(
        table(
            [
                "field",
                "P",
                "aggregation",
                "F",
                "plan ms",
                "alone",
                "exchange ms",
                "write ms",
                "fsync ms",
                "total ms",
                "MiB/s",
                "moving MiB/s",
                "bytes per aggregator max/mean",
                "largest aggregator",
                "moved",
                "messages",
                "vs counts",
                "moving vs counts",
                "every byte once",
            ],
            rows,
            align="lrlrrrrrrrrrrrrrrrl",
        )
    )
    for line in size_grid_summary(g):
        out.append(line)


def size_grid_summary(g: dict) -> list[str]:
    """Per field, at the largest P: balanced against counts (the issue's targets)."""
    if not g["jobs"]:
        return []
    job = max(g["jobs"], key=lambda j: j["ranks"])
    lines = []
    for name in job["fields"]:
        rows = {(r["aggregation"], r["aggregators"]): r for r in job["rows"] if r["field"] == name}
        pairs = [(rows[k], rows[("counts", k[1])]) for k in rows if k[0] == "balanced"]
        if not pairs:
            continue
        speed = [c["seconds"] / b["seconds"] for b, c in pairs]
        moving = [c["data_seconds"] / b["data_seconds"] for b, c in pairs]
        bal = [b["agg_balance"] for b, _ in pairs]
        cnt = [c["agg_balance"] for _, c in pairs]
        bound = [c["agg_bytes_max"] / max(b["agg_bytes_max"], 1) for b, c in pairs]
        plan = [b["plan_alone"] * 1e3 for b, _ in pairs]
        lines.append(
            f"{name}, P = {job['ranks']}, F = {', '.join(str(b['aggregators']) for b, _ in pairs)}: "
            f"balanced / counts write bandwidth {_span(speed)}x, without the plan "
            f"{_span(moving)}x (target >= 1.3); the balanced plan alone {_span(plan, '.1f')} ms; "
            f"bytes per aggregator max/mean balanced {_span(bal, '.3f')} (target <= 1.05), "
            f"counts {_span(cnt, '.3f')}; largest aggregator counts / balanced {_span(bound)}x "
            "(the speed-up where each aggregator writes at a bandwidth of its own)"
        )
    return lines


def _span(values: list[float], fmt: str = ".2f") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}} .. {hi:{fmt}}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
