"""Little-endian binary encoding with bounds checks on every read, and JSON read from outside.

:class:`Decoder` never trusts a length it reads: every count and size is
checked against the bytes that remain *before* anything is allocated, so any
byte string decodes to a value or raises :class:`~lamina.errors.FormatError`,
never a crash, a hang or a huge allocation.  :func:`load_json` is the one
JSON parser for text that comes from a file or the wire, with the same
promise.
"""

from __future__ import annotations

import builtins
import json
import re
import struct
from typing import Any

import numpy as np

from ..errors import FormatError

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")

MAX_STR = 1 << 16
#: longest JSON text :func:`load_json` parses by default (bytes or characters)
MAX_JSON = 1 << 16
#: deepest nesting of arrays and objects :func:`load_json` accepts by default
MAX_JSON_DEPTH = 32

# a JSON string literal (unrolled, so matching is linear), and a run of brackets
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_JSON_BRACKETS = re.compile(r"[\[{]+|[\]}]+")


class Encoder:
    """Append-only byte builder."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def u8(self, v: int) -> None:
        self._parts.append(_U8.pack(v))

    def u16(self, v: int) -> None:
        self._parts.append(_U16.pack(v))

    def u32(self, v: int) -> None:
        self._parts.append(_U32.pack(v))

    def u64(self, v: int) -> None:
        self._parts.append(_U64.pack(v))

    def i64(self, v: int) -> None:
        self._parts.append(_I64.pack(v))

    def f64(self, v: float) -> None:
        self._parts.append(_F64.pack(v))

    def raw(self, b: bytes) -> None:
        self._parts.append(bytes(b))

    def blob(self, b: bytes) -> None:
        """Length-prefixed (u64) bytes."""
        self.u64(len(b))
        self._parts.append(bytes(b))

    def str(self, s: str) -> None:
        """Length-prefixed (u32) UTF-8 string, at most MAX_STR bytes."""
        b = s.encode("utf-8")
        if len(b) > MAX_STR:
            raise ValueError(f"string of {len(b)} bytes exceeds the format limit of {MAX_STR}")
        self.u32(len(b))
        self._parts.append(b)

    def array(self, a, dtype) -> None:
        """The values of *a* as *dtype* (little-endian, C order), no length."""
        self._parts.append(np.ascontiguousarray(a, dtype=np.dtype(dtype)).tobytes())

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class Decoder:
    """Bounds-checked reader over a byte string; *what* names it in errors."""

    __slots__ = ("buf", "pos", "end", "what")

    def __init__(
        self, buf: bytes | memoryview, what: str = "metadata", pos: int = 0, end: int | None = None
    ):
        self.buf = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
        self.pos = pos
        self.end = len(buf) if end is None else end
        self.what = what

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def _take(self, n: int) -> bytes | memoryview:
        if n < 0 or n > self.end - self.pos:
            raise self._short(n)
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def _short(self, n: int) -> FormatError:
        return FormatError(
            f"{self.what}: truncated at byte {self.pos}: need {n} bytes, {self.end - self.pos} left"
        )

    # the fixed-size fields are unpacked where they lie (a slice of bytes is a copy, and a
    # call of _take a frame: half the time of decoding a record of a small step)
    def u8(self) -> int:
        p = self.pos
        if p >= self.end:
            raise self._short(1)
        self.pos = p + 1
        return self.buf[p]

    def u16(self) -> int:
        return self._fixed(_U16)

    def u32(self) -> int:
        p = self.pos
        if p + 4 > self.end:
            raise self._short(4)
        self.pos = p + 4
        return _U32.unpack_from(self.buf, p)[0]

    def u64(self) -> int:
        p = self.pos
        if p + 8 > self.end:
            raise self._short(8)
        self.pos = p + 8
        return _U64.unpack_from(self.buf, p)[0]

    def i64(self) -> int:
        return self._fixed(_I64)

    def f64(self) -> float:
        return self._fixed(_F64)

    def fields(self, st: struct.Struct) -> tuple:
        """The fields of *st* (little-endian, fixed size) at the reading position, unpacked."""
        p = self.pos
        if p + st.size > self.end:
            raise self._short(st.size)
        self.pos = p + st.size
        return st.unpack_from(self.buf, p)

    def _fixed(self, st: struct.Struct):
        return self.fields(st)[0]

    def raw(self, n: int) -> bytes:
        return bytes(self._take(n))

    def array(self, dtype, count: int) -> np.ndarray:
        """*count* values of *dtype* (read-only, a view of the buffer)."""
        dt = np.dtype(dtype)
        if count < 0 or count * dt.itemsize > self.end - self.pos:
            raise FormatError(
                f"{self.what}: truncated at byte {self.pos}: need {count} values of {dt}, "
                f"{self.end - self.pos} bytes left"
            )
        return np.frombuffer(self._take(count * dt.itemsize), dtype=dt, count=count)

    def blob(self, limit: int | None = None) -> bytes:
        n = self.u64()
        if limit is not None and n > limit:
            raise FormatError(f"{self.what}: field of {n} bytes exceeds the limit of {limit}")
        return bytes(self._take(n))

    def str(self) -> str:
        n = self.u32()
        if n > MAX_STR:
            raise FormatError(f"{self.what}: string of {n} bytes exceeds the limit of {MAX_STR}")
        try:
            return bytes(self._take(n)).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"{self.what}: string at byte {self.pos - n} is not UTF-8") from e

    def count(
        self, min_item_bytes: int, limit: int | None = None, name: builtins.str = "items"
    ) -> int:
        """Read a u32 count of items that each take at least *min_item_bytes*."""
        n = self.u32()
        if n * max(1, min_item_bytes) > self.remaining or (limit is not None and n > limit):
            raise FormatError(
                f"{self.what}: count of {n} {name} at byte {self.pos - 4} cannot fit in the "
                f"{self.remaining} bytes that remain"
            )
        return n

    def expect_end(self) -> None:
        if self.pos != self.end:
            raise FormatError(
                f"{self.what}: {self.end - self.pos} unexpected trailing bytes at {self.pos}"
            )


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in the JSON *text*, found without recursion.

    Brackets inside string literals do not count.  For text that is not
    valid JSON the result is only an estimate (the parser then rejects it).
    """
    depth = deepest = 0
    for run in _JSON_BRACKETS.findall(_JSON_STRING.sub("", text)):
        if run[0] in "[{":
            depth += len(run)
            deepest = max(deepest, depth)
        else:
            depth -= len(run)
    return deepest


def load_json(
    text: str | bytes | bytearray | memoryview,
    what: builtins.str,
    limit: int = MAX_JSON,
    max_depth: int = MAX_JSON_DEPTH,
    constants: bool = True,
) -> Any:
    """Parse JSON read from a file or the wire; :class:`~lamina.errors.FormatError` if it is not usable.

    Parameters
    ----------
    text : str or bytes-like
        The JSON text (bytes must be UTF-8).
    what : str
        What is being read, for error messages (e.g. ``"meta: codec description
        of dataset 'x'"``).
    limit : int
        Longest text accepted, in bytes or characters.
    max_depth : int
        Deepest nesting of arrays and objects accepted.  It is checked
        before the parser runs, so deeply nested input never reaches the
        recursion of :func:`json.loads`.
    constants : bool
        Accept ``NaN``, ``Infinity`` and ``-Infinity`` (Python's JSON writes them).

    Returns
    -------
    The parsed value.

    Raises
    ------
    FormatError
        Too long, not UTF-8, nested more than *max_depth* levels, or not JSON;
        the message starts with *what*.
    """
    if not isinstance(text, str):
        if len(text) > limit:
            raise FormatError(f"{what}: {len(text)} bytes of JSON, more than the limit of {limit}")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"{what}: not UTF-8 text (byte {e.start})") from None
    if len(text) > limit:
        raise FormatError(f"{what}: {len(text)} characters of JSON, more than the limit of {limit}")
    depth = json_depth(text)
    if depth > max_depth:
        raise FormatError(
            f"{what}: not valid JSON here: arrays and objects nested {depth} levels deep, "
            f"more than the limit of {max_depth}"
        )

    def no_constant(name: builtins.str) -> Any:
        raise ValueError(f"{name} is not a number JSON allows here")

    try:
        if constants:
            return json.loads(text)
        return json.loads(text, parse_constant=no_constant)
    except (ValueError, RecursionError) as e:  # RecursionError: cannot happen below max_depth
        raise FormatError(f"{what}: not valid JSON ({e})") from None
