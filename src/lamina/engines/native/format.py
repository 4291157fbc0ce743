"""On-disk layout of the native format: pure functions over bytes.

A lamina file is a directory::

    run.lam/
      lamina.meta     header + metadata records, each framed (length, crc32c)
      lamina.commit   header + one 32-byte commit entry per committed record
      lamina.lock     the writer lock (see lock.py): names its holder; emptied at close
      data.S.A        block data written by aggregator A in writer session S

Nothing else in the directory belongs to lamina; lamina never removes it.

Both headers carry the file's identity (version 2), a random number drawn
when the file is created ('w'): a reader that finds another identity knows
the file was re-created under it.

Commit protocol: block data is written (and made durable) first, then the
metadata record is appended to ``lamina.meta``, then its commit entry to
``lamina.commit``, each fsynced in that order.  A record counts only once
its commit entry is complete and valid, so a writer killed at any point
leaves every earlier step readable.  See ``docs/format.md``.
"""

from __future__ import annotations

import errno
import os
import re
import struct
from dataclasses import dataclass
from typing import NamedTuple

from ...errors import FormatError, NotALaminaFileError
from ...stats import crc

VERSION = 4
#: the first format version with multiresolution datasets (band blocks, codec 3): a writer
#: appending to a file of an earlier version refuses to create one
MULTIRES_VERSION = 3
META_MAGIC = b"LAMINA\x89M"
COMMIT_MAGIC = b"LAMINA\x89C"
META_NAME = "lamina.meta"
COMMIT_NAME = "lamina.commit"
#: header bytes per format version (version 1: no file identity)
HEADER_SIZES = {1: 16, 2: 32, 3: 32, 4: 32}
HEADER_SIZE = HEADER_SIZES[VERSION]
#: header flag bits this lamina knows: flags mark features a reader must know to read the
#: file (as ext4's incompatible features), so that a later lamina can mark one without a
#: new version; a reader refuses a file with a bit it does not know.  None is defined.
KNOWN_FLAGS = 0
#: the names of block data files; with META_NAME, COMMIT_NAME and the lock, all lamina writes
DATA_NAME = re.compile(r"data\.(0|[1-9][0-9]{0,9})\.(0|[1-9][0-9]{0,9})")
FRAME_HEAD = struct.Struct("<QI")  # payload length, crc32c of payload
ENTRY = struct.Struct("<QQQII")  # seq, frame offset, frame length, payload crc, entry crc
ENTRY_SIZE = ENTRY.size  # 32
MAX_RECORD = 1 << 31


def new_identity() -> int:
    """A file identity: random, never 0 (0 stands for "none", in version 1 files).

    From ``os.urandom`` (what ``secrets`` draws from; ``secrets`` itself imports hashlib
    and hmac, 5 ms of every process's start)."""
    return (int.from_bytes(os.urandom(8), "little") >> 1) + 1


def header(magic: bytes, identity: int, version: int = VERSION) -> bytes:
    """The 32-byte header of a version 2 or 3 file.

    magic (8), version u16, flags u16, header size u32, identity u64,
    reserved u32 (0), crc32c of the first 28 bytes u32.
    """
    head = magic + struct.pack("<HHIQI", version, 0, HEADER_SIZES[version], identity, 0)
    return head + struct.pack("<I", crc(head))


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    size: int  # bytes: where the first record (meta) or entry (commit) starts
    identity: int  # 0 for version 1 files


def check_header(buf: bytes, magic: bytes, what: str) -> Header:
    """Validate the header at the start of *buf* (at least its first 32 bytes, or the whole file)."""
    if len(buf) < 12 or buf[:8] != magic:
        raise NotALaminaFileError(f"{what} is not a lamina file (bad magic)")
    version, flags = struct.unpack("<HH", buf[8:12])
    if version > VERSION:
        raise FormatError(
            f"{what}: format version {version} is newer than this lamina reads (versions "
            f"{min(HEADER_SIZES)} to {VERSION}): a newer lamina reads it"
        )
    if version not in HEADER_SIZES:
        raise FormatError(f"{what}: unknown format version {version}")
    size = HEADER_SIZES[version]
    if len(buf) < size:
        raise FormatError(f"{what}: header truncated ({len(buf)} of {size} bytes)")
    (c,) = struct.unpack("<I", buf[size - 4 : size])
    if c != crc(buf[: size - 4]):
        raise FormatError(f"{what}: header checksum mismatch")
    if flags & ~KNOWN_FLAGS:
        raise FormatError(
            f"{what}: header flags 0x{flags:04x} mark features this lamina does not know (it "
            "knows none): a newer lamina reads it"
        )
    if version == 1:
        return Header(1, size, 0)
    declared, identity, _reserved = struct.unpack("<IQI", buf[12:28])
    if declared != size or identity == 0:
        raise FormatError(f"{what}: inconsistent header (size {declared}, identity {identity})")
    return Header(version, size, identity)


def link_refused(e: OSError, directory: str, name: str) -> FormatError | None:
    """The error of *e*, an ``os.open`` with ``O_NOFOLLOW`` of *name* in the lamina file
    *directory*, where it met a symbolic link (None for any other error): lamina does not
    follow links planted inside its files."""
    if e.errno not in (errno.ELOOP, errno.EMLINK):
        return None
    return FormatError(
        f"{directory}: {name} is a symbolic link; lamina does not follow links inside its files"
    )


def frame(payload: bytes) -> bytes:
    """A metadata record as stored in lamina.meta."""
    return FRAME_HEAD.pack(len(payload), crc(payload)) + payload


def entry(seq: int, offset: int, length: int, payload_crc: int) -> bytes:
    head = struct.pack("<QQQI", seq, offset, length, payload_crc)
    return head + struct.pack("<I", crc(head))


class CommitEntry(NamedTuple):
    """An entry of the commit log: record *seq*'s frame in lamina.meta (its offset and length)
    and the CRC-32C of its payload.  A named tuple: a log of 100,000 steps makes as many, in
    half the time frozen dataclasses took (0.11 s against 0.20 s)."""

    seq: int
    offset: int
    length: int
    payload_crc: int


def parse_commits(
    buf: bytes,
    meta_size: int,
    what: str = COMMIT_NAME,
    *,
    last_past_end: bool = False,
    after: tuple[int, int] = (0, 0),
) -> tuple[list[CommitEntry], int, Header]:
    """Valid commit entries of a commit file, the byte length of that valid prefix, and its header.

    A torn last entry (shorter than 32 bytes, or with a bad checksum) is a
    commit that did not happen and is ignored; any other inconsistency is a
    FormatError.  *meta_size* is the size of lamina.meta: every committed
    record must lie inside it (after a header of the same version), except,
    with *last_past_end* (a reader, which leaves them out), those that run
    past its end: a suffix, as frames only move forward (an entry in the
    middle that did is followed by one misplaced), the logs copied or cut at
    different moments; the last alone is a record whose frame did not reach
    the disk (its frame read short is that record's FormatError).

    *after* ``(k, end)``: *buf* is the header followed by the entries from
    entry *k* on, the entries before it checked already and their last frame
    ending at *end* (a reader following the file reads only what is new).
    """
    head = check_header(buf, COMMIT_MAGIC, what)
    n = (len(buf) - head.size) // ENTRY_SIZE
    entries: list[CommitEntry] = []
    first, expect_off = after
    expect_off = max(expect_off, head.size) if first else head.size
    for j in range(n):
        i = first + j
        pos = head.size + j * ENTRY_SIZE
        raw = buf[pos : pos + ENTRY_SIZE]
        seq, off, length, pcrc, ecrc = ENTRY.unpack(raw)
        if ecrc != crc(raw[:28]):
            if j == n - 1:
                break  # torn final entry: that commit never completed
            raise FormatError(f"{what}: commit entry {i} is corrupt (checksum mismatch)")
        if seq != i:
            raise FormatError(f"{what}: commit entry {i} has sequence number {seq}")
        # version 3 stores a step's block area before its record's frame: frames only move forward
        misplaced = off < expect_off if head.version >= 3 else off != expect_off
        if misplaced or length < FRAME_HEAD.size or length > MAX_RECORD:
            raise FormatError(
                f"{what}: commit entry {i} points at bytes {off}+{length}, expected offset "
                f"{'at least ' if head.version >= 3 else ''}{expect_off}"
            )
        if off + length > meta_size and not last_past_end:
            raise FormatError(
                f"{what}: commit entry {i} points at bytes {off}..{off + length} but {META_NAME} has {meta_size} bytes"
                + (
                    " (the logs copied or cut at different moments: readers open the records "
                    "before it; a writer does not append to such a file)"
                    if off >= meta_size or j < n - 1
                    else ""
                )
            )
        entries.append(CommitEntry(seq, off, length, pcrc))
        expect_off = off + length
    return entries, head.size + (first + len(entries)) * ENTRY_SIZE, head


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
