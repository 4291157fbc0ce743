"""Threads for the CPU kernels: the blocks of a region shared among a few threads.

numpy releases the GIL inside its loops, so blocks computed on different
threads run on different cores; each thread has its own scratch buffers and
takes the next block when it is done with one (on a shared machine a thread
that gets less of a core simply does fewer blocks).  Every element is computed
by the same operations whichever thread computes it, so the results do not
depend on the number of threads.

How many threads: :data:`THREADS` if set, else the environment variable
``LAMINA_THREADS``, else the cores this process may run on divided among the
MPI ranks of its node (``MPI_LOCALNRANKS`` from MPICH's launcher,
``OMPI_COMM_WORLD_LOCAL_SIZE`` from Open MPI's); one thread per rank when a
launcher is seen that does not tell.  A region smaller than
:data:`PARALLEL_MIN_ELEMENTS` is computed on the calling thread alone.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import numpy as np

#: threads of the CPU kernels (None: from the environment, see the module's description)
THREADS: int | None = None
#: at most this many threads unless asked for more (``THREADS``, ``LAMINA_THREADS``)
MAX_THREADS = 8
#: regions with fewer elements run on one thread (thread start-up would cost more than it gains)
PARALLEL_MIN_ELEMENTS = 1 << 19

_LOCAL_SIZE = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
_LAUNCHED = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID")


def _positive(text: str | None) -> int | None:
    try:
        v = int(text) if text is not None else None
    except ValueError:
        return None
    return v if v is not None and v > 0 else None


def default_threads() -> int:
    """Threads the CPU kernels use (see the module's description)."""
    if THREADS is not None:
        return max(1, int(THREADS))
    asked = _positive(os.environ.get("LAMINA_THREADS"))
    if asked is not None:
        return asked
    return max(1, min(MAX_THREADS, cores_per_rank()))


def cores_per_rank() -> int:
    """This process's share of the cores it may run on: those cores over the ranks the MPI
    launcher says share the node (1 under a launcher that does not say), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    ranks = next((v for v in map(_positive, map(os.environ.get, _LOCAL_SIZE)) if v), None)
    if ranks is None:
        if any(k in os.environ for k in _LAUNCHED):
            return 1  # under an MPI launcher that does not say how many ranks share the node
        ranks = 1
    return max(1, cpus // ranks)


S = TypeVar("S")
T = TypeVar("T")


def run_blocks(items: Sequence[T], work: Callable[[S, T], None], states: Sequence[S]) -> None:
    """Call ``work(state, item)`` for every item, on ``len(states)`` threads (the caller's included).

    Each thread keeps one state (the caller's is ``states[0]``) and takes the
    next item when done with one.  The first exception raised stops the
    others after their current item and is raised here.  Each thread runs in
    a copy of the caller's context and with the caller's numpy error state
    (``numpy.errstate``).
    """
    if len(states) == 1:  # the caller alone: no lock, no copy of its error state
        for item in items:
            work(states[0], item)
        return
    lock = threading.Lock()
    pending = iter(items)
    done = object()  # what next() gives once every item is taken
    errors: list[BaseException] = []
    errstate = np.geterr()  # (numpy < 2 keeps it per thread, not in the context)

    def loop(state) -> None:
        try:
            with np.errstate(**errstate):
                while not errors:
                    with lock:
                        item = next(pending, done)
                    if item is done:
                        return
                    work(state, cast(T, item))
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            errors.append(e)

    threads = [
        threading.Thread(
            target=contextvars.copy_context().run,
            args=(loop, s),
            name="lamina-kernels",
            daemon=True,
        )
        for s in states[1:]
    ]
    for t in threads:
        t.start()
    try:
        loop(states[0])
    finally:
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
