"""``lamina bench blocks``: the cost per block of many small blocks, lamina against its baselines.

Each rank holds ``--blocks`` cubic float64 blocks of edge e (e^3 values
each) per step, laid out on a near-cubic grid of blocks
(:func:`lamina.geometry.dims_create`); the global array is the ranks'
regions stacked along axis 0.  Every block is its own contiguous array, as
in a code that owns many small patches.  For every rank count one MPI job
runs every (edge, blocks) case, and in each case times ``--repeat`` times,
order rotated between repetitions:

``numpy``   one raw file per rank: every block written with its own ``write``
            (buffered), then an index of the block corners (``.npy``)
``adios2``  ADIOS2 BP5 from PyPI, one file per rank (serial ADIOS2): one
            variable, per block ``set_selection`` and ``put`` in ``Deferred`` mode
``h5py``    one shared file, one chunk per block (chunks e^3), a step axis
            first; ranks in turn (the wheel has no parallel HDF5)
``lamina``  lamina native, one subfile per rank (``aggregators=R``),
            ``durable=False``: ``ds.write(block, offset=..., copy=False)``
            inside ``with f.step():``

Phases (each timed from a common barrier to the slowest rank's end, open
and close included):

``write``     all ``--steps`` steps of all blocks
``read-all``  this rank's whole region at every step, into one array in the
              global layout (the raw files are rearranged after the read)
``read-one``  one block of the middle step (a time per read, not per block)
``query``     the elements of this rank's region where ``u > t`` at the
              middle step, *t* chosen so that one block per rank holds
              matches: lamina ``f.query`` (block statistics prune the rest);
              ADIOS2 its per-block min/max (``blocks_info``), then reads the
              candidates; numpy and h5py read the whole region and compare

The data differ by step: at the start of each step the writers set the
first value of every block to that step's own value (one numpy assignment
per step, the same for every method), and ``read-all`` keeps those values
of every step it reads (one numpy gather per step), so that a step read in
place of another is caught.  Nobody fsyncs.  Every result is checked
(untimed) against the data written: every step's marks, the last step's
region whole.
Costs per block are the phase's time over the blocks one rank handles
(blocks per step x steps for write and read-all, blocks per step for query).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from ..geometry import Box, dims_create
from ..text import fmt_bytes, plural, table
from . import baselines as bl
from . import common, launch
from .harness import Ctx, Method

FAMILIES = ("numpy", "adios2", "h5py", "lamina", "lamina-batch")
#: lamina writing a step's blocks with one ``write_blocks`` call (write only: the file is the same)
BATCH = "lamina-batch"
PHASES = ("write", "read-all", "read-one", "query")
FLAT_FROM = 1000  # blocks per rank per step: the flatness target applies from here up
FLAT_TOL = 0.20


# ------------------------------------------------------------------ cases
def case_bytes(edge: int, blocks: int) -> int:
    """Bytes per rank per step of *blocks* blocks of edge *edge*."""
    return blocks * edge**3 * common.ITEM


def plan(edges: list[int], blocks: list[int], max_bytes: int) -> tuple[list, list]:
    """(cases to run, cases skipped for being over *max_bytes*), each a list of (edge, blocks)."""
    run, skipped = [], []
    for e in edges:
        for n in blocks:
            (run if case_bytes(e, n) <= max_bytes else skipped).append((e, n))
    return run, skipped


@dataclass
class Case:
    """One (edge, blocks) case on one rank: its blocks, where they go, what to expect."""

    edge: int
    nblocks: int
    steps: int
    dims: tuple[int, ...]
    data: np.ndarray  # (nblocks, e, e, e): block k is data[k]
    starts: list[list[int]]  # global corner of every block
    box: Box  # this rank's region of the global array
    gshape: tuple[int, ...]
    threshold: float
    one: int  # the block read by read-one
    step: int  # the step read by read-one and searched by query
    floor: np.ndarray  # every block's global number: its values lie in [floor, floor + 1)
    marks: np.ndarray  # where the first value of each block lies in this rank's region (flat)

    @classmethod
    def make(cls, edge: int, nblocks: int, steps: int, rank: int, size: int, seed: int) -> Case:
        dims = dims_create(nblocks, 3)
        region = tuple(d * edge for d in dims)
        box = Box.from_offset((rank * region[0], 0, 0), region)
        gshape = (size * region[0], *region[1:])
        corner = np.stack(np.unravel_index(np.arange(nblocks), dims), axis=1) * edge
        corner += np.asarray(box.start)
        # block k of this rank holds values in [g, g + 1), g its global block number:
        # block statistics tell the blocks apart, and only the last block passes the threshold
        first = rank * nblocks
        data = np.random.default_rng([seed, rank, edge, nblocks]).random(
            (nblocks, edge, edge, edge)
        )
        data *= 0.999
        floor = np.arange(first, first + nblocks, dtype=np.float64)
        data += floor[:, None, None, None]
        marks = np.ravel_multi_index(tuple((corner - np.asarray(box.start)).T), region)
        c = cls(
            edge,
            nblocks,
            steps,
            dims,
            data,
            corner.tolist(),
            box,
            gshape,
            first + nblocks - 1 + 0.5,
            nblocks // 2,
            steps // 2,
            floor,
            np.asarray(marks, dtype=np.intp),
        )
        c.stamp(0)
        return c

    def stamps(self, step: int) -> np.ndarray:
        """The first value of every block at *step*: its own per step, in the block's range
        and under the threshold (so the query's matches and the blocks' ranges stay as they are)."""
        return self.floor + 0.25 * step / self.steps

    def stamp(self, step: int) -> np.ndarray:
        """Set the first value of every block to *step*'s (a writer does, at the start of the
        step); the blocks."""
        self.data[:, 0, 0, 0] = self.stamps(step)
        return self.data

    def region_at(self, step: int) -> np.ndarray:
        """This rank's region as written at *step* (a copy, for the checks)."""
        out = self.region(self.stamp(step))
        return out.copy() if np.shares_memory(out, self.data) else out

    def block_at(self, k: int, step: int) -> np.ndarray:
        """Block *k* as written at *step* (a copy, for the checks)."""
        out = self.data[k].copy()
        out.reshape(-1)[0] = self.stamps(step)[k]
        return out

    def seen(self, region: np.ndarray) -> np.ndarray:
        """The first value of every block in *region* (this rank's region as read)."""
        return np.take(region, self.marks)

    @property
    def block_bytes(self) -> int:
        return self.edge**3 * common.ITEM

    def block_box(self, k: int) -> Box:
        return Box.from_offset(tuple(self.starts[k]), (self.edge,) * 3)

    def region(self, blocks: np.ndarray) -> np.ndarray:
        """Blocks (nblocks, e, e, e) in this rank's region layout (a view when possible)."""
        gx, gy, gz = self.dims
        e = self.edge
        return (
            blocks.reshape(gx, gy, gz, e, e, e).transpose(0, 3, 1, 4, 2, 5).reshape(self.box.shape)
        )

    def expected_count(self) -> int:
        return int(np.count_nonzero(self.data > self.threshold))


# ------------------------------------------------------------------ numpy
def _index_path(ctx: Ctx) -> str:
    return bl.numpy_path(ctx) + ".index.npy"


def numpy_write(ctx: Ctx, c: Case) -> None:
    blocks = list(c.data)
    with open(bl.numpy_path(ctx), "wb") as f:
        for s in range(c.steps):
            c.stamp(s)
            for b in blocks:
                f.write(b)
    np.save(_index_path(ctx), np.asarray(c.starts, dtype=np.int64))


def _numpy_step(ctx: Ctx, c: Case, f, step: int, into: np.ndarray) -> np.ndarray:
    f.seek(step * c.nblocks * c.block_bytes)
    if f.readinto(memoryview(into).cast("B")) != into.nbytes:
        raise OSError(f"{bl.numpy_path(ctx)}: short read")
    return into


def numpy_read_all(ctx: Ctx, c: Case) -> tuple[np.ndarray, list[np.ndarray]]:
    np.load(_index_path(ctx))
    out = np.empty(c.box.shape)
    buf = np.empty_like(c.data)
    seen = []
    with open(bl.numpy_path(ctx), "rb", buffering=0) as f:
        for s in range(c.steps):
            out[...] = c.region(_numpy_step(ctx, c, f, s, buf))
            seen.append(c.seen(out))
    return out, seen


def numpy_read_one(ctx: Ctx, c: Case) -> np.ndarray:
    index = np.load(_index_path(ctx))
    k = int(np.flatnonzero((index == c.starts[c.one]).all(axis=1))[0])
    out = np.empty((c.edge,) * 3)
    fd = os.open(bl.numpy_path(ctx), os.O_RDONLY)
    try:
        os.preadv(fd, [memoryview(out).cast("B")], (c.step * c.nblocks + k) * c.block_bytes)
    finally:
        os.close(fd)
    return out


def numpy_query(ctx: Ctx, c: Case) -> int:
    np.load(_index_path(ctx))
    with open(bl.numpy_path(ctx), "rb", buffering=0) as f:
        a = _numpy_step(ctx, c, f, c.step, np.empty_like(c.data))
    return int(np.count_nonzero(a > c.threshold))


# ------------------------------------------------------------------ adios2
def adios2_write(ctx: Ctx, c: Case) -> None:
    import adios2

    blocks = list(c.data)
    count = [c.edge] * 3
    ad = adios2.Adios()
    io = ad.declare_io("lamina-bench-blocks")
    io.set_engine("BP5")
    deferred = adios2.bindings.Mode.Deferred
    with adios2.Stream(io, bl.adios2_path(ctx), "w") as s:
        var = io.define_variable(bl.DATASET, blocks[0], list(c.gshape), c.starts[0], count)
        for step in range(c.steps):
            c.stamp(step)
            s.begin_step()
            for b, start in zip(blocks, c.starts, strict=True):
                var.set_selection([start, count])
                s.engine.put(var, b, deferred)
            s.end_step()


def adios2_read_all(ctx: Ctx, c: Case) -> tuple[np.ndarray, list[np.ndarray]]:
    out = np.empty(c.box.shape)
    seen = []
    with common.adios2_reader(bl.adios2_path(ctx)) as r:
        var = r.inquire_variable(bl.DATASET)
        var.set_selection([list(c.box.start), list(c.box.shape)])
        for s in range(c.steps):
            var.set_step_selection([s, 1])
            r.read_in_buffer(var, out)
            seen.append(c.seen(out))
    return out, seen


def adios2_read_one(ctx: Ctx, c: Case) -> np.ndarray:
    out = np.empty((c.edge,) * 3)
    with common.adios2_reader(bl.adios2_path(ctx)) as r:
        var = r.inquire_variable(bl.DATASET)
        var.set_selection([c.starts[c.one], [c.edge] * 3])
        var.set_step_selection([c.step, 1])
        r.read_in_buffer(var, out)
    return out


def adios2_query(ctx: Ctx, c: Case) -> int:
    """Per-block min/max from the metadata (``blocks_info``), then read the blocks that may match."""
    n = 0
    with common.adios2_reader(bl.adios2_path(ctx)) as r:
        info = r.engine.blocks_info(bl.DATASET, c.step)
        var = r.inquire_variable(bl.DATASET)
        var.set_step_selection([c.step, 1])
        for b in info:
            if float(b["Max"]) <= c.threshold:
                continue
            start = [int(x) for x in b["Start"].split(",")]
            shape = [int(x) for x in b["Count"].split(",")]
            a = np.empty(shape)
            var.set_selection([start, shape])
            r.read_in_buffer(var, a)
            n += int(np.count_nonzero(a > c.threshold))
    return n


# ------------------------------------------------------------------ h5py
def h5py_write(ctx: Ctx, c: Case) -> None:
    """Ranks in turn write their blocks, one chunk each, into one shared file."""
    import h5py

    path = bl.h5py_path(ctx)
    blocks = list(c.data)
    ctx.token_wait()
    if ctx.rank == 0:
        f = h5py.File(path, "w")
        ds = f.create_dataset(
            bl.DATASET,
            shape=(c.steps, *c.gshape),
            dtype=c.data.dtype,
            chunks=(1, *(c.edge,) * 3),
            fill_time="never",
        )
    else:
        f = h5py.File(path, "r+")
        ds = f[bl.DATASET]
    sels = [c.block_box(k).slices for k in range(c.nblocks)]
    for s in range(c.steps):
        c.stamp(s)
        for b, sel in zip(blocks, sels, strict=True):
            ds.write_direct(b, dest_sel=(s, *sel))
    f.close()
    ctx.token_pass()


def h5py_read_all(ctx: Ctx, c: Case) -> tuple[np.ndarray, list[np.ndarray]]:
    import h5py

    out = np.empty(c.box.shape)
    seen = []
    with h5py.File(bl.h5py_path(ctx), "r") as f:
        ds = f[bl.DATASET]
        for s in range(c.steps):
            ds.read_direct(out, source_sel=(s, *c.box.slices))
            seen.append(c.seen(out))
    return out, seen


def h5py_read_one(ctx: Ctx, c: Case) -> np.ndarray:
    import h5py

    with h5py.File(bl.h5py_path(ctx), "r") as f:
        return f[bl.DATASET][(c.step, *c.block_box(c.one).slices)]


def h5py_query(ctx: Ctx, c: Case) -> int:
    import h5py

    with h5py.File(bl.h5py_path(ctx), "r") as f:
        a = f[bl.DATASET][(c.step, *c.box.slices)]
    return int(np.count_nonzero(a > c.threshold))


# ------------------------------------------------------------------ lamina
def lamina_path(ctx: Ctx, family: str = "lamina") -> str:
    return os.path.join(ctx.dir, f"{family}.lam")


def lamina_write(ctx: Ctx, c: Case) -> None:
    import lamina

    blocks = list(c.data)
    with lamina.open(
        lamina_path(ctx), "w", comm=ctx.comm, aggregators=ctx.size, durable=False
    ) as f:
        ds = f.create_dataset(bl.DATASET, c.gshape, c.data.dtype)
        for s in range(c.steps):
            c.stamp(s)
            with f.step():
                for b, start in zip(blocks, c.starts, strict=True):
                    ds.write(b, offset=start, copy=False)


def lamina_batch_write(ctx: Ctx, c: Case) -> None:
    import lamina

    starts = np.array(c.starts, dtype=np.int64)
    with lamina.open(
        lamina_path(ctx, BATCH), "w", comm=ctx.comm, aggregators=ctx.size, durable=False
    ) as f:
        ds = f.create_dataset(bl.DATASET, c.gshape, c.data.dtype)
        for s in range(c.steps):
            with f.step():
                ds.write_blocks(c.stamp(s), starts, copy=False)


def lamina_read_all(
    ctx: Ctx, c: Case, family: str = "lamina"
) -> tuple[np.ndarray, list[np.ndarray]]:
    import lamina

    out = np.empty(c.box.shape)
    seen = []
    with lamina.open(lamina_path(ctx, family), "r", comm=ctx.comm) as f:
        ds = f[bl.DATASET]
        for s in range(c.steps):
            ds.read(c.box, step=s, out=out)
            seen.append(c.seen(out))
    return out, seen


def lamina_read_one(ctx: Ctx, c: Case) -> np.ndarray:
    import lamina

    with lamina.open(lamina_path(ctx), "r", comm=ctx.comm) as f:
        return f[bl.DATASET].read(c.block_box(c.one), step=c.step)


def lamina_query(ctx: Ctx, c: Case) -> int:
    import lamina

    with lamina.open(lamina_path(ctx), "r", comm=ctx.comm) as f:
        res = f.query(f"{bl.DATASET} > {c.threshold!r}", region=c.box, step=c.step)
    return int(res.count or 0)


RUNS = {
    "numpy": (numpy_write, numpy_read_all, numpy_read_one, numpy_query),
    "adios2": (adios2_write, adios2_read_all, adios2_read_one, adios2_query),
    "h5py": (h5py_write, h5py_read_all, h5py_read_one, h5py_query),
    "lamina": (lamina_write, lamina_read_all, lamina_read_one, lamina_query),
    BATCH: (lamina_batch_write, None, None, None),
}
NOTES = {
    "numpy": "file per rank, a write per block, index",
    "adios2": "BP5 file per rank, Deferred puts",
    "h5py": "one file, chunk per block, ranks in turn",
    "lamina": "native, aggregators=R, durable=False",
    BATCH: "the same, one write_blocks call per step",
}


# ------------------------------------------------------------------ worker
def _output(ctx: Ctx, family: str) -> str | None:
    """The path *family* writes on this rank (None: another rank owns the shared file)."""
    if family == "numpy":
        return bl.numpy_path(ctx)
    if family == "adios2":
        return bl.adios2_path(ctx)
    if ctx.rank != 0:
        return None
    return bl.h5py_path(ctx) if family == "h5py" else lamina_path(ctx, family)


def _remove_outputs(ctx: Ctx, families: list[str]) -> None:
    ctx.barrier()
    for fam in families:
        p = _output(ctx, fam)
        if p is not None:
            common.remove(p)
            if fam == "numpy":
                common.remove(_index_path(ctx))
    ctx.barrier()


def _read_all_check(ctx: Ctx, c: Case, fam: str):
    """The check of a read of everything *fam* wrote: every step's own, the last step whole."""
    want = c.region_at(c.steps - 1)
    marks = [c.stamps(s) for s in range(c.steps)]

    def check(out, rep) -> None:
        region, seen = out
        ctx.check(
            len(seen) == len(marks)
            and all(np.array_equal(a, b) for a, b in zip(seen, marks, strict=True)),
            f"{fam} read-all: a step's data differs from that step's",
        )
        ctx.check(np.array_equal(region, want), f"{fam} read-all: data differs")

    return check


def phase_methods(ctx: Ctx, c: Case, phase: str, families: list[str]) -> list[Method]:
    i = PHASES.index(phase)
    ms = []
    for fam in families:
        fn = RUNS[fam][i]
        if fn is None:  # a family of the write phase only
            continue
        run = functools.partial(fn, ctx, c)
        prepare = after = None
        if phase == "write":
            prepare = functools.partial(_remove_outputs, ctx, [fam])
            if RUNS[fam][PHASES.index("read-all")] is None:
                # a family of the write phase only (write_blocks): its file read back once,
                # untimed, as lamina's reads read lamina's (its times were reported unread)
                check = _read_all_check(ctx, c, fam)

                def after(out, rep, fam=fam, check=check):
                    check(lamina_read_all(ctx, c, fam), rep)

        elif phase == "read-all":
            after = _read_all_check(ctx, c, fam)

        elif phase == "read-one":
            block = c.block_at(c.one, c.step)

            def after(out, rep, fam=fam, block=block):
                ctx.check(np.array_equal(out, block), f"{fam} read-one: data differs")

        else:
            count = c.expected_count()

            def after(out, rep, fam=fam, count=count):
                ctx.check(out == count, f"{fam} query: {out} matches, expected {count}")

        ms.append(Method(fam, fam, run, prepare=prepare, after=after, note=NOTES[fam]))
    return ms


def run_case(ctx: Ctx, c: Case, families: list[str]) -> list[dict]:
    rows = []
    for phase in PHASES:
        for r in ctx.measure(phase_methods(ctx, c, phase, families)):
            rows.append({"edge": c.edge, "blocks": c.nblocks, "phase": phase, **r})
    _remove_outputs(ctx, families)
    return rows


def worker_main(argv: list[str]) -> int:
    from .. import comm as lcomm

    p = argparse.ArgumentParser(prog="python -m lamina.bench.blocks")
    p.add_argument("--cases", required=True, help="edge x blocks, comma-separated: 8x64,32x4096")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--methods", default=",".join(FAMILIES))
    p.add_argument("--dir", required=True)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--out", required=True)
    ns = p.parse_args(argv)
    comm = lcomm.world()
    families = [f for f in ns.methods.split(",") if f]
    notes = []
    for fam in list(families):
        why = bl.available(fam)
        if why:
            families.remove(fam)
            notes.append(why)
    rows = []
    for spec in ns.cases.split(","):
        e, n = (int(x) for x in spec.split("x"))
        c = Case.make(e, n, ns.steps, comm.rank, comm.size, ns.seed)
        ctx = Ctx(
            comm,
            comm.rank,
            comm.size,
            c.data,
            c.box,
            c.gshape,
            ns.dir,
            False,
            False,
            ns.repeat,
            ns.warmup,
            [comm.size],
            families,
            ns.seed,
            notes,
        )
        rows += run_case(ctx, c, families)
        del c, ctx
    if comm.rank == 0:
        with open(ns.out, "w") as f:
            json.dump({"ranks": comm.size, "rows": rows, "notes": notes}, f)
    return 0


# ------------------------------------------------------------------ parent
def per_block(row: dict) -> float:
    """Seconds per block of a row: read-one is one block; query one step; the others every step."""
    if row["phase"] == "read-one":
        return row["median"]
    n = row["blocks"] * (1 if row["phase"] == "query" else row["steps"])
    return row["median"] / n


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e6:.2f}" if x < 1e-4 else f"{x * 1e6:.1f}"


def analyse(jobs: list[dict], steps: int) -> list[dict]:
    """One entry per (ranks, phase, edge, blocks): per-block seconds by family, lamina's ratios, flatness."""
    out = []
    for job in jobs:
        R = job["ranks"]
        cells: dict = {}
        for r in job["rows"]:
            r = {**r, "steps": steps}
            cells.setdefault((r["phase"], r["edge"], r["blocks"]), {})[r["family"]] = r
        for (phase, edge, blocks), fams in cells.items():
            lam = fams.get("lamina")
            e = {
                "ranks": R,
                "phase": phase,
                "edge": edge,
                "blocks": blocks,
                "bytes_per_step": case_bytes(edge, blocks),
                "per_block": {f: per_block(r) for f, r in fams.items()},
            }
            # cost ratios lamina / baseline: paired median over repetitions (best case min/min)
            for base in ("adios2", "numpy", "h5py"):
                e[f"vs_{base}"], e[f"vs_{base}_best"] = common.speedup(lam, fams.get(base))
            e["batch_vs_adios2"], e["batch_vs_adios2_best"] = common.speedup(
                fams.get(BATCH), fams.get("adios2")
            )
            out.append(e)
    # flatness: lamina's per-block cost over its cost at the fewest blocks >= FLAT_FROM
    for e in out:
        ref = [
            x
            for x in out
            if (x["ranks"], x["phase"], x["edge"]) == (e["ranks"], e["phase"], e["edge"])
            and x["blocks"] >= FLAT_FROM
            and "lamina" in x["per_block"]
        ]
        ref.sort(key=lambda x: x["blocks"])
        e["flat"] = (
            e["per_block"]["lamina"] / ref[0]["per_block"]["lamina"]
            if ref and e["blocks"] >= FLAT_FROM and "lamina" in e["per_block"]
            else None
        )
    return out


def _worst(rows: list[dict], key: str) -> float | None:
    """The largest *key* of *rows* that have one (the worst cost ratio), None if none has."""
    vals = [x[key] for x in rows if x.get(key) is not None]
    return max(vals) if vals else None


def targets(entries: list[dict]) -> list[dict]:
    """Per (ranks, edge): write and read-all cost vs ADIOS2 (<= 1.0 at every block count), flatness."""
    out = []
    keys = sorted({(e["ranks"], e["edge"]) for e in entries})
    for R, edge in keys:
        t: dict = {"ranks": R, "edge": edge}
        for phase in ("write", "read-all"):
            mine = [x for x in entries if (x["ranks"], x["edge"], x["phase"]) == (R, edge, phase)]
            t[f"{phase}_vs_adios2"] = _worst(mine, "vs_adios2")
            t[f"{phase}_vs_adios2_best"] = _worst(mine, "vs_adios2_best")
            flat = [x["per_block"]["lamina"] for x in mine if x["flat"] is not None]
            t[f"{phase}_spread"] = max(flat) / min(flat) - 1 if len(flat) > 1 else None
            if phase == "write":  # write_blocks, written in the write phase only
                t["batch_vs_adios2"] = _worst(mine, "batch_vs_adios2")
                t["batch_vs_adios2_best"] = _worst(mine, "batch_vs_adios2_best")
        out.append(t)
    return out


TITLES = {
    "write": "write: us per block (all steps, open and close included)",
    "read-all": "read-all: us per block (this rank's region at every step)",
    "read-one": "read-one: us per read of one block (open, read, close)",
    "query": "query: us per block of the step searched (u > t, one block per rank matches)",
}


def report(o: dict, jobs: list[dict], skipped: list, argv: list[str]) -> tuple[str, dict]:
    entries = analyse(jobs, o["steps"])
    fams = [f for f in FAMILIES if any(f in e["per_block"] for e in entries)]
    out = [
        f"lamina bench blocks: cubic float64 blocks, {plural(o['steps'], 'step')}, repeat {o['repeat']}, "
        "page cache (nobody fsyncs), medians over repetitions, slowest rank",
        "per block = phase time / blocks one rank handles; ratios: lamina's cost over the baseline's "
        "(< 1 = lamina cheaper), paired median (best case min/min in parentheses); "
        f"flat = lamina's per-block cost over its cost at the fewest blocks >= {FLAT_FROM:,} (same ranks, edge)",
    ]
    hdr = [
        "ranks",
        "edge",
        "blocks/rank/step",
        "bytes/rank/step",
        *fams,
        "lamina/adios2",
        "lamina/numpy",
        "flat",
    ]
    batch = BATCH in fams
    for phase in PHASES:
        body = []
        cols = [f for f in fams if phase == "write" or f != BATCH]
        for e in (x for x in entries if x["phase"] == phase):
            pb = e["per_block"]
            row = [
                str(e["ranks"]),
                str(e["edge"]),
                f"{e['blocks']:,}",
                fmt_bytes(e["bytes_per_step"]),
                *(_us(pb.get(f)) for f in cols),
                common.ratio_cell((e["vs_adios2"], e["vs_adios2_best"])),
            ]
            if batch and phase == "write":
                row.append(common.ratio_cell((e["batch_vs_adios2"], e["batch_vs_adios2_best"])))
            row += [
                common.ratio_cell((e["vs_numpy"], e["vs_numpy_best"])),
                "-" if e["flat"] is None else f"{e['flat']:.2f}",
            ]
            body.append(row)
        h = [x for x in hdr if x in cols or x not in fams]
        if batch and phase == "write":
            h.insert(h.index("lamina/adios2") + 1, "batch/adios2")
        out.append("")
        out.append(f"### {TITLES[phase]}")
        out.append(table(h, body, "r" * len(h)))
    if skipped:
        out.append(
            f"skipped (over --max-bytes {fmt_bytes(o['max_bytes'])} per rank per step): "
            + ", ".join(f"edge {e} x {n:,} blocks" for e, n in skipped)
        )
    for job in jobs:
        for n in job.get("notes", []):
            out.append(f"note ({job['ranks']} ranks): {n}")
        if job.get("loadavg"):
            out.append(
                f"load average before/after the {job['ranks']}-rank job: "
                f"{job['loadavg'][0]:.2f} / {job['loadavg'][1]:.2f} on {common.machine()['cpus']} CPUs"
            )
    ts = targets(entries)
    body = []
    for t in ts:

        def vs(key: str, t=t) -> str:
            v, b = t.get(key), t.get(f"{key}_best")
            if v is None:
                return "n/a"
            return (
                f"{common.ratio_cell((v, b))} "
                f"{common.verdict(v, 1.0, higher_is_better=False, best=b)}"
            )

        def flat(phase: str, t=t) -> str:
            v = t[f"{phase}_spread"]
            if v is None:
                return f"n/a (fewer than 2 block counts >= {FLAT_FROM:,})"
            return f"{100 * v:.0f}% {common.verdict(v, FLAT_TOL, higher_is_better=False)}"

        body.append(
            [
                str(t["ranks"]),
                str(t["edge"]),
                vs("write_vs_adios2"),
                vs("batch_vs_adios2"),
                vs("read-all_vs_adios2"),
                flat("write"),
                flat("read-all"),
            ]
        )
    out.append("")
    out.append("### targets")
    out.append(
        table(
            [
                "ranks",
                "edge",
                "write vs adios2 (<= 1.0x, worst)",
                "write_blocks vs adios2 (<= 1.0x, worst)",
                "read-all vs adios2 (<= 1.0x, worst)",
                f"write flat (max/min - 1 <= {FLAT_TOL:.0%})",
                f"read-all flat (<= {FLAT_TOL:.0%})",
            ],
            body,
            "rrlllll",
        )
    )
    out.append(
        "worst = the largest lamina/adios2 cost ratio over the block counts of that edge "
        "(write: a write per block; write_blocks: one call per step); "
        f"flat = spread of lamina's per-block cost over the block counts >= {FLAT_FROM:,}"
    )
    doc = {
        "benchmark": "blocks",
        "options": {
            **o,
            "machine": common.machine(),
            "command": "lamina bench blocks " + " ".join(argv),
        },
        "skipped": [{"edge": e, "blocks": n} for e, n in skipped],
        "jobs": jobs,
        "entries": entries,
        "targets": ts,
    }
    return "\n".join(out), doc


def parser(prog: str = "lamina bench blocks") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Cost per block of many small blocks: numpy, ADIOS2 BP5, h5py chunked and lamina.",
    )
    p.add_argument("--edges", default="4,8,16,32,64", help="block edges (default 4,8,16,32,64)")
    p.add_argument(
        "--blocks",
        default="64,512,4096,32768,65536",
        help="blocks per rank per step (default 64,512,4096,32768,65536)",
    )
    p.add_argument("--ranks", default="1,2,4", help="rank counts, one MPI job each (default 1,2,4)")
    p.add_argument("--steps", type=int, default=3, help="steps written (default 3)")
    p.add_argument("--repeat", type=int, default=3, help="timed repetitions (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    p.add_argument(
        "--max-bytes",
        default="256MiB",
        help="skip cases over this many bytes per rank per step (default 256MiB)",
    )
    p.add_argument(
        "--methods",
        default=",".join(FAMILIES),
        help=f"method families (default {','.join(FAMILIES)}; lamina always runs)",
    )
    common.add_job_arguments(p)
    return p


def main(argv: list[str]) -> int:
    p = parser()
    ns = p.parse_args(argv)
    try:
        edges = common.parse_int_list(ns.edges, "--edges")
        nblocks = common.parse_int_list(ns.blocks, "--blocks")
        ranks = common.parse_ranks(ns.ranks)
        max_bytes = common.parse_size(ns.max_bytes)
        methods = common.parse_choices(ns.methods, "--methods", FAMILIES)
        if ns.steps < 1 or ns.repeat < 1 or ns.warmup < 0:
            raise ValueError("--steps and --repeat must be at least 1, --warmup at least 0")
    except ValueError as e:
        p.error(str(e))
    methods = [f for f in FAMILIES if f in methods or f == "lamina"]
    cases, skipped = plan(edges, nblocks, max_bytes)
    if not cases:
        p.error(f"every case is over --max-bytes {ns.max_bytes}")
    e, n = max(cases, key=lambda c: case_bytes(*c))  # every rank's blocks of it, at once
    try:
        common.check_memory(
            case_bytes(e, n) * max(ranks),
            f"{n} blocks of edge {e} on {max(ranks)} ranks",
            max(ranks),
        )
        common.check_disk(  # one method's file of that case, at least
            case_bytes(e, n) * max(ranks) * ns.steps,
            ns.dir,
            f"--steps {ns.steps} of {n} blocks of edge {e} on {max(ranks)} ranks",
        )
    except ValueError as err:
        p.error(str(err))
    o = {
        "edges": edges,
        "blocks": nblocks,
        "ranks": ranks,
        "steps": ns.steps,
        "repeat": ns.repeat,
        "warmup": ns.warmup,
        "max_bytes": max_bytes,
        "methods": methods,
    }
    reps = ns.repeat + ns.warmup
    timeout = ns.timeout
    if timeout is None:  # generous: 50 us per block and 20 s per GiB, per method, phase, repetition
        work = sum(
            n * ns.steps * 50e-6 + case_bytes(e, n) * ns.steps * 20 / common.GiB for e, n in cases
        )
        timeout = 120 + work * len(methods) * len(PHASES) * reps * max(ranks)
    args = [
        "--cases",
        ",".join(f"{e}x{n}" for e, n in cases),
        "--steps",
        str(ns.steps),
        "--repeat",
        str(ns.repeat),
        "--warmup",
        str(ns.warmup),
        "--methods",
        ",".join(methods),
        "--seed",
        str(ns.seed),
    ]
    own = ns.dir is None
    base = tempfile.mkdtemp(prefix="lamina-bench-blocks-") if own else os.path.abspath(ns.dir)
    os.makedirs(base, exist_ok=True)
    per_job = len(cases) * len(PHASES) * (ns.warmup + ns.repeat * len(methods))
    bar = launch.make_bar(per_job * len(ranks), "bench blocks")
    jobs = []
    try:
        for r in ranks:
            d = os.path.join(base, f"blocks-np{r}")
            os.makedirs(d, exist_ok=True)
            try:
                jobs.append(
                    launch.run_job(
                        r, [*args, "--dir", d], bar, timeout, module="lamina.bench.blocks"
                    )
                )
            finally:
                common.remove(d)
    except (RuntimeError, FileNotFoundError) as e:
        print(f"lamina bench blocks: {e}", file=sys.stderr)
        return 1
    finally:
        bar.close()
        if own:
            common.remove(base)
    text, doc = report(o, jobs, skipped, argv)
    common.emit(ns.json, text, doc)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
