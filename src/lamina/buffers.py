"""Buffers placed for copies between the page cache and memory.

The kernel copies a ``pread`` or ``pwrite`` between the page cache and the
caller's memory with ``rep movsb``.  On x86 CPUs that copy runs several
times slower when the destination lies 1 to 31 bytes past the source,
counted within a 4 KiB page (4K aliasing: each store aliases the loads
that follow it).  Measured on an AMD EPYC, 2 MiB read from a page of
the page cache: 120-145 us into memory at the same place in a page, 370-400
us into memory 16 bytes further on, 790-900 us 8 bytes further on; a place
up to a cache line *before* the source's copies at full speed.

numpy's large allocations start 16 bytes into a page, and a block's bytes
often start on a page of its file (blocks of power-of-two sizes written
back to back): a read buffer from ``np.empty`` pays the slowest case.
:func:`empty` and :func:`window` give memory at the cache line at or before
the place of a file offset within its page, so that the copy runs at full
speed and the buffer stays aligned for any dtype.
"""

from __future__ import annotations

import numpy as np

PAGE = 4096
#: the granule of the placement: the buffer starts on a cache line, at most this far before
LINE = 64
#: memory this many bytes or fewer past the source (within a page) is copied into slowly
SLOW_WITHIN = 32
#: smaller buffers are plain ``np.empty``: their copies are short whatever their place, and
#: finding an address costs about 2 us
PLACED_MIN = 1 << 16


def _start(raw: np.ndarray, offset: int) -> int:
    """Index into *raw* (uint8) of the cache line at or before *offset*'s place in a page."""
    return (offset % PAGE // LINE * LINE - raw.ctypes.data) % PAGE


def empty(nbytes: int, offset: int = 0) -> np.ndarray:
    """An uninitialized uint8 array of *nbytes* for the bytes at *offset* of a file (see the
    module's description); at offset 0, memory that starts on a page."""
    if nbytes < PLACED_MIN:
        return np.empty(nbytes, dtype=np.uint8)
    raw = np.empty(nbytes + PAGE, dtype=np.uint8)
    start = _start(raw, offset)
    return raw[start : start + nbytes]


def misplaced(mv: memoryview, offset: int) -> bool:
    """Whether a copy between the bytes at *offset* of a file and the memory of *mv* runs at a
    crawl: that memory lies 1 to 31 bytes past the file's bytes within a page (1-15: 3.8x
    the time of a copy placed well, 16-31: 1.5x; 1 MiB measured)."""
    addr = np.frombuffer(mv, np.uint8, 0).ctypes.data if len(mv) else 0
    return 0 < (addr - offset) % PAGE < SLOW_WITHIN


def window(raw: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
    """*nbytes* of *raw* (a uint8 buffer of at least ``nbytes + PAGE`` bytes, kept for many
    reads) placed for the bytes at *offset* of a file, as :func:`empty` places them."""
    start = _start(raw, offset)
    return raw[start : start + nbytes]
