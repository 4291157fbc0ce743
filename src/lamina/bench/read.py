"""``lamina bench read``: reading back what numpy, h5py, ADIOS2 BP5 and lamina wrote, same data, one run.

Set-up (untimed) writes the same per-rank blocks with every method (as in
``lamina bench write``), then each read is timed ``--repeat`` times:

* **same decomposition**: every rank reads its own block back into a new
  array (``numpy fromfile``, ``h5py``, ``adios2 BP5``, ``lamina agg=A`` for
  each aggregator count the file was written with), plus ``numpy aligned``
  (for information: ``preadv`` into a page-aligned array; numpy's own
  arrays start 16 bytes into a page, which makes the kernel's copy out of
  the page cache slower on some CPUs: ``lamina.buffers``);
* **into the program's array**: the same block read into one array the
  program made with ``np.empty`` and reads into at every repetition:
  ``numpy readinto`` (``os.preadv``), ``h5py read_direct`` and ``lamina
  agg=A out=`` (the most aggregators, ``read(box, out=...)``); these rows
  compare with each other, not with the reads into new arrays.  Before
  every repetition (untimed) the array is filled with NaN, and after it
  the array itself is checked;
* **slabs** (more than one rank): every rank reads a slab of the global
  array along axis 1, which cuts through every rank's block
  (``numpy memmap`` over the per-rank files, h5py hyperslab, ADIOS2
  selections, lamina box read, and the same read with ``collective=True``:
  each block read once, by one rank, and its parts sent to the others);
* **one block of a large file** (rank 0, once): a lamina file of 8 blocks;
  reading one block must touch only that block's bytes, counted with
  ``/proc/self/io`` (``rchar``: bytes the process read through system calls;
  ``read_bytes``: bytes fetched from the storage device, meaningful only
  with ``--drop-caches``).

A timed read is open + read + close, into a fresh array (but for the reads into the program's
array), from a common barrier to the slowest rank's end.  Every result is checked (untimed)
against the CRC-32C of the data written.  With ``--fsync`` the set-up writes are durable
(lamina ``durable=True``, the baselines' files fsynced), as in ``lamina bench write``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import numpy as np

from ..geometry import Box
from ..text import fmt_bytes, table
from . import baselines as bl
from . import common, launch
from .harness import MPI, Ctx, Method

REF = "numpy fromfile"
ALIGNED = "numpy aligned"
#: the baselines of the reads into an array the program made once (group "into")
REF_INTO = "numpy readinto"
H5_INTO = "h5py read_direct"
REF_SLAB = "numpy memmap slabs"
#: the baselines of each group of rows, one per family of FAMS (None: no such row)
BASELINES = {
    "same": (REF, "h5py", "adios2 BP5"),
    "into": (REF_INTO, H5_INTO, None),
    "slabs": (REF_SLAB, "h5py slabs", "adios2 slabs"),
}
DECOMPOSITION = {"same": "own block", "into": "own block, own array", "slabs": "axis-1 slabs"}
#: what the reads into the program's array find there if they write nothing
POISON = np.nan
PROBE_BLOCKS = 8


def lamina_name(aggs: int, slabs: bool = False, collective: bool = False) -> str:
    return (
        f"lamina agg={aggs}" + (" slabs" if slabs else "") + (" collective" if collective else "")
    )


def lamina_out_name(aggs: int) -> str:
    """The read into an array the program made itself (``read(box, out=...)``)."""
    return f"lamina agg={aggs} out="


def method_names(ranks: int, aggregators: list[str], families: list[str]) -> list[tuple[str, str]]:
    """(name, group) of the rows of a job with *ranks* ranks."""
    aggs = common.resolve_aggregators(aggregators, ranks)
    out = []
    if "numpy" in families:
        out += [(REF, "same"), (ALIGNED, "same")]
    if "h5py" in families:
        out.append(("h5py", "same"))
    if "adios2" in families:
        out.append(("adios2 BP5", "same"))
    out += [(lamina_name(a), "same") for a in aggs]
    if "numpy" in families:
        out.append((REF_INTO, "into"))
    if "h5py" in families:
        out.append((H5_INTO, "into"))
    out.append((lamina_out_name(max(aggs)), "into"))
    if ranks > 1:
        if "numpy" in families:
            out.append((REF_SLAB, "slabs"))
        if "h5py" in families:
            out.append(("h5py slabs", "slabs"))
        if "adios2" in families:
            out.append(("adios2 slabs", "slabs"))
        out.append((lamina_name(max(aggs), True), "slabs"))
        out.append((lamina_name(max(aggs), True, True), "slabs"))
    return out


def steps(ranks: int, o: common.CommonOptions) -> int:
    return 2 + o.warmup + o.repeat * len(method_names(ranks, o.aggregators, o.methods))


# ------------------------------------------------------------------ worker
def _lamina_path(ctx: Ctx, aggs: int) -> str:
    return os.path.join(ctx.dir, f"lamina.agg{aggs}.lam")


def _lamina_write(
    ctx: Ctx, path: str, aggs: int, comm=None, blocks: list[Box] | None = None
) -> None:
    import lamina

    comm = ctx.comm if comm is None else comm
    blocks = [ctx.box] if blocks is None else blocks
    gshape = (
        ctx.gshape if comm is ctx.comm else (len(blocks) * ctx.local.shape[0], *ctx.local.shape[1:])
    )
    with lamina.open(path, "w", comm=comm, aggregators=aggs, durable=ctx.fsync) as f:
        ds = f.create_dataset(bl.DATASET, gshape, ctx.local.dtype)
        with f.step():
            for b in blocks:
                ds.write(ctx.local, offset=b.start, copy=False)


def _lamina_read(
    ctx: Ctx, path: str, box: Box, collective: bool = False, out: np.ndarray | None = None
) -> np.ndarray:
    import lamina

    with lamina.open(path, "r", comm=ctx.comm) as f:
        return f[bl.DATASET].read(box, collective=collective, out=out)


def _expected_slab_crc(ctx: Ctx, slab: Box) -> int:
    """CRC-32C of this rank's slab of the global array, built block by block (never the whole array)."""
    from ..stats import crc

    value = 0
    n0 = ctx.local.shape[0]
    for q in range(ctx.size):
        block = Box.from_offset((q * n0, 0, 0), ctx.local.shape)
        inter = block.intersect(slab)
        if inter is None:
            continue
        data = ctx.local if q == ctx.rank else common.make_local(ctx.local.shape, q, ctx.seed)
        value = crc(
            memoryview(np.ascontiguousarray(data[inter.relative_to(block)])).cast("B"), value
        )
    return value


def setup(ctx: Ctx, families: list[str]) -> None:
    """Untimed: write the same data with every method."""
    if "numpy" in families:
        bl.numpy_write(ctx)
    if "h5py" in families:
        bl.h5py_write(ctx)
        ctx.barrier()
    if "adios2" in families:
        bl.adios2_write(ctx)
    for a in ctx.aggregators:
        _lamina_write(ctx, _lamina_path(ctx, a), a)
    ctx.barrier()
    if ctx.rank == 0:
        os.sync()
    ctx.barrier()


def build_methods(ctx: Ctx, families: list[str]) -> list[Method]:
    crc_local = common.crc_array(ctx.local)
    slab = bl.slab_box(ctx)
    want_slab = _expected_slab_crc(ctx, slab) if ctx.size > 1 else None
    names = dict(method_names(ctx.size, [str(a) for a in ctx.aggregators], families))

    def checker(name: str, expect: int, own: np.ndarray | None = None):
        def after(out, rep):
            if own is not None:  # the program's array itself holds the block, and came back
                ok = out is own and common.crc_array(own) == expect
            else:
                ok = out is not None and common.crc_array(out) == expect
            ctx.check(ok, f"{name}: the data read differs from the data written")

        return after

    # the arrays of the reads into the program's array: made once with numpy (16 bytes into
    # a page), read into at every repetition as a program reads step after step into one
    # buffer, and poisoned before each (untimed), so that a read that leaves it is caught
    owns = {n: np.empty(ctx.local.shape, ctx.local.dtype) for n, g in names.items() if g == "into"}
    runs = {
        REF: lambda: bl.numpy_read(ctx),
        ALIGNED: lambda: bl.numpy_read_aligned(ctx),
        "h5py": lambda: bl.h5py_read(ctx, ctx.box),
        "adios2 BP5": lambda: bl.adios2_read(ctx, ctx.box),
        REF_SLAB: lambda: bl.numpy_read_slab(ctx, slab),
        "h5py slabs": lambda: bl.h5py_read(ctx, slab),
        "adios2 slabs": lambda: bl.adios2_read(ctx, slab),
    }
    notes = {
        REF: "one file per rank",
        ALIGNED: "preadv into a page-aligned array (info)",
        "h5py": "one shared file",
        "adios2 BP5": "one file per rank",
        REF_SLAB: "per-rank files",
        "h5py slabs": "hyperslab",
        "adios2 slabs": "selections",
    }
    for a in ctx.aggregators:
        runs[lamina_name(a)] = (lambda p: lambda: _lamina_read(ctx, p, ctx.box))(
            _lamina_path(ctx, a)
        )
        notes[lamina_name(a)] = f"{a} subfile{'s' if a > 1 else ''}"
    big = max(ctx.aggregators)
    if REF_INTO in owns:
        runs[REF_INTO] = lambda: bl.numpy_read_into(ctx, owns[REF_INTO])
        notes[REF_INTO] = "os.preadv into the program's array"
    if H5_INTO in owns:
        runs[H5_INTO] = lambda: bl.h5py_read_direct(ctx, ctx.box, owns[H5_INTO])
        notes[H5_INTO] = "into the program's array"
    out_name = lamina_out_name(big)
    runs[out_name] = lambda: _lamina_read(ctx, _lamina_path(ctx, big), ctx.box, out=owns[out_name])
    notes[out_name] = "read(box, out=) into the program's array"
    runs[lamina_name(big, True)] = lambda: _lamina_read(ctx, _lamina_path(ctx, big), slab)
    notes[lamina_name(big, True)] = "box read"
    runs[lamina_name(big, True, True)] = lambda: _lamina_read(
        ctx, _lamina_path(ctx, big), slab, collective=True
    )
    notes[lamina_name(big, True, True)] = "read(box, collective=True)"
    ms = []
    for name, group in names.items():
        own = owns.get(name)
        ms.append(
            Method(
                name,
                name.split()[0],
                runs[name],
                prepare=None if own is None else functools.partial(own.fill, POISON),
                group=group,
                note=notes.get(name, ""),
                after=checker(name, want_slab if group == "slabs" else crc_local, own),
            )
        )
    return ms


def probe(ctx: Ctx) -> dict | None:
    """Rank 0: bytes read to open a lamina file of 8 blocks and to read one block (or less) of it."""
    import lamina

    res = None
    if ctx.rank == 0:
        path = os.path.join(ctx.dir, "probe.lam")
        n0 = ctx.local.shape[0]
        blocks = [Box.from_offset((k * n0, 0, 0), ctx.local.shape) for k in range(PROBE_BLOCKS)]
        _lamina_write(ctx, path, 1, comm=MPI.COMM_SELF, blocks=blocks)
        file_bytes = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
        dropped = common.drop_caches() if ctx.drop_caches else (os.sync() or False)
        k = PROBE_BLOCKS // 2
        sub = Box.from_offset((k * n0 + n0 // 2, 0, 0), (1, *ctx.local.shape[1:]))
        tiny = Box.from_offset(
            (k * n0 + n0 // 2, ctx.local.shape[1] // 2, 0), (1, 1, ctx.local.shape[2])
        )
        rows = []
        c0 = common.proc_io()
        c1 = common.proc_io()
        own = _delta(c0, c1)  # what reading /proc/self/io itself adds to the counters
        io0 = common.proc_io()
        f = lamina.open(path, "r", comm=MPI.COMM_SELF)
        io1 = common.proc_io()
        rows.append(
            {"what": "open (metadata)", "box": None, "box_bytes": 0, **_delta(io0, io1, own)}
        )
        ds = f[bl.DATASET]
        # the step's block table is read from the metadata when the step is first used
        t0 = common.proc_io()
        nblocks = len(ds.blocks())
        t1 = common.proc_io()
        rows.append(
            {"what": "block table of the step", "box": None, "box_bytes": 0, **_delta(t0, t1, own)}
        )
        ok = nblocks == PROBE_BLOCKS
        for what, box in (
            ("one whole block", blocks[k]),
            ("one plane of a block", sub),
            ("one row of a block", tiny),
        ):
            a0 = common.proc_io()
            got = ds.read(box)
            a1 = common.proc_io()
            ok = ok and np.array_equal(
                got, ctx.local[box.shift(tuple(-s for s in blocks[k].start)).slices]
            )
            rows.append(
                {
                    "what": what,
                    "box": [list(box.start), list(box.stop)],
                    "box_bytes": int(got.nbytes),
                    **_delta(a0, a1, own),
                }
            )
        f.close()
        common.remove(path)
        res = {
            "blocks": PROBE_BLOCKS,
            "block_bytes": ctx.nbytes,
            "file_bytes": file_bytes,
            "cache_dropped": bool(dropped),
            "rows": rows,
            "ok": ok,
        }
    ctx.barrier()
    return res


def _delta(a: dict, b: dict, own: dict | None = None) -> dict:
    """Counters from snapshot *a* to *b*, less what reading the snapshots cost (*own*; the text
    of snapshot *a* exactly, for rchar)."""
    own = own or {}
    out = {k: b.get(k, 0) - a.get(k, 0) - own.get(k, 0) for k in ("rchar", "read_bytes", "syscr")}
    if own:
        out["rchar"] = b.get("rchar", 0) - a.get("rchar", 0) - a.get("own_rchar", 0)
    return out


def worker(ctx: Ctx) -> dict:
    fams = [f for f in ctx.families if f == "numpy" or f == "lamina" or bl.available(f) is None]
    for f in ctx.families:
        if f not in fams:
            ctx.note(bl.available(f) or f)
    setup(ctx, fams)
    ctx.progress("set-up")
    rows = ctx.measure(build_methods(ctx, fams))
    pr = probe(ctx)
    ctx.progress("one-block probe")
    if ctx.rank == 0 and pr is not None and not pr["ok"]:
        print("lamina bench read: the one-block probe read wrong data", file=sys.stderr, flush=True)
        ctx.comm.Abort(3)
    return {"rows": rows, "probe": pr}


# ------------------------------------------------------------------ parent
FAMS = ("numpy", "h5py", "adios2")


def report(o: common.CommonOptions, jobs: list[dict], argv: list[str]) -> tuple[str, dict]:
    out = []
    first = jobs[0]
    cache = (
        "page cache dropped before every read"
        if first.get("drop_caches")
        else "reads from the page cache (files written just before)"
    )
    out.append(
        f"lamina bench read: 3-D float64, {fmt_bytes(first['bytes_per_rank'])} per rank "
        f"(block {tuple(first['local_shape'])}), repeat {o.repeat}, {cache}"
    )
    out.append(
        "times: open+read+close into a new array (own array rows: the program's), slowest rank; "
        "ratios: speed-up of the row over the baseline "
        "(> 1 = row faster), median over repetitions of the paired ratio, best case (min/min) in parentheses; "
        "'own array' rows read into one array the program made and reuses, and compare with "
        f"{REF_INTO} and {H5_INTO}; "
        "'axis-1 slabs' rows cut through every rank's block and compare with the slab baselines"
    )
    targets = []
    for job in jobs:
        R = job["ranks"]
        rows = {r["name"]: r for r in job["rows"]}
        total = job["bytes_per_rank"] * R
        base = {
            group: {k: rows.get(n) if n else None for k, n in zip(FAMS, names, strict=True)}
            for group, names in BASELINES.items()
        }
        hdr = [
            "method",
            "decomposition",
            "median s",
            "min s",
            "GiB/s",
            "vs numpy",
            "vs h5py",
            "vs adios2",
            "note",
        ]
        body = []
        for r in job["rows"]:
            b = base[r["group"]]
            body.append(
                [
                    r["name"],
                    DECOMPOSITION[r["group"]],
                    f"{r['median']:.3f}",
                    f"{r['min']:.3f}",
                    f"{common.gibps(total, r['median']):.2f}",
                    *(common.ratio_cell(common.speedup(b[k], r)) for k in FAMS),
                    r.get("note", ""),
                ]
            )
            if r["family"] == "lamina":
                t = {"ranks": R, "method": r["name"], "group": r["group"]}
                for k in FAMS:
                    t[f"vs_{k}"], t[f"vs_{k}_best"] = common.speedup(b[k], r)
                targets.append(t)
        out.append("")
        out.append(
            f"### {R} rank{'s' if R > 1 else ''}: {fmt_bytes(total)} in all, "
            f"global shape {tuple(job['global_shape'])}"
        )
        out.append(table(hdr, body, "llrrrrrrl"))
        for n in job.get("notes", []):
            out.append(f"note: {n}")
        if job.get("loadavg"):
            out.append(
                f"load average before/after the job: {job['loadavg'][0]:.2f} / {job['loadavg'][1]:.2f} "
                f"on {common.machine()['cpus']} CPUs"
            )
    out.append("")
    out.append("### targets")
    body = []
    for t in targets:
        v = common.ratio_cell((t["vs_numpy"], t["vs_numpy_best"]))
        if t["group"] != "slabs":
            v += f" {common.verdict(t['vs_numpy'], 0.9, best=t['vs_numpy_best'])}"
        else:
            v += " (info: vs numpy memmap)"
        body.append(
            [
                str(t["ranks"]),
                t["method"],
                v,
                common.ratio_cell((t["vs_h5py"], t["vs_h5py_best"])),
                common.ratio_cell((t["vs_adios2"], t["vs_adios2_best"])),
            ]
        )
    out.append(
        table(
            [
                "ranks",
                "lamina",
                f"vs numpy (>= 0.9x {REF}; own array: {REF_INTO})",
                "vs h5py",
                "vs adios2",
            ],
            body,
            "rllll",
        )
    )
    pr = next((j.get("probe") for j in reversed(jobs) if j.get("probe")), None)
    if pr:
        out.append("")
        out.append(
            f"### one block of a large file: {pr['blocks']} blocks of {fmt_bytes(pr['block_bytes'])}, "
            f"{fmt_bytes(pr['file_bytes'])} on disk"
            + (
                " (page cache dropped)"
                if pr["cache_dropped"]
                else " (page cache not dropped: read_bytes is 0)"
            )
        )
        body = []
        for r in pr["rows"]:
            touched = r["rchar"]
            ratio = f"{touched / r['box_bytes']:.2f}" if r["box_bytes"] else "-"
            body.append(
                [
                    r["what"],
                    f"{r['box_bytes']:,}",
                    f"{r['rchar']:,}",
                    ratio,
                    f"{r['read_bytes']:,}",
                    str(r["syscr"]),
                ]
            )
        out.append(
            table(
                [
                    "read",
                    "bytes asked",
                    "bytes read (rchar)",
                    "read / asked",
                    "read_bytes (device)",
                    "read calls",
                ],
                body,
                "lrrrrr",
            )
        )
        whole = next(r for r in pr["rows"] if r["what"] == "one whole block")
        met = whole["rchar"] == whole["box_bytes"]
        out.append(
            f"target 'one block touches only its bytes': {'met' if met else 'NOT met'} "
            f"({whole['rchar']:,} bytes read for a {whole['box_bytes']:,}-byte block of a {pr['file_bytes']:,}-byte file; "
            "parts of a block are read in whole checksum segments)"
        )
    doc = {
        "benchmark": "read",
        "options": common.options_doc(o, "read", argv),
        "jobs": jobs,
        "targets": targets,
    }
    return "\n".join(out), doc


def parser(prog: str = "lamina bench read") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Read throughput of lamina native vs numpy, h5py and ADIOS2 BP5."
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
    side = common.block_shape(o.size)[1]
    if max(o.ranks) > side:
        p.error(
            f"--size {ns.size} gives blocks of {side} rows along axis 1, too few to cut into {max(o.ranks)} slabs"
        )
    return launch.run_and_report("read", o, lambda r: steps(r, o), report, argv)
