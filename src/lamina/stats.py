"""Block statistics and checksums: one cache-blocked pass per block, or one batch for many small blocks.

Statistics are NaN-aware min, max, sum and count (complex data: min and max
of |z|); checksums are CRC-32C of the block's bytes, one per checksum
segment.

:func:`compute` takes one block chunk by chunk: each chunk (up to
:data:`PASS` bytes, aligned with the checksum segments) is read from main
memory once and reduced while it is in the cache, with as few numpy passes
as the dtype allows (``fmin``/``fmax`` skip NaN by themselves; the float64
sum says whether a chunk holds any, and only then is the chunk looked at
again).  :func:`summarize` takes many small blocks of one dtype at once:
their values side by side, one ``reduceat`` per statistic, so a block of a
few kilobytes costs a fraction of a microsecond instead of a few numpy
calls.  Both give the same min, max and count; sums agree to rounding.
Large chunks are summed without casting every value to float64: integers
exactly in a type wide enough or, 32-bit ones, in rows of their own type
short enough for their extremes (:func:`_int_sum`), float32 in float32 rows
(:func:`_float32_sum`, float32's rounding).

:class:`BlockJob` runs :func:`compute` on a worker thread (numpy
reductions and crc32c release the GIL), so on a machine with a spare core
the cost hides behind the write itself.

numba was measured for this twice and not taken: importing it and loading
its compiled kernels costs 0.3-0.75 s in every process, which every rank of
every launch would pay, and kernels that keep numpy's NaN rules were not
faster than this pass (docs/performance.md, "Statistics and checksums in
the write").
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

import numpy as np

from .catalog.model import Stats
from .checksum import crc32c as crc_raw  # crc without its wrapper: loops of small pieces

if TYPE_CHECKING:  # (concurrent.futures imports logging: 5 ms of every process's start)
    from concurrent.futures import Future, ThreadPoolExecutor

#: checksum segments are multiples of this many bytes (the format's unit)
CHUNK = 1 << 18
#: bytes reduced per pass of compute() (a chunk that stays in L2 while it is reduced)
PASS = 1 << 20
#: default checksum segment: partial reads verify only the segments they touch
SEGMENT = 1 << 22
#: smaller blocks are summarized inline: handing them to the thread costs more than it saves
BACKGROUND_MIN = 1 << 20
#: blocks up to this many bytes are worth summarizing in batches (summarize)
SMALL = 1 << 16

_fmin, _fmax, _add = np.fmin.reduce, np.fmax.reduce, np.add.reduce


def _sum(c: np.ndarray, dtype) -> Any:
    """Sum of a 1-D chunk in *dtype* (float64 or complex128).

    ``einsum`` casts and accumulates in one loop: 1.2-1.6x faster than
    ``np.add.reduce(c, dtype=...)``, whose casting goes through a buffer.
    """
    if c.dtype.itemsize > np.dtype(dtype).itemsize:  # long double: no safe cast to float64
        return np.add.reduce(c).astype(dtype)
    return np.einsum("i->", c, dtype=dtype)


def _outward(mn: Any, mx: Any) -> tuple[Any, Any]:
    """Extremes of extended precision (long double) as float64, rounded outward: the bounds
    then hold every value, so that no query leaves out a block on a rounding."""
    lo, hi = np.asarray(mn).astype(np.float64), np.asarray(mx).astype(np.float64)
    with np.errstate(invalid="ignore"):
        lo = np.where(lo > mn, np.nextafter(lo, -np.inf), lo)
        hi = np.where(hi < mx, np.nextafter(hi, np.inf), hi)
    return lo, hi


#: chunks from this many values on are summed in lanes (:func:`_float32_sum`, :func:`_int_sum`)
LANES_MIN = 1 << 14
#: float32 values summed together in float32 (a row of :func:`_float32_sum`); numpy's
#: einsum adds a row in vector lanes, four vectors a turn, so that each lane's partial sum
#: rounds at most 256 / 16 = 16 times with 4-wide vectors (SSE, NEON), 8 with AVX2, 4 with
#: AVX-512: 1.5e-7 of a sum of 0.1 everywhere, as numpy's own float32 sum has
F32_ROW = 256
#: narrow integers: (accumulator, values per lane) that cannot overflow it
_INT_LANES: dict[np.dtype, tuple[np.dtype, int]] = {
    np.dtype(np.int8): (np.dtype(np.int16), 256),
    np.dtype(np.uint8): (np.dtype(np.uint16), 256),
    np.dtype(np.int16): (np.dtype(np.int32), 1024),
    np.dtype(np.uint16): (np.dtype(np.uint32), 1024),
}


def _float32_sum(c: np.ndarray) -> Any:
    """Sum of a 1-D float32 chunk as a float64: rows of :data:`F32_ROW` values summed in
    float32 (``einsum``, in vector registers), the rows' sums then added in float64.

    Casting every value to float64 (``einsum`` with ``dtype``) cost 70-90 us a MiB in the
    cache; lanes of 16 rows added element by element (``add.reduce`` along the outer
    axis) 30-37; these rows 18-22.  The sum is exact to float32's rounding, as numpy's
    own sum of float32 values is, not float64's (:data:`F32_ROW`).  A sum that comes out
    NaN or infinite (a NaN value, infinities, or a row past float32's range) is taken
    again in float64, so NaN and overflow behave exactly as in float64.
    """
    body = c.size - c.size % F32_ROW
    rows = np.einsum("ij->i", c[:body].reshape(-1, F32_ROW))
    s = rows.sum(dtype=np.float64) + np.einsum("i->", c[body:], dtype=np.float64)
    if not np.isfinite(s):
        return np.einsum("i->", c, dtype=np.float64)
    return s


#: 32-bit integers are summed in rows of at most this many values in their own type
ROWS32 = 4096
#: and at least this many (smaller rows cost more than the 64-bit sum saves)
ROWS32_MIN = 256


def _rows32(dt: np.dtype, mn: int, mx: int) -> int:
    """Values per row of a 32-bit integer chunk with extremes *mn*, *mx* whose every partial
    sum stays inside the type (a power of two, up to :data:`ROWS32`); 0 if fewer than
    :data:`ROWS32_MIN` would."""
    m = max(-int(mn), int(mx), 1)
    limit = (1 << 31) if dt.kind == "i" else (1 << 32)
    rows = ROWS32
    while rows >= ROWS32_MIN and m * rows >= limit:
        rows //= 2
    return rows if rows >= ROWS32_MIN else 0


def _int_sum(c: np.ndarray, mn: int, mx: int) -> Any:
    """Sum of a 1-D chunk of integers (*mn* and *mx* its extremes), exact as a Python int:
    bytes of 0 and 1 (bool) counted, other narrow integers in lanes of a wider type that
    cannot overflow, 32-bit ones in rows of their own type that cannot overflow
    (:func:`_rows32`; else in 64 bits),
    64-bit ones in their own type when ``max |x| * n`` cannot overflow it; otherwise
    (64-bit values too large) a float64 sum as before.  :func:`compute` adds the chunks'
    exact sums and rounds once, at the end."""
    dt = c.dtype
    if dt.itemsize == 1 and int(mn) >= 0 and int(mx) <= 1:  # bool, or a mask of 0 and 1
        return int(np.count_nonzero(c))  # 38 us a MiB in cache, the lanes 86
    wide = np.int64 if dt.kind == "i" else np.uint64
    lane = _INT_LANES.get(dt)
    if lane is not None:
        acc, rows = lane
        body = c.size - c.size % rows
        lanes = np.add.reduce(c[:body].reshape(rows, -1), axis=0, dtype=acc)
        return int(lanes.sum(dtype=wide)) + int(c[body:].sum(dtype=wide))
    if dt.itemsize == 4:
        rows = _rows32(dt, mn, mx)
        if rows and c.size >= rows:
            # rows short enough that no partial sum leaves the type: numpy's einsum adds 32-bit
            # integers in vector registers (33-39 us a MiB in cache, add.reduce into 64 bits 89)
            body = c.size - c.size % rows
            part = np.einsum("ij->i", c[:body].reshape(-1, rows))
            return int(part.sum(dtype=wide)) + int(c[body:].sum(dtype=wide))
        return int(np.add.reduce(c, dtype=wide))
    if max(-int(mn), int(mx)) * c.size < (1 << 63 if dt.kind == "i" else 1 << 64):
        return int(np.add.reduce(c))
    return _sum(c, np.float64)


#: buffers from this many bytes are checksummed by awscrt's CRC-32C (:func:`crc`)
FAST_MIN = 1 << 14
_fast_crc: Any = None


def _load_fast_crc() -> Any:
    """awscrt's CRC-32C, imported at the first large checksum (about 50 ms, which a process
    that checksums only small buffers never pays); ``crc32c``'s where awscrt is missing.

    Both compute the same CRC-32C.  awscrt (the AWS Common Runtime's aws-checksums) folds
    with carry-less multiplies (AVX-512 VPCLMULQDQ where the CPU has them): 2x the
    throughput of ``crc32c``'s three-way SSE 4.2 loop here, 56 against 28 GB/s on a
    MiB in cache, and it too releases the GIL on large buffers.
    """
    global _fast_crc
    try:
        from awscrt.checksums import crc32c as fast
    except ImportError:  # pragma: no cover - awscrt is a dependency; the result is the same
        fast = crc_raw
    _fast_crc = fast
    return fast


def fast_crc_loaded() -> bool:
    """Whether this process has imported the large checksums' library (a timing that
    includes its import, about 50 ms, is no sample of a read's rate)."""
    return _fast_crc is not None


def crc(data, value: int = 0) -> int:
    """CRC-32C of a bytes-like object, continuing from *value*."""
    if len(data) >= FAST_MIN:
        return (_fast_crc or _load_fast_crc())(data, value)
    return crc_raw(data, value)


# -- checking many pieces with one CRC call -------------------------------
#
# CRC-32C is linear: for pieces A and B, crc(A + B) = Z_len(B)(crc(A)) ^ crc(B),
# where Z_n is the (invertible, GF(2)-linear) effect on the register of n zero
# bytes (zlib's crc32_combine).  So the CRC of a run of pieces follows from the
# pieces' own CRCs without touching their bytes, and one CRC call over the run
# checks every piece: a piece whose bytes changed changes the run's CRC too
# (Z_n is invertible), so a run that matches holds no piece that would fail
# alone, except for changes in several pieces that cancel (as likely as a
# collision of one CRC-32C over the run).  An operator is kept as four
# 256-entry tables, one per byte of the register, so applying it to an array
# of CRCs is four lookups.

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), bit-reflected
_ZEROS: dict[int, np.ndarray] = {}
#: most operators kept (4 KiB each): runs of many different block lengths start it again
_ZEROS_MAX = 2048


def _tables(images: np.ndarray) -> np.ndarray:
    """Lookup tables (4, 256) of the linear map sending bit j to ``images[j]``; of each map
    at once for images ``(..., 32)``: tables ``(..., 4, 256)``."""
    im = np.asarray(images, dtype=np.uint32).reshape(-1, 4, 8)  # map, byte, bit
    out = np.zeros((len(im), 4, 256), dtype=np.uint32)
    for i in range(8):  # the values with bit i set: those below it, and bit i's image
        out[:, :, 1 << i : 2 << i] = out[:, :, : 1 << i] ^ im[:, :, i, None]
    return out.reshape(*np.shape(images)[:-1], 4, 256)


#: row k of an operator's tables, for a register's byte k
_K4 = np.arange(4)


def _apply(tab: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The operator of tables *tab* applied to every register of *x*: a lookup per byte, the
    four looked up together (the bytes of little-endian registers are the table's rows)."""
    b = np.ascontiguousarray(x, dtype="<u4").view(np.uint8).reshape(-1, 4)
    return np.bitwise_xor.reduce(tab[_K4, b], axis=1).reshape(np.shape(x))


_UNIT = np.uint32(1) << np.arange(32, dtype=np.uint32)


def _zeros(n: int) -> np.ndarray:
    """Tables of Z_n, the register's change over *n* zero bytes (cached)."""
    tab = _ZEROS.get(n)
    if tab is not None:
        return tab
    if n == 1:
        images = []
        for j in range(32):
            r = 1 << j
            for _ in range(8):
                r = (r >> 1) ^ (_POLY if r & 1 else 0)
            images.append(r)
        tab = _tables(np.asarray(images, dtype=np.uint32))
    else:
        half = 1 << (n.bit_length() - 1)
        if half == n:  # a power of two: Z_n = Z_(n/2) twice
            inner = outer = _zeros(n // 2)
        else:  # Z_n = Z_half after Z_(n - half)
            inner, outer = _zeros(n - half), _zeros(half)
        tab = _tables(_apply(outer, _apply(inner, _UNIT)))
    if len(_ZEROS) >= _ZEROS_MAX:
        _ZEROS.clear()
    _ZEROS[n] = tab
    return tab


#: pieces from which one CRC call and :func:`crc_concat` check a run faster than a call per
#: piece: the combination costs about 6 us a step of :data:`_RADIX` pieces, a call about
#: 0.3 us a piece (32 pieces of 512 B: 13 us against 17; 256: 17 against 94)
CONCAT_MIN = 32
#: pieces :func:`crc_concat` combines in one step
_RADIX = 16
_RADIX_TABLES: dict[int, np.ndarray] = {}
#: most kept (64 KiB each)
_RADIX_MAX = 64
#: where the table of (piece, byte) of a radix step starts in its tables made flat
_AT = (np.arange(_RADIX * 4, dtype=np.intp) * 256).reshape(_RADIX, 4)


def _radix_tables(length: int) -> np.ndarray:
    """Tables ``(_RADIX, 4, 256)``, made flat, of the operators a group of :data:`_RADIX`
    pieces of *length* bytes needs: piece j's CRC goes through ``Z_((_RADIX - 1 - j) * length)``
    (the last through none).  Made by applying ``Z_length`` again and again (cached)."""
    tab = _RADIX_TABLES.get(length)
    if tab is not None:
        return tab
    step = _zeros(length)
    images = np.empty((_RADIX, 32), dtype=np.uint32)
    images[-1] = _UNIT
    for j in range(_RADIX - 2, -1, -1):
        images[j] = _apply(step, images[j + 1])
    tab = _tables(images).reshape(-1)  # flat: one take per step
    if len(_RADIX_TABLES) >= _RADIX_MAX:
        _RADIX_TABLES.clear()
    _RADIX_TABLES[length] = tab
    return tab


def crc_concat(crcs: np.ndarray, length: int) -> int:
    """CRC-32C of pieces of *length* bytes each, back to back, from the pieces' CRCs.

    :data:`_RADIX` pieces at a time: each group's CRCs go through their operators with one
    lookup of every byte and are combined with one XOR reduction, so that 1,000 pieces take
    3 steps (a step per doubling took 10, of a dozen numpy calls each).
    """
    c = np.ascontiguousarray(crcs, dtype="<u4")  # its bytes are looked up
    if c.size == 0:
        return 0
    while c.size > 1:
        pad = -c.size % _RADIX
        if pad:  # a zero CRC in front adds nothing, whatever its length
            c = np.concatenate([np.zeros(pad, dtype="<u4"), c])
        at = c.view(np.uint8).reshape(-1, _RADIX, 4) + _AT
        c = np.bitwise_xor.reduce(_radix_tables(length).take(at), axis=(1, 2))
        length *= _RADIX
    return int(c[0])


def crc_combine(crcs: Sequence[int], lengths: Sequence[int]) -> int:
    """CRC-32C of pieces back to back (any lengths) from each piece's CRC and length: zlib's
    ``crc32_combine`` folded over the pieces, one operator per distinct length (cached)."""
    cur = 0
    for c, n in zip(crcs, lengths, strict=True):
        if n:  # (a zero register stays zero: the first piece needs no operator)
            shifted = int(_apply(_zeros(int(n)), np.asarray(cur, dtype=np.uint32))) if cur else 0
            cur = shifted ^ int(c)
    return cur


def first_bad_piece(buf, lengths: np.ndarray, expected: np.ndarray) -> int:
    """Index of the first piece of *buf* (pieces of *lengths* bytes, back to back) whose
    CRC-32C is not *expected*, or -1 when all match.

    From :data:`CONCAT_MIN` pieces of one length on, they are checked with one
    CRC call over the whole buffer (:func:`crc_concat`); fewer pieces, pieces
    of different lengths or a mismatch cost a call per piece.
    """
    view = memoryview(buf).cast("B")
    n = len(lengths)
    if n >= CONCAT_MIN and int(lengths[0]) > 0 and bool(np.all(lengths == lengths[0])):
        if crc(view) == crc_concat(expected, int(lengths[0])):
            return -1
    edges = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=edges[1:])
    got = piece_crcs(view, edges)
    bad = np.flatnonzero(got.astype(np.int64) != np.asarray(expected, dtype=np.int64))
    return int(bad[0]) if bad.size else -1


def piece_crcs(view, edges) -> np.ndarray:
    """CRC-32C of each piece ``view[edges[k]:edges[k + 1]]`` (byte offsets), as uint32."""
    edges = np.asarray(edges)
    n = len(edges) - 1
    first, last = int(edges[0]), int(edges[-1])
    c: Any = crc if last - first >= FAST_MIN * n else crc_raw  # large pieces: the fast CRC
    size = int(edges[1]) - first if n > 1 else 0
    if size > 0 and last - first == n * size and bool((edges[1:] - edges[:-1] == size).all()):
        # pieces of one size (many blocks of one shape): the rows of a 2-D array, which numpy
        # hands out without a slice object per piece (0.78 against 1.08 ms for 4,096 of 512 B)
        rows = np.frombuffer(view, np.uint8, n * size, first).reshape(n, size)
        return np.fromiter(map(c, rows), np.uint32, n)
    e = edges.tolist()
    pieces = map(view.__getitem__, map(slice, e[:-1], e[1:]))  # no Python frame per piece
    return np.fromiter(map(c, pieces), np.uint32, n)


def _flat_bytes(arr: np.ndarray) -> memoryview:
    return np.ascontiguousarray(arr).data.cast("B")


def segment_crcs(buf, seg: int = SEGMENT) -> tuple[int, ...]:
    """Checksums of consecutive *seg*-byte segments of *buf* (one if seg == 0)."""
    mv = memoryview(buf).cast("B")
    if seg <= 0 or len(mv) <= seg:
        return (crc(mv),)
    return tuple(crc(mv[i : i + seg]) for i in range(0, len(mv), seg))


def _values(a: np.ndarray) -> np.ndarray:
    """The flat values statistics are taken of (bool as uint8)."""
    flat = a.reshape(-1)
    return flat.view(np.uint8) if a.dtype.kind == "b" else flat


def _reduce(c: np.ndarray, kind: str) -> tuple[Any, Any, Any, int]:
    """(min, max, sum, count) of one chunk; min and max None when it holds no value (all NaN)."""
    if kind in "iub":  # exact min/max, float64 sum
        mn, mx = c.min(), c.max()
        # (64-bit integers exactly at any size, as summarize_flat sums a small block: the
        # float64 sum of values past 2^53 would round at every addition)
        if c.size >= LANES_MIN or c.dtype.itemsize == 8:
            return mn, mx, _int_sum(c, mn, mx), c.size
        return mn, mx, _sum(c, np.float64), c.size
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: a NaN sum is the statistic
        if kind == "c":
            m = np.abs(c)
            s = _sum(c, np.complex128)
            nan = np.isnan(s.real) or np.isnan(s.imag)
        else:
            m = c
            big32 = c.dtype == np.float32 and c.size >= LANES_MIN
            s = _float32_sum(c) if big32 else _sum(c, np.float64)
            nan = np.isnan(s)
        mn, mx = _fmin(m), _fmax(m)  # fmin/fmax skip NaN (NaN only if every value is NaN)
        if not nan:
            return mn, mx, s, c.size
        # a NaN in the sum: some values are NaN (or +inf and -inf met); a complex value is
        # NaN with NaN in either part (numpy's isnan), though |inf + NaN j| is inf
        ok = ~np.isnan(c if kind == "c" else m)
        n = int(np.count_nonzero(ok))
        if n == 0:
            return None, None, s * 0, 0
        if n < c.size:  # (fmin/fmax give NaN for a signalling NaN: taken again without)
            s = _add(c[ok], dtype=s.dtype)
            mn, mx = _fmin(m[ok]), _fmax(m[ok])
        return mn, mx, s, n


def _finish(kind: str, mn, mx, total, count: int) -> Stats:
    if count == 0:  # no value: NaN extremes, or 0 for integer types (no NaN there)
        if kind in "iub":
            return Stats(0, 0, 0.0, 0)
        return Stats(float("nan"), float("nan"), complex(total) if kind == "c" else float(total), 0)
    if kind in "iub":
        return Stats(int(mn), int(mx), float(total), int(count))
    if np.asarray(mn).dtype.itemsize > 8:  # long double (or |z| of one)
        mn, mx = _outward(mn, mx)
    return Stats(float(mn), float(mx), complex(total) if kind == "c" else float(total), int(count))


def compute(
    arr: np.ndarray, seg: int = SEGMENT, checksum: bool = True
) -> tuple[Stats, tuple[int, ...]]:
    """Statistics of *arr* and checksums of its raw C-order bytes in one pass.

    Returns ``(stats, crcs)``; *crcs* has one CRC-32C per *seg* bytes (empty
    when *checksum* is False, e.g. when the stored bytes are compressed and
    checksummed separately).
    """
    a = np.ascontiguousarray(arr)
    flat = _values(a)
    kind = a.dtype.kind
    n = flat.size
    item = a.dtype.itemsize
    if checksum and seg > 0 and seg % item:
        # segments that split items cannot follow the chunks: checksum the bytes separately
        st, _ = compute(a, 0, checksum=False)
        return st, segment_crcs(a.reshape(-1).view(np.uint8), seg)
    step = max(1, PASS // item)
    # make step divide the segment so that checksum segments align with chunks
    if seg > 0 and seg % (step * item):
        step = max(1, math.gcd(step * item, seg) // item)
    seg_items = (seg // item) if seg > 0 else n  # after adjusting step: a multiple of it
    raw = a.reshape(-1).view(np.uint8).data if checksum else None
    mn: Any = None
    mx: Any = None
    total: Any = 0j if kind == "c" else 0 if kind in "iub" else 0.0  # ints: exact if it can
    count = 0
    crcs: list[int] = []
    cur = 0
    # the checksum first: it streams a chunk from memory fastest, and the reductions then
    # find it in the cache (64 MiB of float32: 8.6-9.6 ms against 10.6-11.5 the other way
    # round); complex data last, after the pass that takes |z| (10.2 against 11.2 ms)
    crc_first = kind != "c"
    for i in range(0, n, step):
        c = flat[i : i + step]
        if raw is not None and crc_first:
            cur = crc(raw[i * item : (i + c.size) * item], cur)
        r_mn, r_mx, r_s, r_n = _reduce(c, kind)
        if r_n:
            mn = r_mn if mn is None or r_mn < mn else mn
            mx = r_mx if mx is None or r_mx > mx else mx
            total += r_s
            count += r_n
        if raw is not None:
            if not crc_first:
                cur = crc(raw[i * item : (i + c.size) * item], cur)
            if seg > 0 and ((i + c.size) % seg_items == 0) and i + c.size < n:
                crcs.append(cur)
                cur = 0
    if raw is not None:
        crcs.append(cur)
    return _finish(kind, mn, mx, total, count), tuple(crcs)


class Summary(NamedTuple):
    """Statistics of many blocks as columns (block i: ``mins[i]``, ``maxs[i]``, ...), and their checksums."""

    mins: np.ndarray  # int64 (signed), uint64 (unsigned, bool) or float64 (float; complex: of |z|)
    maxs: np.ndarray
    sums: np.ndarray  # float64, complex128 for complex data
    counts: np.ndarray  # int64
    crcs: np.ndarray | None  # uint32: one CRC-32C per block (None without checksums)

    def stats(self, i: int) -> Stats:
        """Block *i*'s statistics as a :class:`~lamina.catalog.Stats`."""
        return Stats.of_row(self.mins[i], self.maxs[i], self.sums[i], self.counts[i])


def summarize(arrays: Sequence[np.ndarray], checksum: bool = True) -> Summary:
    """:func:`compute` of many small blocks of one dtype at once (each block one checksum segment).

    The blocks' values are laid side by side (:func:`summarize_flat`), so the
    cost per block is a fraction of a microsecond plus its checksum.  Empty
    blocks are not allowed (lamina stores none).
    """
    if not arrays:
        e = np.zeros(0)
        return Summary(
            e, e, e, np.zeros(0, dtype=np.int64), np.zeros(0, np.uint32) if checksum else None
        )
    flats = [_values(np.ascontiguousarray(a)) for a in arrays]
    sizes = np.fromiter((f.size for f in flats), dtype=np.int64, count=len(flats))
    values = np.concatenate(flats) if len(flats) > 1 else flats[0]
    if arrays[0].dtype.kind == "b":
        values = values.view(np.bool_)
    return summarize_flat(values, sizes, checksum)


def summarize_flat(values: np.ndarray, sizes: np.ndarray, checksum: bool = True) -> Summary:
    """Statistics of consecutive blocks laid side by side in *values* (1-D), *sizes[i]* elements each.

    Every statistic is one ``reduceat`` over *values*; blocks with NaN in
    their sum are done again one by one.
    """
    one = len(sizes) == 1  # a block alone (a dataset written once a step): fewer calls
    if (int(sizes[0]) <= 0) if one else (sizes.size and sizes.min() <= 0):
        raise ValueError("summarize() takes non-empty blocks")
    if one:
        starts = _FIRST
    else:
        starts = np.zeros(len(sizes), dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
    return _summarized(values, starts, sizes.astype(np.int64, copy=True), None, checksum)


def summarize_rows(values: np.ndarray, n: int, checksum: bool = True) -> Summary:
    """:func:`summarize_flat` of *n* blocks of one size (*values*, 1-D, holds them back to back):
    the same statistics and checksums, without an array of sizes to add up (steps of a few
    blocks of one shape: 20-30 us less of a step's fixed cost)."""
    size = len(values) // n if n > 0 else 0
    if size <= 0 or size * n != len(values):
        raise ValueError(f"summarize_rows() takes {n} non-empty blocks of one size")
    starts = _FIRST if n == 1 else np.arange(0, n * size, size, dtype=np.int64)
    return _summarized(values, starts, np.full(n, size, dtype=np.int64), size, checksum)


def _summarized(
    values: np.ndarray, starts: np.ndarray, count: np.ndarray, size: int | None, checksum: bool
) -> Summary:
    """The statistics (and checksums) of the blocks of *values* starting at *starts*, *count*
    elements each (a new array: the counts come back in it); *size* their one size, or None."""
    dt = values.dtype
    kind = dt.kind
    n = len(starts)
    slot = np.int64 if kind == "i" else np.uint64 if kind in "ub" else np.float64
    flat = values.view(np.uint8) if kind == "b" else values
    with np.errstate(invalid="ignore", over="ignore"):
        if kind in "iub":
            mn = np.minimum.reduceat(flat, starts).astype(slot)
            mx = np.maximum.reduceat(flat, starts).astype(slot)
            sums = np.add.reduceat(flat, starts, dtype=np.float64)
            if dt.itemsize == 8:  # exact where it cannot overflow, rounded once (as compute)
                _exact_int_sums(flat, starts, mn, mx, count, sums)
        else:
            m = np.abs(flat) if kind == "c" else flat
            mn, mx = np.fmin.reduceat(m, starts), np.fmax.reduceat(m, starts)
            mn, mx = (
                _outward(mn, mx) if m.dtype.itemsize > 8 else (mn.astype(slot), mx.astype(slot))
            )
            sums = np.add.reduceat(flat, starts, dtype=np.complex128 if kind == "c" else np.float64)
            if n == 1:
                redo = [0] if sums[0] != sums[0] else []  # (a complex NaN is unequal too)
            else:
                redo = np.flatnonzero(
                    np.isnan(sums.real) | np.isnan(sums.imag) if kind == "c" else np.isnan(sums)
                ).tolist()
            for i in redo:  # NaN values inside: counted and left out, one by one
                a = int(starts[i])
                st, _ = compute(values[a : a + int(count[i])], 0, checksum=False)
                mn[i], mx[i], sums[i], count[i] = st.min, st.max, st.sum, st.count
    crcs = None
    if checksum:
        raw = values.view(np.uint8)
        if n == 1:
            crcs = np.array([crc(raw.data)], dtype=np.uint32)
        elif size is not None:  # rows of one size: each row's checksum, no edges to work out
            c: Any = crc if size * dt.itemsize >= FAST_MIN else crc_raw
            crcs = np.fromiter(map(c, raw.reshape(n, -1)), np.uint32, n)
        else:
            edges = np.append(starts, flat.size) * dt.itemsize
            crcs = piece_crcs(raw.data, edges)
    return Summary(mn, mx, sums, count, crcs)


def _exact_int_sums(flat, starts, mn, mx, count, sums) -> None:
    """Into *sums* (float64): the exact sums of 64-bit integer blocks, each rounded once, where
    ``max(|min|, |max|) x n`` leaves room in the type (as :func:`_int_sum` sums a chunk); the
    others keep their float64 sums."""
    signed = flat.dtype.kind == "i"
    big = np.maximum(np.abs(mn.astype(np.float64)), np.abs(mx.astype(np.float64))) * count
    ok = big < (2.0**62 if signed else 2.0**63)  # surely (the float bound rounds)
    limit = 1 << 63 if signed else 1 << 64
    for i in np.flatnonzero(~ok & (big < 4.0 * limit)).tolist():  # near: judged exactly
        ok[i] = max(-int(mn[i]), int(mx[i])) * int(count[i]) < limit
    if ok.any():
        exact = np.add.reduceat(flat, starts)  # in the dtype: wraps only where not ok
        sums[ok] = exact[ok].astype(np.float64)


#: the start of a block alone in summarize_flat (read-only: shared by every call)
_FIRST = np.zeros(1, dtype=np.int64)
_FIRST.flags.writeable = False


class StatsJob(Protocol):
    """What an engine keeps for a block until its step commits: its statistics and checksums, when ready."""

    def result(self) -> tuple[Stats | None, tuple[int, ...]]: ...

    def done(self) -> bool: ...


class OneThread:
    """A thread of its own for background work of one kind, started at the first use (one per
    process: ``get()`` returns the same executor every time; a child made by ``fork`` starts
    its own, for the parent's thread did not come with it and its work would never run)."""

    _every: ClassVar[weakref.WeakSet[OneThread]] = weakref.WeakSet()

    def __init__(self, name: str) -> None:
        self.name = name
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        OneThread._every.add(self)

    @classmethod
    def _forget_in_child(cls) -> None:
        for one in list(cls._every):
            one._executor = None
            one._lock = threading.Lock()

    def get(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                from concurrent.futures import ThreadPoolExecutor

                ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
                try:
                    ex.submit(_nothing)  # its worker started here, once
                except BaseException:
                    # interrupted (Ctrl-C) while the worker started: an executor can start
                    # a thread and be cut before it registers it for Python's exit, which
                    # then waits for that thread for ever; told to end, it ends
                    ex.shutdown(wait=False)
                    raise
                self._executor = ex
            return self._executor


def _nothing() -> None:
    """The first job of a :class:`OneThread`: it starts the thread."""


_POOL = OneThread("lamina-stats")
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=OneThread._forget_in_child)


def _pool() -> ThreadPoolExecutor:
    return _POOL.get()


class BlockJob:
    """Statistics + checksums of one block, computed on the worker thread."""

    def __init__(
        self, arr: np.ndarray, seg: int = SEGMENT, checksum: bool = True, background: bool = True
    ):
        self._future: Future | None = None
        self._result: tuple[Stats, tuple[int, ...]] | None = None
        if background and arr.nbytes >= BACKGROUND_MIN:
            self._future = _pool().submit(compute, arr, seg, checksum)
        else:
            self._result = compute(arr, seg, checksum)

    def done(self) -> bool:
        """Whether :meth:`result` returns without waiting."""
        return self._future is None or self._future.done()

    def result(self) -> tuple[Stats, tuple[int, ...]]:
        if self._future is not None:
            self._result = self._future.result()
            self._future = None
        assert self._result is not None
        return self._result
