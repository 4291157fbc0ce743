"""The two MPI programs of the demo: the simulation that writes, the analysis that reads back.

Both are collective over the communicator they are given and use only the
public lamina API.  Each returns, on rank 0, a JSON-able dict of what it
measured (None on the other ranks); the report is built from those.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence

import numpy as np

import lamina

from .. import comm as comm_mod
from ..geometry import Box, decompose, dims_create, prime_factors
from . import simulation as sim

GROUP = "flame"
#: the speed |v| kept three ways, to compare what a query reads under each strategy
SPEED = {strategy: f"{GROUP}/speed_{strategy}" for strategy in ("store", "stats", "expression")}
#: the vorticity, a vector (group with x, y, z), statistics only
VORTICITY = f"{GROUP}/vorticity"
#: the demo writes files that another program reads back
ENGINE = "native"
TITLE = "lamina demo: analytic 3-D premixed flame"


def dataset_path(name: str) -> str:
    return f"{GROUP}/{name}"


#: automatic block count: blocks of at least this many cells (16^3, 32 KiB of float64) ...
MIN_BLOCK_CELLS = 16**3
#: ... and at most this many blocks per rank and dataset
MAX_AUTO_BLOCKS = 32


def auto_blocks(shape: Sequence[int], nranks: int) -> int:
    """Blocks per writer rank when not given: a power of two, blocks of >= 16^3 cells, at most 32."""
    per_rank = math.prod(shape) // max(1, nranks)
    n = 1
    while n * 2 <= MAX_AUTO_BLOCKS and per_rank // (n * 2) >= MIN_BLOCK_CELLS:
        n *= 2
    return n


def writer_blocks(shape: Sequence[int], nranks: int, rank: int, blocks_per_rank: int) -> list[Box]:
    """The blocks one writer rank owns: its box of a 3-D decomposition, split again.

    Real codes hold several patches per rank; more, smaller blocks also make
    the per-block statistics show where the flame is.
    """
    mine = decompose(shape, nranks)[rank]
    if mine.empty:
        return []
    n = max(1, min(blocks_per_rank, mine.size))
    subs = decompose(mine.shape, n, dims=_cubic_dims(mine.shape, n))
    return [b.shift(mine.start) for b in subs if not b.empty]


def _cubic_dims(shape: Sequence[int], n: int) -> tuple[int, ...]:
    """Split counts per dimension with product *n* that make the blocks as close to cubes as possible."""
    dims = [1] * len(shape)
    for p in sorted(prime_factors(n), reverse=True):
        d = max(range(len(shape)), key=lambda i: (shape[i] / dims[i], -i))
        dims[d] *= p
    return tuple(dims)


def _max_over(comm, seconds: float) -> float:
    return comm_mod.allreduce_int(comm, int(seconds * 1e9), "max") / 1e9


def _sum_over(comm, n: int) -> int:
    return comm_mod.allreduce_int(comm, int(n), "sum")


def _dir_size(path: str) -> tuple[int, int]:
    """(bytes, number of data subfiles) of a native ``.lam`` directory (0, 0 for others)."""
    total = nsub = 0
    if os.path.isdir(path):
        for entry in os.scandir(path):
            if entry.is_file():
                total += entry.stat().st_size
                nsub += entry.name.startswith("data.")
    return total, nsub


# --------------------------------------------------------------------------- writer


def write(
    path: str,
    comm,
    shape: Sequence[int],
    steps: int,
    blocks_per_rank: int = 32,
    aggregators: int | None = None,
    durable: bool = True,
) -> dict | None:
    """Collective over *comm*: run the simulation for *steps* steps and write every field.

    Returns the writer's measurements on rank 0, None elsewhere.
    """
    shape = tuple(int(n) for n in shape)
    rank, size = comm.rank, comm.size
    dt = sim.time_step(shape, steps)
    blocks = writer_blocks(shape, size, rank, blocks_per_rank)
    options: dict = {"durable": durable}
    if aggregators:
        options["aggregators"] = min(int(aggregators), size)

    comm_mod.barrier(comm)
    t_open = time.perf_counter()
    f = lamina.open(path, "w", comm=comm, engine=ENGINE, **options)
    with f:
        f.attrs["title"] = TITLE
        f.attrs["grid_shape"] = np.array(shape, dtype=np.int64)
        f.attrs["grid_spacing"] = sim.H
        f.attrs["dt"] = dt
        f.attrs["T_unburnt"] = sim.T_U
        f.attrs["T_burnt"] = sim.T_B
        f.attrs["fields"] = list(sim.FIELDS)
        dsets = {}
        for name, unit in sim.FIELDS.items():
            ds = f.create_dataset(dataset_path(name), shape, "f8")
            ds.attrs["units"] = unit
            ds.attrs["dims"] = list(sim.AXES)  # dimension names for xarray (docs/xarray.md)
            dsets[name] = ds
        vel = ", ".join(f"`{dataset_path(c)}`" for c in ("vx", "vy", "vz"))
        for strategy, name in SPEED.items():
            f.derive(name, f"magnitude({vel})", strategy=strategy)
        f.derive(VORTICITY, f"curl({vel})", strategy="stats", spacing=sim.H)
        tds = f.create_dataset("time", (), "f8")
        tds.attrs["units"] = "s"
        open_s = time.perf_counter() - t_open

        compute_s = io_s = 0.0
        nbytes = 0
        for k in range(steps):
            t = sim.step_time(k, dt)
            c0 = time.perf_counter()
            data = [(b, sim.fields(b, shape, t)) for b in blocks]
            compute_s += time.perf_counter() - c0
            comm_mod.barrier(comm)
            w0 = time.perf_counter()
            with f.step():
                for b, values in data:
                    for name in sim.FIELDS:
                        dsets[name].write(values[name], offset=b.start, copy=False)
                        nbytes += values[name].nbytes
                if rank == 0:
                    tds[()] = t
            io_s += time.perf_counter() - w0
            del data
        c0 = time.perf_counter()
    close_s = time.perf_counter() - c0

    res = {
        "ranks": size,
        "steps": steps,
        "shape": list(shape),
        "dtype": "float64",
        "datasets": [dataset_path(n) for n in sim.FIELDS],
        "blocks_per_rank": blocks_per_rank,
        "aggregators": options.get("aggregators", size),
        "durable": durable,
        "bytes": _sum_over(comm, nbytes),
        "write_s": _max_over(comm, io_s),
        "compute_s": _max_over(comm, compute_s),
        "open_s": _max_over(comm, open_s),
        "close_s": _max_over(comm, close_s),
        "decomposition": list(process_grid(shape, size)),
    }
    if rank != 0:
        return None
    res["disk_bytes"], res["subfiles"] = _dir_size(path)
    return res


def process_grid(shape: Sequence[int], nparts: int) -> tuple[int, ...]:
    """The process grid that :func:`lamina.geometry.decompose` uses for *nparts* parts of *shape*.

    Like decompose: the largest factors of dims_create go to the longest dimensions.
    """
    dims = dims_create(nparts, len(shape))
    out = [1] * len(shape)
    for d, f in zip(sorted(range(len(shape)), key=lambda d: -shape[d]), dims, strict=True):
        out[d] = f
    return tuple(out)


# --------------------------------------------------------------------------- reader


def read(path: str, comm, max_errors: int = 5) -> dict | None:
    """Collective over *comm*: read every step of every field, check it against the simulation.

    Everything the check needs (grid, time of each step) comes from the file;
    the values are compared bit for bit with :func:`simulation.fields` for
    this rank's box, and the per-block statistics in the file's metadata with
    statistics recomputed from the simulation.  Returns, on rank 0, the
    measurements, the verdict and a per-step summary of the blocks of T.
    """
    rank, size = comm.rank, comm.size
    errors: list[str] = []
    values_checked = mismatched = blocks_checked = 0

    def fail(msg: str) -> None:
        if len(errors) < max_errors:
            errors.append(f"reader rank {rank}: {msg}")

    comm_mod.barrier(comm)
    t_open = time.perf_counter()
    f = lamina.open(path, "r", comm=comm, engine=ENGINE)
    with f:
        open_s = time.perf_counter() - t_open
        steps = f.steps
        names = [dataset_path(n) for n in sim.FIELDS]
        missing = [n for n in [*names, "time"] if n not in f]
        if missing:
            raise lamina.NotFoundError(f"{path}: the demo datasets {missing} are missing")
        shape = f[names[0]].shape
        dt = float(f.attrs["dt"])
        if tuple(int(n) for n in np.ravel(f.attrs["grid_shape"])) != shape:
            fail(f"attribute grid_shape {f.attrs['grid_shape']} != dataset shape {shape}")
        if f.attrs["title"] != TITLE:
            fail(f"attribute title is {f.attrs['title']!r}")
        for name, unit in sim.FIELDS.items():
            if f[dataset_path(name)].attrs["units"] != unit:
                fail(
                    f"{dataset_path(name)} has units {f[dataset_path(name)].attrs['units']!r}, expected {unit!r}"
                )
        box = decompose(shape, size)[rank]
        read_s = 0.0
        nbytes = blocks_total = stored_bytes = 0
        per_step = []
        for k in range(steps):
            view = f.at(k)
            t = float(view["time"][()])
            if t != sim.step_time(k, dt):
                fail(f"step {k}: time {t!r} != {k} * dt = {sim.step_time(k, dt)!r}")
            got = {}
            r0 = time.perf_counter()
            for n in names:
                got[n] = view[n].read(box)
            read_s += time.perf_counter() - r0
            expected = sim.fields(box, shape, t)
            for name in sim.FIELDS:
                a, e = got[dataset_path(name)], expected[name]
                nbytes += a.nbytes
                values_checked += a.size
                if not np.array_equal(a, e):
                    bad = np.argwhere(a != e)
                    mismatched += len(bad)
                    i = tuple(int(v) + o for v, o in zip(bad[0], box.start, strict=True))
                    fail(
                        f"step {k}: {name}{list(i)} = {a[tuple(bad[0])]!r}, expected "
                        f"{e[tuple(bad[0])]!r} ({len(bad)} of {a.size} values differ)"
                    )
            del got, expected
            infos = {n: view[n].blocks() for n in names}
            blocks_total += sum(len(bl) for bl in infos.values())
            stored_bytes += sum(b.nbytes for bl in infos.values() for b in bl)
            blocks_checked += _check_block_stats(infos, shape, t, k, rank, size, fail)
            if rank == 0:
                per_step.append(_summarize_T(infos[dataset_path("T")], k, t, shape))

        derived = _check_derived(f, shape, dt, box, rank, fail) if steps else {}
        stats_blocks = 0  # blocks of derived quantities of which only the statistics are kept
        for d in f.derived.values():  # data of derived quantities kept with the store strategy
            for c in d.components:
                for k in range(steps):
                    for b in f[c].blocks(k):
                        if b.codec == "stats-only":
                            stats_blocks += 1
                        else:
                            blocks_total += 1
                            stored_bytes += b.nbytes

        res = {
            "ranks": size,
            "steps": steps,
            "shape": list(shape),
            "derived": derived,
            "bytes": _sum_over(comm, nbytes),
            "read_s": _max_over(comm, read_s),
            "open_s": _max_over(comm, open_s),
            "values_checked": _sum_over(comm, values_checked),
            "mismatched": _sum_over(comm, mismatched),
            "blocks_checked": _sum_over(comm, blocks_checked),
            "decomposition": list(process_grid(shape, size)),
            "blocks_total": blocks_total,
            "stored_bytes": stored_bytes,
            "stats_blocks": stats_blocks,
        }
    gathered = comm_mod.gather_bytes(comm, "\n".join(errors).encode())
    if rank != 0:
        return None
    all_errors = [e for raw in gathered or [] for e in raw.decode().splitlines() if e]
    res["errors"] = all_errors[: max_errors * 2]
    res["n_errors"] = len(all_errors)
    res["per_step"] = per_step
    res["ok"] = (
        not all_errors
        and res["mismatched"] == 0
        and res["values_checked"] == res["steps"] * len(names) * math.prod(shape)
    )
    return res


def _check_derived(f, shape, dt: float, box: Box, rank: int, fail) -> dict:
    """At the last step: derived values against numpy, and "T where the speed is low" under each strategy.

    Every rank checks the speed over its own box; rank 0 checks the
    vorticity over the whole grid against ``numpy.gradient`` of the global
    fields and runs the query once per strategy.  Returns rank 0's findings.
    """
    k = f.steps - 1
    view = f.at(k)
    t = sim.step_time(k, dt)
    e = sim.fields(box, shape, t)
    speed = np.sqrt(e["vx"] ** 2 + e["vy"] ** 2 + e["vz"] ** 2)
    for strategy, name in SPEED.items():
        got = view[name].read(box)
        if not np.allclose(got, speed, rtol=1e-14, atol=0):
            fail(
                f"step {k}: {name} ({strategy}) differs from |v| by up to {np.abs(got - speed).max():.3g}"
            )
    if rank != 0:
        return {}
    g = sim.fields(Box.from_shape(shape), shape, t)

    def d(a, axis):
        return np.gradient(g[a], sim.H, axis=axis, edge_order=2)

    expected = {
        "x": d("vz", 1) - d("vy", 2),
        "y": d("vx", 2) - d("vz", 0),
        "z": d("vy", 0) - d("vx", 1),
    }
    worst = 0.0
    for c, ref in expected.items():
        got = view[f"{VORTICITY}/{c}"][...]
        scale = float(np.abs(ref).max()) or 1.0
        worst = max(worst, float(np.abs(got - ref).max()) / scale)
    if worst > 1e-12:
        fail(
            f"step {k}: vorticity differs from numpy.gradient(edge_order=2) by {worst:.3g} (relative)"
        )
    # "temperature where the speed is low": a threshold a quarter of the way up the speed range
    lo = min(b.stats.min for b in view[SPEED["stats"]].blocks())
    hi = max(b.stats.max for b in view[SPEED["stats"]].blocks())
    threshold = lo + 0.25 * (hi - lo)
    queries = {}
    for strategy, name in SPEED.items():
        t0 = time.perf_counter()
        res = view.query(f"`{name}` < {threshold!r}", select=[dataset_path("T")])
        seconds = time.perf_counter() - t0
        queries[strategy] = {
            "units": res.units,
            "candidates": len(res.candidates),
            "candidate_bytes": res.candidate_bytes_read,
            "exact_bytes": res.exact_bytes_read,
            "matches": res.count,
            "mean_T": float(res.values[dataset_path("T")].mean()) if res.count else float("nan"),
            "seconds": seconds,
        }
    counts = {q["matches"] for q in queries.values()}
    if len(counts) != 1:
        fail(f"step {k}: the speed query found {sorted(counts)} matches under the three strategies")
    return {
        "step": k,
        "vorticity_error": worst,
        "threshold": threshold,
        "field_bytes": math.prod(shape) * 8,
        "queries": queries,
    }


def _check_block_stats(infos: dict, shape, t: float, k: int, rank: int, size: int, fail) -> int:
    """Compare the metadata statistics of the blocks (round robin over ranks) with the simulation."""
    boxes = sorted({b.box for bl in infos.values() for b in bl}, key=lambda b: b.start)
    covered = sum(b.box.size for b in infos[next(iter(infos))])
    if covered != math.prod(shape):
        fail(f"step {k}: blocks cover {covered} of {math.prod(shape)} cells")
    by_box = {n: {b.box: b for b in bl} for n, bl in infos.items()}
    checked = 0
    for i, box in enumerate(boxes):
        if i % size != rank:
            continue
        expected = sim.fields(box, shape, t)
        for name, e in expected.items():
            info = by_box[dataset_path(name)].get(box)
            if info is None:
                fail(f"step {k}: {name} has no block {box}")
                continue
            st = info.stats
            checked += 1
            if st is None:
                fail(f"step {k}: {name} block {box} has no statistics")
            elif (
                st.min != e.min()
                or st.max != e.max()
                or st.count != e.size
                or not math.isclose(st.sum, float(e.sum()), rel_tol=1e-9, abs_tol=1e-9 * e.size)
            ):
                fail(
                    f"step {k}: {name} block {box}: stats {st} != min {e.min()!r} max {e.max()!r} "
                    f"sum {float(e.sum())!r} count {e.size}"
                )
    return checked


def _summarize_T(blocks, k: int, t: float, shape) -> dict:
    """Per-step picture of T from block statistics alone: where is the flame, what would a query read."""
    kinds = {"fresh": 0, "front": 0, "burnt": 0}
    hot_blocks = hot_bytes = all_bytes = 0
    for b in blocks:
        kinds[sim.classify_T(b.stats.min, b.stats.max)] += 1
        all_bytes += b.nbytes
        if b.stats.max > 1000.0:
            hot_blocks += 1
            hot_bytes += b.nbytes
    front_z = sim.front_position(shape, t) / sim.H  # in cells
    return {
        "step": k,
        "time": t,
        "blocks": len(blocks),
        **kinds,
        "front_cell": front_z,
        "query_blocks": hot_blocks,
        "query_bytes": hot_bytes,
        "bytes": all_bytes,
        "mean_T": sum(b.stats.sum for b in blocks) / max(1, sum(b.stats.count for b in blocks)),
    }
