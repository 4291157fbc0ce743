"""Write, append to, or read back files of 1-D, 2-D and 3-D datasets of several dtypes.

Run under ``mpiexec -n N python -m mpi4py roundtrip.py``::

    roundtrip.py write DIR --history H [--aggregators 1,2,n] [--durable 0|1] [--extra] [--names a,b] [--memory]
                       [--msg-chunk BYTES]
    roundtrip.py read  DIR --history H --rseed R [--aggregators 1,2,n] [--extra-from K] [--names a,b]

*H* lists the writer sessions ``ranks:seed:steps,...``.  ``write`` performs
the last session of *H* (mode 'w' if it is the only one, else 'a'), whose
rank count must be the communicator size, once per aggregator count, into
``DIR/agg<A>.lam`` (``n`` means one aggregator per rank).  Each rank writes
the pieces :func:`_common.write_plan` gives it (uneven, some empty, some
split in two), with values that encode the global index and the step.
``read`` checks every step of every file with its own decomposition (a
different rank count and different cuts), so every value is compared.
``--msg-chunk`` makes the pieces members send to their aggregator that
small, so that a block travels as many pieces, several in flight, some
joined from several blocks.  ``--memory`` also runs the session through the ``memory`` engine in this
job and reads it back on a sub-communicator of fewer ranks.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from _common import (
    BIG,
    DATASETS,
    EXTRA,
    NAMES,
    check_equal,
    expected,
    log,
    parse_history,
    read_check_step,
    write_step,
)
from mpi4py import MPI

import lamina
from lamina.engines.native import engine as native_engine
from lamina.geometry import Box


def _files(args, nranks: int) -> list[tuple[int, str]]:
    out = []
    for a in args.aggregators.split(","):
        aggs = nranks if a == "n" else int(a)
        out.append((a, os.path.join(args.dir, f"agg{a}.lam"), aggs))
    return [(aggs, path) for _, path, aggs in out]


def write_session(f, comm, history, names_arg, extra: bool) -> int:
    """Collective: one writer session on open file *f*; returns cells this rank wrote."""
    nw, seed, nsteps = history[-1]
    before = sum(h[2] for h in history[:-1])
    mode = f.mode
    if f.steps != before:
        raise AssertionError(
            f"mode {mode!r}: expected {before} committed steps, file has {f.steps}"
        )
    names = list(names_arg)
    if len(history) == 1:
        for name in names:
            shape, dtype, fill, comp = DATASETS[name]
            ds = f.create_dataset(name, shape, dtype, fill=fill, compression=comp)
            if (
                ds.shape != shape
                or ds.dtype != np.dtype(dtype)
                or ds.fill != np.array(fill).astype(dtype)
            ):
                raise AssertionError(f"{name}: created {ds.shape} {ds.dtype} fill {ds.fill!r}")
        f.attrs["seed"] = seed
    else:
        for name in names:
            if name not in f:
                raise AssertionError(f"append: dataset {name!r} is missing; have {f.keys()}")
        if int(f.attrs["seed"]) != history[0][1]:
            raise AssertionError(f"append: attribute seed is {f.attrs['seed']!r}")
    for name, (shape, dtype, fill) in EXTRA.items():
        if extra and name not in f:
            f.create_dataset(name, shape, dtype, fill=fill)
        if name in f:
            names.append(name)
    cells = 0
    for i in range(nsteps):
        with f.step() as k:
            if k != before + i:
                raise AssertionError(f"step index {k}, expected {before + i}")
            cells += write_step(f, k, comm.rank, comm.size, seed, names)
        if f.steps != k + 1:
            raise AssertionError(f"after committing step {k}: f.steps = {f.steps}")
        # read your own writes: a random box of the step just committed and of the step before
        rng = np.random.default_rng([seed, k, comm.rank])
        name = names[(k + comm.rank) % len(names)]
        shape = f[name].shape
        lo = [int(rng.integers(0, s)) for s in shape]
        hi = [int(rng.integers(a + 1, s + 1)) for a, s in zip(lo, shape, strict=True)]
        box = Box(tuple(lo), tuple(hi))
        check_equal(
            f.at(k)[name][box.slices],
            expected(name, k, comm.size, seed, box),
            f"writer re-read {name} step {k}",
        )
        if k > before:
            check_equal(
                f[name].read(box, step=k - 1),
                expected(name, k - 1, comm.size, seed, box),
                f"writer re-read {name} step {k - 1}",
            )
    return cells


def read_file(f, comm, history, names_arg, rseed: int, extra_from) -> int:
    """Collective over *f*'s communicator: check every step; returns values compared."""
    total_steps = sum(h[2] for h in history)
    if f.steps != total_steps:
        raise AssertionError(f"reader: {f.steps} steps, expected {total_steps}")
    if not f.engine.writer_closed:
        raise AssertionError("reader: the writer closed the file but writer_closed is False")
    if int(f.attrs["seed"]) != history[0][1]:
        raise AssertionError(f"attribute seed is {f.attrs['seed']!r}")
    n = 0
    for k in range(total_steps):
        view = f.at(k)
        names = list(names_arg)
        if extra_from is not None:
            if k >= extra_from:
                names += list(EXTRA)
            else:
                for name, (shape, dtype, fill) in EXTRA.items():
                    if view[name].coverage() != []:
                        raise AssertionError(
                            f"{name} has blocks at step {k}, before it was written"
                        )
                    check_equal(
                        view[name][...],
                        np.full(shape, fill, dtype=dtype),
                        f"{name} at step {k} (never written)",
                    )
        n += read_check_step(view, k, history, comm.rank, comm.size, history[0][1], rseed, names)
    # negative step index and the default (latest) view
    name = names_arg[comm.rank % len(names_arg)]
    check_equal(f.at(-1)[name][...], f.at(total_steps - 1)[name][...], "f.at(-1)")
    check_equal(f[name][...], f.at(total_steps - 1)[name][...], "latest view")
    return n


def do_write(args, comm) -> None:
    history = parse_history(args.history)
    nw, seed, nsteps = history[-1]
    if nw != comm.size:
        raise SystemExit(f"history says {nw} writer ranks, running on {comm.size}")
    mode = "w" if len(history) == 1 else "a"
    names = _names(args)
    opts = {"checksum_segment": 1 << 18} if args.big else {}
    if args.msg_chunk:
        native_engine.MSG_CHUNK = args.msg_chunk  # every rank alike: members and aggregators
    cells = 0
    for aggs, path in _files(args, comm.size):
        with lamina.open(path, mode, aggregators=aggs, durable=bool(args.durable), **opts) as f:
            cells += write_session(f, comm, history, names, args.extra)
    if args.memory:
        mem = f"mem://roundtrip/{args.dir}"
        with lamina.open(mem, "w", engine="memory") as f:
            write_session(f, comm, history[-1:], names, args.extra)
        # read it back on fewer ranks than wrote it (each rank holds its own copy of the store)
        m = max(1, comm.size - 1)
        sub = comm.Split(0 if comm.rank < m else MPI.UNDEFINED, comm.rank)
        if sub != MPI.COMM_NULL:
            with lamina.open(mem, "r", comm=sub, engine="memory") as f:
                read_file(f, sub, history[-1:], names, 4242, None)
            sub.Free()
        comm.Barrier()
    total = comm.allreduce(cells)
    before = sum(h[2] for h in history[:-1])
    log(
        comm,
        f"OK wrote steps {before}..{before + nsteps - 1} with {comm.size} ranks, aggregators {args.aggregators}, {total} cells",
    )


def do_read(args, comm) -> None:
    history = parse_history(args.history)
    names = _names(args)
    n = 0
    files = _files(args, history[-1][0])
    for _, path in files:
        with lamina.open(path, "r") as f:
            n += read_file(f, comm, history, names, args.rseed, args.extra_from)
    total = comm.allreduce(n)
    log(
        comm,
        f"OK read {sum(h[2] for h in history)} steps of {len(files)} file(s) with {comm.size} ranks, {total} values compared",
    )


def _names(args) -> list[str]:
    names = args.names.split(",") if args.names else list(NAMES)
    return names + [BIG] if args.big else names


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["write", "read"])
    p.add_argument("dir")
    p.add_argument("--history", required=True)
    p.add_argument("--aggregators", default="n")
    p.add_argument("--durable", type=int, default=1)
    p.add_argument("--extra", action="store_true")
    p.add_argument("--extra-from", type=int, default=None)
    p.add_argument("--names", default=None)
    p.add_argument("--rseed", type=int, default=12345)
    p.add_argument("--memory", action="store_true")
    p.add_argument("--msg-chunk", type=int, default=0)
    p.add_argument(
        "--big", action="store_true", help="add a dataset of blocks larger than a checksum segment"
    )
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    if args.action == "write":
        do_write(args, comm)
    else:
        do_read(args, comm)


if __name__ == "__main__":
    main()
