"""What the producer and the consumer side of the in situ transport share: options, routes, the end of a launch.

``LAMINA_TRANSPORT=file|memory|both`` (or ``lamina.open(..., transport=...)``)
chooses, outside the program, whether a file is written to disk as usual
(``file``), or served from the producer's memory to the consumer programs
(``memory``, engine ``mpi``; ``both`` writes the file too).
``LAMINA_WORKFLOW`` says which program produces which name
(:mod:`lamina.workflow.routes`); see ``docs/transport.md``.

A program that opens a name for writing gets a :class:`~.producer.Producer`,
one that opens it for reading a :class:`~.consumer.Consumer`; both are block
engines whose catalog is built from the same committed records.
"""

from __future__ import annotations

import atexit
import math
import numbers
import os
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np

from ... import comm as comm_mod
from ...errors import LaminaWarning, ModeError
from ...geometry import as_int
from ...workflow import routes
from ..base import flag_option
from ..block import BlockEngine
from . import rendezvous, wire
from .wire import Poll

SERVE_ENV = "LAMINA_TRANSPORT_SERVE"
#: how producers answer requests: a serving thread (default), or only inside lamina calls
SERVE_MODES = ("thread", "calls")

#: options only the transport knows (the registry drops them for other engines)
#: seconds a side leaving after an error waits for the other to take its last message (a
#: peer that stopped answering is not waited for a whole timeout again)
ABANDON_PATIENCE = 2.0
TRANSPORT_OPTIONS = frozenset({"timeout", "queue_limit", "shallow", "flow", "serve", "stats"})

MPI = wire.MPI


def _timeout(options: dict) -> float:
    """The option ``timeout`` (seconds > 0; None: not given), else ``$LAMINA_TRANSPORT_TIMEOUT``,
    else 60 (:func:`lamina.comm.transport_patience`, which the first task_comm waits as
    long); ValueError naming the one given for anything else."""
    given = options.get("timeout")
    if given is None:
        return comm_mod.transport_patience()
    real = not isinstance(given, bool) and isinstance(given, numbers.Real)
    seconds = float(given) if real else math.nan
    if not seconds > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {given!r}")
    return seconds


class TransportBase(BlockEngine):
    """The options and the route of a transported name, common to both sides."""

    OPTIONS = BlockEngine.OPTIONS | TRANSPORT_OPTIONS
    #: blocks in memory carry no checksums: MPI moves them, nothing stores them
    CHECKSUMS = False

    def __init__(self, name: str = "mpi") -> None:
        super().__init__()
        self.name = name

    def _open_storage(self, path: str, mode: str) -> None:
        if mode == "a":
            raise ModeError(
                "the memory transport streams new steps: open with 'w' (producer) or 'r' (consumer)"
            )
        name = routes.normname(path)
        app = comm_mod.appnum()
        wf = routes.from_env()
        for k, v in routes.options_for(name, mode, app, wf).items():
            self.options.setdefault(k, v)  # the workflow's defaults; the caller's options win
        self.timeout = _timeout(self.options)
        wire.spin_seconds()  # refused here, before any message, as the timeout is
        queue_limit = self.options.get("queue_limit", 2)
        try:
            self.queue_limit = as_int(queue_limit)
        except TypeError:  # 1.5 is not 1, "2" not 2
            self.queue_limit = 0
        if self.queue_limit < 2:
            # a consumer releases step k when it asks for step k+1, which the producer must be free to make
            raise ValueError(f"queue_limit must be an integer >= 2, got {queue_limit!r}")
        self.segment = 0  # no checksums in memory: one placeholder per block (see Producer._stage)
        # the option, else the variable, else a thread: an error names the one given
        given, where = self.options.get("serve"), "serve"
        if given is None and os.environ.get(SERVE_ENV):
            given, where = os.environ[SERVE_ENV], f"${SERVE_ENV}"
        serve = str("thread" if given is None else given).strip().lower()
        if serve not in SERVE_MODES:
            raise ValueError(f"{where} must be one of {', '.join(SERVE_MODES)}, got {given!r}")
        if serve == "thread" and MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            use = "serve='calls'" if where == "serve" else f"{where}=calls"
            raise ValueError(
                f"{where}='thread' needs MPI initialized with MPI_THREAD_MULTIPLE "
                f"(this MPI gives level {MPI.Query_thread()}); use {use}"
            )
        self.serve_mode = serve
        stats = self.options.get("stats", True)
        if not isinstance(stats, bool | np.bool_):
            raise ValueError(f"stats must be True or False, got {stats!r}")
        self.with_stats = self._with_stats = bool(stats)
        # statistics on the program's thread unless asked: the serving thread holds the GIL
        # and competes for the CPU
        self.background_stats = flag_option(
            self.options.get("background_stats", False), "background_stats"
        )
        shallow = self.options.get("shallow", ())
        shallow = (shallow,) if isinstance(shallow, str) else shallow
        shallow = tuple(shallow) if isinstance(shallow, Iterable) else None
        if shallow is None or not all(isinstance(p, str) for p in shallow):
            raise TypeError(
                f"shallow must be a dataset path glob (a string) or a sequence of them, "
                f"got {self.options.get('shallow')!r}"
            )
        self.shallow = tuple(p.lstrip("/") for p in shallow)  # dataset paths have no leading /
        route = routes.route_for(name, mode, app, comm_mod.task_count(), wf)
        #: what the rendezvous pairs on: the workflow entry where one matches (two spellings
        #: of one file pair), else the name
        self.rendezvous_key = rendezvous.key_for(name, wf)
        self._connect(name, app, route, wf)
        _track(self)

    def close(self) -> None:
        try:
            super().close()
        finally:
            _OPEN.pop(id(self), None)

    def abandon(self) -> None:
        try:
            super().abandon()
        finally:
            _OPEN.pop(id(self), None)

    def _connect(
        self, name: str, app: int, route: routes.Route, wf: routes.Workflow | None
    ) -> None:
        """Collective: meet the other side of *route* (the role's own part of open)."""
        raise NotImplementedError

    def _serve_once(self) -> bool:
        """Independent: answer what the other side asked; True if anything happened (producers)."""
        return False

    def _data_in_flight(self) -> bool:
        return False

    @contextmanager
    def _serving(self) -> Iterator[None]:
        """The program's thread serves for a while (a producer's serving thread rests meanwhile)."""
        yield

    def _gather(self, call: int = 0) -> None:
        """Collective: wait for every rank of this task, serving consumers meanwhile (producers);
        *call* names the collective call this is the first agreement of (see
        :func:`~lamina.comm.agree`).

        Ranks that arrive early would otherwise spin in the blocking
        collectives of the commit and take the CPU from a rank still
        sending; here they sleep once idle.  No timeout: the other ranks
        are this program's own (a blocking collective has none either).
        It is an :func:`~lamina.comm.agree`, so a rank that left the file
        (:meth:`leave`) is heard here.
        """
        if self.size == 1:
            return
        pending = comm_mod.PendingAgree(self.comm, call=call)
        poll = Poll(self.timeout)
        with self._serving():
            while not pending.test():
                if self._serve_once():
                    poll.reset()
                else:
                    poll.sleep(active=self._data_in_flight())
        pending.finish()


#: transported files open in this process, in open order (closed at exit: see close_at_exit)
_OPEN: dict[int, TransportBase] = {}
_HOOKED = False


def _track(engine: TransportBase) -> None:
    """Keep *engine* (just opened) until it is closed, and close it at exit if the program does not."""
    global _HOOKED
    if not _HOOKED:
        # registered after mpi4py.MPI was imported (lamina.comm imports it), so it runs
        # before mpi4py's own exit handler finalizes MPI
        atexit.register(close_at_exit)
        _HOOKED = True
    _OPEN[id(engine)] = engine


def close_at_exit() -> None:
    """At interpreter exit: close every transported file the program left open.

    A program that reads every step and ends without ``f.close()`` (or stops
    early) would otherwise leave its producer waiting for the goodbye of
    each of its ranks until the timeout, as a file needs no close from its
    readers.  Consumers go first (each says goodbye: the producer goes on),
    then producers (their close record, then their consumers' goodbyes);
    every wait of a close is bounded by the transport timeout.  After an
    uncaught exception (``sys.last_value``) a file is left as after an
    error instead (:meth:`abandon`: no collective call, which ranks that
    did not fail would not make).  What fails is said as a warning: nobody
    is left to raise it to.
    """
    if not _OPEN or MPI.Is_finalized():
        return
    failed = getattr(sys, "last_value", None) is not None
    engines = sorted(_OPEN.values(), key=lambda e: e.mode != "r")  # consumers first, in order
    for engine in engines:
        try:
            if failed:
                engine.abandon()
            else:
                engine.close()
        except Exception as e:  # noqa: BLE001 - nothing to raise to at exit
            warnings.warn(
                f"{engine.path}: closing it at exit (the program did not): {e}",
                LaminaWarning,
                stacklevel=1,
            )
        finally:
            _OPEN.pop(id(engine), None)


__all__ = [
    "ABANDON_PATIENCE",
    "SERVE_MODES",
    "TRANSPORT_OPTIONS",
    "TransportBase",
    "close_at_exit",
]
