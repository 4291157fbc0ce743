"""A step of background I/O as the program made it, what the layer counts, and how it reports a failure."""

from __future__ import annotations

import mmap
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...catalog import DatasetSpec
from ...engines.batch import check_dtype
from ...engines.staging import BoxIndex, make_writeable
from ...errors import (
    ConfigError,
    RemoteError,
    ShapeError,
    error_from_wire,
    error_to_wire,
    is_left,
)
from ...geometry import Box

#: default budget of the copies of the steps in flight
DEFAULT_INFLIGHT_BYTES = 1 << 30
#: steps queued for the background thread at most (beside the one it writes): an end_step that
#: would queue more waits, before its meeting, as a put waits for the budget, so that a program
#: of many small steps faster than their writes does not run ahead without bound (an
#: interrupted program writes every step its ranks ended before it stops: a thousand small
#: steps queued took half a minute)
QUEUE_STEPS = 32


@dataclass
class Step:
    """One step as the application made it: the calls to replay on the inner stack."""

    explicit: bool  # begun by begin_step (else opened by a put)
    ops: list[tuple] = field(default_factory=list)
    #: attribute changes made in it, ("attr", path, name, value) or ("delattr", path, name),
    #: in order: handed down with its writes (BackgroundLayer._later)
    attrs: list[tuple] = field(default_factory=list)
    nbytes: int = 0  # bytes of the copies this step holds (counted in the budget)
    lent: int = 0  # bytes of the arrays it keeps by reference (the budget's waits count them)
    frozen: list[np.ndarray] = field(default_factory=list)  # arrays kept by reference
    boxes: dict[int, BoxIndex] = field(default_factory=dict)  # dataset id -> boxes (overlap)
    index: int = -1  # the step's index, known at end_step
    doing: str = ""  # what the background thread was doing in it (for the error)
    data_bytes: int = 0  # bytes of data written in the step (copied or kept)
    copies: list[np.ndarray] = field(default_factory=list)  # the buffers of its copies (Pool)
    # bytes copied at put into buffers reused from earlier steps and the seconds it took,
    # then the same for copies into new buffers (copy_sample: one sample per step)
    copied: int = 0
    copy_seconds: float = 0.0
    fresh_copied: int = 0
    fresh_seconds: float = 0.0
    budget_wait: float = 0.0  # seconds its puts waited for the budget, its end_step for room in
    # the queue (QUEUE_STEPS): not the calls' own work
    idle: bool = True  # no step was being written when it was opened (its calls met no thread)
    decision: dict[str, Any] | None = None  # io='auto': the prediction made for it, and the outcome
    #: io='auto': extension records of the decisions of steps before it, (key, bytes), set with
    #: its writes on every rank (BackgroundLayer._hand_decisions)
    exts: list[tuple[str, bytes]] = field(default_factory=list)
    # steps this rank dropped before this one without handing them down (Engine.skip_steps)
    skipped: int = 0

    def count_copy(self, nbytes: int, seconds: float, warm: bool) -> None:
        """A copy at put of *nbytes* that took *seconds*, into a reused buffer if *warm*."""
        if warm:
            self.copied += nbytes
            self.copy_seconds += seconds
        else:
            self.fresh_copied += nbytes
            self.fresh_seconds += seconds

    def copy_sample(self, pool_served: bool) -> tuple[int, float] | None:
        """``(bytes, seconds)`` of this step's sample of the copy rate, or None.

        Its copies into reused buffers; if it had none, its copies into new
        buffers, but only once the pool has had buffers back (*pool_served*):
        a run's first steps copy into new memory once (a page fault per page,
        several times slower) and would make every later copy look as dear,
        while copies into new memory after that are what this run pays
        (blocks whose sizes change, steps faster than their writes).
        """
        if self.copied:
            return self.copied, self.copy_seconds
        if self.fresh_copied and pool_served:
            return self.fresh_copied, self.fresh_seconds
        return None


@dataclass
class IOStats:
    """What the background layer did (``File.io_stats``)."""

    mode: str = "sync"
    steps_background: int = 0  # steps committed by the background thread
    steps_failed: int = 0
    steps_cancelled: int = 0
    waits: int = 0  # times the application thread waited for the budget
    wait_seconds: float = 0.0
    inflight_bytes: int = 0
    peak_inflight_bytes: int = 0
    max_inflight_bytes: int = 0
    prefetch_hits: int = 0  # reads served from a read ahead (readers, iter_steps(prefetch=True))
    prefetch_misses: int = 0
    prefetched_bytes: int = 0
    steps_auto_async: int = 0  # io='auto': steps the model sent to the background
    steps_auto_sync: int = 0  # ... and steps it wrote synchronously
    probes: int = 0  # ... of them, steps written the other way to measure it again (_probe)
    steps_direct: int = 0  # ... of which straight to the engine (no copy at put, no thread)
    decisions: list[dict[str, Any]] = field(default_factory=list)  # the last ones, with outcomes

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


#: a rank's error as the background thread words it where it failed in the step's calls
#: (BackgroundLayer._run), or as another rank's agreement brought it: "rank N: ..."
_FROM_RANK = re.compile(r"rank (\d+)(?: \((.*?)\))?: (.*)", re.S)
#: a failure report another rank's agreement brought here (the rank whose report it was first)
_RELAYED = re.compile(r"rank \d+: (?=background step \d+ of )")
#: the part of a report that says the step was not committed and which steps were cancelled
_CANCELLED = re.compile(
    r" and was not committed(?:; step\(s\) \[([\d, ]*)\] queued after it were cancelled)?"
    r"; earlier steps are intact: "
)


def _intact(cancelled: list[int]) -> str:
    cancel = f"; step(s) {cancelled} queued after it were cancelled" if cancelled else ""
    return f" and was not committed{cancel}; earlier steps are intact: "


class BackgroundError:
    """The failure of one background step, as the application thread reports it."""

    def __init__(self, step: int, exc: BaseException, rank: int, path: str, doing: str) -> None:
        self.step = step
        self.exc = exc
        self.rank = rank
        self.path = path
        self.doing = doing
        self.cancelled: list[int] = []

    def origin(self, text: str) -> tuple[int | None, str, str]:
        """The rank that failed, what it was doing (or ''), and its error's own words, from
        *text* (the error's text as it travels).

        A rank's own error is its own.  One another rank sent (a RemoteError, or an error
        an agreement brought: ``lamina_from_rank``) says whose it was ("rank N: ...", or
        "rank N (writing dataset 'x' box ...): ..." where that rank failed in the step's
        calls): every rank words the failure alike, whichever rank's report is raised
        (the ranks report it together, the lowest rank's report raised everywhere, and a
        rank whose own failure is not recorded yet reports none).  A failure another rank
        sent without saying what it was doing came through the step's commit, which this
        rank was making too."""
        remote = isinstance(self.exc, RemoteError) or hasattr(self.exc, "lamina_from_rank")
        m = _FROM_RANK.fullmatch(text)
        if m is not None and (remote or int(m.group(1)) == self.rank):
            doing = m.group(2) or (self.doing if self.doing == "committing" else "")
            return int(m.group(1)), doing, m.group(3)
        if remote:
            return getattr(self.exc, "lamina_from_rank", None), "", text
        return self.rank, self.doing, text

    def build(self) -> BaseException:
        """The error to raise: the original's class (or a RemoteError that is also its builtin)."""
        kind, text = error_to_wire(self.exc)
        if text.startswith("background step"):
            msg = text  # already said by the rank that failed first
        elif is_left(self.exc):
            # nothing failed here: another rank let go of the file (its own error, an
            # interrupt) while this step waited in its commit for that rank
            rank = getattr(self.exc, "lamina_from_rank", None)
            by = "another rank" if rank is None else f"rank {rank}"
            msg = f"background step {self.step} of {self.path!r} was abandoned by {by}"
            msg += _intact(self.cancelled) + text
        else:
            rank, doing, words = self.origin(text)
            where = "" if rank is None else f" on rank {rank}"
            doing = f" ({doing})" if doing else ""
            msg = (
                f"background step {self.step} of {self.path!r} failed{where}{doing}"
                f"{_intact(self.cancelled)}{words}"
            )
        err = error_from_wire(kind, msg)
        err.__cause__ = self.exc
        if hasattr(self.exc, "lamina_from_rank"):  # another rank's failure, brought here: the
            err.lamina_from_rank = self.exc.lamina_from_rank  # type: ignore[attr-defined]
        return err  # agreement raises that rank's own report everywhere (comm.agree)


def same_report(exc: BaseException, ended: int | None = None) -> bool:
    """Whether *exc* is a background failure's report (:meth:`BackgroundError.build`); if so,
    worded as on the rank whose report it is: an agreement that brings it from another rank
    puts that rank in front ("rank N: background step ..."), taken off here, so that every
    rank raises the same words (the rank that failed is named in them).  *ended*: the step
    whose ``end_step`` raises it, dropped on every rank, is named among the cancelled."""
    text = str(exc)
    relayed = _RELAYED.match(text)
    if relayed is not None:
        text = text[relayed.end() :]
    if not text.startswith("background step "):
        return False
    if ended is not None:
        m = _CANCELLED.search(text)
        if m is not None:
            cancelled = [int(k) for k in m.group(1).split(",")] if m.group(1) else []
            if ended not in cancelled:
                cancelled.append(ended)
            text = text[: m.start()] + _intact(cancelled) + text[m.end() :]
    if text != str(exc):
        exc.args = (text,)
    return True


#: bytes of a page of memory: touching one byte faults the whole page in
PAGE = mmap.PAGESIZE
#: new buffers of at least this many bytes are mapped with their pages populated by the
#: kernel in the same call (Linux's MAP_POPULATE): a copy at put into np.empty's memory takes
#: a page fault per page, 1.5-2.5x the cost of populating them at once (8 MiB as 256 KiB to
#: 8 MiB buffers: 2.2-6.1 ms against 1.4-2.4 ms, copy included, on the development machine).
#: Smaller buffers come from malloc's heap, as do all where MAP_POPULATE does not exist.
POPULATE_MIN = 256 << 10
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
#: bytes of a huge page (x86-64; aarch64 with 4 KiB pages): where the kernel gives
#: transparent huge pages to memory advised for them, new buffers of POPULATE_MIN bytes or
#: more come from regions of whole huge pages, one page fault and one clear per HUGE bytes
#: instead of one per page (8 MiB made: 0.36 ms against 0.97 ms with MAP_POPULATE, and the
#: copy into it 0.63 against 0.79 ms, fewer TLB misses; development machine)
HUGE = 2 << 20


def _transparent_huge_pages() -> bool:
    """Whether Linux gives huge pages to memory advised for them (THP 'always' or 'madvise')."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            text = fh.read()
    except OSError:
        return False
    return "[always]" in text or "[madvise]" in text


#: new copy buffers come from huge-page regions (see HUGE); False: MAP_POPULATE or malloc
HUGE_PAGES = _transparent_huge_pages()


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


class _Region:
    """New memory, advised for huge pages and every page touched, cut into buffers.

    Each buffer is an array of its own over the mapping (``np.frombuffer`` at
    an offset), not a slice of one array: numpy's views of a slice refer to
    the array sliced, so :meth:`Pool.take` could not see (by the buffer's
    reference count) that an engine still holds a view of it.  The mapping
    lives as long as one of its buffers does.
    """

    __slots__ = ("mm", "pos", "end")

    def __init__(self, size: int) -> None:
        """*size* bytes (at least HUGE, a multiple of PAGE); the whole huge pages among them
        advised."""
        # a huge page must start at a multiple of HUGE: map one more and start there
        self.mm = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        addr = np.frombuffer(self.mm, dtype=np.uint8, count=1).ctypes.data
        self.pos = -addr % HUGE
        self.end = self.pos + size
        try:
            self.mm.madvise(mmap.MADV_HUGEPAGE, self.pos, size // HUGE * HUGE)
        except OSError:  # not given: pages of PAGE bytes, touched below all the same
            pass
        # every page touched now: one fault per huge page (per page where none was given)
        np.frombuffer(self.mm, dtype=np.uint8, count=size, offset=self.pos)[::PAGE] = 0

    def room(self) -> int:
        return self.end - self.pos

    def cut(self, nbytes: int) -> np.ndarray:
        """A buffer of *nbytes* (at most :meth:`room`), its pages populated."""
        out = np.frombuffer(self.mm, dtype=np.uint8, count=nbytes, offset=self.pos)
        self.pos = min(self.end, self.pos + _round_up(nbytes, 64))
        return out


def new_buffer(nbytes: int) -> tuple[np.ndarray, bool]:
    """A new uint8 buffer of *nbytes* bytes, and whether its pages are in memory already
    (from HUGE bytes on, huge pages where the kernel gives them, see :data:`HUGE`; else
    populated by the kernel, see :data:`POPULATE_MIN`; else malloc's).  Smaller buffers
    share huge pages only through :class:`Regions`."""
    if nbytes >= POPULATE_MIN:
        try:
            if HUGE_PAGES and nbytes >= HUGE:
                return _Region(_round_up(nbytes, PAGE)).cut(nbytes), True
            if _POPULATE:
                flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE
                return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype=np.uint8), True
        except (OSError, ValueError):  # no mapping to be had: malloc's memory, faulted as used
            pass
    return np.empty(nbytes, dtype=np.uint8), False


def _shared(nbytes: int) -> bool:
    """Whether a new buffer of *nbytes* is cut from a region shared with others."""
    return HUGE_PAGES and POPULATE_MIN <= nbytes < HUGE


class Regions:
    """Where new buffers come from: those smaller than a huge page cut from shared
    huge-page regions (a huge page each would hold up to twice their bytes, and small pages
    cost a fault each), the others from :func:`new_buffer`.  The last region is kept while
    it has room for more."""

    def __init__(self) -> None:
        self.last: _Region | None = None

    def make(self, sizes: list[int]) -> list[tuple[np.ndarray, bool]]:
        """New buffers of *sizes* bytes, and whether each one's pages are in memory already."""
        out: list[tuple[np.ndarray, bool]] = []
        left = sum(n for n in sizes if _shared(n))
        for n in sizes:
            if _shared(n):
                try:
                    if self.last is None or self.last.room() < n:
                        self.last = _Region(_round_up(left, HUGE))  # the rest of them, at once
                    out.append((self.last.cut(n), True))
                    left -= n
                    continue
                except (OSError, ValueError):
                    self.last = None
            out.append(new_buffer(n))
        return out


class Pool:
    """The buffers of the copies of written steps, for the copies of later steps.

    A copy into fresh memory costs its page faults (about 5 times a copy
    into memory already touched, on the development machine), so the
    buffers of a step are kept when it is written and taken again by the
    puts of later steps of the same sizes.  A buffer is taken only if
    nothing else refers to it any more (``sys.getrefcount``): an engine that
    keeps a block by reference (the memory transport's shallow datasets)
    keeps its buffer out of the pool.  Not locked: the layer calls it under
    its condition.
    """

    def __init__(self) -> None:
        self.free: dict[int, list[np.ndarray]] = {}
        self.nbytes = 0
        self.served = False  # buffers came back once (a step was written): past the warm-up
        self.made_seconds = 0.0  # what the last take spent making a new buffer (0 if served)
        self.regions = Regions()  # where new buffers come from

    def take(self, nbytes: int) -> tuple[np.ndarray, bool]:
        """A uint8 buffer of *nbytes* bytes: a free one of that size, else a new one
        (:class:`Regions`, its cost in :attr:`made_seconds`); and whether it was free (its
        pages touched already: a copy into it runs at memory speed, a new one costs its
        pages, populated at once or faulted by the copy)."""
        self.made_seconds = 0.0
        got = self.free.get(nbytes)
        while got:
            raw = got.pop()
            self.nbytes -= nbytes
            if sys.getrefcount(raw) <= 2:  # this name and the call's argument: nobody else
                return raw, True
        t0 = time.perf_counter()
        ((raw, _),) = self.regions.make([nbytes])
        self.made_seconds = time.perf_counter() - t0
        return raw, False

    def missing(self, sizes: list[int]) -> list[int]:
        """The buffers of *sizes* the pool cannot serve from what it holds now."""
        have = {n: len(lst) for n, lst in self.free.items()}
        out = []
        for n in sizes:
            if have.get(n, 0) > 0:
                have[n] -= 1
            else:
                out.append(n)
        return out

    def give(self, raws: list[np.ndarray], room: int, served: bool = True) -> None:
        """Keep *raws* for later copies, as long as the pool stays within *room* bytes;
        *served*: they come back from a written step (the warm-up is over)."""
        self.served = self.served or served
        for raw in raws:
            if self.nbytes + raw.nbytes > room:
                break
            self.free.setdefault(raw.nbytes, []).append(raw)
            self.nbytes += raw.nbytes
        raws.clear()

    def trim(self, room: int) -> None:
        """Let go of buffers, the largest first, until the pool holds at most *room* bytes
        (the budget less what is in flight: buffers kept for copies of one size do not stay
        beside copies of other sizes past the budget)."""
        for n in sorted(self.free, reverse=True):
            got = self.free[n]
            while got and self.nbytes > room:
                got.pop()
                self.nbytes -= n
            if not got:
                del self.free[n]
            if self.nbytes <= room:
                return

    def clear(self) -> None:
        self.free.clear()
        self.nbytes = 0
        self.regions = Regions()


def touched(sizes: list[int]) -> list[np.ndarray]:
    """New uint8 buffers of *sizes* bytes with every page touched: the page faults paid here
    (the worker, while the program computes), not by the copies of the program's puts."""
    out = []
    for raw, populated in Regions().make(sizes):
        if not populated:
            raw[::PAGE] = 0
        out.append(raw)
    return out


class Frozen:
    """Arrays kept by reference (``copy=False``): read-only until the last step holding them is done.

    An array in several steps in flight thaws with the last of them, and
    only if it was writeable when first kept.  Not locked: the layer calls
    it under its condition.
    """

    def __init__(self) -> None:
        self.entries: dict[int, list] = {}  # id(array) -> [array, holders, was writeable]
        #: views done with whose base another step in flight holds: numpy keeps a view of a
        #: read-only base read-only, so they thaw with the base
        self.pending: list[np.ndarray] = []

    def freeze(self, step: Step, arr: np.ndarray) -> None:
        entry = self.entries.get(id(arr))
        if entry is None:
            entry = self.entries[id(arr)] = [arr, 0, bool(arr.flags.writeable)]
            if entry[2]:
                arr.flags.writeable = False
        entry[1] += 1
        step.frozen.append(arr)

    def thaw(self, step: Step) -> None:
        """*step* is done: its arrays thaw (those no other step holds); its copies and calls go."""
        thawed = []
        for arr in step.frozen:
            entry = self.entries.get(id(arr))
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] == 0:
                del self.entries[id(arr)]
                if entry[2]:
                    thawed.append(arr)
        if thawed or self.pending:
            # (a view after its base, whatever the order they came in)
            refused = make_writeable(thawed + self.pending)
            self.pending = [a for a in refused if self._base_held(a)]
        step.frozen.clear()
        step.ops.clear()
        step.attrs.clear()
        step.nbytes = 0

    def _base_held(self, arr: np.ndarray) -> bool:
        """Whether an array a step in flight holds is a base of *arr* (else its base was made
        read-only by the program, and *arr* stays so, as numpy wants)."""
        b = arr.base
        while isinstance(b, np.ndarray):
            if id(b) in self.entries:
                return True
            b = b.base
        return False


def check_stats_layout(spec: DatasetSpec) -> None:
    """ConfigError, as the engines raise it, for statistics-only blocks of a dataset with a
    multiresolution layout (its statistics come from its data)."""
    if spec.layout is not None:
        raise ConfigError(
            f"dataset {spec.path!r} has a multiresolution layout: its statistics come from its data"
        )


def check_put(spec: DatasetSpec, box: Box, array: Any, stats: bool = False) -> np.ndarray:
    """The checks a put makes without the layer, at the same call: the array, of the box's shape.

    *stats*: those of a ``put_stats`` instead (statistics-only blocks): no
    multiresolution layout, the array of exactly the box's shape (a scalar is
    not broadcast), and no dtype check for an empty box, as the engines make them.
    """
    if not box.inside(spec.shape):
        box.check_inside(spec.shape, f"dataset {spec.path!r}")
    if stats:
        check_stats_layout(spec)
    arr = np.asarray(array)
    if arr.shape != box.shape:
        if stats:
            raise ShapeError(
                f"statistics of an array of shape {arr.shape} for box {box} (shape {box.shape}) "
                f"of dataset {spec.path!r}"
            )
        if arr.ndim == 0:
            arr = np.broadcast_to(arr, box.shape)
        else:
            raise ShapeError(
                f"cannot write an array of shape {arr.shape} to box {box} (shape {box.shape}) "
                f"of dataset {spec.path!r}"
            )
    if stats and box.empty:
        return arr
    check_dtype(spec, arr.dtype, f"statistics of box {box}" if stats else None)
    return arr


__all__ = [
    "BackgroundError",
    "DEFAULT_INFLIGHT_BYTES",
    "Frozen",
    "IOStats",
    "Pool",
    "Regions",
    "Step",
    "check_put",
    "check_stats_layout",
    "new_buffer",
    "same_report",
    "touched",
]
