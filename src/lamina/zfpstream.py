"""zfp streams read without zfp: the header's field and mode, and the bytes a stream may take.

zfp (https://zfp.readthedocs.io) decodes without bounds checks, as far as
its header's shape and mode take it: a reader of stored zfp data checks
the header against what it expects and pads the data to what the header
lets zfp read (:func:`zfp_need`), so that a damaged or forged header gives
a :class:`~lamina.errors.CodecError` instead of a read past the end of a
buffer.  Used by the block codecs and by the multiresolution layout's
bands.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import CodecError

# zfp (https://zfp.readthedocs.io): a stream of bits, least significant first, starting with a
# header of 'zfp', a version byte, 52 bits of field metadata and a 12- or 64-bit mode; the
# data follows in blocks of 4^d values (a field is padded to multiples of 4 along each axis).

_ZFP_TYPES: dict[int, np.dtype] = {
    1: np.dtype("i4"),
    2: np.dtype("i8"),
    3: np.dtype("f4"),
    4: np.dtype("f8"),
}
#: header bits at most: magic 32, field 52, long mode 64
_ZFP_HEADER_BITS = 148


def _zfp_blocks(shape: tuple[int, ...]) -> tuple[int, int]:
    """(blocks, values per block) of a zfp field of *shape*."""
    return math.prod(-(-max(n, 1) // 4) for n in shape), 4 ** len(shape)


def _zfp_block_bits(values: int) -> int:
    """Most bits lamina's zfp modes spend on a block of *values* values.

    A rate or precision of at most 64 bits a value (:func:`lamina.codecs.normalize`
    refuses more), plus zfp's per-block sign, exponent and group-test bits.
    """
    return values * 66 + 96


def zfp_bound(shape: tuple[int, ...]) -> int:
    """Most bytes of zfp data for a block of *shape* (the header, every block at its most, a word more)."""
    blocks, values = _zfp_blocks(shape)
    return -(-(_ZFP_HEADER_BITS + blocks * _zfp_block_bits(values)) // 64) * 8 + 16


def zfp_header(buf, what: str) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """(dtype, shape, most bits a block may take, header bits) of zfp data; CodecError if absent."""
    head = bytes(buf[:19])
    if len(head) < 12 or head[:3] != b"zfp":
        raise CodecError(f"{what}: not zfp data (no zfp header)")
    v = int.from_bytes(head, "little")
    meta = (v >> 32) & ((1 << 52) - 1)
    dt = _ZFP_TYPES[(meta & 3) + 1]
    dims = ((meta >> 2) & 3) + 1
    width = 48 // dims
    sizes = meta >> 4
    shape = tuple(((sizes >> (width * j)) & ((1 << width) - 1)) + 1 for j in reversed(range(dims)))
    _, values = _zfp_blocks(shape)
    prec = dt.itemsize * 8

    def variable(maxprec: int) -> int:  # zfp_stream_maximum_size, with a margin
        return values * (min(maxprec, prec) + 2) + 64

    mode = (v >> 84) & 0xFFF
    if mode < 0xFFF:  # the short forms
        bits = 96
        if mode < 2048:  # fixed rate: every block takes exactly maxbits
            per_block = mode + 1
        elif mode < 2176:  # fixed precision
            per_block = variable(mode - 2047)
        else:  # reversible, fixed accuracy
            per_block = variable(prec)
    else:
        if len(head) < 19:
            raise CodecError(f"{what}: zfp header truncated ({len(head)} bytes)")
        bits = _ZFP_HEADER_BITS
        long = (v >> 84) & ((1 << 64) - 1)
        minbits = ((long >> 12) & 0x7FFF) + 1
        maxbits = ((long >> 27) & 0x7FFF) + 1
        maxprec = ((long >> 42) & 0x7F) + 1
        per_block = max(minbits, min(maxbits, variable(maxprec)))
    return dt, shape, per_block, bits


def zfp_need(shape: tuple[int, ...], per_block: int, header_bits: int) -> int:
    """Bytes zfp may read of a stream of *shape* whose blocks take at most *per_block* bits
    after *header_bits* of header (:func:`zfp_header`), a word more."""
    blocks, _ = _zfp_blocks(shape)
    return -(-(header_bits + blocks * per_block) // 64) * 8 + 16


__all__ = ["zfp_bound", "zfp_header", "zfp_need"]
