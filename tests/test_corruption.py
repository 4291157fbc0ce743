"""Damaged files: every byte of data is checksummed, every byte of metadata is framed.

A flipped byte in a data subfile is a ChecksumError that names the file, the
dataset and the block; damaged or truncated metadata and truncated subfiles
are FormatErrors when the file is opened.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import lamina
from lamina.engines import memory as memory_engine
from lamina.engines.native import format as fmt
from lamina.errors import ChecksumError, FormatError, LaminaWarning, NotALaminaFileError
from lamina.geometry import Box
from lamina.stats import CHUNK

pytestmark = pytest.mark.usefixtures("fast_native")

COMPRESSIONS = [None, "zstd", "zlib", ("zfp", 1e-6)]


def flip(path: str, offset: int, mask: int = 0x40) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def smooth(shape, k=0):
    grids = np.meshgrid(*[np.linspace(0, 1, n) for n in shape], indexing="ij")
    # few mantissa bits, so lossless codecs really compress it
    return np.round((np.sin(3 * sum(grids) + k) + 2.0) * 8) / 8


def make_file(path, compression=None, steps=2, shape=(16, 12)):
    """Two blocks (first and second half of the rows) per step of 'grid/u' (compressible data)."""
    truth = []
    h = shape[0] // 2
    with lamina.open(path, "w", engine="native") as f:
        ds = f.create_dataset("grid/u", shape=shape, dtype="f8", compression=compression)
        for k in range(steps):
            a = smooth(shape, k)
            with f.step():
                ds[:h] = a[:h]
                ds[h:] = a[h:]
            truth.append(a)
    return truth


def block_of(path, step, index, name="grid/u"):
    with lamina.open(path, "r", engine="native") as f:
        return f[name].blocks(step)[index]


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=str)
def test_flipped_data_byte_is_checksum_error(native_path, compression):
    truth = make_file(native_path, compression)
    b = block_of(native_path, 1, 1)
    if compression is not None:
        assert b.codec != "raw"  # the data compresses, so the payload is the compressed bytes
    flip(os.path.join(native_path, b.subfile), b.offset + b.nbytes // 2)
    with lamina.open(native_path, "r", engine="native") as f:
        ds = f["grid/u"]
        # the other block of the same step and the whole previous step are intact
        np.testing.assert_allclose(ds[:8], truth[1][:8], atol=1e-5)
        np.testing.assert_allclose(f.at(0)["grid/u"][...], truth[0], atol=1e-5)
        for key in (Ellipsis, (slice(9, 11), slice(2, 5)), (10,), (slice(None), 3)):
            with pytest.raises(ChecksumError) as ei:
                ds[key]
            msg = str(ei.value)
            assert b.subfile in msg and native_path in msg
            assert "grid/u" in msg
            assert str(b.box) in msg
            assert msg.endswith("(step 1)"), msg
        # ChecksumError is a FormatError is an OSError
        assert isinstance(ei.value, FormatError) and isinstance(ei.value, OSError)


@pytest.mark.parametrize("shapes", ["one", "mixed"])
def test_flipped_byte_in_a_run_of_small_blocks(native_path, shapes):
    """Small blocks back to back in a subfile are read with one pread per run and checked each.

    Blocks of one shape go into place with one scatter per run, blocks of
    several shapes one by one; both name the damaged block, and every other
    block reads back right.
    """
    rng = np.random.default_rng(3)
    truth = rng.random((16, 16, 16))
    edges = [(4, 4, 4)] if shapes == "one" else [(4, 4, 4), (4, 2, 4)]
    boxes = []
    for i in range(0, 16, 4):
        for j in range(0, 16, 4):
            for k in range(0, 16, 4):
                e = edges[(i + j + k) // 4 % len(edges)]
                boxes += [((i, j + m, k), e) for m in range(0, 4, e[1])]
    with lamina.open(native_path, "w", engine="native") as f:
        ds = f.create_dataset("u", truth.shape, "f8")
        with f.step():
            for (i, j, k), (a, b, c) in boxes:
                ds.write(truth[i : i + a, j : j + b, k : k + c], offset=(i, j, k))
    with lamina.open(native_path, "r", engine="native") as f:
        np.testing.assert_array_equal(f["u"][...], truth)
        np.testing.assert_array_equal(f["u"][3:13, 1:15, 2:9], truth[3:13, 1:15, 2:9])
        victim = f["u"].blocks(0)[len(boxes) // 2]
    flip(os.path.join(native_path, victim.subfile), victim.offset + 9)
    with lamina.open(native_path, "r", engine="native") as f:
        with pytest.raises(ChecksumError, match=re.escape(str(victim.box))):
            f["u"][...]
        np.testing.assert_array_equal(f["u"][:4], truth[:4])  # the damaged block lies further


@pytest.mark.parametrize("compression", [None, "zstd"], ids=str)
def test_a_dataset_of_one_block_a_step_read_whole(native_path, monkeypatch, compression):
    """A dataset written as one block a step and read whole at a step is read straight from
    the step's table (no block record made): the values, the bytes counted and every checksum
    segment checked as on the general path; a flipped byte names the dataset and the block.
    A part of the block, a strided output or a compressed block take the general path."""
    from lamina.catalog.blocks import BlockTable

    seg = CHUNK
    shapes = {"s": (), "v": (7,), "g": (3, 4, 5), "big": (3 * seg // 8 // 64, 64)}
    rng = np.random.default_rng(11)
    truth = {k: [rng.random(sh) for _ in range(2)] for k, sh in shapes.items()}
    with lamina.open(native_path, "w", engine="native", checksum_segment=seg) as f:
        dss = {
            k: f.create_dataset(k, sh, "f8", compression=compression) for k, sh in shapes.items()
        }
        for step in range(2):
            with f.step():
                for k, ds in dss.items():
                    ds.write(truth[k][step])
    made = []
    record = BlockTable.record
    monkeypatch.setattr(BlockTable, "record", lambda *a, **k: made.append(1) or record(*a, **k))
    with lamina.open(native_path, "r", engine="native") as f:
        for k in shapes:
            for step in range(2):
                before = f.engine.bytes_read
                np.testing.assert_array_equal(f[k].read(step=step), truth[k][step])
                if compression is None:
                    assert f.engine.bytes_read - before == truth[k][step].nbytes
        assert (made == []) == (compression is None)  # the raw blocks: no record made
        made.clear()
        np.testing.assert_array_equal(
            f["g"].read(Box((1, 0, 0), (3, 4, 5)), step=1), truth["g"][1][1:]
        )
        strided = np.empty((3, 4, 10))[:, :, ::2]
        f["g"].read(step=0, out=strided)
        np.testing.assert_array_equal(strided, truth["g"][0])
        assert len(made) == 2  # the part and the strided output: the general path
    b = block_of(native_path, 1, 0, "big")
    assert b.nbytes > 2 * seg  # several checksum segments
    flip(os.path.join(native_path, b.subfile), b.offset + 2 * seg + 5)
    with lamina.open(native_path, "r", engine="native") as f:
        np.testing.assert_array_equal(f["big"].read(step=0), truth["big"][0])
        with pytest.raises(ChecksumError) as err:
            f["big"].read(step=1)
        msg = str(err.value)
        assert "'big'" in msg and str(b.box) in msg and b.subfile in msg
        if compression is None:
            assert "segment 2" in msg


def test_partial_reads_verify_only_touched_segments(native_path):
    """With 256 KiB checksum segments, damage in one segment fails only reads that touch it."""
    n = 4 * CHUNK // 8  # 4 segments of float64
    shape = (n // 256, 256)
    a = np.arange(n, dtype="f8").reshape(shape)
    with lamina.open(native_path, "w", engine="native", checksum_segment=CHUNK) as f:
        f.create_dataset("big", shape=shape, dtype="f8")
        f["big"][...] = a
    b = block_of(native_path, 0, 0, "big")
    rows_per_seg = shape[0] // 4
    flip(os.path.join(native_path, b.subfile), b.offset + 2 * CHUNK + 100)  # inside segment 2
    with lamina.open(native_path, "r", engine="native") as f:
        ds = f["big"]
        np.testing.assert_array_equal(ds[: 2 * rows_per_seg], a[: 2 * rows_per_seg])
        np.testing.assert_array_equal(ds[3 * rows_per_seg :, 5:9], a[3 * rows_per_seg :, 5:9])
        with pytest.raises(ChecksumError, match="segment 2") as ei:
            ds[2 * rows_per_seg + 1, :]
        assert "'big'" in str(ei.value)
        with pytest.raises(ChecksumError, match="segment 2"):
            ds[...]
        with pytest.raises(ChecksumError, match="segment 2"):
            ds[rows_per_seg : 3 * rows_per_seg + 1, 0]


def test_single_segment_block_detects_every_flip(native_path):
    truth = make_file(native_path, None, steps=1, shape=(4, 4))
    b = block_of(native_path, 0, 0)
    sub = os.path.join(native_path, b.subfile)
    for pos in range(b.offset, b.offset + b.nbytes, 7):
        flip(sub, pos)
        with lamina.open(native_path, "r", engine="native") as f:
            with pytest.raises(ChecksumError):
                f["grid/u"][1:3]
            np.testing.assert_array_equal(f["grid/u"][2:], truth[0][2:])
        flip(sub, pos)  # undo
    with lamina.open(native_path, "r", engine="native") as f:
        np.testing.assert_array_equal(f["grid/u"][...], truth[0])


@pytest.mark.parametrize("name", [fmt.META_NAME, fmt.COMMIT_NAME])
@pytest.mark.parametrize("where", ["header", "middle", "first-record"])
def test_flipped_metadata_is_format_error(native_path, name, where):
    make_file(native_path, "zstd")
    path = os.path.join(native_path, name)
    size = os.path.getsize(path)
    pos = {"header": 9, "middle": size // 2, "first-record": fmt.HEADER_SIZE + 5}[where]
    if name == fmt.COMMIT_NAME and pos >= size - fmt.ENTRY_SIZE:
        pos = fmt.HEADER_SIZE + 5  # the last entry would be a torn commit, tested in test_fuzz
    flip(path, pos)
    # the blocks of a step are read from lamina.meta when the step is first read
    with pytest.raises(FormatError) as ei:
        read_everything(native_path)
    assert native_path in str(ei.value) or "lamina" in str(ei.value)


def _last_frame(path: str) -> fmt.CommitEntry:
    commit = open(os.path.join(path, fmt.COMMIT_NAME), "rb").read()
    entries, _, _ = fmt.parse_commits(commit, os.path.getsize(os.path.join(path, fmt.META_NAME)))
    return entries[-1]


@pytest.mark.parametrize("last", ["close", "step"])
def test_a_damaged_last_record_leaves_the_steps_before_it(native_path, last):
    """A valid last commit entry whose frame fails its checksum (what a power loss can leave
    with durable=False): a reader opens the steps before it and says what it left out; a
    writer in 'a' refuses and changes nothing; damage further back stays a FormatError."""
    truth = make_file(native_path, steps=3)
    if last == "step":  # a file whose writer was killed after its last step: no close record
        os.truncate(
            os.path.join(native_path, fmt.COMMIT_NAME),
            os.path.getsize(os.path.join(native_path, fmt.COMMIT_NAME)) - fmt.ENTRY_SIZE,
        )
    e = _last_frame(native_path)
    flip(os.path.join(native_path, fmt.META_NAME), e.offset + e.length - 3)
    kept = 3 if last == "close" else 2
    with pytest.warns(
        LaminaWarning, match=rf"record {e.seq} .*fails its checksum.*steps before it open"
    ):
        with lamina.open(native_path, "r", engine="native") as f:
            assert f.steps == kept
            for k in range(kept):
                np.testing.assert_array_equal(f.at(k)["grid/u"][...], truth[k])
    before = {n: open(os.path.join(native_path, n), "rb").read() for n in os.listdir(native_path)}
    with pytest.raises(FormatError, match=r"does not append after a damaged record"):
        lamina.open(native_path, "a", engine="native")
    after = {n: open(os.path.join(native_path, n), "rb").read() for n in os.listdir(native_path)}
    assert after == before
    # the same damage in the record before the last is corruption, not a torn commit
    flip(os.path.join(native_path, fmt.META_NAME), e.offset + e.length - 3)  # undo
    commit = open(os.path.join(native_path, fmt.COMMIT_NAME), "rb").read()
    entries, _, _ = fmt.parse_commits(
        commit, os.path.getsize(os.path.join(native_path, fmt.META_NAME))
    )
    flip(os.path.join(native_path, fmt.META_NAME), entries[-2].offset + entries[-2].length - 3)
    with pytest.raises(FormatError, match=rf"record {entries[-2].seq} .*fails its checksum"):
        read_everything(native_path)


def read_everything(path: str) -> None:
    with lamina.open(path, "r", engine="native") as f:
        for k in range(f.steps):
            f.at(k)["grid/u"][...]


def test_bad_magic_is_not_a_lamina_file(native_path):
    make_file(native_path)
    flip(os.path.join(native_path, fmt.COMMIT_NAME), 0)
    with pytest.raises(NotALaminaFileError, match="not a lamina file"):
        lamina.open(native_path, "r", engine="native")


def test_truncated_subfile_opens_the_intact_steps(native_path):
    """A subfile cut short (an interrupted copy): the steps before open, a warning says what was left out."""
    truth = make_file(native_path, steps=3)
    b = block_of(native_path, 1, 1)
    sub = os.path.join(native_path, b.subfile)
    os.truncate(sub, b.offset + b.nbytes - 1)
    with pytest.warns(LaminaWarning) as warned:
        f = lamina.open(native_path, "r", engine="native")
    with f:
        assert f.steps == 1  # step 1's block is cut: steps 1 and 2 are left out
        np.testing.assert_array_equal(f.at(0)["grid/u"][...], truth[0])
    msg = str(warned[0].message)
    assert b.subfile in msg and "grid/u" in msg and str(b.box) in msg and "step 1 on" in msg
    # a writer goes on after the intact steps; what was left out is gone
    with pytest.warns(LaminaWarning):
        w = lamina.open(native_path, "a", engine="native")
    with w:
        assert w.steps == 1
        with w.step() as k:
            assert k == 1
            w["grid/u"][...] = 7.0
    with lamina.open(native_path, "r", engine="native") as f:
        assert f.steps == 2
        np.testing.assert_array_equal(f.at(1)["grid/u"][...], 7.0)


@pytest.mark.parametrize("what", ["one block", "a run of blocks"])
def test_subfile_cut_under_an_open_reader_names_file_and_dataset(native_path, what):
    """A subfile cut short after the reader opened it: the read of a block alone, or of a
    run of blocks back to back, is a FormatError naming the subfile and the dataset."""
    make_file(native_path, steps=1)
    b = block_of(native_path, 0, 0)
    with lamina.open(native_path, "r", engine="native") as f:
        ds = f["grid/u"]
        os.truncate(os.path.join(native_path, b.subfile), b.offset + 8)
        with pytest.raises(FormatError, match="file ends at byte") as ei:
            ds.read(lamina.Box((1, 0), (3, 12)) if what == "one block" else None)
        msg = str(ei.value)
        assert f"{native_path}/{b.subfile}: dataset 'grid/u'" in msg
        if what == "one block":
            assert f"block {b.box}" in msg


def test_missing_subfile_leaves_its_steps_out(native_path):
    make_file(native_path)
    b = block_of(native_path, 0, 0)
    os.remove(os.path.join(native_path, b.subfile))
    with pytest.warns(LaminaWarning, match="missing"):
        f = lamina.open(native_path, "r", engine="native")
    with f:
        assert f.steps == 0 and "grid/u" not in f  # the dataset was defined in the first record


@pytest.mark.parametrize("name", [fmt.META_NAME, fmt.COMMIT_NAME])
def test_missing_metadata_file(native_path, name):
    make_file(native_path)
    os.remove(os.path.join(native_path, name))
    with pytest.raises(NotALaminaFileError):
        lamina.open(native_path, "r", engine="native")


def test_truncated_meta_is_format_error(native_path):
    """lamina.meta cut inside its last frame (the writer's close) leaves that record out, with
    a warning, for readers (a writer refuses the file); cut further back, inside the last
    step's frame, the records from that one on are left out as those of a copy taken while
    it was written (a torn copy), and a writer refuses it too."""
    truth = make_file(native_path)
    meta = os.path.join(native_path, fmt.META_NAME)
    last = _last_frame(native_path)
    os.truncate(meta, os.path.getsize(meta) - 3)
    with pytest.warns(LaminaWarning, match=rf"record {last.seq} is truncated"):
        with lamina.open(native_path, "r", engine="native") as f:
            assert f.steps == len(truth)
    with pytest.raises(FormatError, match="lamina.meta has"):
        lamina.open(native_path, "a", engine="native")
    os.truncate(meta, last.offset - 3)
    with pytest.warns(LaminaWarning, match="copied or cut at different moments"):
        with lamina.open(native_path, "r", engine="native") as f:
            assert f.steps == len(truth) - 1
    with pytest.raises(FormatError, match="lamina.meta has"):
        lamina.open(native_path, "a", engine="native")


def test_a_copy_whose_metadata_was_copied_first_opens_the_steps_it_holds(native_path):
    """A copy of a file being written (cp -r copies lamina.meta, then lamina.commit) holds
    commit entries of records lamina.meta does not: it could not be opened at all ('commit
    entry 3 points at bytes ... but lamina.meta has ...'), though docs/format.md lists an
    interrupted copy among the files cut short whose steps before open."""
    truth = make_file(native_path, steps=6)
    commit = open(os.path.join(native_path, fmt.COMMIT_NAME), "rb").read()
    meta = os.path.join(native_path, fmt.META_NAME)
    entries, _, _ = fmt.parse_commits(commit, os.path.getsize(meta))
    assert len(entries) == 7  # six steps and the close
    os.truncate(meta, entries[2].offset + entries[2].length)  # as copied after step 2
    with pytest.warns(
        LaminaWarning,
        match=r"4 committed records \(records 3\.\.6\) point past the end of lamina\.meta .*"
        r"copied or cut at different moments",
    ):
        with lamina.open(native_path, "r", engine="native") as f:
            assert f.steps == 3
            for k in range(3):
                np.testing.assert_array_equal(f.at(k)["grid/u"][...], truth[k])
    before = {n: open(os.path.join(native_path, n), "rb").read() for n in os.listdir(native_path)}
    with pytest.raises(FormatError, match="lamina.meta has"):
        lamina.open(native_path, "a", engine="native")
    after = {n: open(os.path.join(native_path, n), "rb").read() for n in os.listdir(native_path)}
    assert after == before


def test_a_copy_taken_in_the_middle_of_a_frame_opens_the_steps_before(native_path):
    """lamina.meta copied while a record's frame was being written: that frame runs past
    its end and the later ones start past it. The same torn copy, not corruption (it was
    'commit entry 3 points at bytes ... but lamina.meta has ...', no step opened)."""
    truth = make_file(native_path, steps=6)
    commit = open(os.path.join(native_path, fmt.COMMIT_NAME), "rb").read()
    meta = os.path.join(native_path, fmt.META_NAME)
    entries, _, _ = fmt.parse_commits(commit, os.path.getsize(meta))
    os.truncate(meta, entries[3].offset + entries[3].length // 2)
    with pytest.warns(LaminaWarning, match=r"4 committed records \(records 3\.\.6\) point"):
        with lamina.open(native_path, "r", engine="native") as f:
            assert f.steps == 3
            np.testing.assert_array_equal(f.at(2)["grid/u"][...], truth[2])
    with pytest.raises(FormatError, match="copied or cut at different moments"):
        lamina.open(native_path, "a", engine="native")


def test_truncated_commit_drops_only_the_torn_step(native_path):
    truth = make_file(native_path, steps=3)
    commit = os.path.join(native_path, fmt.COMMIT_NAME)
    # records: step 0 (with the definitions), step 1, step 2, close
    os.truncate(commit, fmt.HEADER_SIZE + 3 * fmt.ENTRY_SIZE - 5)
    with lamina.open(native_path, "r", engine="native") as f:
        assert f.steps == 2
        assert not f.engine.writer_closed
        for k in range(2):
            np.testing.assert_array_equal(f.at(k)["grid/u"][...], truth[k])


def test_corrupt_file_can_be_rewritten(native_path):
    make_file(native_path)
    flip(os.path.join(native_path, fmt.META_NAME), 40)
    with pytest.raises(FormatError):
        read_everything(native_path)
    # mode 'w' replaces it
    truth = make_file(native_path, steps=1)
    with lamina.open(native_path, "r", engine="native") as f:
        np.testing.assert_array_equal(f["grid/u"][...], truth[0])


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_memory_engine_detects_corrupt_block(compression):
    path = "mem://corruption-test"
    try:
        with lamina.open(path, "w", engine="memory") as f:
            ds = f.create_dataset("x", shape=(64,), dtype="i4", compression=compression)
            ds[:32] = np.zeros(32, dtype="i4")
            ds[32:] = np.arange(32, dtype="i4")
        store = memory_engine._STORES[path]
        with lamina.open(path, "r", engine="memory") as f:
            second = f["x"].blocks()[1]
        held = store.data[(0, 0)]  # session 0, rank 0: both blocks, back to back
        held[second.offset + second.nbytes // 2] ^= 1
        with lamina.open(path, "r", engine="memory") as f:
            np.testing.assert_array_equal(f["x"][:32], 0)
            with pytest.raises(ChecksumError, match="'x'"):
                f["x"][40:50]
        # a block gone missing is also reported
        del held[second.offset :]
        with lamina.open(path, "r", engine="memory") as f:
            with pytest.raises(ChecksumError, match="missing"):
                f["x"][...]
    finally:
        memory_engine.drop(path)


def _with_boxes(t, start, stop):
    """Table *t* with its boxes replaced: what a section forged with valid checksums decodes to."""
    from lamina.catalog.blocks import BlockTable

    cols = {
        k: getattr(t, k)
        for k in ("rank", "session", "agg", "offset", "length", "codec", "seg", "ncrc", "crcs")
    }
    cols.update(has_stats=t.has_stats, smin=t.smin, smax=t.smax, ssum=t.ssum, count=t.count)
    return BlockTable(
        t.dtype, np.array(start, dtype=np.int64), np.array(stop, dtype=np.int64), **cols
    )


def test_overlapping_blocks_in_forged_metadata_are_a_format_error(native_path):
    """A section whose checksums match but whose boxes overlap (forged or damaged metadata; a
    writer never commits one) is refused by any read that puts two of its blocks together,
    naming both, instead of returning one block's values where the other's belong or memory
    nobody wrote.  A read of a region one block alone covers reads that block."""
    with lamina.open(native_path, "w") as f:
        z = f.create_dataset("z", shape=(8,), dtype="i8", fill=7)
        with f.step():
            z[0:4] = np.arange(4)
            z[4:8] = np.arange(4, 8)
    with lamina.open(native_path) as r:
        eng = r.engine.stack()[-1]
        spec = eng.catalog.datasets["z"]
        t = eng.catalog.table(spec.id, 0)
        eng.catalog.steps[0]._tables[spec.id] = _with_boxes(t, [[0], [0]], [[4], [4]])
        for sel in (np.s_[...], np.s_[2:8], np.s_[0:4]):
            with pytest.raises(FormatError, match=r"step 0: blocks \[0:4\] and \[0:4\] overlap"):
                r["z"][sel]
        np.testing.assert_array_equal(r["z"][4:8], np.full(4, 7))  # no block: the fill


def _written_with_layout_or_codecs(path, monkeypatch, **change):
    """A file whose dataset definitions are recorded with *change* applied (forged metadata
    whose checksums all match: lamina itself encodes the altered definition)."""
    from lamina.catalog import model

    encode = model.DatasetSpec.encode

    def forged(self, e):
        saved = (self.layout, self.codecs)
        if (
            self.layout is not None
            and self.layout.get("layout") == "multires"
            and "patch" in change
        ):
            object.__setattr__(self, "layout", {**self.layout, "patch": change["patch"]})
        if self.codecs and "codecs" in change:
            object.__setattr__(self, "codecs", change["codecs"])
        try:
            encode(self, e)
        finally:
            object.__setattr__(self, "layout", saved[0])
            object.__setattr__(self, "codecs", saved[1])

    monkeypatch.setattr(model.DatasetSpec, "encode", forged)
    with lamina.open(path, "w") as f:
        if "patch" in change:
            d = f.create_dataset("m", (8, 8), "f4", layout=lamina.Multires(patch=4, tolerance=0))
        else:
            d = f.create_dataset("m", (8, 8), "f4", compression="zstd")
        with f.step():
            d[...] = np.arange(64.0).reshape(8, 8)
    monkeypatch.setattr(model.DatasetSpec, "encode", encode)


@pytest.mark.parametrize(
    "change, words",
    [
        # levels of patch 4 defined, the layout saying patch 8 (a level more): was KeyError: 3
        (dict(patch=[8, 8]), "dataset 'm': level 3 is not defined in the file"),
        # int() took "44" for (4, 4), 4.9 for 4, true for 1
        (dict(patch="44"), "patch '44' is not a list of integers"),
        (dict(patch=[4.9, 4]), r"patch \[4.9, 4\] is not a list of integers"),
        (dict(patch=[True, 4]), r"patch \[True, 4\] is not a list of integers"),
        # a codec outside the allowed list, or bad parameters: was a CodecError naming neither
        (dict(codecs=({"id": "numcodecs.pickles.Pickle"},)), "is stored with codecs this lamina"),
        (dict(codecs=({"id": "zstd", "level": "3"},)), "is stored with codecs this lamina"),
    ],
)
def test_forged_layouts_and_codecs_are_format_errors(native_path, monkeypatch, change, words):
    """Definitions a writer never records, whose checksums match: a FormatError naming the
    dataset (and the file, for codecs) when it is opened or read, never a KeyError or an
    import of what the file names."""
    _written_with_layout_or_codecs(native_path, monkeypatch, **change)
    with pytest.raises(FormatError, match=words):
        with lamina.open(native_path) as f:
            f["m"][...]


def _written_with_layout_fields(path, monkeypatch, change, level: bool = False):
    """A file of a plain dataset T and a multiresolution dataset m whose layout record (or,
    with *level*, its level 1's) is recorded with *change* applied (None: a field left out),
    its checksums matching."""
    from lamina.catalog import model

    encode = model.DatasetSpec.encode
    kind = "multires-level" if level else "multires"

    def forged(self, e):
        saved = self.layout
        if saved is not None and saved.get("layout") == kind:
            lay = {**saved, **change}
            object.__setattr__(self, "layout", {k: v for k, v in lay.items() if v is not None})
        try:
            encode(self, e)
        finally:
            object.__setattr__(self, "layout", saved)

    monkeypatch.setattr(model.DatasetSpec, "encode", forged)
    with lamina.open(path, "w") as f:
        t = f.create_dataset("T", (4,), "f8")
        d = f.create_dataset("m", (8, 8), "f4", layout=lamina.Multires(patch=4, tolerance=0))
        with f.step():
            t[...] = 1.0
            d[...] = np.arange(64.0).reshape(8, 8)
    monkeypatch.setattr(model.DatasetSpec, "encode", encode)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"optimism": None}, "the layout has no field 'optimism'"),
        ({"optimism": None, "verify": None}, "the layout has no fields 'verify', 'optimism'"),
        # a newer writer's field may change what the bands mean: not read as if absent
        ({"wavelet": "cdf97"}, "the layout has the field 'wavelet', which this lamina does not"),
    ],
)
def test_a_layout_missing_a_field_or_with_an_unknown_one_is_refused(
    native_path, monkeypatch, capsys, change, words
):
    """A multiresolution layout record without one of its fields, or with one this lamina
    does not write: a FormatError naming the file, the record, the dataset and the field
    (was a bare KeyError text, or the field silently ignored); the file's other datasets
    read, and ``lamina ls`` lists them and marks that one with the reason."""
    import json

    from lamina import cli

    _written_with_layout_fields(native_path, monkeypatch, change)
    where = re.escape(f"{native_path}/{fmt.META_NAME} record ") + r"\d+: layout of dataset 'm': "
    with lamina.open(native_path) as f:
        assert f["T"][0] == 1.0
        with pytest.raises(FormatError, match=where + re.escape(words)):
            f["m"][...]
    assert cli.main(["ls", native_path]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\n  m  float32 \(8, 8\)  unreadable: .*" + re.escape(words), out), out
    assert "\n  T  float64 (4,)  steps 0 (1 of 1)" in out
    assert cli.main(["ls", native_path, "--json"]) == 0
    nodes = {n["path"]: n for n in json.loads(capsys.readouterr().out)["nodes"]}
    assert words in nodes["/m"]["error"] and "error" not in nodes["/T"]


def test_a_level_definition_with_an_unknown_field_is_refused(native_path, monkeypatch):
    _written_with_layout_fields(native_path, monkeypatch, {"wavelet": "cdf97"}, level=True)
    with pytest.raises(
        FormatError,
        match=r"record \d+: level definition 'm level 1' has the field 'wavelet', which this",
    ):
        lamina.open(native_path)


def test_an_unknown_band_header_names_the_file_the_subfile_and_the_step(native_path, monkeypatch):
    """Bands whose header says a version this lamina does not read (a newer writer's), their
    checksums matching: the FormatError names the dataset, the step, the block, the level and
    the subfile of the file, as a read's other errors do."""
    from lamina.layouts import write as layout_write

    with lamina.open(native_path, "w") as f:
        d = f.create_dataset("m", (8, 8), "f4", layout=lamina.Multires(patch=8, tolerance=0))
        with f.step():
            d[...] = 1.0
        monkeypatch.setattr(layout_write, "HEADER_VERSION", 2)
        with f.step():
            d[...] = 2.0
    monkeypatch.undo()
    words = (
        re.escape("dataset 'm' step 1: block [0:8, 0:8] of level 0 in ")
        + re.escape(native_path)
        + r"/data\.0\.0 has an unknown header \(version 2, mode \d; this lamina reads version 1"
    )
    with lamina.open(native_path) as f:
        assert f.at(0)["m"][0, 0] == 1.0
        with pytest.raises(FormatError, match=words):
            f.at(1)["m"][...]


def test_tables_found_disjoint_once_for_boxes_alike(monkeypatch):
    """The overlap check runs once for a table and once for boxes like the last table found
    disjoint (a step written like the one before); boxes that differ are checked again."""
    from lamina import geometry
    from lamina.catalog import blocks as cb
    from lamina.catalog.blocks import BlockTable

    calls = []
    real = cb.find_overlap_arrays
    monkeypatch.setattr(cb, "find_overlap_arrays", lambda *a: (calls.append(1), real(*a))[1])
    monkeypatch.setattr(cb, "_disjoint_last", None)

    def table(lo, width=(3, 5, 4)):  # blocks of several widths: no grid, the full search
        lo = np.array(lo, dtype=np.int64).reshape(-1, 1)
        return BlockTable.build("f8", lo, lo + np.array(width).reshape(-1, 1))

    a, b = table([0, 3, 8]), table([0, 3, 8])
    a.check_disjoint("t")
    a.check_disjoint("t")
    b.check_disjoint("t")
    assert len(calls) == 1
    table([0, 3, 9]).check_disjoint("t")
    assert len(calls) == 2
    with pytest.raises(FormatError, match=r"blocks \[3:8\] and \[6:10\] overlap"):
        table([0, 3, 6]).check_disjoint("t")
    table([0, 4, 8], (4, 4, 4)).check_disjoint("t")  # cells of a grid: counted, not searched
    assert len(calls) == 3 and geometry.find_overlap_arrays is real
    # the bytes of two 2-D blocks side by side are those of four 1-D blocks that overlap
    two = BlockTable.build("f8", np.array([[0, 0], [0, 4]]), np.array([[4, 4], [4, 8]]))
    two.check_disjoint("t")
    four = BlockTable.build("f8", np.array([[0], [0], [0], [4]]), np.array([[4], [4], [4], [8]]))
    with pytest.raises(FormatError, match="overlap"):
        four.check_disjoint("t")


@pytest.mark.parametrize("seed", range(40))
def test_grid_cells_apart_agrees_with_the_full_search(seed):
    """The grid shortcut says disjoint only when the full search finds no overlap: grids of
    1-3 dimensions in any order, with a cell repeated, a block shifted off the grid, a block of
    another shape, negative corners and sparse cells."""
    from lamina.catalog.blocks import _grid_cells_apart
    from lamina.geometry import find_overlap_arrays

    rng = np.random.default_rng(seed)
    nd = int(rng.integers(1, 4))
    shape = rng.integers(1, 5, nd)
    cells = rng.choice(6**nd, size=int(rng.integers(2, min(30, 6**nd) + 1)), replace=False)
    lo = np.stack(np.unravel_index(cells, (6,) * nd), axis=1) * shape * int(rng.choice([1, 3]))
    lo = lo - int(rng.integers(0, 10))
    hi = lo + shape
    change = seed % 4
    if change == 1:
        lo[-1], hi[-1] = lo[0], hi[0]  # a cell twice
    elif change == 2:
        lo[-1] += 1  # off the grid
        hi[-1] += 1
    elif change == 3:
        hi[-1] += 1  # another shape
    got = _grid_cells_apart(lo, hi)
    truth = find_overlap_arrays(lo, hi) is None
    assert not got or truth
    if change == 0:
        assert got


def test_an_encoded_block_longer_than_its_subfile_is_refused_before_allocation(
    native_path, monkeypatch
):
    """A compressed block whose recorded length reaches past its subfile (damaged or forged
    metadata under valid checksums) is a FormatError naming the block, raised before a
    buffer of that length is made."""
    with lamina.open(native_path, "w") as f:
        z = f.create_dataset("z", shape=(2048,), dtype="i8", compression="zlib")
        with f.step():
            z[...] = 0
    with lamina.open(native_path) as r:
        eng = r.engine.stack()[-1]
        spec = eng.catalog.datasets["z"]
        t = eng.catalog.table(spec.id, 0)
        forged = _with_boxes(t, t.start, t.stop)
        forged.length = np.array([1 << 50], dtype=np.int64)
        forged.seg = np.zeros(1, dtype=np.int64)
        eng.catalog.steps[0]._tables[spec.id] = forged
        made = []
        real = np.empty
        monkeypatch.setattr(
            "lamina.engines.native.engine.np.empty",
            lambda n, *a, **k: (made.append(n), real(n, *a, **k))[1],
        )
        with pytest.raises(FormatError, match=r"block \[0:2048\]: its 1125899906842624 bytes"):
            r["z"][0:10]
        assert all(int(n) < 1 << 40 for n in made if np.isscalar(n))


def test_a_step_records_damaged_blocks_are_named_by_step_and_record(native_path):
    """Record numbers and step numbers part at the first record that is not a step's (a
    reopened file's empty record): damage to step 3's blocks in lamina.meta said 'record 5'
    alone, where docs/format.md promises the step."""
    make_file(native_path, steps=3)
    with lamina.open(native_path, "a") as f:
        with f.step():
            f["grid/u"][...] = 7.0
    raw = open(os.path.join(native_path, fmt.META_NAME), "rb").read()
    saw = []
    for off in range(len(raw) - 1, len(raw) - 400, -1):  # into the last records' areas
        flip(os.path.join(native_path, fmt.META_NAME), off)
        try:
            with lamina.open(native_path) as f:
                f["grid/u"].read(step=3)
        except FormatError as e:
            if "fail their checksum" in str(e):
                saw.append(str(e))
        flip(os.path.join(native_path, fmt.META_NAME), off)  # back
    assert saw and all("record 5 (step 3): blocks of dataset 'grid/u'" in m for m in saw), saw


def test_blocks_read_as_a_run_longer_than_their_subfile_are_refused_before_allocation(
    native_path, monkeypatch
):
    """Blocks read back to back in one run (bands of a multiresolution dataset, lamina
    verify's batches) whose recorded lengths reach past the subfile (damaged or forged
    metadata under valid checksums) are a FormatError naming the subfile and dataset, raised
    before a buffer of that length is made: a read asked numpy for 32 TiB, and verify died
    with a traceback instead of reporting the block."""
    from lamina.check import verify

    with lamina.open(native_path, "w") as f:
        z = f.create_dataset("z", shape=(4096,), dtype="i8", compression="zlib")
        with f.step():
            z[:2048] = 0
            z[2048:] = 1
    with lamina.open(native_path) as r:
        eng = r.engine.stack()[-1]
        spec = eng.catalog.datasets["z"]
        t = eng.catalog.table(spec.id, 0)
        forged = _with_boxes(t, t.start, t.stop)
        forged.length = np.array([t.length[0], 1 << 45], dtype=np.int64)
        forged.seg = np.array([t.seg[0], 0], dtype=np.int64)
        eng.catalog.steps[0]._tables[spec.id] = forged
        made = []
        real = np.empty
        for where in ("lamina.buffers.np.empty", "lamina.check.np.empty"):
            monkeypatch.setattr(where, lambda n, *a, **k: (made.append(n), real(n, *a, **k))[1])
        with pytest.raises(
            FormatError, match=r"data.0.0: dataset 'z': its blocks at bytes .* lie past"
        ):
            eng.payloads(0, [(spec, forged, np.arange(2))])
        report = verify(r)
        assert [(p["what"], p["box"]) for p in report["problems"]] == [("block", "[2048:4096]")]
        assert "lie past the end of the subfile" in report["problems"][0]["error"]
        assert all(int(n) < 1 << 40 for n in made if np.isscalar(n))


@pytest.mark.parametrize("forge", ["moved", "twice"])
def test_a_band_not_its_patchs_extent_is_a_format_error(native_path, forge):
    """A multiresolution band whose box (forged or damaged metadata under valid checksums)
    is not its patch's extent at its level, or a second band of one patch, is refused by
    reads and found by verify: the band was decoded as another patch's, values wrong by up
    to 1e38 and verify saying the file was intact."""
    from lamina.check import verify

    x = np.linspace(0, 1, 32)
    with lamina.open(native_path, "w") as f:
        m = f.create_dataset("mr", (32, 32), "f4", layout=lamina.Multires(patch=8, tolerance=1e-3))
        with f.step():
            m[...] = (np.sin(x[:, None] * 3) * np.cos(x[None, :] * 2)).astype("f4")
    with lamina.open(native_path) as r:
        eng = r.engine.stack()[-1]
        spec = eng.catalog.datasets["mr"]
        t = eng.catalog.table(spec.id, 0)
        start, stop = t.start.copy(), t.stop.copy()
        i = int(np.flatnonzero((start == [8, 16]).all(axis=1))[0])
        j = int(np.flatnonzero((start == [8, 0]).all(axis=1))[0])
        if forge == "moved":  # [8:16, 16:24] made [8:16, 0:24], over two other patches
            start[i] = (8, 0)
            said = r"band \[8:16, 0:24\] of level 0 is no patch's extent there"
        else:  # [8:16, 16:24] made [8:16, 0:8], the box of another band
            start[i], stop[i] = start[j], stop[j]
            said = r"bands \[8:16, 0:8\] and \[8:16, 0:8\] of level 0 are both of one patch"
        eng.catalog.steps[0]._tables[spec.id] = _with_boxes(t, start, stop)
        with pytest.raises(FormatError, match=r"dataset 'mr', step 0: " + said):
            r["mr"][...]
        problems = verify(r)["problems"]
        assert problems and all(re.search(said, p["error"]) for p in problems), problems


def test_a_step_record_out_of_order_names_the_file_and_record(native_path):
    """A step record whose step number is not the next (damaged or forged under valid
    checksums) is a FormatError naming lamina.meta and the record, as the file's other
    errors do; it said "step record 33554434 out of order" alone."""
    from types import SimpleNamespace

    from lamina.catalog import KIND_STEP

    make_file(native_path, steps=2)
    with lamina.open(native_path) as r:
        cat = r.engine.stack()[-1].catalog
        forged = SimpleNamespace(kind=KIND_STEP, step=33554434, session=0, time=0.0)
        with pytest.raises(
            FormatError,
            match=r"lamina.meta record 2: step record 33554434 out of order: expected step 2",
        ):
            cat.apply_record(forged, True, None, f"{native_path}/lamina.meta record 2")
    with pytest.raises(FormatError, match=r"^step record 5 out of order"):  # (no file: none said)
        cat.apply_record(SimpleNamespace(kind=KIND_STEP, step=5, session=0, time=0.0), True)


def test_a_read_past_the_end_names_where_the_file_ends(tmp_path):
    """A read from an offset past the end (forged or damaged metadata under valid checksums)
    names the file's size: it said the file ended at the offset read from."""
    from lamina.engines.native.engine import _pread_into

    p = tmp_path / "ten"
    p.write_bytes(bytes(10))
    fd = os.open(p, os.O_RDONLY)
    try:
        buf = bytearray(4)
        with pytest.raises(
            FormatError, match=r"^x: file ends at byte 10, before byte 100, where 4 more"
        ):
            _pread_into(fd, memoryview(buf), 100, "x")
        with pytest.raises(FormatError, match=r"^x: file ends at byte 10, expected 2 more bytes$"):
            _pread_into(fd, memoryview(buf), 8, "x")
    finally:
        os.close(fd)
