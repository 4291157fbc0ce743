"""Pairing a producer and its consumers of one name, then connecting them with intercommunicators.

Task leaders (rank 0 of each task, its lowest world rank) talk on the
private duplicate of the world (:func:`lamina.comm.peer_comm`):

1. each consumer leader sends ``HELLO(name, seq, appnum, size)`` to the
   producer's leader and waits for ``ACCEPT``;
2. the producer leader, in its ``open``, waits for the ``HELLO`` of every
   consumer task of the name (in appnum order), then for each one sends
   ``ACCEPT`` and waits for its ``READY``; then its whole task calls
   ``Create_intercomm`` with it, while the consumer task, having got
   ``ACCEPT`` and sent ``READY``, does the same once the producer's ``GO``
   came.  (Without ``READY`` a producer whose ``ACCEPT`` answered a
   consumer that had given up waiting for it, and never opened again,
   waited in ``Create_intercomm`` for ever: a small message's send
   completes whether or not it is ever received; without ``GO`` so did a
   consumer that took the ``ACCEPT`` of a producer that had given up.)

``seq`` counts the opens of a name in one role by this process, so the
k-th producer open pairs with the k-th consumer open of the same name.
Under a workflow the name both sides send is the workflow entry the name
matches (:func:`key_for`), so that one file spelled two ways (``out.lam``
by a task running in ``run/``, ``run/out.lam`` by one running above it)
pairs as it does when it is a file.
Messages for names this task has not opened yet are kept (``_STASH``)
until it does.  Every wait polls with a timeout: a consumer of a name that
nobody produces gets :class:`~lamina.errors.TransportError`, not a hang.
"""

from __future__ import annotations

import os

import numpy as np

from ... import comm as comm_mod
from ...catalog import Decoder, Encoder
from ...errors import FormatError, TransportError
from ...workflow import routes
from .wire import Poll

# (tag, source world rank, name, seq) -> (appnum, size, flow) of messages not yet wanted
_STASH: dict[tuple[int, int, str, int], tuple[int, int, int]] = {}
# (name, role) -> number of opens so far in this process
_SEQ: dict[tuple[str, str], int] = {}


def key_for(name: str, wf: routes.Workflow | None) -> str:
    """The name a rendezvous pairs on for *name* (normalized, as opened): *name* itself,
    or under a workflow the entry it matches and the part of it the entry looks at.

    Routing matches an entry's pattern against the name or its last path
    component, so two spellings of one file from different directories
    (``out.lam`` and ``run/out.lam``) route alike; they pair alike too: by
    the entry and the last path component (a pattern without ``/``), or the
    whole name (a pattern with one, which only a whole name can match; the
    absolute path where ``lamina run`` made the pattern absolute).
    """
    if wf is None:
        return name
    i = wf._match(name)
    if i is None:
        return name
    pattern = wf.entries[i][0]
    if os.path.isabs(pattern):  # (the file on disk, whichever directory a task opened it from)
        return f"{pattern}|{os.path.realpath(name)}"
    return f"{pattern}|{name if '/' in pattern else os.path.basename(name)}"


def _shown(key: str) -> str:
    """The name in a rendezvous key, as messages show it."""
    return key.rpartition("|")[2]


def next_seq(name: str, role: str) -> int:
    """The number of this task's next open of *name* in *role* ('r', 'w'), taken by
    :func:`opened` once the open has paired: an open that failed (no partner within its
    timeout) leaves it to the next one, so that a program that opens again after a
    TransportError pairs with its partner's first open (its number taken, the retry's
    greeting went unanswered, and a partner that had answered the first waited for ever)."""
    return _SEQ.get((name, role), 0)


def opened(name: str, role: str, seq: int) -> None:
    """Open number *seq* of *name* in *role* paired: the next open takes the next number."""
    _SEQ[(name, role)] = seq + 1


def _encode(name: str, seq: int, app: int, size: int, flow: int = 1) -> np.ndarray:
    e = Encoder()
    e.str(name)
    e.u32(seq)
    e.u32(app)
    e.u32(size)
    e.u32(flow)
    return np.frombuffer(e.getvalue(), dtype=np.uint8).copy()


def _decode(buf: np.ndarray) -> tuple[str, int, int, int, int]:
    d = Decoder(buf.tobytes(), "transport rendezvous message")
    name = d.str()
    seq, app, size, flow = d.u32(), d.u32(), d.u32(), d.u32()
    d.expect_end()
    return name, seq, app, size, flow


def _drain(peer, tag: int) -> None:
    while True:
        got = comm_mod.poll_bytes(peer, comm_mod.ANY_SOURCE, tag)
        if got is None:
            return
        src, buf = got
        try:
            name, seq, app, size, flow = _decode(buf)
        except FormatError:
            continue  # not ours: the peer communicator is private, so this does not happen
        _STASH[(tag, src, name, seq)] = (app, size, flow)


def _await(
    peer, tag: int, source: int, name: str, seq: int, poll: Poll, what: str
) -> tuple[int, int, int]:
    key = (tag, source, name, seq)
    while True:
        _drain(peer, tag)
        if key in _STASH:
            return _STASH.pop(key)
        if poll.expired:
            raise TransportError(f"{what}: nothing after {poll.timeout:g} s")
        poll.sleep()


def _ask(
    peer,
    tags: tuple[int, int],
    dest: int,
    name: str,
    seq: int,
    buf,
    poll: Poll,
    asking: str,
    waiting: str,
) -> None:
    """Send *buf* with the first of *tags* to *dest*, then wait for its reply with the second
    (within *poll*'s timeout; one of an earlier try of this open dropped first)."""
    _forget(peer, tags[1], dest, name, seq)
    _send(peer, buf, dest, tags[0], poll, asking)
    _await(peer, tags[1], dest, name, seq, poll, waiting)


def _forget(peer, tag: int, source: int, name: str, seq: int) -> None:
    """Drop a message of *tag* from *source* for open *seq* of *name* that came already: the
    answer to an earlier try of this open, which gave up (a reply counts only after the
    message it answers)."""
    _drain(peer, tag)
    _STASH.pop((tag, source, name, seq), None)


def _opened_instead(leader: int, task: int, key: str) -> str:
    """For a producer whose consumer task never opened its name: the names that task did open
    for reading from it (their ``HELLO`` is here, stashed), which tells a name spelled two ways."""
    other = sorted(
        {
            _shown(k[2])
            for k in _STASH
            if k[0] == comm_mod.Tag.HELLO and k[1] == leader and k[2] != key
        }
    )
    if not other:
        return ""
    return f"; task {task} opened {', '.join(map(repr, other))} for reading instead"


def _send(peer, buf: np.ndarray, dest: int, tag: int, poll: Poll, what: str) -> None:
    req = comm_mod.isend_bytes(peer, buf, dest, tag)
    while comm_mod.test_requests([req]) is None:
        if poll.expired:
            raise TransportError(f"{what}: the message was not taken in {poll.timeout:g} s")
        poll.sleep()


def _check_task_comm(comm, app: int) -> None:
    """Collective: the file's communicator must span the whole task, leader first."""
    ok = comm.size == comm_mod.task_size(app)
    if comm.rank == 0:
        ok = ok and comm_mod.world().rank == comm_mod.task_leader(app)
    if not comm_mod.allreduce_int(comm, int(ok), "min"):
        raise TransportError(
            "the memory transport needs a file opened on the task's whole communicator "
            "(the default), with its lowest world rank as rank 0"
        )


def connect_producer(
    comm, name: str, app: int, consumers: tuple[int, ...], timeout: float, key: str | None = None
) -> list:
    """Collective over the producer task: ``[(consumer appnum, intercomm, flow)]``, one per consumer task.

    *flow* is the consumer task's flow policy from its ``HELLO`` (see :func:`.workflow.parse_flow`).
    *key* (default *name*) is what the rendezvous pairs on (:func:`key_for`).
    """
    _check_task_comm(comm, app)
    key = name if key is None else key
    peer = comm_mod.peer_comm()
    seq = next_seq(key, "w")
    g = comm_mod.Guard()
    flows = np.ones(len(consumers), dtype=np.int64)
    with g:
        if comm.rank == 0:
            poll = Poll(timeout)
            for i, c in enumerate(consumers):
                leader = comm_mod.task_leader(c)
                try:
                    flows[i] = _await(
                        peer,
                        comm_mod.Tag.HELLO,
                        leader,
                        key,
                        seq,
                        poll,
                        f"producer of {name!r} (task {app}) waiting for its consumer task {c} to open it",
                    )[2]
                except TransportError as e:
                    raise TransportError(f"{e}{_opened_instead(leader, c, key)}") from None
    comm_mod.agree(comm, g.error)
    raw = comm_mod.bcast_bytes(comm, flows.tobytes() if comm.rank == 0 else None, root=0)
    flows = np.frombuffer(raw, dtype=np.int64)
    links = []
    try:
        for c in consumers:
            g = comm_mod.Guard()
            with g:
                if comm.rank == 0:
                    leader = comm_mod.task_leader(c)
                    poll = Poll(timeout)
                    mine = _encode(key, seq, app, comm.size)  # (sent twice: ACCEPT, then GO)
                    _ask(
                        peer,
                        (comm_mod.Tag.ACCEPT, comm_mod.Tag.READY),
                        leader,
                        key,
                        seq,
                        mine,
                        poll,
                        f"producer of {name!r} accepting task {c}",
                        f"producer of {name!r} (task {app}): consumer task {c} did not take "
                        "its answer (it gave up waiting before it came, and did not open the "
                        "name again)",
                    )
                    _send(
                        peer,
                        mine,
                        leader,
                        comm_mod.Tag.GO,
                        poll,
                        f"producer of {name!r} going on with task {c}",
                    )
            comm_mod.agree(comm, g.error)
            links.append(
                (
                    c,
                    comm_mod.intercomm(comm, c, comm_mod.Tag.INTERCOMM),
                    int(flows[consumers.index(c)]),
                )
            )
    except BaseException:
        for _, inter, _ in links:
            comm_mod.free(inter)
        raise
    opened(key, "w", seq)
    return links


def connect_consumer(
    comm,
    name: str,
    app: int,
    producer: int,
    timeout: float,
    flow: int = 1,
    key: str | None = None,
):
    """Collective over a consumer task: the intercommunicator to the producer task of *name*
    (*key*, default *name*: what the rendezvous pairs on, :func:`key_for`)."""
    _check_task_comm(comm, app)
    key = name if key is None else key
    peer = comm_mod.peer_comm()
    seq = next_seq(key, "r")
    g = comm_mod.Guard()
    with g:
        if comm.rank == 0:
            poll = Poll(timeout)
            leader = comm_mod.task_leader(producer)
            _send(
                peer,
                _encode(key, seq, app, comm.size, flow),
                leader,
                comm_mod.Tag.HELLO,
                poll,
                f"consumer of {name!r} (task {app}) greeting producer task {producer}",
            )
            _await(
                peer,
                comm_mod.Tag.ACCEPT,
                leader,
                key,
                seq,
                poll,
                f"no producer for {name!r}: task {producer} did not open it for writing",
            )
    comm_mod.agree(comm, g.error)
    g = comm_mod.Guard()
    with g:
        if comm.rank == 0:
            # this task goes on to Create_intercomm once the producer, told so, does too: an
            # answer (ACCEPT) of a producer that gave up waiting for this since comes with no
            # GO (a small message is sent whether or not anyone receives it)
            leader = comm_mod.task_leader(producer)
            poll = Poll(timeout)
            _ask(
                peer,
                (comm_mod.Tag.READY, comm_mod.Tag.GO),
                leader,
                key,
                seq,
                _encode(key, seq, app, comm.size, flow),
                poll,
                f"consumer of {name!r} (task {app}) confirming to producer task {producer}",
                f"producer of {name!r} (task {producer}) answered this task's open, then gave up "
                "waiting for it",
            )
    comm_mod.agree(comm, g.error)
    inter = comm_mod.intercomm(comm, producer, comm_mod.Tag.INTERCOMM)
    opened(key, "r", seq)
    return inter
