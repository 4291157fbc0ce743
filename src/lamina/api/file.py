"""Files: open, steps, views at a step, following a file that is still being written."""

from __future__ import annotations

import contextlib
import numbers
import os
import time
import warnings
from collections.abc import Iterator

from .. import comm as comm_mod
from .. import layers as _layers  # noqa: F401 - registers the built-in layers
from .. import query as query_mod
from .. import stats as stats_mod
from ..derived import _parallel
from ..engines import registry
from ..engines.base import Engine, durable_flag
from ..errors import (
    CollectiveMismatchError,
    ConfigError,
    LaminaWarning,
    StepError,
    StepTimeoutError,
    is_collective,
    is_left,
    mark_collective,
)
from ..geometry import as_int
from ..layers.background import BackgroundLayer, IOStats
from ..text import as_seconds, fmt_ranges, plural
from ..workflow import routes
from .group import Group

#: what the ranks opening a file must choose alike: (what, the variables and arguments choosing it)
_CHOICES = (
    ("engines", f"engine=, transport=, ${routes.TRANSPORT_ENV} or ${registry.ENGINE_ENV}"),
    ("I/O modes", f"io= or ${registry.IO_ENV}"),
    ("layers", "layers="),
)


def _chosen(top: Engine, path, mode, engine, layers, transport, io) -> list[tuple[str, str]]:
    """This rank's choices for the file, in :data:`_CHOICES`' order: (the value, what chose it)."""
    if isinstance(engine, Engine):
        name, why = top.stack()[-1].name, "an engine= object"
    else:
        name, why = registry.engine_choice(path, mode, engine, transport)
    how = registry.resolve_io(io)
    io_why = (
        "io="
        if io is not None
        else f"${registry.IO_ENV}"
        if os.environ.get(registry.IO_ENV)
        else "the default"
    )
    lays = registry.layers_of(top)
    return [
        (f"engine {name!r}", why),
        (f"io {how!r}", io_why),
        (f"layers {lays}", "layers=" if layers is not None else "the default"),
    ]


def _same_stack(comm, path: str, chosen: list[tuple[str, str]]) -> None:
    """Collective: CollectiveMismatchError on every rank unless every rank made the same
    *chosen* (:func:`_chosen`), naming what differs and which ranks chose what."""
    key = stats_mod.crc(repr([value for value, _ in chosen]).encode())
    if comm_mod.same_everywhere(comm, key):
        return
    mine = "\0".join(f"{value}\0{why}" for value, why in chosen).encode()
    every = []
    for raw in comm_mod.allgather_bytes(comm, mine):
        parts = raw.decode("utf-8", "replace").split("\0")
        every.append(list(zip(parts[::2], parts[1::2], strict=False)))
    apart = [i for i in range(len(_CHOICES)) if len({c[i][0] for c in every}) > 1] or [0, 1, 2]
    groups: dict[str, list[int]] = {}
    for r, c in enumerate(every):
        words = ", ".join(f"{c[i][0]} ({c[i][1]})" for i in apart)
        groups.setdefault(words, []).append(r)
    said = "; ".join(
        f"{'rank' if len(ranks) == 1 else 'ranks'} {fmt_ranges(ranks)}: {words}"
        for words, ranks in groups.items()
    )
    what = " and ".join(f"different {_CHOICES[i][0]} ({_CHOICES[i][1]})" for i in apart)
    raise mark_collective(CollectiveMismatchError(f"{path}: ranks open it with {what}: {said}"))


class File(Group):
    """An open lamina file: the root group plus steps.

    Use :func:`lamina.open`.  Opening and closing are collective over
    ``f.comm``.
    """

    def __init__(
        self,
        path,
        mode: str = "r",
        comm=None,
        engine: str | Engine | None = None,
        layers=None,
        transport: str | None = None,
        io: str | None = None,
        **options,
    ):
        # a bytes path (os.fsencode's, h5py's filename) names the same file as its str: str()
        # of it made a directory named "b'...'" under the working directory
        path = os.fsdecode(os.fspath(path))
        # a write call of this file's datasets under way: set as it starts, cleared as it
        # returns or raises an error. Left set by an interrupt (Ctrl-C) that escapes it, from
        # wherever in the call, the engine is told (_cut_short) that the open step lacks
        # what that call was writing: it is not committed (end_step raises, close drops it)
        self._writing = False
        self._comm = comm_mod.resolve(comm)
        # the arguments checked on every rank, then agreed: a rank given an argument the others
        # were not (an I/O mode, an option, a budget) raises with them instead of leaving them
        # waiting in the open's first collective call
        g = comm_mod.Guard()
        built, chosen = None, []
        with g:
            # a bad $LAMINA_THREADS named here, not where threads are first used (a step's end)
            _parallel.env_threads()
            built = registry.build(path, mode, engine, layers, transport, options, io)
            built[0].validate_open(mode, built[1], self._comm.size)
            chosen = _chosen(built[0], path, mode, engine, layers, transport, io)
        comm_mod.agree(self._comm, g.error)
        # one engine, one stack of layers and one I/O mode on every rank (one allreduce): an
        # engine or background I/O makes collective calls of its own from the open on (a rank
        # under $LAMINA_ENGINE, $LAMINA_TRANSPORT or $LAMINA_IO beside ranks without it waited
        # forever).  Only the ranks of this communicator: the programs of an in situ launch
        # open their sides of a name with engines of their own.
        _same_stack(self._comm, path, chosen)
        assert built is not None
        self._engine, options = built
        self._engine.open(path, mode, self._comm, options)
        self._filename = path
        super().__init__(self, "", None)

    # -- identity -------------------------------------------------------
    @property
    def comm(self):
        """The communicator the file was opened on (the task's, by default)."""
        return self._comm

    @property
    def filename(self) -> str:
        return self._filename

    @property
    def mode(self) -> str:
        return self._engine.mode

    @property
    def format_version(self) -> int | None:
        """The on-disk format version of a native file (1 to 4, docs/format.md): the one its
        headers give, which an appending writer keeps; a new file's is the latest.  None for
        engines that keep no such file (memory, transports)."""
        return self._engine.format_version

    @property
    def engine(self) -> Engine:
        return self._engine

    def __repr__(self) -> str:
        state = "closed" if self._engine.closed else f"mode {self.mode!r}"
        steps = plural(self.steps, "step")
        return f"<lamina.File {self._filename!r} ({state}, engine {self._engine.name!r}, {steps})>"

    # -- steps (writers) --------------------------------------------------
    @property
    def steps(self) -> int:
        """Number of committed steps this rank knows of."""
        return self._engine.steps

    def begin_step(self) -> int:
        """Collective: start a step; returns its index."""
        if self._writing:
            self._cut_short()
        return self._engine.begin_step()

    def end_step(self) -> None:
        """Collective: commit the current step atomically (data, then metadata, then commit record)."""
        if self._writing:
            self._cut_short()
        self._engine.end_step()

    def _cut_short(self) -> None:
        """A write call never returned (an interrupt cut it short, see ``_writing``): the
        engine is told, and does not commit the step that call was writing into."""
        self._writing = False
        if not self._engine.closed:
            self._engine.cut_step()

    # on a File, ``step`` begins a step (``with f.step():``), as documented; on views
    # (Group.step) it is the step a view reads, which a File, reading the latest, has not
    @contextlib.contextmanager
    def step(self) -> Iterator[int]:  # type: ignore[override]
        """Collective: ``with f.step() as k:`` begins step k and commits it on exit.

        If the block raises, the step is discarded on this rank and the error
        propagates (under ``python -m mpi4py`` an uncaught error aborts all ranks).
        """
        k = self.begin_step()
        try:
            yield k
        except BaseException:
            self._writing = False  # (a write cut short was of the step dropped)
            self._engine.discard_step()
            raise
        self.end_step()

    # -- derived quantities ----------------------------------------------
    def derive(self, name: str, expression: str, strategy: str = "stats", *, spacing=None, **hints):
        """Collective: declare a derived quantity; returns its dataset (or group of x, y, z for a vector).

        Parameters
        ----------
        name : str
            Path of the new dataset (a group ``name`` with ``x``, ``y``, ``z``
            for a vector result such as ``curl``).
        expression : str
            Over dataset paths, e.g. ``"magnitude(vx, vy, vz)"`` (see docs/derived.md).
        strategy : {'stats', 'store', 'expression', 'auto'}
            What the file keeps: statistics only (default), data and
            statistics, or the expression only; ``'auto'`` asks the cost model
            (:mod:`lamina.perf`), using *hints*.
        spacing : float or sequence of float, optional
            Grid spacing of stencils, one per axis (default 1).
        **hints
            For ``'auto'``: ``query_fraction``, ``readers``, ``read_bandwidth``,
            ``write_bandwidth``.

        On a file opened for reading, the quantity exists in this process
        only and is computed when read.
        """
        d = self._engine.derive(name, expression, strategy, spacing=spacing, hints=hints or None)
        return self[d.name]

    @property
    def derived(self) -> dict:
        """Derived quantities by name: their :class:`~lamina.layers.Definition` (expression, strategy, ...)."""
        return self._engine.definitions()

    def query(
        self, where: str, select=(), region=None, step=None, exact: bool = True, level: int = 0
    ):
        """Independent: the elements where predicate *where* holds at *step* (default: the last).

        See :func:`lamina.query.run` for the arguments (*level*: answer at a
        coarser level of multiresolution datasets) and what the
        :class:`~lamina.query.QueryResult` holds.
        """
        return query_mod.run(
            self._engine,
            self._filename,
            where,
            select=select,
            region=region,
            step=step,
            exact=exact,
            level=level,
        )

    # -- steps (readers) --------------------------------------------------
    def at(self, step: int) -> StepView:
        """Independent: a read-only view of the whole file at committed *step* (negative counts from the end)."""
        k = self._engine.check_step(step)
        return StepView(self, k)

    def refresh(self) -> int:
        """Collective: pick up steps committed by a concurrent writer; returns the step count."""
        self._open_for("refresh")
        return self._engine.refresh()

    def _open_for(self, what: str) -> None:
        """ValueError if the file is closed (as a read of it raises; a closed reader has no
        communicator left to agree on anything)."""
        if self._engine.closed:
            raise ValueError(f"cannot {what}: file {self._filename!r} is closed")

    def wait_for_step(
        self, step: int, timeout: float | None = None, poll: float = 0.05
    ) -> StepView:
        """Collective: block until *step* is committed (or raise StepTimeoutError / StepError).

        On a file open for writing there is nothing to wait for but the steps it ended in
        the background: a step it has not ended is a StepError at once.

        *step* is an integer (negative counts from the end: -k waits until there are k
        steps, then gives the k-th from the last), *timeout* None (no limit) or seconds >= 0,
        *poll* seconds > 0: anything else is a TypeError or ValueError naming it.
        """
        self._open_for("wait for a step")
        step = _step_arg(step, "wait_for_step")
        timeout, poll = _wait_args(timeout, poll, "wait_for_step")
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = poll
        need = -step if step < 0 else step + 1  # the steps there must be
        looked = False  # whether this call has looked at the file yet
        while True:
            if need <= self.steps:
                return self.at(step)
            if self.mode != "r":  # this process writes the file: no other adds a step
                self.wait()  # (the steps it ended in the background, committed)
                if need <= self.steps:
                    return self.at(step)
                raise StepError(
                    f"step {step} does not exist in {self._filename!r}: this process writes it "
                    f"and has committed {self.steps} steps; a step exists once its end_step "
                    "returns"
                )
            # (what the last refresh saw may be old: steps committed since, a writer that
            # opened the file again in mode 'a' after closing it; so the first turn looks at
            # the file before it judges, and a timeout of 0 looks once)
            if looked and self._engine.writer_closed:
                raise StepError(
                    f"step {step} will never exist: the writer of {self._filename!r} closed it after {self.steps} steps"
                )
            expired = looked and deadline is not None and time.monotonic() >= deadline
            # all ranks must agree on timing out, or they would diverge in refresh() (the call
            # named: ranks in another collective call raise CollectiveMismatchError)
            if self._engine.agree(int(expired), comm_mod.CALL_WAIT):
                raise StepTimeoutError(
                    f"no step {step} in {self._filename!r} after {timeout} s ({self.steps} steps committed)"
                )
            if looked:
                # (returns early when the engine hears of a step; never past the deadline: a
                # poll of 8 s under a timeout of 1 s waited 8 s)
                left = (
                    delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))
                )
                self._engine.wait_steps(need, min(left, LONGEST_PAUSE))
                delay = min(delay * 1.5, 1.0)
            looked = True
            self.refresh()

    def iter_steps(
        self,
        start: int = 0,
        timeout: float | None = 30.0,
        poll: float = 0.05,
        prefetch: bool = False,
    ) -> Iterator[StepView]:
        """Collective: yield each step as it is committed, like a stream.

        Ends when the writer has closed the file and every step was yielded;
        raises StepTimeoutError if no new step arrives within *timeout* seconds.
        On a file open for writing, the steps it has committed (those it ended in the
        background waited for) and no more: this process is the file's writer.
        With *prefetch* (a file opened with ``io='async'``), what the program
        read at one step is read ahead at the next ones on a background
        thread while it works (docs/background.md).
        """
        self._open_for("iterate over steps")
        start = _step_arg(start, "iter_steps", "start")
        timeout, poll = _wait_args(timeout, poll, "iter_steps")
        bg = self._background() if prefetch else None
        # (a file opened with io='async' where MPI has no thread support streams without
        # read-ahead, as its open warned: the program runs on)
        if prefetch and (bg is None or not (bg.asynchronous or bg.without_thread)):
            raise ConfigError(
                "iter_steps(prefetch=True) reads ahead on a background thread: open the file "
                "with io='async' (or $LAMINA_IO=async)"
            )
        if start < 0:  # from the end of the steps committed now, once (it counted up from it)
            if self.mode == "r":
                self.refresh()  # (now: not at the last refresh)
            if -start > self.steps:
                raise StepError(
                    f"iter_steps(start={start}): {self._filename!r} has {self.steps} committed "
                    "steps to count back from"
                )
            start += self.steps
        k = start
        try:  # (a break, an error or the last step ends the stream's read-ahead)
            while True:
                if k >= self.steps and self.mode != "r":
                    self.wait()
                    if k >= self.steps:
                        return  # (no other process adds a step to a file this one writes)
                if k >= self.steps and self._engine.writer_closed:
                    self.refresh()
                    if k >= self.steps and self._engine.writer_closed:
                        return
                try:
                    view = self.wait_for_step(k, timeout=timeout, poll=poll)
                except StepError:
                    if self._engine.writer_closed and k >= self.steps:
                        return
                    raise
                if bg is not None:
                    bg.streaming(k)
                yield view
                k += 1
        finally:
            if bg is not None:
                bg.stream_ended()

    def __iter__(self):
        return super().__iter__()

    # -- background I/O ---------------------------------------------------
    def _background(self) -> BackgroundLayer | None:
        for e in self._engine.stack():
            if isinstance(e, BackgroundLayer):
                return e
        return None

    @property
    def io(self) -> str:
        """``'async'`` when steps are committed in the background (``io='async'``), ``'auto'`` when
        a model picks per step (``io='auto'``), else ``'sync'``."""
        bg = self._background()
        if bg is None or not bg.asynchronous:
            return "sync"
        return "auto" if bg.auto else "async"

    def wait(self) -> None:
        """Collective: wait until every step ended so far is committed (``io='async'``; no-op otherwise).

        Raises, on every rank, the error of a background step that failed
        (naming the step and the steps cancelled after it).
        """
        bg = self._background()
        if bg is not None:
            bg.wait()

    def flush(self, durable: bool = True) -> None:
        """Collective: every step ended so far committed (waiting for background steps, as
        :meth:`wait` does) and, with *durable*, on stable storage.

        A file opened with ``durable=False`` skips the fsyncs at each commit (a
        killed process still leaves a consistent file, a power loss may not);
        ``f.flush()`` makes what it committed durable at the points the program
        chooses (every few steps, before a checkpoint is reported done).  Files
        opened with ``durable=True``, readers and engines without storage
        (``memory``, ``mpi``) have nothing more to do.  Every rank passes the same
        *durable* (else CollectiveMismatchError on every rank, where a file fsyncs); it is a
        bool (numpy's too), else TypeError.  ValueError on a closed file (on every engine).
        """
        self._open_for("flush")
        self._engine.flush(durable_flag(durable, "flush()"))

    @property
    def io_stats(self) -> dict:
        """Independent: what background I/O did: steps written in the background, waits for the budget, bytes in flight."""
        bg = self._background()
        return (bg.stats if bg is not None else IOStats()).as_dict()

    # -- lifetime ---------------------------------------------------------
    def close(self) -> None:
        """Collective: commit pending changes (writers) and close."""
        if not self._engine.closed:  # (no MPI call may be made after MPI.Finalize)
            comm_mod.check_mpi(f"close of {self._filename!r}")
        if self._writing:
            self._cut_short()
        self._engine.close()

    def __del__(self) -> None:
        # as Python's files: one collected open says so (a ResourceWarning, shown with -X dev
        # or -W default). It is not closed here: a close is collective, and the other ranks
        # are not collecting theirs at this moment.
        if "_filename" not in self.__dict__:  # its open failed: nothing was opened
            return
        engine = self._engine
        if not engine.closed:
            warnings.warn(
                f"unclosed lamina file {self._filename!r} (mode {engine.mode!r}): close it or "
                "open it in a with block; a writer's open step and later changes are not "
                "committed, and the file stays locked in this process",
                ResourceWarning,
                source=self,
                stacklevel=2,
            )

    def __enter__(self) -> File:
        return self

    def __exit__(self, et, ev, tb) -> None:
        if ev is not None and not self._engine.closed and comm_mod.finalized():
            self.close()  # MPIStateError (what there is to say; the program's error chained)
        if is_left(ev):  # another rank let go of the file: no collective call with it any more
            self._engine.abandon()
            return
        if ev is not None and self._comm.size > 1 and not is_collective(ev):
            # only this rank failed: a collective close could pair with a different collective
            # call on the others; tell them (they raise at their next collective call) and go.
            # Where every rank leaves at once, each after an error of its own, the leave marks
            # the error collective: they close together below, as one rank does
            self._engine.leave(ev)
            if not is_collective(ev):
                return
        if ev is not None and any(e.ENDS_STREAMS for e in self._engine.stack()):
            # an in situ producer that failed (on every rank, or alone): a close would end
            # its consumers' streams as if it had finished; they are told it failed
            self._engine.abandon()
            return
        if ev is not None and self._engine.in_step:
            self._writing = False  # (as in step())
            self._engine.discard_step()
        if ev is None:
            self.close()
            return
        try:
            self.close()
        except Exception as late:
            # the program's error goes on unchanged, on any number of ranks (where this rank
            # left the others, above, a background failure is said at exit): what the close
            # met (a background step's failure, io="async") is said beside it
            warnings.warn(
                f"closing {self._filename!r} after {type(ev).__name__} in its with block: {late}",
                LaminaWarning,
                stacklevel=2,
            )


#: the longest pause between two looks for new steps: a longer *poll* looks again after it
#: (time.sleep refuses pauses past the platform's time_t)
LONGEST_PAUSE = 3600.0


def _step_arg(step, call: str, what: str = "step") -> int:
    """*step* of *call* as an int; TypeError naming it for anything else (a float, a string or
    a bool is not rounded, parsed or taken as 0 and 1)."""
    try:
        return as_int(step)
    except TypeError:
        raise TypeError(
            f"{call}(): {what} must be an integer (negative counts from the end), got {step!r}"
        ) from None


def _seconds(value, call: str, what: str, zero: bool) -> float:
    """*value* of *call* as seconds: TypeError unless a real number (not a bool), ValueError
    unless >= 0 (> 0 where not *zero*)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{call}(): {what} must be a number of seconds, got {value!r}")
    v = as_seconds(value)
    if not (v >= 0 if zero else v > 0):
        raise ValueError(
            f"{call}(): {what} must be {'>= 0' if zero else '> 0'} seconds, got {value!r}"
        )
    return v


def _wait_args(timeout, poll, call: str) -> tuple[float | None, float]:
    """*timeout* (None: no limit) and *poll* of a wait for steps, checked (:func:`_seconds`)."""
    return (
        None if timeout is None else _seconds(timeout, call, "timeout", True),
        _seconds(poll, call, "poll", False),
    )


class StepView(Group):
    """The file as it was at one committed step (from :meth:`File.at`)."""

    def __init__(self, file: File, step: int):
        super().__init__(file, "", step)

    @property
    def index(self) -> int:
        assert self._step is not None  # a view is of one step
        return self._step

    @property
    def time(self) -> float:
        """Wall-clock time at which the step was committed (seconds since the epoch)."""
        return self._file._engine.catalog.step_times[self._step]

    def __repr__(self) -> str:
        return f"<lamina step {self._step} of {self._file.filename!r}>"

    def query(
        self, where: str, select=(), region=None, step=None, exact: bool = True, level: int = 0
    ):
        """Independent: :meth:`File.query` at this view's step (or at *step*)."""
        return self._file.query(
            where,
            select=select,
            region=region,
            step=self._step if step is None else step,
            exact=exact,
            level=level,
        )


def open(  # noqa: A001
    path,
    mode: str = "r",
    comm=None,
    engine: str | Engine | None = None,
    transport: str | None = None,
    layers=None,
    io: str | None = None,
    **options,
) -> File:
    """Collective: open a lamina file.

    Parameters
    ----------
    path : str or path-like
        A ``.lam`` directory for the native engine; a name for ``memory``.
    mode : {'r', 'w', 'a'}
        Read, create (truncate), or append after the last committed step.
    comm : mpi4py communicator, optional
        Default: the task's communicator (``MPI.COMM_WORLD`` unless several
        programs share one MPMD launch).  Without ``mpiexec``: one rank.
    engine : str or Engine, optional
        ``'native'`` (default, or ``$LAMINA_ENGINE``), ``'memory'``, ``'mpi'``,
        ``'both'``, or an engine registered by a package
        (:mod:`lamina.engines.registry`).
    transport : {'file', 'memory', 'both'}, optional
        Default ``$LAMINA_TRANSPORT``, else ``'file'``.  ``'memory'`` serves
        the file from the producer program to the consumer programs of the
        same MPMD launch over MPI instead of writing it; ``'both'`` does
        both (see docs/transport.md).
    layers : list of str, optional
        The layers over the engine, innermost first (default: ``['derived']``,
        which gives derived quantities and queries over them).
    io : {'sync', 'async', 'auto'}, optional
        Default ``$LAMINA_IO``, else ``'sync'``.  ``'async'``: ``end_step``
        returns once the step's data is copied and the step is committed on
        a background thread (option ``max_inflight_bytes`` bounds the
        copies); :meth:`File.wait` waits for it.  ``'auto'``: a model fitted
        to this machine's measured history picks per step.  See
        docs/background.md.
    **options
        Options of the engine and the layers, e.g. ``aggregators=2``,
        ``durable=False``; for the memory transport ``timeout``,
        ``queue_limit``, ``shallow``; for the derived layer ``device``.
        Options of the engines a program may be routed to instead are
        accepted and ignored, so one program runs under every transport.
    """
    return File(
        path, mode, comm=comm, engine=engine, layers=layers, transport=transport, io=io, **options
    )
