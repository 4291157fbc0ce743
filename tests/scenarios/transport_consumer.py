"""A consumer program: reads and checks every value of the benchmark datasets, step by step.

    transport_consumer.py NAME[,NAME...] STEPS [--relay OUT]

With one name it follows the steps with ``iter_steps``; with several (fan-in)
it waits for each step of each name in turn.  With ``--relay OUT`` it also
writes what it read of each step to ``OUT`` through its own decomposition
(the middle of a chain).  Under ``LAMINA_TRANSPORT=file`` the names are files
that may not exist yet when this starts: it retries ``open``.
"""

from __future__ import annotations

import argparse
import time

from mpi4py import MPI
from transport_common import FIELD, GRID, NPART, check_step, cuts, define, say

import lamina
from lamina.errors import LaminaError
from lamina.geometry import Box


def open_when_ready(path: str, comm, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return lamina.open(path, "r")
        except (OSError, LaminaError) as e:  # a file not created yet (file transport)
            if comm.allreduce(int(time.monotonic() > deadline), op=MPI.MAX):
                raise TimeoutError(f"{path} did not become readable in {timeout} s: {e}") from e
        time.sleep(0.05)


def relay_step(out, view, k: int, rank: int, size: int) -> None:
    """Write step *k* of *view* to *out* with this task's own (uneven) decomposition."""
    with out.step():
        a, b = cuts(GRID[0], [r % 2 + 1 for r in range(size)])[rank]
        out["grid"][a:b] = view["grid"][a:b]
        a, b = cuts(NPART, [1] * size)[rank]
        out["particles"][a:b] = view["particles"][a:b]
        a, b = cuts(FIELD[1], [size - r for r in range(size)])[rank]
        box = Box((0, a, 0), (FIELD[0], b, FIELD[2]))
        out["fields/z"][box.slices] = view["fields/z"][box.slices]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("names")
    p.add_argument("steps", type=int)
    p.add_argument("--relay")
    args = p.parse_args()
    names = args.names.split(",")
    files = [open_when_ready(n, lamina.comm.task_comm()) for n in names]
    comm = files[0].comm
    rank, size = comm.rank, comm.size
    out = lamina.open(args.relay, "w") if args.relay else None
    if out is not None:
        define(out, args.steps)
    compared = 0
    seen = 0
    if len(files) == 1:
        for view in files[0].iter_steps(timeout=60):
            if view.index != seen:
                raise AssertionError(f"step {view.index}, expected {seen}")
            compared += check_step(view, view.index, rank, size)
            if out is not None:
                relay_step(out, view, view.index, rank, size)
            seen += 1
    else:
        for k in range(args.steps):
            for f in files:
                compared += check_step(f.wait_for_step(k, timeout=60), k, rank, size)
            seen += 1
    if seen != args.steps:
        raise AssertionError(f"saw {seen} steps, expected {args.steps}")
    engines = sorted({f.engine.name for f in files})
    moved = comm.allreduce(sum(f.engine.bytes_read for f in files))
    for f in files:
        f.close()
    if out is not None:
        out.close()
    total = comm.allreduce(compared)
    if rank == 0:
        say(
            f"OK consumer {args.names}: {seen} steps on {size} ranks ({engines}), {total} values "
            f"compared, {moved} bytes read"
        )


if __name__ == "__main__":
    main()
