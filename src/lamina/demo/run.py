"""Entry point of the demo's MPI programs (started by ``lamina demo``).

::

    mpiexec -n 4 python -m mpi4py -m lamina.demo.run write PATH --result W.json [options]
    mpiexec -n 3 python -m mpi4py -m lamina.demo.run read  PATH --result R.json

Rank 0 writes its measurements as JSON to ``--result``.  The exit status is 0
whenever the program ran to the end, also when the check found differences
(the verdict is in the JSON); an exception on any rank aborts the job
(``python -m mpi4py``), so it never hangs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .. import comm as comm_mod
from . import phases


def shape_arg(text: str) -> tuple[int, ...]:
    """argparse type of a 3-D grid shape: ``64x64x128`` or ``64,64,128``."""
    parts = text.replace("x", ",").split(",")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}") from None
    if len(shape) != 3 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"the shape must be 3 positive integers, got {text!r}")
    return shape


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lamina.demo.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("role", choices=["write", "read"])
    p.add_argument("path", help="the .lam file to write or read")
    p.add_argument("--result", required=True, help="JSON file for rank 0's measurements")
    p.add_argument(
        "--shape", type=shape_arg, default=None, help="global grid, e.g. 64x64x128 (write)"
    )
    p.add_argument("--steps", type=int, default=5, help="steps to write")
    p.add_argument(
        "--blocks", type=int, default=None, help="blocks per writer rank (default: auto)"
    )
    p.add_argument("--aggregators", type=int, default=None, help="subfiles per write session")
    p.add_argument("--no-fsync", action="store_true", help="open with durable=False")
    return p


def write_result(path: str, result: dict) -> None:
    """Write *result* as JSON, atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    comm = comm_mod.world()
    if args.role == "write":
        from .simulation import DEFAULT_SHAPE

        res = phases.write(
            args.path,
            comm,
            args.shape or DEFAULT_SHAPE,
            args.steps,
            blocks_per_rank=args.blocks
            or phases.auto_blocks(args.shape or DEFAULT_SHAPE, comm.size),
            aggregators=args.aggregators,
            durable=not args.no_fsync,
        )
    else:
        res = phases.read(args.path, comm)
    if comm.rank == 0:
        write_result(args.result, res)
    comm_mod.barrier(comm)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
