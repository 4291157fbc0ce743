"""On-disk layout of the native format: pure functions over bytes.

A lamina file is a directory::

    run.lam/
      lamina.meta     header + metadata records, each framed (length, crc32c)
      lamina.commit   header + one 32-byte commit entry per committed record
      data.S.A        block data written by aggregator A in writer session S

Commit protocol: block data is written (and made durable) first, then the
metadata record is appended to ``lamina.meta``, then its commit entry to
``lamina.commit``, each fsynced in that order.  A record counts only once
its commit entry is complete and valid, so a writer killed at any point
leaves every earlier step readable.  See ``docs/format.md``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ...errors import FormatError, NotALaminaFileError
from ...stats import crc

VERSION = 1
META_MAGIC = b"LAMINA\x89M"
COMMIT_MAGIC = b"LAMINA\x89C"
META_NAME = "lamina.meta"
COMMIT_NAME = "lamina.commit"
HEADER_SIZE = 16
FRAME_HEAD = struct.Struct("<QI")  # payload length, crc32c of payload
ENTRY = struct.Struct("<QQQII")  # seq, frame offset, frame length, payload crc, entry crc
ENTRY_SIZE = ENTRY.size  # 32
MAX_RECORD = 1 << 31


def header(magic: bytes) -> bytes:
    """16-byte file header: magic (8), version u16, flags u16, crc32c of the first 12 bytes."""
    head = magic + struct.pack("<HH", VERSION, 0)
    return head + struct.pack("<I", crc(head))


def check_header(buf: bytes, magic: bytes, what: str) -> int:
    """Validate a file header; returns its version."""
    if len(buf) < HEADER_SIZE or buf[:8] != magic:
        raise NotALaminaFileError(f"{what} is not a lamina file (bad magic)")
    version, _flags = struct.unpack("<HH", buf[8:12])
    (c,) = struct.unpack("<I", buf[12:16])
    if c != crc(buf[:12]):
        raise FormatError(f"{what}: header checksum mismatch")
    if version > VERSION:
        raise FormatError(
            f"{what}: format version {version} is newer than this lamina reads ({VERSION})"
        )
    return version


def frame(payload: bytes) -> bytes:
    """A metadata record as stored in lamina.meta."""
    return FRAME_HEAD.pack(len(payload), crc(payload)) + payload


def entry(seq: int, offset: int, length: int, payload_crc: int) -> bytes:
    head = struct.pack("<QQQI", seq, offset, length, payload_crc)
    return head + struct.pack("<I", crc(head))


@dataclass(frozen=True, slots=True)
class CommitEntry:
    seq: int
    offset: int
    length: int
    payload_crc: int


def parse_commits(
    buf: bytes, meta_size: int, what: str = COMMIT_NAME
) -> tuple[list[CommitEntry], int]:
    """Valid commit entries of a commit file and the byte length of that valid prefix.

    A torn last entry (shorter than 32 bytes, or with a bad checksum) is a
    commit that did not happen and is ignored; any other inconsistency is a
    FormatError.  *meta_size* is the size of lamina.meta: every committed
    record must lie inside it.
    """
    check_header(buf, COMMIT_MAGIC, what)
    n = (len(buf) - HEADER_SIZE) // ENTRY_SIZE
    entries: list[CommitEntry] = []
    expect_off = HEADER_SIZE
    for i in range(n):
        pos = HEADER_SIZE + i * ENTRY_SIZE
        raw = buf[pos : pos + ENTRY_SIZE]
        seq, off, length, pcrc, ecrc = ENTRY.unpack(raw)
        if ecrc != crc(raw[:28]):
            if i == n - 1:
                break  # torn final entry: that commit never completed
            raise FormatError(f"{what}: commit entry {i} is corrupt (checksum mismatch)")
        if seq != i:
            raise FormatError(f"{what}: commit entry {i} has sequence number {seq}")
        if off != expect_off or length < FRAME_HEAD.size or length > MAX_RECORD:
            raise FormatError(
                f"{what}: commit entry {i} points at bytes {off}+{length}, expected offset {expect_off}"
            )
        if off + length > meta_size:
            raise FormatError(
                f"{what}: commit entry {i} points at bytes {off}..{off + length} but {META_NAME} has {meta_size} bytes"
            )
        entries.append(CommitEntry(seq, off, length, pcrc))
        expect_off = off + length
    return entries, HEADER_SIZE + len(entries) * ENTRY_SIZE


def parse_frame(buf: bytes, e: CommitEntry, what: str = META_NAME) -> bytes:
    """Payload of the record that commit entry *e* points at; *buf* holds bytes from e.offset."""
    if len(buf) != e.length:
        raise FormatError(f"{what}: record {e.seq} is truncated ({len(buf)} of {e.length} bytes)")
    if len(buf) < FRAME_HEAD.size:
        raise FormatError(
            f"{what}: record {e.seq} is shorter ({len(buf)} bytes) than its {FRAME_HEAD.size}-byte frame head"
        )
    n, c = FRAME_HEAD.unpack(buf[: FRAME_HEAD.size])
    if n != e.length - FRAME_HEAD.size:
        raise FormatError(
            f"{what}: record {e.seq} frame says {n} bytes, commit entry says {e.length - FRAME_HEAD.size}"
        )
    payload = buf[FRAME_HEAD.size :]
    if crc(payload) != c or c != e.payload_crc:
        raise FormatError(
            f"{what}: record {e.seq} (bytes {e.offset}..{e.offset + e.length}) fails its checksum"
        )
    return payload
