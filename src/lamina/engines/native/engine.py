"""Engine ``native``: block-indexed directory format with two-phase aggregation.

Ranks are split into ``aggregators`` contiguous groups; the first rank of
each group owns one subfile per writer session.  An aggregator writes its
own blocks at ``put`` time (while its worker thread computes statistics and
checksums); member ranks keep theirs (a copy, or the caller's buffer with
``copy=False``) and send them to their aggregator at ``end_step``, which
receives the next piece while writing the current one.  ``aggregators=1``
is one subfile; ``aggregators=size`` is file-per-process.

Rank 0 alone touches the metadata files (``format.py`` describes them); it
reads new records and broadcasts them, so every rank sees the same steps.
"""

from __future__ import annotations

import errno
import fcntl
import numbers
import os
import resource
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from ... import buffers
from ... import comm as comm_mod
from ... import stats as stats_mod
from ...catalog import (
    CODEC_RAW,
    KIND_CLOSE,
    KIND_STEP,
    BlockCodec,
    BlockTable,
    Checkpoint,
    Decoder,
    Encoder,
    Record,
    StepBlocks,
    subfile_name,
)
from ...catalog.tree import paused_gc
from ...derived import _parallel
from ...errors import (
    ChecksumError,
    CollectiveMismatchError,
    ConfigError,
    FormatError,
    LaminaError,
    NotALaminaFileError,
    mark_collective,
    warn_caller,
)
from ...geometry import Box, box_of, rows_all, split_range
from ...workflow import routes
from ..base import durable_flag, under
from ..block import BlockEngine, StepHeads, wait_for
from ..placement import SCATTER_ELEMENTS, GridPlan, grid_plan_for, grid_view
from ..staging import Chunk
from . import descriptors
from . import format as fmt
from .lock import LOCK_NAME, WriterLock

MSG_CHUNK = 1 << 25  # 32 MiB pieces: pipelined, and far below MPI's 2 GiB count limit
#: a member rank waits for its aggregator without polling when the aggregator writes this much
QUIET_MOVE = 1 << 20
#: whole raw blocks up to this size that lie back to back in a subfile are read together ...
COALESCE_BLOCK = 1 << 22
#: ... in reads of up to this many bytes
COALESCE_RUN = 1 << 24
#: a run is read, checked and put in place this many bytes at a time (whole blocks), each piece
#: while it is in the cache: 16 MiB of 32^3 blocks through one buffer took 5.3 ms, in pieces 2.9
READ_PIECE = 1 << 20
#: ... but a piece of a grid holds a whole row of cells along its last axis where the row
#: holds at most this many bytes: the blocks then fill whole rows of the output (64 blocks of
#: 64^3 float64 in a 256^3 output: 150-270 us a block placed four at a time, 400-560 one
#: at a time; a read of all of them 323-359 against 459-499 us a block at the least)
ROW_PIECE = 1 << 23
#: most bytes of read buffers an engine keeps between reads (a buffer a reading thread):
#: four of a row piece
RUN_BUFFERS_KEPT = 4 * (ROW_PIECE + buffers.PAGE)
#: runs of at least this many bytes are read by a few threads (a thread's start costs ~0.1 ms)
PARALLEL_READ_MIN = 1 << 22
PREALLOCATE_MIN = 1 << 20

#: reads planned that are kept (:meth:`NativeEngine._read_blocks`), one per box and output
#: geometry: a reader of a few regions step after step finds each one's plan
READ_PLANS = 4
#: reads of more blocks than this are planned each time (planning costs a few percent of
#: them) and not kept (a plan and its key take about 250 bytes a block)
PLANNED_MAX = 4096


def _slabs(extent: Sequence[int], block_bytes: int, limit: int) -> Iterator[tuple[int, int, tuple]]:
    """A grid of blocks in C order of their cells, cut in boxes of cells of at most *limit*
    bytes (one cell at least): ``(first block, end block, index of the box in the grid)``.

    The boxes are slabs: whole rows of cells along the last axes, as many
    of them along the axis before as fit.
    """
    nd = len(extent)
    j, per = nd, 1  # cells in one slab: the whole extent of axes j and after
    while j > 0 and per * extent[j - 1] * block_bytes <= limit:
        j -= 1
        per *= extent[j]
    if j == 0:
        yield 0, per, ()
        return
    along = int(extent[j - 1])
    m = max(1, limit // (per * block_bytes))  # slabs side by side along axis j - 1
    for k, pre in enumerate(np.ndindex(*(int(v) for v in extent[: j - 1]))):
        for a in range(0, along, m):
            b = min(a + m, along)
            yield (k * along + a) * per, (k * along + b) * per, (*pre, slice(a, b))


def _cuts(ends: np.ndarray, limit: int) -> Iterator[tuple[int, int]]:
    """Ranges ``[a, b)`` of pieces (pieces of bytes ending at *ends*, cumulative) of at most
    *limit* bytes together, each at least one piece."""
    a, n = 0, len(ends)
    while a < n:
        done = int(ends[a - 1]) if a else 0
        b = max(a + 1, int(np.searchsorted(ends, done + limit, "right")))
        yield a, b
        a = b


def _pwrite_all(fd: int, buf, offset: int) -> None:
    mv = memoryview(buf).cast("B")
    if len(mv) >= PREALLOCATE_MIN:
        # reserve the extent first (as numpy's tofile does): one allocation instead of
        # one per page written; filesystems without it just write
        try:
            os.posix_fallocate(fd, offset, len(mv))
        except OSError:
            pass
    done = 0
    while done < len(mv):
        n = os.pwrite(fd, mv[done:], offset + done)
        if n <= 0:
            raise OSError(f"short write at offset {offset + done}")
        done += n


def _pwrite_pair(fd: int, first, second, offset: int) -> None:
    """*first* then *second* from *offset* of *fd*: one ``pwritev`` where the system has it
    and it writes both whole (a record's block area and its frame: a call less a commit)."""
    if first and len(first) + len(second) < PREALLOCATE_MIN and hasattr(os, "pwritev"):
        if os.pwritev(fd, [first, second], offset) == len(first) + len(second):
            return
    if first:  # (or the rest of a short pwritev: written again whole, at the same offsets)
        _pwrite_all(fd, first, offset)
    _pwrite_all(fd, second, offset + len(first))


class _Lazy:
    """What a read names in its error messages (``path/subfile: dataset 'd' ...``), formatted
    by *make* only when a message is made: a read of a small block is a few microseconds,
    and formatting its box took as long as a tenth of it."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], str]) -> None:
        self.make = make

    def __str__(self) -> str:
        return self.make()


class _AreaLoader:
    """Reads bytes of one step's block area from lamina.meta, for the step's
    :class:`~lamina.catalog.StepBlocks`: one small object a step of a file of many steps, where
    a closure took four (a function and three cells, about 230 bytes a step, each tracked by
    the cycle collector)."""

    __slots__ = ("eng", "base", "what")

    def __init__(self, eng: NativeEngine, base: int, what: str) -> None:
        self.eng, self.base, self.what = eng, base, what

    def __call__(self, off: int, n: int) -> memoryview:
        # read into memory nobody cleared, handed over read-only: no second copy
        at = self.base + off
        buf = buffers.empty(n, at)
        with self.eng._in_use:
            try:
                _pread_into(self.eng._meta_reader(), buf.data, at, self.what)
            except FormatError:
                self.eng._check_identity()  # a file re-created under this reader says so
                raise
        buf.flags.writeable = False
        return buf.data


#: a method that reads with the file's descriptors: a close in another thread waits for it
#: (:class:`.descriptors.InUse`)
_reading = under("_in_use")


def aggregators_option(value, size: int) -> int:
    """The subfiles of a write session that ``lamina.open(..., aggregators=value)`` asks for
    on *size* ranks (None: one per rank): TypeError for anything but an integer (a float,
    a bool or a string such as ``"all"`` is no count), ValueError outside 1..*size*."""
    if value is None:
        return size
    if not isinstance(value, numbers.Integral) or isinstance(value, bool | np.bool_):
        raise TypeError(
            f"lamina.open(): aggregators must be an int from 1 to the number of ranks ({size}), "
            f"got {value!r}"
        )
    n = int(value)
    if not 1 <= n <= size:
        raise ValueError(f"aggregators must be between 1 and the number of ranks ({size}), got {n}")
    return n


def _of_step(rec: Record, what: str) -> str:
    """*what* names a record by its number; a step record's blocks are named by the step too
    (numbers of records and steps part at the first record that is not a step's)."""
    return f"{what} (step {rec.step})" if rec.kind == KIND_STEP else what


def _verify(rec, seg: int, k: int, got: int, what: str | _Lazy) -> None:
    """ChecksumError unless *got* is the checksum of segment *k* (of *seg* bytes) of block *rec*."""
    if k < len(rec.crcs) and got == rec.crcs[k]:
        return
    raise ChecksumError(
        f"checksum mismatch in {what}, segment {k} (bytes {rec.offset + k * seg}.."
        f"{rec.offset + min(rec.length, (k + 1) * seg)}): the data is corrupt"
    )


def _pread_into(fd: int, mv: memoryview, offset: int, what: str | _Lazy, after: int = 0) -> None:
    """*mv* filled from byte *offset* of *fd*; FormatError where the file ends first, naming
    the bytes missing (and *after* more the caller reads next)."""
    done = 0
    while done < len(mv):
        n = os.preadv(fd, [mv[done:]], offset + done)
        if n <= 0:
            # the file's size, not where the read stood: a forged offset past the end was
            # said to be where the file ends
            size = os.fstat(fd).st_size
            more = f"{len(mv) - done + after} more bytes"
            raise FormatError(
                f"{what}: file ends at byte {size}, expected {more}"
                if size == offset + done
                else f"{what}: file ends at byte {size}, before byte {offset + done}, where "
                f"{more} were expected"
            )
        done += n


def _pieces(views: list[memoryview], size: int):
    """The bytes of *views* one after the other, cut in pieces of *size* (the last shorter).

    A piece inside one view is that view's slice; only pieces that span
    views are copied together.
    """
    parts: list[memoryview] = []
    have = 0
    for v in views:
        pos, n = 0, len(v)
        while pos < n:
            if not parts and n - pos >= size:
                yield v[pos : pos + size]
                pos += size
                continue
            take = min(size - have, n - pos)
            parts.append(v[pos : pos + take])
            have += take
            pos += take
            if have == size:
                yield b"".join(parts)
                parts, have = [], 0
    if parts:
        yield parts[0] if len(parts) == 1 else b"".join(parts)


class _Sole(NamedTuple):
    """What :meth:`NativeEngine._read_verified` needs of a block (a :class:`BlockRecord` has it
    too): where it lies, its length, its checksum segment and its checksums."""

    offset: int
    length: int
    seg: int
    crcs: tuple[int, ...]


class _Run(NamedTuple):
    """One run of a read planned (:meth:`NativeEngine._plan_run`): its pieces' sizes, its bytes,
    how to read piece k through a buffer and put it in place, and the check once all are read."""

    sizes: list[int]
    total: int
    place: Callable[[np.ndarray, int], None]
    check: Callable[[], None]


class _RunPlan(NamedTuple):
    """How a run of a read is read (:meth:`NativeEngine._lay_out_run`), apart from the step
    it is read from and the array it fills (:meth:`NativeEngine._bind_run` adds them)."""

    ks: np.ndarray  # positions (in the read's blocks) of the run's blocks, in subfile order
    lengths: np.ndarray
    ends: np.ndarray  # each block's end in the run (the cumulative lengths)
    pieces: list[tuple[int, int, Any]]  # (first block, end block, slab of the grid or None)
    sizes: list[int]  # each piece's bytes
    grid: GridPlan | None  # blocks of one shape tiling a box of the output
    within: np.ndarray | None  # the scatter: each element's index in a block at 0
    at: np.ndarray | None  # and each block's first element in the output
    corner: np.ndarray  # each block's part in the output: [corner, hi)
    hi: np.ndarray
    one_crc: bool  # checked with one CRC over the run


class _ReadPlan(NamedTuple):
    """How a read of many blocks is read (:meth:`NativeEngine._lay_out`): its runs, and
    the positions of the blocks read one by one (None: none)."""

    single: np.ndarray | None
    runs: list[_RunPlan]


#: reads planned (:meth:`NativeEngine._read_blocks`): (box, output geometry, tuning) ->
#: (the blocks' layout key, plan).  Kept for the process, not for an engine: a plan names no
#: file, and a program that reads file after file of one decomposition plans once
_plans: dict[tuple, tuple[tuple, _ReadPlan]] = {}
_plans_lock = threading.Lock()


def _place_piece(buf: np.ndarray, item: tuple[_Run, int]) -> None:
    item[0].place(buf, item[1])


def _runs(key: np.ndarray, off: np.ndarray, ln: np.ndarray) -> Iterator[tuple[int, int]]:
    """Index ranges ``[a, b)`` of blocks (sorted by subfile *key*, then offset *off*; lengths
    *ln*) that lie back to back in one subfile, each at most :data:`COALESCE_RUN` bytes (at
    least one block): what one pread reads."""
    # a run goes on while the next block starts where this one ends, in the same subfile
    brk = np.ones(len(key), dtype=bool)
    brk[1:] = (key[1:] != key[:-1]) | (off[1:] != off[:-1] + ln[:-1])
    bounds = np.flatnonzero(brk).tolist() + [len(key)]
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        for i, j in _cuts(np.cumsum(ln[a:b]), COALESCE_RUN):
            yield a + i, a + j


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _is_lamina_name(name: str) -> bool:
    """True for the names lamina writes in its directory (nothing else there is lamina's)."""
    return (
        name in (fmt.META_NAME, fmt.COMMIT_NAME, LOCK_NAME)
        or fmt.DATA_NAME.fullmatch(name) is not None
        or name.startswith(LOCK_NAME + ".")  # a lock being made or taken over (native/lock.py)
    )


def _foreign(path: str) -> str | None:
    """A name in directory *path* that lamina did not write, or None."""
    return next((n for n in sorted(os.listdir(path)) if not _is_lamina_name(n)), None)


#: a directory held open (a reader's: what it reads is found in it, wherever it is moved)
_DIR_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC


def _open_in(directory: str, name: str, flags: int, mode: int = 0o644, *, dir_fd: int = -1) -> int:
    """``os.open`` of *name* inside a lamina directory, never through a symbolic link, and
    only of a regular file: FormatError for a directory, a named pipe (whose open would wait
    for a writer to come) or a device of that name; with *dir_fd*, in that directory held
    open (*directory* names it in messages)."""
    where = os.path.join(directory, name) if dir_fd < 0 else name
    try:
        fd = os.open(
            where,
            flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
            mode,
            dir_fd=None if dir_fd < 0 else dir_fd,
        )
    except OSError as e:
        link = fmt.link_refused(e, directory, name)
        if link is not None:
            raise link from None
        if e.errno == errno.EISDIR:  # (a file of lamina's name that lamina did not make)
            raise _not_a_file(directory, name, "a directory") from None
        raise
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            what = (
                "a directory"
                if stat.S_ISDIR(kind)
                else "a named pipe"
                if stat.S_ISFIFO(kind)
                else "not a regular file"
            )
            raise _not_a_file(directory, name, what)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_a_file(directory: str, name: str, what: str) -> FormatError:
    """The error of a name lamina keeps a file under that holds something else (*what*)."""
    return FormatError(f"{directory}: {name} is {what} where lamina keeps a file of that name")


#: the signature an HDF5 file starts with, at offset 0 or after a user block of 512, 1024,
#: 2048, ... bytes
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


#: the native files open for reading in this process (:func:`read_here`)
_READERS: weakref.WeakSet[NativeEngine] = weakref.WeakSet()


def read_here(path) -> bool:
    """Whether this process has the file at *path* open for reading (``lamina.open`` in mode
    'r', an ``xr.open_dataset`` not closed)."""
    key = os.path.realpath(path)
    return any(not e.closed and os.path.realpath(e.path) == key for e in list(_READERS))


def is_hdf5_file(path: str) -> bool:
    """Whether *path* is a regular file holding HDF5's signature where HDF5 looks for it (what
    ``h5py.is_hdf5`` looks at, without importing h5py)."""
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            at = 0
            while at + len(HDF5_SIGNATURE) <= size:
                fh.seek(at)
                if fh.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE:
                    return True
                at = 512 if at == 0 else 2 * at
    except OSError:
        pass
    return False


def _log_begun(commit: str) -> bool:
    """Whether commit log *commit* is there with its header: a log shorter than its header
    holds no commit (its writer is creating the file, between making the log and writing
    its header, or was killed there); anything but a regular file is looked at, and
    refused, as a log."""
    st = _stat_or_none(commit, False)
    return st is not None and (
        not stat.S_ISREG(st.st_mode) or st.st_size >= min(fmt.HEADER_SIZES.values())
    )


def _stat_or_none(path: str, follow: bool = True) -> os.stat_result | None:
    """``os.stat`` of *path* (``os.lstat`` without *follow*), None where nothing is there; a
    directory on the way that may not be searched raises PermissionError naming *path*
    (``os.path.exists`` and ``lexists`` take it for "nothing there")."""
    try:
        return os.stat(path, follow_symlinks=follow)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _read_all(directory: str, name: str) -> tuple[bytes, os.stat_result]:
    fd = _open_in(directory, name, os.O_RDONLY)
    try:
        return _read_fd(fd), os.fstat(fd)
    finally:
        os.close(fd)


def _same_inode(dir_fd: int, name: str, inode: tuple[int, int]) -> bool:
    """Whether *name* in the directory held open as *dir_fd* is still the file of *inode*
    (device, inode number)."""
    try:
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == inode


def _read_fd(fd: int, at: int = 0) -> bytes:
    """Every byte of the file open as *fd*, from offset *at* (its start)."""
    chunks = []
    while chunk := os.pread(fd, 1 << 20, at):
        chunks.append(chunk)
        at += len(chunk)
    return b"".join(chunks)


def written_since(path: str, mode: str, wait: float) -> float | None:
    """When a file *path* opened in *mode* must have been written since: the job's start, or None.

    A reader that waits for a file (``wait=``) under a workflow
    (``$LAMINA_WORKFLOW``, or none in a launch of two programs, where each
    reads what the other writes) names a file a task of the workflow writes
    for its own task to read: it wants the one this run writes, not one an
    earlier run left under that name, which the writer re-creates under it
    when it opens it.  None (any file will do) for writers, readers that do
    not wait, names the workflow does not route to this task, one program
    alone, or where the job's start is unknown (the file opened on a
    communicator of the program's own before any other lamina.open:
    :func:`lamina.comm.job_start`).
    """
    start = comm_mod.job_start()
    if mode != "r" or not wait or start is None:
        return None
    try:
        wf = routes.from_env()
    except ValueError:  # a malformed workflow: the transport choice reports it where it matters
        return None
    if wf is None:  # (task_count is known once job_start is: no message)
        return start if comm_mod.task_count() == 2 else None
    route = wf.route(routes.normname(path))
    if route is None or comm_mod.appnum() not in route.consumers:
        return None
    return start


def _written_after(path: str, since: float) -> bool:
    """Rank 0 of a reader: whether the lamina file *path* holds a record committed at or after
    *since* (seconds since the epoch).  A file being re-created under the reader (a log
    without its header, the two logs of different files, a log gone) is not there yet."""
    try:
        cbuf, _ = _read_all(path, fmt.COMMIT_NAME)
        mfd = _open_in(path, fmt.META_NAME, os.O_RDONLY)
        try:
            meta_size = os.fstat(mfd).st_size
            entries, _end, head = fmt.parse_commits(cbuf, meta_size, fmt.COMMIT_NAME)
            if not entries:
                return False
            mhead = fmt.check_header(
                os.pread(mfd, fmt.HEADER_SIZE, 0), fmt.META_MAGIC, fmt.META_NAME
            )
            if (mhead.version, mhead.identity) != (head.version, head.identity):
                return False
            last = entries[-1]
            payload = fmt.parse_frame(os.pread(mfd, last.length, last.offset), last)
        finally:
            os.close(mfd)
        return record_time(payload) >= since
    except PermissionError:  # (not a file being made: waiting would not let this user in)
        raise
    except (OSError, LaminaError, ValueError):
        return False


def record_time(payload: bytes) -> float:
    """The commit time of a record payload (its head: kind, step, session, nranks, time)."""
    return Record.read_head(Decoder(payload, "metadata record"))[4]


class NativeEngine(BlockEngine):
    """Engine ``native`` (see module docstring).

    Options
    -------
    aggregators : int
        Number of subfiles written per session (1..ranks); default: one per rank.
    durable : bool
        fsync data, then metadata, then the commit entry at every commit (default True).
    """

    name = "native"
    OPTIONS = BlockEngine.OPTIONS | {"aggregators", "durable"}

    # reads that a close in another thread waits for, whole (descriptors.InUse)
    get = _reading(BlockEngine.get)
    get_collective = _reading(BlockEngine.get_collective)
    get_level = _reading(BlockEngine.get_level)
    payload = _reading(BlockEngine.payload)

    # ------------------------------------------------------------ open
    def validate_open(self, mode: str, options: dict, size: int) -> None:
        super().validate_open(mode, options, size)
        aggregators_option(options.get("aggregators"), size)

    def _open_storage(self, path: str, mode: str) -> None:
        self.durable = durable_flag(self.options.get("durable", True), "lamina.open()")
        naggs = aggregators_option(self.options.get("aggregators"), self.size)
        self.naggs = naggs
        self.agg_of = [0] * self.size
        self.agg_rank = []
        for a in range(naggs):
            lo, hi = split_range(self.size, naggs, a)
            self.agg_rank.append(lo)
            for r in range(lo, hi):
                self.agg_of[r] = a
        self.is_agg = self.agg_rank[self.agg_of[self.rank]] == self.rank
        # the subfiles reads open read-only, the most recently read kept open for every
        # thread (descriptors.py: a file may have more subfiles than a process may open)
        self._subfiles = descriptors.Subfiles(descriptors.subfiles_kept())
        # the reads under way, that a close from another thread waits for (descriptors.py)
        self._in_use = descriptors.InUse(path)
        # what else reads open read-only, by name (lamina.meta): one descriptor each, every
        # thread's (_meta_reader)
        self._rfds: dict[str, int] = {}
        # the buffers of the pieces of runs read (_read_run), one per reading thread, used
        # again: a piece into fresh memory pays a page fault per 4 KiB; a thread takes one
        # (list.pop and append are atomic: a thread that finds none makes its own) and gives
        # it back once the run's blocks are in place
        self._run_bufs: list[np.ndarray] = []
        self._sizes: dict[str, int] = {}
        self._meta_fd = self._commit_fd = self._data_fd = -1
        self._lock: WriterLock | None = None
        self._identity: int | None = None  # the file's, once read (0: a version 1 file has none)
        self._commit_inode: tuple[int, int] | None = None  # (device, inode) of the commit log read
        self._held_fd = -1  # that commit log, open while this engine is
        self._nentries = 0
        self._commit_head = fmt.HEADER_SIZE  # the commit log's header size (read at open)
        self._last_entry: fmt.CommitEntry | None = None  # the last commit entry seen (or written)
        self._meta_end = self._commit_end = fmt.HEADER_SIZE
        self._warned = -1  # the last record a reader warned it had to leave out
        # committed records the last read of the logs left out (records_left_out)
        self._left_out = 0
        self._version = (
            fmt.VERSION
        )  # the file's format version (an older file is appended in its own)
        # the file's directory, held open: what is read is opened in it, so that a file moved
        # (renamed) while open reads on as an open h5py file does, and one deleted says so
        self._dir_fd = -1
        # a writer alone: the head of the record it wrote last and that record as a reader
        # decodes it (None for formats 1 and 2, or ranks > 1), applied without decoding it
        self._written: tuple[bytes, Record | None] | None = None

        # under a workflow, a reader waiting for a name a task of it writes takes no file left
        # by an earlier run (rank 0's view is the one that counts)
        self._since = written_since(path, mode, self.wait)
        g = comm_mod.Guard()
        with g:
            if self.rank == 0:
                self._prepare_dir(path, mode)
        comm_mod.agree(self.comm, g.error)
        g = comm_mod.Guard()
        with g:
            self._dir_fd = os.open(path, _DIR_FLAGS)
        comm_mod.agree(self.comm, g.error)
        self._load_new()
        if mode == "r":
            _READERS.add(self)
        else:
            self.session = self.catalog.last_session + 1
            g = comm_mod.Guard()
            with g:
                if self.session > 0xFFFFFFFF:  # (records hold sessions as 32 bits)
                    raise FormatError(
                        f"{path!r}: the last writer's session is {self.session - 1}, the "
                        "largest a record holds: the file takes no further writer"
                    )
                if self.is_agg:
                    name = subfile_name(self.session, self.agg_of[self.rank])
                    self._data_fd = _open_in(path, name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                self._data_end = 0
            comm_mod.agree(self.comm, g.error)
            if self.durable and self.rank == 0:
                # the new subfiles' directory entries must survive before a commit names them
                _fsync_dir(path)

    def _prepare_dir(self, path: str, mode: str) -> None:
        """Rank 0: check the directory for *mode*; writers take the lock, then create or truncate."""
        if mode == "r":
            # (a directory on the way this user may not search is a PermissionError naming
            # it, not a file "missing": os.path.exists says False for both)
            st = _stat_or_none(path)
            commit = os.path.join(path, fmt.COMMIT_NAME)
            since = self._since
            if since is not None and self.wait:  # the file this run's writer makes, not an old one
                wait_for(
                    path,
                    self.wait,
                    lambda: _written_after(path, since),
                    lambda s: (
                        FileNotFoundError if _stat_or_none(path) is None else NotALaminaFileError
                    )(
                        f"no lamina file {path!r} written in this run after waiting {s:g} s for "
                        "its writer (a task of the workflow) to commit to it"
                        + ("; the one there is an earlier run's" if _stat_or_none(path) else "")
                    ),
                )
                return
            if self.wait and not _log_begun(commit):  # not created yet, maybe
                wait_for(
                    path,
                    self.wait,
                    lambda: _log_begun(commit),
                    lambda s: (
                        FileNotFoundError if _stat_or_none(path) is None else NotALaminaFileError
                    )(f"no lamina file {path!r} after waiting {s:g} s for its writer to create it"),
                )
                return
            if st is None:
                raise FileNotFoundError(f"no such lamina file: {path!r}")
            if is_hdf5_file(path):
                raise NotALaminaFileError(
                    f"{path!r} is an HDF5 file, not a lamina file; convert it with "
                    f"'lamina convert {path} OUT.lam' (lamina.hdf5.convert), or read it with h5py"
                )
            if not stat.S_ISDIR(st.st_mode) or _stat_or_none(commit, False) is None:
                raise NotALaminaFileError(
                    f"{path!r} is not a lamina file (no {fmt.COMMIT_NAME} inside)"
                )
            return
        exists = os.path.exists(path)
        if exists and not os.path.isdir(path):
            raise NotALaminaFileError(
                f"cannot create lamina file {path!r}: a file of that name exists"
            )
        if not exists:
            os.makedirs(path, exist_ok=True)
            if self.durable:
                _fsync_dir(os.path.dirname(os.path.abspath(path)))
        self._check_foreign(path)  # before the lock file: leave a stranger's directory as it was
        self._lock = WriterLock(path)
        self._lock.acquire()  # before anything changes: one writing job at a time
        commit = os.path.join(path, fmt.COMMIT_NAME)
        committed = _log_begun(commit)
        if mode == "a" and not committed:
            self._check_never_committed(path)
        if mode == "w" or not committed:
            # a new file; or 'a' where nothing was ever committed (a writer killed while creating it)
            self._check_foreign(path)
            self._create(path)
        self._meta_fd = _open_in(path, fmt.META_NAME, os.O_RDWR)
        self._commit_fd = _open_in(path, fmt.COMMIT_NAME, os.O_RDWR)

    @staticmethod
    def _check_never_committed(path: str) -> None:
        """FormatError unless the file at *path*, whose commit log is missing or shorter than
        its header, is one a writer was killed while creating (:meth:`_create` writes
        ``lamina.meta``'s header before it makes the log, and removes the subfiles before
        ``lamina.meta``): then ``lamina.meta`` is missing or no more than its header, and no
        subfile holds a byte without it.  Anything else is a damaged file, whose records
        mode 'a' would have removed with the file."""
        commit = os.path.join(path, fmt.COMMIT_NAME)
        meta = os.path.join(path, fmt.META_NAME)
        meta_size = os.lstat(meta).st_size if os.path.lexists(meta) else None
        held = []
        for name in os.listdir(path):
            full = os.path.join(path, name)
            if name in (fmt.META_NAME, fmt.COMMIT_NAME) or name.startswith(LOCK_NAME):
                continue
            if _is_lamina_name(name) and os.path.isfile(full) and os.path.getsize(full):
                held.append(name)
        if (meta_size or 0) <= max(fmt.HEADER_SIZES.values()) and (
            meta_size is not None or not held
        ):
            return
        log = (
            "is missing"
            if not os.path.lexists(commit)
            else f"is cut inside its header ({os.lstat(commit).st_size} bytes)"
        )
        holds = (
            f"{fmt.META_NAME} holds {meta_size} bytes of records"
            if meta_size is not None
            else f"{fmt.META_NAME} is missing and {', '.join(sorted(held)[:3])} "
            + ("holds data" if len(held) == 1 else "hold data")
        )
        raise FormatError(
            f"cannot append to lamina file {path!r}: its {fmt.COMMIT_NAME} {log} while {holds}: "
            "a damaged file (or one whose re-creation in mode 'w' was cut short), not one a "
            "writer was killed creating; nothing was changed. Restore the commit log to read "
            "it, or open it with mode 'w' to start it again"
        )

    @staticmethod
    def _check_foreign(path: str) -> None:
        """Refuse a directory that is not a lamina file and holds something lamina did not write."""
        if os.path.lexists(os.path.join(path, fmt.COMMIT_NAME)):
            return  # a lamina file: what else it holds is left alone
        foreign = _foreign(path)
        if foreign is not None:
            raise NotALaminaFileError(
                f"cannot create lamina file {path!r}: the directory is not a lamina file and holds "
                f"{foreign!r}, which lamina did not write (lamina removes only its own files)"
            )

    def _create(self, path: str) -> None:
        """Rank 0, holding the lock: remove what lamina wrote here before, start empty logs.

        The commit log goes first: a reader of the old file then finds it gone or another
        (re-created, said so) rather than the old log beside missing data or a new
        ``lamina.meta`` (reported as a corrupt or cut-short file)."""
        names = sorted(os.listdir(path), key=lambda n: (n != fmt.COMMIT_NAME, n))
        for name in names:  # a read-only file is refused, as h5py's 'w' does, before any goes
            full = os.path.join(path, name)
            if (
                _is_lamina_name(name)
                and not name.startswith(LOCK_NAME)
                and stat.S_ISREG(os.lstat(full).st_mode)
                and not os.access(full, os.W_OK)
            ):
                raise PermissionError(
                    errno.EACCES,
                    f"cannot truncate lamina file {path!r}: {name} is read-only",
                    full,
                )
        for name in names:
            if name.startswith(LOCK_NAME) or not _is_lamina_name(name):
                continue  # only what lamina wrote goes; a link goes as a link
            full = os.path.join(path, name)
            if os.path.isdir(full) and not os.path.islink(full):
                raise NotALaminaFileError(
                    f"cannot truncate lamina file {path!r}: {name} is a directory"
                )
            os.unlink(full)
        identity = fmt.new_identity()
        for name, magic in ((fmt.META_NAME, fmt.META_MAGIC), (fmt.COMMIT_NAME, fmt.COMMIT_MAGIC)):
            fd = _open_in(path, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            try:
                _pwrite_all(fd, fmt.header(magic, identity), 0)
                if self.durable:
                    os.fsync(fd)
            except OSError as e:  # (a full disk: say which file, as open does)
                raise OSError(
                    e.errno,
                    f"{e.strerror} (writing the header of {name})",
                    os.path.join(path, name),
                ) from None
            finally:
                os.close(fd)
        if self.durable:
            _fsync_dir(path)

    # ------------------------------------------------------ metadata I/O
    def _read_new_records(self) -> tuple[list[bytes], list[fmt.CommitEntry], int, int]:
        """Rank 0: payloads of records committed since the last call (validated), their
        commit entries, the header size of the logs, and how many records committed since
        were left out (past the end of lamina.meta, or a damaged last one: a reader's)."""
        where = f"{self.path}/{fmt.COMMIT_NAME}"
        held = -1
        try:
            if self._identity is None:
                # the first read: the commit log read through the descriptor kept open while
                # this engine is, so that its inode stays this file's (a log re-created after
                # a close and a new open could get the inode number back, ext4 reuses them)
                held = _open_in(self.path, fmt.COMMIT_NAME, os.O_RDONLY, dir_fd=self._dir_fd)
                cbuf, cstat = _read_fd(held), os.fstat(held)
            else:
                # what is new only: the header (its identity checked below) and the entries
                # after those read before (the whole log read and checked again made each
                # refresh of a file of n steps cost O(n): following it, O(n^2))
                fd = _open_in(self.path, fmt.COMMIT_NAME, os.O_RDONLY, dir_fd=self._dir_fd)
                try:
                    cstat = os.fstat(fd)
                    cbuf = os.pread(fd, self._commit_head, 0)
                    last = self._last_entry
                    if last is not None:
                        # the last entry seen, still there: a log cut under the reader and
                        # grown again by another writer is not read on as if it were
                        seen = os.pread(fd, fmt.ENTRY_SIZE, self._commit_end - fmt.ENTRY_SIZE)
                        if seen != fmt.entry(last.seq, last.offset, last.length, last.payload_crc):
                            raise FormatError(
                                f"{self.path}: commit entry {last.seq}, seen before, is gone or "
                                "changed: the file was truncated or re-created while open"
                            )
                    cbuf += _read_fd(fd, self._commit_end)
                finally:
                    os.close(fd)
            mfd = _open_in(self.path, fmt.META_NAME, os.O_RDONLY, dir_fd=self._dir_fd)
        except FileNotFoundError as e:
            if held >= 0:
                os.close(held)
            if self._identity is not None:  # deleted, or a writer re-creating it removed its logs
                raise FormatError(self._gone()) from None
            raise NotALaminaFileError(
                f"{self.path!r} is not a lamina file: {e.filename} is missing"
            ) from e
        try:
            if self._identity is not None and (cstat.st_dev, cstat.st_ino) != self._commit_inode:
                # before the log is parsed against a lamina.meta that may be the new file's
                raise FormatError(self._gone())
            meta_size = os.fstat(mfd).st_size
            if self._identity is None:
                # the two logs of one file, checked before the commit log is parsed against
                # the other's size (a lamina.meta of a run re-creating the file meanwhile)
                head = fmt.check_header(cbuf, fmt.COMMIT_MAGIC, where)
                mhead = fmt.check_header(
                    os.pread(mfd, fmt.HEADER_SIZE, 0),
                    fmt.META_MAGIC,
                    f"{self.path}/{fmt.META_NAME}",
                )
                if (mhead.version, mhead.identity) != (head.version, head.identity):
                    inode = (cstat.st_dev, cstat.st_ino)
                    if not _same_inode(self._dir_fd, fmt.COMMIT_NAME, inode):
                        raise FormatError(
                            f"{self.path}: the file was re-created while being opened (another "
                            "writer opened it in mode 'w'); open it again"
                        )
                    if mhead.identity == head.identity and mhead.identity:
                        # one file's logs (its identity), one of them labelled another version
                        raise FormatError(
                            f"{self.path}: the format versions of {fmt.META_NAME} "
                            f"({mhead.version}) and {fmt.COMMIT_NAME} ({head.version}) disagree "
                            f"(identity {head.identity} in both): the file is damaged"
                        )
                    raise FormatError(
                        f"{self.path}: {fmt.META_NAME} and {fmt.COMMIT_NAME} belong to different files "
                        f"(versions {mhead.version}/{head.version}, identities {mhead.identity}/{head.identity})"
                    )
            first = self._identity is None
            if not first and cstat.st_size < self._commit_end:
                raise FormatError(
                    f"{self.path}: {(cstat.st_size - self._commit_head) // fmt.ENTRY_SIZE} committed "
                    f"records, {self._nentries} seen before: the file was truncated or re-created while open"
                )
            entries, _valid_end, head = fmt.parse_commits(
                cbuf,
                meta_size,
                where,
                last_past_end=self.mode == "r",
                after=(0, 0) if first else (self._nentries, self._meta_end),
            )
            if first:
                self._identity = head.identity
                self._version = head.version  # appended in its own version
                self._commit_inode = (cstat.st_dev, cstat.st_ino)
                self._commit_head = head.size
                self._held_fd, held = held, -1  # kept open: a re-created log gets another inode
            elif head.identity != self._identity:
                raise FormatError(self._gone())
            new = entries[self._nentries :] if first else entries
            committed = len(new)
            cut = next(
                (
                    k
                    for k, e in enumerate(new)
                    if e.offset >= meta_size
                    or (e.offset + e.length > meta_size and e is not entries[-1])
                ),
                len(new),
            )
            if cut < len(new):
                # records whose frames run past the end of lamina.meta, not the last alone
                # (only a reader gets them): the logs copied or cut at different moments,
                # lamina.meta first, in the middle of a frame or between two. A file cut
                # short: the records before open, a writer refuses (above)
                gone, new = new[cut:], new[:cut]
                if gone[0].seq != self._warned:
                    self._warned = gone[0].seq
                    warn_caller(
                        f"{where}: {len(gone)} committed record{'s' if len(gone) > 1 else ''} "
                        f"(record{'s' if len(gone) > 1 else ''} {gone[0].seq}"
                        + (f"..{gone[-1].seq}" if len(gone) > 1 else "")
                        + f") point{'' if len(gone) > 1 else 's'} past the end of "
                        f"{fmt.META_NAME} ({meta_size} bytes): the "
                        "logs were copied or cut at different moments (lamina.meta before "
                        "lamina.commit, as a copy of a file being written may be); the steps before "
                        "open, these records (steps, metadata changes or the writer's close) "
                        "are left out"
                    )
            out = []
            for ent in new:
                try:
                    out.append(
                        fmt.parse_frame(
                            # (no more than lamina.meta holds: a last entry may claim up to
                            # MAX_RECORD bytes past its end, and pread allocates what it asks)
                            os.pread(
                                mfd, min(ent.length, max(0, meta_size - ent.offset)), ent.offset
                            ),
                            ent,
                            f"{self.path}/{fmt.META_NAME}",
                        )
                    )
                except FormatError as err:
                    if ent is not entries[-1]:
                        raise
                    if self.mode != "r":
                        raise FormatError(
                            f"{err}: a writer does not append after a damaged record (readers "
                            "open the steps before it; copy them to a new file to go on)"
                        ) from None
                    # The last record damaged: what a power loss leaves when its commit
                    # entry reached the disk and its frame did not (durable=False). A reader
                    # opens the steps before it, as it does a file cut short; a writer
                    # refuses, so that nothing committed is dropped unseen.
                    new = new[:-1]
                    if ent.seq != self._warned:
                        self._warned = ent.seq
                        warn_caller(
                            f"{err}: the steps before it open, this last committed record (a "
                            "step, a metadata change or the writer's close) is left out"
                        )
        finally:
            os.close(mfd)
            if held >= 0:  # (the first read failed: nothing is kept)
                os.close(held)
        return out, new, head.size, committed - len(new)

    @_reading
    def _load_new(self, call: int = 0) -> int:
        """Collective: read records committed since the last call on rank 0, apply on all ranks
        (*call*: the collective call it is, named in its first agreement); the garbage
        collector paused meanwhile (:func:`~lamina.catalog.tree.paused_gc`).
        """
        with paused_gc():
            return self._load_records(call)

    def _load_records(self, call: int) -> int:
        """:meth:`_load_new`.

        All or nothing: if any record fails to decode or check on any rank,
        every rank restores its catalog and rank 0 keeps its reading position,
        so ranks never disagree on the steps they see.

        A record whose blocks lie beyond the end of their subfile (a copy
        cut short, a subfile truncated) ends what is read: the steps before
        it open, a warning says what was left out, and a writer ('a')
        continues after the intact prefix.

        Rank 0 broadcasts every record it read before it checks them: the other ranks
        decode them while it does (the open costs one decode, not two in turn), and then
        keep as many as rank 0 found intact.
        """
        g = comm_mod.Guard()
        blob = None
        state = None
        read: tuple[list[bytes], list[fmt.CommitEntry], int, int] | None = None
        left_out = 0  # records rank 0 left out as it read the logs (past lamina.meta's end)
        cp = self.catalog.checkpoint()
        with g:
            if self.rank == 0:
                read = self._read_new_records()
                if self.size > 1:
                    e = Encoder()
                    e.u32(self._version)
                    e.u64(read[3])
                    e.u32(len(read[0]))
                    for p in read[0]:
                        e.blob(p)
                    blob = e.getvalue()
        comm_mod.agree(self.comm, g.error, call=call)
        if self.size > 1:
            blob = comm_mod.bcast_bytes(self.comm, blob, root=0)
        g = comm_mod.Guard()
        intact = 0  # records rank 0 found whole (its flag in the agreement below)
        raws: list[bytes] = []
        # on the other ranks: records applied, and the error that stopped them
        applied, late = 0, None
        with g:
            if self.rank == 0:
                assert read is not None
                payloads, entries, header_size, left_out = read
                raws = payloads
                good = self._intact_prefix(payloads, entries, cp)
                intact = len(good)
                meta_end = entries[intact - 1].offset + entries[intact - 1].length if good else None
                state = (
                    self._nentries + intact,
                    meta_end if meta_end is not None else max(self._meta_end, header_size),
                    header_size + (self._nentries + intact) * fmt.ENTRY_SIZE,
                    entries[intact - 1] if good else self._last_entry,
                )
            else:
                assert blob is not None  # broadcast by rank 0
                d = Decoder(blob, "metadata broadcast")
                self._version = d.u32()
                left_out = d.u64()
                raws = [d.blob() for _ in range(d.count(8, name="records"))]
                d.expect_end()
                applied, late = self._apply_raws(raws)
        try:
            # every rank learns how many records rank 0 kept (the others pass 0)
            intact = comm_mod.agree(self.comm, g.error, flag=intact)
        except Exception:
            self.catalog.restore(cp)
            raise
        g = comm_mod.Guard()
        with g:
            if self.rank != 0 and (applied != intact or late is not None):
                if applied < intact:  # a record rank 0 kept failed here
                    assert late is not None
                    raise late
                # records past the intact prefix were applied here (or a part of one, that
                # then failed): as of before, then the prefix
                self.catalog.restore(cp)
                _, late = self._apply_raws(raws[:intact])
                if late is not None:
                    raise late
            if self.rank == 0 and self.mode != "r":
                # drop anything past the intact commits (a killed writer's torn tail, records whose data is gone)
                assert state is not None  # read on rank 0
                _n, meta_end, commit_end, _last = state
                # the commit log first (and durably): a writer killed between the two leaves
                # entries that point only into the metadata there is (the other order left
                # entries past its end, and every open then refused the file)
                os.ftruncate(self._commit_fd, commit_end)
                if self.durable:
                    os.fsync(self._commit_fd)
                os.ftruncate(self._meta_fd, meta_end)
        try:
            comm_mod.agree(self.comm, g.error)
        except Exception:
            self.catalog.restore(cp)
            raise
        if self.rank == 0:
            # only now that every rank applied the records: read on from after them
            assert state is not None
            self._nentries, self._meta_end, self._commit_end, self._last_entry = state
        self.catalog.release(cp)  # (a reader keeps no log of the records it took up)
        # the records left out are read again by the next call (a writer dropped its own)
        self._left_out = left_out + len(raws) - intact if self.mode == "r" else 0
        return len(self.catalog.steps)

    @property
    def format_version(self) -> int:
        """The file's format version (1 to 4), as its headers say; a new file's: the
        latest."""
        return self._version

    @_reading
    def unfinished_commit(self, pause: float = 0.1) -> str | None:
        """Independent: what the commit log holds after its last valid entry, where that is
        an entry whole in length that fails its checksum (said, naming it), else None.

        Opening a file takes such an entry for a commit cut short (its record left out, as a
        follower reading it while the writer writes it may see it): what a crash in the
        middle of the write leaves, and what a flipped bit in a committed step's entry
        leaves too.  ``lamina verify`` asks, once the rest is read, and says it.  An entry
        found so is looked at again after *pause* seconds: one a running writer was writing
        then is whole by now, or followed by others."""
        where = f"{self.path}/{fmt.COMMIT_NAME}"

        def look() -> tuple[str | None, int]:
            try:
                fd = _open_in(self.path, fmt.COMMIT_NAME, os.O_RDONLY, dir_fd=self._dir_fd)
                try:
                    buf = _read_fd(fd)
                finally:
                    os.close(fd)
                meta_size = os.stat(fmt.META_NAME, dir_fd=self._dir_fd).st_size
                entries, end, _ = fmt.parse_commits(buf, meta_size, where, last_past_end=True)
            except (FormatError, OSError) as e:
                return str(e), -1
            if len(buf) - end < fmt.ENTRY_SIZE:
                return None, len(buf)  # nothing after it, or an entry cut short: never ended
            return (
                f"{where}: commit entry {len(entries)} (bytes {end}..{end + fmt.ENTRY_SIZE}), the "
                "last, fails its checksum: a commit cut short by a crash, or a damaged entry of "
                "a committed record; the record it names is left out"
            ), len(buf)

        said, size = look()
        if said is None:
            return None
        time.sleep(pause)
        again, size_now = look()
        return again if again == said and size_now == size else None

    @property
    def records_left_out(self) -> int:
        """Committed records a reader left out of the file as it last read its logs (a file
        cut short, docs/format.md): the steps before them open."""
        return self._left_out

    def _apply_raws(self, raws: list[bytes]) -> tuple[int, Exception | None]:
        """Decode and apply records *raws* in order (the other ranks' records, or rank 0's
        intact ones again): how many were applied, and the error that stopped the next one
        (None: none did)."""
        for k, raw in enumerate(raws):
            seq = self.catalog.nrecords
            what = f"{self.path}/{fmt.META_NAME} record {seq}"
            try:
                rec = Record.decode(raw, self.catalog, what, version=self._version)
                self.catalog.apply_record(rec, True, self._blocks(rec, _of_step(rec, what)), what)
            except Exception as e:  # noqa: BLE001 - raised if rank 0 kept this record
                return k, e
        return len(raws), None

    def _intact_prefix(
        self, payloads: list[bytes], entries: list[fmt.CommitEntry], cp: Checkpoint
    ) -> list[bytes]:
        """Rank 0: decode and apply *payloads* in order up to the first whose blocks are not all
        there (the catalog as of checkpoint *cp* before the first: for the rare record left
        out, the catalog goes back to *cp* and the intact ones are applied again)."""
        good: list[bytes] = []
        prev_end = self._meta_end
        for raw, ent in zip(payloads, entries, strict=True):
            seq = self.catalog.nrecords
            what = f"{self.path}/{fmt.META_NAME} record {seq}"
            rec = Record.decode(raw, self.catalog, what, version=self._version)
            if rec.area_length and not (
                prev_end <= rec.area_offset and rec.area_offset + rec.area_length <= ent.offset
            ):  # (the caller restores the catalog)
                raise FormatError(
                    f"{what}: its block area (bytes {rec.area_offset}+{rec.area_length}) is not between "
                    f"the previous record (ends at {prev_end}) and its own (at {ent.offset})"
                )
            missing = self._missing_data(rec)
            if missing is not None:
                self.catalog.restore(cp)
                _, late = self._apply_raws(good)
                if late is not None:  # (they applied a moment ago)
                    raise late
                if seq != self._warned:
                    self._warned = seq
                    warn_caller(
                        f"{self.path}: {len(payloads) - len(good)} committed record(s) from record {seq} "
                        f"(step {len(self.catalog.steps)} on) left out: {missing}"
                    )
                break
            self.catalog.apply_record(rec, True, self._blocks(rec, _of_step(rec, what)), what)
            good.append(raw)
            prev_end = ent.offset + ent.length
        return good

    def _blocks(self, rec: Record, what: str) -> StepBlocks | None:
        """The blocks of a step record: version 3 reads them from lamina.meta when first used."""
        if rec.kind != 1:
            return None
        return rec.step_blocks(_AreaLoader(self, rec.area_offset, what), what)

    def _meta_reader(self) -> int:
        """lamina.meta open read-only, once for every thread.  Threads reading at once may
        each open it: the first one kept is every thread's, the others are closed."""
        fd = self._rfds.get(fmt.META_NAME)
        if fd is not None:
            return fd
        try:
            fd = self._open_reader(fmt.META_NAME)
        except FileNotFoundError:
            self._check_identity()  # a file deleted or re-created under this reader says so
            raise
        kept = self._rfds.setdefault(fmt.META_NAME, fd)  # atomic: one descriptor wins
        if kept != fd:
            os.close(fd)
        return kept

    def _open_reader(self, name: str) -> int:
        """*name* in the file's directory opened read-only (FileNotFoundError, or
        FormatError where the file was re-created meanwhile).  Where the process has no
        descriptor left, the subfiles kept open that no read holds are closed and the open
        tried again; if it fails again, the error names the file and what to do."""
        for last in (False, True):
            try:
                fd = _open_in(self.path, name, os.O_RDONLY, dir_fd=self._dir_fd)
                break
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                if last or not self._subfiles.close_idle():
                    raise self._no_descriptor(e, name) from None
        try:
            self._check_identity()  # what is opened now must be of the file this rank knows
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _no_descriptor(self, e: OSError, name: str) -> OSError:
        """*e*, an open of *name* for reading that failed for want of a descriptor (the
        process's, EMFILE, or the system's, ENFILE), with the file's whole path and what to do."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        may = "no limit" if soft == resource.RLIM_INFINITY else f"at most {soft} files open"
        return type(e)(
            e.errno,
            f"{e.strerror} (opening {name} to read it: the process may have {may} (ulimit -n) "
            f"and a reader keeps at most {self._subfiles.most} of a file's subfiles open, "
            "those it has open all in use now; raise the limit (ulimit -n), close other files, "
            "or write the file with fewer subfiles: aggregators=N, fewer writer sessions)",
            os.path.join(self.path, name),
        )

    def _missing_data(self, rec: Record) -> str | None:
        """What of *rec*'s block data is not in its subfiles (None if everything is)."""
        for session, agg, end in rec.extents:
            name = subfile_name(session, agg)
            size = self._sizes.get(name)
            if size is None or end > size:
                try:
                    st = os.stat(name, dir_fd=self._dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    return f"subfile {name} is missing ({self._first_block_in(rec, session, agg)})"
                # not a file cut short: an error for readers and writers alike, and a
                # writer in 'a' must not drop the steps it holds from the logs
                if stat.S_ISLNK(st.st_mode):
                    raise FormatError(
                        f"{self.path}: subfile {name} is a symbolic link; lamina does not follow "
                        "links inside its files"
                    )
                if not stat.S_ISREG(st.st_mode):
                    raise FormatError(f"{self.path}: subfile {name} is not a regular file")
                size = self._sizes[name] = st.st_size
            if end > size:
                return (
                    f"the step's blocks need bytes up to {end} of {name}, which has {size} "
                    f"({self._first_block_in(rec, session, agg, size)})"
                )
        return None

    def _first_block_in(self, rec: Record, session: int, agg: int, size: int = -1) -> str:
        """Names a block of *rec* in subfile (session, agg) that ends beyond *size* (for messages)."""
        try:
            blocks = self._blocks(rec, "record")
            assert blocks is not None  # a step record
            tables = rec.tables or {
                did: blocks.table(self.catalog.specs[did]) for did in rec.sections
            }
        except (FormatError, OSError):
            return "its blocks could not be read"
        for did, t in tables.items():
            m = (
                (t.session == session)
                & (t.agg == agg)
                & (t.length > 0)
                & (t.offset + t.length > size)
            )
            if bool(m.any()):
                i = int(np.argmax(m))
                return f"block {t.box(i)} of dataset {self.catalog.specs[did].path!r}"
        return "no block named"

    def refresh(self) -> int:
        """Collective: pick up steps committed by a writer since open (for following a live file)."""
        if self.mode != "r":
            return len(self.catalog.steps)
        return self._load_new(comm_mod.CALL_REFRESH)

    def flush(self, durable: bool = True) -> None:
        """Collective: with *durable*, every step committed so far on stable storage: each
        aggregator fsyncs its subfile, then rank 0 the metadata and commit logs and the
        directory.  The bytes of a commit are in the operating system's cache once it
        returns; a file opened with ``durable=False`` (no fsync at each commit) is made
        durable at the points a program chooses this way.  Readers have nothing to flush.
        Ranks that pass different *durable* raise CollectiveMismatchError on every rank."""
        if self._closed:
            raise ValueError(f"cannot flush: file {self.path!r} is closed")
        if self.mode == "r":
            return
        durable = durable_flag(durable, "flush()")
        if self.size > 1:
            # one durable= on every rank: a rank that fsyncs waits in the agreement below for
            # the ranks that would have returned (they raise with it instead); ranks in
            # another collective call (a close) raise with this one, the call named
            comm_mod.agree(self.comm, None, call=comm_mod.CALL_FLUSH)
            if not comm_mod.same_everywhere(self.comm, int(durable)):
                raise mark_collective(
                    CollectiveMismatchError(
                        f"flush of {self.path!r}: ranks passed different durable= (this rank "
                        f"durable={durable}); every rank must pass the same"
                    )
                )
        if not durable:
            return
        g = comm_mod.Guard()
        with g:
            if self.is_agg and self._data_fd >= 0:
                os.fsync(self._data_fd)
        comm_mod.agree(self.comm, g.error)  # the data before the records that name it
        g = comm_mod.Guard()
        with g:
            if self.rank == 0:
                os.fsync(self._meta_fd)
                os.fsync(self._commit_fd)
                _fsync_dir(self.path)
        comm_mod.agree(self.comm, g.error)

    def _write_record(self, rec: Record) -> bytes:
        """Rank 0: the step's block area, then the record's frame, then its commit entry (each fsynced)."""
        off = self._meta_end
        read: Record | None = None
        if self._version >= 3 and self.size == 1:
            # a writer alone applies the record as written; with more ranks every rank decodes
            # the same bytes, so that a record the decoder refused is refused on every rank
            head, area, read = rec.encode_read(self.catalog.specs, self._version, area_offset=off)
        else:
            head, area = rec.encode(self.catalog.specs, self._version, area_offset=off)
        framed = fmt.frame(head)
        at = off + len(area)  # the frame follows the area
        doing = fmt.META_NAME
        try:
            _pwrite_pair(self._meta_fd, area, framed, off)
            if self.durable:
                os.fsync(self._meta_fd)
            last = fmt.CommitEntry(self._nentries, at, len(framed), stats_mod.crc(head))
            ent = fmt.entry(last.seq, last.offset, last.length, last.payload_crc)
            doing = fmt.COMMIT_NAME
            _pwrite_all(self._commit_fd, ent, self._commit_end)
            if self.durable:
                os.fsync(self._commit_fd)
        except BaseException as e:
            # the step is discarded on every rank: make sure no reader can see it either
            for fd, end in ((self._commit_fd, self._commit_end), (self._meta_fd, self._meta_end)):
                try:
                    os.ftruncate(fd, end)
                except OSError:
                    pass
            if isinstance(e, OSError) and e.filename is None:  # say which file, as open does
                what = (
                    f"the record of step {rec.step}"
                    if rec.kind == KIND_STEP
                    else "the close record"
                    if rec.kind == KIND_CLOSE
                    else "the metadata record of changes made outside a step"
                )
                if doing == fmt.COMMIT_NAME:
                    what = f"the commit entry of {what}"
                raise OSError(
                    e.errno, f"{e.strerror} (writing {what})", os.path.join(self.path, doing)
                ) from e
            raise
        self._last_entry = last
        self._nentries += 1
        self._meta_end = at + len(framed)
        self._commit_end += len(ent)
        self._written = (head, read)
        return head

    def _record_out(self) -> bytes | None:
        return None if self._written is None else self._written[0]

    def _apply_committed(self, shared: bytes):
        what = f"{self.path}/{fmt.META_NAME} record {self.catalog.nrecords}"
        written, self._written = self._written, None
        if written is not None and written[1] is not None and written[0] == shared:
            rec = written[1]  # the record this rank wrote, as decoding its head would give it
        else:
            rec = Record.decode(shared, self.catalog, what, apply_ops=False, version=self._version)
        return rec, self._blocks(rec, what)

    # ------------------------------------------------------------ data
    def _write_data(self, buf, what: Callable[[], str] | None = None) -> int:
        """Aggregator: append *buf* to this session's subfile; its offset there.  *what()*
        names what *buf* holds, in the message of an I/O error (default: its blocks).

        An I/O error is kept and raised by end_step, on every rank: raised
        here, on this rank only, it would leave the other ranks waiting in
        end_step for this one.
        """
        off = self._data_end
        n = memoryview(buf).nbytes
        if self._put_error is None:
            try:
                _pwrite_all(self._data_fd, buf, off)
            except OSError as e:
                # what was being written, in the message every rank gets (the error's class,
                # errno and file stay)
                said = what() if what is not None else "its blocks"
                self._put_error = self._write_error(e, said)
        self._data_end += n
        return off

    def _write_error(self, e: OSError, what: str) -> OSError:
        """*e*, an aggregator's failed write of *what* into its subfile, as every rank gets it:
        its class and errno, the step and the subfile's path named."""
        name = os.path.join(self.path, subfile_name(self.session, self.agg_of[self.rank]))
        step = len(self.catalog.steps)  # (blocks are written for the step being committed)
        return OSError(e.errno, f"{e.strerror} (writing step {step}: {what})", name)

    def _place(self, spec, arr: np.ndarray, copy: bool, start) -> tuple:
        if not self.is_agg:
            return super()._place(spec, arr, copy, start)
        # write now; the worker thread computes stats/checksums meanwhile
        job = self._job(arr)
        off = self._write_data(arr, lambda: f"dataset {spec.path!r} box {box_of(start, arr.shape)}")
        if copy:
            job.result()  # the caller may reuse its buffer as soon as we return
        return None, job, (self.session, self.agg_of[self.rank], off)

    def _rows_named(self, rows: list[int]) -> str:
        """The blocks of put-log *rows* in the words of an I/O error: one block's dataset and
        box, or how many blocks of which datasets."""
        log, specs = self._log, self.catalog.specs
        if len(rows) == 1:
            r = rows[0]
            did = log.ds[r]
            try:
                i = log.rows[did].index(r)
                box = f" box {Box(log.starts[did][i], log.stops[did][i])}"
            except (KeyError, ValueError):
                box = ""
            return f"dataset {specs[did].path!r}{box}"
        names = sorted({specs[log.ds[r]].path for r in rows})
        shown = ", ".join(repr(n) for n in names[:4]) + (", ..." if len(names) > 4 else "")
        return f"{len(rows)} staged blocks of dataset{'s' if len(names) > 1 else ''} {shown}"

    def _place_payload(self, payload: bytes) -> tuple[int, int, int] | None:
        if not self.is_agg:
            return None
        return (self.session, self.agg_of[self.rank], self._write_data(payload))

    def _seal(self, c: Chunk) -> None:
        """A full staging chunk: an aggregator writes it at once (summarized meanwhile) and reuses it."""
        self._summarize(c)
        if not self.is_agg:
            return
        off = self._write_data(c.buf.data[: c.used], lambda: self._rows_named(c.rows))
        c.loc = (self.session, self.agg_of[self.rank], off)  # its rows lie at off + their offset
        c.wait()
        self._recycle(c)

    def _move(self, heads: StepHeads) -> list[tuple[int, int, int, int]]:
        """Collective: members send the blocks not written yet to their aggregator, which writes them.

        A rank's blocks go as one stream in put order, cut in pieces of
        :data:`MSG_CHUNK` bytes (staged blocks straight from their chunks),
        so the aggregator knows every piece's size from the heads alone and
        places the blocks back to back from one base offset.  Every expected
        byte is always sent and received, even after a local failure (a full
        disk, say): the aggregator keeps draining its members' messages and
        raises afterwards, so no message is left to be matched by a later
        step and no rank is left blocked.  Tags also carry the record number
        as a second guard.
        """
        tag = comm_mod.Tag.AGGREGATE + self.catalog.nrecords % 4096
        my_agg = self.agg_of[self.rank]
        bases: list[tuple[int, int, int, int]] = []
        error: BaseException | None = self._put_error
        if self.is_agg:
            mine, _ = heads.unplaced(self.rank)
            if mine.size:  # nothing is left unwritten on an aggregator, but be safe
                base = self._data_end
                rows = mine.tolist()
                for v in self._log.views(rows):
                    self._write_data(v, lambda: self._rows_named(rows))
                bases.append((self.rank, self.session, my_agg, base))
            for r in range(self.size):
                if r == self.rank or self.agg_of[r] != my_agg:
                    continue
                total = heads.unplaced_bytes(r)
                if not total:
                    continue
                base = self._data_end
                failed = self._recv_write(
                    r, total, base, self._recv_buffers(total), tag, write=error is None
                )
                if failed is not None and error is None:
                    failed = self._write_error(failed, f"the blocks of rank {r}")
                error = error or failed
                self._data_end += total
                bases.append((r, self.session, my_agg, base))
            error = error or self._put_error
            if error is None and self.durable:
                os.fsync(self._data_fd)
        else:
            rows, _ = heads.unplaced(self.rank)
            dest = self.agg_rank[my_agg]
            # two pieces in flight (the aggregator receives two at a time), waited for quietly:
            # a member blocked in Send would poll without pause and, on a node with fewer cores
            # than ranks, take the CPU from the aggregator it waits for
            flight: list = []  # (request, piece): the piece stays alive until it is sent
            for piece in _pieces(self._log.views(rows.tolist()), MSG_CHUNK):
                if len(flight) == 2:
                    comm_mod.wait_quietly([flight.pop(0)[0]])
                req = self.comm.Isend([piece, comm_mod.MPI.BYTE], dest=dest, tag=tag)
                flight.append((req, piece))
            comm_mod.wait_quietly([r for r, _ in flight])
        if error is not None:
            raise error
        return bases

    def _places_own_blocks(self) -> bool:
        """Every rank its own aggregator (the default): each writes its own blocks."""
        return self.naggs == self.size

    def _waits_after_move(self, heads: StepHeads) -> bool:
        """A member whose aggregator has at least :data:`QUIET_MOVE` bytes to write waits for it quietly."""
        if self.is_agg:
            return False
        group = self.agg_of[self.rank]
        total = sum(heads.unplaced_bytes(r) for r in range(self.size) if self.agg_of[r] == group)
        return total >= QUIET_MOVE

    def _recv_buffers(self, length: int) -> list[bytearray]:
        """Two reusable receive buffers, grown on demand (never larger than MSG_CHUNK)."""
        need = min(MSG_CHUNK, length)
        bufs = getattr(self, "_bufs", None)
        if bufs is None or len(bufs[0]) < need:
            bufs = self._bufs = [bytearray(need), bytearray(need)]
        return bufs

    def _recv_write(
        self,
        src: int,
        length: int,
        offset: int,
        bufs: list[bytearray],
        tag: int,
        write: bool = True,
    ) -> OSError | None:
        """Receive *length* bytes from *src* in pieces, writing piece k while piece k+1 arrives.

        Every piece is always received; after a write error (returned, not
        raised) or with ``write=False`` the remaining pieces are drained unwritten.
        """
        MPI = comm_mod.MPI
        pieces = [(a, min(MSG_CHUNK, length - a)) for a in range(0, length, MSG_CHUNK)]
        error: OSError | None = None
        reqs = []
        if pieces:
            reqs.append(
                self.comm.Irecv(
                    [memoryview(bufs[0])[: pieces[0][1]], MPI.BYTE], source=src, tag=tag
                )
            )
        for k, (a, n) in enumerate(pieces):
            reqs[k].Wait()
            if k + 1 < len(pieces):
                nb = memoryview(bufs[(k + 1) % 2])[: pieces[k + 1][1]]
                reqs.append(self.comm.Irecv([nb, MPI.BYTE], source=src, tag=tag))
            if write and error is None:
                try:
                    _pwrite_all(self._data_fd, memoryview(bufs[k % 2])[:n], offset + a)
                except OSError as e:
                    error = e
        return error

    # ------------------------------------------------------------ read
    def _subfile(self, name: str) -> descriptors.Held:
        """Subfile *name* held open for a read until the end of a ``with`` (which gives its
        descriptor): see :mod:`.descriptors`."""
        return self._subfiles.hold(name, lambda: self._open_subfile(name))

    def _open_subfile(self, name: str) -> int:
        try:
            return self._open_reader(name)
        except FileNotFoundError:
            self._check_identity()  # a file deleted or re-created under this reader says so
            raise FormatError(f"{self.path}: subfile {name} is missing") from None

    def _check_identity(self) -> None:
        """FormatError if the file at this path is no longer the one opened (re-created since).

        Re-creation makes a new commit log (the identity in its header, checked
        at each refresh, and its inode, checked here without reading a byte).
        """
        if self._commit_inode is None:
            return
        if not _same_inode(self._dir_fd, fmt.COMMIT_NAME, self._commit_inode):
            raise FormatError(self._gone())

    def _check_layout_format(self, path: str) -> None:
        """A file of a format version before multiresolution datasets is appended to in its
        own version: a multiresolution dataset there would be band blocks (codec 3) that the
        lamina which wrote the file cannot read, and it would no longer open the file."""
        if self._version < fmt.MULTIRES_VERSION:
            raise ConfigError(
                f"{self.path}: cannot create the multiresolution dataset {path!r}: the file is in "
                f"format version {self._version}, and multiresolution datasets came with format "
                f"version {fmt.MULTIRES_VERSION} (the lamina that wrote this file could no longer "
                f"open it); write them to a new file (mode 'w' writes format version {fmt.VERSION})"
            )

    def _gone(self) -> str:
        """What became of the file open here, whose commit log is no longer the one held:
        deleted (its directory, held open, is gone), or re-created (another log in its place;
        none, for a moment, while a writer re-creates it or it is being deleted)."""
        try:
            os.stat(fmt.COMMIT_NAME, dir_fd=self._dir_fd, follow_symlinks=False)
        except OSError:
            if os.fstat(self._dir_fd).st_nlink == 0:
                return (
                    f"{self.path}: the file was deleted while open; only what this reader had "
                    "opened of it still reads: open the file again to read what is there now"
                )
            return (
                f"{self.path}: the file was re-created while open (another writer opened it in "
                f"mode 'w') or is being deleted: its {fmt.COMMIT_NAME} is gone; open it again"
            )
        return (
            f"{self.path}: the file was re-created while open (another writer opened it "
            "in mode 'w'); open it again to read the new one"
        )

    def _read_blocks(self, spec, t: BlockTable, idx, lo, hi, box: Box, out: np.ndarray) -> None:
        """Whole raw blocks that lie back to back in a subfile are read with one pread each run.

        Each block of a run is checked against its checksum and copied into
        place; blocks read in part, compressed or large go one by one
        (:meth:`_read_region`, which reads only the checksum segments a part
        touches).  How (:meth:`_lay_out`) is kept for the next read of blocks laid out
        alike (:meth:`~lamina.catalog.BlockTable.layout_key`) into the same box of an
        output of the same geometry: a reader of one region step after step plans once
        (the plans are the process's: a file opened again, or another file written alike,
        finds them too).
        """
        n = len(idx)
        if n < 2:
            return super()._read_blocks(spec, t, idx, lo, hi, box, out)
        # the threads the read may take (_read_runs): one below PARALLEL_READ_MIN bytes
        big = box.size * spec.dtype.itemsize >= PARALLEL_READ_MIN
        threads = _parallel.default_threads() if big else 1
        if n > PLANNED_MAX:  # planning is a small part of such a read: not kept
            plan = self._lay_out(t, idx, lo, hi, box, out, threads)
        else:
            key = (
                box.start,
                box.stop,
                out.shape,
                out.strides,
                out.dtype.str,
                (
                    COALESCE_BLOCK,
                    COALESCE_RUN,
                    READ_PIECE,
                    ROW_PIECE,
                    SCATTER_ELEMENTS,
                    stats_mod.CONCAT_MIN,
                    threads,
                ),
            )
            layout = t.layout_key(idx)
            with _plans_lock:
                kept = _plans.pop(key, None)
                if kept is not None:
                    _plans[key] = kept  # the most recently used last: the oldest goes first
            if kept is not None and kept[0] == layout:
                plan = kept[1]
            else:
                plan = self._lay_out(t, idx, lo, hi, box, out, threads)
                with _plans_lock:
                    if key not in _plans and len(_plans) >= READ_PLANS:
                        del _plans[next(iter(_plans))]  # the least recently used
                    _plans[key] = (layout, plan)
        if plan.runs:
            self._read_runs([self._bind_run(spec, t, idx, r, out) for r in plan.runs])
        if plan.single is not None:
            k = plan.single
            super()._read_blocks(spec, t, idx[k], lo[k], hi[k], box, out)

    def _lay_out(
        self, t: BlockTable, idx, lo, hi, box: Box, out: np.ndarray, threads: int
    ) -> _ReadPlan:
        """How :meth:`_read_blocks` reads blocks ``idx`` of *t* (parts ``[lo, hi)``) into
        *out*, which holds *box*: the runs of whole raw blocks back to back in a subfile
        (:meth:`_lay_out_run`), the others one by one, by up to *threads* threads.  Nothing
        in it depends on where the step's blocks start in their subfile, on their checksums,
        or on *out*'s memory."""
        n = len(idx)
        length = t.length[idx]
        whole = (
            rows_all((lo == t.start[idx]) & (hi == t.stop[idx]))
            & (t.codec[idx] == CODEC_RAW)
            & (t.ncrc[idx] == 1)
            & (length <= COALESCE_BLOCK)
        )
        if int(whole.sum()) < 2:
            return _ReadPlan(np.arange(n, dtype=np.int64), [])
        w = np.flatnonzero(whole)
        key = t.session[idx[w]].astype(np.int64) << 32 | t.agg[idx[w]].astype(np.int64)
        off = t.offset[idx[w]]
        order = np.lexsort((off, key))
        w, key, off = w[order], key[order], off[order]
        ln = length[w]
        single: list[int] = [int(v) for v in np.flatnonzero(~whole)]
        base = np.asarray(box.start, dtype=np.int64)
        rel_lo, rel_hi = lo - base, hi - base
        runs: list[_RunPlan] = []
        for a, b in _runs(key, off, ln):
            if b - a == 1:
                single.append(int(w[a]))
                continue
            runs.append(self._lay_out_run(t, idx, w[a:b], rel_lo, rel_hi, out, threads))
        if not single:
            return _ReadPlan(None, runs)
        single.sort()
        return _ReadPlan(np.asarray(single, dtype=np.int64), runs)

    def _read_runs(self, runs: list[_Run]) -> None:
        """Read the pieces of every run of a read, then check the runs checked as a whole.

        The pieces of all the runs go to a few threads together when they are large
        (:data:`PARALLEL_READ_MIN` bytes in all): the cores of this process shared among the
        ranks of its node, as for the derived kernels
        (:func:`lamina.derived._parallel.default_threads`); pread, CRC and numpy's copies
        release the GIL.  One set of threads for the whole read, not one per run: a run
        holds at most :data:`COALESCE_RUN` bytes, and threads started per run wait for the
        slowest piece of each.  Each thread reads through a buffer of a piece, kept by the
        engine for the next read.
        """
        items = [(r, k) for r in runs for k in range(len(r.sizes))]
        threads = 1
        if len(items) > 1 and sum(r.total for r in runs) >= PARALLEL_READ_MIN:
            threads = min(len(items), _parallel.default_threads())
        need = max(max(r.sizes) for r in runs) + buffers.PAGE  # a piece placed (buffers.window)
        bufs = [self._run_buffer(need) for _ in range(threads)]
        try:
            _parallel.run_blocks(items, _place_piece, bufs)
        finally:
            for buf in bufs:
                self._keep_run_buffer(buf, threads)
        for r in runs:
            r.check()

    @staticmethod
    def _lay_out_run(t: BlockTable, idx, ks, rel_lo, rel_hi, out, threads: int) -> _RunPlan:
        """How to read blocks ``idx[ks]``, back to back in one subfile: in pieces of whole
        blocks (about :data:`READ_PIECE` bytes; a grid's pieces a row of cells at least, up to
        :data:`ROW_PIECE`), each checked and put in place while it is still in the cache
        (:meth:`_bind_run`, :meth:`_read_runs`).

        A run of many blocks of one length is checked with one CRC over it (the pieces'
        CRCs combined) against the blocks' own (:func:`~lamina.stats.crc_concat`), at the
        end.  Fewer or unequal blocks are checked a piece at a time, before they are placed.
        Blocks of one shape that tile a box of *out* in C order are placed a slab of the grid
        per piece; otherwise one fancy-indexed copy, one scatter or a copy per block.
        """
        rows = idx[ks]
        lengths = t.length[rows]
        ends = np.cumsum(lengths)
        n = len(rows)
        one_length = bool(np.all(lengths == lengths[0]))
        shape = t.stop[int(rows[0])] - t.start[int(rows[0])]
        one_shape = one_length and bool(np.all(t.stop[rows] - t.start[rows] == shape))
        corner = rel_lo[ks]
        grid = grid_plan_for(out, corner, shape) if one_shape else None
        pieces: list[tuple[int, int, Any]]
        if grid is not None and grid.order is None:  # a slab of the grid per piece
            extent = grid.split[0 : 2 * out.ndim : 2]
            row = int(extent[-1]) * int(lengths[0])  # a row of cells along the last axis
            rows = n // int(extent[-1])
            # rows a piece, where they leave each of the read's *threads* a piece
            whole = row <= ROW_PIECE and rows >= threads
            pieces = list(_slabs(extent, int(lengths[0]), max(READ_PIECE, row * whole)))
        else:
            pieces = [(a, b, None) for a, b in _cuts(ends, READ_PIECE)]
        within = at = None
        if grid is None and one_shape and out.flags.c_contiguous:
            if int(np.prod(shape)) <= SCATTER_ELEMENTS:  # an index array for every block
                strides = np.asarray(out.strides, dtype=np.int64) // out.itemsize
                cells = np.indices(tuple(int(v) for v in shape)).reshape(len(shape), -1)
                within = np.asarray(np.ravel_multi_index(tuple(cells), out.shape), dtype=np.int64)
                at = corner @ strides
        sizes = [int(ends[b - 1]) - (int(ends[a - 1]) if a else 0) for a, b, _ in pieces]
        return _RunPlan(
            ks,
            lengths,
            ends,
            pieces,
            sizes,
            grid,
            within,
            at,
            corner,
            rel_hi[ks],
            n >= stats_mod.CONCAT_MIN and one_length and int(lengths[0]) > 0,
        )

    def _bind_run(self, spec, t: BlockTable, idx, plan: _RunPlan, out) -> _Run:
        """The run *plan* lays out, of blocks ``idx[plan.ks]`` of *t* (one step's), into *out*:
        where it starts, the checksums it is checked against, and how each piece is placed.

        On a checksum mismatch of a run checked as a whole, the run is read again to name
        the corrupt block, and *out* holds what was read (as after any failed read, its
        contents are then undefined).
        """
        rows = idx[plan.ks]
        i0 = int(rows[0])
        first = int(t.offset[i0])
        name = subfile_name(int(t.session[i0]), int(t.agg[i0]))
        what = _Lazy(lambda: f"{self.path}/{name}: dataset {spec.path!r}")
        dt = spec.dtype
        expected = t.crcs[t.crc_ptr[rows]]
        lengths, ends, pieces, one_crc = plan.lengths, plan.ends, plan.pieces, plan.one_crc
        grid = None if plan.grid is None else grid_view(out, plan.grid)
        got = [0] * len(pieces)  # each piece's CRC (one_crc)

        def corrupt(j: int) -> ChecksumError:
            begin = first + (int(ends[j - 1]) if j else 0)
            return ChecksumError(
                f"checksum mismatch in {self.path}/{name}: dataset {spec.path!r} block "
                f"{t.box(int(rows[j]))}, segment 0 (bytes {begin}..{first + int(ends[j])}): "
                "the data is corrupt"
            )

        def place(buf: np.ndarray, k: int) -> None:
            a, b, key = pieces[k]
            begin = int(ends[a - 1]) if a else 0
            piece = buffers.window(buf, first + begin, int(ends[b - 1]) - begin)
            with self._subfile(name) as fd:  # (held by each piece: few open at once)
                _pread_into(fd, piece.data, first + begin, what)
            if one_crc:
                got[k] = stats_mod.crc(piece.data)
            else:
                j = stats_mod.first_bad_piece(piece, lengths[a:b], expected[a:b])
                if j >= 0:
                    raise corrupt(a + j)
            vals = piece.view(dt)
            if key is not None:
                assert grid is not None
                dst = grid[key]
                dst[...] = vals.reshape(dst.shape)
            elif grid is not None:
                assert plan.grid is not None
                block = grid.shape[out.ndim :]
                grid[tuple(plan.grid.cells[a:b].T)] = vals.reshape(b - a, *block)
            elif plan.within is not None:
                assert plan.at is not None
                out.reshape(-1)[(plan.at[a:b, None] + plan.within[None, :]).reshape(-1)] = vals
            else:
                e = (ends[a:b] - begin).tolist()
                for lo_k, hi_k, u, v in zip(
                    plan.corner[a:b].tolist(), plan.hi[a:b].tolist(), [0, *e[:-1]], e, strict=True
                ):
                    dst = out[tuple(map(slice, lo_k, hi_k))]
                    dst[...] = vals[u // dt.itemsize : v // dt.itemsize].reshape(dst.shape)

        def check() -> None:
            """The run checked as a whole (many blocks of one length), once every piece is read."""
            if not one_crc or stats_mod.crc_combine(got, plan.sizes) == stats_mod.crc_concat(
                expected, int(lengths[0])
            ):
                return
            again = buffers.empty(int(ends[-1]), first)  # which block: each one's CRC
            with self._subfile(name) as fd:
                _pread_into(fd, again.data, first, what)
            j = stats_mod.first_bad_piece(again, lengths, expected)
            if j >= 0:
                raise corrupt(j)
            raise ChecksumError(
                f"checksum mismatch in {self.path}/{name}: dataset {spec.path!r}, the blocks at "
                f"bytes {first}..{first + int(ends[-1])} read differently twice"
            )

        return _Run(plan.sizes, int(ends[-1]), place, check)

    def _keep_run_buffer(self, buf: np.ndarray, most: int) -> None:
        """Keep *buf* for the next read unless *most* are kept already, or
        :data:`RUN_BUFFERS_KEPT` bytes with it."""
        kept = self._run_bufs
        if len(kept) < most and len(buf) + sum(map(len, kept)) <= RUN_BUFFERS_KEPT:
            kept.append(buf)

    def _run_buffer(self, need: int) -> np.ndarray:
        """A buffer of at least *need* bytes: one kept from an earlier run, or a new one."""
        try:
            buf = self._run_bufs.pop()
        except IndexError:
            return np.empty(need, dtype=np.uint8)
        return buf if len(buf) >= need else np.empty(need, dtype=np.uint8)

    def aggregator_ranks(self) -> list[int]:
        return list(self.agg_rank)

    @_reading
    def payloads(self, step: int, wanted, into: np.ndarray | None = None) -> list[list[np.ndarray]]:
        """Blocks that lie back to back in a subfile (bands of a multiresolution dataset in
        patch or level order) are read with one pread per run, then each is checked against
        its segment checksums; a run holds at most :data:`COALESCE_RUN` bytes.  A run that
        fits *into* (less a page: it is placed as :func:`buffers.window` places it) is read
        there."""
        out: list[list[np.ndarray]] = [[np.empty(0, np.uint8)] * len(rows) for _, _, rows in wanted]
        cols = [
            (g, spec, t, np.asarray(rows, dtype=np.int64))
            for g, (spec, t, rows) in enumerate(wanted)
        ]
        if sum(r.size for *_, r in cols) < 2:
            return super().payloads(step, wanted)
        grp = np.concatenate([np.full(r.size, g, dtype=np.int64) for g, _, _, r in cols])
        pos = np.concatenate([np.arange(r.size, dtype=np.int64) for *_, r in cols])
        key = np.concatenate(
            [t.session[r].astype(np.int64) << 32 | t.agg[r].astype(np.int64) for _, _, t, r in cols]
        )
        off = np.concatenate([t.offset[r].astype(np.int64) for _, _, t, r in cols])
        ln = np.concatenate([t.length[r].astype(np.int64) for _, _, t, r in cols])
        order = np.lexsort((off, key))
        grp, pos, key, off, ln = grp[order], pos[order], key[order], off[order], ln[order]
        free = into
        for a, b in _runs(key, off, ln):
            # each run in a part of *into* of its own: the views of every run are returned
            free = self._payload_run(cols, grp[a:b], pos[a:b], int(off[a]), ln[a:b], out, free)
        return out

    def _payload_run(
        self, cols, grp, pos, first: int, lengths, out, into: np.ndarray | None = None
    ) -> np.ndarray | None:
        """Blocks back to back from byte *first* of one subfile: one pread, then each checked.
        Read into *into* where the run fits there (less a page, for its place); returns
        what of *into* is left after it."""
        _, spec, t, rows = cols[int(grp[0])]
        r0 = int(rows[pos[0]])
        name = subfile_name(int(t.session[r0]), int(t.agg[r0]))
        n = int(lengths.sum())
        with self._subfile(name) as fd:
            # the lengths are the records' words alone: held to the subfile's size before
            # the run's buffer is made, as _payload holds one block's
            size = os.fstat(fd).st_size
            if first + n > size:
                raise FormatError(
                    f"{self.path}/{name}: dataset {spec.path!r}: its blocks at bytes "
                    f"{first}..{first + n} lie past the end of the subfile ({size} bytes): "
                    "the metadata is corrupt or the subfile was cut short"
                )
            if into is not None and into.size >= n + buffers.PAGE:
                buf = buffers.window(into, first, n)
                into = into[buf.ctypes.data - into.ctypes.data + n :]
            else:
                buf = buffers.empty(n, first)
            _pread_into(fd, buf.data, first, f"{self.path}/{name}: dataset {spec.path!r}")
        begin = 0
        for g, p, n in zip(grp.tolist(), pos.tolist(), lengths.tolist(), strict=True):
            _, spec, t, rows = cols[g]
            r = int(rows[p])
            piece = buf[begin : begin + n]
            if stats_mod.segment_crcs(piece, int(t.seg[r])) != t.block_crcs(r):
                raise ChecksumError(
                    f"checksum mismatch in {self.path}/{name}: dataset {spec.path!r} block "
                    f"{t.box(r)} (bytes {first + begin}..{first + begin + n}): the data is corrupt"
                )
            out[g][p] = piece
            begin += n
        return into

    def _block_name(self, rec, spec) -> _Lazy:
        return _Lazy(lambda: f"{self.path}/{rec.subfile}: dataset {spec.path!r} block {rec.box}")

    def _payload(self, rec, spec) -> np.ndarray:
        what = self._block_name(rec, spec)
        with self._subfile(rec.subfile) as fd:
            # an encoded block's length is its record's word alone (a raw one's is its box's
            # bytes): held to the subfile's size before its buffer is made
            size = os.fstat(fd).st_size
            if rec.offset + rec.length > size:
                raise FormatError(
                    f"{what}: its {rec.length} bytes at offset {rec.offset} lie past the end of "
                    f"the subfile ({size} bytes): the metadata is corrupt or the subfile was cut "
                    "short"
                )
            buf = buffers.empty(rec.length, rec.offset)
            self._read_verified(fd, buf.data, rec.offset, 0, rec, what)
        return buf

    def _read_sole(self, spec, t: BlockTable, box: Box, out: np.ndarray) -> bool:
        """The block read whole into *out* straight from the table's columns, as
        :meth:`_read_region` reads a whole block (no record, search or box made for it): a
        raw block that is exactly *box*, into C-contiguous memory."""
        if int(t.codec[0]) != CODEC_RAW or not out.flags.c_contiguous:
            return False
        start, stop = t.hull
        if start != box.start or stop != box.stop:
            return False
        name = subfile_name(int(t.session[0]), int(t.agg[0]))
        one = _Sole(int(t.offset[0]), int(t.length[0]), int(t.seg[0]), t.block_crcs(0))
        what = _Lazy(lambda: f"{self.path}/{name}: dataset {spec.path!r} block {box}")
        # (memoryview: an array subclass's .data may be an array, a masked array's)
        with self._subfile(name) as fd:
            self._read_whole(fd, np.asarray(out).data.cast("B"), one.offset, one, what)
        self._count_read(one.length)
        return True

    def _read_region(self, rec, spec, inter: Box, dst: np.ndarray) -> None:
        what = self._block_name(rec, spec)
        if rec.codec != BlockCodec.RAW:
            arr = self.decode_payload(rec, spec, self._payload(rec, spec))
            dst[...] = arr[inter.relative_to(rec.box)]
            return
        item = spec.dtype.itemsize
        if inter == rec.box and dst.flags.c_contiguous:
            # the whole block into the caller's memory: no intermediate copy
            with self._subfile(rec.subfile) as fd:
                self._read_whole(fd, np.asarray(dst).data.cast("B"), rec.offset, rec, what)
            return
        # byte span of the region in the block's C order, widened to checksum segments
        bshape = rec.box.shape
        first = (
            int(
                np.ravel_multi_index(
                    tuple(a - b for a, b in zip(inter.start, rec.box.start, strict=True)), bshape
                )
            )
            if bshape
            else 0
        )
        last = (
            int(
                np.ravel_multi_index(
                    tuple(a - 1 - b for a, b in zip(inter.stop, rec.box.start, strict=True)), bshape
                )
            )
            if bshape
            else 0
        )
        lo, hi = first * item, (last + 1) * item
        seg = rec.seg
        if seg:
            lo = (lo // seg) * seg
            hi = min(rec.length, -(-hi // seg) * seg)
        else:
            lo, hi = 0, rec.length
        buf = buffers.empty(hi - lo, rec.offset + lo)
        with self._subfile(rec.subfile) as fd:
            self._read_verified(fd, buf.data, rec.offset + lo, lo, rec, what)
        strides = tuple(
            item * int(np.prod(bshape[i + 1 :], dtype=np.int64)) for i in range(len(bshape))
        )
        view = np.lib.stride_tricks.as_strided(
            buf[first * item - lo :].view(spec.dtype),
            shape=inter.shape,
            strides=strides,
            writeable=False,
        )
        dst[...] = view

    def _read_verified(
        self, fd: int, mv: memoryview, file_off: int, block_off: int, rec, what: _Lazy
    ) -> None:
        """Read bytes [block_off, block_off+len(mv)) of a block and check their segment checksums.

        Reads segment by segment; the checksum of segment k runs on the worker
        thread while segment k+1 is read.  A read within one segment is checked
        on this thread: handing it over would cost a thread's wake-up for nothing.
        """
        seg = rec.seg if rec.seg else rec.length
        n = len(mv)
        if n and block_off + n <= (block_off // seg + 1) * seg:
            _pread_into(fd, mv, file_off, what)
            _verify(rec, seg, block_off // seg, stats_mod.crc(mv), what)
            return
        futures = []
        pool = stats_mod._pool()
        pos = 0
        while pos < n:
            k = (block_off + pos) // seg if seg else 0
            end = min(n, (k + 1) * seg - block_off)
            piece = mv[pos:end]
            _pread_into(fd, piece, file_off + pos, what)
            futures.append((k, pool.submit(stats_mod.crc, piece)))
            pos = end
        for k, fut in futures:
            _verify(rec, seg, k, fut.result(), what)

    def _read_whole(self, fd: int, mv: memoryview, file_off: int, rec, what: _Lazy) -> None:
        """A whole block read and checked into the caller's memory *mv*: straight in
        (:meth:`_read_verified`), or through a buffer where the page cache would copy into
        that memory at a crawl (:meth:`_read_bounced`)."""
        if len(mv) >= buffers.PLACED_MIN and buffers.misplaced(mv, file_off):
            self._read_bounced(fd, mv, file_off, rec, what)
        else:
            self._read_verified(fd, mv, file_off, 0, rec, what)

    def _read_bounced(self, fd: int, mv: memoryview, file_off: int, rec, what: _Lazy) -> None:
        """A whole block read into memory the page cache copies into at a crawl
        (:func:`lamina.buffers.misplaced`: the caller's array, 16 bytes into a page, for
        bytes that start on a page of the file): each :data:`READ_PIECE` read into a buffer
        placed for it, checked (each segment's checksum carried over its pieces) and copied
        into place while it is in the cache.  1 MiB: 215 us read into memory 16 bytes past
        the source, 550 us 8 bytes past, 145 + 27 us through the buffer."""
        seg = rec.seg if rec.seg else rec.length
        n = len(mv)
        size = min(READ_PIECE, n)
        buf = self._run_buffer(size + buffers.PAGE)
        try:
            got: list[int] = []  # each segment's checksum, checked once all are read
            pos = 0
            while pos < n:
                end = min(n, (len(got) + 1) * seg)
                crc = 0
                while pos < end:
                    m = min(size, end - pos)
                    piece = buffers.window(buf, file_off + pos, m)
                    # a file cut short is named as a read of the whole segment names it
                    _pread_into(fd, piece.data, file_off + pos, what, end - pos - m)
                    crc = stats_mod.crc(piece.data, crc)
                    mv[pos : pos + m] = piece.data
                    pos += m
                got.append(crc)
            for k, crc in enumerate(got):  # as _read_verified: a file cut short is named first
                _verify(rec, seg, k, crc, what)
        finally:
            self._keep_run_buffer(buf, 1)

    def _close_storage(self) -> None:
        in_use = getattr(self, "_in_use", None)
        if in_use is not None:  # (reads under way in other threads end first)
            in_use.close()
        subfiles = getattr(self, "_subfiles", None)
        if subfiles is not None:
            subfiles.close()
        fds = list(getattr(self, "_rfds", {}).values())
        fds += [
            getattr(self, n, -1)
            for n in ("_meta_fd", "_commit_fd", "_data_fd", "_held_fd", "_dir_fd")
        ]
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._rfds = {}
        self._meta_fd = self._commit_fd = self._data_fd = self._held_fd = -1
        self._dir_fd = -1
        # the read buffers go now, not when the collector frees the engine (a file's catalog
        # and its engine refer to each other): the next file's reads find their memory
        self._run_bufs = []
        lock = getattr(self, "_lock", None)
        if lock is not None:  # last: a new writer may start once the logs are closed
            lock.release()
            self._lock = None
