"""A reader following a writer: two separate mpiexec jobs started at the same time.

    follow.py write PATH --history H [--wait]      (writer ranks = last session of H)
    follow.py read  PATH --history H [--after-open]

*H* lists writer sessions ``ranks:seed:steps,...`` as in ``roundtrip.py``;
``write`` performs the last one (mode 'w' if it is the only one, else 'a').

The reader may start before the file exists: it retries ``open`` until it
succeeds.  It then consumes ``f.iter_steps(timeout=...)`` and checks every
value of every step as it arrives, through its own uneven decomposition,
and creates a marker file ``PATH.seen<k>`` for each step *k* it has checked.
With ``--wait`` the writer, after the first step of its session, waits
until the reader has seen that step, then writes the rest with short
pauses: so the reader really follows a live file rather than reading a
finished one, and the reader checks that it saw steps before the writer
closed.  The writer also creates ``PATH.opened`` once the file is open;
with ``--after-open`` the reader waits for it before opening (used to
follow an *appending* writer that has opened the file but not yet
committed anything).
"""

from __future__ import annotations

import argparse
import os
import time

from _common import DATASETS, log, parse_history, read_check_step, wait_for, write_step
from mpi4py import MPI

import lamina
from lamina.errors import LaminaError

NAMES = ["d1/c128", "d2/f32", "d2/bool", "d3/i64"]
TIMEOUT = 30.0


def seen_marker(path: str, k: int) -> str:
    return f"{path}.seen{k}"


def wait_all(comm, cond, timeout: float, what: str) -> None:
    """Collective: rank 0 waits for *cond*; every rank fails if it times out."""
    ok = 1
    if comm.rank == 0:
        try:
            wait_for(cond, timeout, what)
        except TimeoutError:
            ok = 0
    if not comm.bcast(ok, root=0):
        raise SystemExit(f"timed out waiting for {what}")


def write(args, comm) -> None:
    history = parse_history(args.history)
    nw, seed, nsteps = history[-1]
    assert nw == comm.size, (nw, comm.size)
    before = sum(h[2] for h in history[:-1])
    mode = "w" if len(history) == 1 else "a"
    path = args.path
    with lamina.open(path, mode, aggregators=max(1, comm.size // 2)) as f:
        if f.steps != before:
            raise AssertionError(f"{f.steps} steps at open, expected {before}")
        if comm.rank == 0:
            with open(f"{path}.opened.{len(history)}", "w") as m:  # one marker per writer session
                m.write("open\n")
        if mode == "w":
            for name in NAMES:
                shape, dtype, fill, comp = DATASETS[name]
                f.create_dataset(name, shape, dtype, fill=fill, compression=comp)
        elif args.wait:
            time.sleep(0.3)  # a reader may open now: the file is being appended to, nothing new yet
        for k in range(before, before + nsteps):
            with f.step() as s:
                assert s == k
                write_step(f, k, comm.rank, comm.size, seed, NAMES)
            if args.wait and k == before:
                wait_all(
                    comm,
                    lambda k=k: os.path.exists(seen_marker(path, k)),
                    60,
                    f"the reader to see step {k}",
                )
            elif args.wait:
                time.sleep(0.05)
    log(comm, f"OK writer: steps {before}..{before + nsteps - 1} with {comm.size} ranks")


def open_when_ready(path: str, comm, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return lamina.open(path, "r")
        except (OSError, LaminaError) as e:  # not created yet, or created but not yet initialized
            # open is collective and its errors reach every rank; agree on giving up too
            if comm.allreduce(int(time.monotonic() > deadline), op=MPI.MAX):
                raise TimeoutError(f"{path} did not become readable in {timeout} s: {e}") from e
        time.sleep(0.05)


def read(args, comm) -> None:
    history = parse_history(args.history)
    nsteps = sum(h[2] for h in history)
    path = args.path
    if args.after_open:
        # the marker of the writer session that appends the last part of the history
        # (an earlier session's marker says nothing about this one)
        marker = f"{path}.opened.{len(history)}"
        wait_all(comm, lambda: os.path.exists(marker), 60, "the writer to open the file")
    f = open_when_ready(path, comm, 60)
    seen = 0
    live = 0
    compared = 0
    with f:
        for view in f.iter_steps(timeout=TIMEOUT):
            k = view.index
            if k != seen:
                raise AssertionError(f"iter_steps yielded step {k}, expected {seen}")
            if not f.engine.writer_closed:
                live += 1
            compared += read_check_step(
                view, k, history, comm.rank, comm.size, history[0][1], 777, NAMES
            )
            seen += 1
            comm.Barrier()
            if comm.rank == 0:
                with open(seen_marker(path, k), "w") as m:
                    m.write(f"seen {k}\n")
        if seen != nsteps:
            raise AssertionError(f"reader saw {seen} steps, the writer(s) wrote {nsteps}")
        if not f.engine.writer_closed:
            raise AssertionError("iter_steps ended but the writer is not closed")
        if f.steps != nsteps:
            raise AssertionError(f"f.steps = {f.steps}")
        if live < 1:
            raise AssertionError("the reader never saw a step while the writer was running")
    total = comm.allreduce(compared)
    log(
        comm,
        f"OK reader: followed {seen} steps with {comm.size} ranks ({live} while the writer ran), {total} values compared",
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["write", "read"])
    p.add_argument("path")
    p.add_argument("--history", required=True)
    p.add_argument("--wait", action="store_true")
    p.add_argument("--after-open", action="store_true")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    if args.action == "write":
        write(args, comm)
    else:
        read(args, comm)


if __name__ == "__main__":
    main()
