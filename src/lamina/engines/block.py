"""Logic shared by block-storing engines: definitions, validation, the step commit protocol, reads.

:class:`BlockEngine` implements everything in the engine interface except
where bytes live.  Subclasses provide four hooks:

``_open_storage(path, mode)``   collective: create/open storage, load the catalog
``_stage(p)``                   independent: take a :class:`Pending` block at put time
``_move(headers, mine)``        collective: place every pending block; return locations
``_write_record(raw)``          rank 0 only: make one metadata record durable
``_read_region(rec, spec, inter, dst)``   independent: fill *dst* with *inter* of a block

The commit of one step (``end_step``) is four collective phases:

1. **headers**: every rank encodes its pending blocks (dataset, box, stored
   length, codec) and a digest of its metadata changes; allgather.
2. **validate** (same verdict on every rank, no messages): ranks agree on
   definitions; no two boxes of one dataset overlap.
3. **move**: the engine moves block bytes to where they live (aggregators,
   memory); statistics and checksums finish on the worker threads meanwhile.
4. **commit**: trailers (statistics, checksums, locations) are gathered on
   rank 0, which writes the record (data is already durable), then
   broadcasts it; every rank applies it to its catalog.

Any failure on any rank is propagated to all ranks (:func:`lamina.comm.agree`)
so no rank is left waiting; a failed step is discarded and nothing committed
before it changes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .. import codecs as codec_mod
from .. import comm as comm_mod
from .. import stats as stats_mod
from ..catalog import (
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
    Catalog,
    DatasetSpec,
    Decoder,
    Encoder,
    Record,
    normalize_attr,
    normpath,
    parent,
)
from ..catalog.model import MAX_ATTR_BYTES, MAX_NDIM, decode_op, encode_op
from ..errors import (
    CollectiveMismatchError,
    DTypeError,
    ExistsError,
    FormatError,
    ModeError,
    NotFoundError,
    OverlapError,
    ShapeError,
    StepError,
    mark_collective,
    suggest,
)
from ..geometry import Box, find_overlap
from .base import Engine

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
class Pending:
    """A block put in the current step and not yet committed."""

    idx: int
    spec: DatasetSpec
    box: Box
    data: np.ndarray | None  # array to store (copy or caller's buffer), None once stored
    payload: bytes | None = None  # encoded bytes when the dataset has a codec
    job: stats_mod.StatsJob | None = None  # statistics and checksums, set at put
    length: int = 0
    codec: int = BlockCodec.RAW
    location: tuple[int, int, int] | None = None  # (session, agg, offset) once stored
    extra: dict = field(default_factory=dict)


@dataclass(slots=True)
class Header:
    """What every rank learns about a pending block in phase 1."""

    rank: int
    idx: int
    dataset: int
    box: Box
    length: int
    codec: int
    location: tuple[int, int, int] | None


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


class BlockEngine(Engine):
    """Common base of the memory and native engines (see module docstring)."""

    OPTIONS = COMMON_OPTIONS

    def __init__(self) -> None:
        self.catalog = Catalog()
        self._pending: list[Pending] = []
        self._boxes: dict[int, tuple] = {}  # dataset id -> (starts, stops, count) put in this step
        self._pending_ops: list[tuple] = []
        self._commit_ops: list[
            tuple
        ] = []  # the ops of the record being committed (after merging attributes)
        self._committed_cp: tuple | None = (
            None  # the catalog as of the last commit (to undo refused changes)
        )
        self._put_error: BaseException | None = (
            None  # an I/O failure in put, raised by end_step on every rank
        )
        self._in_step = False
        self._closed = False
        self.session = 0

    # ------------------------------------------------------------------ open
    def open(self, path: str, mode: str, comm, options: dict) -> None:
        if mode not in ("r", "w", "a"):
            raise ValueError(f"mode must be 'r', 'w' or 'a', got {mode!r}")
        unknown = set(options) - self.OPTIONS
        if unknown:
            raise TypeError(
                f"unknown option(s) {sorted(unknown)} for engine {self.name!r}; accepted: {sorted(self.OPTIONS)}"
            )
        seg = int(options.get("checksum_segment", stats_mod.SEGMENT))
        if seg < 0 or (seg and seg % stats_mod.CHUNK):
            raise ValueError(
                f"checksum_segment must be 0 or a multiple of {stats_mod.CHUNK} bytes, got {seg}"
            )
        self.path = str(path)
        self.mode = mode
        self.comm = comm_mod.dup(comm)
        self.rank = self.comm.rank
        self.size = self.comm.size
        self.options = dict(options)
        self.segment = seg
        self.background_stats = bool(options.get("background_stats", True))
        wait = options.get("wait", 0)
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
            raise ValueError(f"wait must be a number of seconds >= 0, got {wait!r}")
        self.wait = float(wait)  # readers: how long to wait for a file that does not exist yet
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
        """Collective: raise CollectiveMismatchError if ranks passed different *payload*."""
        if self.size == 1:
            return
        if not comm_mod.same_everywhere(self.comm, stats_mod.crc(payload)):
            raise mark_collective(
                CollectiveMismatchError(f"ranks disagree on the collective call {what}")
            )

    def define(self, spec: DatasetSpec) -> DatasetSpec:
        self._require_write(
            f"create dataset {spec.path!r}"
        )  # before any message: a closed file has no communicator
        g = comm_mod.Guard()
        with g:
            spec = self._validate_definition(spec)
        comm_mod.agree(self.comm, g.error)  # a rank that refuses must not leave the others waiting
        self._check_same(
            f"create_dataset({spec.path!r}, shape={spec.shape}, dtype={spec.dtype})",
            spec.digest_bytes(),
        )
        op = (OP_DATASET, spec)
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
        spec = DatasetSpec(
            path,
            tuple(int(n) for n in spec.shape),
            spec.dtype,
            spec.fill,
            spec.codecs,
            len(self.catalog.specs),
        )
        if (
            spec.ndim > MAX_NDIM
            or math.prod(max(1, n) for n in spec.shape) * spec.dtype.itemsize >= 1 << 62
        ):
            # readers refuse such a definition (DatasetSpec.decode): the file would not open again
            raise ShapeError(
                f"cannot create dataset {path!r} of shape {spec.shape}: the format allows at most "
                f"{MAX_NDIM} dimensions and 2**62 bytes"
            )
        return spec

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
        self._check_parents_are_groups(path, "group")
        op = (OP_GROUP, path)
        self.catalog.apply_op(op)
        self._pending_ops.append(op)

    def set_attr(self, path: str, name: str, value) -> None:
        self._require_write(f"set attribute {name!r}")
        path = normpath(path)
        if self.catalog.kind_of(path) is None:
            raise NotFoundError(f"no group or dataset {path!r} to hold attribute {name!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"attribute names are non-empty strings, got {name!r}")
        op = (OP_ATTR, path, name, normalize_attr(value))
        try:
            encode_op(Encoder(), op)  # fail here, not in every later commit (and close)
        except ValueError as e:
            raise ValueError(f"cannot set attribute {name!r} on {'/' + path!r}: {e}") from None
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
            raise StepError(f"step {len(self.catalog.steps)} is already open; call end_step first")
        return self._open_step()

    def _open_step(self) -> int:
        """This engine's own step opens (a put's implicit step does not go through an overridden begin_step)."""
        self._in_step = True
        return len(self.catalog.steps)

    def lookup(self, name: str) -> DatasetSpec:
        path = normpath(name)
        spec = self.catalog.datasets.get(path)
        if spec is None:
            raise dataset_not_found(self.catalog, path)
        return spec

    def put(self, name: str, box: Box, array: np.ndarray, copy: bool = True) -> None:
        self._require_write(f"write dataset {name!r}")
        if not self._in_step:
            self._open_step()  # implicit step, committed by the next end_step or close
        spec = self.lookup(name)
        box.check_inside(spec.shape, f"dataset {spec.path!r}")
        arr = np.asarray(array)
        if arr.shape != box.shape:
            if arr.size == box.size and arr.ndim == 0:
                arr = np.broadcast_to(arr, box.shape)
            else:
                raise ShapeError(
                    f"cannot write an array of shape {arr.shape} to box {box} (shape {box.shape}) of dataset {spec.path!r}"
                )
        if arr.dtype != spec.dtype:
            if arr.dtype.kind not in "biufc" or not np.can_cast(
                arr.dtype, spec.dtype, casting="same_kind"
            ):
                raise DTypeError(
                    f"cannot write {arr.dtype} data to dataset {spec.path!r} of dtype {spec.dtype} (unsafe cast)"
                )
            arr = arr.astype(spec.dtype)
            copy = False  # astype already made a private copy
        self._check_local_overlap(spec, box)
        if box.empty:
            return
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
            copy = False
        p = Pending(len(self._pending), spec, box, arr)
        pipe = codec_mod.pipeline(spec.codecs) if spec.codecs else None
        if pipe is not None and pipe.finite_only and not np.isfinite(arr).all():
            pipe = None  # zfp cannot represent NaN or inf (it would store other numbers): keep raw
        if pipe is not None:
            p.payload = pipe.encode(arr)
            p.codec = BlockCodec.PIPELINE
            p.length = len(p.payload)
            if p.length >= arr.nbytes:  # incompressible: store raw, like ADIOS
                p.payload, p.codec, p.length = None, BlockCodec.RAW, arr.nbytes
        else:
            p.length = arr.nbytes
        if p.codec == BlockCodec.PIPELINE:
            p.job = stats_mod.BlockJob(arr, 0, checksum=False, background=False)
            p.extra["crcs"] = stats_mod.segment_crcs(p.payload, self.segment)
            p.data = None
        else:
            self._stage(p, copy)
        self._pending.append(p)
        self._record_local_box(spec, box)  # only now: a put that failed wrote nothing

    def put_stats(self, name: str, box: Box, array: np.ndarray) -> None:
        """Independent: record the statistics of *array* as a block of *name* without storing its data.

        The block (codec :data:`BlockCodec.STATS_ONLY`, zero bytes) takes part in
        the step like any other: boxes may not overlap, and queries prune with
        its statistics.  Reading its values is up to a layer that can compute
        them (the derived layer).
        """
        self._require_write(f"write statistics of dataset {name!r}")
        if not self._in_step:
            self._open_step()
        spec = self.lookup(name)
        box.check_inside(spec.shape, f"dataset {spec.path!r}")
        arr = np.asarray(array)
        if arr.shape != box.shape:
            raise ShapeError(
                f"statistics of an array of shape {arr.shape} for box {box} (shape {box.shape}) of dataset {spec.path!r}"
            )
        self._check_local_overlap(spec, box)
        if box.empty:
            return
        p = Pending(len(self._pending), spec, box, None, codec=BlockCodec.STATS_ONLY, length=0)
        p.job = stats_mod.BlockJob(
            arr.astype(spec.dtype, copy=False), 0, checksum=False, background=False
        )
        p.extra["crcs"] = (0,)
        p.location = (self.session, 0, 0)  # nothing to move
        self._pending.append(p)
        self._record_local_box(spec, box)

    def _check_local_overlap(self, spec: DatasetSpec, box: Box) -> None:
        """OverlapError now if *box* overlaps a box this rank already put in this step.

        Vectorized over the rank's pending boxes of the dataset; overlaps across
        ranks are found at end_step by one sweep over all boxes of the step.
        """
        if box.empty:
            return
        lo, hi, n = self._boxes.get(spec.id, (None, None, 0))
        if n:
            start = np.asarray(box.start, dtype=np.int64)
            stop = np.asarray(box.stop, dtype=np.int64)
            hit = np.all((lo[:n] < stop) & (hi[:n] > start), axis=1)
            if hit.any():
                j = int(np.argmax(hit))
                other = Box(tuple(int(v) for v in lo[j]), tuple(int(v) for v in hi[j]))
                raise OverlapError(
                    f"dataset {spec.path!r}, step {len(self.catalog.steps)}: box {box} overlaps box {other} "
                    "already written by this rank in this step"
                )

    def _record_local_box(self, spec: DatasetSpec, box: Box) -> None:
        lo, hi, n = self._boxes.get(spec.id, (None, None, 0))
        if lo is None or n == len(lo):
            cap = max(16, 2 * n)
            nlo = np.empty((cap, spec.ndim), dtype=np.int64)
            nhi = np.empty((cap, spec.ndim), dtype=np.int64)
            if n:
                nlo[:n], nhi[:n] = lo[:n], hi[:n]
            lo, hi = nlo, nhi
        lo[n], hi[n] = box.start, box.stop
        self._boxes[spec.id] = (lo, hi, n + 1)

    def end_step(self) -> None:
        self._require_write("end a step")
        # a step opened implicitly by a write exists only on the ranks that wrote:
        # decide together, so every rank commits it (ranks that wrote nothing add no blocks)
        if not comm_mod.agree(self.comm, None, flag=int(self._in_step)):
            raise StepError("end_step called without begin_step")
        self._in_step = True
        self._commit(KIND_STEP)

    # ---------------------------------------------------------- commit
    def _encode_headers(self) -> bytes:
        if self._put_error is not None:  # put could not store a block: the step cannot commit
            raise self._put_error
        e = Encoder()
        ops = Encoder()
        for op in self._pending_ops:
            if op[0] not in ATTR_OPS:
                encode_op(ops, op)
        e.u32(stats_mod.crc(ops.getvalue()))
        attrs = Encoder()
        final = attribute_changes(self._pending_ops)
        attrs.u32(len(final))
        for op in final:
            encode_op(attrs, op)
        e.blob(attrs.getvalue())
        e.u32(len(self._pending))
        for p in self._pending:
            e.u32(p.idx)
            e.u32(p.spec.id)
            for a in p.box.start:
                e.u64(a)
            for b in p.box.stop:
                e.u64(b)
            e.u64(p.length)
            e.u8(p.codec)
            if p.location is None:
                e.u8(0)
            else:
                e.u8(1)
                for v in p.location:
                    e.u64(v)
        return e.getvalue()

    def _decode_headers(self, raws: list[bytes]) -> tuple[list[int], list[Header]]:
        digests, headers = [], []
        changes: list[list[tuple]] = []
        for r, raw in enumerate(raws):
            d = Decoder(raw, f"step headers from rank {r}")
            digests.append(d.u32())
            a = Decoder(d.blob(), f"attribute changes of rank {r}")
            changes.append([decode_op(a) for _ in range(a.count(2, name="changes"))])
            for _ in range(d.count(18, name="blocks")):
                idx, did = d.u32(), d.u32()
                if did >= len(self.catalog.specs):
                    raise CollectiveMismatchError(
                        f"rank {r} wrote dataset id {did}, unknown on rank {self.rank}"
                    )
                nd = self.catalog.specs[did].ndim
                box = Box(tuple(d.u64() for _ in range(nd)), tuple(d.u64() for _ in range(nd)))
                length, codec = d.u64(), d.u8()
                loc = (d.u64(), d.u64(), d.u64()) if d.u8() else None
                headers.append(Header(r, idx, did, box, length, codec, loc))
        # the record's metadata: the collective changes (the same on every rank, checked by
        # _validate), then the attribute changes any subset of ranks made, merged
        self._commit_ops = [op for op in self._pending_ops if op[0] not in ATTR_OPS]
        self._commit_ops += merge_attribute_changes(changes)
        return digests, headers

    def _validate(self, digests: list[int], headers: list[Header], step: int) -> None:
        bad = [r for r, dg in enumerate(digests) if dg != digests[0]]
        if bad:
            raise CollectiveMismatchError(
                f"ranks {bad} made different metadata changes (create_dataset/create_group/attrs) "
                "than rank 0 before this commit; collective calls need the same arguments on every rank"
            )
        by_ds: dict[int, list[Header]] = {}
        for h in headers:
            by_ds.setdefault(h.dataset, []).append(h)
        for did, hs in by_ds.items():
            pair = find_overlap([h.box for h in hs])
            if pair is not None:
                a, b = hs[pair[0]], hs[pair[1]]
                raise OverlapError(
                    f"dataset {self.catalog.specs[did].path!r}, step {step}: box {a.box} written by rank "
                    f"{a.rank} overlaps box {b.box} written by rank {b.rank}; boxes of one step may not overlap"
                )

    def _encode_trailer(self, locations: list[tuple[int, int, int, int, int]]) -> bytes:
        e = Encoder()
        e.u32(len(self._pending))
        for p in self._pending:
            assert p.job is not None  # every put sets it
            st, crcs = p.job.result()
            if p.codec != BlockCodec.RAW:
                crcs = p.extra["crcs"]
            e.u32(p.idx)
            e.u64(self.segment)
            e.u32(len(crcs))
            for c in crcs:
                e.u32(c)
            if (
                st is None
            ):  # an engine that keeps no statistics (the memory transport with stats=False)
                e.u8(0)
            else:
                e.u8(1)
                st.encode(e, p.spec.dtype)
        e.u32(len(locations))
        for loc in locations:
            for v in loc:
                e.u64(v)
        return e.getvalue()

    def _build_record(
        self, kind: int, step: int, headers: list[Header], trailers: list[bytes]
    ) -> Record:
        from ..catalog.model import Stats

        by_key = {(h.rank, h.idx): h for h in headers}
        recs: dict[tuple[int, int], BlockRecord] = {}
        for h in headers:
            recs[(h.rank, h.idx)] = BlockRecord(
                h.dataset, h.box, h.rank, length=h.length, codec=h.codec
            )
            if h.location is not None:
                (
                    recs[(h.rank, h.idx)].session,
                    recs[(h.rank, h.idx)].agg,
                    recs[(h.rank, h.idx)].offset,
                ) = h.location
        for r, raw in enumerate(trailers):
            d = Decoder(raw, f"step trailer from rank {r}")
            for _ in range(d.count(16, name="blocks")):
                idx = d.u32()
                rec = recs[(r, idx)]
                rec.seg = d.u64()
                rec.crcs = tuple(d.u32() for _ in range(d.count(4, name="checksums")))
                if d.u8():
                    rec.stats = Stats.decode(d, self.catalog.specs[by_key[(r, idx)].dataset].dtype)
            for _ in range(d.count(40, name="locations")):
                src, idx, session, agg, off = (d.u64() for _ in range(5))
                rec = recs[(src, idx)]
                rec.session, rec.agg, rec.offset = session, agg, off
        blocks = [recs[(h.rank, h.idx)] for h in headers]
        return Record(
            kind, step, self.session, self.size, time.time(), list(self._commit_ops), blocks
        )

    def _commit(self, kind: int) -> None:
        """Collective: the four phases described in the module docstring."""
        step = len(self.catalog.steps) if kind == KIND_STEP else -1
        try:
            g = comm_mod.Guard()
            with g:
                local = self._encode_headers()
            comm_mod.agree(self.comm, g.error)
            raws = comm_mod.allgather_bytes(self.comm, local)
            digests, headers = self._decode_headers(raws)
            self._validate(digests, headers, step)  # same verdict on every rank

            g = comm_mod.Guard()
            locations: list = []
            with g:
                locations = self._move(headers, self._pending)
            comm_mod.agree(self.comm, g.error)

            g = comm_mod.Guard()
            trailer = b""
            with g:
                trailer = self._encode_trailer(locations)
            comm_mod.agree(self.comm, g.error)
            trailers = comm_mod.gather_bytes(self.comm, trailer, root=0)

            g = comm_mod.Guard()
            raw = None
            with g:
                if self.rank == 0:
                    assert trailers is not None  # gathered on rank 0
                    rec = self._build_record(kind, step, headers, trailers)
                    raw = rec.encode(self.catalog.specs)
                    self._write_record(raw)
            comm_mod.agree(self.comm, g.error)
            raw = comm_mod.bcast_bytes(self.comm, raw, root=0)
        except Exception as e:
            # every error here is raised on all ranks alike (agree, or the same verdict)
            self.discard_step()
            if isinstance(e, CollectiveMismatchError):
                # ranks disagree on the metadata: none of it can be committed, ever; undo it here
                # so that the file goes on (later steps and close commit) as of the last commit
                self._undo_metadata()
            mark_collective(e)
            raise
        rec = Record.decode(raw, self.catalog, "committed record", apply_ops=False)
        for op in rec.ops:
            if op[0] in ATTR_OPS:  # other ranks' attribute changes; this rank's again (the same)
                self.catalog.apply_op(op, "committed record")
        self.catalog.apply_record(rec, ops_applied=True)
        self._committed(raw)
        self._pending.clear()
        self._boxes.clear()
        self._pending_ops.clear()
        self._commit_ops = []
        self._committed_cp = self.catalog.checkpoint()
        self._in_step = False

    def _undo_metadata(self) -> None:
        """Forget the metadata changes made since the last commit, in the catalog too."""
        if self._pending_ops and self._committed_cp is not None:
            self.catalog.restore(self._committed_cp)
        self._pending_ops.clear()
        self._commit_ops = []

    @property
    def closed(self) -> bool:
        return self._closed

    def discard_step(self) -> None:
        for p in self._pending:
            if p.job is not None:
                try:
                    p.job.result()
                except Exception:
                    pass
        self._pending.clear()
        self._boxes.clear()
        self._put_error = None
        self._in_step = False

    # ---------------------------------------------------------- reading
    def check_step(self, step: int | None) -> int:
        n = len(self.catalog.steps)
        if step is None:
            if n == 0:
                raise StepError(f"file {self.path!r} has no committed steps yet")
            return n - 1
        step = int(step)
        if step < 0:
            step += n
        if not 0 <= step < n:
            raise StepError(
                f"step {step} does not exist in {self.path!r}: {n} committed step(s) (0..{n - 1})"
            )
        return step

    def check_read(
        self, name: str, box: Box, step: int | None, out: np.ndarray
    ) -> tuple[DatasetSpec, int]:
        """(spec, step) of a read of *box* of *name* into *out*, after checking all three; raises otherwise."""
        spec = self.lookup(name)
        box.check_inside(spec.shape, f"dataset {spec.path!r}")
        step = self.check_step(step)
        if out.shape != box.shape or out.dtype != spec.dtype:
            raise ShapeError(
                f"output buffer {out.shape} {out.dtype} does not match box {box} of {spec.dtype}"
            )
        return spec, step

    def get(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        spec, step = self.check_read(name, box, step, out)
        hits = self.catalog.hits(spec.id, step, box)
        covered = sum(inter.size for _, inter in hits)
        if covered < box.size:
            out[...] = spec.fill_scalar()
        for rec, inter in hits:
            if rec.codec == BlockCodec.STATS_ONLY:
                raise FormatError(
                    f"dataset {spec.path!r} keeps only statistics at step {step} (block {rec.box}); "
                    "its values are computed by the derived layer"
                )
            self._read_region(rec, spec, inter, out[inter.within(box)])

    def decode_payload(self, rec: BlockRecord, spec: DatasetSpec, payload) -> np.ndarray:
        """Bytes of a whole block as stored -> array of the block's shape."""
        what = f"dataset {spec.path!r} block {rec.box} in {self.path}/{rec.subfile}"
        if rec.codec == BlockCodec.RAW:
            return np.frombuffer(payload, dtype=spec.dtype).reshape(rec.box.shape)
        return codec_mod.pipeline(spec.codecs).decode(
            bytes(payload), spec.dtype, rec.box.shape, what
        )

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._finish()
        finally:
            self._closed = True
            self._close_storage()
            comm_mod.free(self.comm)

    def _finish(self) -> None:
        """Collective, in close, before resources go: writers commit what is pending."""
        if self.mode != "r":
            self._commit_close()
        else:
            comm_mod.agree(
                self.comm, None
            )  # meets a rank that left (leave) rather than freeing under it

    def agree(self, flag: int = 0) -> int:
        return comm_mod.agree(self.comm, None, flag)

    def leave(self, exc: BaseException) -> None:
        if self._closed:
            return
        comm_mod.leave(self.comm, exc)
        self.abandon()

    def _commit_close(self) -> None:
        """Collective (writers): commit the step left open on any rank and pending metadata, then the close record."""
        if comm_mod.agree(self.comm, None, flag=int(self._in_step)):
            self._in_step = True
            self._commit(KIND_STEP)
        if comm_mod.allreduce_int(self.comm, int(bool(self._pending_ops)), "max"):
            self._commit(KIND_META)
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
        self._closed = True
        self._close_storage()

    # ---------------------------------------------------------- hooks
    def _open_storage(self, path: str, mode: str) -> None:
        raise NotImplementedError

    def _stage(self, p: Pending, copy: bool) -> None:
        """Take a raw block at put time: store it now or keep (a copy of) it for _move."""
        assert p.data is not None  # a raw block keeps its array until it is stored
        if copy:
            p.data = p.data.copy()
        p.job = stats_mod.BlockJob(p.data, self.segment, background=self.background_stats)

    def _move(
        self, headers: list[Header], mine: list[Pending]
    ) -> list[tuple[int, int, int, int, int]]:
        raise NotImplementedError

    def _write_record(self, raw: bytes) -> None:
        raise NotImplementedError

    def _read_region(
        self, rec: BlockRecord, spec: DatasetSpec, inter: Box, dst: np.ndarray
    ) -> None:
        raise NotImplementedError

    def _committed(self, raw: bytes) -> None:
        """Called on every rank once a record is committed."""

    def _close_storage(self) -> None:
        pass


__all__ = ["BlockEngine", "Header", "Pending", "FormatError"]
