"""One program, its own tasks: ``lamina.comm.set_task_comm`` instead of an MPMD launch.

    transport_split.py NAME STEPS NPROD [numbered|bad]

World ranks 0..NPROD-1 produce, the others consume (a communicator the
program builds with ``Split``; with ``numbered`` it numbers the tasks itself,
consumers 0 and producers 1, and names them in ``LAMINA_WORKFLOW``; with ``bad`` the producer ranks pass
different task numbers, which every rank must refuse alike).  The
producer and consumer code is the MPMD scenario's: the common datasets,
every value checked.
"""

from __future__ import annotations

import os
import sys

from mpi4py import MPI
from transport_common import check_step, define, say, write_step

import lamina


def main() -> None:
    name, steps, nprod = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    how = sys.argv[4] if len(sys.argv) > 4 else ""
    numbered = how == "numbered"
    w = MPI.COMM_WORLD
    producer = w.rank < nprod
    mine = w.Split(
        int(producer), -w.rank
    )  # any order: lamina orders its task communicator by world rank
    if how == "bad":
        try:
            lamina.comm.set_task_comm(mine, task=w.rank if producer else 0)
        except ValueError as e:
            if "different task numbers" not in str(e):
                raise
            w.Barrier()
            if w.rank == 0:
                say(f"OK bad split refused on every rank: {e}")
            return
        raise AssertionError("different task numbers in one task were accepted")
    if numbered:
        os.environ["LAMINA_WORKFLOW"] = f"{name}=1>0"
        task = lamina.comm.set_task_comm(mine, task=1 if producer else 0)
    else:
        task = lamina.comm.set_task_comm(mine)
    if task.size != mine.size or lamina.comm.task_count() != 2:
        raise AssertionError("task communicator")
    if producer:
        with lamina.open(name, "w") as f:
            define(f, steps)
            for k in range(steps):
                with f.step():
                    write_step(f, k, f.comm.rank, f.comm.size)
    else:
        n = 0
        with lamina.open(name, "r") as f:
            if f.engine.name != "mpi":
                raise AssertionError(f"engine {f.engine.name}")
            for view in f.iter_steps():
                check_step(view, view.index, f.comm.rank, f.comm.size)
                n += 1
        if n != steps:
            raise AssertionError(f"saw {n} of {steps} steps")
        if f.comm.rank == 0:
            say(f"OK split: {steps} steps from {nprod} to {w.size - nprod} ranks")


if __name__ == "__main__":
    main()
