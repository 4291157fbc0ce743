"""``lamina bench write``: lamina native against numpy, h5py and ADIOS2 BP5, same data, one run.

Each rank holds one 3-D float64 block of ``--size`` bytes; the global array
is the ranks' blocks stacked along axis 0.  For every rank count one MPI job
times, ``--repeat`` times each (order rotated between repetitions):

``numpy tofile``        one file per rank (the reference)
``os.pwrite``           the same bytes with one ``os.pwrite`` (lamina's call; numpy preallocates first)
``h5py 1 file``         one shared file, ranks in turn (no parallel HDF5 in the wheel)
``adios2 BP5``          one BP5 file per rank (serial ADIOS2)
``lamina agg=A``        lamina native, ``aggregators=A``, ``ds.write(copy=False)``
``lamina agg=R copy``   the same with ``ds[box] = a`` (safe copy semantics)
``lamina agg=R sync-stats``  statistics and checksums on the calling thread
``lamina agg=R no-stats``    statistics and checksums replaced by a no-op (measurement only):
                        ``stats.compute``, and ``stats.summarize_flat``, ``summarize_rows`` and
                        ``summarize`` for blocks of at most ``stats.SMALL`` (64 KiB), which are
                        summarized a chunk at a time
``stats+crc only``      ``lamina.stats.compute`` on the block, nothing written

A timed write is open + define + write + close (everything a program pays),
from a common barrier to the slowest rank's end.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os

import numpy as np

from ..text import fmt_bytes, table
from . import baselines as bl
from . import common, launch
from .harness import Ctx, Method

REF = "numpy tofile"
PWRITE = "os.pwrite"


# ------------------------------------------------------------ method list
def lamina_name(aggs: int, variant: str = "") -> str:
    return f"lamina agg={aggs}" + (f" {variant}" if variant else "")


def method_names(ranks: int, aggregators: list[str], families: list[str]) -> list[str]:
    """The rows of a job with *ranks* ranks (shared by the parent, for the progress bar)."""
    names = []
    if "numpy" in families:
        names += [REF, PWRITE]
    if "h5py" in families:
        names.append("h5py 1 file")
    if "adios2" in families:
        names.append("adios2 BP5")
    for a in common.resolve_aggregators(aggregators, ranks):
        names.append(lamina_name(a))
    names += [
        lamina_name(ranks, "copy"),
        lamina_name(ranks, "sync-stats"),
        lamina_name(ranks, "no-stats"),
        "stats+crc only",
    ]
    return names


# ------------------------------------------------------------------ worker
def _lamina_path(ctx: Ctx, name: str) -> str:
    return os.path.join(ctx.dir, name.replace(" ", "_").replace("=", "") + ".lam")


def _lamina_write(
    ctx: Ctx, path: str, aggs: int, copy: bool = False, background: bool = True
) -> None:
    import lamina

    with lamina.open(
        path, "w", comm=ctx.comm, aggregators=aggs, durable=ctx.fsync, background_stats=background
    ) as f:
        ds = f.create_dataset(bl.DATASET, ctx.gshape, ctx.local.dtype)
        with f.step():
            if copy:
                ds[ctx.box.slices] = ctx.local
            else:
                ds.write(ctx.local, offset=ctx.box.start, copy=False)


def _fake_compute(arr, seg=None, checksum=True):
    """Stand-in for lamina.stats.compute that does no work (for the no-stats measurement)."""
    from ..catalog.model import Stats
    from ..stats import SEGMENT

    seg = SEGMENT if seg is None else seg
    n = int(arr.nbytes)
    ncrc = (max(1, -(-n // seg)) if seg > 0 else 1) if checksum else 0
    return Stats(0.0, 0.0, 0.0, int(arr.size)), (0,) * ncrc


def _fake_summarize_flat(values, sizes, checksum=True):
    """Stand-in for lamina.stats.summarize_flat that does no work: the statistics and checksums
    of blocks of at most ``stats.SMALL`` bytes, which the engine stages in chunks and
    summarizes a chunk at a time instead of calling compute (engines/staging.py)."""
    from ..stats import Summary

    kind = values.dtype.kind
    slot = np.int64 if kind == "i" else np.uint64 if kind in "ub" else np.float64
    n = len(sizes)
    return Summary(
        np.zeros(n, dtype=slot),
        np.zeros(n, dtype=slot),
        np.zeros(n, dtype=np.complex128 if kind == "c" else np.float64),
        np.asarray(sizes, dtype=np.int64).copy(),
        np.zeros(n, dtype=np.uint32) if checksum else None,
    )


def _fake_summarize_rows(values, n, checksum=True):
    """Stand-in for lamina.stats.summarize_rows (see :func:`_fake_summarize_flat`)."""
    return _fake_summarize_flat(values, np.full(n, len(values) // max(n, 1)), checksum)


def _fake_summarize(arrays, checksum=True):
    """Stand-in for lamina.stats.summarize that does no work (see :func:`_fake_summarize_flat`)."""
    sizes = np.array([a.size for a in arrays], dtype=np.int64)
    values = arrays[0].reshape(-1) if len(arrays) else np.zeros(0)
    return _fake_summarize_flat(values, sizes, checksum)


#: what computes the statistics and checksums of a block written: compute (a block of more
#: than stats.SMALL bytes), summarize_flat and summarize (smaller blocks, staged in chunks)
_FAKES = {
    "compute": _fake_compute,
    "summarize_flat": _fake_summarize_flat,
    "summarize_rows": _fake_summarize_rows,
    "summarize": _fake_summarize,
}


@contextlib.contextmanager
def _stats_off():
    """Every path that computes a written block's statistics and checksums made a no-op."""
    from .. import stats

    orig = {name: getattr(stats, name) for name in _FAKES}
    for name, fake in _FAKES.items():
        setattr(stats, name, fake)
    try:
        yield
    finally:
        for name, fn in orig.items():
            setattr(stats, name, fn)


def _verify_and_remove(ctx: Ctx, name: str, path: str | None, reader, rep: int) -> None:
    """Untimed, after a timed write: check what was written (first repetition), then delete it."""
    ctx.barrier()
    if rep == (-1 if ctx.warmup else 0) and reader is not None:
        got = reader()
        ctx.check(
            got.shape == ctx.local.shape and np.array_equal(got, ctx.local),
            f"{name}: data read back differs",
        )
    ctx.barrier()
    if path is not None:
        common.remove(path)
    ctx.barrier()


def build_methods(ctx: Ctx) -> list[Method]:
    import lamina

    from .. import stats

    fams = ctx.families
    ms: list[Method] = []
    names = method_names(ctx.size, [str(a) for a in ctx.aggregators], fams)

    if REF in names:
        ms.append(
            Method(
                REF,
                "numpy",
                lambda: bl.numpy_write(ctx),
                after=lambda out, rep: _verify_and_remove(
                    ctx, REF, bl.numpy_path(ctx), lambda: bl.numpy_read(ctx), rep
                ),
            )
        )
    if PWRITE in names:
        ms.append(
            Method(
                PWRITE,
                "numpy",
                lambda: bl.numpy_write_pwrite(ctx),
                note="no fallocate (info)",
                after=lambda out, rep: _verify_and_remove(
                    ctx, PWRITE, bl.numpy_path(ctx), lambda: bl.numpy_read(ctx), rep
                ),
            )
        )
    if "h5py 1 file" in names:
        why = bl.available("h5py")
        if why:
            ctx.note(why)
        else:
            ms.append(
                Method(
                    "h5py 1 file",
                    "h5py",
                    lambda: bl.h5py_write(ctx),
                    after=lambda out, rep: _verify_and_remove(
                        ctx,
                        "h5py",
                        bl.h5py_path(ctx) if ctx.rank == 0 else None,
                        lambda: bl.h5py_read(ctx, ctx.box),
                        rep,
                    ),
                    note="ranks in turn",
                )
            )
    if "adios2 BP5" in names:
        why = bl.available("adios2")
        if why:
            ctx.note(why)
        else:
            ms.append(
                Method(
                    "adios2 BP5",
                    "adios2",
                    lambda: bl.adios2_write(ctx),
                    after=lambda out, rep: _verify_and_remove(
                        ctx,
                        "adios2",
                        bl.adios2_path(ctx),
                        lambda: bl.adios2_read(ctx, ctx.box),
                        rep,
                    ),
                    note="file per rank",
                )
            )

    def lamina_method(
        name: str, aggs: int, copy=False, background=True, off=False, note=""
    ) -> Method:
        path = _lamina_path(ctx, name)

        def run():
            if off:
                with _stats_off():
                    _lamina_write(ctx, path, aggs, copy, background)
            else:
                _lamina_write(ctx, path, aggs, copy, background)

        def read_back():
            with lamina.open(path, "r", comm=ctx.comm) as f:
                return f[bl.DATASET].read(ctx.box)

        return Method(
            name,
            "lamina",
            run,
            note=note,
            after=lambda out, rep: _verify_and_remove(
                ctx, name, path if ctx.rank == 0 else None, None if off else read_back, rep
            ),
        )

    R = ctx.size
    for a in ctx.aggregators:
        ms.append(lamina_method(lamina_name(a), a, note="write(copy=False)"))
    ms.append(lamina_method(lamina_name(R, "copy"), R, copy=True, note="ds[box] = a"))
    ms.append(
        lamina_method(
            lamina_name(R, "sync-stats"), R, background=False, note="background_stats=False"
        )
    )
    ms.append(
        lamina_method(lamina_name(R, "no-stats"), R, off=True, note="stats and CRCs patched out")
    )
    ms.append(
        Method(
            "stats+crc only",
            "stats",
            lambda: stats.compute(ctx.local),
            note="lamina.stats.compute, no I/O",
        )
    )
    return ms


def worker(ctx: Ctx) -> dict:
    rows = ctx.measure(build_methods(ctx))
    return {"rows": rows}


# ------------------------------------------------------------------ parent
def _target_cell(t: dict, k: str, goal: float, applies: bool = True) -> str:
    if t[f"vs_{k}"] is None:
        return "-"
    c = common.ratio_cell((t[f"vs_{k}"], t[f"vs_{k}_best"]))
    if not applies:
        return c + " (info)"
    return c + f" {common.verdict(t[f'vs_{k}'], goal, best=t[f'vs_{k}_best'])}"


BASELINES = (("numpy", REF), ("h5py", "h5py 1 file"), ("adios2", "adios2 BP5"))


def report(o: common.CommonOptions, jobs: list[dict], argv: list[str]) -> tuple[str, dict]:
    """The text report (tables, targets) and the JSON document."""
    out = []
    first = jobs[0]
    mode = (
        "durable: lamina durable=True, baselines fsync"
        if o.fsync
        else "page cache: nobody fsyncs (durable=False)"
    )
    out.append(
        f"lamina bench write: 3-D float64, {fmt_bytes(first['bytes_per_rank'])} per rank "
        f"(block {tuple(first['local_shape'])}), repeat {o.repeat}, {mode}"
    )
    out.append(
        "times: open+write+close, slowest rank; ratios: speed-up of the row over the baseline "
        "(> 1 = row faster), median over repetitions of the paired ratio, best case (min/min) in parentheses"
    )
    targets = []
    for job in jobs:
        R = job["ranks"]
        rows = {r["name"]: r for r in job["rows"]}
        total = job["bytes_per_rank"] * R
        base = {k: rows.get(n) for k, n in BASELINES}
        hdr = ["method", "median s", "min s", "GiB/s", "vs numpy", "vs h5py", "vs adios2", "note"]
        body = []
        for r in job["rows"]:
            io = r["family"] != "stats"
            body.append(
                [
                    r["name"],
                    f"{r['median']:.3f}",
                    f"{r['min']:.3f}",
                    f"{common.gibps(total, r['median']):.2f}",
                    *(
                        common.ratio_cell(common.speedup(base[k], r)) if io else "-"
                        for k, _ in BASELINES
                    ),
                    r.get("note", ""),
                ]
            )
        out.append("")
        out.append(
            f"### {R} rank{'s' if R > 1 else ''}: {fmt_bytes(total)} in all, "
            f"global shape {tuple(job['global_shape'])}"
        )
        out.append(table(hdr, body, "lrrrrrrl"))
        for n in job.get("notes", []):
            out.append(f"note: {n}")
        if job.get("loadavg"):
            out.append(
                f"load average before/after the job: {job['loadavg'][0]:.2f} / {job['loadavg'][1]:.2f} "
                f"on {common.machine()['cpus']} CPUs"
            )
        on, off, only = (
            rows.get(lamina_name(R)),
            rows.get(lamina_name(R, "no-stats")),
            rows.get("stats+crc only"),
        )
        for r in job["rows"]:
            if r["family"] != "lamina" or " " in r["name"].split("=", 1)[1]:
                continue  # plain 'lamina agg=A' rows only
            t = {"ranks": R, "method": r["name"]}
            for k, _ in BASELINES:
                t[f"vs_{k}"], t[f"vs_{k}_best"] = common.speedup(base[k], r)
            if r["name"] == lamina_name(R):
                t["stats_overhead"] = common.paired_fraction(on, off)
                t["stats_overhead_best"] = (
                    (on["min"] - off["min"]) / on["min"] if on and off else None
                )
                t["stats_compute_fraction"] = only["median"] / on["median"] if on and only else None
            targets.append(t)
    out.append("")
    out.append("### targets")
    hdr = [
        "ranks",
        "lamina",
        "vs numpy (>= 0.9x at 1 rank)",
        "vs adios2 (>= 1.0x)",
        "vs h5py (>= 1.2x)",
        "stats+crc overhead (<= 10%)",
    ]
    body = []
    for t in targets:
        cell = functools.partial(_target_cell, t)

        so = "-"
        if t.get("stats_overhead") is not None:
            so = (
                f"{100 * t['stats_overhead']:.0f}% ({100 * t['stats_overhead_best']:.0f}%) "
                f"{common.verdict(t['stats_overhead'], 0.10, higher_is_better=False, best=t['stats_overhead_best'])}"
            )
            if t.get("stats_compute_fraction") is not None:
                so += f"; compute alone {100 * t['stats_compute_fraction']:.0f}%"
        body.append(
            [
                str(t["ranks"]),
                t["method"],
                cell("numpy", 0.9, t["ranks"] == 1),
                cell("adios2", 1.0),
                cell("h5py", 1.2),
                so,
            ]
        )
    out.append(table(hdr, body, "rlllll"))
    out.append(
        "stats+crc overhead = (lamina agg=R - lamina agg=R no-stats) / lamina agg=R, paired median (best case); "
        "'compute alone' = stats+crc only / lamina agg=R, medians: the cost if the work were not overlapped"
    )
    doc = {
        "benchmark": "write",
        "options": common.options_doc(o, "write", argv),
        "jobs": jobs,
        "targets": targets,
    }
    return "\n".join(out), doc


def parser(prog: str = "lamina bench write") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Write throughput of lamina native vs numpy, h5py and ADIOS2 BP5."
    )
    common.add_common_arguments(p)
    return p


def main(argv: list[str]) -> int:
    p = parser()
    ns = p.parse_args(argv)
    try:
        o = common.common_options(ns)
    except ValueError as e:
        p.error(str(e))
    return launch.run_and_report(
        "write",
        o,
        lambda r: o.warmup + o.repeat * len(method_names(r, o.aggregators, o.methods)),
        report,
        argv,
    )
