"""Metadata records: one committed step, metadata change or close, as bytes.

Format version 3 splits a record in two: a small **head** (kind, step,
metadata operations, and a directory of the step's block sections) and a
**block area** holding one section per dataset (:class:`~.blocks.BlockTable`
columns).  Files store the area just before the head's frame and readers
decode a section only when its step is read; the transports ship head and
area together (:func:`pack`).  Versions 1 and 2 store every block inline
in the record, one after the other; lamina reads them, and appends to such
a file in its own version.  ``docs/format.md`` describes both.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import FormatError
from .blocks import (
    BlockTable,
    Loader,
    Section,
    StepBlocks,
    StepTable,
    encode_area,
    encode_step,
    extents_of,
    row_bytes,
)
from .model import (
    KIND_NAMES,
    KIND_STEP,
    BlockRecord,
    DatasetSpec,
    decode_op,
    encode_op,
)
from .wire import Decoder, Encoder

#: the newest record format (the native format's version)
VERSION = 4

#: a section's entry in the directory (dataset, blocks, offset, length, crc; version 4 adds
#: the raw length), by format version
_ENTRY = {3: struct.Struct("<IQQQI"), 4: struct.Struct("<IQQQIQ")}
#: an extent: session, aggregator, end
_EXTENT_ENTRY = struct.Struct("<IIQ")
#: the fields every record begins with: kind, step, session, ranks, commit time
_HEAD = struct.Struct("<BqIId")
#: longest table a compressed section may claim to hold
_MAX_RAW = 1 << 40


@dataclass(slots=True)
class Record:
    """One committed unit of metadata: a step, a metadata change, or a close mark.

    To encode, a step record carries its blocks as ``tables`` (dataset id
    -> :class:`BlockTable`).  A decoded version 3 record carries the
    directory of its block area instead (``sections``, ``area_offset``,
    ``area_length``): the tables are decoded later, from the area, by
    :class:`StepBlocks`.  ``extents`` says how many bytes of each subfile
    ``(session, aggregator)`` the step's blocks need.  A commit gives its blocks as
    ``columns`` instead of ``tables``: one :class:`StepTable` for the step, which
    encodes to the same bytes without a table per dataset.
    """

    kind: int
    step: int = -1
    session: int = 0
    nranks: int = 1
    time: float = 0.0
    ops: list[tuple] = field(default_factory=list)
    tables: dict[int, BlockTable] = field(default_factory=dict)
    sections: dict[int, Section] = field(default_factory=dict)
    extents: list[tuple[int, int, int]] = field(default_factory=list)
    area_offset: int = 0
    area_length: int = 0
    version: int = VERSION
    columns: StepTable | None = None

    @classmethod
    def of_blocks(cls, kind: int, step: int, blocks: list[BlockRecord], specs, **kw) -> Record:
        """A record of per-block :class:`BlockRecord` objects (their tables built here)."""
        by: dict[int, list[BlockRecord]] = {}
        for b in blocks:
            by.setdefault(b.dataset, []).append(b)
        tables = {d: BlockTable.from_records(rs, specs[d]) for d, rs in by.items()}
        return cls(kind, step, tables=tables, **kw)

    # -- encoding ---------------------------------------------------------------
    def _encode_start(self, e: Encoder) -> None:
        e.u8(self.kind)
        e.i64(self.step)
        e.u32(self.session)
        e.u32(self.nranks)
        e.f64(self.time)
        e.u32(len(self.ops))
        for op in self.ops:
            encode_op(e, op)

    def encode(
        self, specs_after_ops: list[DatasetSpec], version: int = VERSION, area_offset: int = 0
    ) -> tuple[bytes, bytes]:
        """``(head, area)``: the bytes of this record in format *version* (:meth:`_encode`)."""
        head, area, _ = self._encode(specs_after_ops, version, area_offset)
        return head, area

    def encode_read(
        self, specs_after_ops: list[DatasetSpec], version: int = VERSION, area_offset: int = 0
    ) -> tuple[bytes, bytes, Record]:
        """``(head, area, record)``: :meth:`encode`, and the record :meth:`decode` gives of
        *head* (format 3 and up: the directory of the area, no tables) without decoding it.

        For the writer that applies the record it just wrote: decoding its head again cost
        about 7 % of the instructions of a step of one block, 200-300 us of a step of 128
        one-block datasets.
        """
        head, area, directory = self._encode(specs_after_ops, version, area_offset)
        if directory is None:
            raise ValueError(f"a record of format {version} holds its blocks: decode its bytes")
        sections, extents = directory
        read = Record(
            self.kind,
            self.step,
            self.session,
            self.nranks,
            self.time,
            list(self.ops),
            sections={s.dataset: s for s in sections},
            extents=list(extents),
            area_offset=area_offset,
            area_length=sum(s.length for s in sections),
            version=version,
        )
        return head, area, read

    def _encode(
        self, specs_after_ops: list[DatasetSpec], version: int, area_offset: int
    ) -> tuple[bytes, bytes, tuple[list[Section], list[tuple[int, int, int]]] | None]:
        """``(head, area, (sections, extents))``: the bytes of this record in format *version*,
        and the directory its head holds (None for versions 1 and 2, which have none).

        *specs_after_ops*: datasets by id, including those this record
        defines.  A decoded version 3 record (sections, no tables) encodes
        its head with the same directory and an empty area: the area it
        was decoded from goes with it unchanged.  *area_offset* is where the area will lie (a file offset
        for the native format; 0 when shipped with the head).  Versions 1
        and 2 have no area: every block is in the head.
        """
        e = Encoder()
        self._encode_start(e)
        if version <= 2:
            tables = self.tables
            if self.columns is not None:
                tables = self.columns.tables(specs_after_ops, amax=False)
            rows = [(d, t) for d, t in sorted(tables.items()) if len(t)]  # v1/v2: blocks inline
            e.u32(sum(len(t) for _, t in rows))
            for d, t in rows:
                dt = specs_after_ops[d].dtype
                for i in range(len(t)):
                    t.record(i, d).encode(e, dt)
            return e.getvalue(), b"", None
        if self.columns is not None:  # a commit's: one table for the step
            sections, area = encode_step(self.columns, specs_after_ops, version)
            extents = self.columns.extents()
        elif self.tables or not self.sections:
            squeeze = (
                [d for d in self.tables if specs_after_ops[d].layout is not None]
                if version >= 4
                else []
            )
            tables = {
                d: _with_amax(t, version >= 4 and specs_after_ops[d].layout is not None)
                for d, t in self.tables.items()
            }
            sections, area = encode_area(tables, squeeze)
            extents = extents_of(tables)
        else:  # a decoded record: its directory as it was (the caller ships the area it came with)
            sections, area = list(self.sections.values()), b""
            extents = list(self.extents)
        e.u32(len(sections))
        if version >= 4:
            pack = _ENTRY[4].pack
            e.raw(
                b"".join(
                    pack(s.dataset, s.nblocks, s.offset, s.length, s.crc, s.raw) for s in sections
                )
            )
        else:
            if any(s.raw for s in sections):
                raise ValueError("a compressed block section cannot be written in format 3")
            pack = _ENTRY[3].pack
            e.raw(b"".join(pack(s.dataset, s.nblocks, s.offset, s.length, s.crc) for s in sections))
        e.u32(len(extents))
        e.raw(b"".join(_EXTENT_ENTRY.pack(*x) for x in extents))
        e.u64(area_offset)
        e.u64(sum(s.length for s in sections))
        return e.getvalue(), area, (sections, extents)

    # -- decoding ---------------------------------------------------------------
    @staticmethod
    def read_head(d: Decoder) -> tuple[int, int, int, int, float]:
        """The fields every record begins with (:meth:`_encode_start`): kind, step, session,
        ranks and commit time, unchecked."""
        return d.fields(_HEAD)

    @classmethod
    def decode(
        cls,
        buf: bytes,
        catalog,
        what: str = "metadata record",
        apply_ops: bool = True,
        version: int = VERSION,
    ) -> Record:
        """The record a head encodes (version 3) or a whole record (versions 1 and 2).

        The ops are applied to *catalog* unless already applied (ops may
        define datasets the blocks use).  A version 3 record's sections are
        checked against the datasets but not decoded.
        """
        d = Decoder(buf, what)
        kind, step, session, nranks, t = cls.read_head(d)
        if kind not in KIND_NAMES:
            raise FormatError(f"{what}: unknown record kind {kind}")
        rec = cls(kind, step, session, nranks, t, version=version)
        nops = d.count(2, name="operations")
        for _ in range(nops):
            op = decode_op(d)
            if apply_ops:
                catalog.apply_op(op, what)
            rec.ops.append(op)
        specs = catalog.specs
        if version <= 2:
            nblocks = d.count(50, name="blocks")
            by: dict[int, list[BlockRecord]] = {}
            for _ in range(nblocks):
                b = BlockRecord.decode(d, specs)
                by.setdefault(b.dataset, []).append(b)
            d.expect_end()
            if by and kind != KIND_STEP:
                raise FormatError(f"{what}: a {KIND_NAMES[kind]} record holds blocks")
            rec.tables = {did: BlockTable.from_records(bs, specs[did]) for did, bs in by.items()}
            rec.extents = extents_of(rec.tables)
            return rec
        entry = _ENTRY[min(version, 4)]
        nsec = d.count(entry.size, name="block sections")
        directory = d.raw(entry.size * nsec)
        got = _sections_at_once(directory, nsec, specs, version) if nsec > _FEW else None
        if got is None:  # a bad entry, or one the quick checks cannot judge: one at a time
            got = _sections_one_by_one(directory, nsec, specs, version, what)
        rec.sections, end = got
        next_ = d.count(_EXTENT_ENTRY.size, name="subfile extents")
        prev = (-1, -1)
        for _ in range(next_):
            sess, agg, e = d.fields(_EXTENT_ENTRY)
            if (sess, agg) <= prev or e >= 1 << 62:
                raise FormatError(f"{what}: subfile extents out of order or impossible")
            prev = (sess, agg)
            rec.extents.append((sess, agg, e))
        rec.area_offset, rec.area_length = d.u64(), d.u64()
        d.expect_end()
        if rec.area_length != end or rec.area_offset >= 1 << 62:
            raise FormatError(
                f"{what}: block area of {rec.area_length} bytes at {rec.area_offset}; its sections take {end}"
            )
        if kind != KIND_STEP and (rec.sections or rec.extents):
            raise FormatError(f"{what}: a {KIND_NAMES[kind]} record holds blocks")
        return rec

    def step_blocks(self, load: Loader | None, what: str) -> StepBlocks:
        """The blocks of this (step) record: decoded already (versions 1, 2, or built here) or loaded by *load*."""
        if self.columns is not None:
            raise ValueError("a record of step columns is encoded, not read: decode its bytes")
        if self.tables or not self.sections:
            return StepBlocks.of_tables(self.tables, what)
        return StepBlocks(dict(self.sections), list(self.extents), load, what, version=self.version)


#: directories of at most this many sections are checked entry by entry (numpy's calls cost
#: more than a loop over a few)
_FEW = 8

#: a directory entry as numpy reads it, by format version (:data:`_ENTRY`)
_ENTRY_DTYPE = {
    v: np.dtype(
        {
            "names": ["d", "n", "o", "l", "c", *(["r"] if v >= 4 else [])],
            "formats": ["<u4", "<u8", "<u8", "<u8", "<u4", *(["<u8"] if v >= 4 else [])],
            "offsets": [0, 4, 12, 20, 28, *([32] if v >= 4 else [])],
            "itemsize": _ENTRY[v].size,
        }
    )
    for v in (3, 4)
}


#: a Section of a 6-tuple, as Section._make makes it without its frame and length check
_new_section = functools.partial(tuple.__new__, Section)


def _sections_at_once(
    directory: bytes, nsec: int, specs, version: int
) -> tuple[dict[int, Section], int] | None:
    """The sections of a directory of *nsec* entries and where they end, every entry checked
    as :func:`_sections_one_by_one` checks it but as whole columns; None if any fails (that
    one then names it)."""
    if not nsec:
        return {}, 0
    a = np.frombuffer(directory, dtype=_ENTRY_DTYPE[min(version, 4)], count=nsec)
    did, n, off, length = a["d"], a["n"], a["o"], a["l"]
    raw = a["r"] if version >= 4 else np.zeros(nsec, dtype=np.uint64)
    if int(did[-1]) >= len(specs) or (nsec > 1 and bool((did[1:] <= did[:-1]).any())):
        return None
    if bool((length >= 1 << 62).any()) or bool((raw >= _MAX_RAW).any()) or bool((n == 0).any()):
        return None
    end = np.cumsum(length)  # uint64: a sum past 2^64 wraps, and then falls somewhere
    if nsec > 1 and bool((end[1:] < end[:-1]).any()):
        return None
    if int(off[0]) != 0 or (nsec > 1 and bool((off[1:] != end[:-1]).any())):
        return None
    ids = did.tolist()
    rows = [row_bytes(specs[k].ndim, specs[k].dtype) for k in ids]
    table = np.where(raw != 0, raw, length)
    if bool((n > table // np.array(rows, dtype=np.uint64)).any()):
        return None
    sections = dict(
        zip(
            ids,
            map(
                _new_section,  # (Section._make less its Python frame: one per section)
                zip(
                    ids,
                    n.tolist(),
                    off.tolist(),
                    length.tolist(),
                    a["c"].tolist(),
                    raw.tolist(),
                    strict=True,
                ),
            ),
            strict=True,
        )
    )
    return sections, int(end[-1])


def _sections_one_by_one(
    directory: bytes, nsec: int, specs, version: int, what: str
) -> tuple[dict[int, Section], int]:
    """The sections of a directory, entry by entry; FormatError naming the first bad one."""
    entry = _ENTRY[min(version, 4)]
    sections: dict[int, Section] = {}
    end = 0
    last = -1  # the dataset of the section before: sections come by ascending dataset
    for k in range(nsec):
        did, n, off, length, c, *more = entry.unpack_from(directory, k * entry.size)
        raw = more[0] if more else 0
        if did >= len(specs):
            raise FormatError(
                f"{what}: blocks of dataset id {did}, only {len(specs)} datasets defined"
            )
        spec = specs[did]
        if did <= last:
            raise FormatError(f"{what}: block sections out of order at dataset {spec.path!r}")
        last = did
        table_bytes = raw if raw else length
        if (
            off != end
            or n == 0
            or n > table_bytes // row_bytes(spec.ndim, spec.dtype)
            or raw >= _MAX_RAW
        ):
            raise FormatError(
                f"{what}: block section of dataset {spec.path!r} ({n} blocks at {off}+{length}) "
                f"is inconsistent (expected at {end})"
            )
        sections[did] = Section(did, n, off, length, c, raw)
        end = off + length
    return sections, end


def _with_amax(t: BlockTable, amax: bool) -> BlockTable:
    """*t* with the coefficient magnitudes its format wants: a column (inf where unknown) or none."""
    if amax == (t.amax is not None):
        return t
    out = t.take(np.arange(len(t)))
    out.amax = np.full(len(t), np.inf) if amax else None
    return out


def pack(head: bytes, area: bytes) -> bytes:
    """Head and area as one message (the transports, the memory engine): ``u64 len(head), head, area``."""
    return np.array([len(head)], dtype="<u8").tobytes() + head + area


def unpack(buf, what: str) -> tuple[memoryview, memoryview]:
    """The head and the area of a :func:`pack` message."""
    mv = memoryview(buf).cast("B")
    if len(mv) < 8:
        raise FormatError(f"{what}: message of {len(mv)} bytes is shorter than its 8-byte head")
    n = int(np.frombuffer(mv[:8], dtype="<u8")[0])
    if n > len(mv) - 8:
        raise FormatError(f"{what}: head of {n} bytes in a message of {len(mv)}")
    return mv[8 : 8 + n], mv[8 + n :]


def decode_packed(
    buf, catalog, what: str, apply_ops: bool = True, version: int = VERSION
) -> tuple[Record, StepBlocks | None]:
    """A :func:`pack` message (format *version*, 3 or later): the record, and for a step its
    blocks (loaded from the message)."""
    head, area = unpack(buf, what)
    rec = Record.decode(bytes(head), catalog, what, apply_ops, version=version)
    if rec.kind != KIND_STEP:
        return rec, None
    if len(area) != rec.area_length:
        raise FormatError(
            f"{what}: block area of {len(area)} bytes, its head says {rec.area_length}"
        )
    area_bytes = bytes(area)
    return rec, rec.step_blocks(lambda off, n: memoryview(area_bytes)[off : off + n], what)
