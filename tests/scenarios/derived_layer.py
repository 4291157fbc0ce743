"""Derived quantities written by n ranks, read by m ranks, checked against numpy on the global arrays.

Run under ``mpiexec -n N python -m mpi4py derived_layer.py``::

    derived_layer.py write DIR     # write DIR/{store,stats,expression}.lam, check them with N readers,
                                   # then (N > 1) the mismatch cases in DIR/mismatch
    derived_layer.py read DIR NW   # check the files NW writer ranks wrote, with this job's ranks
    derived_layer.py mismatch DIR  # ranks that pass different derive() arguments

``write`` declares every quantity of :data:`derived_common.QUANTITIES` in
three files, one per strategy, and writes the same steps to each with the
uneven decompositions of :mod:`derived_common` (inputs cut along different
axes, a rank with two blocks, a rank with none, one-cell-thick blocks, a
step where an input is missing and another has a hole, a last step opened
implicitly by a write and committed by ``close``).  ``read`` reads every
component at every step, whole and over this rank's box of a reader
decomposition (the end of ``write``: the ``expression`` file over the box
only), and compares it with the numpy reference; the three files must give the same bits (1e-14
relative where numpy's transcendental functions are involved); block
statistics under ``store`` and ``stats`` must equal numpy's over each
block's box.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
from derived_common import (
    INPUTS,
    NSTEPS,
    QUANTITIES,
    SHAPE,
    STRATEGIES,
    check_close,
    check_stats,
    derived_names,
    my_blocks,
    references,
    written,
)
from mpi4py import MPI

import lamina
from lamina.errors import CollectiveMismatchError, ExpressionError
from lamina.geometry import Box


def log(*a) -> None:
    if MPI.COMM_WORLD.rank == 0:
        print(*a, flush=True)


def declare(f, strategy: str, late: bool) -> None:
    for q in QUANTITIES:
        if q.late == late:
            f.derive(q.name, q.expr, q.strategy or strategy, spacing=q.spacing)


def write_inputs(f, step: int, comm) -> None:
    """Independent: this rank's blocks of every input at *step*, through several write paths."""
    from derived_common import field

    for j, name in enumerate(INPUTS):
        for b in my_blocks(name, step, comm.rank, comm.size):
            v = field(name, b, step)
            how = (j + step) % 3
            if how == 0:
                f[name][b.slices] = v
            elif how == 1:
                f[name].write(v, offset=b.start)
            else:
                f[name].write(v, offset=b.start, copy=False)


def write(d: str) -> None:
    comm = MPI.COMM_WORLD
    for strategy in STRATEGIES:
        path = os.path.join(d, f"{strategy}.lam")
        f = lamina.open(path, "w", durable=False)
        for name, (dt, fill) in INPUTS.items():
            f.create_dataset(name, SHAPE, dt, fill=fill)
        declare(f, strategy, late=False)
        with f.step():
            write_inputs(f, 0, comm)
        declare(f, strategy, late=True)
        f.begin_step()
        write_inputs(f, 1, comm)
        f.end_step()
        write_inputs(f, 2, comm)  # an implicit step (not begun on the rank that writes nothing)
        f.close()  # ... computed and committed here
    comm.Barrier()
    log(f"OK write {comm.size} ranks")


def reader_box(rank: int, size: int) -> Box:
    """This rank's box of a reader decomposition (uneven, along axis 1 then 0)."""
    cuts = sorted({0, *[(3 * r + 1) % SHAPE[1] for r in range(1, size)], SHAPE[1]})
    while len(cuts) < size + 1:
        cuts.insert(-1, cuts[-2])  # empty boxes for extra ranks
    lo, hi = cuts[rank], cuts[rank + 1]
    return Box((rank % 2, lo, 0), (SHAPE[0], hi, SHAPE[2] - (rank % 3)))


def check_files(d: str, comm, full: bool = True) -> int:
    """Collective over *comm*: every derived dataset, every step; returns values compared.

    Each rank reads its box of a reader decomposition.  With *full*: the
    three files, each dataset also read whole by one of the ranks, strategies
    compared, block statistics checked; else the ``expression`` file only
    (every value recomputed from the inputs, with halos from other blocks).
    """
    names = derived_names()
    box = reader_box(comm.rank, comm.size)
    n = 0
    strategies = STRATEGIES if full else ("expression",)
    files = {s: lamina.open(os.path.join(d, f"{s}.lam"), "r", comm=comm) for s in strategies}
    try:
        for s, f in files.items():
            if f.steps != NSTEPS:
                raise AssertionError(f"{s}: {f.steps} steps, expected {NSTEPS}")
            if sorted(f.derived) != sorted(q.name for q in QUANTITIES):
                raise AssertionError(f"{s}: derived {sorted(f.derived)}")
        for step in range(NSTEPS):
            G = references(step)
            for i, name in enumerate(names):
                want = G[name]
                got = {}
                for s, f in files.items():
                    ds = f[name]
                    part = ds.read(box, step=step)
                    check_close(part, want[box.slices], f"{s} {name} step {step} box {box}")
                    got[s] = part
                    n += part.size
                    if full and i % comm.size == comm.rank and box.shape != SHAPE:
                        every = f.at(step)[name][...]
                        check_close(every, want, f"{s} {name} step {step} whole")
                        n += every.size
                # the same kernels on the same inputs: the same bits under every strategy where
                # every operation is correctly rounded (IEEE + - * / sqrt, the stencils); numpy's
                # transcendental functions may differ in the last bit between SIMD lanes
                for s in STRATEGIES[1:] if full else ():
                    if exact(name):
                        if not np.array_equal(got[s], got["store"], equal_nan=True):
                            diff = np.nanmax(np.abs(got[s].astype(float) - got["store"]))
                            raise AssertionError(
                                f"{name} step {step}: {s} differs from store by {diff}"
                            )
                    else:
                        np.testing.assert_allclose(
                            got[s], got["store"], rtol=1e-14, atol=0, equal_nan=True
                        )
                if full:
                    check_blocks(files, name, step, want)
    finally:
        for f in files.values():
            f.close()
    return n


def exact(name: str) -> bool:
    """True if the quantity of dataset *name* uses only correctly rounded operations."""
    q = next(q for q in QUANTITIES if name == q.name or name.startswith(q.name + "/"))
    return not re.search(r"\b(exp|log|sin|cos|tan|asin|acos|atan|pow)\(|\*\*|\^", q.expr)


def check_blocks(files, name: str, step: int, want: np.ndarray) -> None:
    """Blocks of derived dataset *name*: the anchor's boxes, stats as numpy's; none for 'expression'."""
    q = next(q for q in QUANTITIES if name == q.name or name.startswith(q.name + "/"))
    key = lambda b: (b.start, b.stop)  # noqa: E731
    anchor = sorted(written(q.anchor, step), key=key)
    for s, f in files.items():
        blocks = f[name].blocks(step)
        strategy = q.strategy or s
        if strategy == "expression" or (q.late and step == 0):  # nothing computed when writing
            if blocks:
                raise AssertionError(f"{s} {name} step {step}: {len(blocks)} blocks, expected none")
            continue
        if sorted((b.box for b in blocks), key=key) != anchor:
            raise AssertionError(
                f"{s} {name} step {step}: blocks {[b.box for b in blocks]}, anchor {anchor}"
            )
        for b in blocks:
            if strategy == "stats" and (b.codec != "stats-only" or b.nbytes != 0):
                raise AssertionError(f"{s} {name}: block {b.box} codec {b.codec} {b.nbytes} bytes")
            if strategy == "store" and (b.codec != "raw" or b.nbytes != b.raw_nbytes):
                raise AssertionError(f"{s} {name}: block {b.box} codec {b.codec} {b.nbytes} bytes")
            check_stats(b.stats, want[b.box.slices], f"{s} {name} step {step} block {b.box}")


def read(d: str, nwriters: int) -> None:
    comm = MPI.COMM_WORLD
    n = check_files(d, comm)
    total = comm.allreduce(n)
    log(f"OK read {comm.size} ranks of files by {nwriters} ranks: {total} values")


# ---------------------------------------------------------------------------
# different derive() arguments on different ranks
# ---------------------------------------------------------------------------


def mismatch(d: str) -> None:
    """Every rank raises CollectiveMismatchError (no hang); the file goes on; nothing committed is lost."""
    comm = MPI.COMM_WORLD
    rank = comm.rank
    cases = {
        # case -> derive(name, expression, strategy, spacing) on this rank
        "expression": ("m", "magnitude(u, v)" if rank == 0 else "u + v", "stats", None),
        "strategy": ("m", "magnitude(u, v)", "stats" if rank == 0 else "expression", None),
        "strategy2": ("m", "magnitude(u, v)", "store" if rank else "stats", None),
        "spacing": ("m", "gradient(u, 0)", "stats", 1.0 if rank == 0 else 2.0),
        "name": ("m" if rank == 0 else "n", "u * 2", "stats", None),
        "refused": ("m", "u * 2" if rank == 0 else "u * nothere", "stats", None),
    }
    if rank == 0:
        os.makedirs(d, exist_ok=True)
    comm.Barrier()
    for case, (name, expr, strategy, spacing) in cases.items():
        path = os.path.join(d, f"{case}.lam")
        f = lamina.open(path, "w", durable=False)
        for n in ("u", "v"):
            f.create_dataset(n, (6, 5, 4), "f8")
        box = Box((rank, 0, 0), (rank + 1, 5, 4))
        with f.step():
            f["u"].write(np.full(box.shape, 1.0 + rank), offset=box.start)
            f["v"].write(np.full(box.shape, 2.0), offset=box.start)
        raised = None
        try:
            f.derive(name, expr, strategy, spacing=spacing)
            with f.step():
                f["u"].write(np.full(box.shape, 3.0), offset=box.start)
                f["v"].write(np.full(box.shape, 4.0), offset=box.start)
        except (CollectiveMismatchError, ExpressionError) as e:
            raised = e
        want = ExpressionError if case == "refused" else CollectiveMismatchError
        if not isinstance(raised, want):
            raise AssertionError(
                f"case {case}: rank {rank} raised {raised!r}, expected {want.__name__}"
            )
        # nothing was declared: the file goes on, and the same declaration everywhere works
        if f.derived or "m" in f or "n" in f:
            raise AssertionError(f"case {case}: declared after the error: {f.derived} {f.keys()}")
        f.derive("ok", "u + v", "stats")
        with f.step():
            f["u"].write(np.full(box.shape, 5.0), offset=box.start)
            f["v"].write(np.full(box.shape, 6.0), offset=box.start)
        f.close()
        with lamina.open(path, "r") as g:
            if g.steps != 2:
                raise AssertionError(f"case {case}: {g.steps} steps after the mismatch")
            n = min(comm.size, 6)
            u0 = g["u"].read(Box((0, 0, 0), (n, 5, 4)), step=0)
            if not np.array_equal(u0[:, 0, 0], 1.0 + np.arange(n)):
                raise AssertionError(f"case {case}: u at step 0 reads {u0[:, 0, 0]}")
            ok = g["ok"].read(Box((0, 0, 0), (n, 5, 4)), step=1)
            ok0 = g["ok"].read(step=0)  # declared after step 0: recomputed there
            if not (ok == 11.0).all() or not np.array_equal(ok0[:n, 0, 0], 3.0 + np.arange(n)):
                raise AssertionError(f"case {case}: ok reads {ok[:, 0, 0]}")
            if g["ok"].blocks(1)[0].codec != "stats-only":
                raise AssertionError(f"case {case}: blocks of ok {g['ok'].blocks(1)}")
        comm.Barrier()
        log(
            f"OK mismatch {case}: {type(raised).__name__} on every rank: {str(raised).splitlines()[0]}"
        )


def main(argv: list[str]) -> None:
    cmd, d = argv[0], argv[1]
    if cmd == "write":
        write(d)
        n = check_files(d, MPI.COMM_WORLD, full=False)  # the rest: in the read job
        total = MPI.COMM_WORLD.allreduce(n)
        log(f"OK read back by the {MPI.COMM_WORLD.size} writer ranks: {total} values")
        if MPI.COMM_WORLD.size > 1:
            mismatch(os.path.join(d, "mismatch"))
    elif cmd == "read":
        read(d, int(argv[2]))
    elif cmd == "mismatch":
        mismatch(d)
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
