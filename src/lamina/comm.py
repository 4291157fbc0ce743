"""The one place that touches mpi4py.

Provides the world and task communicators (one task per program of an MPMD
launch, found through the ``MPI.APPNUM`` attribute), duplication so library
traffic never mixes with the user's, and a few collective helpers that move
*bytes* (lamina's own encodings) rather than pickled objects.

Every helper here is collective over the communicator it is given.

Importing this module initializes MPI (``mpi4py.MPI``), unless the program
did first.  ``MPI_Init`` waits for every process of the launch, as in any
MPI program: every task of a workflow must initialize MPI (``lamina run
--timeout`` bounds a launch where one never does).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from enum import IntEnum

import numpy as np
from mpi4py import MPI

from .errors import (
    CollectiveMismatchError,
    LaminaError,
    MPIStateError,
    TransportError,
    error_from_wire,
    error_to_wire,
    is_left,
    mark_collective,
)
from .text import fmt_ranges, parse_seconds

#: variables that say a program runs inside a workflow (set by ``lamina run``, or by hand)
WORKFLOW_VARIABLES = ("LAMINA_WORKFLOW", "LAMINA_TRANSPORT")
#: the transport timeout (seconds): how long the first task_comm waits for the others
TIMEOUT_VARIABLE = "LAMINA_TRANSPORT_TIMEOUT"
DEFAULT_PATIENCE = 60.0


def env_seconds(variable: str, default: float, zero: bool = False, finite: bool = False) -> float:
    """``$variable`` as seconds (> 0, or >= 0 with *zero*; below infinity with *finite*:
    :func:`lamina.text.parse_seconds`), else *default* where it is unset or empty;
    ValueError naming the variable, the limit and the value for anything else."""
    given = os.environ.get(variable)
    if not given:
        return default
    try:
        return parse_seconds(given, zero, finite)
    except ValueError as e:
        raise ValueError(f"${variable} {e}, got {given!r}") from None


def transport_patience() -> float:
    """``$LAMINA_TRANSPORT_TIMEOUT`` (seconds > 0), else :data:`DEFAULT_PATIENCE` where it is
    unset or empty; ValueError naming the variable for anything else (the in situ transport
    takes its timeout from here too, so that both refuse the same values)."""
    return env_seconds(TIMEOUT_VARIABLE, DEFAULT_PATIENCE)


def in_workflow() -> bool:
    """Whether ``$LAMINA_WORKFLOW`` or ``$LAMINA_TRANSPORT`` is set (``lamina run`` sets both)."""
    return any(os.environ.get(k, "").strip() for k in WORKFLOW_VARIABLES)


Comm = MPI.Comm


class Tag(IntEnum):
    """The message tags of lamina's point-to-point protocols, in one place.

    Each protocol runs on a communicator of its own (a duplicate made by
    :func:`dup`, an intercommunicator, or the private :func:`peer_comm`), so
    the tags need not differ between protocols; they do anyway, so that a
    message in the wrong place cannot be mistaken for another.
    """

    #: native engine, member -> aggregator: block bytes (plus the record number mod 4096)
    AGGREGATE = 701
    #: in situ transport, producer rank j % P -> consumer rank j: int64 step, int64 flags, committed
    #: record; empty: no more
    RECORD = 11
    #: in situ transport, consumer -> producer: int64 words (see ``engines.transport.wire.Request``)
    REQUEST = 12
    #: in situ transport, producer -> consumer: one chunk of a requested box; empty: not held
    DATA = 13
    #: in situ transport, producer -> consumer: the statistics a ``Request.STATS`` asked for; empty: not held
    STATS = 14
    #: collective read: a part of a block, from the rank that read the block to one that needs it
    COLLECTIVE_READ = 901
    #: multiresolution layout at end_step: pieces of patches to the rank that encodes them
    PATCH_PIECES = 801
    #: multiresolution layout at end_step: encoded patches (and their statistics) to their aggregator
    PATCH_BYTES = 802
    #: rendezvous on the peer communicator, consumer leader -> producer leader
    HELLO = 0x4C4D0
    #: rendezvous, producer leader -> consumer leader
    ACCEPT = 0x4C4D1
    #: rendezvous: the tag of ``Create_intercomm`` between the two tasks
    INTERCOMM = 0x4C4D2
    #: rendezvous, consumer leader -> producer leader: ACCEPT taken, its task goes on to
    #: ``Create_intercomm``
    READY = 0x4C4D5
    #: rendezvous, producer leader -> consumer leader: READY taken, its task goes on to
    #: ``Create_intercomm``
    GO = 0x4C4D6
    #: first task_comm, on the world, only once a rank gave up waiting for the others:
    #: "which task are you?" (int64 appnum of the asking rank)
    ARRIVAL_QUERY = 0x4C4D3
    #: the answer of a rank waiting in its first task_comm (int64 appnum)
    ARRIVAL_REPLY = 0x4C4D4


_TASK_COMM: MPI.Comm | None = None
#: when this process imported lamina (seconds since the epoch): see :func:`job_start`
_STARTED = time.time()


def world() -> MPI.Comm:
    """``MPI.COMM_WORLD`` (a single rank when the program was not launched by mpiexec)."""
    return MPI.COMM_WORLD


def self_comm() -> MPI.Comm:
    """``MPI.COMM_SELF``: this process alone (for work that concerns no other rank)."""
    return MPI.COMM_SELF


def appnum() -> int:
    """Index of this program's task: its MPMD appnum (``mpiexec A : B``), or the one :func:`set_task_comm` gave."""
    if _DECLARED is not None:
        return _DECLARED
    value = MPI.COMM_WORLD.Get_attr(MPI.APPNUM)
    return 0 if value is None else int(value)


def task_comm() -> MPI.Comm:
    """Communicator of this program's own ranks.  Collective over the world on first call.

    When several programs share one MPMD launch, the world is split by
    ``APPNUM`` so that each program's ``lamina.open`` sees only its own ranks.

    Under a workflow (:func:`world_patience`) the first call waits at most
    the transport timeout for every other rank of the world to make it too,
    then raises :class:`~lamina.errors.TransportError` naming the ranks (and
    tasks) that never did, instead of waiting for ever for a program that
    never opens a lamina file.
    """
    global _TASK_COMM, _APPNUMS, _PEER_COMM, _JOB_START, _TASK_FAILURE
    if _TASK_COMM is None:
        if _TASK_FAILURE is not None:  # the world never met: a second try would not either
            raise TransportError(_TASK_FAILURE)
        w = MPI.COMM_WORLD
        mine = appnum()
        patience = world_patience(mine)  # (a bad $LAMINA_TRANSPORT_TIMEOUT: before any message)
        # every rank's appnum (one allgather instead of the max alone): the in situ
        # transport finds the other tasks' leaders and sizes from it without more messages;
        # and when lamina started on each rank (job_start)
        rows = np.zeros((w.size, 2), dtype=np.int64)
        row = np.array([mine, int(_STARTED * 1e6)], dtype=np.int64)
        req = w.Iallgather(row, rows)
        _KEEP.append((req, row, rows))  # a gather given up on stays pending: its buffers live on
        # quietly, answering the questions of ranks that gave up meanwhile
        if not wait_quietly([req], patience, lambda: _answer_arrivals(mine)):
            assert patience is not None
            present = _who_is_there(req, mine)
            if present is not None:  # (None: everyone came after all)
                _TASK_FAILURE = _absent_message(present, mine, patience)
                raise TransportError(_TASK_FAILURE)
        _answer_arrivals(mine)  # a rank that gave up just as the last one came asked
        _KEEP.clear()
        apps = rows[:, 0].copy()
        _APPNUMS = apps
        _JOB_START = float(rows[:, 1].min()) / 1e6
        if apps.max(initial=0) == 0:
            _TASK_COMM = w
        else:
            _TASK_COMM = w.Split(mine, w.rank)
            # a private duplicate of the world for rendezvous between tasks (see peer_comm)
            _PEER_COMM = w.Dup()
    return _TASK_COMM


_JOB_START: float | None = None
_KEEP: list = []
#: why the first task_comm failed (raised again by every later call)
_TASK_FAILURE: str | None = None

#: seconds a rank that gave up waiting for the world asks the others which task they are
ARRIVAL_GRACE = 2.0
#: worlds larger than this are not asked rank by rank (the error then names no rank)
ARRIVAL_ASK_LIMIT = 4096
#: the arrival messages in flight and their buffers (kept alive until sent)
_ARRIVAL_SENDS: list[tuple[MPI.Request, np.ndarray]] = []


def world_patience(app: int | None = None) -> float | None:
    """Seconds the first :func:`task_comm` waits for the whole world; None: no limit.

    A limit applies where this rank can tell it runs in a workflow: a task
    other than the first of an MPMD launch (*app* > 0), or ``$LAMINA_WORKFLOW``
    or ``$LAMINA_TRANSPORT`` set (``lamina run`` sets both).  It is the
    transport timeout, ``$LAMINA_TRANSPORT_TIMEOUT`` (default 60).  A single
    program keeps the blocking collective of old: its ranks run the same code.
    """
    app = appnum() if app is None else app
    if MPI.COMM_WORLD.size == 1 or (app == 0 and not in_workflow()):
        return None
    return transport_patience()


def job_start() -> float | None:
    """When the job started, as every rank agrees (seconds since the epoch); None before :func:`task_comm`.

    The earliest time any rank of the world imported lamina, taken at the
    first :func:`task_comm` (or :func:`set_task_comm`): every file a task of
    this launch creates is created after it (a task creates files only once
    every rank reached that first call), and every file of an earlier launch
    before it.
    """
    return _JOB_START


def _answer_arrivals(app: int, present: dict[int, int] | None = None) -> None:
    """Answer every ``ARRIVAL_QUERY`` waiting: this rank is in its first task_comm, task *app*.

    Only a rank that gave up waiting sends one, and only lamina ranks in
    their first task_comm look for them, so the answer goes to a lamina
    rank (it waits for it).  *present* (the asking rank's own list) gets
    every asker: it is there too.
    """
    for src, asker in _arrivals(Tag.ARRIVAL_QUERY):
        if present is not None:
            present[src] = asker
        _send_arrival(src, Tag.ARRIVAL_REPLY, app)
    _ARRIVAL_SENDS[:] = [(r, b) for r, b in _ARRIVAL_SENDS if not r.Test()]


def _arrivals(tag: int) -> Iterator[tuple[int, int]]:
    """``(world rank, appnum)`` of each arrival message of *tag* waiting, received."""
    w = MPI.COMM_WORLD
    st = MPI.Status()
    while w.Iprobe(MPI.ANY_SOURCE, tag, st):
        src = st.Get_source()
        got = np.zeros(1, dtype=np.int64)
        w.Recv([got, MPI.INT64_T], src, tag)
        yield src, int(got[0])


def _send_arrival(dest: int, tag: int, app: int) -> None:
    buf = np.array([app], dtype=np.int64)
    _ARRIVAL_SENDS.append((MPI.COMM_WORLD.Isend([buf, MPI.INT64_T], dest, tag), buf))


def _who_is_there(req: MPI.Request, app: int) -> dict[int, int] | None:
    """After the first task_comm's wait ran out: the world ranks in theirs, by appnum.

    Asks every other rank (only now: a launch whose ranks all come sends
    nothing) and takes the answers of those waiting in their first
    task_comm for :data:`ARRIVAL_GRACE` seconds.  None if the gather
    completed meanwhile (everyone came after all: go on); empty for a world
    too large to ask.  Ranks that never call lamina get a question they
    never read.
    """
    w = MPI.COMM_WORLD
    if w.size > ARRIVAL_ASK_LIMIT:
        return {} if not req.Test() else None
    present = {w.rank: app}
    for r in range(w.size):
        if r != w.rank:
            _send_arrival(r, Tag.ARRIVAL_QUERY, app)
    end = time.monotonic() + ARRIVAL_GRACE
    while time.monotonic() < end and len(present) < w.size:
        if req.Test():
            return None
        _answer_arrivals(app, present)
        present.update(_arrivals(Tag.ARRIVAL_REPLY))
        time.sleep(1e-3)
    if req.Test():
        return None
    return present


def _absent_message(present: dict[int, int], app: int, patience: float) -> str:
    """The error of a first task_comm that waited in vain: who never came, as far as it can tell.

    The ranks of an MPMD launch are numbered program by program, so a run
    of absent world ranks between ranks of tasks p and q belongs to the
    tasks in between (or to p and q themselves where nothing lies between).
    """
    w = MPI.COMM_WORLD
    size = w.size
    missing = [r for r in range(size) if r not in present] if present else []
    parts = []
    i = 0
    while i < len(missing):
        lo = hi = missing[i]
        while i + 1 < len(missing) and missing[i + 1] == hi + 1:
            i += 1
            hi = missing[i]
        i += 1
        ranks = f"world rank {lo}" if lo == hi else f"world ranks {lo}-{hi}"
        p = present.get(lo - 1)
        q = present.get(hi + 1)
        if p is not None and q is not None and q - p >= 2:
            tasks = f"task {p + 1}" if q - p == 2 else f"tasks {p + 1}-{q - 1}"
            parts.append(f"{tasks} ({ranks})")
        elif p is not None and q is None:
            tasks = f"task {p + 1}" if lo == hi else f"task {p + 1} (and any after it)"
            parts.append(f"{tasks} ({ranks})")
        elif p is None and q is not None and q >= 1:
            tasks = "task 0" if q == 1 else f"tasks 0-{q - 1}"
            parts.append(f"{tasks} ({ranks})")
        else:
            near = sorted({t for t in (p, q) if t is not None})
            of = f" (of task {' or '.join(map(str, near))})" if near else ""
            parts.append(f"{ranks}{of}")
    who = ", ".join(parts) if parts else f"some of the {size} ranks of the launch"
    return (
        f"{who} never opened a lamina file within {patience:g} s: every task of a workflow must "
        f"(seen from task {app}, world rank {w.rank}, in its first lamina.open, which waits for "
        "every rank of the launch; a program that opens no lamina file calls "
        "lamina.comm.task_comm() once; the wait is the transport timeout: "
        f"${TIMEOUT_VARIABLE}, a workflow file's timeout)"
    )


# --- tasks of an MPMD launch (used by the in situ transport) -------------

_APPNUMS: np.ndarray | None = None
_PEER_COMM: MPI.Intracomm | None = None
_DECLARED: int | None = None  # this rank's task, when the program split the world itself


def set_task_comm(comm: MPI.Comm, task: int | None = None) -> MPI.Comm:
    """Collective over the world: the tasks are *comm*s the program built, not the programs of an MPMD launch.

    For one program that splits ``MPI.COMM_WORLD`` into a producer part and
    a consumer part itself (``mpiexec -n 8 python workflow.py``).  Every rank
    of the world passes the communicator of its own task; the communicators
    must partition the world.  Tasks are numbered by *task* (the same on
    every rank of a task, 0..T-1, each once) or, when every rank passes
    None, in the order of their lowest world rank.  These numbers are what
    ``LAMINA_WORKFLOW`` names.  Returns the task communicator that
    ``lamina.open`` then uses by default: a copy of *comm*'s group ordered by
    world rank.  Must come before the first ``lamina.open`` (or
    :func:`task_comm`) of the process, and only once.
    """
    global _TASK_COMM, _APPNUMS, _PEER_COMM, _DECLARED, _JOB_START
    if _TASK_COMM is not None:
        raise RuntimeError(
            "set_task_comm must come before the first lamina.open (or lamina.comm.task_comm) "
            "of the process, and only once: the tasks are already set"
        )
    w = MPI.COMM_WORLD
    leader = allreduce_int(comm, w.rank, "min")
    want = -1 if task is None else int(task)
    if task is not None and want < 0:
        raise ValueError(
            f"task must be >= 0, got {task}"
        )  # the same verdict on every rank of a task
    rows = np.zeros((w.size, 4), dtype=np.int64)
    w.Allgather(np.array([leader, want, comm.size, int(_STARTED * 1e6)], dtype=np.int64), rows)
    leaders = np.unique(rows[:, 0])
    problem = None
    for lead in leaders:
        mine = rows[rows[:, 0] == lead]
        if len(mine) != mine[0, 2] or (mine[:, 2] != mine[0, 2]).any():
            problem = f"the task communicators do not partition the world (the task led by world rank {lead})"
        elif (mine[:, 1] != mine[0, 1]).any():
            problem = (
                f"the ranks of the task led by world rank {lead} passed different task numbers"
            )
    given = rows[:, 1]
    if problem is None and (given >= 0).any():
        ids = {int(rows[rows[:, 0] == lead][0, 1]) for lead in leaders}
        if (given < 0).any() or ids != set(range(len(leaders))):
            problem = (
                f"task numbers must be given on every rank or on none, each of 0..{len(leaders) - 1} "
                f"once; got {sorted(ids)}"
            )
    if problem is not None:
        raise ValueError(f"set_task_comm: {problem}")  # every rank saw the same rows
    if (given >= 0).any():
        apps = given.copy()
    else:
        apps = np.searchsorted(leaders, rows[:, 0]).astype(np.int64)
    _APPNUMS = apps
    _JOB_START = float(rows[:, 3].min()) / 1e6
    _DECLARED = int(apps[w.rank])
    _TASK_COMM = w.Split(_DECLARED, w.rank)
    if len(leaders) > 1:
        _PEER_COMM = w.Dup()
    return _TASK_COMM


def task_appnums() -> np.ndarray:
    """The appnum of every world rank (collective over the world on the first call, see :func:`task_comm`)."""
    task_comm()
    assert _APPNUMS is not None
    return _APPNUMS


def task_count() -> int:
    """Number of programs (tasks) in this launch."""
    return int(task_appnums().max(initial=0)) + 1


def task_leader(app: int) -> int:
    """World rank of the leader of task *app*: its lowest world rank (rank 0 of its task communicator)."""
    ranks = np.flatnonzero(task_appnums() == app)
    if not len(ranks):
        raise ValueError(f"no task {app} in this launch ({task_count()} task(s))")
    return int(ranks[0])


def task_size(app: int) -> int:
    """Number of ranks of task *app*."""
    return int(np.count_nonzero(task_appnums() == app))


def peer_comm() -> MPI.Intracomm | None:
    """Private duplicate of the world for traffic between tasks, None unless several tasks share the launch.

    Made once, collectively over the world, by :func:`task_comm`; task
    leaders exchange rendezvous messages on it and it is the peer
    communicator of :func:`intercomm`.
    """
    task_comm()
    return _PEER_COMM


def intercomm(local: MPI.Intracomm, remote_app: int, tag: int) -> MPI.Intercomm:
    """Collective over *local* and the matching call in task *remote_app*: an intercommunicator between them.

    *local* must have its leader (rank 0) on the lowest world rank of its
    group; the remote task's leader is its lowest world rank.  Both sides
    pass the same *tag*.  Blocks until the other side calls too: agree on
    it first (the transport does, with a handshake that has a timeout).
    """
    peer = peer_comm()
    if peer is None:
        raise ValueError("intercommunicators need several tasks in one MPMD launch")
    return local.Create_intercomm(0, peer, task_leader(remote_app), tag)


def finalized() -> bool:
    """Independent: whether MPI was finalized (no MPI call may be made any more)."""
    return bool(MPI.Is_finalized())


def check_mpi(what: str) -> None:
    """Independent: an :class:`~lamina.errors.MPIStateError` naming *what* where MPI cannot
    be used now (a call into MPICH then ends the process with no Python error): not
    initialized yet (``mpi4py.rc.initialize = False``), or finalized."""
    if finalized():
        raise MPIStateError(
            f"{what}: MPI was finalized (MPI.Finalize was called): close lamina files before "
            "finalizing MPI; the steps committed before stay"
        )
    if not MPI.Is_initialized():
        raise MPIStateError(
            f"{what}: MPI is not initialized (mpi4py.rc.initialize is False): call "
            "MPI.Init() or MPI.Init_thread() first"
        )


def resolve(comm: MPI.Comm | None) -> MPI.Comm:
    """The communicator a file should use: *comm*, else the task communicator; a
    TypeError or ValueError naming ``comm`` for one a file cannot use."""
    check_mpi("lamina.open")
    if comm is None:
        return task_comm()
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError(
            "comm is MPI.COMM_NULL (a communicator freed, or one this rank is not a member "
            "of): give the communicator of the ranks that open the file"
        )
    if comm.Is_inter():
        raise TypeError(
            "comm is an intercommunicator: a file is opened by the ranks of one group; give "
            "an intracommunicator (e.g. comm.Merge() or each side's own communicator)"
        )
    return comm


def at_finalize(fn: Callable[[], None]) -> None:
    """Independent: call *fn* when the program calls ``MPI.Finalize`` itself (first thing in
    it, while MPI still works: a delete callback of an attribute of ``MPI.COMM_SELF``,
    which MPI frees first), as HDF5 closes its library there."""

    def deleted(comm, keyval, value) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - nothing to raise to inside MPI_Finalize
            pass

    keyval = MPI.Comm.Create_keyval(delete_fn=deleted)
    MPI.COMM_SELF.Set_attr(keyval, 1)


#: the thread level background I/O needs (two threads calling MPI at once)
THREAD_MULTIPLE = MPI.THREAD_MULTIPLE

_THREAD_NAMES = {
    MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE",
    MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
    MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
    MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE",
}


def thread_level() -> int:
    """Independent: the thread support MPI gave this process (mpi4py asks for MULTIPLE by default)."""
    return int(MPI.Query_thread())


def thread_level_name(level: int) -> str:
    """``MPI_THREAD_...`` for a thread level."""
    return _THREAD_NAMES.get(level, f"thread level {level}")


def dup(comm: MPI.Comm) -> MPI.Comm:
    """Collective: a private duplicate of *comm* for library traffic."""
    return comm.Dup()


#: the communicators (their handles) on which this rank heard that another rank left (see
#: :func:`leave`): no collective call on them can complete any more
_LEFT: set[int] = set()


def _heard(comm: MPI.Comm, err: BaseException) -> BaseException:
    """*err*, an error an agreement on *comm* brought from another rank; a rank that left
    (``lamina_left``) is remembered for :func:`has_left`."""
    if is_left(err):
        _LEFT.add(comm.py2f())
    return err


def has_left(comm: MPI.Comm) -> bool:
    """Independent: whether this rank heard, in an agreement on *comm*, that another rank
    left (then a close lets go of the file without a collective call: nobody would meet it)."""
    return comm.size > 1 and comm.py2f() in _LEFT


def free(comm: MPI.Comm) -> None:
    """Free a communicator made by :func:`dup` (ignores predefined ones)."""
    if comm not in (MPI.COMM_WORLD, MPI.COMM_SELF, MPI.COMM_NULL):
        _LEFT.discard(comm.py2f())
        _CUT.pop(comm.py2f(), None)
        try:
            comm.Free()
        except MPI.Exception:
            pass


# --- byte collectives -----------------------------------------------------


def _as_u8(data: bytes | bytearray | memoryview) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8) if len(data) else np.zeros(0, dtype=np.uint8)


def gather_bytes(comm: MPI.Comm, data: bytes, root: int = 0) -> list[bytes] | None:
    """Collective: gather one byte string from every rank at *root* (None elsewhere)."""
    if comm.size == 1:
        return [bytes(data)]
    n = np.array([len(data)], dtype=np.int64)
    if comm.rank == root:
        counts = np.zeros(comm.size, dtype=np.int64)
        comm.Gather(n, counts, root=root)
        displs = np.zeros(comm.size, dtype=np.int64)
        np.cumsum(counts[:-1], out=displs[1:])
        buf = np.empty(int(counts.sum()), dtype=np.uint8)
        comm.Gatherv(_as_u8(data), [buf, counts, displs, MPI.BYTE], root=root)
        return _split(buf, displs, counts)
    comm.Gather(n, None, root=root)
    comm.Gatherv(_as_u8(data), None, root=root)
    return None


def allgather_bytes(comm: MPI.Comm, data: bytes) -> list[bytes]:
    """Collective: every rank gets every rank's byte string."""
    if comm.size == 1:
        return [bytes(data)]
    n = np.array([len(data)], dtype=np.int64)
    counts = np.zeros(comm.size, dtype=np.int64)
    comm.Allgather(n, counts)
    displs = np.zeros(comm.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=displs[1:])
    buf = np.empty(int(counts.sum()), dtype=np.uint8)
    comm.Allgatherv(_as_u8(data), [buf, counts, displs, MPI.BYTE])
    return _split(buf, displs, counts)


def _split(buf: np.ndarray, displs: np.ndarray, counts: np.ndarray) -> list[bytes]:
    """Each rank's bytes of a gathered buffer (one copy each, not a copy of the whole first)."""
    return [buf[d : d + c].tobytes() for d, c in zip(displs.tolist(), counts.tolist(), strict=True)]


def bcast_bytes(comm: MPI.Comm, data: bytes | None, root: int = 0) -> bytes:
    """Collective: *root*'s byte string on every rank."""
    if comm.size == 1:
        return bytes(data or b"")
    n = np.array([len(data) if comm.rank == root and data is not None else 0], dtype=np.int64)
    comm.Bcast(n, root=root)
    buf = np.empty(int(n[0]), dtype=np.uint8)
    if comm.rank == root and data is not None and n[0]:
        buf[:] = _as_u8(data)
    if n[0]:
        comm.Bcast(buf, root=root)
    return buf.tobytes()


def exchange_bytes(comm: MPI.Comm, sends: list) -> list[np.ndarray]:
    """Collective: send ``sends[r]`` (bytes-like, possibly empty) to rank *r*; returns what each rank sent here.

    One Alltoall of sizes, then one Alltoallv of the payloads.  Each payload
    must stay below 2 GiB (MPI counts); used for halos and small pieces.
    """
    if len(sends) != comm.size:
        raise ValueError(
            f"exchange_bytes needs one payload per rank ({comm.size}), got {len(sends)}"
        )
    if comm.size == 1:
        return [np.frombuffer(bytes(sends[0]), dtype=np.uint8)]
    scounts = np.array([len(memoryview(s).cast("B")) for s in sends], dtype=np.int64)
    rcounts = np.zeros(comm.size, dtype=np.int64)
    comm.Alltoall(scounts, rcounts)
    if scounts.max(initial=0) >= 1 << 31 or rcounts.max(initial=0) >= 1 << 31:
        raise ValueError("exchange_bytes: one payload is 2 GiB or more")
    sdispl = np.zeros(comm.size, dtype=np.int64)
    np.cumsum(scounts[:-1], out=sdispl[1:])
    rdispl = np.zeros(comm.size, dtype=np.int64)
    np.cumsum(rcounts[:-1], out=rdispl[1:])
    sbuf = np.empty(int(scounts.sum()), dtype=np.uint8)
    for s, d, c in zip(sends, sdispl, scounts, strict=True):
        if c:
            sbuf[int(d) : int(d + c)] = np.frombuffer(memoryview(s).cast("B"), dtype=np.uint8)
    rbuf = np.empty(int(rcounts.sum()), dtype=np.uint8)
    comm.Alltoallv(
        [sbuf, scounts.astype(np.int32), sdispl.astype(np.int32), MPI.BYTE],
        [rbuf, rcounts.astype(np.int32), rdispl.astype(np.int32), MPI.BYTE],
    )
    return [rbuf[int(d) : int(d + c)] for d, c in zip(rdispl, rcounts, strict=True)]


# --- point to point (independent; raw bytes, never pickled objects) ------

ANY_SOURCE = MPI.ANY_SOURCE

Request = MPI.Request


#: probes of one poll for a message (:func:`poll_bytes`): two found every one of eight
#: messages waiting (MPICH 4, shared memory), one found one a drain
PROBES = 3


def poll_bytes(comm: MPI.Comm, source: int, tag: int) -> tuple[int, np.ndarray] | None:
    """Independent: receive one message of *tag* from *source* if one is waiting, else None.

    Returns ``(source rank, uint8 array)``.  Never blocks for a message that
    has not arrived, so callers can wait with a timeout (poll, then sleep).
    A message is looked for :data:`PROBES` times: MPICH's ``Iprobe`` makes
    progress on messages that arrived and finds them at a later call, so one
    probe a call took up one of eight waiting messages per drain.
    """
    st = MPI.Status()
    for _ in range(PROBES):
        if comm.Iprobe(source, tag, st):
            break
    else:
        return None
    n = st.Get_count(MPI.BYTE)
    src = st.Get_source()
    buf = np.empty(n, dtype=np.uint8)
    comm.Recv([buf, MPI.BYTE], src, tag)
    return src, buf


def isend_bytes(comm: MPI.Comm, buf: np.ndarray, dest: int, tag: int) -> MPI.Request:
    """Independent: start sending the uint8 array *buf*; keep it alive until the request completes."""
    return comm.Isend([buf, MPI.BYTE], dest, tag)


def irecv_bytes(comm: MPI.Comm, buf: np.ndarray, source: int, tag: int) -> MPI.Request:
    """Independent: start receiving at most ``len(buf)`` bytes into the uint8 array *buf*."""
    return comm.Irecv([buf, MPI.BYTE], source, tag)


def test_requests(reqs: list) -> list[int] | None:
    """Independent: None while any of *reqs* is pending, else the byte count each one moved."""
    if not reqs:
        return []
    statuses = [MPI.Status() for _ in reqs]
    if not MPI.Request.Testall(reqs, statuses):
        return None
    return [st.Get_count(MPI.BYTE) for st in statuses]


def cancel_receives(reqs: list) -> None:
    """Independent: withdraw receives that may never be matched (after a timeout), so no late message lands in their buffers."""
    for r in reqs:
        if r != MPI.REQUEST_NULL:
            r.Cancel()
            r.Wait()


def exchange_pairs(
    comm: MPI.Comm, sends: dict[int, np.ndarray], recvs: dict[int, np.ndarray], tag: int
) -> None:
    """Collective among the ranks named: send each uint8 array ``sends[r]`` to rank *r* and
    receive into each ``recvs[r]`` from rank *r*, all at once (non-blocking, then waited for).

    Both sides know every size beforehand (each buffer is received whole);
    a rank that neither sends nor receives returns at once.
    """
    reqs = [comm.Irecv([buf, MPI.BYTE], src, tag) for src, buf in recvs.items() if len(buf)]
    reqs += [comm.Isend([buf, MPI.BYTE], dst, tag) for dst, buf in sends.items() if len(buf)]
    if reqs:
        MPI.Request.Waitall(reqs)


def allreduce_int(comm: MPI.Comm, value: int, op: str = "max") -> int:
    """Collective: reduce one int64 over all ranks (op: 'max', 'min' or 'sum')."""
    if comm.size == 1:
        return int(value)
    ops = {"max": MPI.MAX, "min": MPI.MIN, "sum": MPI.SUM}
    out = np.zeros(1, dtype=np.int64)
    comm.Allreduce(np.array([value], dtype=np.int64), out, op=ops[op])
    return int(out[0])


def same_everywhere(comm: MPI.Comm, value: int) -> bool:
    """Collective: True if every rank passed the same int64 *value* (one allreduce)."""
    if comm.size == 1:
        return True
    out = np.zeros(2, dtype=np.int64)
    comm.Allreduce(np.array([value, -value], dtype=np.int64), out, op=MPI.MAX)
    return int(out[0]) == -int(out[1])


def spread_leaving(comm: MPI.Comm, value: int, seconds: float = 10.0) -> tuple[int, int] | None:
    """Collective, every rank leaving a file in the same agreement (:func:`leave`): the
    least and the largest int64 *value* of the ranks (one allreduce); None where they did
    not all come within *seconds* (they come at once: nothing waits between).  Not cut by an
    exception a signal's handler raises meanwhile (a second Ctrl-C), nor shortened by it:
    the rank is leaving on one already, and every rank must learn the same."""
    if comm.size == 1:
        return int(value), int(value)
    out = np.zeros(2, dtype=np.int64)
    req = comm.Iallreduce(np.array([-value, value], dtype=np.int64), out, op=MPI.MAX)
    deadline = time.monotonic() + seconds
    while True:
        try:
            done = wait_quietly([req], max(0.0, deadline - time.monotonic()))
            break
        except BaseException:  # noqa: BLE001 - a signal's exception: see above
            continue
    return (-int(out[0]), int(out[1])) if done else None


#: variants of a call :func:`who_made` names one by one (the others are counted)
WHO_MADE_SHOWN = 4


def who_made(comm: MPI.Comm, key: int, what: str) -> str:
    """Collective (once ranks are known to disagree): which ranks made which call, for the
    message every rank raises.  Ranks are grouped by *key* (the digest of their arguments),
    each group said with its *what* (the call in words), the group of rank 0 first."""
    raws = allgather_bytes(comm, int(key).to_bytes(8, "little", signed=True) + what.encode())
    groups: dict[int, tuple[list[int], str]] = {}
    for r, raw in enumerate(raws):
        k = int.from_bytes(raw[:8], "little", signed=True)
        groups.setdefault(k, ([], raw[8:].decode("utf-8", "replace")))[0].append(r)
    said = [
        f"{'rank' if len(ranks) == 1 else 'ranks'} {fmt_ranges(ranks)}: {words}"
        for ranks, words in list(groups.values())[:WHO_MADE_SHOWN]
    ]
    if len(groups) > WHO_MADE_SHOWN:
        said.append(f"{len(groups) - WHO_MADE_SHOWN} more variants")
    text = "; ".join(said)
    if len({words for _, words in groups.values()}) == 1:
        text += " (alike in these words: the arguments differ elsewhere)"
    return text


def barrier(comm: MPI.Comm) -> None:
    """Collective: wait for all ranks."""
    if comm.size > 1:
        comm.Barrier()


#: how long :func:`wait_quietly` yields the CPU before it starts to sleep, and its longest sleep
QUIET_SPIN = 2e-3
QUIET_MAX_SLEEP = 1e-3


def wait_quietly(
    reqs: list, seconds: float | None = None, between: Callable[[], None] | None = None
) -> bool:
    """Independent: wait for every request of *reqs* without holding the CPU meanwhile; True
    when they completed, False after *seconds* (None: no limit).  *between* is called after
    each test that finds them incomplete.

    MPICH's ``Wait`` polls without pause: a rank waiting for another one
    that has work to do takes a core from it when the node has fewer cores
    than ranks.  This tests, yields the CPU for :data:`QUIET_SPIN` seconds,
    then sleeps between tests (20 us, doubling up to
    :data:`QUIET_MAX_SLEEP`), so it answers within about that much after
    the last request completes.  For waits expected to be long (a member
    rank while its aggregator writes); short ones are done at the first test.
    """
    if MPI.Request.Testall(reqs):
        return True
    now = time.monotonic()
    spin_until = now + QUIET_SPIN
    deadline = None if seconds is None else now + seconds
    delay = 2e-5
    while not MPI.Request.Testall(reqs):
        if between is not None:
            between()
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return False
        if now < spin_until:
            os.sched_yield()
        else:
            time.sleep(delay)
            delay = min(2 * delay, QUIET_MAX_SLEEP)
    return True


#: what a rank that did not fail adds to an agreement, in ranks (an original error counts its
#: rank, one brought from another rank its rank plus the size: see agree)
_NONE = 2
#: the int64 of an agreement's allreduce (MIN): the failing rank, the largest flag (negated),
#: the two call slots (:func:`_call_slots`), and 1 where every rank leaves (:func:`leave`)
_SLOTS = 5

#: the collective calls an agreement may name (``agree(call=...)``): the first agreement of
#: each names its call, so that ranks in different calls raise instead of pairing them
CALL_END_STEP, CALL_CLOSE, CALL_DERIVE, CALL_DEFINE, CALL_FLUSH = 1, 2, 3, 4, 5
CALL_REFRESH, CALL_READ, CALL_WAIT = 6, 7, 8
CALL_NAMES = {
    CALL_END_STEP: "end_step",
    CALL_CLOSE: "close",
    CALL_DERIVE: "derive",
    CALL_DEFINE: "create_dataset",
    CALL_FLUSH: "flush",
    CALL_REFRESH: "refresh",
    CALL_READ: "read(collective=True)",
    CALL_WAIT: "wait_for_step",
}
#: what an agreement that names no call adds to the two call slots (the least is taken)
_NO_CALL = np.iinfo(np.int64).max


def _call_slots(call: int) -> list[int]:
    return [call, -call] if call else [_NO_CALL, _NO_CALL]


def _same_call(out: np.ndarray) -> None:
    """CollectiveMismatchError where the call slots of an agreement's result *out* show that
    ranks named different calls (an agreement that names none pairs with any)."""
    if int(out[2]) != _NO_CALL and int(out[2]) != -int(out[3]):
        a, b = (CALL_NAMES.get(c, str(c)) for c in (int(out[2]), -int(out[3])))
        raise mark_collective(
            CollectiveMismatchError(
                f"ranks made different collective calls together: {a} on some, {b} on "
                "others (a collective call made on some ranks only); every rank must make "
                "the same collective calls in the same order"
            )
        )


def agree(
    comm: MPI.Comm,
    exc: BaseException | None,
    flag: int = 0,
    quiet: bool = False,
    seen: list[int] | None = None,
    call: int = 0,
) -> int:
    """Collective: raise on every rank if any rank failed; else return the largest *flag*.

    Each rank passes the exception it caught in the phase just finished (or
    None).  If none failed this returns the maximum of the ranks' *flag*
    (one allreduce carries both).  Otherwise the lowest failing rank's
    error is re-raised on every rank as the same lamina error class, so a
    failure on one rank never leaves the others waiting in a later
    collective.  The failing rank re-raises its own exception object.

    With *quiet* it waits with :func:`wait_quietly` (for ranks expected
    to wait long, so that they leave the CPU to the ones still working).
    *seen*, a list, gets the largest flag appended whether or not a rank
    failed (a caller that must act alike on every rank after a failure).
    *call* (one of :data:`CALL_NAMES`) names the collective call this
    agreement begins: where ranks name different calls (a collective call
    made on some ranks only, paired with another call of the others), every
    rank raises a :class:`~lamina.errors.CollectiveMismatchError` naming
    them, instead of the ranks going on through different collectives.

    Every collective call of an engine communicates first through this
    function, so that a rank that gives up on a file (:func:`leave`) meets
    the others at their next collective call, whichever it is.

    An exception a signal's handler raises meanwhile (``KeyboardInterrupt``
    at Ctrl-C) is raised once this rank took its part: where the allreduce
    completed and a rank failed, the others go on to the broadcast of its
    error with this one, so it takes part in that first (else they would
    wait for it); the exception carries the marks of the error the others
    raise (``lamina_collective``, ``lamina_left``), and *seen* is told as
    for that error.  Where none failed, the others go on with their call
    and this rank raises at once (*seen* not told: it left the call
    halfway).  Where it came before the allreduce completed here, the
    agreement is kept for :func:`leave`, which ends it first.
    """
    if comm.size == 1:
        if seen is not None:
            seen.append(int(flag))
        if exc is not None:
            raise mark_collective(exc)
        return int(flag)
    # the rank whose error is raised everywhere: the lowest one whose error is its own, else the
    # lowest one that failed with another rank's (an error an earlier agreement brought it)
    failed = _NONE * comm.size
    if exc is not None:
        failed = comm.rank + (comm.size if hasattr(exc, "lamina_from_rank") else 0)
    out = np.empty(_SLOTS, dtype=np.int64)
    # non-blocking, then waited for: a nonblocking collective matches only nonblocking ones, and
    # leave() and PendingAgree must meet this one
    req = comm.Iallreduce(
        np.array([failed, -int(flag), *_call_slots(call), 0], dtype=np.int64), out, op=MPI.MIN
    )
    cut: BaseException | None = None
    try:
        _wait(req, quiet)
    except BaseException as e:  # a signal's (Ctrl-C): raised during the wait or just after
        if not req.Test():
            _CUT[comm.py2f()] = _Cut(req, out)
            raise
        cut = e
    if int(out[0]) >= _NONE * comm.size and cut is not None:
        # the others go on with their call, this rank not: left halfway (*seen* not told)
        raise cut
    if seen is not None:
        seen.append(-int(out[1]))
    if int(out[0]) >= _NONE * comm.size:
        _same_call(out)
        return -int(out[1])
    first = int(out[0]) % comm.size
    payload = _error_payload(exc, left=False) if comm.rank == first else None
    # (interrupted: the others are in this broadcast already, or never come)
    seconds = SAID_TIMEOUT if cut is None else INTERRUPTED_WAIT
    raw, late = _said(comm, payload, first, seconds)
    cut = cut or late
    if comm.rank == first:
        assert exc is not None
        err = mark_collective(exc)
    elif raw is None:
        err = _unsaid(comm, first, seconds)
    else:
        err = _heard(comm, _error_from_payload(raw, first))
    if cut is not None:
        raise _marked_as(cut, err)
    raise err


def _wait(req: MPI.Request, quiet: bool) -> None:
    """The wait of an agreement's allreduce (:func:`agree`)."""
    if quiet:
        wait_quietly([req])
    else:
        req.Wait()


class _Cut:
    """An agreement that an exception (a signal's) cut on this rank before its allreduce
    completed: the request still pending, and its result (:func:`leave`)."""

    def __init__(self, req: MPI.Request, out: np.ndarray) -> None:
        self.req, self.out = req, out


#: the agreements cut on this rank, by communicator (handle), for :func:`leave`
_CUT: dict[int, _Cut] = {}

#: how long the broadcast of a failing rank's error waits for it (it follows an allreduce that
#: every rank completed, and the failing rank takes part even when interrupted: it does not
#: come only where that rank died; generous, for ranks that share cores under load)
SAID_TIMEOUT = 60.0
#: how long a rank waits for the others once interrupted (``KeyboardInterrupt``, ``SystemExit``:
#: :func:`interrupted`), in :func:`leave` and in an agreement: Ctrl-C reaches every rank of a
#: job, which leaves too or waits in a collective call that this rank meets at once
INTERRUPTED_WAIT = 1.0


def _wait_until(reqs: list, seconds: float) -> tuple[bool, BaseException | None]:
    """:func:`wait_quietly` for at most *seconds*, not cut by an exception (a signal's): the
    completion, and the first such exception raised meanwhile, returned for the caller to
    raise once it took its part (it waits :data:`INTERRUPTED_WAIT` more at most then)."""
    deadline = time.monotonic() + seconds
    cut: BaseException | None = None
    while True:
        try:
            return wait_quietly(reqs, max(0.0, deadline - time.monotonic())), cut
        except BaseException as e:  # noqa: BLE001 - returned, raised by the caller
            cut = cut or e
            deadline = min(deadline, time.monotonic() + INTERRUPTED_WAIT)


def _said(
    comm: MPI.Comm, payload: bytes | None, root: int, seconds: float
) -> tuple[bytes | None, BaseException | None]:
    """The second phase of an agreement in which a rank failed or left: *root*'s *payload*
    on every rank, in nonblocking broadcasts (:func:`agree`, :func:`leave` and
    :meth:`PendingAgree.finish` meet in them), waited for at most *seconds* (None where it
    did not come: a rank that an interrupt cut may never take part).  An exception raised
    meanwhile is returned (:func:`_wait_until`): the others would wait for this rank."""
    n = np.array([len(payload) if comm.rank == root and payload is not None else 0], np.int64)
    deadline = time.monotonic() + seconds
    done, cut = _wait_until([comm.Ibcast(n, root=root)], seconds)
    if not done:
        return None, cut
    buf = np.empty(int(n[0]), dtype=np.uint8)
    if n[0]:
        if comm.rank == root and payload is not None:
            buf[:] = _as_u8(payload)
        done, late = _wait_until(
            [comm.Ibcast(buf, root=root)], max(0.0, deadline - time.monotonic())
        )
        cut = cut or late
        if not done:
            return None, cut
    return buf.tobytes(), cut


def _unsaid(comm: MPI.Comm, rank: int, seconds: float) -> BaseException:
    """What a rank raises where *rank* failed or left in an agreement and its error did not
    come within *seconds* (:func:`_said`): that rank is gone from the file, as one that left."""
    err = error_from_wire(
        "RemoteError",
        f"rank {rank} failed or left the file, and did not say why within {seconds:g} s "
        "(interrupted there?); let go of the file here too",
    )
    err.lamina_left = True  # type: ignore[attr-defined]
    err.lamina_from_rank = rank  # type: ignore[attr-defined]
    return _heard(comm, mark_collective(err))


def _marked_as(cut: BaseException, err: BaseException) -> BaseException:
    """*cut* (a signal's exception, raised instead of *err*, the error of an agreement that
    this rank took its part in) with the marks that tell the callers what *err* tells."""
    for mark in ("lamina_collective", "lamina_left"):
        if getattr(err, mark, False):
            setattr(cut, mark, True)
    return cut


class PendingAgree:
    """:func:`agree` without blocking: :meth:`test` until True, then :meth:`finish` (for waits
    that must serve meanwhile).  *call* as :func:`agree`'s."""

    def __init__(self, comm: MPI.Comm, flag: int = 0, call: int = 0) -> None:
        self.comm = comm
        self.out = np.empty(_SLOTS, dtype=np.int64)
        self.flag = int(flag)
        self.req = (
            comm.Iallreduce(
                np.array([_NONE * comm.size, -self.flag, *_call_slots(call), 0], dtype=np.int64),
                self.out,
                op=MPI.MIN,
            )
            if comm.size > 1
            else None
        )
        if self.req is not None:  # cut where an exception leaves the caller's loop (a signal's)
            _CUT[comm.py2f()] = _Cut(self.req, self.out)

    def test(self) -> bool:
        return self.req is None or bool(self.req.Test())

    def finish(self) -> int:
        """The largest flag; raises what a rank that left said (as :func:`agree`)."""
        if self.req is None:
            return self.flag
        _CUT.pop(self.comm.py2f(), None)
        self.req.Wait()
        if int(self.out[0]) >= _NONE * self.comm.size:
            _same_call(self.out)
            return -int(self.out[1])
        first = int(self.out[0]) % self.comm.size
        raw, cut = _said(self.comm, None, first, SAID_TIMEOUT)
        err = (
            _unsaid(self.comm, first, SAID_TIMEOUT)
            if raw is None
            else _heard(self.comm, _error_from_payload(raw, first))
        )
        if cut is not None:
            raise _marked_as(cut, err)
        raise err


#: how long :func:`leave` waits for the others after an error of this rank's own
LEAVE_TIMEOUT = 10.0


def interrupted(exc: BaseException | None) -> bool:
    """Whether *exc* stops the program (Ctrl-C's ``KeyboardInterrupt``, a ``SystemExit``)
    rather than reports an error."""
    return isinstance(exc, (KeyboardInterrupt, SystemExit))


def leave(comm: MPI.Comm, exc: BaseException, timeout: float | None = None) -> bool:
    """Tell the other ranks that this one gives up on the file after *exc*; True if they heard it.

    For a rank that leaves a file after an error only it saw: the others
    are in (or will come to) their next collective call on *comm*, which
    starts with :func:`agree`; this meets them there, so they raise a
    :class:`~lamina.errors.RemoteError` marked ``lamina_left`` (let go of
    the file too: a collective with this rank would wait forever) instead of
    waiting.  If nobody comes within *timeout* seconds (the others finished
    with the file), it gives up waiting: by default :data:`LEAVE_TIMEOUT`,
    :data:`INTERRUPTED_WAIT` after an interrupt (:func:`interrupted`).
    Where this rank heard that another rank left, nobody waits for it: it
    returns at once.  An agreement that an interrupt cut on this rank before
    it completed (:func:`agree`) is ended first, the others meeting it there.

    Where every rank leaves in the same agreement (each after an error of
    its own: the same error on every rank, raised outside any collective
    call), none is told, and none is in another collective call: *exc* is
    marked collective (:func:`~lamina.errors.mark_collective`), and the
    ranks close the file together, as one rank does after its error.
    """
    if comm.size == 1:
        return True
    if timeout is None:
        timeout = INTERRUPTED_WAIT if interrupted(exc) else LEAVE_TIMEOUT
    deadline = time.monotonic() + timeout
    cut = _CUT.pop(comm.py2f(), None)
    if cut is not None:
        # the others meet this rank in that agreement first (its part was sent)
        done, _ = _wait_until([cut.req], timeout)
        if not done:
            return False  # the request stays pending on a communicator nobody uses any more
        if int(cut.out[0]) < _NONE * comm.size:  # a rank failed or left in it: its word first
            first = int(cut.out[0]) % comm.size
            payload = _error_payload(exc, left=True) if comm.rank == first else None
            raw, _ = _said(comm, payload, first, max(timeout, 0.1))
            if raw is None or comm.rank == first or raw[:1] == b"L":
                # told them (they let go: nobody calls on the file any more), or a rank left
                return raw is not None
        # the others went on to their next collective call: met there, as below
    if has_left(comm):
        return True  # every rank heard it in that agreement: nobody calls on the file again
    out = np.empty(_SLOTS, dtype=np.int64)
    req = comm.Iallreduce(
        np.array([comm.rank, 0, *_call_slots(0), 1], dtype=np.int64), out, op=MPI.MIN
    )
    done, _ = _wait_until([req], max(0.0, deadline - time.monotonic()))
    if not done:
        return False  # the request stays pending on a communicator nobody uses any more
    if int(out[4]):
        # every rank leaves in this agreement, each after an error of its own: nobody is left
        # to tell, and none is in another collective call; they close the file together
        mark_collective(exc)
        return True
    first = int(out[0]) % comm.size
    payload = _error_payload(exc, left=True) if comm.rank == first else None
    # every rank is in the same agreement now; bounded all the same (an interrupt may cut one)
    raw, _ = _said(comm, payload, first, max(timeout, 0.1))
    return raw is not None


def _error_payload(exc: BaseException | None, left: bool) -> bytes:
    assert exc is not None
    kind, text = error_to_wire(exc)
    return (b"L" if left else b"E") + kind.encode() + b"\0" + text.encode("utf-8", "replace")


def _error_from_payload(raw: bytes, rank: int) -> BaseException:
    left, rest = raw[:1] == b"L", raw[1:]
    name, _, msg = rest.partition(b"\0")
    text = msg.decode("utf-8", "replace")
    kind = name.decode("ascii", "replace")
    if left:  # not this rank's error: a RemoteError that says whose it was
        # (a builtin's text names its class already: 'ValueError: ...', not 'Remote:ValueError')
        said = text if kind.startswith("Remote") else f"{kind}: {text}"
        text = f"rank {rank} left the file after an error of its own ({said}); let go of the file here too"
        kind = "RemoteError"
    err = error_from_wire(kind, text, rank=None if left else rank)
    if left:
        err.lamina_left = True  # type: ignore[attr-defined]
    err.lamina_from_rank = rank  # type: ignore[attr-defined]  # not this rank's own (agree)
    return mark_collective(err)


class HeldInterrupts:
    """Context manager: Ctrl-C (SIGINT) held while the ranks go through a protocol together.

    Between the agreements of a collective call (:func:`agree`) ranks exchange in MPI calls
    of their own (an allgather, sends and receives): an interrupt raised on one rank after
    such a call completed there, the others gone on to the next, left them waiting for it for
    ever.  Inside, the first SIGINT is kept and raised as the handler raises it (the
    ``KeyboardInterrupt``) once the block ends, the protocol done on every rank; a second
    SIGINT is raised at once (the program is stuck: the user insists).  An exception leaving
    the block meanwhile is raised as the interrupt, with its marks (``lamina_collective``,
    ``lamina_left``; as :func:`agree` does).  Only in the main thread (signals are handled
    there), and only where the handler is a Python one (not ignored, not the default's kill).
    """

    __slots__ = ("prev", "count")

    def __init__(self) -> None:
        self.prev: Callable | None = None
        self.count = 0

    def __enter__(self) -> HeldInterrupts:
        if threading.current_thread() is not threading.main_thread():
            return self
        prev = signal.getsignal(signal.SIGINT)
        # (inside another hold, that one holds: counted there, a second SIGINT is at once)
        if callable(prev) and not isinstance(getattr(prev, "__self__", None), HeldInterrupts):
            self.prev = prev
            signal.signal(signal.SIGINT, self._hold)
        return self

    def _hold(self, signum, frame) -> None:
        self.count += 1
        if self.count > 1 and self.prev is not None:
            prev, self.prev = self.prev, None
            signal.signal(signal.SIGINT, prev)
            prev(signum, frame)

    def __exit__(self, et, ev, tb) -> None:
        prev, self.prev = self.prev, None
        if prev is None:
            return
        signal.signal(signal.SIGINT, prev)
        if self.count:  # (a second one between the two lines above was not raised either)
            try:
                prev(signal.SIGINT, sys._getframe())
            except BaseException as cut:
                if ev is not None:
                    raise _marked_as(cut, ev) from ev
                raise


class Guard:
    """Context manager that records an exception for :func:`agree` instead of raising.

    ::

        g = Guard()
        with g:
            risky_local_work()
        agree(comm, g.error)   # collective: every rank raises if any failed
    """

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, et, ev, tb) -> bool:
        if ev is not None and isinstance(ev, Exception):
            self.error = ev
            return True
        return False


__all__ = [
    "ANY_SOURCE",
    "Comm",
    "Request",
    "Tag",
    "LaminaError",
    "Guard",
    "HeldInterrupts",
    "exchange_pairs",
    "agree",
    "allgather_bytes",
    "allreduce_int",
    "appnum",
    "barrier",
    "bcast_bytes",
    "cancel_receives",
    "dup",
    "free",
    "gather_bytes",
    "intercomm",
    "in_workflow",
    "job_start",
    "PendingAgree",
    "leave",
    "spread_leaving",
    "irecv_bytes",
    "isend_bytes",
    "poll_bytes",
    "peer_comm",
    "resolve",
    "task_appnums",
    "self_comm",
    "set_task_comm",
    "task_comm",
    "task_count",
    "task_leader",
    "task_size",
    "test_requests",
    "wait_quietly",
    "THREAD_MULTIPLE",
    "thread_level",
    "thread_level_name",
    "env_seconds",
    "transport_patience",
    "world",
    "who_made",
    "world_patience",
]
