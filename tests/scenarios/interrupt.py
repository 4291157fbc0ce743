"""Ctrl-C on a job of several ranks, out of ``with lamina.open(...)``: nobody waits long.

Usage: interrupt.py CASE IO PATH
  ctrlc     SIGINT on every rank (as mpiexec forwards Ctrl-C) while rank 0 waits in end_step
            for the others, still computing inside their step: every rank catches the
            KeyboardInterrupt out of the with block within a few seconds of the signal (a
            rank waited 10 s, 20 under io='async', and without ``-m mpi4py`` one waited for
            ever); the first step is intact
  uncaught  the same, the KeyboardInterrupt not caught (run without ``-m mpi4py``: no
            MPI_Abort ends the job, each rank's own exit does)
  in-commit SIGINT on the last rank inside end_step's commit, just before its heads are
            exchanged (a collective the others are in already): the commit completes on
            every rank, then the last rank raises KeyboardInterrupt (it raised it at once,
            and the others waited in the allgather for ever); the others hear at their next
            end_step that it left; steps 0 and 1 are in the file
  cut       as ctrlc without a signal: the others raise KeyboardInterrupt inside their
            step, and rank 0's wait in end_step raises it just after the wait completed
            (where a signal's handler runs): rank 0 still takes its part in the rest of
            that agreement (it hears that rank 1 left), raises the KeyboardInterrupt, and
            nobody waits for it
"""

import os
import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import lamina
from lamina import comm as comm_mod

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
case, io, path = sys.argv[1], sys.argv[2], sys.argv[3]
#: seconds a rank may take from the interrupt to the end of its with block
PROMPT = 8.0  # (about 1 s here; 10 s and more before a rank interrupted stopped waiting)


def interrupt_at_wait() -> None:
    """Rank 0's next agreement of the program's thread: its wait raises KeyboardInterrupt
    once it completed, as a signal's handler does where it ran during the wait."""
    real = comm_mod._wait

    def wait(req, quiet):
        real(req, quiet)
        if threading.current_thread() is threading.main_thread():
            comm_mod._wait = real
            raise KeyboardInterrupt

    comm_mod._wait = wait


when = {}


def say(text: str) -> None:
    """One line in one write: mpiexec forwards each rank's writes as they come, so a line
    printed in pieces (print under PYTHONUNBUFFERED writes its text, then its newline) was
    cut by another rank's line ('rank 1: out after 0.31 sOK cut sync')."""
    os.write(1, (text + "\n").encode())


def ctrl_c() -> None:
    when["signal"] = time.monotonic()
    os.kill(os.getpid(), signal.SIGINT)


def write() -> None:
    with lamina.open(path, "w", io=io, durable=False) as f:
        x = f.create_dataset("x", (size, 1000), "f8")
        with f.step():
            x[rank] = 0.0
        if case == "cut":
            when["signal"] = time.monotonic()
        else:  # rank 0's first: it waits in end_step when its signal comes
            threading.Timer(0.8 if rank == 0 else 1.0, ctrl_c).start()
        with f.step():
            x[rank] = 1.0
            if rank != 0:
                if case == "cut":
                    time.sleep(0.3)  # rank 0 waits in end_step meanwhile
                    raise KeyboardInterrupt
                time.sleep(3)  # still computing: rank 0 waits in end_step
            elif case == "cut":
                interrupt_at_wait()
    raise AssertionError(f"rank {rank}: no KeyboardInterrupt")


def in_commit() -> None:
    armed = [False]
    when["start"] = time.monotonic()

    def signalled(real):
        def exchange(*args, **kwargs):
            if armed[0] and threading.current_thread() is threading.main_thread():
                armed[0] = False
                ctrl_c()  # (its handler runs at once, here: before this rank's part)
            return real(*args, **kwargs)

        return exchange

    # (the commit's first exchange after its agreement: a gather where ranks place their
    # own blocks, an allgather of the heads otherwise)
    for fn in ("allgather_bytes", "gather_bytes"):
        setattr(comm_mod, fn, signalled(getattr(comm_mod, fn)))
    try:
        with lamina.open(path, "w", io=io, durable=False) as f:
            x = f.create_dataset("x", (size, 1000), "f8")
            for k in range(3):
                with f.step():
                    x[rank] = float(k)
                    armed[0] = k == 1 and rank == size - 1
        raise AssertionError(f"rank {rank}: no error")
    except KeyboardInterrupt as e:
        assert rank == size - 1, f"rank {rank}: {e!r}"
        say(f"rank {rank}: out after {time.monotonic() - when['signal']:.2f} s")
    except lamina.RemoteError as e:
        assert rank != size - 1 and getattr(e, "lamina_left", False), repr(e)
        say(f"rank {rank}: out after {time.monotonic() - when['start']:.2f} s (told)")
    comm.Barrier()
    if rank == 0:
        with lamina.open(path, "r", comm=MPI.COMM_SELF) as f:
            assert f.steps == 2 and np.all(f.at(1)["x"][...] == 1.0), f.steps
        say(f"OK {case} {io}")


if case == "in-commit":
    in_commit()
    sys.exit(0)
if case == "uncaught":
    write()
try:
    write()
except KeyboardInterrupt as e:
    took = time.monotonic() - when["signal"]
    say(f"rank {rank}: out after {took:.2f} s")
    assert took < PROMPT, f"rank {rank} took {took:.1f} s to leave the file"
    if case == "cut" and rank == 0:  # it heard, in the rest of the agreement, that rank 1 left
        assert getattr(e, "lamina_left", False), "rank 0 left the agreement halfway"
comm.Barrier()
if rank == 0:
    with lamina.open(path, "r", comm=MPI.COMM_SELF) as f:
        assert f.steps == 1 and np.all(f["x"][...] == 0.0), f.steps
    say(f"OK {case} {io}")
