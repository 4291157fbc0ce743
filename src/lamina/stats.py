"""Block statistics and checksums, computed in one cache-blocked pass.

Statistics (NaN-aware min, max, sum, count) and CRC-32C checksums are taken
chunk by chunk over a block so that each chunk is read from main memory once
and the other reductions hit the cache.  :class:`BlockJob` runs the pass on
a worker thread (numpy reductions and crc32c release the GIL), so on a
machine with a spare core the cost hides behind the write itself.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import crc32c as _crc32c
import numpy as np

from .catalog.model import Stats

#: bytes per cache-blocked chunk (fits in L2 together with its reductions)
CHUNK = 1 << 18
#: default checksum segment: partial reads verify only the segments they touch
SEGMENT = 1 << 22
#: smaller blocks are summarized inline: handing them to the thread costs more than it saves
BACKGROUND_MIN = 1 << 20


def crc(data, value: int = 0) -> int:
    """CRC-32C of a bytes-like object, continuing from *value*."""
    return _crc32c.crc32c(data, value)


def _flat_bytes(arr: np.ndarray) -> memoryview:
    return np.ascontiguousarray(arr).data.cast("B")


def segment_crcs(buf, seg: int = SEGMENT) -> tuple[int, ...]:
    """Checksums of consecutive *seg*-byte segments of *buf* (one if seg == 0)."""
    mv = memoryview(buf).cast("B")
    if seg <= 0 or len(mv) <= seg:
        return (crc(mv),)
    return tuple(crc(mv[i : i + seg]) for i in range(0, len(mv), seg))


def _reduce_chunk(c: np.ndarray, kind: str):
    # a block holding both +inf and -inf has a NaN sum: that is the statistic, not a problem
    with np.errstate(invalid="ignore", over="ignore"):
        return _reduce(c, kind)


def _reduce(c: np.ndarray, kind: str):
    if kind == "c":
        a = np.abs(c)
        mn, mx = a.min(), a.max()
        s = c.sum(dtype=np.complex128)
        if np.isnan(mn):
            ok = ~np.isnan(a)
            n = int(ok.sum())
            if n == 0:
                return None, None, 0j, 0
            return a[ok].min(), a[ok].max(), c[ok].sum(dtype=np.complex128), n
        return mn, mx, s, c.size
    if kind == "f":
        mn, mx = c.min(), c.max()
        if np.isnan(mn) or np.isnan(mx):
            ok = ~np.isnan(c)
            n = int(ok.sum())
            if n == 0:
                return None, None, 0.0, 0
            v = c[ok]
            return v.min(), v.max(), float(v.sum(dtype=np.float64)), n
        return mn, mx, float(c.sum(dtype=np.float64)), c.size
    # bool / int / uint: exact min/max, float64 sum
    return c.min(), c.max(), float(c.sum(dtype=np.float64)), c.size


def compute(
    arr: np.ndarray, seg: int = SEGMENT, checksum: bool = True
) -> tuple[Stats, tuple[int, ...]]:
    """Statistics of *arr* and checksums of its raw C-order bytes in one pass.

    Returns ``(stats, crcs)``; *crcs* has one CRC-32C per *seg* bytes (empty
    when *checksum* is False, e.g. when the stored bytes are compressed and
    checksummed separately).
    """
    a = np.ascontiguousarray(arr)
    flat = a.reshape(-1)
    kind = a.dtype.kind
    if kind == "b":
        flat = flat.view(np.uint8)
    n = flat.size
    mn: Any = None
    mx: Any = None
    total: Any = 0j if kind == "c" else 0.0
    count = 0
    crcs: list[int] = []
    item = a.dtype.itemsize
    if checksum and seg > 0 and seg % item:
        # segments that split items cannot follow the chunks: checksum the bytes separately
        st, _ = compute(a, 0, checksum=False)
        return st, segment_crcs(flat.view(np.uint8), seg)
    step = max(1, CHUNK // item)
    # make step divide the segment so that checksum segments align with chunks
    if seg > 0 and seg % (step * item):
        step = max(1, math.gcd(step * item, seg) // item)
    seg_items = (seg // item) if seg > 0 else n  # after adjusting step: a multiple of it
    raw = flat.view(np.uint8).data if checksum else None
    cur = 0
    for i in range(0, n, step):
        c = flat[i : i + step]
        r_mn, r_mx, r_s, r_n = _reduce_chunk(c, kind)
        if r_n:
            mn = r_mn if mn is None or r_mn < mn else mn
            mx = r_mx if mx is None or r_mx > mx else mx
            total += r_s
            count += r_n
        if raw is not None:
            cur = crc(raw[i * item : (i + c.size) * item], cur)
            if seg > 0 and ((i + c.size) % seg_items == 0) and i + c.size < n:
                crcs.append(cur)
                cur = 0
    if raw is not None:
        crcs.append(cur)
    if count == 0:
        mn = mx = float("nan")
    if kind in "iub":
        mn, mx = int(mn) if count else 0, int(mx) if count else 0
    else:
        mn, mx = float(mn), float(mx)
    if kind == "c":
        total = complex(total)
    else:
        total = float(total)
    return Stats(mn, mx, total, int(count)), tuple(crcs)


class StatsJob(Protocol):
    """What an engine keeps for a block until its step commits: its statistics and checksums, when ready."""

    def result(self) -> tuple[Stats | None, tuple[int, ...]]: ...


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lamina-stats")
        return _POOL


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

    def result(self) -> tuple[Stats, tuple[int, ...]]:
        if self._future is not None:
            self._result = self._future.result()
            self._future = None
        assert self._result is not None
        return self._result
