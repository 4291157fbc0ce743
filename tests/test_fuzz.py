"""Fuzzing the metadata readers: any bytes -> a value or FormatError, never another exception,
a hang or a huge allocation.

Three levels:

1. the pure readers (``check_header``, ``parse_commits``, ``parse_frame``,
   ``Record.decode``, and the pieces they are made of) on random bytes;
2. the same readers on *mutations* of valid encodings (bit flips, byte
   overwrites, insertions, deletions, truncations, duplicated spans), which
   reach much deeper into the decoders than random bytes;
3. real files: a lamina file written by the native engine whose
   ``lamina.meta`` / ``lamina.commit`` are corrupted at random positions, then
   opened and read: FormatError (or ChecksumError) or, for a torn trailing
   commit entry, a valid prefix of the steps that were written.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lamina
from lamina import codecs
from lamina.catalog import (
    KIND_CLOSE,
    KIND_META,
    KIND_STEP,
    OP_ATTR,
    OP_DATASET,
    OP_DELATTR,
    OP_EXT,
    OP_GROUP,
    BlockRecord,
    BlockTable,
    Catalog,
    DatasetSpec,
    Decoder,
    Encoder,
    Record,
    Stats,
    decode_packed,
    pack,
)
from lamina.catalog.model import decode_attr, decode_op
from lamina.catalog.wire import load_json
from lamina.engines.native import format as fmt
from lamina.errors import CodecError, FormatError
from lamina.geometry import Box
from lamina.perf import asyncmodel as am
from lamina.stats import crc

#: no reader may allocate more than this for inputs of a few KiB
ALLOC_LIMIT = 16 << 20
#: nor take longer than this on one input
TIME_LIMIT = 5.0


def guarded(fn, *args):
    """Run fn(*args): return its value, or the FormatError it raised; fail on anything else,
    on a peak allocation over ALLOC_LIMIT, or on a run over TIME_LIMIT."""
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        return fn(*args)
    except FormatError as e:
        return e
    finally:
        elapsed = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < ALLOC_LIMIT, f"{fn.__name__} allocated {peak} bytes"
        assert elapsed < TIME_LIMIT, f"{fn.__name__} took {elapsed:.1f} s"


# --------------------------------------------------------------------------
# valid encodings to mutate


def _specs():
    return [
        DatasetSpec("fields/T", (16, 8), np.dtype("f8"), 0.0, (), 0),
        DatasetSpec("fields/n", (40,), np.dtype("i4"), -1, ({"id": "zstd", "level": 1},), 1),
        DatasetSpec("c", (3, 2), np.dtype("c8"), 0j, (), 2),
        DatasetSpec("flag", (), np.dtype("?"), False, (), 3),
    ]


def _records() -> list[tuple[Record, list[BlockRecord]]]:
    """Records of every kind, each with its blocks as BlockRecord objects."""
    specs = _specs()
    r0 = Record(
        KIND_STEP,
        0,
        session=0,
        nranks=2,
        time=17.0,
        ops=[
            (OP_GROUP, "meta/info"),
            (OP_DATASET, specs[0]),
            (OP_DATASET, specs[1]),
            (OP_ATTR, "", "title", "fuzz"),
            (OP_ATTR, "fields/T", "units", ["K", "C"]),
            (OP_ATTR, "fields", "origin", np.array([[1.5, 2.5]], dtype="f4")),
            (OP_EXT, "ext/key", b"\x00" * 5),
        ],
    )
    b0 = [
        BlockRecord(
            0, Box((0, 0), (8, 8)), 0, 0, 0, 0, 512, 0, 0, (crc(b"a"),), Stats(0.0, 9.0, 3.0, 64)
        ),
        BlockRecord(
            0, Box((8, 0), (16, 8)), 1, 0, 0, 512, 512, 0, 0, (crc(b"b"),), Stats(1.0, 2.0, 3.0, 64)
        ),
        BlockRecord(
            1,
            Box((0,), (40,)),
            0,
            0,
            0,
            1024,
            600_000,
            1,
            1 << 18,
            (1, 2, 3),
            Stats(-4, 12, 30.0, 40),
        ),
    ]
    r1 = Record(
        KIND_STEP,
        1,
        session=0,
        ops=[(OP_DATASET, specs[2]), (OP_DATASET, specs[3]), (OP_DELATTR, "", "title")],
    )
    b1 = [
        BlockRecord(
            2, Box((0, 0), (3, 2)), length=48, crcs=(7,), stats=Stats(0.5, 3.0, complex(1, -1), 6)
        ),
        BlockRecord(3, Box((), ()), length=1, crcs=(9,), stats=Stats(1, 1, 1.0, 1)),
        BlockRecord(1, Box((5,), (5,)), length=0, crcs=(0,), stats=None),
    ]
    r2 = Record(KIND_META, -1, session=1, ops=[(OP_ATTR, "c", "x", 3)])
    r3 = Record(KIND_CLOSE, -1, session=1)
    out = []
    cat = Catalog()
    for r, blocks in ((r0, b0), (r1, b1), (r2, []), (r3, [])):
        before = len(cat.specs)
        for op in r.ops:
            cat.apply_op(op)
        by: dict[int, list[BlockRecord]] = {}
        for b in blocks:
            by.setdefault(b.dataset, []).append(b)
        r.tables = {d: BlockTable.from_records(bs, cat.specs[d]) for d, bs in by.items()}
        out.append((r, list(cat.specs), before))
    return out


_RECS = _records()


def _encodings(version: int) -> list[tuple[bytes, bytes, int, int, int]]:
    """(head, area, specs before, index, version) of every record in format *version* (no area before 3)."""
    return [
        (*r.encode(specs, version), before, i, version)
        for i, (r, specs, before) in enumerate(_RECS)
    ]


RECORDS = _encodings(3)
RECORDS_V2 = _encodings(2)
RECORDS_V4 = _encodings(4)
SPECS = _specs()


IDENTITY = 0x1234_5678_9ABC


def _file_bytes() -> tuple[bytes, bytes]:
    """(lamina.meta, lamina.commit) exactly as the native engine writes them: each step's block
    area, then its record's frame, then the commit entry."""
    meta = bytearray(fmt.header(fmt.META_MAGIC, IDENTITY))
    commit = bytearray(fmt.header(fmt.COMMIT_MAGIC, IDENTITY))
    for i, (rec, specs, _) in enumerate(_RECS):
        head, area = rec.encode(specs, fmt.VERSION, area_offset=len(meta))
        meta += area
        framed = fmt.frame(head)
        commit += fmt.entry(i, len(meta), len(framed), crc(head))
        meta += framed
    return bytes(meta), bytes(commit)


META, COMMIT = _file_bytes()


def read_metadata(meta: bytes, commit: bytes) -> Catalog:
    """The native engine's metadata path, on bytes: commit entries -> frames -> records -> catalog,
    then every step's blocks decoded from its area."""
    entries, valid_end, head = fmt.parse_commits(commit, len(meta), "commit")
    assert head.size <= valid_end <= len(commit)
    mhead = fmt.check_header(meta[: fmt.HEADER_SIZE], fmt.META_MAGIC, "meta")
    assert (mhead.version, mhead.identity) == (head.version, head.identity)
    cat = Catalog()
    prev = head.size
    for e in entries:
        payload = fmt.parse_frame(meta[e.offset : e.offset + e.length], e, "meta")
        rec = Record.decode(payload, cat, "record", version=mhead.version)
        if rec.area_length and not (
            prev <= rec.area_offset and rec.area_offset + rec.area_length <= e.offset
        ):
            raise FormatError("record: block area outside its place")
        base = rec.area_offset
        cat.apply_record(
            rec, True, rec.step_blocks(lambda o, n, b=base: meta[b + o : b + o + n], "record")
        )
        prev = e.offset + e.length
    for k in range(len(cat.steps)):
        step_tables(cat, k)
    return cat


def step_tables(cat: Catalog, k: int) -> dict[int, bytes]:
    """Every table of step *k*, encoded (to compare steps)."""
    return {d: cat.steps[k].table(cat.specs[d]).encode() for d in cat.steps[k].datasets()}


def test_seed_files_are_valid():
    cat = read_metadata(META, COMMIT)
    assert len(cat.steps) == 2 and cat.closed and len(cat.specs) == 4
    assert cat.attrs["c"]["x"] == 3


# --------------------------------------------------------------------------
# mutations


@st.composite
def mutated(draw, base: bytes):
    """*base* after 1-4 random edits."""
    buf = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(
            st.sampled_from(["flip", "set", "insert", "delete", "truncate", "dup", "u32", "u64"])
        )
        n = len(buf)
        pos = draw(st.integers(0, max(0, n - 1)))
        if op == "flip" and n:
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and n:
            buf[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete" and n:
            del buf[pos : pos + draw(st.integers(1, 16))]
        elif op == "truncate":
            del buf[pos:]
        elif op == "dup" and n:
            k = draw(st.integers(1, 32))
            buf[pos:pos] = buf[pos : pos + k]
        elif op in ("u32", "u64") and n:
            # overwrite a length/count-sized field with an extreme value
            size = 4 if op == "u32" else 8
            v = draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1, 0x7FFF_FFFF]))
            v &= (1 << (8 * size)) - 1
            buf[pos : pos + size] = v.to_bytes(size, "little")
    return bytes(buf)


record_and_catalog = st.sampled_from(RECORDS + RECORDS_V2 + RECORDS_V4)


def decode_full(head: bytes, area: bytes, cat: Catalog, version: int = 3) -> Record:
    """Decode a record and every block table of its step (what a reader does, over time)."""
    if version <= 2:
        return Record.decode(head, cat, "record", version=version)
    rec, blocks = decode_packed(pack(head, area), cat, "record", version=version)
    if blocks is not None:
        for d in blocks.datasets():
            blocks.table(cat.specs[d])
    return rec


def _decode_with_prefix(head: bytes, area: bytes, before: int, index: int, version: int):
    """Decode a (possibly mutated) record with the catalog state it was encoded against."""
    cat = Catalog()
    for h, _, _, _, v in RECORDS[:index]:
        Record.decode(h, cat, version=v)
    assert len(cat.specs) == before
    return decode_full(head, area, cat, version)


# --------------------------------------------------------------------------
# level 1: random bytes


@given(st.binary(max_size=256))
def test_check_header_random(buf):
    for magic in (fmt.META_MAGIC, fmt.COMMIT_MAGIC):
        r = guarded(fmt.check_header, buf, magic, "x")
        assert isinstance(r, (int, FormatError))


@given(st.binary(max_size=24))
def test_check_header_with_right_magic(tail):
    buf = fmt.META_MAGIC + tail
    r = guarded(fmt.check_header, buf, fmt.META_MAGIC, "x")
    assert isinstance(r, (int, FormatError))


@given(st.binary(max_size=512), st.integers(0, 2**64 - 1))
def test_parse_commits_random(buf, meta_size):
    r = guarded(fmt.parse_commits, buf, meta_size, "c")
    assert isinstance(r, (tuple, FormatError))
    r = guarded(fmt.parse_commits, fmt.COMMIT_MAGIC + buf, meta_size, "c")
    assert isinstance(r, (tuple, FormatError))


@given(
    st.binary(max_size=256),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    st.integers(0, 2**32 - 1),
)
def test_parse_frame_random(buf, seq, offset, length, pcrc):
    e = fmt.CommitEntry(seq, offset, len(buf) if length is None else length, pcrc)
    r = guarded(fmt.parse_frame, buf, e, "m")
    assert isinstance(r, (bytes, FormatError))


@given(st.binary(max_size=64))
def test_parse_frame_short_buffers(payload):
    """Frames shorter than their 12-byte head, including ones a commit entry claims are complete."""
    for cut in range(0, fmt.FRAME_HEAD.size):
        buf = fmt.frame(payload)[:cut]
        r = guarded(fmt.parse_frame, buf, fmt.CommitEntry(0, 16, len(buf), crc(payload)), "m")
        assert isinstance(r, FormatError)


@given(st.binary(max_size=1024))
def test_record_decode_random(buf):
    r = guarded(Record.decode, buf, Catalog())
    assert isinstance(r, (Record, FormatError))


@given(st.binary(max_size=512))
def test_record_decode_random_after_valid_head(tail):
    """Random bytes behind a plausible head (kind, step, session, nranks, time)."""
    head = bytes([KIND_STEP]) + struct.pack("<qIId", 0, 0, 1, 0.0)
    r = guarded(Record.decode, head + tail, Catalog())
    assert isinstance(r, (Record, FormatError))


@given(st.binary(max_size=256))
def test_component_decoders_random(buf):
    specs = list(SPECS)
    for fn in (
        lambda: DatasetSpec.decode(Decoder(buf)),
        lambda: decode_attr(Decoder(buf)),
        lambda: decode_op(Decoder(buf)),
        lambda: BlockRecord.decode(Decoder(buf), specs),
        lambda: Stats.decode(Decoder(buf), np.dtype("f8")),
    ):
        guarded(fn)


@given(st.binary(max_size=256), st.binary(max_size=256))
def test_read_metadata_random(meta_tail, commit_tail):
    meta = fmt.header(fmt.META_MAGIC, IDENTITY) + meta_tail
    commit = fmt.header(fmt.COMMIT_MAGIC, IDENTITY) + commit_tail
    r = guarded(read_metadata, meta, commit)
    assert isinstance(r, (Catalog, FormatError))


# --------------------------------------------------------------------------
# JSON and compressed blocks from a file: a value or a lamina error, within bounds


@given(st.text(alphabet='[]{}"\\:,0123456789 aeNIn', max_size=4096))
def test_load_json_random(text):
    r = guarded(load_json, text, "json")
    assert r is None or isinstance(r, (FormatError, int, float, str, list, dict))


_DECISION_VALUES = st.one_of(
    st.integers(-3, 3), st.booleans(), st.none(), st.text("sa", max_size=3), st.just([1])
)
_DECISION_RECORD = st.fixed_dictionaries(
    # mostly well-formed rows, so that the parts and runs they name are what is tried
    {
        "fields": st.one_of(st.just(["step"]), st.lists(st.sampled_from(["step", 1]), max_size=2)),
        "decisions": st.lists(st.tuples(_DECISION_VALUES).map(list), max_size=3),
    },
    optional={"parts": _DECISION_VALUES, "run": _DECISION_VALUES},
)


@given(
    st.dictionaries(
        st.sampled_from([am.decisions_key(k) for k in range(4)] + ["other"]),
        st.one_of(_DECISION_RECORD.map(lambda d: json.dumps(d).encode()), st.binary(max_size=16)),
        max_size=5,
    )
)
def test_io_decision_records_random(ext):
    """Any extension records named as io='auto' decisions: read back as decisions, or a
    FormatError; never another error, and whether the run was unfinished always answers."""
    r = guarded(am.read_decisions, ext)
    assert r is None or isinstance(r, FormatError) or (isinstance(r, tuple) and len(r) == 2)
    assert am.decisions_unfinished(ext) in (True, False)


_BLOCK = np.random.default_rng(3).standard_normal(1000)
_CODECS = {
    "zstd": "zstd",
    "blosc": "blosc",
    "lz4": "lz4",
    "zlib": "zlib",
    "zfp accuracy": ("zfp", 1e-3),
    "zfp rate": {"id": "zfpy", "rate": 8},
    "zfp precision": {"id": "zfpy", "precision": 20},
    "zstd then zlib": ["zstd", "zlib"],
}


def _decode_block(pipe, raw):
    """pipe.decode(raw) as a block of _BLOCK's shape: its array or the CodecError, within limits."""
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        return pipe.decode(raw, _BLOCK.dtype, _BLOCK.shape, "block")
    except CodecError as e:
        return e
    finally:
        elapsed = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 4 * _BLOCK.nbytes + (1 << 20), f"decode allocated {peak} bytes"
        assert elapsed < TIME_LIMIT


@pytest.mark.parametrize("name", list(_CODECS))
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_codec_payload_mutated(name, data):
    pipe = codecs.pipeline(codecs.normalize(_CODECS[name], _BLOCK.dtype, 1))
    bad = data.draw(mutated(pipe.encode(_BLOCK)))
    r = _decode_block(pipe, bad)
    assert isinstance(r, CodecError) or (r.shape == _BLOCK.shape and r.dtype == _BLOCK.dtype)


# --------------------------------------------------------------------------
# level 2: mutations of valid encodings


@given(st.data())
def test_record_decode_mutated(data):
    head, area, before, index, version = data.draw(record_and_catalog)
    if area and data.draw(st.booleans()):
        area = data.draw(mutated(area))
    else:
        head = data.draw(mutated(head))
    r = guarded(_decode_with_prefix, head, area, before, index, version)
    assert isinstance(r, (Record, FormatError))


@given(st.data())
def test_record_decode_mutated_fresh_catalog(data):
    head, area, _, _, version = data.draw(record_and_catalog)
    r = guarded(decode_full, data.draw(mutated(head)), area, Catalog(), version)
    assert isinstance(r, (Record, FormatError))


@given(st.data())
def test_block_section_mutated(data):
    """The section decoder itself (behind its checksum): any mutation decodes to a table or FormatError."""
    rec, specs, _ = data.draw(st.sampled_from([x for x in _RECS if x[0].tables]))
    did = data.draw(st.sampled_from(sorted(rec.tables)))
    raw = rec.tables[did].encode()
    r = guarded(BlockTable.decode, data.draw(mutated(raw)), specs[did], "section")
    assert isinstance(r, (BlockTable, FormatError))
    if isinstance(r, BlockTable):  # whatever decodes is usable: boxes inside, records buildable
        for i in range(len(r)):
            r.record(i, did).box.check_inside(specs[did].shape)


def _large_section() -> tuple[DatasetSpec, bytes]:
    """A section of more blocks than a decoded table folds from (most columns one value)."""
    from lamina.catalog.blocks import FOLD_MIN

    n = FOLD_MIN + 44
    spec = DatasetSpec("big", (n * 4, 6), np.dtype("f4"), id=0)
    start = np.stack([np.arange(n) * 4, np.zeros(n, np.int64)], axis=1)
    t = BlockTable.build(
        spec.dtype,
        start,
        start + [4, 6],
        rank=1,
        offset=np.arange(n) * 96,
        crcs=[(i,) for i in range(n)],
        has_stats=True,
        smin=np.arange(n) * 1.0,
        smax=2.0,
        ssum=np.arange(n) * 3.0,
        count=24,
    )
    return spec, t.encode()


_LARGE = _large_section()


@settings(max_examples=150)
@given(st.data())
def test_large_block_section_mutated(data):
    """A section of a table decoded into folded columns: any mutation decodes to a table or
    FormatError, and whatever decodes is usable."""
    spec, raw = _LARGE
    r = guarded(BlockTable.decode, data.draw(mutated(raw)), spec, "section")
    assert isinstance(r, (BlockTable, FormatError))
    if isinstance(r, BlockTable):
        for i in range(len(r)):
            r.record(i, 0).box.check_inside(spec.shape)
        assert r.nbytes < len(raw)


def _one_block_step() -> tuple[list[DatasetSpec], list, bytes]:
    """A step of 12 datasets of two layouts written as one block each, and one of 3 blocks:
    the specs, the section directory and the block area."""
    from lamina.catalog.blocks import encode_area

    specs, tables = [], {}
    for did in range(13):
        dt, shape = ("<f8", (16,)) if did % 2 else ("<i4", (4, 6))
        spec = DatasetSpec(f"v{did}", shape, np.dtype(dt), None, (), did)
        n = 3 if did == 6 else 1
        lo = np.array([[k] + [0] * (len(shape) - 1) for k in range(n)], dtype=np.int64)
        hi = lo + 1
        hi[:, 1:] = shape[1:]
        specs.append(spec)
        tables[did] = BlockTable.build(
            spec.dtype, lo, hi, rank=did % 3, offset=np.arange(n) * 64 + 640 * did,
            crcs=[[did * 7 + k] for k in range(n)], has_stats=True, smin=-1, smax=did, ssum=1.5,
            count=1,
        )  # fmt: skip
    secs, area = encode_area(tables)
    return specs, secs, area


ONE_BLOCK_STEP = _one_block_step()


def _tables_both_ways(specs, secs, area: bytes) -> list:
    """Every table of the step, read as a reader of every dataset does (one-block sections
    together) and each alone: the two must agree, table for table or error for error."""
    from lamina.catalog.blocks import StepBlocks

    def load(o: int, n: int):
        return memoryview(area)[o : o + n]

    together = StepBlocks({s.dataset: s for s in secs}, [], load, "step 0")
    alone = StepBlocks({s.dataset: s for s in secs}, [], load, "step 0")
    out = []
    for s in secs:
        a = guarded(together.table, specs[s.dataset], specs)
        b = guarded(alone.table, specs[s.dataset])
        if isinstance(a, FormatError) or isinstance(b, FormatError):
            assert str(a) == str(b), s.dataset
        else:
            assert a.encode() == b.encode(), s.dataset
        out.append(a)
    return out


def test_one_block_step_seed_is_valid():
    specs, secs, area = ONE_BLOCK_STEP
    assert all(isinstance(t, BlockTable) for t in _tables_both_ways(specs, secs, area))


@given(st.data())
def test_one_block_sections_mutated_decode_as_alone(data):
    """The one-block sections of a step decoded together (a reader of many variables) give,
    on any mutation of the block area, what each decoded alone gives: the same table or the
    same FormatError.  The directory's checksums are made to match the mutated bytes, so the
    mutations reach the checks behind them."""
    from crc32c import crc32c

    specs, secs, area = ONE_BLOCK_STEP
    bad = data.draw(mutated(area))
    secs = [s._replace(crc=crc32c(bad[s.offset : s.offset + s.length])) for s in secs]
    _tables_both_ways(specs, secs, bad)


@given(st.binary(max_size=512))
def test_block_section_random(buf):
    for spec in SPECS:
        r = guarded(BlockTable.decode, buf, spec, "section")
        assert isinstance(r, (BlockTable, FormatError))


@given(st.data())
def test_component_decoders_mutated(data):
    e = Encoder()
    SPECS[1].encode(e)
    spec_raw = e.getvalue()
    r = guarded(lambda b: DatasetSpec.decode(Decoder(b)), data.draw(mutated(spec_raw)))
    assert isinstance(r, (DatasetSpec, FormatError))
    blk = BlockRecord(
        1, Box((3,), (20,)), 1, 2, 3, 4, 600_000, 1, 1 << 18, (1, 2, 3), Stats(1, 2, 3.0, 17)
    )
    e = Encoder()
    blk.encode(e, SPECS[1].dtype)
    r = guarded(lambda b: BlockRecord.decode(Decoder(b), SPECS), data.draw(mutated(e.getvalue())))
    assert isinstance(r, (BlockRecord, FormatError))


@given(mutated(COMMIT))
def test_parse_commits_mutated(bad):
    r = guarded(fmt.parse_commits, bad, len(META), "c")
    assert isinstance(r, (tuple, FormatError))
    if isinstance(r, tuple):
        entries, end, _head = r
        # whatever survives is a prefix of the real entries
        good, _, _ = fmt.parse_commits(COMMIT, len(META))
        assert entries == good[: len(entries)]
        assert end == fmt.HEADER_SIZE + fmt.ENTRY_SIZE * len(entries)


@given(st.data())
def test_parse_frame_mutated(data):
    entries, _, _ = fmt.parse_commits(COMMIT, len(META))
    e = data.draw(st.sampled_from(entries))
    frame = META[e.offset : e.offset + e.length]
    bad = data.draw(mutated(frame))
    r = guarded(fmt.parse_frame, bad, e, "m")
    if isinstance(r, bytes):
        assert r == frame[fmt.FRAME_HEAD.size :]  # only an unchanged frame passes
    else:
        assert isinstance(r, FormatError)


@given(st.data())
def test_read_metadata_mutated(data):
    which = data.draw(st.sampled_from(["meta", "commit", "both"]))
    meta = data.draw(mutated(META)) if which in ("meta", "both") else META
    commit = data.draw(mutated(COMMIT)) if which in ("commit", "both") else COMMIT
    r = guarded(read_metadata, meta, commit)
    if isinstance(r, Catalog):
        # a successful read is a prefix of the real history
        assert len(r.steps) <= 2
        good = read_metadata(META, COMMIT)
        for k in range(len(r.steps)):
            assert step_tables(r, k) == step_tables(good, k)
    else:
        assert isinstance(r, FormatError)


def test_torn_last_commit_entry_is_ignored():
    entries, _, _ = fmt.parse_commits(COMMIT, len(META))
    n = len(entries)
    for cut in range(1, fmt.ENTRY_SIZE + 1):
        got, end, _ = fmt.parse_commits(COMMIT[:-cut], len(META))
        assert got == entries[: n - 1] and end == len(COMMIT) - fmt.ENTRY_SIZE
    # a bad checksum in the last entry: also a commit that never happened
    bad = bytearray(COMMIT)
    bad[-10] ^= 0xFF
    got, _, _ = fmt.parse_commits(bytes(bad), len(META))
    assert got == entries[: n - 1]
    # ... but not in an earlier one
    bad = bytearray(COMMIT)
    bad[fmt.HEADER_SIZE + 3] ^= 0xFF
    with pytest.raises(FormatError, match="entry 0 is corrupt"):
        fmt.parse_commits(bytes(bad), len(META))


def test_commit_entries_checked_against_meta():
    with pytest.raises(FormatError, match="lamina.meta has"):
        fmt.parse_commits(COMMIT, len(META) - 1)
    # version 2: entries that are each valid but leave a gap between frames
    h = fmt.HEADER_SIZE
    v2 = (fmt.header(fmt.META_MAGIC, IDENTITY, 2), fmt.header(fmt.COMMIT_MAGIC, IDENTITY, 2))
    meta = v2[0] + fmt.frame(b"x") * 3
    commit = v2[1] + fmt.entry(0, h, 13, crc(b"x")) + fmt.entry(1, h + 14, 13, crc(b"x"))
    with pytest.raises(FormatError, match=f"expected offset {h + 13}"):
        fmt.parse_commits(commit, len(meta))
    # version 3 keeps block areas between frames: gaps are fine, going back is not
    meta = fmt.header(fmt.META_MAGIC, IDENTITY) + fmt.frame(b"x") * 3
    commit = (
        fmt.header(fmt.COMMIT_MAGIC, IDENTITY)
        + fmt.entry(0, h, 13, crc(b"x"))
        + fmt.entry(1, h + 14, 13, crc(b"x"))
    )
    assert len(fmt.parse_commits(commit, len(meta))[0]) == 2
    commit = (
        fmt.header(fmt.COMMIT_MAGIC, IDENTITY)
        + fmt.entry(0, h, 13, crc(b"x"))
        + fmt.entry(1, h + 12, 13, crc(b"x"))
    )
    with pytest.raises(FormatError, match=f"expected offset at least {h + 13}"):
        fmt.parse_commits(commit, len(meta))
    meta = fmt.header(fmt.META_MAGIC, IDENTITY) + fmt.frame(b"x") * 2
    commit = (
        fmt.header(fmt.COMMIT_MAGIC, IDENTITY)
        + fmt.entry(0, h, 13, crc(b"x"))
        + fmt.entry(5, h + 13, 13, crc(b"x"))
    )
    with pytest.raises(FormatError, match="sequence number 5"):
        fmt.parse_commits(commit, len(meta))


def test_header_errors():
    h = fmt.header(fmt.META_MAGIC, IDENTITY)
    assert fmt.check_header(h, fmt.META_MAGIC, "m") == fmt.Header(fmt.VERSION, 32, IDENTITY)
    with pytest.raises(lamina.NotALaminaFileError, match="bad magic"):
        fmt.check_header(h, fmt.COMMIT_MAGIC, "m")
    with pytest.raises(lamina.NotALaminaFileError):
        fmt.check_header(h[:10], fmt.META_MAGIC, "m")
    with pytest.raises(FormatError, match="truncated"):
        fmt.check_header(h[:20], fmt.META_MAGIC, "m")
    for pos in (10, 20):
        bad = bytearray(h)
        bad[pos] ^= 1
        with pytest.raises(FormatError, match="header checksum"):
            fmt.check_header(bytes(bad), fmt.META_MAGIC, "m")
    newer = fmt.META_MAGIC + struct.pack("<HH", fmt.VERSION + 1, 0)
    newer += struct.pack("<I", crc(newer))
    with pytest.raises(FormatError, match="newer"):
        fmt.check_header(newer, fmt.META_MAGIC, "m")
    # version 1: 16 bytes, no identity
    v1 = fmt.META_MAGIC + struct.pack("<HH", 1, 0)
    v1 += struct.pack("<I", crc(v1))
    assert fmt.check_header(v1, fmt.META_MAGIC, "m") == fmt.Header(1, 16, 0)
    zero = fmt.META_MAGIC + struct.pack("<HHIQI", 2, 0, 32, 0, 0)
    zero += struct.pack("<I", crc(zero))
    with pytest.raises(FormatError, match="inconsistent header"):
        fmt.check_header(zero, fmt.META_MAGIC, "m")


# --------------------------------------------------------------------------
# level 3: real files corrupted at random positions


NSTEPS = 4


@pytest.fixture(scope="module")
def real_file(tmp_path_factory):
    """A native file with several steps, groups, attributes and a compressed dataset; and its data."""
    path = str(tmp_path_factory.mktemp("fuzz") / "real.lam")
    rng = np.random.default_rng(7)
    with lamina.open(path, "w", engine="native") as f:
        t = f.create_dataset("fields/T", shape=(12, 10), dtype="f4")
        n = f.create_dataset("fields/n", shape=(30,), dtype="i8", compression="zstd", fill=-1)
        f.attrs["title"] = "fuzz target"
        t.attrs["units"] = ["K"]
        for k in range(NSTEPS):
            a = rng.standard_normal((12, 10)).astype("f4")
            b = np.arange(30) * k
            with f.step():
                t[:6] = a[:6]
                t[6:] = a[6:]
                n[: 10 * (k + 1) if k < 3 else 30] = b[: 10 * (k + 1) if k < 3 else 30]
    with lamina.open(path, "r", engine="native") as f:
        truth = [(f.at(k)["fields/T"][...], f.at(k)["fields/n"][...]) for k in range(NSTEPS)]
    files = {
        name: open(os.path.join(path, name), "rb").read()
        for name in (fmt.META_NAME, fmt.COMMIT_NAME)
    }
    return _Quiet((path, truth, files))


class _Quiet(tuple):
    """A tuple whose repr stays short in hypothesis failure reports."""

    def __repr__(self) -> str:
        return "<real lamina file>"


def open_and_read_all(path: str):
    """Open read-only and read every dataset at every step; returns the step count and the data."""
    with lamina.open(path, "r", engine="native") as f:
        out = []
        for k in range(f.steps):
            v = f.at(k)
            out.append((v["fields/T"][...], v["fields/n"][...]))
        if f.steps:  # attributes were committed with step 0
            assert f.attrs["title"] == "fuzz target"
        return f.steps, out


def _check_corrupted_open(path, truth):
    try:
        t0 = time.monotonic()
        nsteps, data = open_and_read_all(path)
        assert time.monotonic() - t0 < TIME_LIMIT
    except FormatError:
        return "error"
    # a read that succeeds is a valid prefix of what was written
    assert nsteps <= len(truth)
    for (a, b), (ta, tb) in zip(data, truth, strict=False):
        np.testing.assert_array_equal(a, ta)
        np.testing.assert_array_equal(b, tb)
    return nsteps


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupt_real_metadata_files(real_file, data):
    path, truth, files = real_file
    name = data.draw(st.sampled_from([fmt.META_NAME, fmt.COMMIT_NAME]))
    bad = data.draw(mutated(files[name]))
    target = os.path.join(path, name)
    try:
        with open(target, "wb") as fh:
            fh.write(bad)
        _check_corrupted_open(path, truth)
    finally:
        with open(target, "wb") as fh:
            fh.write(files[name])


def test_real_file_sanity(real_file):
    path, truth, _ = real_file
    assert _check_corrupted_open(path, truth) == NSTEPS


def test_real_file_torn_commit_entries_give_prefixes(real_file):
    path, truth, files = real_file
    commit = files[fmt.COMMIT_NAME]
    target = os.path.join(path, fmt.COMMIT_NAME)
    nentries = (len(commit) - fmt.HEADER_SIZE) // fmt.ENTRY_SIZE
    seen = set()
    try:
        for keep in range(nentries + 1):
            for extra in (0, 1, 17, 31):
                if keep == nentries and extra:
                    continue
                with open(target, "wb") as fh:
                    fh.write(commit[: fmt.HEADER_SIZE + keep * fmt.ENTRY_SIZE + extra])
                got = _check_corrupted_open(path, truth)
                assert got != "error", (keep, extra)
                seen.add(got)
    finally:
        with open(target, "wb") as fh:
            fh.write(commit)
    # every prefix length of steps was reachable
    assert seen == set(range(NSTEPS + 1))


def test_real_file_every_single_byte_flip(real_file, tmp_path):
    """Flip each byte of both metadata files once: always a FormatError or a valid prefix."""
    path, truth, files = real_file
    work = str(tmp_path / "copy.lam")
    shutil.copytree(path, work)
    outcomes = {}
    for name in (fmt.META_NAME, fmt.COMMIT_NAME):
        raw = files[name]
        target = os.path.join(work, name)
        for pos in range(0, len(raw), max(1, len(raw) // 150)):
            bad = bytearray(raw)
            bad[pos] ^= 0x5A
            with open(target, "wb") as fh:
                fh.write(bad)
            outcomes[(name, pos)] = _check_corrupted_open(work, truth)
        with open(target, "wb") as fh:
            fh.write(raw)
    # a flip in lamina.meta always breaks a checksum: an error, except in the last record's
    # frame (the writer's close), which a reader leaves out and says so; in the last commit
    # entry it is a torn commit
    entries, _, _ = fmt.parse_commits(files[fmt.COMMIT_NAME], len(files[fmt.META_NAME]))
    for (n, pos), v in outcomes.items():
        if n == fmt.META_NAME:
            assert v == (NSTEPS if pos >= entries[-1].offset else "error"), (pos, v)
    last = len(files[fmt.COMMIT_NAME]) - fmt.ENTRY_SIZE
    for (n, pos), v in outcomes.items():
        if n == fmt.COMMIT_NAME:
            assert (v != "error") == (pos >= last), (pos, v)


@given(st.binary(max_size=200), st.binary(max_size=200))
@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_open_directory_with_random_metadata(tmp_path, meta, commit):
    path = tmp_path / "rand.lam"
    path.mkdir(exist_ok=True)
    for name, magic, tail in (
        (fmt.META_NAME, fmt.META_MAGIC, meta),
        (fmt.COMMIT_NAME, fmt.COMMIT_MAGIC, commit),
    ):
        (path / name).write_bytes(
            fmt.header(magic, IDENTITY) + tail if tail[:1] != b"\x00" else tail
        )
    try:
        with lamina.open(str(path), "r", engine="native") as f:
            assert f.steps >= 0
    except FormatError:
        pass
