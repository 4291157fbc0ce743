"""Buffers placed for copies from the page cache (lamina.buffers), and reads through them.

A copy from the page cache into memory 1 to 31 bytes past the source
(within a page) runs 1.5-4x slower on x86 CPUs; the engine's own buffers are
placed at the cache line at or before the source, and a read into a
caller's array placed badly goes through such a buffer.  Whatever the path,
the values are the block's and a flipped byte is caught.
"""

from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pytest
from test_corruption import flip
from test_read_runs import write_grid

import lamina
from lamina import buffers
from lamina.engines.native import engine as native
from lamina.errors import ChecksumError

pytestmark = pytest.mark.usefixtures("fast_native")

OFFSETS = [0, 8, 16, 24, 63, 64, 100, 4095, 4096, 4096 + 40, (1 << 33) + 12]


def _addr(a: np.ndarray) -> int:
    return a.ctypes.data


@pytest.mark.parametrize("offset", OFFSETS)
def test_a_placed_buffer_starts_on_the_cache_line_at_or_before_its_bytes(offset):
    n = buffers.PLACED_MIN + 123
    a = buffers.empty(n, offset)
    assert a.dtype == np.uint8 and a.shape == (n,)
    assert _addr(a) % buffers.LINE == 0  # aligned for any dtype
    before = -(_addr(a) - offset) % buffers.PAGE  # bytes before the source's place
    assert 0 <= before < buffers.LINE
    assert not buffers.misplaced(a.data, offset)
    a[:] = 7  # all of it is ours
    assert buffers.empty(n).ctypes.data % buffers.PAGE == 0


def test_small_buffers_are_plain():
    a = buffers.empty(100, 8)
    assert a.shape == (100,) and a.dtype == np.uint8 and a.base is None


@pytest.mark.parametrize("shift", [0, 1, 16, 4000])
@pytest.mark.parametrize("offset", OFFSETS)
def test_a_window_of_a_kept_buffer_is_placed_and_inside_it(offset, shift):
    n = 5000
    raw = np.empty(n + buffers.PAGE + shift, dtype=np.uint8)[shift:]  # any start
    w = buffers.window(raw, offset, n)
    assert len(w) == n and np.shares_memory(w, raw)
    assert _addr(raw) <= _addr(w) and _addr(w) + n <= _addr(raw) + len(raw)
    assert _addr(w) % buffers.LINE == 0 and not buffers.misplaced(w.data, offset)


def test_misplaced_is_memory_1_to_31_bytes_past_the_source_within_a_page():
    raw = np.empty(3 * buffers.PAGE, dtype=np.uint8)
    base = -_addr(raw) % buffers.PAGE
    for past in range(0, 64):
        mv = raw[base + past : base + past + 100].data
        for offset in (0, 5 * buffers.PAGE):
            assert buffers.misplaced(mv, offset) == (0 < past < buffers.SLOW_WITHIN)
        assert not buffers.misplaced(mv, past)  # memory at the source's place
        assert buffers.misplaced(mv, buffers.PAGE + past - 8)  # 8 bytes past
        assert not buffers.misplaced(mv, buffers.PAGE + past + 8)  # 8 bytes before
    assert not buffers.misplaced(raw[:0].data, 3)


def _misplaced_array(shape, past: int, offset: int = 0) -> np.ndarray:
    """An array of float64 whose memory lies *past* bytes past *offset*'s place in a page."""
    n = int(np.prod(shape)) * 8
    raw = np.empty(n + 2 * buffers.PAGE, dtype=np.uint8)
    start = (offset % buffers.PAGE + past - _addr(raw)) % buffers.PAGE
    return raw[start : start + n].view(np.float64).reshape(shape)


SHAPE = (40, 64, 64)  # a block of 1,310,720 bytes


def _one_block(path: str, values, **options) -> None:
    """A file of one step of dataset ``u``, one block of *values* (of :data:`SHAPE`)."""
    with lamina.open(path, "w", **options) as f:
        ds = f.create_dataset("u", SHAPE, "f8")
        with f.step():
            ds.write(values, offset=(0, 0, 0))


@pytest.mark.parametrize("past", [8, 16, 24])
@pytest.mark.parametrize("piece", [1 << 16, 3 << 16, native.READ_PIECE])
def test_a_read_into_a_misplaced_array_goes_through_a_placed_buffer(tmp_path, past, piece):
    """One block of three checksum segments (the last short) read into the caller's array
    placed badly: through the engine's buffer, a piece at a time, each segment's checksum
    carried over its pieces; the values are the block's, and a byte flipped in the middle
    segment is caught and named."""
    shape = SHAPE  # segments of 512 KiB, 512 KiB and 256 KiB
    truth = np.random.default_rng(5).random(shape)
    path = str(tmp_path / "one.lam")
    _one_block(path, truth, checksum_segment=1 << 19)
    bounced = mock.Mock(wraps=native.NativeEngine._read_bounced)
    with (
        mock.patch.object(native, "READ_PIECE", piece),
        mock.patch.object(
            native.NativeEngine,
            "_read_bounced",
            lambda self, *a: bounced(self, *a),
        ),
        lamina.open(path) as f,
    ):
        ds = f["u"]
        (block,) = ds.blocks()
        out = _misplaced_array(shape, past, block.offset)
        assert buffers.misplaced(out.data.cast("B"), block.offset)
        got = ds.read(out=out)
        assert got is out and bounced.call_count == 1
        np.testing.assert_array_equal(out, truth)
        well = _misplaced_array(shape, 0, block.offset)  # placed well: straight in
        np.testing.assert_array_equal(ds.read(out=well), truth)
        assert bounced.call_count == 1
        np.testing.assert_array_equal(ds.read(), truth)  # lamina's own array starts on a page
        flip(os.path.join(path, block.subfile), block.offset + (1 << 19) + 4321)
        seg1 = rf"segment 1 \(bytes {block.offset + (1 << 19)}\.\.{block.offset + (1 << 20)}\)"
        with pytest.raises(ChecksumError, match=seg1):
            ds.read(out=out)
        with pytest.raises(ChecksumError, match="segment 1"):
            ds.read(out=well)


def test_a_file_cut_short_is_named_alike_whatever_the_memory_read_into(tmp_path):
    """A block's subfile cut short after the open: the read into the caller's misplaced array
    (through a placed buffer, a piece at a time) names the bytes missing as the read straight
    into memory placed well names them, to the end of the segment."""
    shape = SHAPE  # one segment
    path = str(tmp_path / "cut.lam")
    _one_block(path, np.ones(shape))
    with lamina.open(path) as f:
        ds = f["u"]
        (block,) = ds.blocks()
        os.truncate(os.path.join(path, block.subfile), block.offset + 100_000)
        messages = []
        for past in (0, 16):
            out = _misplaced_array(shape, past, block.offset)
            with pytest.raises(lamina.errors.FormatError) as err:
                ds.read(out=out)
            messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert f"expected {block.raw_nbytes - 100_000} more bytes" in messages[0]


def test_the_read_buffers_an_engine_keeps_are_bounded(tmp_path, monkeypatch):
    """A reading engine keeps its run buffers for the next read, a buffer a thread, up to
    ``RUN_BUFFERS_KEPT`` bytes in all."""
    from lamina.derived import _parallel

    monkeypatch.setattr(native, "PARALLEL_READ_MIN", 0)
    monkeypatch.setattr(native, "READ_PIECE", 1)  # a row of cells a piece: 16 of them
    monkeypatch.setattr(_parallel, "THREADS", 4)
    path = str(tmp_path / "kept.lam")
    truth = write_grid(path, (16, 16, 16), (8, 2, 2), 2)  # 32 KiB blocks, rows of 64 KiB
    for most, kept in ((1 << 30, 4), (3 * (64 * 1024 + buffers.PAGE), 3), (0, 0)):
        monkeypatch.setattr(native, "RUN_BUFFERS_KEPT", most)
        with lamina.open(path) as f:
            for _ in range(2):
                np.testing.assert_array_equal(f["u"][...], truth)
            bufs = f.engine.inner._run_bufs
            assert len(bufs) == kept and sum(map(len, bufs)) <= most
        assert f.engine.inner._run_bufs == []  # let go at close


def test_reads_return_arrays_as_numpy_makes_them(tmp_path):
    """A small read returns an array that owns its memory (as numpy's and h5py's do: it can
    be resized); a large one starts on a page of memory."""
    path = str(tmp_path / "own.lam")
    with lamina.open(path, "w") as f:
        for name, n in (("small", 1000), ("large", 1 << 14)):
            ds = f.create_dataset(name, (n,), "f8")
            with f.step():
                ds.write(np.arange(n, dtype="f8"), offset=(0,))
    with lamina.open(path) as f:
        for a in (f["small"].read(), f["small"][10:20]):
            assert a.flags.owndata and a.base is None
        a.resize(40, refcheck=False)
        big = f["large"].read()
        assert big.ctypes.data % buffers.PAGE == 0
        np.testing.assert_array_equal(big, np.arange(1 << 14))


def test_two_faults_are_named_alike_whatever_the_memory_read_into(tmp_path):
    """A byte flipped in the first segment of a block whose subfile is also cut short in its
    last: the read into the caller's misplaced array names the file cut short first, as the
    read straight into memory placed well does."""
    shape = SHAPE  # segments of 512, 512 and 256 KiB
    path = str(tmp_path / "two.lam")
    _one_block(path, np.ones(shape), checksum_segment=1 << 19)
    with lamina.open(path) as f:
        ds = f["u"]
        (block,) = ds.blocks()
        sub = os.path.join(path, block.subfile)
        flip(sub, block.offset + 1000)
        os.truncate(sub, block.offset + (1 << 20) + 5000)
        messages = []
        for past in (0, 16):
            with pytest.raises(lamina.errors.FormatError) as err:
                ds.read(out=_misplaced_array(shape, past, block.offset))
            assert not isinstance(err.value, ChecksumError)
            messages.append(str(err.value))
    assert messages[0] == messages[1] and "file ends at byte" in messages[0]
