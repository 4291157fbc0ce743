"""Threads for the CPU kernels: the blocks of a region shared among a few threads.

numpy releases the GIL inside its loops, so blocks computed on different
threads run on different cores; each thread has its own scratch buffers and
takes the next block when it is done with one (on a shared machine a thread
that gets less of a core simply does fewer blocks).  Every element is computed
by the same operations whichever thread computes it, so the results do not
depend on the number of threads.

How many threads: :data:`THREADS` if set, else the environment variable
``LAMINA_THREADS`` (an integer >= 1, else a ConfigError naming it; one above
:data:`PER_CORE` times the cores this process may run on counts as that many),
else the cores this process may run on divided among the MPI ranks of its node
(``MPI_LOCALNRANKS`` from MPICH's launcher, ``OMPI_COMM_WORLD_LOCAL_SIZE`` from
Open MPI's), at most :data:`MAX_THREADS`; one thread per rank when a launcher
is seen that does not tell.  A region smaller than
:data:`PARALLEL_MIN_ELEMENTS` is computed on the calling thread alone, and a
larger one gives each thread at least :data:`THREAD_MIN_ELEMENTS`.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import numpy as np

from ..errors import ConfigError

#: threads of the CPU kernels (None: from the environment, see the module's description)
THREADS: int | None = None
#: at most this many threads unless asked for more (``THREADS``, ``LAMINA_THREADS``)
MAX_THREADS = 8
#: regions with fewer elements run on one thread (thread start-up would cost more than it gains)
PARALLEL_MIN_ELEMENTS = 1 << 19
#: a region split among threads gives each at least this many elements
THREAD_MIN_ELEMENTS = 1 << 16
#: ``LAMINA_THREADS`` counts at most this many threads per core this process may run on
PER_CORE = 4
#: the variable
ENV = "LAMINA_THREADS"
#: blocks of at least this many elements on average are worth evaluating where they lie, a
#: region each (:func:`lamina.derived.evaluate_regions`: about 60 us of Python a region besides
#: its values); smaller ones are worth gathering into one box first.  The derived layer's rule
#: at the end of a step (:func:`lamina.layers.derived.exchange.regions`) and its cost model's;
#: here, where the layer finds it without importing the kernels
IN_PLACE_ELEMENTS = 1 << 15

_LOCAL_SIZE = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
_LAUNCHED = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID")


def _positive(text: str | None) -> int | None:
    try:
        v = int(text) if text is not None else None
    except ValueError:
        return None
    return v if v is not None and v > 0 else None


def default_threads() -> int:
    """Threads the CPU kernels use (see the module's description); ConfigError for a
    ``$LAMINA_THREADS`` that is not an integer >= 1."""
    if THREADS is not None:
        return max(1, int(THREADS))
    asked = env_threads()
    if asked is not None:
        return asked
    return max(1, min(MAX_THREADS, cores_per_rank()))


def env_threads() -> int | None:
    """``$LAMINA_THREADS`` (None where unset or empty), at most :data:`PER_CORE` times the
    cores this process may run on; ConfigError naming the variable for anything but an
    integer >= 1."""
    given = os.environ.get(ENV, "").strip()
    if not given:
        return None
    n = int(given) if given.isdigit() else 0  # (isdigit: no sign, no blanks, no '1_0')
    if n < 1:
        raise ConfigError(
            f"${ENV} must be an integer >= 1 (threads of the CPU kernels; one above "
            f"{thread_cap()}, {PER_CORE} per core this process may run on, counts as "
            f"{thread_cap()}), got {given!r}"
        )
    return min(n, thread_cap())


def thread_cap() -> int:
    """The most threads ``$LAMINA_THREADS`` gives: :data:`PER_CORE` per core this process may
    run on."""
    return PER_CORE * _cpus()


def _cpus() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def cores_per_rank() -> int:
    """This process's share of the cores it may run on: those cores over the ranks the MPI
    launcher says share the node (1 under a launcher that does not say), at least 1."""
    cpus = _cpus()
    ranks = next((v for v in map(_positive, map(os.environ.get, _LOCAL_SIZE)) if v), None)
    if ranks is None:
        if any(k in os.environ for k in _LAUNCHED):
            return 1  # under an MPI launcher that does not say how many ranks share the node
        ranks = 1
    return max(1, cpus // ranks)


def split_threads(threads: int, elements: int) -> int:
    """How many of *threads* a region of *elements* is split among: each takes at least
    :data:`THREAD_MIN_ELEMENTS` (1 below :data:`PARALLEL_MIN_ELEMENTS`)."""
    if elements < PARALLEL_MIN_ELEMENTS:
        return 1
    return max(1, min(threads, elements // max(1, THREAD_MIN_ELEMENTS)))


S = TypeVar("S")
T = TypeVar("T")


def run_blocks(items: Sequence[T], work: Callable[[S, T], None], states: Sequence[S]) -> None:
    """Call ``work(state, item)`` for every item, on ``len(states)`` threads (the caller's included).

    Each thread keeps one state (the caller's is ``states[0]``) and takes the
    next item when done with one; where a thread cannot be started (the
    process's limit) the threads started share the items (each item is
    computed alike on any thread).  The first exception raised stops the
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

    threads: list[threading.Thread] = []
    try:
        for s in states[1:]:
            t = threading.Thread(
                target=contextvars.copy_context().run,
                args=(loop, s),
                name="lamina-kernels",
                daemon=True,
            )
            try:
                t.start()
            except RuntimeError:  # "can't start new thread": the threads started do the work
                break
            threads.append(t)
        loop(states[0])
    finally:
        for t in threads:  # those started, whatever failed: none is left running
            t.join()
    if errors:
        raise errors[0]
