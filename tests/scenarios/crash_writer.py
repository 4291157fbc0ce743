"""A writer that stops at a chosen point of a step and waits there to be killed (SIGKILL).

Runs as plain ``python crash_writer.py ...`` (one rank) or under
``mpiexec -n N python -m mpi4py crash_writer.py ...``::

    crash_writer.py PATH --mode w|a --phase PHASE --at K --signal FILE [--aggregators A] [--durable 0|1]
                    [--io sync|async]

The writer writes steps from the file's current step count on (0 for mode
'w').  Each step holds three datasets, ``crash/x`` (int64, 6x10),
``crash/y`` (float32, 13) and ``crash/m`` (float64, 20x12, multiresolution,
lossless), whose values encode the global index and the
step, split over the ranks by an uneven decomposition that changes every
step, so a reader needs no knowledge of the writer to check them.

At step *K* it stops at *PHASE*, creates ``FILE.<rank>`` (the signal; rank 0
only for the commit phases) and sleeps until killed:

``midstep``         after this rank's puts of ``crash/x``, before ``end_step``
``before_meta``     in ``end_step``, data durable, before the metadata record is written
``torn_meta``       half of the metadata record written
``before_commit``   metadata record written, before the commit entry
``torn_commit``     half of the 32-byte commit entry written
``garbled_commit``  a whole commit entry whose checksum is wrong (a torn sector)
``after_commit``    commit entry written and synced: step *K* is committed
``loop``            never stops: writes steps and appends ``committed N`` to
                    ``FILE.progress`` after each (a file, not stdout: output in
                    flight through mpiexec is lost when the job is killed);
                    creates the signal once the file is open

With ``--io async`` the commit phases stop on the background thread, and
the program goes on ending two more steps (queued behind the stopped one,
in flight when the kill comes) before it waits to be killed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import random_grid, values_for  # noqa: E402

import lamina  # noqa: E402
from lamina import comm as comm_mod  # noqa: E402
from lamina.engines.native import engine as native  # noqa: E402
from lamina.geometry import Box  # noqa: E402

DATASETS = {
    "crash/x": ((6, 10), "int64", -1),
    "crash/y": ((13,), "float32", -2.5),
    "crash/m": ((20, 12), "float64", -3.0),
}
#: datasets with a layout: "crash/m" is multiresolution, lossless (so values check bit for bit)
LAYOUTS = {"crash/m": lamina.Multires(patch=4, tolerance=0)}


def expected(name: str, step: int) -> np.ndarray:
    shape, dtype, _ = DATASETS[name]
    return values_for(shape, dtype, Box.from_shape(shape), step)


def my_boxes(name: str, step: int, rank: int, size: int) -> Box:
    shape = DATASETS[name][0]
    rng = np.random.default_rng([step, size, len(name)])
    return random_grid(Box.from_shape(shape), size, rng)[rank]


def put(f, name: str, step: int, rank: int, size: int) -> None:
    b = my_boxes(name, step, rank, size)
    if not b.empty:
        shape, dtype, _ = DATASETS[name]
        f[name][b.slices] = values_for(shape, dtype, b, step)


def signal(path: str, rank: int, text: str) -> None:
    tmp = f"{path}.{rank}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text + "\n")
    os.replace(tmp, f"{path}.{rank}")


def wait_forever() -> None:
    while True:
        time.sleep(60)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--mode", default="w")
    p.add_argument("--phase", required=True)
    p.add_argument("--at", type=int, default=0)
    p.add_argument("--signal", required=True)
    p.add_argument("--aggregators", type=int, default=None)
    p.add_argument("--durable", type=int, default=1)
    p.add_argument("--io", default="sync")
    args = p.parse_args()
    comm = comm_mod.world()
    rank, size = comm.rank, comm.size
    opts = {"durable": bool(args.durable)}
    if args.aggregators:
        opts["aggregators"] = args.aggregators

    f = lamina.open(args.path, args.mode, io=args.io, **opts)
    for name, (shape, dtype, fill) in DATASETS.items():
        # an appending writer defines them too if a killed writer never committed them
        if name not in f:
            f.create_dataset(name, shape, dtype, fill=fill, layout=LAYOUTS.get(name))
    eng = f.engine.stack()[-1]  # the native engine under the layers
    armed = {"on": False}

    def hit() -> bool:
        # the commit of step K (under io='async' it runs on the background thread, maybe
        # while the program is at a later step)
        return armed["on"] and len(eng.catalog.steps) == args.at

    def stop(text: str) -> None:
        signal(args.signal, rank, text)
        wait_forever()

    orig_pwrite = native._pwrite_all

    def pwrite(fd, buf, offset):
        if hit() and fd == eng._meta_fd:
            if args.phase == "before_meta":
                stop("before_meta")
            if args.phase == "torn_meta":
                mv = memoryview(buf).cast("B")
                orig_pwrite(fd, mv[: len(mv) // 2], offset)
                os.fsync(fd)
                stop("torn_meta")
        if hit() and fd == eng._commit_fd:
            if args.phase == "before_commit":
                stop("before_commit")
            mv = memoryview(buf).cast("B")
            if args.phase == "torn_commit":
                orig_pwrite(fd, mv[:16], offset)
                os.fsync(fd)
                stop("torn_commit")
            if args.phase == "garbled_commit":
                orig_pwrite(fd, bytes(mv[:28]) + b"\0\0\0\0", offset)
                os.fsync(fd)
                stop("garbled_commit")
        return orig_pwrite(fd, buf, offset)

    native._pwrite_all = pwrite
    # a record's area and frame (one pwritev) go through the same faults, as one write
    native._pwrite_pair = lambda fd, first, second, offset: pwrite(
        fd, bytes(first) + bytes(second), offset
    )
    orig_write_record = type(eng)._write_record

    def write_record(self, rec):
        shared = orig_write_record(self, rec)
        if hit() and args.phase == "after_commit":
            stop("after_commit")
        return shared

    type(eng)._write_record = write_record

    first = f.steps
    progress = (
        os.open(args.signal + ".progress", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if rank == 0
        else -1
    )
    if rank == 0:
        os.write(progress, f"start {first}\n".encode())
    print(f"start {first}", flush=True)
    if args.phase == "loop":
        signal(args.signal, rank, f"open {first}")
    k = first
    while True:
        if args.io == "async" and args.phase != "loop" and k > args.at + 2:
            wait_forever()  # steps at+1, at+2 are queued behind the stopped background thread
        if args.io != "async" and args.phase != "loop" and k > args.at:
            raise SystemExit(f"phase {args.phase!r} was never reached")
        f.begin_step()
        put(f, "crash/x", k, rank, size)
        if args.phase == "midstep" and k == args.at:
            stop("midstep")
        put(f, "crash/y", k, rank, size)
        put(f, "crash/m", k, rank, size)
        if args.phase != "loop" and k == args.at:
            armed["on"] = True
        f.end_step()
        k += 1
        if rank == 0:
            os.write(progress, f"committed {f.steps}\n".encode())


if __name__ == "__main__":
    main()
