"""Logic shared by block-storing engines: definitions, validation, the step commit protocol, reads.

:class:`BlockEngine` implements everything in the engine interface except
where bytes live.  Subclasses provide these hooks:

``_open_storage(path, mode)``   collective: create/open storage, load the catalog
``_place(spec, arr, copy, start)``  independent: a large raw block at put time: store it now or keep it
``_seal(chunk)``                independent: a staging chunk is full (write it, or summarize it)
``_move(heads)``                collective: place every block not placed yet; return where
``_write_record(rec)``          rank 0 only: make one record durable; the bytes every rank applies
``_apply_committed(shared)``    every rank: decode those bytes into the catalog
``_read_blocks(...)``           independent: fill parts of an output array from blocks

Blocks put in a step are rows of a :class:`~.staging.PutLog` (columns, no
object per block); small raw blocks are copied into staging chunks and
summarized a chunk at a time.  A small raw block lent with ``copy=False``
is checked for bounds and shape at ``put`` and only referenced (and made
read-only until then): the commit enters and stages the step's lent
blocks by dataset and shape, one overlap search and one copy per staging
chunk (ADIOS2 defers a ``Put`` likewise).  So an overlap among lent blocks
is raised by ``end_step`` (on every rank, and the step is dropped) rather
than by the write.  The commit of one step (``end_step``) is four
collective phases, each moving whole columns:

1. **heads**: every rank encodes its blocks (dataset, boxes, stored
   lengths, codecs, locations: one set of columns for every dataset of the
   step, in put order) and a digest of its metadata changes; allgather.
2. **validate** (same verdict on every rank, no messages): ranks agree on
   definitions; no two boxes of one dataset overlap (one sort-and-sweep
   over the step's boxes, :func:`~lamina.geometry.find_overlap_arrays`).
3. **move**: the engine moves block bytes to where they live (aggregators,
   memory); statistics and checksums finish on the worker thread meanwhile.
4. **commit**: trailers (statistics, checksums, the base offset of each
   rank's moved blocks, again one set of columns for the step) are gathered
   on rank 0, which joins every rank's columns into one
   :class:`~lamina.catalog.blocks.StepTable` (rows by dataset) and writes
   the record from it (data is already durable), then broadcasts it; every
   rank applies it.  No table or object is made per dataset: a step of many
   datasets costs a few numpy calls per column, not per dataset.

On one rank, phases 1 and 4 hand the columns over as they are: nothing is
encoded to bytes and decoded again (``_pack_heads``/``_unpack_heads`` and
``_pack_trailer``/``_unpack_trailer`` are used only between ranks, and a
rank never decodes its own).

Where every rank places its own blocks (``_places_own_blocks``: the native
engine with one aggregator per rank, its default) no bytes cross ranks, and
the commit takes two exchanges instead of four (``_commit_gathered``): each
rank writes its blocks and sends its heads and trailer to rank 0 in one
message; rank 0 validates the step (the verdict phase 2 gives on every
rank, raised on every rank by the ``agree`` that follows), writes the record
and broadcasts it (two ranks writing one small block a step: 0.47-0.52 ms
a step against 0.66-0.96 ms through the four phases, docs/performance.md).

Any failure on any rank is propagated to all ranks (:func:`lamina.comm.agree`)
so no rank is left waiting; a failed step is discarded and nothing committed
before it changes.
"""

from __future__ import annotations

import collections
import itertools
import math
import operator
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import numpy as np

from .. import codecs as codec_mod
from .. import comm as comm_mod
from .. import stats as stats_mod
from ..catalog import (
    CODEC_STATS_ONLY,
    KIND_CLOSE,
    KIND_META,
    KIND_STEP,
    OP_ATTR,
    OP_DATASET,
    OP_DELATTR,
    OP_EXT,
    OP_GROUP,
    BlockCodec,
    BlockRecord,
    BlockTable,
    Catalog,
    Checkpoint,
    DatasetSpec,
    Decoder,
    Encoder,
    Record,
    checked_attr,
    decode_packed,
    normpath,
    pack,
    parent,
)
from ..catalog.blocks import LIMIT as SEGMENT_LIMIT
from ..catalog.blocks import StepTable, column_extents, dataset_runs, merge_extents
from ..catalog.model import MAX_ATTR_BYTES, MAX_NDIM, Stats, decode_op, encode_op
from ..errors import (
    BoundsError,
    ChecksumError,
    CodecError,
    CollectiveMismatchError,
    ConfigError,
    DTypeError,
    ExistsError,
    FormatError,
    ModeError,
    NotFoundError,
    ShapeError,
    StepError,
    is_collective,
    is_left,
    mark_collective,
    suggest,
)
from ..geometry import (
    Box,
    as_int,
    box_of,
    check_ranks_disjoint,
    cols_max,
    cols_min,
    find_overlap_arrays,
    rows_prod,
)
from ..layouts import read as layout_read
from ..layouts import write as layout_write
from ..layouts.spec import Layout, level_specs
from ..text import as_seconds
from . import collective
from .base import Engine, flag_option, step_number
from .batch import Batch, cast, check_batch, check_dtype
from .staging import (
    SMALL,
    BoxIndex,
    Chunk,
    LentBlocks,
    PutLog,
    enter_box,
    enter_boxes,
    filled,
    index_of,
)

_chain = itertools.chain.from_iterable

#: options every block engine takes
COMMON_OPTIONS = frozenset({"checksum_segment", "background_stats", "wait"})


def wait_for(what: str, seconds: float, ready, missing):
    """Poll *ready()* until it is true or *seconds* have passed; then raise *missing(seconds)* if it is not.

    For readers that open a file its writer has not created yet (``wait=``).
    """
    deadline = time.monotonic() + seconds
    delay = 0.01
    while not ready():
        if time.monotonic() >= deadline:
            raise missing(seconds)
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.5)


@dataclass(slots=True)
class RefusedSpec(DatasetSpec):
    """A definition whose arguments this rank's own checks refused (``create_dataset``'s,
    before a :class:`DatasetSpec` could be made of them): :meth:`BlockEngine.define` raises
    *error* inside the agreement its definition starts with, so that every rank raises it
    (the others, which took their arguments, waited there for this one forever)."""

    error: BaseException | None = None


class _Done:
    """A statistics job finished at put: (statistics or None, checksums)."""

    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value

    def result(self):
        return self.value

    def done(self) -> bool:
        return True


@dataclass(slots=True)
class RankHead:
    """One rank's blocks of a step, every dataset's, as every rank learns them in phase 1:
    row k is the rank's PutLog row k (put order)."""

    did: np.ndarray  # int64: the dataset of each block
    start: np.ndarray  # (n, width) int64: a dataset's own dimensions first, zeros after
    stop: np.ndarray
    length: np.ndarray  # int64
    codec: np.ndarray  # uint8
    located: np.ndarray  # bool: placed at put time (location below)
    session: np.ndarray  # uint32
    agg: np.ndarray  # uint32
    offset: np.ndarray  # int64

    def by_dataset(self) -> dict[int, slice | np.ndarray]:
        """The rows of each dataset (dataset id -> what takes them of a column)."""
        order, bounds, ids = dataset_runs(self.did)
        runs = zip(ids, bounds, bounds[1:], strict=False)
        if order is None:
            return {d: slice(a, b) for d, a, b in runs}
        return {d: order[a:b] for d, a, b in runs}


@dataclass(slots=True)
class StepHeads:
    """What phase 1 gathers from every rank."""

    digests: list[int] = field(default_factory=list)
    ranks: list[RankHead] = field(default_factory=list)  # per rank
    _unplaced: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def unplaced(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and lengths of *rank*'s blocks still to be placed, in put order (the order they are sent)."""
        got = self._unplaced.get(rank)
        if got is None:  # asked by the move and again by the record: computed once
            h = self.ranks[rank]
            m = ~h.located & (h.codec != CODEC_STATS_ONLY)
            got = self._unplaced[rank] = (m.nonzero()[0], h.length[m])
        return got

    def unplaced_bytes(self, rank: int) -> int:
        return int(self.unplaced(rank)[1].sum())


#: metadata operations any subset of ranks may make (merged at commit); the others are collective
ATTR_OPS = frozenset({OP_ATTR, OP_DELATTR})


def attribute_changes(ops: list[tuple]) -> list[tuple]:
    """This rank's attribute changes since the last commit: the last one per attribute, in first-touch order."""
    last: dict[tuple[str, str], tuple] = {}
    for op in ops:
        if op[0] in ATTR_OPS:
            key = (op[1], op[2])
            last.pop(key, None)
            last[key] = op
    return list(last.values())


def _stop(start: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The far corner of a block of *shape* at *start*."""
    return tuple(map(operator.add, start, shape))


def merge_attribute_changes(per_rank: list[list[tuple]]) -> list[tuple]:
    """The attribute changes of every rank as one list; CollectiveMismatchError where ranks disagree.

    Attributes may be set by any subset of ranks (often rank 0 alone, as in
    ADIOS2 programs); ranks that change the same attribute in one step must
    leave it the same (same value, or all delete it).
    """
    merged: dict[tuple[str, str], tuple[tuple, bytes, int]] = {}
    for rank, ops in enumerate(per_rank):
        for op in ops:
            e = Encoder()
            encode_op(e, op)
            key, raw = (op[1], op[2]), e.getvalue()
            if key not in merged:
                merged[key] = (op, raw, rank)
            elif merged[key][1] != raw:
                first, _, r0 = merged[key]
                raise CollectiveMismatchError(
                    f"attribute {op[2]!r} of {'/' + op[1]!r}: rank {r0} {_attr_change(first)} but rank "
                    f"{rank} {_attr_change(op)}; ranks that change one attribute in a step must agree"
                )
    return [op for op, _, _ in merged.values()]


def attr_change(catalog: Catalog, path: str, name: str, value) -> tuple:
    """The operation that sets attribute *name* of *path* to *value*, checked as a commit
    would take it (NotFoundError, ValueError, DTypeError naming the attribute)."""
    path = normpath(path)
    if catalog.kind_of(path) is None:
        raise NotFoundError(f"no group or dataset {path!r} to hold attribute {name!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"attribute names are non-empty strings, got {name!r}")
    try:
        # a ragged nested list is numpy's ValueError: said with the attribute's name
        op = (OP_ATTR, path, name, checked_attr(name, value))  # here, not at every commit
    except (DTypeError, ValueError) as e:
        kind = type(e) if isinstance(e, DTypeError | ShapeError) else ValueError
        raise kind(f"cannot set attribute {name!r} on {'/' + path!r}: {e}") from None
    return op


def _attr_change(op: tuple) -> str:
    if op[0] == OP_DELATTR:
        return "deletes it"
    value = op[3]
    text = (
        repr(value)
        if isinstance(value, str | list)
        else np.array2string(np.asarray(value), threshold=8)
    )
    return f"sets it to {text}"


def dataset_not_found(catalog: Catalog, name: str) -> NotFoundError:
    kind = catalog.kind_of(name)
    if kind == "group":
        return NotFoundError(f"{name!r} is a group, not a dataset")
    return NotFoundError(f"no dataset {name!r} in this file.{suggest(name, catalog.datasets)}")


def _check_steps_alike(serials: list[int]) -> None:
    """Raise StepError where the ranks of a step's commit have opened different numbers of
    steps (*serials*, one a rank): their programs are a step apart from here on, and every
    later commit would pair one rank's step k with another's k + 1."""
    if all(s == serials[0] for s in serials):
        return
    ahead = [r for r, s in enumerate(serials) if s != min(serials)]
    raise StepError(
        f"ranks {ahead} have opened more steps than rank {serials.index(min(serials))} "
        f"(steps opened by each rank: {serials}): a step was ended on some ranks and "
        "discarded on others (an error inside `with f.step()` on one rank), so this "
        "commit would mix their steps; nothing of it is committed"
    )


def _hulls_apart(boxes: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    """Whether the boxes around each rank's blocks (*boxes*: per rank, ``(starts, stops)``)
    are pairwise disjoint (then no block of one rank overlaps a block of another: each
    rank's own were tested at put)."""
    hulls = [_hull(a, b) for a, b in boxes]
    a, b = [h[0] for h in hulls], [h[1] for h in hulls]
    if len(boxes) > 8:
        return find_overlap_arrays(np.array(a, np.int64), np.array(b, np.int64)) is None
    # a few ranks: every pair, in Python (the sweep's fixed cost is tens of microseconds)
    for i in range(len(a)):
        for j in range(i):
            if all(map(operator.lt, a[i], b[j])) and all(map(operator.lt, a[j], b[i])):
                if all(map(operator.lt, a[i], b[i])) and all(map(operator.lt, a[j], b[j])):
                    return False  # two boxes, neither empty, that meet
    return True


def _hull(starts: np.ndarray, stops: np.ndarray) -> tuple[list[int], list[int]]:
    """The corners of the box around boxes ``[starts[k], stops[k])`` (an empty box for none)."""
    if not len(starts):
        zero = [0] * starts.shape[1]
        return zero, zero
    return cols_min(starts).tolist(), cols_max(stops).tolist()


def fill_uncovered(spec: DatasetSpec, box: Box, lo: np.ndarray, hi: np.ndarray, out) -> None:
    """Fill *out* (holding *box*) with the fill value unless the blocks' parts ``[lo, hi)`` cover it."""
    covered = int(rows_prod(hi - lo).sum()) if len(lo) else 0
    if covered < box.size:
        out[...] = spec.fill_scalar()


def check_out(out, box: Box, spec: DatasetSpec) -> None:
    """*out*, the buffer a read of *box* of *spec* fills: a writeable numpy array (any strides)
    of the box's shape and the dataset's dtype, else an error naming the dataset (DTypeError,
    ValueError for a read-only array, ShapeError), before anything is read."""
    what = f"dataset {spec.path!r}"
    if not isinstance(out, np.ndarray):
        raise DTypeError(
            f"{what}: the output buffer must be a numpy array, not {type(out).__name__}"
        )
    if out.shape != box.shape or out.dtype != spec.dtype:
        raise ShapeError(
            f"{what}: output buffer {out.shape} {out.dtype} does not match box {box} of {spec.dtype}"
        )
    if not out.flags.writeable:
        raise ValueError(f"{what}: output buffer {out.shape} {out.dtype} is read-only")


def refuse_stats_only(spec: DatasetSpec, t: BlockTable, rows: np.ndarray, step: int) -> None:
    """FormatError if any of *rows* of *t* keeps only statistics (no values to read)."""
    if len(rows) == 1:
        k = int(rows[0])
        computed = int(t.codec[k]) == CODEC_STATS_ONLY
    else:
        flags = t.codec[rows] == CODEC_STATS_ONLY
        computed = bool(flags.any())
        k = int(rows[int(np.argmax(flags))]) if computed else -1
    if computed:
        raise FormatError(
            f"dataset {spec.path!r} keeps only statistics at step {step}: block {t.box(k)} "
            "holds statistics only, no values to read (a statistics-only block, whose values "
            "only the derived layer computes, for a derived quantity kept with strategy='stats'; "
            f"{spec.path!r} is not read as one here)"
        )


class BlockEngine(Engine):
    """Common base of the memory and native engines (see module docstring)."""

    OPTIONS = COMMON_OPTIONS
    #: whether datasets may have a layout (``lamina.layouts``): every block engine that keeps blocks
    LAYOUTS = True
    #: whether blocks carry CRC-32C checksums (the memory transport's bytes are never stored)
    CHECKSUMS = True

    def __init__(self) -> None:
        self.catalog = Catalog()
        self._log = PutLog()  # the blocks of the current step on this rank
        self._local: dict[int, BoxIndex] = {}  # dataset id -> this rank's boxes in this step
        # small blocks put with copy=False, entered and staged at the commit (_flush_lent)
        self._lent = LentBlocks()
        self._free_chunks: list[np.ndarray] = []  # staging buffers to use again
        self._spec_cache: dict[str, DatasetSpec] = {}  # names as passed to put -> definitions
        self._lendable: dict[str, DatasetSpec] = {}  # the same, of the datasets lend may keep
        self._with_stats = True  # False: blocks carry no statistics (the memory transport's option)
        # False: the record goes out without the statistics, which follow (the memory transport)
        self._stats_in_record = True
        self._pending_ops: list[tuple] = []
        self._bytes_read = 0  # stored bytes read by get and get_collective (bytes_read)
        # taken to add to _bytes_read: threads reading one file at once (_count_read)
        self._count_lock = threading.Lock()
        self._commit_ops: list[
            tuple
        ] = []  # the ops of the record being committed (after merging attributes)
        self._committed_cp: Checkpoint | None = (
            None  # the catalog as of the last commit (to undo refused changes)
        )
        self._put_error: BaseException | None = (
            None  # an I/O failure in put, raised by end_step on every rank
        )
        # the put log marks the write calls (put, put_many, put_stats) under way (WriteMark):
        # an error out of a call (its checks', a codec's before anything is kept, or a failure
        # kept in _put_error) clears the mark; an interrupt leaves it set, the put log half
        # added to, and the open step is not committed (_cut_short).  put spells the mark
        # out: a test and two stores of an attribute, what a small block's write can pay for
        # (a try block costs nothing until it catches).
        self._in_step = False
        self._implicit = False  # the open step was opened by a write, not by begin_step
        # steps this rank has opened (begun, opened by a write, or joined at end_step): the
        # ranks compare it at each commit, so that a step ended on some ranks and discarded on
        # others (an error inside ``with f.step()`` on one rank) is not committed with another
        # rank's next step (_validate)
        self._serial = 0
        self._closed = False
        # close committed what it had to (or failed): only its release is left (an interrupt
        # may cut that short too, and a close again completes it)
        self._finished = False
        self._close_recorded = False  # the close record is committed (a close again: not twice)
        self.session = 0
        # multiresolution datasets: this rank's pieces in this step (encoded at end_step)
        self._mr_pending: dict[int, list[tuple[Box, np.ndarray]]] = {}
        self._mr_local: dict[int, BoxIndex] = {}
        #: what the last step's multiresolution writes did, per dataset (``layouts.write.Report``)
        self.layout_reports: dict[str, layout_write.Report] = {}

    # ------------------------------------------------------------------ open
    def validate_open(self, mode: str, options: dict, size: int) -> None:
        if mode not in ("r", "w", "a"):
            raise ValueError(f"mode must be 'r', 'w' or 'a', got {mode!r}")
        unknown = set(options) - self.OPTIONS
        if unknown:
            raise TypeError(
                f"unknown option(s) {sorted(unknown)} for engine {self.name!r}; accepted: {sorted(self.OPTIONS)}"
            )
        seg = options.get("checksum_segment", stats_mod.SEGMENT)
        try:
            n = as_int(seg)
        except TypeError:
            n = -1  # (refused below, as it was given)
        if n < 0 or (n and n % stats_mod.CHUNK) or n >= SEGMENT_LIMIT:
            # readers refuse a segment of 2**62 bytes or more (the block records): the file
            # would not open again
            raise ValueError(
                f"checksum_segment must be 0 or a multiple of {stats_mod.CHUNK} bytes below "
                f"2**62 (an int), got {seg!r}"
            )
        flag_option(options.get("background_stats", True), "background_stats")
        wait = options.get("wait", 0)
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
            raise ValueError(f"wait must be a number of seconds >= 0, got {wait!r}")

    def open(self, path: str, mode: str, comm, options: dict) -> None:
        self.validate_open(mode, options, comm.size)
        self.path = str(path)
        self.mode = mode
        self.comm = comm_mod.dup(comm)
        self.rank = self.comm.rank
        self.size = self.comm.size
        self.options = dict(options)
        self.segment = int(options.get("checksum_segment", stats_mod.SEGMENT))
        self.background_stats = flag_option(
            options.get("background_stats", True), "background_stats"
        )
        # readers: how long to wait for a file that does not exist yet
        self.wait = as_seconds(options.get("wait", 0))
        try:
            # ranks that disagree on path, mode or options would diverge later (e.g.
            # different aggregator maps): refuse now, on every rank
            self._check_same(
                f"open({self.path!r}, {mode!r}, options={sorted(options.items())!r})",
                repr((self.path, mode, sorted((k, repr(v)) for k, v in options.items()))).encode(),
            )
            self._open_storage(self.path, mode)
            if mode == "a" and self.catalog.closed:
                # Reopened for writing: commit an empty record at once so that readers stop
                # taking the last writer's close record for the end of the file (a reader
                # opening before this session's first step would otherwise end iter_steps early).
                with self._interrupts_held():
                    self._commit(KIND_META)
            self._committed_cp = self.catalog.checkpoint()
        except BaseException:
            # every failure above is raised on all ranks alike, so freeing is safe
            self._close_storage()
            comm_mod.free(self.comm)
            raise

    # ----------------------------------------------------------- metadata
    def _require_write(self, what: str) -> None:
        if self._closed:
            raise ValueError(f"cannot {what}: file {self.path!r} is closed")
        if self.mode == "r":
            raise ModeError(f"cannot {what}: file {self.path!r} is open read-only (mode 'r')")

    def _check_same(self, what: str, payload: bytes) -> None:
        """Collective: raise CollectiveMismatchError if ranks passed different *payload*
        (*what*: the call in words), naming which ranks made which call."""
        if self.size == 1:
            return
        key = stats_mod.crc(payload)
        if not comm_mod.same_everywhere(self.comm, key):
            raise mark_collective(
                CollectiveMismatchError(
                    "ranks disagree on the arguments of a collective call: "
                    + comm_mod.who_made(self.comm, key, what)
                )
            )

    def define(self, spec: DatasetSpec) -> DatasetSpec:
        self._require_write(
            f"create dataset {spec.path!r}"
        )  # before any message: a closed file has no communicator
        g = comm_mod.Guard()
        with g:
            if isinstance(spec, RefusedSpec):  # this rank's arguments, refused before
                assert spec.error is not None
                raise spec.error
            spec = self._validate_definition(spec)
        # a rank that refuses must not leave the others waiting; ranks in another collective
        # call (a close) raise with this one (the call named)
        comm_mod.agree(self.comm, g.error, call=comm_mod.CALL_DEFINE)
        self._check_same(
            f"create_dataset({spec.path!r}, shape={spec.shape}, dtype={spec.dtype})",
            spec.digest_bytes(),
        )
        ops = [(OP_DATASET, spec)]
        layout = Layout.of(spec)
        if layout is not None:
            ops += [(OP_DATASET, s) for s in level_specs(spec, layout, spec.id + 1)]
        for op in ops:
            self.catalog.apply_op(op)
            self._pending_ops.append(op)
        return spec

    def _validate_definition(self, spec: DatasetSpec) -> DatasetSpec:
        self._require_write(f"create dataset {spec.path!r}")
        path = normpath(spec.path)
        kind = self.catalog.kind_of(path)
        if kind is not None:
            raise ExistsError(f"cannot create dataset {path!r}: a {kind} of that name exists")
        self._check_parents_are_groups(path, "dataset")
        if spec.layout is not None and not self.LAYOUTS:
            raise ConfigError(
                f"cannot create dataset {path!r} with the {spec.layout.get('layout')!r} layout: "
                f"engine {self.name!r} does not store layouts (use a file or the memory engine)"
            )
        if spec.layout is not None:
            self._check_layout_format(path)
        spec = DatasetSpec(
            path,
            tuple(int(n) for n in spec.shape),
            spec.dtype,
            spec.fill,
            spec.codecs,
            len(self.catalog.specs),
            spec.layout,
        )
        Layout.of(spec)  # a layout that does not fit the dataset is refused here
        if (
            spec.ndim > MAX_NDIM
            or math.prod(max(1, n) for n in spec.shape) * spec.dtype.itemsize >= 1 << 62
        ):
            # readers refuse such a definition (DatasetSpec.decode): the file would not open again
            raise ShapeError(
                f"cannot create dataset {path!r} of shape {spec.shape}: the format allows at most "
                f"{MAX_NDIM} dimensions and fewer than 2**62 bytes (each empty dimension counted "
                "as 1)"
            )
        return spec

    def _check_layout_format(self, path: str) -> None:
        """Refuse a dataset with a layout at *path* where the file's format predates layouts
        (an engine that appends to older files in their own version says so)."""

    def _check_parents_are_groups(self, path: str, kind: str) -> None:
        p = parent(path)
        while p:
            if p in self.catalog.datasets:
                raise ExistsError(f"cannot create {kind} {path!r}: {p!r} is a dataset, not a group")
            p = parent(p)

    def make_group(self, path: str) -> None:
        self._require_write(f"create group {path!r}")
        path = normpath(path)
        if path in self.catalog.datasets:
            raise ExistsError(f"cannot create group {path!r}: a dataset of that name exists")
        if path in self.catalog.groups:  # (as h5py: require_group takes one that exists)
            raise ExistsError(
                f"cannot create group {'/' + path!r}: a group of that name exists "
                "(require_group returns it)"
            )
        self._check_parents_are_groups(path, "group")
        op = (OP_GROUP, path)
        self.catalog.apply_op(op)
        self._pending_ops.append(op)

    def set_attr(self, path: str, name: str, value) -> None:
        self._require_write(f"set attribute {name!r}")
        op = attr_change(self.catalog, path, name, value)
        self.catalog.apply_op(op)
        self._pending_ops.append(op)

    def del_attr(self, path: str, name: str) -> None:
        self._require_write(f"delete attribute {name!r}")
        path = normpath(path)
        if name not in self.catalog.attrs.get(path, {}):
            raise NotFoundError(f"no attribute {name!r} on {path or '/'!r}")
        op = (OP_DELATTR, path, name)
        self.catalog.apply_op(op)
        self._pending_ops.append(op)

    def set_ext(self, key: str, payload: bytes) -> None:
        self._require_write(f"record {key!r}")
        op = (OP_EXT, str(key), bytes(payload))
        if len(op[2]) > MAX_ATTR_BYTES:  # readers refuse longer ones: the file would not open
            raise ValueError(
                f"extension record {key!r} of {len(op[2])} bytes exceeds the limit of {MAX_ATTR_BYTES}"
            )
        try:
            encode_op(Encoder(), op)
        except ValueError as e:
            raise ValueError(f"cannot record {key!r}: {e}") from None
        self.catalog.apply_op(op)
        self._pending_ops.append(op)

    # -------------------------------------------------------------- steps
    @property
    def in_step(self) -> bool:
        return self._in_step

    def begin_step(self) -> int:
        self._require_write("begin a step")
        if self._in_step:
            if self._implicit:  # opened by a write on this rank (create_dataset(data=) on
                # rank 0): this begin_step takes it, as the other ranks' begin the same step
                self._implicit = False
                return len(self.catalog.steps)
            raise StepError(f"step {len(self.catalog.steps)} is already open; call end_step first")
        self._log.forget()  # a write cut short before: it opened no step
        return self._open_step()

    def _open_step(self) -> int:
        """This engine's own step opens (a put's implicit step does not go through an overridden begin_step)."""
        if self._log.chunks or self._local or self._mr_pending:
            # left by a step an interrupt (Ctrl-C) cut short as it ended: none of it is this one's
            self._end_of_step()
        self._in_step = True
        self._implicit = False
        self._serial += 1
        return len(self.catalog.steps)

    def lookup(self, name: str) -> DatasetSpec:
        spec = self._spec_cache.get(name)
        if spec is not None:
            return spec
        path = normpath(name)
        spec = self.catalog.datasets.get(path)
        if spec is None:
            raise dataset_not_found(self.catalog, path)
        if spec.id < 0:  # a reader's own (a derived layer's): the file may define the name later
            return spec
        self._spec_cache[name] = spec
        if spec.shape and not spec.codecs and spec.layout is None:
            self._lendable[name] = spec  # raw blocks of at least one dimension: lend may keep them
        return spec

    def _prepare(self, name: str, box: Box | None, what: str) -> DatasetSpec:
        """Checks common to put, put_many and put_stats (*box* within the dataset, unless
        None); opens the implicit step."""
        if self._closed or self.mode == "r":
            self._require_write(f"{what} {name!r}")
        if not self._in_step:
            self._open_step()  # implicit step, committed by the next end_step or close
            self._implicit = True
        spec = self.lookup(name)
        if box is not None and not box.inside(spec.shape):
            box.check_inside(spec.shape, f"dataset {spec.path!r}")
        return spec

    def _enter(self, spec: DatasetSpec, box: Box) -> BoxIndex:
        """Enter *box* among this rank's boxes of *spec* in this step (:func:`.staging.enter_box`)."""
        return enter_box(self._local, spec, box, len(self.catalog.steps))

    def put(self, name: str, box: Box, array: np.ndarray, copy: bool = True) -> None:
        log = self._log
        if log.putting:  # the last write call never returned: an interrupt cut it short
            log.cut = True
        log.putting = True
        try:
            spec = self._prepare(name, box, "write dataset")
            lent = not copy  # the caller's word (a cast below may make copy False as well)
            arr = array if type(array) is np.ndarray else np.asarray(array)
            # the caller's array whose memory arr is: what a lent block makes read-only (an
            # np.memmap, not the plain view of it np.asarray makes)
            mine: np.ndarray | None = array if isinstance(array, np.ndarray) else None
            bshape = box.shape
            if arr.shape != bshape:
                if arr.size == box.size and arr.ndim == 0:
                    arr = np.broadcast_to(arr, bshape)
                else:
                    raise ShapeError(
                        f"cannot write an array of shape {arr.shape} to box {box} (shape {bshape}) of dataset {spec.path!r}"
                    )
            if arr.dtype != spec.dtype or not arr.flags.c_contiguous:
                arr, private = cast(spec, arr)
                copy = copy and not private  # a cast or reordering made a private copy already
                if private:
                    mine = None
            if arr.size == 0:  # an empty box: nothing to store, nothing it could overlap
                log.putting = False
                return
            if spec.layout is not None:  # encoded at end_step, with every rank's pieces
                enter_box(self._mr_local, spec, box, len(self.catalog.steps))
                self._mr_pending.setdefault(spec.id, []).append((box, arr.copy() if copy else arr))
                if lent and mine is not None:
                    self._lent.hold(mine)
                log.putting = False
                return
            if lent and arr.nbytes <= SMALL and arr.ndim and not spec.codecs:
                # lent, small and raw: kept as it is until the commit enters and stages it with
                # the step's other lent blocks (_flush_lent), as ADIOS2 defers a Put; the
                # caller's array is read-only until then, so that a change too early fails,
                # not corrupts
                self._lent.add(spec, box.start, arr, mine)
                log.putting = False
                return
            index = self._enter(spec, box)
            try:
                self._put(spec, box.start, box.stop, arr, copy)
            except BaseException:
                index.pop()  # a put that failed wrote nothing: the box may be written again
                raise
            if lent and mine is not None and arr.nbytes > SMALL:
                self._lent.hold(mine)  # kept by reference (staged blocks were copied)
        except Exception:
            # raised by the checks, or by a codec before the block was logged: nothing of it
            # is kept (an I/O failure is kept in _put_error)
            log.putting = False
            raise
        log.putting = False

    def lend(self, name: str, start: tuple[int, ...], array: np.ndarray) -> bool:
        """Independent: keep a small raw block lent inside a step, as :meth:`put` keeps it.

        Taken: a block of a dataset already written through ``put`` or looked up
        (raw, of at least one dimension), of its dtype, C-contiguous, of
        1 to :data:`SMALL` bytes, within its bounds, at a corner of ints.  The
        checks ``put`` makes for such a block, spelled out, without a box:
        about a third of ``put``'s cost.  Anything else is left to ``put``.
        """
        spec = self._lendable.get(name)
        if spec is None or not self._in_step or self._closed or array.dtype is not spec.dtype:
            return False
        # (not marked under way as put is: its one caller, Dataset.write, marks the whole call,
        # and an interrupt in it reaches this step through cut_step)
        return self._lent.take(spec, start, array)

    def put_many(self, name: str, starts, arrays, copy: bool = True) -> None:
        """Independent: many blocks of *name* in one call (:mod:`.batch`), checked as a whole.

        A bad block (shape, dtype, bounds, overlap) raises before any block
        of the call is stored.  Small raw blocks given stacked are staged
        with one copy per staging chunk instead of one ``put`` each.
        """
        self._log.call(self._put_many, name, starts, arrays, copy)

    def _put_many(self, name: str, starts, arrays, copy: bool) -> None:
        spec = self._prepare(name, None, "write dataset")
        batch = check_batch(spec, starts, arrays)
        n = len(batch)
        if not n:
            return
        lent = not copy  # the caller's arrays not cast (batch.lent) are kept by reference
        copy = copy and not batch.owned
        step = len(self.catalog.steps)
        if spec.layout is not None:  # encoded at end_step, with every rank's pieces
            enter_boxes(self._mr_local, spec, batch.starts, batch.stops, step)
            pending = self._mr_pending.setdefault(spec.id, [])
            for k, box in enumerate(batch.boxes()):
                a = batch.block(k)
                pending.append((box, a.copy() if copy else a))
            if lent:
                self._hold_batch(batch)
            return
        enter_boxes(self._local, spec, batch.starts, batch.stops, step)
        try:
            self._put_batch(spec, batch, copy)
        except Exception as e:
            # some blocks may be staged or written already: this step cannot commit (an
            # interrupt leaves _log.putting set, which says so)
            if self._put_error is None:
                self._put_error = e
            raise
        if lent and (spec.codecs or int(batch.nbytes.max()) > SMALL):  # not all staged (copied)
            self._hold_batch(batch)

    def _hold_batch(self, batch: Batch) -> None:
        """The caller's arrays of *batch*, lent and kept by reference: read-only until the step
        ends (each not cast: one block cast in a list left the others writeable)."""
        for a in batch.lent:
            self._lent.hold(a)

    def _put_batch(self, spec: DatasetSpec, batch: Batch, copy: bool) -> None:
        b = int(batch.nbytes[0])
        if not spec.codecs and b <= SMALL:
            if isinstance(batch.arrays, np.ndarray):  # stacked: back to back already
                self._stage_run(
                    spec, batch.starts, batch.stops, b, batch.arrays.reshape(-1).view(np.uint8)
                )
                return
            shapes = batch.stops - batch.starts
            if spec.ndim and bool((shapes == shapes[0]).all()):  # a list of one shape
                self._stage_run(spec, batch.starts, batch.stops, b, batch.arrays)
                return
            if int(batch.nbytes.max()) <= SMALL:  # small blocks of several shapes
                self._stage_each(spec, batch)
                return
        starts = map(tuple, batch.starts.tolist())
        stops = map(tuple, batch.stops.tolist())
        for k, (a, z) in enumerate(zip(starts, stops, strict=True)):  # each as put stores it
            self._put(spec, a, z, batch.block(k), copy)

    def _stage_run(self, spec: DatasetSpec, starts, stops, b: int, data) -> None:
        """Rows for small raw blocks of *b* bytes each, entered already, staged a chunk at a
        time: *data* their bytes back to back, or a list of arrays of one shape."""
        log = self._log
        n = len(starts)
        first = log.add_many(spec.id, starts, stops, b, BlockCodec.RAW)
        lists = isinstance(data, list)
        k = 0
        while k < n:
            c = self._chunk_for(b)
            fit = min(n - k, (len(c.buf) - c.used) // b)
            piece = data[k : k + fit] if lists else data[k * b : (k + fit) * b]
            log.stage_run(first + k, fit, b, spec.dtype, piece, c)
            k += fit

    def _stage_each(self, spec: DatasetSpec, batch: Batch) -> None:
        """Small raw blocks of *batch* (entered already), of several shapes, staged as ``put``
        stages each: as many as the current chunk has room for with one copy."""
        n = len(batch)
        ends = np.cumsum(batch.nbytes)
        sizes = batch.nbytes.tolist()
        starts = list(map(tuple, batch.starts.tolist()))
        stops = list(map(tuple, batch.stops.tolist()))
        ids = [spec.id] * n
        k = 0
        while k < n:
            c = self._chunk_for(sizes[k])
            base = int(ends[k - 1]) if k else 0
            j = int(np.searchsorted(ends, base + len(c.buf) - c.used, side="right"))
            j = min(max(j, k + 1), n)
            arrays = batch.arrays[k:j]  # (a list: stacked blocks are of one shape)
            self._log.add_staged_each(ids[k:j], starts[k:j], stops[k:j], list(arrays), c)
            k = j

    def _flush_lent(self) -> None:
        """Enter and stage the small blocks ``put`` kept with ``copy=False``, grouped by dataset
        and shape: one overlap search and one copy per staging chunk for each group.

        An overlap among them, or with another block of the step, is found here,
        when the step is committed: OverlapError naming both boxes, raised on
        every rank by the commit, which then drops the step.  The arrays are
        writeable again afterwards, whatever happens.
        """
        lent = self._lent
        if not lent:
            return
        try:
            self._stage_lent(lent)
        finally:
            lent.thaw()

    def _stage_lent(self, lent: LentBlocks) -> None:
        """Enter and stage the blocks *lent*, by dataset and block shape."""
        groups = lent.groups()
        if len(groups) == len(lent) and len({spec.id for spec, _, _ in groups}) == len(groups):
            # a block each of as many datasets (a simulation's variables): each the only lent
            # block of its dataset, staged in order with one copy per chunk
            if self._local:  # datasets that have put blocks too: their lent ones are checked
                step = len(self.catalog.steps)
                for spec, corners, arrays in groups:
                    if spec.id in self._local:
                        enter_box(
                            self._local,
                            spec,
                            box_of(corners[0], arrays[0].shape),
                            step,
                            lent_by=self.rank,
                        )
            self._stage_alone([(spec, c[0], a[0]) for spec, c, a in groups])
            return
        lent_of: collections.Counter[int] = collections.Counter()
        if len(groups) > 1:  # lent blocks per dataset, where several groups may share one
            for spec, _, arrays in groups:
                lent_of[spec.id] += len(arrays)
        step = len(self.catalog.steps)
        alone: list[tuple[DatasetSpec, tuple, np.ndarray]] = []  # staged together, in order
        for spec, corners, arrays in groups:
            if len(arrays) == 1:  # one block (of a dataset written once in the step): as put would
                start, arr = corners[0], arrays[0]
                if spec.id in self._local or lent_of[spec.id] > 1:  # other blocks: checked
                    enter_box(self._local, spec, box_of(start, arr.shape), step, lent_by=self.rank)
                # else the dataset's only block in the step: nothing to meet, and nothing
                # enters the index after the commit that flushes it (the step forgets it then)
                alone.append((spec, start, arr))
                continue
            self._stage_alone(alone)
            n, nd = len(arrays), spec.ndim
            starts = np.fromiter(_chain(corners), np.int64, n * nd).reshape(n, nd)
            stops = starts + np.array(arrays[0].shape, dtype=np.int64)
            enter_boxes(self._local, spec, starts, stops, step, lent_by=self.rank)
            self._stage_run(spec, starts, stops, arrays[0].nbytes, arrays)
        self._stage_alone(alone)

    def _stage_alone(self, alone: list[tuple[DatasetSpec, tuple, np.ndarray]]) -> None:
        """Stage lent blocks of one each ``(definition, corner, array)``, entered already: as
        many as the current chunk holds at a time with one copy (many datasets of one block
        each, a simulation's variables), the others one by one; *alone* is emptied."""
        log = self._log
        k, n = 0, len(alone)
        while k < n:
            spec, start, arr = alone[k]
            c = self._chunk_for(arr.nbytes)
            room = len(c.buf) - c.used
            j = k
            while j < n and alone[j][2].nbytes <= room:
                room -= alone[j][2].nbytes
                j += 1
            if j - k < 2:  # one fits (or none more): as put stages it
                log.add_staged(spec.id, start, _stop(start, arr.shape), arr, c)
                k += 1
                continue
            part = alone[k:j]
            log.add_staged_each(
                [s.id for s, _, _ in part],
                [a for _, a, _ in part],
                [_stop(a, x.shape) for _, a, x in part],
                [x for _, _, x in part],
                c,
            )
            k = j
        alone.clear()

    def _put(self, spec: DatasetSpec, start, stop, arr: np.ndarray, copy: bool) -> None:
        log = self._log
        nbytes = arr.nbytes
        if spec.codecs:
            pipe = codec_mod.pipeline(spec.codecs)
            # zfp cannot represent NaN or inf (it would store other numbers): such blocks go raw
            finite = not pipe.finite_only or bool(np.isfinite(arr).all())
            what = f"dataset {spec.path!r} block {Box(start, stop)}"
            payload = None
            if finite:
                try:
                    payload = pipe.encode(arr, what)
                except codec_mod.CodecLimitError:
                    pass  # beyond what a codec's format or library takes: stored raw
            kept = arr  # the values a read of the block returns
            if payload is not None and pipe.lossy and (self._with_stats or pipe.tolerance):
                # a lossy codec stores other values than those written: decoded once, for
                # statistics of the values every read returns (queries prune and decide by
                # them) and to hold zfp to its error bound, which it may miss in corner cases
                kept = pipe.decode(payload, arr.dtype, arr.shape, what)
                if pipe.tolerance and not codec_mod.within(kept, arr, pipe.tolerance):
                    payload = None  # stored raw, exactly
                    kept = arr
            if payload is not None and len(payload) < nbytes:
                st = stats_mod.compute(kept, 0, checksum=False)[0] if self._with_stats else None
                self._add_encoded(spec, start, stop, payload, BlockCodec.PIPELINE, st)
                return
            # incompressible, not finite for zfp, beyond its bound or beyond a codec's limits
            # (zfp's header, LZ4's and Blosc's buffers): stored raw, like ADIOS
        if nbytes <= SMALL:
            log.add_staged(spec.id, start, stop, arr, self._chunk_for(nbytes))
        else:
            payload, job, loc = self._place(spec, arr, copy, start)
            log.add(spec.id, start, stop, nbytes, BlockCodec.RAW, payload, job, loc)

    def put_stats(self, name: str, box: Box, array: np.ndarray) -> None:
        """Independent: record the statistics of *array* as a block of *name* without storing its data.

        The block (codec :data:`BlockCodec.STATS_ONLY`, zero bytes) takes part in
        the step like any other: boxes may not overlap, and queries prune with
        its statistics.  Reading its values is up to a layer that can compute
        them (the derived layer).
        """
        self._log.call(self._put_stats, name, box, array)

    def _put_stats(self, name: str, box: Box, array: np.ndarray) -> None:
        spec = self._stats_only(name, box)
        arr = np.asarray(array)
        if arr.shape != box.shape:
            raise ShapeError(
                f"statistics of an array of shape {arr.shape} for box {box} (shape {box.shape}) of dataset {spec.path!r}"
            )
        if box.empty:
            return
        check_dtype(spec, arr.dtype, f"statistics of box {box}")  # the casts put makes
        index = self._enter(spec, box)
        try:
            st, _ = stats_mod.compute(arr.astype(spec.dtype, copy=False), 0, checksum=False)
        except BaseException:
            index.pop()
            raise
        self._add_stats_only(spec, box.start, box.stop, st)

    def _stats_only(self, name: str, box: Box | None) -> DatasetSpec:
        """The dataset *name* for statistics-only blocks (ConfigError for a multiresolution
        layout, whose statistics come from its data)."""
        spec = self._prepare(name, box, "write statistics of dataset")
        if spec.layout is not None:
            raise ConfigError(
                f"dataset {spec.path!r} has a multiresolution layout: its statistics come from its data"
            )
        return spec

    def _add_stats_only(self, spec: DatasetSpec, start: tuple, stop: tuple, st: Stats) -> None:
        """Log a statistics-only block (entered already): zero bytes, nothing to move."""
        self._log.add(
            spec.id,
            start,
            stop,
            0,
            BlockCodec.STATS_ONLY,
            None,
            _Done((st, (0,))),
            (self.session, 0, 0),
        )

    def put_stats_many(self, name: str, starts, arrays) -> None:
        """Independent: :meth:`put_stats` for many blocks of *name*, checked as a whole.

        A bad block (shape, dtype, bounds, overlap) raises before any block of
        the call is recorded; the statistics of blocks of up to :data:`SMALL`
        bytes are taken together (:func:`lamina.stats.summarize`).
        """
        self._log.call(self._put_stats_many, name, starts, arrays)

    def _put_stats_many(self, name: str, starts, arrays) -> None:
        spec = self._stats_only(name, None)
        batch = check_batch(spec, starts, arrays)
        n = len(batch)
        if not n:
            return
        enter_boxes(self._local, spec, batch.starts, batch.stops, len(self.catalog.steps))
        try:
            blocks = [batch.block(k) for k in range(n)]
            if int(batch.nbytes.max()) <= SMALL:
                summary = stats_mod.summarize(blocks, checksum=False)
                sts = [summary.stats(k) for k in range(n)]
            else:
                sts = [stats_mod.compute(a, 0, checksum=False)[0] for a in blocks]
        except Exception as e:  # entered, not recorded: this step cannot commit
            if self._put_error is None:
                self._put_error = e
            raise
        starts_ = map(tuple, batch.starts.tolist())
        stops_ = map(tuple, batch.stops.tolist())
        for a, z, st in zip(starts_, stops_, sts, strict=True):
            self._add_stats_only(spec, a, z, st)

    def put_block(
        self,
        spec: DatasetSpec,
        box: Box,
        payload: bytes,
        stats: Stats | None,
        amax: float = math.inf,
    ) -> None:
        """Independent: one encoded block of a layout (:data:`BlockCodec.MULTIRES`) with its
        statistics and its largest coefficient magnitude (*amax*, inf: unknown)."""
        index = self._enter(spec, box)
        try:
            self._add_encoded(
                spec,
                box.start,
                box.stop,
                payload,
                BlockCodec.MULTIRES,
                stats if self._with_stats else None,
                float(amax),
            )
        except BaseException:
            index.pop()
            raise

    def _add_encoded(
        self,
        spec: DatasetSpec,
        start,
        stop,
        payload: bytes,
        codec: BlockCodec,
        st: Stats | None,
        amax: float | None = None,
    ) -> None:
        """Log an encoded block: its checksums, its place (written now by an aggregator), its statistics."""
        crcs = stats_mod.segment_crcs(payload, self.segment) if self.CHECKSUMS else (0,)
        loc = self._place_payload(payload)
        self._log.add(
            spec.id, start, stop, len(payload), codec, payload, _Done((st, crcs)), loc, amax
        )

    def aggregator_ranks(self) -> list[int]:
        """The ranks whose blocks land in a subfile of their own (each rank, unless the engine aggregates)."""
        return list(range(self.size))

    def _flush_layouts(self, step: int) -> None:
        """Collective: encode this step's pieces of multiresolution datasets into level blocks."""
        specs = self.catalog.layered
        if specs and self.size > 1 and not comm_mod.same_everywhere(self.comm, self._serial):
            # ranks a step apart would encode one rank's step k with another's k + 1 (and
            # blame boxes that never met): the verdict the commit would give, given first
            serials = comm_mod.allgather_bytes(self.comm, self._serial.to_bytes(8, "little"))
            _check_steps_alike([int.from_bytes(b, "little") for b in serials])
        self.layout_reports = layout_write.flush(
            self, specs, self._mr_pending, self.catalog.levels, step, self._with_stats
        )
        self._mr_pending = {}

    def _chunk_for(self, nbytes: int) -> Chunk:
        """The staging chunk the next *nbytes* go into: the current one if it has room, else a
        new one (the current one, full, is sealed first unless its statistics started)."""
        chunks = self._log.chunks
        c = chunks[-1] if chunks else None
        if c is not None and c.job is None and c.summaries is None:
            if c.used + nbytes <= len(c.buf):
                return c
            self._seal(c)  # full: written (aggregators) while its statistics are computed
        c = self._new_chunk()
        chunks.append(c)
        return c

    def _new_chunk(self) -> Chunk:
        if self._free_chunks:
            return Chunk(buf=self._free_chunks.pop())
        return Chunk()

    def _recycle(self, c: Chunk) -> None:
        """The bytes of *c* are stored: its buffer may take the next blocks (its statistics stay)."""
        if len(c.buf) and len(self._free_chunks) < 4:
            self._free_chunks.append(c.buf)
        c.set_buffer(np.empty(0, dtype=np.uint8))

    def _interrupts_held(self) -> AbstractContextManager:
        """Ctrl-C held through a collective call's protocol (:class:`~lamina.comm.HeldInterrupts`;
        nothing to hold on one rank)."""
        return comm_mod.HeldInterrupts() if self.size > 1 else nullcontext()

    def end_step(self) -> None:
        self._require_write("end a step")
        # (from the agreement on: a rank interrupted once it completed went its way, the others
        # on to the exchanges of the commit, waiting for it there for ever)
        with self._interrupts_held():
            self._end_step()

    def _end_step(self) -> None:
        # a step opened implicitly by a write exists only on the ranks that wrote:
        # decide together, so every rank commits it (ranks that wrote nothing add no blocks)
        try:
            active = comm_mod.agree(
                self.comm, None, flag=int(self._in_step), call=comm_mod.CALL_END_STEP
            )
        except CollectiveMismatchError:
            # the ranks were in different calls: the step is dropped here, as any end_step
            # that raises drops it (close would commit it with the others' next step)
            if self._in_step:
                self.discard_step()
            raise
        if not active:
            raise StepError("end_step called without begin_step")
        self._join_step()
        self._commit(KIND_STEP)

    def skip_steps(self, n: int) -> None:
        self._serial += n

    def _join_step(self) -> None:
        """A step another rank opened: this rank takes part in it (with no blocks of its own)."""
        if not self._in_step:
            self._in_step = True
            self._serial += 1

    # ---------------------------------------------------------- commit
    def _local_heads(self) -> tuple[int, bytes, RankHead]:
        """Phase 1 on this rank: the digest of its collective metadata changes, its attribute
        changes (encoded) and its blocks (one :class:`RankHead` for every dataset), as
        :meth:`_unpack_heads` gives them back."""
        if self._in_step and self._cut_short():
            raise StepError(
                f"step {len(self.catalog.steps)} of {self.path!r} is not committed: a write "
                f"into it on rank {self.rank} was interrupted before it returned; the steps "
                "before it are intact"
            )
        self._flush_lent()
        if self._put_error is not None:  # put could not store a block: the step cannot commit
            raise self._put_error
        log = self._log
        if not log.consistent():  # (what _cut_short prevents: never a record of a torn log)
            raise StepError(
                f"step {len(self.catalog.steps)} of {self.path!r} is not committed: the blocks "
                f"put on rank {self.rank} were left inconsistent by a write that failed partway"
            )
        for c in log.chunks:  # the last chunk's statistics start now, while the heads travel
            self._summarize(c)
        ops = Encoder()
        for op in self._pending_ops:
            if op[0] not in ATTR_OPS:
                encode_op(ops, op)
        attrs = Encoder()
        final = attribute_changes(self._pending_ops)
        attrs.u32(len(final))
        for op in final:
            encode_op(attrs, op)
        specs = self.catalog.specs
        ndims = {did: specs[did].ndim for did in log.rows}
        start, stop = log.boxes_by_row(ndims, max(ndims.values(), default=0))
        located, session, agg, offset = log.locations()  # every row's
        mine = RankHead(
            np.array(log.ds, dtype=np.int64),
            start,
            stop,
            np.array(log.length, dtype=np.int64),
            np.array(log.codec, dtype=np.uint8),
            located,
            session,
            agg,
            offset,
        )
        # the metadata changes' checksum, and this rank's step count above it (_validate)
        digest = stats_mod.crc(ops.getvalue()) | (self._serial & 0xFFFFFFFF) << 32
        return digest, attrs.getvalue(), mine

    @staticmethod
    def _pack_heads(digest: int, attrs: bytes, mine: RankHead) -> bytes:
        """This rank's heads as the bytes other ranks decode (:meth:`_unpack_heads`)."""
        e = Encoder()
        e.u64(digest)
        e.blob(attrs)
        e.u32(len(mine.did))
        e.u32(mine.start.shape[1])
        e.array(mine.did, "<i8")
        e.array(mine.start, "<i8")
        e.array(mine.stop, "<i8")
        e.array(mine.length, "<i8")
        e.array(mine.codec, "u1")
        e.array(mine.located, "u1")
        e.array(mine.session, "<u4")
        e.array(mine.agg, "<u4")
        e.array(mine.offset, "<i8")
        return e.getvalue()

    def _unpack_heads(self, r: int, raw: bytes) -> tuple[int, bytes, RankHead]:
        """Rank *r*'s heads from its bytes; FormatError or CollectiveMismatchError if they
        cannot be this step's."""
        d = Decoder(raw, f"step heads from rank {r}")
        digest = d.u64()
        attrs = d.blob()
        n = d.count(34, name="blocks")
        width = d.u32()
        if width > MAX_NDIM:
            raise FormatError(f"step heads from rank {r}: boxes of {width} dimensions")
        did = d.array("<i8", n)
        specs = self.catalog.specs
        if n:  # the datasets written (a set of a few ids costs less than numpy's unique)
            ids = sorted(set(did.tolist())) if n <= 64 else np.unique(did).tolist()
            if ids[0] < 0 or ids[-1] >= len(specs):
                bad = ids[-1] if ids[0] >= 0 else ids[0]
                raise CollectiveMismatchError(
                    f"rank {r} wrote dataset id {bad}, unknown on rank {self.rank}"
                )
            if max(specs[x].ndim for x in ids) > width:
                raise FormatError(f"step heads from rank {r}: boxes narrower than their datasets")
        mine = RankHead(
            did,
            d.array("<i8", n * width).reshape(n, width),
            d.array("<i8", n * width).reshape(n, width),
            d.array("<i8", n),
            d.array("u1", n),
            d.array("u1", n).view(np.bool_),
            d.array("<u4", n),
            d.array("<u4", n),
            d.array("<i8", n),
        )
        d.expect_end()
        return digest, attrs, mine

    def _heads_of(self, parts: list[tuple[int, bytes, RankHead]]) -> StepHeads:
        """Every rank's heads (rank order) as one :class:`StepHeads`; the record's metadata."""
        heads = StepHeads()
        changes: list[list[tuple]] = []
        for r, (digest, attrs, mine) in enumerate(parts):
            heads.digests.append(digest)
            a = Decoder(attrs, f"attribute changes of rank {r}")
            changes.append([decode_op(a) for _ in range(a.count(2, name="changes"))])
            heads.ranks.append(mine)
        # the record's metadata: the collective changes (the same on every rank, checked by
        # _validate), then the attribute changes any subset of ranks made, merged
        self._commit_ops = [op for op in self._pending_ops if op[0] not in ATTR_OPS]
        self._commit_ops += merge_attribute_changes(changes)
        return heads

    def _said_changes(self) -> str:
        """This rank's collective metadata changes since the last commit, in words (for the
        message of ranks that made different ones)."""
        said = []
        for op in self._pending_ops:
            if op[0] == OP_GROUP:
                said.append(f"create_group {'/' + op[1]!r}")
            elif op[0] == OP_DATASET:
                said.append(f"create_dataset {'/' + op[1].path!r}")
            elif op[0] == OP_EXT:
                said.append(f"a definition {op[1]!r}")
        shown = ", ".join(said[:4]) + (f" and {len(said) - 4} more" if len(said) > 4 else "")
        return shown or "none"

    def _validate(self, heads: StepHeads, step: int) -> None:
        if self.size == 1:
            return  # one rank's boxes were tested against each other at put
        if step >= 0:  # (a step's commit)
            _check_steps_alike([dg >> 32 for dg in heads.digests])
        digests = [dg & 0xFFFFFFFF for dg in heads.digests]
        bad = [r for r, dg in enumerate(digests) if dg != digests[0]]
        if bad:
            raise CollectiveMismatchError(
                f"ranks {bad} made different metadata changes (create_dataset/create_group/attrs) "
                "than rank 0 before this commit; collective calls need the same arguments on every "
                f"rank (rank {self.rank} made: {self._said_changes()})"
            )
        rows = [h.by_dataset() for h in heads.ranks]
        for did in sorted(set().union(*rows)):
            parts = [(r, sel[did]) for r, sel in enumerate(rows) if did in sel]
            if len(parts) < 2:
                continue  # one rank's boxes were tested at put
            nd = self.catalog.specs[did].ndim
            boxes = [
                (heads.ranks[r].start[at, :nd], heads.ranks[r].stop[at, :nd]) for r, at in parts
            ]
            if _hulls_apart(boxes):
                continue  # no box of one rank can meet a box of another
            check_ranks_disjoint(
                np.concatenate([a for a, _ in boxes]),
                np.concatenate([b for _, b in boxes]),
                np.concatenate(
                    [np.full(len(a), r) for (r, _), (a, _) in zip(parts, boxes, strict=True)]
                ),
                f"dataset {self.catalog.specs[did].path!r}, step {step}",
            )

    def _local_trailer(self, bases: list[tuple[int, int, int, int]]) -> tuple[list, tuple]:
        """Phase 3 on this rank: where it placed other ranks' blocks (*bases*), and the
        statistics and checksums of every block it put, in put order (the columns of
        :meth:`_unpack_trailer`): seg, ncrc, crcs, has_stats, min, max (their 8 bytes),
        sum, count, and the coefficient magnitudes of bands (None if it put none)."""
        log = self._log
        specs = self.catalog.specs
        cols = log.step_stats(
            {did: specs[did].dtype for did in log.rows},
            self.segment,
            self.CHECKSUMS,
            self._with_stats and self._stats_in_record,
            # stats=False spares the statistics of data; a statistics-only block (a derived
            # quantity kept as statistics) holds nothing else, so it keeps them
            stats_only=self._stats_in_record,
        )
        amax = None
        for did, rows in log.rows.items():
            if specs[did].layout is not None:  # bands: their coefficient magnitudes
                if amax is None:
                    amax = np.full(len(log), np.inf)
                mags = log.amax.get(did, [])
                if len(mags) == len(rows):
                    amax[index_of(rows)] = mags
        return bases, (*cols, amax)

    def _pack_trailer(self, bases: list[tuple[int, int, int, int]], cols: tuple) -> bytes:
        """This rank's trailer as the bytes rank 0 decodes (:meth:`_unpack_trailer`)."""
        e = Encoder()
        e.u32(len(bases))
        for member, session, agg, base in bases:
            e.u32(member)
            e.u32(session)
            e.u32(agg)
            e.u64(base)
        segs, ncrc, flat, has, smin, smax, ssum, count, amax = cols
        e.u32(len(segs))
        e.u64(len(flat))
        e.u8((ssum.dtype.kind == "c") | (amax is not None) << 1)
        e.array(segs, "<i8")
        e.array(ncrc, "<u4")
        e.array(flat, "<u4")
        e.array(has, "u1")
        e.array(smin, "<u8")
        e.array(smax, "<u8")
        e.array(ssum, ssum.dtype.newbyteorder("<"))
        e.array(count, "<i8")
        if amax is not None:
            e.array(amax, "<f8")
        return e.getvalue()

    def _unpack_trailer(self, r: int, raw: bytes) -> tuple[list, tuple]:
        """Rank *r*'s trailer from its bytes (FormatError if they cannot be one)."""
        d = Decoder(raw, f"step trailer from rank {r}")
        bases = [(d.u32(), d.u32(), d.u32(), d.u64()) for _ in range(d.count(20, name="bases"))]
        n = d.count(45, name="blocks")
        ncrcs, flags = d.u64(), d.u8()
        cols = (
            d.array("<i8", n),
            d.array("<u4", n),
            d.array("<u4", ncrcs),
            d.array("u1", n).view(np.bool_),
            d.array("<u8", n),
            d.array("<u8", n),
            d.array("<c16" if flags & 1 else "<f8", n),
            d.array("<i8", n),
            d.array("<f8", n) if flags & 2 else None,
        )
        d.expect_end()
        if int(cols[1].sum(dtype=np.int64)) != ncrcs:
            raise FormatError(f"step trailer from rank {r}: checksum counts do not add up")
        return bases, cols

    def _build_record(
        self, kind: int, step: int, heads: StepHeads, trailers: list[tuple[list, tuple]]
    ) -> Record:
        """Rank 0: the step's record, one :class:`StepTable` of every dataset's blocks (by
        dataset, then rank, then put order)."""
        # where each rank's unplaced blocks went: base offsets from the ranks that placed them
        bases: dict[int, tuple[int, int, int]] = {}
        for placed, _ in trailers:
            for member, sess, ag, base in placed:
                bases[member] = (sess, ag, base)
        parts = []
        extents: list[tuple[int, int, int]] = []  # (session, aggregator, end) of each part
        for r, h in enumerate(heads.ranks):
            n = len(h.did)
            if not n:
                continue
            segs, ncrc, crcs, has, smin, smax, ssum, count, amax = trailers[r][1]
            if len(segs) != n:
                raise FormatError(f"step trailer from rank {r}: not one row per block of its head")
            session, agg, offset = h.session, h.agg, h.offset
            rows, lengths = heads.unplaced(r)
            streamed = False
            if rows.size and r in bases:  # the rank's stream of unplaced blocks, from its base
                s, a, base = bases[r]
                offs = lengths.cumsum()  # each block's end, then its start
                end = base + int(offs[-1])  # where the stream ends
                offs -= lengths
                offs += base
                if len(rows) == n:  # every block moved (staged small blocks, the common case)
                    offset = offs
                    session, agg = filled(n, s, np.uint32), filled(n, a, np.uint32)
                    streamed = True
                    if end > base:  # (a stream of statistics-only blocks holds no byte)
                        extents.append((s, a, end))
                else:
                    session, agg, offset = session.copy(), agg.copy(), offset.copy()
                    offset[rows] = offs
                    session[rows], agg[rows] = s, a
            if not streamed:
                extents.extend(column_extents(h.length, session, agg, offset))
            parts.append(
                dict(
                    did=h.did,
                    start=h.start,
                    stop=h.stop,
                    rank=filled(n, r, np.uint32),
                    session=session,
                    agg=agg,
                    offset=offset,
                    length=h.length,
                    codec=h.codec,
                    seg=segs,
                    ncrc=ncrc,
                    crcs=crcs,
                    has_stats=has,
                    smin=smin,
                    smax=smax,
                    ssum=ssum,
                    count=count,
                    amax=amax,
                )
            )
        columns = StepTable.join(parts)
        columns.ends = merge_extents(extents)
        return Record(
            kind,
            step,
            self.session,
            self.size,
            time.time(),
            list(self._commit_ops),
            columns=columns,
        )

    def _waits_after_move(self, heads) -> bool:
        """Whether this rank may wait long for the others after the move (then it waits quietly)."""
        return False

    def _commit_phases(self, kind: int, step: int) -> bytes:
        """The four phases of a commit (heads, validate, move, record); what rank 0 shared."""
        g = comm_mod.Guard()
        local = None
        packed = b""
        with g:
            local = self._local_heads()
            if self.size > 1:
                packed = self._pack_heads(*local)
        comm_mod.agree(self.comm, g.error)
        assert local is not None
        if self.size == 1:  # nothing to exchange: no bytes made and decoded again
            heads = self._heads_of([local])
        else:
            raws = comm_mod.allgather_bytes(self.comm, packed)
            heads = self._heads_of(  # this rank's own heads as it made them, not decoded again
                [
                    local if r == self.rank else self._unpack_heads(r, raw)
                    for r, raw in enumerate(raws)
                ]
            )
        self._validate(heads, step)  # same verdict on every rank

        g = comm_mod.Guard()
        bases: list = []
        with g:
            bases = self._move(heads)
        comm_mod.agree(self.comm, g.error, quiet=self._waits_after_move(heads))

        g = comm_mod.Guard()
        mine: tuple[list, tuple] = ([], ())
        packed = b""
        with g:
            mine = self._local_trailer(bases)
            if self.size > 1 and self.rank != 0:  # rank 0 keeps its own as it made it
                packed = self._pack_trailer(*mine)
        comm_mod.agree(self.comm, g.error)
        gathered = None
        if self.size > 1:
            gathered = comm_mod.gather_bytes(self.comm, packed, root=0)

        def parts() -> tuple[StepHeads, list[tuple[list, tuple]]]:
            trailers = [mine]
            if gathered is not None:  # gathered on rank 0 (its own not sent)
                trailers += [self._unpack_trailer(r, raw) for r, raw in enumerate(gathered) if r]
            return heads, trailers

        return self._share_record(kind, step, parts)

    def _commit_gathered(self, kind: int, step: int) -> bytes:
        """A commit where every rank places its own blocks (:meth:`_places_own_blocks`): each
        rank writes its blocks (:meth:`_move` with its own heads alone) and sends its heads
        and trailer to rank 0 in one message; rank 0 checks the step as every rank would
        (:meth:`_validate`), writes the record and shares it.  Two collective exchanges
        (a gather, a broadcast) instead of four; an error anywhere, rank 0's verdict
        included, is raised on every rank by the :func:`~lamina.comm.agree` after each
        phase.  A step refused by that verdict leaves bytes no record names in the subfiles,
        as a refused step's sealed chunks always have."""
        g = comm_mod.Guard()
        local: tuple[int, bytes, RankHead] | None = None
        mine: tuple[list, tuple] | None = None
        packed = b""
        with g:
            local = self._local_heads()
            own = StepHeads()
            own.ranks = [local[2]] * self.size  # _move asks for this rank's alone
            mine = self._local_trailer(self._move(own))
            if self.rank != 0:
                e = Encoder()
                e.blob(self._pack_heads(*local))
                e.blob(self._pack_trailer(*mine))
                packed = e.getvalue()
        comm_mod.agree(self.comm, g.error)
        gathered = comm_mod.gather_bytes(self.comm, packed, root=0)

        def parts() -> tuple[StepHeads, list[tuple[list, tuple]]]:
            assert local is not None and mine is not None and gathered is not None
            every, trailers = [local], [mine]
            for r in range(1, self.size):
                d = Decoder(gathered[r], f"step heads and trailer from rank {r}")
                every.append(self._unpack_heads(r, d.blob()))
                trailers.append(self._unpack_trailer(r, d.blob()))
                d.expect_end()
            heads = self._heads_of(every)
            self._validate(heads, step)
            return heads, trailers

        return self._share_record(kind, step, parts)

    def _share_record(
        self, kind: int, step: int, parts: Callable[[], tuple[StepHeads, list]]
    ) -> bytes:
        """The last phase of a commit: rank 0 builds the record of what *parts()* gives it
        (the step's heads and every rank's trailer) and writes it; every rank gets its bytes
        (an error on rank 0 raised on every rank instead)."""
        g = comm_mod.Guard()
        shared = None
        with g:
            if self.rank == 0:
                heads, trailers = parts()
                shared = self._write_record(self._build_record(kind, step, heads, trailers))
        comm_mod.agree(self.comm, g.error)
        return comm_mod.bcast_bytes(self.comm, shared, root=0)

    def _places_own_blocks(self) -> bool:
        """Whether every rank places its own blocks, so that no block's bytes cross ranks at
        a commit (then :meth:`_commit` takes two phases: :meth:`_commit_gathered`).  By
        default False."""
        return False

    def _commit(self, kind: int) -> None:
        """Collective: the phases described in the module docstring.  Called with Ctrl-C held
        (:meth:`_interrupts_held`, by the caller, from its agreement on): raised between two
        exchanges of one rank, it left the others waiting for ever in the next."""
        step = len(self.catalog.steps) if kind == KIND_STEP else -1
        interrupted: BaseException | None = None
        try:
            if kind == KIND_STEP:
                self._flush_layouts(step)
            if self.size > 1 and self._places_own_blocks():
                shared = self._commit_gathered(kind, step)
            else:
                shared = self._commit_phases(kind, step)
        except BaseException as e:
            # an interrupt (Ctrl-C) after this rank wrote the record: the step is committed
            written = None if isinstance(e, Exception) else self._record_out()
            if written is None:
                # every error here is raised on all ranks alike (agree, or the same verdict);
                # an interrupt before the record discards the step as an error does (it stayed
                # open, and a later close committed it)
                self.discard_step()
                if isinstance(e, CollectiveMismatchError):
                    # ranks disagree on the metadata: none of it can be committed, ever; undo it
                    # here so that the file goes on (later steps and close commit) as of the last
                    self._undo_metadata()
                if isinstance(e, Exception):
                    mark_collective(e)
                raise
            shared, interrupted = written, e
        try:
            rec, blocks = self._apply_committed(shared)
            for op in rec.ops:
                # other ranks' attribute changes; this rank's again (the same)
                if op[0] in ATTR_OPS:
                    self.catalog.apply_op(op, "committed record")
            self.catalog.apply_record(rec, ops_applied=True, blocks=blocks)
            if kind == KIND_CLOSE:
                self._close_recorded = True
            self._committed(shared)
            self._committed_cp = self.catalog.checkpoint()
        finally:
            # the record is out: the step is over, whatever interrupts this (a later close
            # committed its blocks again, as a step of their own)
            self._in_step = False
            self._pending_ops.clear()
            self._commit_ops = []
            self._end_of_step()
        if interrupted is not None:
            raise interrupted

    def _record_out(self) -> bytes | None:
        """The record this rank wrote for the commit under way (what it shares), once it is
        in the file; None before, or where ranks other than the writer's cannot tell."""
        return None

    def _end_of_step(self) -> None:
        """Forget this step's blocks (committed or discarded); buffers go back for the next step
        (after: an interrupt while they do leaves no block of this step to a later one)."""
        chunks = list(self._log.chunks)
        self._log.clear()
        self._local.clear()
        for c in chunks:
            if len(c.buf):
                self._recycle(c)
        self._lent.thaw()
        if self._lent.held:  # after thaw: the lent views of held arrays thaw with them
            self._lent.release()
        self._mr_pending = {}
        self._mr_local.clear()

    def _undo_metadata(self) -> None:
        """Forget the metadata changes made since the last commit, in the catalog too."""
        if self._pending_ops and self._committed_cp is not None:
            self.catalog.restore(self._committed_cp)
            self._spec_cache.clear()
            self._lendable.clear()
        self._pending_ops.clear()
        self._commit_ops = []

    @property
    def closed(self) -> bool:
        return self._closed

    def discard_step(self) -> None:
        self._log.wait()
        self._end_of_step()
        self._put_error = None
        self._in_step = False
        self._log.forget()  # (after: cut short, close drops it again)

    def cut_step(self) -> None:
        if not self._closed:
            self._log.cut = True

    def _cut_short(self) -> bool:
        """Whether a write call of the open step never returned (an interrupt cut it short,
        see ``_log.putting``): its blocks may be missing or half logged, so that the step
        is never committed (``end_step`` raises, ``close`` drops it)."""
        return self._log.cut_short()

    def _summarize(self, c: Chunk) -> None:
        """Start the statistics and checksums of the blocks staged in *c* (on the worker thread)."""
        if c.summaries is not None or c.job is not None:
            return
        if not (self._with_stats or self.CHECKSUMS):
            c.summaries = []
            return
        # a chunk of a few blocks, or of small ones, is summarized here (Chunk.worth_a_thread)
        self._log.summarize(c, self.CHECKSUMS, self.background_stats and c.worth_a_thread())

    # ---------------------------------------------------------- reading
    @property
    def bytes_read(self) -> int:
        """Stored bytes of data :meth:`get` and :meth:`get_collective` read: a raw block's
        part in the box, a coded block whole (a collective read counts each rank's box as
        if it read it alone, whichever rank read each block); a consumer of the memory
        transport counts the bytes its producers sent it."""
        return self._bytes_read

    def _count_read(self, n: int) -> None:
        """*n* stored bytes more read (:attr:`bytes_read`), under a lock: threads read one
        file at once, and an unlocked ``+=`` of two of them keeps only one."""
        with self._count_lock:
            self._bytes_read += n

    def check_step(self, step: int | None) -> int:
        if self._closed:  # as h5py: a dataset of a closed file reads nothing (nor reopens it)
            raise ValueError(f"cannot read: file {self.path!r} is closed")
        n = len(self.catalog.steps)
        if step is None:
            if n == 0:
                raise StepError(f"file {self.path!r} has no committed steps yet")
            return n - 1
        asked = step_number(step)
        step = asked + n if asked < 0 else asked
        if not 0 <= step < n:
            have = f"{n} committed step(s) (0..{n - 1}, or -{n}..-1)" if n else "no committed step"
            raise StepError(f"step {asked} does not exist in {self.path!r}: {have}")
        return step

    def check_read(
        self, name: str, box: Box, step: int | None, out: np.ndarray
    ) -> tuple[DatasetSpec, int]:
        """(spec, step) of a read of *box* of *name* into *out*, after checking all three; raises otherwise."""
        spec = self.lookup(name)
        box.check_inside(spec.shape, f"dataset {spec.path!r}")
        step = self.check_step(step)
        check_out(out, box, spec)
        return spec, step

    def get(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        spec, step = self.check_read(name, box, step, out)
        try:
            self._get(spec, box, step, out)
        except ChecksumError as e:  # (the reads name the subfile, dataset and block)
            raise ChecksumError(f"{e} (step {step})") from None

    def _get(self, spec: DatasetSpec, box: Box, step: int, out: np.ndarray) -> None:
        layout = Layout.of(spec)
        if layout is not None:
            self._count_read(layout_read.read(self, spec, layout, box, step, 0, out))
            return
        t = self.catalog.table(spec.id, step)
        if len(t) == 1 and self._read_sole(spec, t, box, out):
            return
        idx, lo, hi = t.hits(box.start, box.stop)
        if len(idx) > 1:  # blocks put together: none may hold another's values
            t.check_disjoint(f"{self.path}: dataset {spec.path!r} step {step}")
        covered, stored = t.read_cost(idx, lo, hi)
        if covered < box.size:
            out[...] = spec.fill_scalar()
        if not len(idx):
            return
        refuse_stats_only(spec, t, idx, step)
        self._read_blocks(spec, t, idx, lo, hi, box, out)
        self._count_read(stored)

    def get_collective(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        """Collective: each rank reads its own *box*; a block several ranks need is read once
        and its parts sent to them (:mod:`.collective`).  Multiresolution datasets, and a
        rank alone, read as :meth:`get` does."""
        g = comm_mod.Guard()
        spec: DatasetSpec | None = None
        with g:
            spec, step = self.check_read(name, box, step, out)
        comm_mod.agree(self.comm, g.error)
        assert spec is not None and step is not None
        self._check_same(
            f"collective read of {spec.path!r} at step {step}", f"{spec.path}\0{step}".encode()
        )
        if self.size == 1 or Layout.of(spec) is not None or spec.ndim == 0:
            self.get(name, box, step, out)
            return
        raws = comm_mod.allgather_bytes(
            self.comm, np.array([box.start, box.stop], dtype=np.int64).tobytes()
        )
        boxes = []
        for raw in raws:
            a, b = np.frombuffer(raw, dtype=np.int64).reshape(2, spec.ndim).tolist()
            boxes.append(Box(tuple(a), tuple(b)))
        t = self.catalog.table(spec.id, step)
        if not collective.fits(t, boxes, spec.dtype.itemsize):
            g = comm_mod.Guard()
            with g:
                self.get(name, box, step, out)
            comm_mod.agree(self.comm, g.error)
            return
        dst = out if out.flags.c_contiguous else np.empty(out.shape, dtype=out.dtype)
        collective.read(self, spec, t, box, step, dst, boxes)
        if dst is not out:
            out[...] = dst
        # counted as this rank's box read alone, whichever rank read each block
        self._count_read(t.read_cost(*t.hits(box.start, box.stop))[1])

    def _read_blocks(
        self,
        spec: DatasetSpec,
        t: BlockTable,
        idx: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
        box: Box,
        out: np.ndarray,
    ) -> None:
        """Fill the parts ``[lo[k], hi[k])`` of *out* (which holds *box*) from blocks ``idx[k]`` of *t*.

        By default one :meth:`_read_region` per block; engines that can read
        many blocks at once override this.
        """
        for i, a, b in zip(idx.tolist(), lo.tolist(), hi.tolist(), strict=True):
            inter = Box(tuple(a), tuple(b))
            self._read_region(
                t.record(i, spec.id, stats=False), spec, inter, out[inter.within(box)]
            )

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
        spec = self.lookup(name)
        layout = Layout.of(spec)
        step = self.check_step(step)
        if layout is None:
            if level != 0:
                raise BoundsError(f"dataset {spec.path!r} has one level (0), not level {level}")
            self.get(name, box, step, out)
            return 0
        level = layout.check_level(level, spec.path)
        layout_read.check_box(spec, layout, box, level)
        check_out(out, box, spec)
        n = layout_read.read(self, spec, layout, box, step, level, out, cache, tolerance)
        self._count_read(n)
        return n

    def payload(self, spec: DatasetSpec, t: BlockTable, row: int) -> np.ndarray:
        """Independent: the stored bytes of block *row* of table *t* of *spec*, checked against its checksums."""
        return self._payload(t.record(row, spec.id, stats=False), spec)

    def payloads(
        self,
        step: int,
        wanted: Sequence[tuple[DatasetSpec, BlockTable, np.ndarray]],
        into: np.ndarray | None = None,
    ) -> list[list[np.ndarray]]:
        """Independent: the stored bytes of many blocks of *step*, ``[spec, table, rows]`` per group, checked.

        By default one :meth:`payload` per block; engines that can read blocks
        lying back to back in storage with one request override this.  *into*: a
        uint8 buffer the engine may read into (views of it returned), for a caller
        that drops them before its next call (``lamina verify``): fresh memory costs a
        page fault per 4 KiB; engines may ignore it.
        """
        return [[self.payload(spec, t, int(r)) for r in rows.tolist()] for spec, t, rows in wanted]

    def _payload(self, rec: BlockRecord, spec: DatasetSpec) -> np.ndarray:
        raise NotImplementedError

    def decode_payload(self, rec: BlockRecord, spec: DatasetSpec, payload) -> np.ndarray:
        """Bytes of a whole block as stored -> array of the block's shape."""
        what = f"dataset {spec.path!r} block {rec.box} in {self.path}/{rec.subfile}"
        if rec.codec == BlockCodec.RAW:
            return np.frombuffer(payload, dtype=spec.dtype).reshape(rec.box.shape)
        return self._pipeline(spec).decode(bytes(payload), spec.dtype, rec.box.shape, what)

    def _pipeline(self, spec: DatasetSpec) -> codec_mod.Pipeline:
        """The codecs of *spec* as stored in the file; FormatError naming the file and the
        dataset where the file names a codec (or parameters) this lamina does not take."""
        try:
            return codec_mod.pipeline(spec.codecs)
        except CodecError as e:
            raise FormatError(
                f"{self.path}: dataset {spec.path!r} is stored with codecs this lamina cannot "
                f"use ({e})"
            ) from None

    def close(self) -> None:
        if self._closed:
            return
        if self._finished:  # an interrupt cut the release short: the rest of it
            self._let_go()
            return
        if comm_mod.has_left(self.comm):
            # another rank let go of the file (an earlier call of this rank heard it): no
            # collective call with it any more; let go here too
            try:
                self.abandon()
            finally:
                comm_mod.free(self.comm)
            return
        try:
            self._finish()
        except BaseException as e:
            if (
                not isinstance(e, Exception)
                and self.size == 1
                and self.mode != "r"
                and not self.ENDS_STREAMS
            ):
                # an interrupt (Ctrl-C) in the close of a file one process writes: nothing is
                # let go, so that close again completes it (what this one committed, a step,
                # pending metadata or the close record, is not committed twice); the file
                # stays open (and locked) until then, as a file never closed
                raise
            self._finished = True
            try:
                # the close failed on this rank: if another rank is in another collective call
                # (a program that put the ranks a step apart, its close paired with their
                # end_step), it would wait forever for this one; tell it, as a rank that leaves
                # does (ranks whose close failed together meet each other here).  Not when a
                # rank left first.
                if not is_left(e) and self.size > 1:
                    comm_mod.leave(self.comm, e)
                if self.ENDS_STREAMS:
                    # an in situ producer: its consumers hear that it failed at once, not a
                    # stream cut off that they wait on until their timeout; so too where
                    # another rank left first (each rank feeds consumer ranks of its own)
                    try:
                        self.abandon()
                    except Exception:  # noqa: BLE001 - already failing: the close's error is raised
                        pass
            finally:
                self._let_go()
            raise
        self._finished = True
        self._let_go()

    def _let_go(self) -> None:
        """The end of a close: this rank's resources go (the writer lock last), then the engine
        is closed.  An interrupt in between leaves it open: close again releases the rest
        (what is released already stays so)."""
        self._free_chunks.clear()  # (a closed engine may live on in a cycle until collected)
        self._close_storage()
        comm_mod.free(self.comm)
        self._closed = True

    def _finish(self) -> None:
        """Collective, in close, before resources go: writers commit what is pending."""
        if self.mode != "r":
            self._commit_close()
        else:
            # meets a rank that left (leave) rather than freeing under it
            comm_mod.agree(self.comm, None, call=comm_mod.CALL_CLOSE)

    def agree(self, flag: int = 0, call: int = 0) -> int:
        return comm_mod.agree(self.comm, None, flag, call=call)

    def leave(self, exc: BaseException) -> None:
        if self._closed:
            return
        comm_mod.leave(self.comm, exc)
        if not is_collective(exc):  # (every rank left at once: they close the file together)
            self.abandon()

    def _commit_close(self) -> None:
        """Collective (writers): commit the step left open on any rank and pending metadata, then the close record.

        A step that a write into was cut short on some rank (an interrupt) is
        dropped on every rank instead (nothing of it is committed: a step is
        all or nothing), as an error out of ``with lamina.open(...)`` drops it.
        """
        # (cut short here, the write may not have opened the step it was writing into)
        flag = 3 if self._cut_short() else int(self._in_step)
        with self._interrupts_held():  # (as end_step)
            open_ = comm_mod.agree(self.comm, None, flag=flag, call=comm_mod.CALL_CLOSE)
            if open_:
                self._join_step()  # (counted on every rank alike, committed or dropped)
                if open_ > 1:
                    self.discard_step()
                else:
                    self._commit(KIND_STEP)
            if comm_mod.allreduce_int(self.comm, int(bool(self._pending_ops)), "max"):
                self._commit(KIND_META)
            if not self._close_recorded:  # (a close again, after an interrupt past the record)
                self._commit(KIND_CLOSE)

    def abandon(self) -> None:
        """Independent: release this rank's resources without committing anything.

        For leaving a file after an error that other ranks may not share: a
        collective close could pair with a different collective call on
        them.  Committed steps stay intact; the current step is dropped.
        """
        if self._closed:
            return
        self.discard_step()
        self._finished = True  # (an interrupt below: close, or abandon again, releases the rest)
        self._free_chunks.clear()
        self._close_storage()
        self._closed = True

    # ---------------------------------------------------------- hooks
    def _open_storage(self, path: str, mode: str) -> None:
        raise NotImplementedError

    def _job(self, arr: np.ndarray):
        """The statistics (and checksums) job of a block not staged."""
        if not (self._with_stats or self.CHECKSUMS):
            return _Done((None, (0,)))
        return stats_mod.BlockJob(
            arr,
            self.segment if self.CHECKSUMS else 0,
            checksum=self.CHECKSUMS,
            background=self.background_stats,
        )

    def _place(self, spec: DatasetSpec, arr: np.ndarray, copy: bool, start) -> tuple:
        """A large raw block at its corner *start*, at put time: ``(payload kept, statistics
        job, location or None)``.

        By default the block is kept (a copy, or the caller's array with
        ``copy=False``) until :meth:`_move`.
        """
        if copy:
            arr = arr.copy()
        return arr, self._job(arr), None

    def _place_payload(self, payload: bytes) -> tuple[int, int, int] | None:
        """An encoded block at put time: its location if stored now, else None (kept until _move)."""
        return None

    def _seal(self, c: Chunk) -> None:
        """A staging chunk is full: by default its statistics start on the worker thread."""
        self._summarize(c)

    def _move(self, heads: StepHeads) -> list[tuple[int, int, int, int]]:
        """Collective: place every block not placed at put; return ``(rank, session, agg, base)``
        for each rank whose blocks this rank placed: they lie from *base* on, in put order."""
        raise NotImplementedError

    def _write_record(self, rec: Record) -> bytes:
        """Rank 0: make *rec* durable; return the bytes every rank applies (_apply_committed)."""
        head, area = rec.encode(self.catalog.specs)
        return pack(head, area)

    def _apply_committed(self, shared: bytes):
        """Every rank: the committed record and its blocks, from what rank 0 shared."""
        return decode_packed(shared, self.catalog, "committed record", apply_ops=False)

    def _read_region(
        self, rec: BlockRecord, spec: DatasetSpec, inter: Box, dst: np.ndarray
    ) -> None:
        raise NotImplementedError

    def _read_sole(self, spec: DatasetSpec, t: BlockTable, box: Box, out: np.ndarray) -> bool:
        """A read of the one block of a step's table, when *box* is that block: read it into
        *out* and say True, or say False and let :meth:`get` read it as any other.  For the
        engines that can do it cheaper than the general path (a dataset written as one block
        a step, read back a step at a time); by default False."""
        return False

    def _committed(self, shared: bytes) -> None:
        """Called on every rank once a record is committed (with what rank 0 shared)."""

    def _close_storage(self) -> None:
        pass


__all__ = ["BlockEngine", "RankHead", "StepHeads", "FormatError"]
