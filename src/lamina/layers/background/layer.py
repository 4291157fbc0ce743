"""Background I/O: ``end_step`` returns once the step's data is copied; the commit runs on a thread.

``lamina.open(path, "w", io="async")`` (or ``$LAMINA_IO=async``) puts this
layer at the top of the stack, over the derived layer and the engine.  A
step is then a *transaction* kept by this layer:

* ``put`` checks the write at once (dataset, box, shape, dtype, overlap:
  the same errors as without the layer, at the same call) and copies the
  caller's array, so the caller may reuse it as soon as ``put`` returns
  (with ``copy=False`` the array is kept by reference and made read-only
  until its step is on disk);
* ``end_step`` hands the whole step (``begin_step``, the puts, ``end_step``)
  to one background thread, which runs these calls on the inner stack, in
  order, step after step, and returns.

**Communicators.**  The inner engine duplicates the communicator it is
opened with; only the background thread uses that duplicate while steps
are in flight.  This layer's own calls that need messages (the agreement
in ``end_step``, ``wait``, ``close``) use a second duplicate, so the
application thread's collectives never interleave with the background
thread's.  Two threads calling MPI at once need ``MPI_THREAD_MULTIPLE``
(which :mod:`lamina.comm` asks for); below it the layer writes
synchronously and warns.

**One lock.**  The inner stack is not thread-safe: every call into it
holds :attr:`BackgroundLayer.lock`, which the background thread holds for
a whole step.  Collective calls into the inner stack from the application
thread (``define``, ``make_group``, ``derive``, ``refresh``,
``set_ext``, a collective read, ``close``) first wait until no step is in flight, so that
both threads' collectives on the inner communicator come in one order on
every rank.

**Budget.**  The copies of the steps in flight may take at most
``max_inflight_bytes`` (default 1 GiB); a put that would exceed it waits
for the oldest steps to be written (the waits are counted in
:attr:`BackgroundLayer.stats`).  A step whose own copies exceed the budget
is refused at the put that would exceed it.

**Errors.**  A step that fails in the background is not committed (the
inner engine discards it) and the steps queued behind it are cancelled;
the error is raised, naming the step and the cancelled steps, on every rank
at the next collective call of the application thread (``end_step``,
``wait``, ``close``, ``define``, ...), through an agreement on this layer's
communicator: every rank raises it at the same call.  Steps committed
before it stay intact, and the file goes on from the last committed step.

See docs/background.md.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ... import comm as comm_mod
from ...catalog import BlockTable, DatasetSpec, normpath
from ...derived._parallel import cores_per_rank
from ...engines.base import BlockInfo, Engine, step_number
from ...engines.batch import check_batch, elements
from ...engines.block import attr_change, dataset_not_found
from ...engines.registry import BACKGROUND_OPTIONS, inflight_bytes
from ...engines.staging import WriteMark, enter_box, enter_boxes
from ...errors import (
    CollectiveMismatchError,
    ConfigError,
    FormatError,
    LaminaWarning,
    ModeError,
    NotFoundError,
    RemoteError,
    StepError,
    error_from_wire,
    error_to_wire,
    is_collective,
    is_left,
    mark_collective,
)
from ...geometry import Box
from ...perf import history as history_mod
from ...perf.asyncmodel import (
    COPY_SERIES,
    DECISIONS_KEPT,
    DECISIONS_KEY,
    IO_SERIES,
    LENT_SERIES,
    SUBMIT_SERIES,
    SYNC_IO_SERIES,
    AsyncModel,
    History,
    Prediction,
    async_epoch,
    decision_row,
    decisions_head,
    decisions_key,
    encode_decision_parts,
    load_history,
    save_history_soon,
)
from ...perf.history import pack_series, unpack_series
from ...stats import OneThread
from ...text import fmt_steps
from ..base import Layer
from ..derived import DerivedLayer
from .prefetch import Prefetcher
from .step import (
    DEFAULT_INFLIGHT_BYTES,
    QUEUE_STEPS,
    BackgroundError,
    Frozen,
    IOStats,
    Pool,
    Step,
    check_put,
    check_stats_layout,
    same_report,
    touched,
)

if TYPE_CHECKING:
    from concurrent.futures import Future

    from mpi4py.MPI import Comm

#: layers with a background thread, written out before the interpreter stops its thread pools
_LIVE: weakref.WeakSet[BackgroundLayer] = weakref.WeakSet()
_HOOKED = False
#: the thread that makes buffers of copies ahead while steps queue (_make_ahead)
_MAKER = OneThread("lamina-buffers")


def _at_exit() -> None:
    """At interpreter exit, before thread pools refuse work: finish every step ended but not written.

    Runs among ``threading``'s own exit calls (after the main program, before
    ``concurrent.futures`` shuts its pools, which the engines' statistics use),
    so that a program that ends without ``close`` loses no step it ended.  It says
    what it writes; an interrupt meanwhile (Ctrl-C) stops it, the steps not written said
    (CPython ignores an exception out of these calls: nothing else would say it).
    """
    stopped = False
    for layer in list(_LIVE):
        stopped = layer._write_at_exit(stopped)


def _hook_exit() -> None:
    global _HOOKED
    if _HOOKED:
        return
    _HOOKED = True
    # threading runs these calls last registered first: the pools' own (registered when
    # concurrent.futures.thread is first imported, which lamina does at a first use) must be
    # registered before this one, so that they still take work while it runs
    import concurrent.futures.thread  # noqa: F401

    register = getattr(threading, "_register_atexit", None)  # CPython >= 3.9
    if register is not None:
        register(_at_exit)
    # and where the program finalizes MPI itself before that: its background threads, in MPI
    # calls of their own, met a finalized MPI (a segfault, and the steps ended were lost)
    comm_mod.at_finalize(_at_exit)


#: The flags of the agreement every collective call of the program's thread starts with
#: (:meth:`BackgroundLayer._meet`): end_step's is ENDING (1 more where this rank has a step
#: open); wait, flush, definitions, collective reads, the first step's judgement and
#: :meth:`BackgroundLayer.agree` (with its caller's key, below 2**32) with a point's flag that
#: names the call (see SPAN); close with CLOSING.  Where the largest is a point's or CLOSING
#: every rank agrees once more (:meth:`BackgroundLayer._apart`), to learn
#: whether some rank came to another call: the ranks are then a call apart (a step dropped on
#: some ranks only, the program going on).  The ranks behind raise CollectiveMismatchError
#: there (a step they were ending is dropped); the ranks ahead agree again, with the others'
#: next call, so that the calls pair once more and no rank waits for a call never made.
ENDING = 1
POINT = 1 << 39
CLOSING = 1 << 40
KEYS = 1 << 32  # agree()'s keys: POINT + key, |key| < KEYS
#: each point names its call (POINT + call * SPAN), so that two different calls never pair as
#: one: agree() (0, whatever its key), wait, flush, a definition, ...
SPAN = 2 * KEYS
(AGREE, WAIT, FLUSH, DEFINE, GROUP, EXT, DERIVE, REFRESH, READ, SYNC_STEP, FIRST) = range(11)


#: io='auto': after this many steps in a row written one way, one is written the other way
#: (BackgroundLayer._probe); then after twice as many, and so on
PROBE_AFTER = 8
#: io='auto' changes mode where the other is predicted faster by this fraction of an epoch
MARGIN = 0.05
#: a predicted epoch (in microseconds) for a step that cannot be written that way
NEVER = 1 << 50


def _micros(seconds: float) -> int:
    """*seconds* as whole microseconds for an agreement (at least 1; NEVER if not finite)."""
    if not math.isfinite(seconds):
        return NEVER
    return min(NEVER - 1, max(1, math.ceil(seconds * 1e6)))


def _point(call: int) -> int:
    return POINT + call * SPAN


def _ends_step(kind: int) -> bool:
    """Whether a call of *kind* (see :func:`_kind`) ends a step: end_step, the first step's
    judgement, a step written directly under io='auto'."""
    return kind in (0, 1 + SYNC_STEP, 1 + FIRST)


#: the program's call each kind of flag stands for (:func:`_kind`), in messages
_KIND_NAMES = {
    0: "end_step",
    1 + AGREE: "an agreement of the file's (refresh, iter_steps)",
    1 + WAIT: "wait",
    1 + FLUSH: "flush",
    1 + DEFINE: "create_dataset",
    1 + GROUP: "create_group",
    1 + EXT: "a change of the file's metadata",
    1 + DERIVE: "derive",
    1 + REFRESH: "refresh",
    1 + READ: "read(collective=True)",
    1 + SYNC_STEP: "end_step",
    1 + FIRST: "end_step",
    CLOSING: "close",
}


def _kind(flag: int) -> int:
    """0: an end_step; 1 + call: a point (see SPAN); CLOSING: close."""
    if flag >= CLOSING:
        return CLOSING
    if flag <= POINT - KEYS:
        return 0
    return 1 + (flag - POINT + KEYS) // SPAN


@functools.cache
def _history_warning(mode: str) -> Callable[[OSError], None]:
    """What warns that the I/O history of writers under io=*mode* could not be saved: one
    function per mode, so that a save that fails warns once, however many times and from
    however many files samples were handed over for it (and holds no writer alive)."""

    def failed(e: OSError) -> None:
        warnings.warn(f"io={mode!r}: cannot keep the I/O history: {e}", LaminaWarning, stacklevel=2)

    return failed


class BackgroundLayer(Layer):
    """Background I/O over any engine (see the module docstring).

    Option ``max_inflight_bytes``: the most bytes the copies of steps in
    flight may take (default 1 GiB).
    """

    OPTIONS = BACKGROUND_OPTIONS

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.lock = threading.RLock()  # held for every call into the inner stack
        self._cond = threading.Condition()  # guards the queue, the counters and the failure
        self._queue: collections.deque[Step] = collections.deque()
        self._running: Step | None = None
        # attribute changes made between steps while steps are in flight: the next step's
        # (handed to the engine with it, or at the next point where none is in flight)
        self._between: list[tuple] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._work_done = False  # the background thread returned (it says so: see _shutdown)
        self._failure: BackgroundError | None = None
        # a failure taken to be reported at a call that raised something else before the ranks
        # heard it (an interrupt while the call waited): reported at the next call instead
        self._unsaid: BaseException | None = None
        # the step that failed, until every rank has raised it (_on_failure_elsewhere): the
        # worker cancels the steps ended after it instead of writing them
        self._failed_at: int | None = None
        self._step: Step | None = None  # the application's open step
        self._opened_at = 0  # the first step this open writes (the file's steps before it)
        self._next = 0  # index of the next step to end (committed + in flight)
        self._committed = 0  # steps committed (by either thread)
        self._frozen = Frozen()  # arrays kept by reference (copy=False), read-only meanwhile
        self._pool = Pool()  # buffers of written steps' copies, for the next copies
        self._spec_cache: dict[str, DatasetSpec] = {}
        # the derived layer below, if any: it refuses statistics-only blocks from a program
        self._derived = next((e for e in inner.stack() if isinstance(e, DerivedLayer)), None)
        self._fcomm: Comm | None = None
        self.active = False  # writer: steps are committed in the background
        self._prefetch: Prefetcher | None = None  # reader: reads may be read ahead
        #: asked for io='async'/'auto', run without the thread (MPI below THREAD_MULTIPLE)
        self.without_thread = False
        self.budget = DEFAULT_INFLIGHT_BYTES
        self.stats = IOStats()
        self.auto = False  # io='auto': the model picks sync or async per step
        self.model: AsyncModel | None = None  # writers: what steps cost here (model.py)
        self._measured = False  # the model got samples this run (saved at close)
        self._history_handed = 0.0  # when they were last handed over to be saved (monotonic)
        self._epoch_start: float | None = None  # when the last end_step returned
        self._in_calls = 0.0  # seconds inside this layer's write calls since then
        # the write calls into the open step under way, as the engine's put log marks them:
        # left set by an interrupt that escapes one, the step lacks its block (or some of a
        # batch's) and is never committed (_cut_short)
        self._mark = WriteMark()
        self._decision: dict[str, Any] | None = None  # the last auto decision, measured next
        # rank 0, io='auto': every decision for the file (_hand_decisions, _record_decisions),
        # each encoded (decision_row) once its step is done and the phase after it measured,
        # until it is handed down; those not yet measured (the last, and those of steps in
        # flight) wait as they are, oldest first (under _cond)
        self._decision_rows: list[str] = []
        self._decisions_open: collections.deque[dict[str, Any]] = collections.deque()
        # the records handed down with the steps (_hand_decisions), whose rows leave
        # _decision_rows then: key, bytes (rank 0's, kept until close, which makes sure each
        # is in the file); and how many records every rank handed down
        self._handed: list[tuple[str, bytes]] = []
        self._parts_handed = 0
        self._decision_started = 0.0
        # io='auto': the last decision was sync, so the next explicit step is written directly
        # (no copy at put, no thread); _direct: such a step is open (bytes put, seconds in I/O)
        self._next_direct = False
        self._direct: list[float] | None = None
        self._direct_sizes: list[int] = []  # the buffers its puts would have copied into
        self._direct_begun = False  # the step written directly was begun by begin_step
        self._adopted: Step | None = None  # copies of a step moved to the engine at begin_step
        self._first = False  # io='auto', no step begun yet: the first is judged on history
        self._parted = False  # the last agreement found the ranks at different calls
        # ... not a call apart (no step dropped that others end): the program's ranks went
        # different ways (see _apart)
        self._diverged = False
        self._cut_meeting = False  # the last agreement was left halfway on this rank (leave)
        self._handed_count = 0  # steps handed to the background thread (_submit) since open
        # every rank left at once, and the others handed the thread a step this rank dropped
        # (an interrupt cut its end_step's agreement after theirs completed): see leave
        self._behind = False
        # this rank dropped a step and has not met the others at a point or close since (see
        # _apart): ranks ending a step there are a call behind this one.  Steps begun since
        # do not clear it: each ends with the others' step before it (the engine refuses
        # them, counted apart), so the ranks stay a call apart until they meet again
        self._just_dropped = False
        self._first_owed = False  # the first step dropped here before it was judged
        self._warm: list[int] = []  # buffers for the worker to make ready (under _cond)
        # bytes of buffers being made for later copies (_make_ahead, _warm), counted in the
        # budget from the moment they are planned until they are in the pool (under _cond)
        self._making = 0
        self._ahead: Future | None = None  # buffers being made for the next step (_make_ahead)
        self._last_sizes: list[int] | None = None  # the copies of the last step submitted
        self._spare_core = False  # this rank has a core of its own beside the program's
        self._rank = 0
        # steps dropped here (discarded, never handed to the engine) since the last one handed
        # down: the engine counts them as it counts the steps it opens (Engine.skip_steps)
        self._dropped = 0

    # -- lifetime -------------------------------------------------------------
    def configure(self, options: dict[str, Any]) -> None:
        self.budget = inflight_bytes(options.get("max_inflight_bytes", DEFAULT_INFLIGHT_BYTES))
        self.stats.max_inflight_bytes = self.budget
        io = options.get("io", "async")
        if io not in ("async", "auto"):
            raise ConfigError(f"the background layer runs io='async' or 'auto', not {io!r}")
        self.auto = io == "auto"

    def opened(self) -> None:
        self._committed = self._next = self._opened_at = self.inner.steps
        level = comm_mod.thread_level()
        if level < comm_mod.THREAD_MULTIPLE:
            warnings.warn(
                f"io={'auto' if self.auto else 'async'!r} needs MPI_THREAD_MULTIPLE, MPI provides "
                f"{comm_mod.thread_level_name(level)}: "
                f"{self.path!r} is "
                + ("read without read-ahead" if self.mode == "r" else "written synchronously"),
                LaminaWarning,
                stacklevel=4,
            )
            self.without_thread = True  # the program runs on as it is, told once
            return
        self.stats.mode = "async"
        if self.mode == "r":  # readers read as they are, and read ahead when streaming
            self._prefetch = Prefetcher(self.inner, self.lock, self.budget, self.stats)
            return
        self._fcomm = comm_mod.dup(self.inner.comm)
        self.active = True
        # io='auto' decides on every rank alike: from rank 0's history (io='async' only records)
        self.model = AsyncModel(self._shared_history() if self.auto else load_history())
        self._spare_core = cores_per_rank() >= 2
        self._rank = self.inner.comm.rank
        self.stats.mode = "auto" if self.auto else "async"
        # started now, idle until the first step: started at that step's submit, the new
        # thread took the GIL from the program for up to a switch interval (5 ms)
        with self._cond:
            self._start()
        # io='auto' writes the first step directly unless this host's history says otherwise
        # (_first_step): its size is not known before its end_step, and copying it first (into
        # new memory) to find there that the model prefers to wait for it cost about a copy
        # and a write (8 ms against 3.5 for a step of 8 MiB here)
        self._next_direct = self.auto
        self._first = self.auto
        # the mode of the last decisions, how many in a row, and after how many the other
        # mode is tried once (_probe)
        self._streak_mode: bool | None = None
        self._streak = 0
        self._probe_after = PROBE_AFTER
        self._probe_next = False  # the next step (copied) is written in the background: a probe
        # the program's work before its first end_step (from open, or from its last dataset
        # definition) is the first compute phase: without it the first decision would take
        # t_comp = 0 and write the first steps at once
        self._epoch_start = time.perf_counter()

    @property
    def asynchronous(self) -> bool:
        """True when steps are committed in the background (writers) or may be read ahead (readers)."""
        return self.active or self._prefetch is not None

    def streaming(self, k: int) -> bool:
        """Independent: the program streams steps and is given step *k* now; read ahead.

        Returns False when this file has no read-ahead (a writer, or MPI
        below ``MPI_THREAD_MULTIPLE``).
        """
        if self._prefetch is None:
            return False
        self._prefetch.streaming(k)
        return True

    def stream_ended(self) -> None:
        """Independent: the program's ``iter_steps`` ended (a break, an error, its last step)."""
        if self._prefetch is not None:
            self._prefetch.stream_ended()

    def _require_open(self, what: str) -> None:
        if self.inner.closed:
            raise ValueError(f"cannot {what}: file {self.path!r} is closed")

    def close(self) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
        if not self.active or self.inner.closed:
            self.inner.close()
            return
        if comm_mod.has_left(self._own()) or comm_mod.has_left(self.inner.comm):
            # another rank let go of the file (an earlier call heard it): nobody meets a close
            self._drop_open_step()
            self.abandon()
            return
        self._drain()
        error: BaseException | None = None
        earlier: BaseException | None = None  # raised with ranks that had not come to close
        try:
            self._judge_owed()
        except BaseException as e:
            earlier = e
            if is_left(e):
                self._drop_open_step()
                self.abandon()
                raise
        pending = self._take_failure()
        while True:
            try:
                # ranks a call behind (their end_step, or another call, met this close) raise
                # there; this close meets their next call, until every rank closes
                self._meet(pending, CLOSING)
                break
            except BaseException as e:
                if is_left(e) or not self._parted:  # raised with every rank closing
                    error = e
                    break
                # raised where the ranks met apart: theirs too (they raised it at their call);
                # how the close goes on is decided with the ranks that close with this one
                earlier = earlier or e
                pending = None
        # an in situ producer's stream does not end as if it had finished after a failure: its
        # consumers are told it failed (a close record would end their streams normally)
        ends_streams = any(e.ENDS_STREAMS for e in self.inner.stack())
        if error is None and earlier is not None:
            if ends_streams:
                self._drop_open_step()
                self.abandon()
                raise earlier
            # the failure raised where the ranks met apart: the file is closed as usual, then
            # it is raised here too
            try:
                self._close_together()
            except BaseException as late:
                earlier.add_note(f"closing the file failed too: {late}")
            raise earlier
        if error is not None:
            self._drop_open_step()
            if self._diverged:
                # the others made another call (not a close): they go on without this rank;
                # they hear that it left at their next call on the file, as under io='sync'
                comm_mod.leave(self._own(), error)
                self.abandon()
                raise error
            if is_left(error) or ends_streams:  # no collective with a rank that left; or the
                self.abandon()  # consumers hear of the failure (above)
                raise error
            try:
                with self.lock:
                    self.inner.close()
            finally:
                self._shutdown()
            raise error
        self._close_together()

    def _close_together(self) -> None:
        """Collective, in close, every rank closing with no failure: commit a step left open,
        the decisions, and close the inner stack."""
        try:
            # unless a write into it was cut short on some rank (an interrupt): then it is
            # dropped on every rank, as the engine's close drops such a step
            if comm_mod.allreduce_int(self._own(), int(self._cut_short()), "max"):
                self._drop_open_step(anywhere=True)
            with self.lock:
                # a step left open is committed by close, as without the layer
                step, self._step = self._step, None
                self.inner.skip_steps(self._take_dropped())
                g = comm_mod.Guard()
                with g:
                    if step is not None:
                        self._replay(step)
                if step is not None:
                    self._release(step)
                try:
                    comm_mod.agree(self.inner.comm, g.error)  # none may stay out of the close
                except BaseException:
                    if self.inner.in_step:
                        self.inner.discard_step()
                    self.inner.close()
                    raise
                self._record_decisions()
                self.inner.close()
        finally:
            self._shutdown()
        self._committed = self._next = self.inner.steps

    def abandon(self, left: BaseException | None = None) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
        if self.active:
            self._drop_open_step()
            self._drain()  # the steps queued were ended by every rank: they complete everywhere
            self._shutdown()
            if left is not None and (self._cut_meeting or self._behind):
                # this rank left a step's meeting halfway (an interrupt, a signal's exception
                # raised while it waited): the others may have met without it and handed the
                # step to their background threads, which wait in its commit for this rank's.
                # Meet them there too (its thread stopped: the communicator is free), or they
                # wait for ever, and so does every program thread draining them.  Where the
                # ranks know that they did (_behind), their threads come for certain once
                # they wrote the steps before it: waited for as after an error of its own
                comm_mod.leave(
                    self.inner.comm, left, timeout=comm_mod.LEAVE_TIMEOUT if self._behind else None
                )
        with self.lock:
            self.inner.abandon()

    def leave(self, exc: BaseException) -> None:
        if not self.active or self.inner.closed:
            if self._prefetch is not None:  # (a reader: its read-ahead thread and arrays go)
                self._prefetch.close()
            self.inner.leave(exc)
            return
        # the others meet this at their next collective call of this layer (all start with agree)
        comm_mod.leave(self._own(), exc)
        if is_collective(exc) and self._handed_apart():
            # every rank left at once, but an interrupt cut the end_step agreement of some
            # rank after the others' completed: they handed that step to their threads, it
            # dropped it.  Closed together, their threads would wait for ever in its commit,
            # and its close for them; so every rank lets go of the file instead, as where one
            # rank leaves: the steps every rank handed over are written, and the others'
            # commit of that step meets the leave of the rank behind (abandon)
            exc.lamina_collective = False  # type: ignore[attr-defined]
        if not is_collective(exc):  # (every rank left at once: they close the file together)
            self.abandon(exc)

    def _handed_apart(self) -> bool:
        """Collective, every rank leaving at once (:meth:`leave`): whether some rank handed its
        thread more steps than this one (then this rank is ``_behind``) or fewer."""
        spread = comm_mod.spread_leaving(self._own(), self._handed_count)
        if spread is None:  # (not every rank came: none closes together)
            return True
        self._behind = self._handed_count < spread[1]
        return spread[0] != spread[1]

    def agree(self, flag: int = 0, call: int = 0) -> int:
        if not self.active:
            return self.inner.agree(flag, call)
        # (active: the point's flag below names the call, and every other collective call of
        # the program's thread has a point of its own; *call* adds nothing)
        if not -KEYS < flag < KEYS:
            raise ValueError(f"agree(): flag {flag} out of range (|flag| < 2**32)")
        return self._meet(None, _point(AGREE) + flag) - POINT

    def _meet(self, pending: BaseException | None, flag: int, seen: list[int] | None = None) -> int:
        """Collective: the agreement a call of the program's thread starts with,
        on this layer's communicator (:func:`comm.agree`: raises on every rank if one failed,
        else the largest flag; *seen* gets it either way).

        Where the ranks are a call apart (see POINT): a rank behind raises
        :class:`CollectiveMismatchError` (or the failure the agreement raised) and notes it
        (``_parted``); a rank ahead (its call's flag the largest) agrees again, with the
        others' next call."""
        self._parted = self._diverged = False
        while True:
            got: list[int] = []
            try:
                top = comm_mod.agree(self._own(), pending, flag, seen=got)
            except BaseException as e:
                # raised here before the agreement ended on this rank (an interrupt while it
                # waited): the others may have ended it with this rank's part (see leave)
                self._cut_meeting = not got
                if seen is not None:
                    seen.extend(got)
                if not is_left(e):
                    same_report(e)  # a background failure: in the words of the rank it names
                    if got and _kind(got[0]):
                        apart = self._apart(flag, got[0])
                        self._parted, self._diverged = apart == 2, apart == 1
                        if apart == 2 and _kind(flag) == _kind(got[0]) != CLOSING:
                            # ahead at a point, the failure raised here as behind at their
                            # step's end: meet their next call (this point) first, as without
                            # a failure (a close meets it in its own loop)
                            self._meet(None, flag)
                raise
            apart = self._apart(flag, top) if _kind(top) else 0
            if not apart:
                if _kind(top) and not _ends_step(_kind(top)):
                    # every rank at one point or close (not one ending a step: the first
                    # step's judgement, a step written directly): paired again
                    self._just_dropped = False
                if seen is not None:
                    seen.append(top)
                return top
            if apart == 1:
                # different calls, not a step dropped on some ranks: the program's ranks went
                # different ways; every rank raises, none waits for a call never made, and
                # says which calls met (every rank is here: one more agreement names them)
                self._diverged = True
                least = comm_mod.allreduce_int(self._own(), _kind(flag), "min")
                a, b = (_KIND_NAMES.get(k, f"call {k}") for k in (least, _kind(top)))
                raise mark_collective(
                    CollectiveMismatchError(
                        f"ranks made different collective calls together on {self.path!r}: "
                        f"{a} on some, {b} on others (a collective call made on some ranks "
                        "only); every rank must make the same collective calls in the same "
                        "order"
                    )
                )
            if _kind(flag) != _kind(top):
                self._parted = True
                what = (
                    "closes"
                    if top >= CLOSING
                    else "waits for its steps (wait, flush, a definition or a collective read)"
                )
                raise mark_collective(
                    CollectiveMismatchError(
                        f"another rank {what} on {self.path!r} while this one ends a step or "
                        "makes another collective call: the ranks are a call apart (a step "
                        "dropped on some ranks only); this call is not made (a step it ends is "
                        "dropped on every rank)"
                    )
                )
            pending = None  # a call ahead: the ranks behind dropped theirs; meet their next

    def _apart(self, flag: int, top: int) -> int:
        """Collective, after an agreement whose largest flag *top* was a point's or close's
        (*flag*: this rank's): 0 where every rank came to the same kind of call; 2 where the
        ranks are a call apart (some rank ends a step, and the ranks at the call of *top*,
        ahead, are there because each dropped a step the others end); else 1 (the ranks
        made different calls: the program's ranks went different ways).  The second
        agreement this takes is made only where the ranks came to different calls."""
        mine, last = _kind(flag), _kind(top)
        other = comm_mod.agree(
            self._own(), None, flag=0 if mine == last else 1 + int(_ends_step(mine))
        )
        if not other:
            return 0
        if not (other == 2 or _ends_step(last)):
            return 1
        undropped = mine == last and not self._just_dropped
        return 1 if comm_mod.agree(self._own(), None, flag=int(undropped)) else 2

    def _shared_history(self) -> History:
        """Collective, at open under io='auto': the history rank 0 loads, on every rank
        (the model's series; rank 0 keeps every series, for its save).

        Only rank 0 saves what a run measured, and a process saves at its exit: another
        rank's own load would hold the file as the last process left it, without what
        this process's earlier files measured, and its model would disagree with rank
        0's (on 8 ranks its epochs in the background came out 15 ms where rank 0's said
        6-8, and every step was written directly).  A history another rank cannot read
        leaves that rank with none.  Whatever rank 0 meets loading it (an unusable file is
        an empty history there) is raised on every rank: none is left waiting for it."""
        comm = self._own()
        if comm.size == 1:
            return load_history()
        names = (IO_SERIES, SYNC_IO_SERIES, COPY_SERIES, SUBMIT_SERIES, LENT_SERIES)
        h, packed, failed = None, None, None
        if comm.rank == 0:
            try:
                h = load_history()
                packed = pack_series(h, names)
            except BaseException as e:  # noqa: BLE001 - raised on every rank just below
                failed = e
        comm_mod.agree(comm, failed)
        raw = comm_mod.bcast_bytes(comm, packed, 0)
        if h is not None:
            return h
        try:
            return unpack_series(raw, names)
        except FormatError:
            return History()

    def _own(self) -> Comm:
        """This layer's communicator (the application thread's collectives, while active)."""
        assert self._fcomm is not None, "background I/O is not active"
        return self._fcomm

    def _record_decisions(self) -> None:
        """Collective, at close under io='auto': rank 0's decisions, every one, are in the file
        (``lamina info``, ``lamina ls``), in records of a bounded size: those handed down with
        the steps (:meth:`_hand_decisions`), again where a step that held one was cancelled
        (a background failure: the record never reached the engine), then the rows of the
        last steps, and the record :func:`decisions_head` saying how many there are."""
        if not self.auto or not self.stats.decisions:  # (none made, none handed down)
            return
        comm, sends = self.inner.comm, []
        if self._rank == 0:
            with self._cond:
                rest = self._decision_rows + [decision_row(d) for d in self._decisions_open]
            ext = self.inner.catalog.ext  # (what the engine took, committed by this close)
            sends = [(k, raw) for k, raw in self._handed if ext.get(k) != raw]
            parts = encode_decision_parts(rest, self._opened_at)
            first = self._parts_handed + 1  # the records after those handed down
            sends += [(decisions_key(first + i), p) for i, p in enumerate(parts)]
            sends.append((DECISIONS_KEY, decisions_head(self._opened_at, first + len(parts))))
        count = len(sends).to_bytes(8, "little") if self._rank == 0 else None
        for i in range(int.from_bytes(comm_mod.bcast_bytes(comm, count, root=0), "little")):
            key = sends[i][0].encode() if self._rank == 0 else None
            raw = sends[i][1] if self._rank == 0 else None
            self.inner.set_ext(
                comm_mod.bcast_bytes(comm, key, root=0).decode(),
                comm_mod.bcast_bytes(comm, raw, root=0),
            )

    def _hand_decisions(self, step: Step | None) -> None:
        """Collective, at each decision under io='auto': rank 0's rows measured for good since
        the last decision go into extension records (:func:`encode_decision_parts`) that
        every rank hands down with *step* (or now, between steps, after a step written
        directly): committed with it, so that a run killed before its close leaves the
        decisions of the steps it committed.  The first such record also marks the file's
        record :data:`DECISIONS_KEY` as one of a run under way.  One nonblocking agreement
        (the count) where no row is new, as at most decisions; then a broadcast."""
        parts: list[bytes] = []
        if self._rank == 0:
            with self._cond:
                new, self._decision_rows = self._decision_rows, []
            parts = encode_decision_parts(new, self._opened_at)
        n = comm_mod.agree(self._own(), None, len(parts))
        exts = []
        for i in range(n):
            raw = comm_mod.bcast_bytes(self._own(), parts[i] if self._rank == 0 else None, root=0)
            self._parts_handed += 1
            exts.append((decisions_key(self._parts_handed), raw))
            if self._parts_handed == 1:
                exts.append((DECISIONS_KEY, decisions_head(self._opened_at)))
        if self._rank == 0:
            self._handed += exts
        if not exts:
            return
        if step is not None:
            step.exts += exts
        else:
            with self.lock:
                for key, raw in exts:
                    self.inner.set_ext(key, raw)

    def _save_history(self, now: float | None = None) -> None:
        """Rank 0: hand what this run measured over, to be kept for the next runs on this host
        (model.py), at close and at an end_step (*now*) a second or more after the last
        handing-over (at most FLUSH_AFTER).  The samples are saved at the interpreter's exit
        (or wait_saves), so that neither waits for the file, or at the handing-over after
        they waited FLUSH_AFTER seconds: a job killed before its close (at its time limit,
        say) loses the last minutes of its samples, not the whole run's (they were handed
        over at close only)."""
        if self.model is None or self._rank != 0:
            return
        if now is not None:
            if now - self._history_handed < min(1.0, history_mod.FLUSH_AFTER):
                return
            self._history_handed = now
        with self._cond:  # (the background thread adds samples under it)
            if not self._measured:
                return
            self._measured = False
            save_history_soon(self.model.history, on_error=_history_warning(self.stats.mode))

    def _shutdown(self) -> None:
        with self._cond:
            self._pool.clear()
            self._warm = []
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            # waited for in the condition's wait, not in join alone: an interrupt raised as
            # this thread entered `with self._cond` (in Condition.__enter__, after it took the
            # lock) left the lock held here, no `with` to let go of it; the wait lets go of
            # it meanwhile, so that the thread can take it and see that it stops (the thread
            # says so as it returns: a wait for its end alone lasted the wait's whole timeout)
            with self._cond:
                while not self._work_done and self._thread.is_alive():
                    self._cond.wait(0.1)
            self._thread.join()
        self._thread = None
        self._save_history()  # after the join: the save's JSON holds the GIL the thread needs
        if self._fcomm is not None:
            comm_mod.free(self._fcomm)
            self._fcomm = None
        self.active = False

    # -- the collective points of the application thread ------------------------
    def _collective_point(self, call: int) -> None:
        """Collective: wait for every step in flight, then raise a background failure on every
        rank (*call*: which call of the program's this is, see SPAN)."""
        self._drain()
        self._judge_owed()
        pending = self._take_failure()
        try:
            self._meet(pending, _point(call))
        except BaseException as e:
            self._reported(e, pending)
            raise

    def _judge_owed(self) -> None:
        """Collective where this rank dropped its first step before it was judged (see
        _drop_open_step): the judgement the other ranks made of it, made here too."""
        if self._first_owed:
            self._first_owed = self._first = False
            self._next_direct = not self._first_step()

    def _take_failure(self) -> BaseException | None:
        """The failure to report (once); afterwards the file goes on from the last committed step."""
        with self._cond:
            f, self._failure = self._failure, None
            unsaid, self._unsaid = self._unsaid, None
            if f is not None:  # what is queued behind it is cancelled (the worker would): say so
                self._cancel_queued(f)
        if unsaid is not None:  # taken before, not heard by the ranks: the first failure
            return unsaid
        if f is None:
            return None
        return f.build()

    def _reported(
        self, e: BaseException, pending: BaseException | None, ended: int | None = None
    ) -> bool:
        """Whether *e*, raised by the agreement of a collective call (or the wait before it),
        is a background failure's report (:func:`same_report`; *ended* as there).  Anything
        else (an interrupt while the call waited, a call made on some ranks only) is not:
        the steps every rank ended are still written, and the failure this rank took to
        report there (*pending*), unheard, is reported at its next collective call."""
        if is_left(e):
            return False
        if same_report(e, ended):
            return True
        if pending is not None:
            with self._cond:
                self._unsaid = self._unsaid or pending
        return False

    def _on_failure_elsewhere(self) -> None:
        """Another rank reported a background failure: cancel what is queued here, forget the rest."""
        with self._cond:
            self._cancel_queued(None)
        self._drain()
        with self._cond:
            self._failure = None
            self._failed_at = None  # every rank is here: the steps ended from now on are written
        self._next = self._committed

    def flush(self, durable: bool = True) -> None:
        """Collective: wait for every background step (:meth:`wait`), then flush the engine.

        A background failure raised by the wait (on every rank) is raised once the steps
        committed before it are flushed all the same."""
        self._require_open("flush")
        try:
            self.wait(FLUSH)
        except BaseException as e:
            # no collective with a rank that left, nor with ranks that came to another call
            if is_left(e) or self.inner.closed or self._parted or self._diverged:
                raise
            try:
                with self.lock:
                    self.inner.flush(durable)
            except BaseException as late:
                e.add_note(f"flushing the steps committed before it failed too: {late}")
            raise
        with self.lock:
            self.inner.flush(durable)

    def wait(self, call: int = WAIT) -> None:
        """Collective: wait for every background step; raise (on every rank) if one failed.
        Nothing to wait for once the file is closed (its close waited), as under io='sync'.
        *call*: the program's call this wait is part of (see SPAN)."""
        if not self.active or self.inner.closed:
            return
        try:
            self._collective_point(call)
        except BaseException as e:
            # a rank that left: the steps ended by all still complete (abandon); an interrupt
            # (or another error of this thread's): they are still written, as they were ended
            if not is_left(e) and same_report(e):
                self._on_failure_elsewhere()
            raise

    def _guarded(self, call: int) -> None:
        """A collective call into the inner stack from the application thread (*call*: which)."""
        if self.active:
            self.wait(call)

    # -- metadata (collective: every step in flight first) ---------------------
    def define(self, spec: DatasetSpec) -> DatasetSpec:
        self._guarded(DEFINE)
        self._spec_cache.clear()  # a refused definition may undo others (CollectiveMismatchError)
        with self.lock:
            out = self.inner.define(spec)
        if self.model is not None and not self.model.compute:
            # before the first end_step: definitions are set-up, the compute phase follows them
            self._epoch_start = time.perf_counter()
        return out

    def make_group(self, path: str) -> None:
        self._guarded(GROUP)
        with self.lock:
            self.inner.make_group(path)

    def set_attr(self, path: str, name: str, value: Any) -> None:
        # independent: committed with the step it is set in (or the next one, between steps)
        if not self._later(("attr", path, name, value)):
            with self.lock:
                self.inner.set_attr(path, name, value)

    def del_attr(self, path: str, name: str) -> None:
        if not self._later(("delattr", path, name)):
            with self.lock:
                self.inner.del_attr(path, name)

    def _later(self, op: tuple) -> bool:
        """Whether the attribute change *op* waits for its step: one open here (handed to the
        engine with its writes), or, between steps while steps are in flight, the next one.
        Given to the engine at once, a change went with the record of a step still queued:
        a rank's value set for step 1 replaced its value of step 0 there, beside another
        rank's value of step 0, and the ranks' values of one record disagreed (the step
        failed, the steps after it were cancelled).  The change is checked now, as the
        engine would check it (its value copied, as the engine copies it), and the writing
        rank sees it at once (:meth:`attrs_of`)."""
        if not self.active or self._direct is not None:
            return False
        if self._step is None:
            with self._cond:
                if not (self._queue or self._running is not None):
                    return False
        op = self._check_attr(op)
        if self._step is not None:
            self._step.attrs.append(op)
        else:
            self._between.append(op)
        return True

    def attrs_of(self, path: str) -> dict[str, Any]:
        """The attributes of *path* with this rank's changes still waiting for their steps
        (see :meth:`_later`) made on them, in order: the writing rank sees its changes at
        once, as without the layer."""
        with self._cond:
            waiting = [
                op for st in (*self._queue, self._running, self._step) if st for op in st.attrs
            ]
            waiting += self._between
        out = self.inner.attrs_of(path)
        changes = [op for op in waiting if normpath(op[1]) == path]
        if not changes:
            return out
        out = dict(out)
        for op in changes:
            if op[0] == "attr":
                out[op[2]] = op[3]  # (in the form stored: _check_attr)
            else:
                out.pop(op[2], None)
        return out

    def _check_attr(self, op: tuple) -> tuple:
        """The checks the engine makes of an attribute change, made at the program's call:
        the change as kept (a value in the form stored, a copy of the program's)."""
        if op[0] == "attr":
            return ("attr", op[1], op[2], attr_change(self.catalog, op[1], op[2], op[3])[3])
        path, name = normpath(op[1]), op[2]
        if name not in self.attrs_of(path):
            raise NotFoundError(f"no attribute {name!r} on {path or '/'!r}")
        return op

    def _hand_between(self) -> None:
        """Program thread, no step in flight: the changes made between steps go to the engine
        (committed with its next record, as without the layer)."""
        if self._between:
            between, self._between = self._between, []
            with self.lock:
                for op in between:
                    self._attr_call(op)

    def _attr_call(self, op: tuple) -> None:
        if op[0] == "attr":
            self.inner.set_attr(op[1], op[2], op[3])
        else:
            self.inner.del_attr(op[1], op[2])

    def set_ext(self, key: str, payload: bytes) -> None:
        self._guarded(EXT)
        with self.lock:
            self.inner.set_ext(key, payload)

    def derive(
        self,
        name: str,
        expression: str,
        strategy: str = "stats",
        *,
        spacing: Any = None,
        hints: dict | None = None,
    ) -> Any:
        self._guarded(DERIVE)
        if self.active and self.mode != "r":
            # a step open here (copied, or written directly) is not the engine's yet: the
            # derived layer below would not see it.  Between steps only, as without the layer,
            # judged on every rank alike (a step opened by a write may be open on some only)
            here = self._step is not None or self._direct is not None
            if comm_mod.agree(self._own(), None, flag=int(here)):
                raise mark_collective(
                    ModeError(
                        f"derived quantity {name!r}: declare it between steps (step "
                        f"{self._next} is open on some rank)"
                    )
                )
        with self.lock:
            return self.inner.derive(name, expression, strategy, spacing=spacing, hints=hints)

    def refresh(self) -> int:
        self._guarded(REFRESH)
        with self.lock:
            n = self.inner.refresh()
        if self.active:
            self._committed = self._next = n
        return n

    # -- steps ------------------------------------------------------------------
    @property
    def in_step(self) -> bool:
        if not self.active:
            return self.inner.in_step
        return self._step is not None or self._direct is not None

    @property
    def steps(self) -> int:
        """Steps this writer ended (committed, or in flight) under async; committed ones otherwise."""
        if not self.active:
            return self.inner.steps
        return self._next

    def begin_step(self) -> int:
        if not self.active:
            return self.inner.begin_step()
        self._require_open("begin a step")
        if self._adopt():
            return self._next
        if self._step is not None or self._direct is not None:
            raise StepError(f"step {self._next} is already open; call end_step first")
        self._forget_cut()  # a write cut short before: it opened no step
        if self._first:
            self._first = self._first_owed = False
            self._next_direct = not self._first_step()
        if self._next_direct:  # io='auto' wrote the last step synchronously: so this one
            t0 = time.perf_counter()
            # Every rank decided alike (_decide, _first_step are collective) and nothing is in
            # flight: the call that decided waited for the steps before.  No collective here,
            # as the engine's begin_step has none: a rank that discarded its step on its own
            # (an error inside `with f.step()`) comes here while the others end theirs, and
            # meets them at the commit, which refuses steps the ranks counted apart (a
            # collective here would wait for one the others never start).
            self._drain()
            with self.lock:
                self.inner.skip_steps(self._take_dropped())
                self.inner.begin_step()
            took = time.perf_counter() - t0
            self._in_calls += took
            self._direct = [0.0, took]
            self._direct_sizes = []
            self._direct_begun = True
            return self._next
        self._step = Step(explicit=True, idle=self._idle())
        self._step.attrs.extend(self._between)
        self._between = []
        return self._next

    def _adopt(self) -> bool:
        """At begin_step: whether a step a write opened here (not begun) was taken as the step
        begun, as the engine takes one (create_dataset(data=) writes on rank 0 alone).  The
        first step under io='auto' is judged here with the ranks that begin it."""
        if self._direct is not None and not self._direct_begun:
            with self.lock:
                self.inner.begin_step()  # the engine's step opened by the writes: taken
            self._direct_begun = True
            return True
        if self._step is None or self._step.explicit:
            return False
        if self._first:
            self._first = self._first_owed = False
            self._next_direct = not self._first_step()
            if self._next_direct:  # the ranks that begin it write it directly: so does this one
                self._adopted = self._step_to_engine()
                with self.lock:
                    self.inner.begin_step()
                self._direct_begun = True
                return True
        self._step.explicit = True
        return True

    def _first_step(self) -> bool:
        """Collective, at the first explicit begin_step under io='auto': whether that step goes
        to the background.  Its size is known only at its end; the last step this host wrote
        with as many ranks (the history) stands in for it, with the time since open as the
        compute phase.  Without such a step: no (written directly).  The ranks' predictions
        are combined as at every decision (_epochs)."""
        assert self.model is not None
        size = self.inner.comm.size
        pred: Prediction | None = None  # no step to stand in for it here: written directly
        with self._cond:  # the worker adds samples under it
            h = self.model.history
            last = next(
                (
                    x1
                    for series in (IO_SERIES, SYNC_IO_SERIES)
                    for x1, x2, _ in reversed(h.samples(series))
                    if x2 == size
                ),
                None,
            )
            # a step that did not fit the budget (its bytes over all ranks) is written directly;
            # and the stand-in may be any program's: this one's step is copied only where it
            # surely fits, every dataset defined whole within the budget (a block that did not
            # fit would be refused at its put, as under io='async')
            fits = sum(
                math.prod(s.shape) * s.dtype.itemsize for s in self.catalog.datasets.values()
            )
            if (
                last is not None
                and self._epoch_start is not None
                and last <= self.budget * size
                and fits <= self.budget
            ):
                comp = max(0.0, time.perf_counter() - self._epoch_start - self._in_calls)
                pred = self.model.predict(int(last), size, t_comp=comp)
        # the agreement of a point (not a blocking allreduce): it meets a rank that left, and
        # a rank that came to another call (see POINT); then the predictions, every rank here
        self._meet(None, _point(FIRST))
        t_sync, t_async = self._epochs(pred)
        return t_async < t_sync

    def _epochs(self, pred: Prediction | None, writes: bool = True) -> tuple[int, int]:
        """Collective, every rank at the same decision: the epoch of the step in each mode for
        the ranks together (microseconds; NEVER where a rank cannot copy it, *pred* None).
        A rank that *writes* nothing in the step says nothing of its I/O (its model would
        predict a step of no bytes: none at all); where no rank writes, the I/O is none.

        The parts of the ranks' predictions are combined before the epochs are formed:
        the compute phase and the copy of the slowest rank (the others wait for it at the
        step's collectives), the I/O the least any rank measured (a rank's own time of a
        collective step holds its wait for the ranks that came to it later: the rank that
        came last measured the step itself).  Each rank's epochs taken alone, voted on, or
        the largest of them taken, wrote steps directly where rank 0 measured its steps in
        the background at 14 ms and the others at 5-7 (8 ranks on 16 cores, where the
        background was 1.3x faster).  Nonblocking agreements, as every rank came here from
        the same call: they meet a rank that leaves."""
        own = self._own()
        if pred is None:
            comp, copy, io, io_sync = 0, NEVER, NEVER, NEVER
        else:
            comp, copy = _micros(pred.t_comp), _micros(pred.t_copy)
            io, io_sync = _micros(pred.t_io), _micros(pred.t_io_sync)
        if not writes:
            io = io_sync = NEVER
        comp = comm_mod.agree(own, None, comp)
        copy = comm_mod.agree(own, None, copy)
        io = -comm_mod.agree(own, None, -io)  # the least over the ranks
        io_sync = -comm_mod.agree(own, None, -io_sync)
        io = 0 if io >= NEVER else io
        io_sync = 0 if io_sync >= NEVER else io_sync
        t_sync = min(NEVER, io_sync + comp)
        t_async = NEVER if copy >= NEVER else min(NEVER, int(async_epoch(comp, io, copy)))
        return t_sync, t_async

    def _step_to_engine(self) -> Step | None:
        """The step open here (copied) is written directly: its calls go to the engine now,
        as a step written directly makes them.  Returns it (its copies are released once the
        step is committed), or None if no step was open here."""
        step, self._step = self._step, None
        if step is None:
            self._join_direct()
            return None
        self._join_direct(step.data_bytes, [raw.nbytes for raw in step.copies])
        try:
            with self.lock:
                self._replay(step)
        except BaseException:
            self._drop_open_step()
            self._release(step)
            raise
        return step

    def _implicit_direct(self) -> None:
        """Independent: where io='auto' writes the steps directly and no step is open here, a
        write (or an end_step) outside begin_step takes part in the step directly too, as
        the ranks that began it do: the engine opens it at the write (or joins it at its end),
        as without the layer.  (In the background instead, its end_step would make other
        collective calls than theirs.)  Before the first begin_step the model has not judged
        yet: such a step is copied, on every rank alike."""
        if self._direct is None and self._step is None and self._next_direct and not self._first:
            self._join_direct()

    def _join_direct(self, nbytes: int = 0, sizes: list[int] | None = None) -> None:
        """A step written directly, open here without begin_step (the engine opens it at the
        first write, or joins it at its end): *nbytes* put so far, *sizes* of their copies."""
        with self.lock:
            self.inner.skip_steps(self._take_dropped())
        self._direct = [float(nbytes), 0.0]
        self._direct_sizes = sizes or []
        self._direct_begun = False

    def _direct_call(self, fn, *args) -> None:
        """A write call of a step written directly (io='auto'), timed as the step's I/O."""
        assert self._direct is not None
        t0 = time.perf_counter()
        try:
            with self.lock:
                fn(*args)
        finally:
            took = time.perf_counter() - t0
            self._direct[1] += took
            self._in_calls += took

    def _open_step(self, what: str, name: str) -> Step:
        if self.inner.closed:
            raise ValueError(f"cannot {what} {name!r}: file {self.path!r} is closed")
        if self._step is None:
            # implicit: committed by the next end_step or close
            self._step = Step(explicit=False, idle=self._idle())
            self._step.attrs.extend(self._between)
            self._between = []
        return self._step

    def _dataset(self, name: str) -> DatasetSpec:
        """The dataset *name* (NotFoundError naming it if there is none)."""
        path = normpath(name)
        spec = self.catalog.datasets.get(path)
        if spec is None:
            raise dataset_not_found(self.catalog, path)
        return spec

    def _lookup(self, name: str) -> DatasetSpec:
        """The dataset *name* a program writes (ModeError for a derived one; cached)."""
        spec = self._spec_cache.get(name)
        if spec is not None:
            return spec
        spec = self._dataset(name)
        path = spec.path
        d = self.inner.definition(path)
        if d is not None:
            raise ModeError(
                f"dataset {path!r} is derived ({d.text!r}, strategy {d.strategy!r}): lamina "
                "computes it; write its inputs"
            )
        if len(self._spec_cache) < 4096:
            self._spec_cache[name] = spec
        return spec

    def lend(self, name: str, start: tuple[int, ...], array: np.ndarray) -> bool:
        # while active, every write goes through the transactional copy (put)
        return not self.active and self.inner.lend(name, start, array)

    def put(self, name: str, box: Box, array: np.ndarray, copy: bool = True) -> None:
        self._write(self.inner.put, self._put, name, lambda: box.size, box, array, copy)

    def put_many(self, name: str, starts: np.ndarray, arrays, copy: bool = True) -> None:
        self._write(
            self.inner.put_many,
            self._put_many,
            name,
            lambda: elements(arrays),
            starts,
            arrays,
            copy,
        )

    def _write(self, inner, own, name: str, count, *args) -> None:
        """A write call: to the inner stack while the layer is not active, straight to the
        engine in a step written directly (``count()``: its elements, the step's bytes), else
        into the open step by *own*; timed as time in the layer's calls."""
        if not self.active:
            inner(name, *args)
            return
        if self._step is None and self._direct is None:  # the first write of a step here
            self._implicit_direct()
        if self._direct is not None:
            self._direct_call(inner, name, *args)
            nbytes = count() * self._lookup(name).dtype.itemsize
            self._direct[0] += nbytes
            if args[-1] and nbytes:  # copy=True: copied, were the step in the background
                self._direct_sizes.append(nbytes)
            return
        t0 = time.perf_counter()
        try:
            self._mark.call(own, name, *args)  # (an error: its checks', the box taken back)
        finally:
            self._in_calls += time.perf_counter() - t0

    def _cut_short(self) -> bool:
        """Whether a write call into the open step (or one it opened) never returned (an
        interrupt cut it short): the step lacks what it was writing, and is never committed."""
        return self._mark.cut_short()

    def cut_step(self) -> None:
        if not self.active:
            self.inner.cut_step()
        elif self._direct is not None:  # the engine holds the step
            with self.lock:
                self.inner.cut_step()
        else:
            self._mark.cut = True

    def _forget_cut(self) -> None:
        """The open step is gone (ended, dropped): a write cut short was of that step."""
        self._mark.forget()

    def _drop_cut_step(self) -> NoReturn:
        """Collective, every rank alike, at an end_step whose agreement said that a write into
        the step was cut short on some rank: the step is dropped on every rank (counted
        alike) and a StepError raised on every rank, as a commit that fails raises it."""
        k = self._next
        self._drop_open_step(anywhere=True)
        raise mark_collective(
            StepError(
                f"step {k} of {self.path!r} is not committed: a write into it was interrupted "
                "before it returned (on this rank or another); the steps before it are intact"
            )
        )

    def _put(self, name: str, box: Box, array: np.ndarray, copy: bool) -> None:
        step = self._open_step("write dataset", name)
        spec = self._lookup(name)
        arr = check_put(spec, box, array)
        if arr.size == 0:
            return
        keep = (
            not copy
            and isinstance(array, np.ndarray)
            and arr is array
            and arr.dtype == spec.dtype
            and arr.flags.c_contiguous
        )
        nbytes = arr.size * spec.dtype.itemsize
        index = enter_box(step.boxes, spec, box, self._next)
        try:
            raw = self._reserve(
                step,
                nbytes,
                lambda: f"a block of dataset {spec.path!r} ({box})",
                take=not keep,
                lent=keep,
            )
        except BaseException:
            index.pop()
            raise
        if raw is None:
            with self._cond:
                self._frozen.freeze(step, arr)
        else:
            buf, warm = raw
            made = self._pool.made_seconds  # a new buffer's pages, paid for this copy
            t0 = time.perf_counter()
            view = buf.view(spec.dtype).reshape(arr.shape)
            np.copyto(view, arr, casting="same_kind")
            step.copies.append(buf)
            arr = view
            step.count_copy(nbytes, time.perf_counter() - t0 + made, warm)
        step.data_bytes += arr.size * spec.dtype.itemsize
        step.ops.append(("put", name, box, arr))

    def _put_many(self, name: str, starts: np.ndarray, arrays, copy: bool) -> None:
        """A batch as one call: checked and entered as a whole, copied into one buffer."""
        step = self._open_step("write dataset", name)
        spec = self._lookup(name)
        batch = check_batch(spec, starts, arrays)
        n = len(batch)
        if not n:
            return
        keep = not copy and not batch.copied  # the caller's arrays, frozen until written
        private = batch.owned and not keep  # casts made private copies: nothing to copy
        total = int(batch.nbytes.sum())
        index = enter_boxes(step.boxes, spec, batch.starts, batch.stops, self._next)
        try:
            # the buffer taken with the budget, under one lock (trimming the pool for the budget
            # would otherwise let go of the very buffer the copy below takes)
            got = self._reserve(
                step,
                total,
                lambda: f"{n} blocks of dataset {spec.path!r}",
                take=not (private or keep),
                lent=keep,
            )
        except BaseException:
            for _ in range(n):
                index.pop()
            raise
        out: np.ndarray | list[np.ndarray] = batch.arrays
        if keep:
            with self._cond:
                for a in batch.lent:  # (the caller's objects: an np.memmap, not a view of it)
                    self._frozen.freeze(step, a)
        elif got is not None:
            raw, warm = got
            with self._cond:
                made = self._pool.made_seconds
            t0 = time.perf_counter()
            if isinstance(batch.arrays, np.ndarray):
                out = raw.view(spec.dtype).reshape(batch.arrays.shape)
                np.copyto(out, batch.arrays)
            else:
                out, pos = [], 0
                for a, nb in zip(batch.arrays, batch.nbytes.tolist(), strict=True):
                    buf = raw[pos : pos + nb].view(spec.dtype).reshape(a.shape)
                    np.copyto(buf, a)
                    out.append(buf)
                    pos += nb
            step.copies.append(raw)
            step.count_copy(total, time.perf_counter() - t0 + made, warm)
        step.data_bytes += total
        step.ops.append(("put_many", name, batch.starts, out))

    def _stats_spec(self, name: str) -> DatasetSpec:
        """The dataset *name* a program records statistics-only blocks of, refused at the call
        as without the layer: NotFoundError, or the derived layer's ModeError (it records them
        itself, for the quantities it computes, on the inner engine: never through here)."""
        spec = self._dataset(name)
        if self._derived is not None:
            self._derived.refuse_stats(spec.path)
        return spec

    def put_stats(self, name: str, box: Box, array: np.ndarray) -> None:
        if not self.active:
            self.inner.put_stats(name, box, array)
            return
        self._implicit_direct()
        if self._direct is not None:
            self._direct_call(self.inner.put_stats, name, box, array)
            return
        self._mark.call(self._put_stats, name, box, array)

    def _put_stats(self, name: str, box: Box, array: np.ndarray) -> None:
        step = self._open_step("write statistics of dataset", name)
        # the checks put_stats makes without the layer, at the same call: a block refused when
        # the step is written would fail the whole step
        spec = self._stats_spec(name)
        arr = check_put(spec, box, array, stats=True)
        if box.empty:
            return
        index = enter_box(step.boxes, spec, box, self._next)
        try:
            self._reserve(step, arr.nbytes, lambda: f"statistics of dataset {spec.path!r} ({box})")
        except BaseException:
            index.pop()
            raise
        step.ops.append(("put_stats", name, box, np.array(arr, copy=True)))

    def put_stats_many(self, name: str, starts: np.ndarray, arrays) -> None:
        if not self.active:
            self.inner.put_stats_many(name, starts, arrays)
            return
        self._implicit_direct()
        if self._direct is not None:  # the engine takes the batch as a whole
            self._direct_call(self.inner.put_stats_many, name, starts, arrays)
            return
        self._mark.call(self._put_stats_many, name, starts, arrays)

    def _put_stats_many(self, name: str, starts: np.ndarray, arrays) -> None:
        step = self._open_step("write statistics of dataset", name)
        spec = self._stats_spec(name)
        check_stats_layout(spec)
        batch = check_batch(spec, starts, arrays)  # every block checked before any is taken
        n = len(batch)
        if not n:
            return
        index = enter_boxes(step.boxes, spec, batch.starts, batch.stops, self._next)
        try:
            # the batch's copies within the budget as a whole, as put_stats takes one
            self._reserve(
                step,
                int(batch.nbytes.sum()),
                lambda: f"statistics of {n} blocks of dataset {spec.path!r}",
            )
        except BaseException:
            for _ in range(n):
                index.pop()
            raise
        for k, box in enumerate(batch.boxes()):
            a = batch.block(k)  # copied, unless the batch's casts made it the layer's own
            step.ops.append(("put_stats", name, box, a if batch.owned else np.array(a, copy=True)))

    def discard_step(self) -> None:
        if not self.active:
            self.inner.discard_step()
            return
        self._drop_open_step()

    def _drop_open_step(self, anywhere: bool = False) -> None:
        """Drop the step open here, if any: counted as a step dropped (handed down with the
        next, :meth:`.Engine.skip_steps`).  *anywhere*: a step was open on some rank (a step
        opened by a put exists only on the ranks that wrote), counted here even if none was,
        as ending it would have ended an empty one here: every rank's count stays alike."""
        counted = False  # the engine counted it (it discards a step it opened)
        if self._direct is not None or self._step is not None or anywhere:
            self._just_dropped = True
        if self._direct is not None:  # written directly: the engine holds the open step
            self._direct = None
            with self.lock:
                if not self.inner.closed and self.inner.in_step:
                    self.inner.discard_step()
                    counted = True
            adopted, self._adopted = self._adopted, None
            if adopted is not None:  # (after the engine let go of them)
                self._release(adopted)
        step, self._step = self._step, None
        if step is not None:
            self._keep_attrs(step)  # (before the release, which lets go of its calls)
            self._release(step)
            # the first step, opened by a put here, dropped before it was judged: the ranks
            # that end it judge it at its end (or at their begin_step): this rank owes them
            # that agreement, at its next collective call
            self._first_owed = self._first
        if not counted and (step is not None or anywhere):
            with self._cond:
                self._dropped += 1
        self._forget_cut()

    def _keep_attrs(self, step: Step) -> None:
        """The attribute changes of *step*, dropped, are kept: the engine's discard drops a
        step's data, not the metadata changes made in it (attributes are not versioned by
        step), which its next record commits, as under io='sync'.  They wait as changes made
        between steps do (:meth:`_later`), handed to the engine at once where no step is in
        flight."""
        if not step.attrs:
            return
        with self._cond:
            self._between = step.attrs + self._between
            idle = not (self._queue or self._running is not None)
        if idle and not self.inner.closed:
            self._hand_between()

    def _write_at_exit(self, stopped: bool) -> bool:
        """At exit (:func:`_at_exit`): write the steps still in flight, saying so, and say a
        failure nobody is left to raise to.  *stopped*: an interrupt stopped the hook at an
        earlier file, so these steps are not written either.  Returns whether it stopped."""
        with self._cond:
            waiting = [s.index for s in self._queue]
            if self._running is not None:
                waiting.insert(0, self._running.index)
        if waiting and not stopped:
            warnings.warn(
                f"background I/O of {self.path!r} at exit: the file was not closed; writing "
                f"{fmt_steps(waiting)} still in flight before the process exits (an "
                "interrupt now leaves them out of the file)",
                LaminaWarning,
                stacklevel=1,
            )
        failure: BaseException | None = None
        try:
            if stopped:
                raise KeyboardInterrupt
            self._drain()
            failure = self._take_failure()  # nobody is left to raise it to: say it
        except Exception as e:  # pragma: no cover - nothing to raise to at exit
            failure = e
        except BaseException:  # an interrupt (a signal handler's exception) while it waits
            self._stop_at_exit()
            return True
        if failure is not None:
            warnings.warn(
                f"background I/O of {self.path!r} at exit: {failure}", LaminaWarning, stacklevel=1
            )
        return stopped

    def _stop_at_exit(self) -> None:
        """The exit hook was interrupted: the steps queued are not written (said), the step
        being committed is finished (the thread may not be left in the commit's MPI calls
        while MPI finalizes; another interrupt stops that wait too)."""
        with self._cond:
            queued = [s.index for s in self._queue]
            running = self._running
            self._cancel_queued(None)
            self._stopping = True
            self._cond.notify_all()
        if not queued and running is None:
            return
        said = []
        if queued:
            said.append(f"{fmt_steps(queued)} {'was' if len(queued) == 1 else 'were'} not written")
        if running is not None:
            said.append(
                f"step {running.index}, being committed, is finished first (another interrupt "
                "leaves it out too)"
            )
        warnings.warn(
            f"background I/O of {self.path!r} interrupted at exit: {'; '.join(said)}",
            LaminaWarning,
            stacklevel=1,
        )
        with self._cond:
            while self._running is not None:
                self._cond.wait(0.5)

    def _take_dropped(self) -> int:
        """The steps dropped here since the last one handed down (they go with the next)."""
        with self._cond:
            n, self._dropped = self._dropped, 0
        return n

    def end_step(self) -> None:
        if not self.active:
            self.inner.end_step()
            return
        self._require_open("end a step")
        copied = None  # the first step, copied here, written directly after all
        if self._first:
            # the first step, opened by a put here (or ended without one): ranks that began it
            # judged it at begin_step (_first_step, collective); this rank judges it with them
            self._first = self._first_owed = False
            try:
                self._next_direct = not self._first_step()
            except BaseException:
                self._drop_open_step(anywhere=self._parted)  # as when end_step's agreement raises
                raise
            if self._next_direct:
                copied = self._step_to_engine()
        self._implicit_direct()  # a rank that neither began this step nor wrote in it
        t_call = time.perf_counter()
        self._measure_phase(t_call)
        if self._direct is not None:
            try:
                self._end_direct(t_call)
            finally:
                copied = copied or self._adopted
                self._adopted = None
                if copied is not None:  # the engine held its copies until the commit
                    self._release(copied)
            return
        pending = self._take_failure()
        opened: list[int] = []  # whether a step was open on some rank, even if this raises
        # a step a write into was cut short (an interrupt) on some rank: 2, the largest
        here = 2 if self._cut_short() else int(self._step is not None)
        room = 0.0
        try:
            # room in the queue first (before the meeting: an interrupt in this wait is one
            # in the meeting, before this rank came to it)
            room = self._wait_for_room()
            # a step opened by a put exists only on the ranks that wrote: decide together (the
            # flag is ENDING at least: a rank at a point or a close meanwhile is told, see POINT)
            t_meet = time.perf_counter()
            active = self._meet(pending, ENDING + here, opened) - ENDING
            # until the step is handed to the thread (_submit), the others may hold it in
            # theirs: an exception of this rank's own (an interrupt) leaves it here (abandon)
            self._cut_meeting = True
            t_meet = time.perf_counter() - t_meet
        except BaseException as e:
            if not is_collective(e):
                # raised on this rank alone (an interrupt), maybe once the agreement completed
                # (after its wait, in _meet): the others may have handed the step to their
                # threads, whose commit of it waits for this rank's (see abandon)
                self._cut_meeting = True
            # a step open on some rank is counted dropped here too, and one the ranks met apart
            # over (this rank behind: it ends a step the others dropped) even if none was here
            ended = bool(opened and opened[0] > ENDING)
            self._drop_open_step(anywhere=ended or self._parted)
            dropped = ended and not self._parted
            if self._reported(e, pending, self._next if dropped else None):
                if dropped:
                    # a background failure raised here: the step this end_step ends is dropped
                    # on every rank, cancelled as the steps ended after the failure are (the
                    # ranks agreed that some rank had it open, so all count it alike)
                    with self._cond:
                        self.stats.steps_cancelled += 1
                self._on_failure_elsewhere()
            # else not a background failure (an interrupt while this rank waited for the
            # others, ...): only the step being ended is dropped; the steps ended before it
            # are still written (at the next call that waits for them, close, or the exit)
            raise
        if not active:
            self._cut_meeting = False  # (raised on every rank)
            raise mark_collective(StepError("end_step called without begin_step"))
        if active > 1:
            self._cut_meeting = False
            self._drop_cut_step()
        step = self._step or Step(explicit=False)
        step.budget_wait += room
        self._step = None
        self._forget_cut()
        timed = False  # the step's calls are a sample of its hand-over (copies all alike)
        lent = False  # it copied nothing: arrays lent (copy=False) alone
        if self.model is not None:  # the step's copies: one sample
            with self._cond:  # the background thread adds samples under it
                sample = step.copy_sample(self._pool.served)
                if sample is not None:
                    self.model.add_copy(*sample)
                # a step of arrays lent (copy=False) copies nothing: its calls are its hand-over,
                # a sample kept apart from the copies' (it says nothing of a step that copies);
                # one made beside a step being written is slowed by that thread (the GIL,
                # memory), which only steps faster than their writes meet, and then the I/O
                # bounds the epoch: only those made alone are samples
                alike = not (step.copied and step.fresh_copied)
                lent = not step.nbytes and step.lent > 0
                timed = (lent or (sample is not None and alike)) and step.idle and self._idle()
        # the bytes it copied (the background thread frees them once the step is written)
        copied_bytes = step.nbytes
        step.index = self._next
        self._next += 1
        background = (
            self._decide(step.data_bytes, step.index, t_call, step, copied=copied_bytes)
            if self.auto
            else True
        )
        # the next step the same way, without the copies; after a probe of writing directly,
        # copied again, so that its own decision says (the probe is one step)
        probe = step.decision is not None and step.decision.get("probe")
        self._next_direct = not background and not probe
        sizes = [raw.nbytes for raw in step.copies]
        self._submit(step)
        self._cut_meeting = False  # handed, as on the others
        if not background:  # the model expects no overlap to pay: the step is written now
            self.wait(SYNC_STEP)
        else:
            self._make_ahead(sizes)
            if timed and self.model is not None:
                # the program's hand-over of the step, the model's t_copy: not its waits for
                # the budget or the other ranks, which steps still being written cause
                spent = self._in_calls + time.perf_counter() - t_call - step.budget_wait - t_meet
                with self._cond:
                    self.model.add_submit(
                        step.data_bytes if lent else copied_bytes, spent, lent=lent
                    )
        self._save_history(time.monotonic())
        self._epoch_start = time.perf_counter()
        self._in_calls = 0.0

    # -- io='auto': the model decides, per step ----------------------------------
    def _measure_phase(self, now: float) -> None:
        """The compute phase that ends now: time since the last end_step returned, minus lamina calls."""
        if self._epoch_start is None or self.model is None:
            return
        comp = max(0.0, now - self._epoch_start - self._in_calls)
        self.model.add_compute(comp)
        d = self._decision
        if d is not None:  # the epoch that followed the last decision: its I/O phase and this phase
            d["t_comp_measured"] = comp
            d["epoch_measured"] = now - self._decision_started
            self._decision = None

    def _end_direct(self, t_call: float) -> None:
        """Collective: end a step written directly; decide how the next one is written."""
        assert self._direct is not None
        nbytes, io = int(self._direct[0]), self._direct[1]
        t0 = time.perf_counter()
        # a step copied here first, cut short, then handed to the engine (_step_to_engine): 2
        here = 2 if self._cut_short() else int(self.inner.in_step)
        try:
            # the agreement every end_step starts with (nothing is in flight to fail): so that
            # a rank that closes meanwhile meets it here, not the engine's commit
            active = self._meet(None, ENDING + here) - ENDING
        except BaseException:
            self._drop_open_step(anywhere=self._parted)  # as end_step's
            raise
        if active > 1:
            self._drop_cut_step()
        try:
            with self.lock:
                self.inner.end_step()  # raises as a synchronous end_step does; the step is gone
        finally:
            self._direct = None
        io += time.perf_counter() - t0
        self.stats.steps_direct += 1
        index = self._next
        self._next += 1
        self._committed = self._next
        with self._cond:
            self._sample_io(nbytes, io, waited=True, index=index)
        # the step is written (sync); what the model says for its size decides the next one
        agreed = self._decide(
            nbytes, index, t_call, None, done="sync", copied=sum(self._direct_sizes)
        )
        self._next_direct = not agreed
        with self._cond:
            if self._decision is not None:
                self._decision["t_io_measured"] = io
            if agreed:  # the next step is copied: its buffers made ready while the program computes
                self._warm = self._pool.missing(self._direct_sizes)
                self._cond.notify_all()
        self._direct_sizes = []
        self._save_history(time.monotonic())
        self._epoch_start = time.perf_counter()
        self._in_calls = 0.0

    def _sample_io(self, nbytes: int, seconds: float, waited: bool, index: int) -> None:
        """Step *index*, of *nbytes* per rank, written in *seconds*: for the model (under
        ``_cond``).  The first step this open wrote is not one of the run's own samples
        (:attr:`AsyncModel.run`), only the history's: it creates the file's first bytes, 5-15x
        a later step's time here, and as the run's only sample of its mode it outweighed the
        history's median of that size for the next 7 decisions."""
        if self.model is not None and nbytes:
            size = self.inner.comm.size
            self.model.add_io(nbytes * size, size, seconds, waited, run=index != self._opened_at)
            self._measured = True

    def _decide(
        self,
        nbytes: int,
        index: int,
        now: float,
        step: Step | None,
        done: str | None = None,
        copied: int = 0,
    ) -> bool:
        """Collective: whether a step of *nbytes* per rank goes to the background (every rank
        alike: all must predict it pays, and a step like this one, *copied* bytes of copies a
        rank, must fit the budget).  *done*: the mode step *index* was written in already (a
        step written directly), recorded instead of the one decided."""
        assert self.model is not None
        size = self.inner.comm.size
        with self._cond:  # the background thread adds samples under it
            pred: Prediction = self.model.predict(max(nbytes, 1) * size, size, copied=copied * size)
        # the next step copied only if one like this one fits the budget: else it is written
        # directly (in the background it would be refused at the put that overflows); what
        # it lent (copy=False) is kept by reference, outside the budget
        fits = copied <= self.budget
        # the ranks' predictions together (every rank came here from the same end_step: its
        # agreement paired them); a step that does not fit on some rank is not copied
        t_sync, t_async = self._epochs(
            pred if fits else dataclasses.replace(pred, t_copy=math.inf), writes=nbytes > 0
        )
        if self._probe_next:  # the step before decided this (copied) step is a probe
            self._probe_next = False
            agreed = probe = True
        else:
            # the mode of the last steps is kept unless the other is predicted better by
            # MARGIN: within it the prediction is noise (a few percent from step to step),
            # and a change costs what the model leaves out (the first copies after steps
            # written directly go into buffers made meanwhile, or new memory)
            if self._streak_mode is None:
                agreed = t_async < t_sync
            elif self._streak_mode:
                agreed = not t_sync < t_async * (1 - MARGIN)
            else:
                agreed = t_async < t_sync * (1 - MARGIN)
            agreed = agreed and t_async < NEVER  # a step some rank cannot copy: written directly
            flip = self._probe(agreed, t_async < NEVER)
            agreed ^= flip
            # a decision after a step written directly is for the next step: a probe there
            # copies that step, and its own decision (at its end) keeps to the probe
            self._probe_next = flip and agreed and done is not None
            probe = flip and done is None
        mode = done or ("async" if agreed else "sync")
        d: dict[str, Any] = {"step": index, **pred.as_dict()}
        d["predicted"] = d.pop("mode")  # what this rank's model said; "mode": what all ranks do
        d["mode"] = mode
        d["t_sync_ranks"] = t_sync / 1e6  # the ranks together (_epochs)
        d["t_async_ranks"] = t_async / 1e6 if t_async < NEVER else None
        d["probe"] = probe
        if step is not None:
            step.decision = d
        self._decision, self._decision_started = d, now
        with self._cond:
            if mode == "async":
                self.stats.steps_auto_async += 1
            else:
                self.stats.steps_auto_sync += 1
            self.stats.decisions.append(d)
            del self.stats.decisions[:-DECISIONS_KEPT]
            if self._rank == 0:
                self._decisions_open.append(d)
                self._encode_decisions()
        self._hand_decisions(step)
        return bool(agreed)

    def _encode_decisions(self) -> None:
        """Rank 0, under ``_cond``: the decisions measured for good, encoded for the file
        (a row each, :func:`decision_row`).  Not the last one (the compute phase after it is
        measured at the next end_step), nor those of steps queued or being written (their
        I/O is measured as they end).  Each decision is encoded once: a run's every decision
        goes into the file at close (the whole list again at every step would cost more at
        each step than the one before)."""
        pending = self._decisions_open
        first = self._running if self._running is not None else next(iter(self._queue), None)
        while len(pending) > 1 and (first is None or pending[0]["step"] < first.index):
            self._decision_rows.append(decision_row(pending.popleft()))

    def _probe(self, background: bool, can: bool) -> bool:
        """Whether the step the ranks agreed to write in the background (*background*) or
        directly is written the other way instead, once, to measure that way again (its
        decision says ``probe``).

        The model learns what a mode costs only from steps written that way: where it
        picked one mode for :data:`PROBE_AFTER` steps in a row, the next step is written
        the other way (if *can*: a step that does not fit the budget is not copied), and the
        streak that earns the next such step doubles.  Otherwise a history of slow steps
        of one mode (another run's, on a busy machine) would keep ``io='auto'`` from that
        mode for good.  The same on every rank: the streak counts agreed decisions."""
        if background == self._streak_mode:
            self._streak += 1
        else:
            self._streak_mode, self._streak = background, 1
        if self._streak < self._probe_after or not (background or can):
            return False
        self._streak = 0
        self._probe_after *= 2
        self.stats.probes += 1
        return True

    # -- the budget -------------------------------------------------------------
    def _reserve(
        self,
        step: Step,
        nbytes: int,
        what: Callable[[], str],
        take: bool = False,
        lent: bool = False,
    ) -> tuple[np.ndarray, bool] | None:
        """Count *nbytes* more of *step* in flight, waiting while the budget is short;
        ConfigError (naming ``what()``) if one step cannot hold them.  With *take*, a buffer of
        *nbytes* from the pool, taken under the same lock (:meth:`.Pool.take`).

        *lent*: the bytes of an array kept by reference (``copy=False``): they wait for the
        budget as copies do, so that a program lending new arrays step after step cannot
        run ahead of its writes without bound (the in situ transport's ``queue_limit``
        holds the background thread, not the program), but are never refused: a lent
        array larger than the budget is taken once nothing else is in flight."""
        if not nbytes:
            return None
        if not lent and step.nbytes + nbytes > self.budget:
            raise ConfigError(
                f"{what()} of {nbytes} bytes does not fit max_inflight_bytes={self.budget} with the "
                f"{step.nbytes} bytes this step already holds: raise max_inflight_bytes to at least "
                f"{step.nbytes + nbytes}, or write this file with io='sync'"
            )
        with self._cond:
            waited = False
            t0 = time.perf_counter()
            # buffers being made for later copies hold their part of the budget until they are
            # in the pool (then this copy may take one of them, and the pool gives way)
            while self.stats.inflight_bytes + nbytes + self._making > self.budget and (
                self._queue or self._running is not None or self._making
            ):
                waited = True
                self._cond.wait(0.5)
            if waited:
                self.stats.waits += 1
                self.stats.wait_seconds += time.perf_counter() - t0
                step.budget_wait += time.perf_counter() - t0
            raw = self._pool.take(nbytes) if take else None  # first: it may fail (memory)
            self.stats.inflight_bytes += nbytes
            if lent:
                step.lent += nbytes
            self._pool.trim(self._pool_room())
            self.stats.peak_inflight_bytes = max(
                self.stats.peak_inflight_bytes, self.stats.inflight_bytes
            )
        if not lent:
            step.nbytes += nbytes
        return raw

    def _release(self, step: Step) -> None:
        """The step is done (written, failed or cancelled): its bytes leave the budget, its
        copies' buffers go back to the pool, its lent arrays thaw."""
        with self._cond:
            self.stats.inflight_bytes -= step.nbytes + step.lent
            self._frozen.thaw(step)
            # the copies' buffers serve later steps, within the budget with what is in flight
            self._pool.give(step.copies, self._pool_room())
            self._cond.notify_all()

    def _pool_room(self) -> int:
        """The bytes the pool may hold (under ``_cond``): the budget less the copies in flight
        and the buffers being made."""
        return self.budget - self.stats.inflight_bytes - self._making

    def _claim(self, sizes: list[int]) -> list[int]:
        """The buffers of *sizes* the pool lacks, counted as being made (under ``_cond``) where
        the budget has room for all of them beside the copies in flight, the pool and the
        buffers being made already; else none (nothing to make)."""
        missing = self._pool.missing(sizes)
        if not missing or sum(missing) > self._pool_room() - self._pool.nbytes:
            return []
        self._making += sum(missing)
        return missing

    # -- the background thread --------------------------------------------------
    def _start(self) -> None:
        """The background thread, waiting for steps (under ``_cond``)."""
        if self._thread is None:
            _hook_exit()
            _LIVE.add(self)
            self._stopping = False
            self._work_done = False
            self._thread = threading.Thread(
                target=self._work, name=f"lamina-io {self.path}", daemon=False
            )
            self._thread.start()

    def _idle(self) -> bool:
        """Whether no step is queued or being written on this rank (read without the lock: a
        hint for the model's samples)."""
        return not self._queue and self._running is None

    def _submit(self, step: Step) -> None:
        step.skipped = self._take_dropped()
        with self._cond:
            self._start()
            self._queue.append(step)
            self._handed_count += 1
            self._cond.notify_all()

    def _wait_for_room(self) -> float:
        """Independent, end_step before its meeting: wait while :data:`QUEUE_STEPS` steps are
        queued (the oldest being written), counted as a wait for the budget is; the seconds
        waited.  The thread writes the steps queued whatever this thread does: it never waits
        for this one.  (Only this thread queues steps: the room is there at the hand-over.)"""
        with self._cond:
            if len(self._queue) < QUEUE_STEPS:
                return 0.0
            t0 = time.perf_counter()
            while (
                len(self._queue) >= QUEUE_STEPS
                and self._failed_at is None
                and (self._thread is not None and self._thread.is_alive())
            ):
                self._cond.wait(0.5)
            took = time.perf_counter() - t0
            self.stats.waits += 1
            self.stats.wait_seconds += took
            return took

    def _drain(self) -> None:
        """Independent, the program's thread: wait until no step is queued or running on this
        rank (then the attribute changes made between steps go to the engine)."""
        with self._cond:
            while self._queue or self._running is not None:
                self._cond.wait(0.5)
        self._hand_between()

    def _work(self) -> None:
        main = threading.main_thread()
        while True:
            with self._cond:
                while not self._queue and not (self._warm and not self._stopping):
                    if self._stopping or not main.is_alive():
                        # at interpreter exit, once every step ended is written; told to a
                        # _shutdown waiting on the condition (see there)
                        self._work_done = True
                        self._cond.notify_all()
                        return
                    self._cond.wait(0.1)
                sizes: list[int] = []
                if self._queue and self._failed_at is not None:
                    # a step failed and the ranks have not parted with it together yet: every
                    # step ended after it is cancelled, whether it was queued when the step
                    # failed or came later (ranks hand their steps over at their own pace; a
                    # step one rank runs and another cancels leaves the first in its commit)
                    self._cancel_queued(self._failure)
                    continue
                if self._queue:
                    step = self._queue.popleft()
                    self._running = step
                else:  # nothing to write: buffers for the next step's copies, if they fit
                    sizes, self._warm = self._claim(self._warm), []
                    if not sizes:
                        continue
            if sizes:  # their pages touched while the program computes
                self._make_ready(sizes)
                continue
            error: BaseException | None = None
            t0 = time.perf_counter()
            try:
                with self.lock:
                    self._run(step)
            except BaseException as e:  # reported by the application thread
                error = e
            took = time.perf_counter() - t0
            with self._cond:
                self._running = None
                if error is None:
                    self._committed = step.index + 1
                    self.stats.steps_background += 1
                    waited = step.decision is not None and step.decision["mode"] == "sync"
                    self._sample_io(step.data_bytes, took, waited, step.index)
                    if step.decision is not None:
                        step.decision["t_io_measured"] = took
                else:
                    self.stats.steps_failed += 1
                    f = BackgroundError(
                        step.index, error, self.inner.comm.rank, self.path, step.doing
                    )
                    self._cancel_queued(f)
                    if self._failure is None:
                        self._failure = f
                    if self._failed_at is None:
                        self._failed_at = step.index
                # released in the same hold of the lock that says it is done: f.wait() (or a
                # read of the step) returned before the step's lent arrays were writeable again
                self._release(step)
                self._cond.notify_all()

    def _make_ahead(self, sizes: list[int]) -> None:
        """A step of copies of *sizes* bytes was submitted: unless it is written before the
        program's next puts, their buffers are not back in time and the next step copies into
        new memory (2-4x a warm copy).  Make what the pool lacks now, on a thread of its own,
        while the program computes and the worker writes; the buffers wait in the pool.  Once
        the pool holds a step more than is in flight, nothing is made.  They count in the
        budget while they are made (:meth:`_claim`): a put that would exceed it with them
        waits until they are in the pool, and takes them.

        Only where it can pay: the rank has a core beside the program's (with ranks = cores
        the thread's page clearing slowed the worker's writes: 1.2x the time of a step at
        compute = half the I/O, 2 ranks on 2 cores), the copies are the same as the step
        before (a program whose steps differ would make buffers nobody takes), and the budget
        has room for them beside what is in flight, pooled and being made (else none are
        made)."""
        last, self._last_sizes = self._last_sizes, sizes
        if not sizes or not self._spare_core or (last is not None and last != sizes):
            return
        with self._cond:
            if not (self._queue or self._running is not None) or (
                self._ahead is not None and not self._ahead.done()
            ):
                return
            missing = self._claim(sizes)
        if missing:
            try:
                self._ahead = _MAKER.get().submit(self._make_ready, missing)
            except RuntimeError:  # the interpreter is stopping: the copies make their own
                with self._cond:
                    self._making -= sum(missing)
                    self._cond.notify_all()

    def _make_ready(self, sizes: list[int]) -> None:
        """Worker, idle (or the thread of :meth:`_make_ahead`): buffers of *sizes* (counted as
        being made, :meth:`_claim`) with their pages touched, into the pool (within the
        budget).  Only a saving: a failure (no memory) leaves the copies to make new ones."""
        raws: list[np.ndarray] = []
        try:
            raws = touched(sizes)
        except Exception:  # noqa: BLE001 - the copies make their own
            pass
        finally:
            with self._cond:
                self._making -= sum(sizes)  # in the pool now (or let go): no longer being made
                if not self._stopping:
                    # not 'served': these buffers did not come back from a step, and copies
                    # into new memory before any did are still the warm-up (copy_sample)
                    self._pool.give(raws, self._pool_room(), served=False)
                self._cond.notify_all()  # puts waiting for the budget they held

    def _cancel_queued(self, failure: BackgroundError | None) -> None:
        """Every queued step will not be written (under ``_cond``): its copies freed, its lent
        arrays thawed, its index noted on *failure* (the error names the steps cancelled)."""
        for step in self._queue:
            if failure is not None:
                failure.cancelled.append(step.index)
            self._dropped += step.skipped  # still to be counted, with the next step handed down
            self.stats.steps_cancelled += 1
            self._release(step)  # (_cond is reentrant)
        self._queue.clear()
        self._cond.notify_all()

    def _replay(self, step: Step) -> None:
        """The step's calls on the inner stack (the puts of one rank fail together, see _run)."""
        if step.skipped:
            self.inner.skip_steps(step.skipped)
            step.skipped = 0
        if step.explicit or not step.ops:
            # an implicit step is opened by its first write; one whose writes were all refused
            # or empty (they open the step without the layer too) is opened here
            step.doing = "beginning the step"
            self.inner.begin_step()
        for op in step.attrs:  # (committed with the step's writes, whatever their order)
            step.doing = f"changing attribute {op[2]!r} of {'/' + op[1]!r}"
            self._attr_call(op)
        for key, raw in step.exts:  # io='auto': decisions of the steps before (every rank)
            step.doing = f"recording {key!r}"
            self.inner.set_ext(key, raw)
        for op in step.ops:
            if op[0] == "put_many":
                step.doing = f"writing {len(op[2])} blocks of dataset {op[1]!r}"
                self.inner.put_many(op[1], op[2], op[3], copy=False)
                continue
            step.doing = f"writing dataset {op[1]!r} box {op[2]}"
            if op[0] == "put":
                self.inner.put(op[1], op[2], op[3], copy=False)
            else:
                self.inner.put_stats(op[1], op[2], op[3])

    def _run(self, step: Step) -> None:
        """Background thread, holding the lock: one whole step on the inner stack."""
        comm = self.inner.comm
        g = comm_mod.Guard()
        with g:
            self._replay(step)
        if g.error is not None and not isinstance(g.error, RemoteError):
            # say where, in the text that travels: the other ranks raise this one's error
            kind, text = error_to_wire(g.error)
            err = error_from_wire(kind, f"rank {comm.rank} ({step.doing}): {text}")
            err.__cause__ = g.error
            g.error = err
        try:
            # a put that failed on one rank must not leave the others in the commit
            comm_mod.agree(comm, g.error)
            step.doing = "committing"
            self.inner.end_step()
        except BaseException:
            if self.inner.in_step:
                self.inner.discard_step()
            raise

    # -- reading: committed steps directly, steps in flight once written ---------
    def _settle(self, step: int | None) -> int | None:
        """The step a read means (absolute); waits until it is committed if it is in flight here.

        Without the layer, ``None`` and negative steps count from the last
        committed step; here from the last step this writer ended, which may
        still be in flight: they are made absolute before the inner engine
        (which knows only the committed ones) sees them.
        """
        if not self.active:
            return step
        n = self._next
        k = n - 1 if step is None else step_number(step)
        if k < 0 and step is not None:
            k += n
        if not 0 <= k < n:
            return step  # no such step: the inner engine says so, as without the layer
        if k >= self._committed:
            with self._cond:
                while k >= self._committed and (self._queue or self._running is not None):
                    self._cond.wait(0.5)
                failed = k >= self._committed
            if failed:
                raise StepError(
                    f"step {k} of {self.path!r} was not committed: its background write failed, "
                    "or it was cancelled behind a step that failed (the error is raised at the "
                    "next collective call)"
                )
        return k

    def check_step(self, step: int | None) -> int:
        step = self._settle(step)
        with self.lock:
            return self.inner.check_step(step)

    def check_read(
        self, name: str, box: Box, step: int | None, out: np.ndarray
    ) -> tuple[DatasetSpec, int]:
        step = self._settle(step)
        with self.lock:
            return self.inner.check_read(name, box, step, out)

    def wait_steps(self, count: int, seconds: float) -> None:
        if self._prefetch is None:
            self.inner.wait_steps(count, seconds)
            return
        # under the lock: an engine told of new steps (the in situ transport's consumer) takes
        # in what arrives, which the read-ahead thread's reads do too
        with self.lock:
            self.inner.wait_steps(count, seconds)

    def prefetch(self, name: str, box: Box, step: int | None) -> bool:
        """Independent (readers): read *box* of *name* at *step* ahead on the read-ahead thread,
        for a later read of that box at that step; whether it is fetched or being fetched."""
        if self._prefetch is None:
            raise ConfigError(
                f"prefetch reads ahead for a reader of a file opened with io='async' "
                f"(or $LAMINA_IO=async): {self.path!r} is "
                + ("written" if self.mode != "r" else "read without read-ahead")
            )
        # the box checked as a read checks it, with the same error: refused here, nothing
        # reserved for it (the read-ahead thread's error would be raised by nobody, and a box
        # out of bounds would hold the budget for bytes no read takes)
        with self.lock:
            spec = self._dataset(name)
        box.check_inside(spec.shape, f"dataset {spec.path!r}")
        # resolving the step releases none (the in situ consumer lets earlier steps go when the
        # program asks for a later one) and waits for none: a step not here yet while the
        # writer goes on is read when asked for
        with self.lock, self.inner.reading_ahead():
            if step is not None:
                k = step_number(step)
                if k >= self.inner.steps and not self.inner.writer_closed:
                    return False
            k = self.inner.check_step(step)
        return self._prefetch.request(name, box, k)

    def take_read_ahead(self, name: str, box: Box, step: int | None) -> np.ndarray | None:
        if self._prefetch is None or not self._prefetch.serving:
            return None
        with self._prefetch.reads():
            with self.lock:
                k = self.inner.check_step(step)
            return self._prefetch.take(name, box, k)

    def get(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        if self._prefetch is not None and self._prefetch.serving:
            with self._prefetch.reads():  # no read ahead beside the program's own reads
                with self.lock:  # the box and the caller's buffer checked as any read checks them
                    _, k = self.inner.check_read(name, box, step, out)
                if self._prefetch.get(name, box, k, out):
                    return
                with self.lock:
                    self.inner.get(name, box, self._settle(k), out)
                return
        step = self._settle(step)
        with self.lock:
            self.inner.get(name, box, step, out)

    def get_collective(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        # collective on the inner communicator, as the background steps' commits are: every
        # step in flight first, so that both come in one order on every rank
        self._guarded(READ)
        step = self._settle(step)
        with self.lock:
            self.inner.get_collective(name, box, step, out)

    def get_level(
        self,
        name: str,
        box: Box,
        step: int | None,
        out: np.ndarray,
        level: int = 0,
        cache: dict | None = None,
        tolerance: float | None = None,
    ) -> int:
        step = self._settle(step)
        with self.lock:
            return self.inner.get_level(name, box, step, out, level, cache, tolerance)

    def blocks(self, name: str, step: int) -> Sequence[BlockInfo]:
        self._settle(step)
        with self.lock:
            return self.inner.blocks(name, step)

    def block_table(self, name: str, step: int, stats: bool = True, level: int = 0) -> BlockTable:
        self._settle(step)
        with self.lock:
            return self.inner.block_table(name, step, stats, level)

    def coverage(self, path: str, step: int | None) -> list[Box]:
        step = self._settle(step)
        with self.lock:
            return self.inner.coverage(path, step)


__all__ = [
    "BackgroundLayer",
    "DEFAULT_INFLIGHT_BYTES",
    "IOStats",
]
