"""Engine ``native``: block-indexed directory format with two-phase aggregation.

Ranks are split into ``aggregators`` contiguous groups; the first rank of
each group owns one subfile per writer session.  An aggregator writes its
own blocks at ``put`` time (while its worker thread computes statistics and
checksums); member ranks keep theirs (a copy, or the caller's buffer with
``copy=False``) and send them to their aggregator at ``end_step``, which
receives the next piece while writing the current one.  ``aggregators=1``
is one subfile; ``aggregators=size`` is file-per-process.

Rank 0 alone touches the metadata files (``format.py`` describes them); it
reads new records and broadcasts them, so every rank sees the same steps.
"""

from __future__ import annotations

import errno
import os
import stat
import warnings

import numpy as np

from ... import comm as comm_mod
from ... import stats as stats_mod
from ...catalog import BlockCodec, Decoder, Encoder, Record, subfile_name
from ...errors import ChecksumError, FormatError, LaminaWarning, NotALaminaFileError
from ...geometry import Box, split_range
from ..block import BlockEngine, Header, Pending, wait_for
from . import format as fmt
from .lock import LOCK_NAME, WriterLock

MSG_CHUNK = 1 << 25  # 32 MiB pieces: pipelined, and far below MPI's 2 GiB count limit


PREALLOCATE_MIN = 1 << 20


def _pwrite_all(fd: int, buf, offset: int) -> None:
    mv = memoryview(buf).cast("B")
    if len(mv) >= PREALLOCATE_MIN:
        # reserve the extent first (as numpy's tofile does): one allocation instead of
        # one per page written; filesystems without it just write
        try:
            os.posix_fallocate(fd, offset, len(mv))
        except OSError:
            pass
    done = 0
    while done < len(mv):
        n = os.pwrite(fd, mv[done:], offset + done)
        if n <= 0:
            raise OSError(f"short write at offset {offset + done}")
        done += n


def _pread_into(fd: int, mv: memoryview, offset: int, what: str) -> None:
    done = 0
    while done < len(mv):
        n = os.preadv(fd, [mv[done:]], offset + done)
        if n <= 0:
            raise FormatError(
                f"{what}: file ends at byte {offset + done}, expected {len(mv) - done} more bytes"
            )
        done += n


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _is_lamina_name(name: str) -> bool:
    """True for the names lamina writes in its directory (nothing else there is lamina's)."""
    return (
        name in (fmt.META_NAME, fmt.COMMIT_NAME, LOCK_NAME)
        or fmt.DATA_NAME.fullmatch(name) is not None
    )


def _foreign(path: str) -> str | None:
    """A name in directory *path* that lamina did not write, or None."""
    return next((n for n in sorted(os.listdir(path)) if not _is_lamina_name(n)), None)


def _open_in(directory: str, name: str, flags: int, mode: int = 0o644) -> int:
    """``os.open`` of *name* inside a lamina directory, never through a symbolic link."""
    try:
        return os.open(os.path.join(directory, name), flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):
            raise FormatError(
                f"{directory}: {name} is a symbolic link; lamina does not follow links inside its files"
            ) from None
        raise


def _read_all(directory: str, name: str) -> tuple[bytes, os.stat_result]:
    fd = _open_in(directory, name, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), os.fstat(fd)
    finally:
        os.close(fd)


class NativeEngine(BlockEngine):
    """Engine ``native`` (see module docstring).

    Options
    -------
    aggregators : int
        Number of subfiles written per session (1..ranks); default: one per rank.
    durable : bool
        fsync data, then metadata, then the commit entry at every commit (default True).
    """

    name = "native"
    OPTIONS = BlockEngine.OPTIONS | {"aggregators", "durable"}

    # ------------------------------------------------------------ open
    def _open_storage(self, path: str, mode: str) -> None:
        self.durable = bool(self.options.get("durable", True))
        naggs = self.options.get("aggregators")
        naggs = self.size if naggs is None else int(naggs)
        if not 1 <= naggs <= self.size:
            raise ValueError(
                f"aggregators must be between 1 and the number of ranks ({self.size}), got {naggs}"
            )
        self.naggs = naggs
        self.agg_of = [0] * self.size
        self.agg_rank = []
        for a in range(naggs):
            lo, hi = split_range(self.size, naggs, a)
            self.agg_rank.append(lo)
            for r in range(lo, hi):
                self.agg_of[r] = a
        self.is_agg = self.agg_rank[self.agg_of[self.rank]] == self.rank
        self._rfds: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        self._meta_fd = self._commit_fd = self._data_fd = -1
        self._lock: WriterLock | None = None
        self._identity: int | None = None  # the file's, once read (0: a version 1 file has none)
        self._commit_inode: tuple[int, int] | None = None  # (device, inode) of the commit log read
        self._held_fd = -1  # that commit log, open while this engine is
        self._nentries = 0
        self._meta_end = self._commit_end = fmt.HEADER_SIZE
        self._warned = -1  # the last record a reader warned it had to leave out

        g = comm_mod.Guard()
        with g:
            if self.rank == 0:
                self._prepare_dir(path, mode)
        comm_mod.agree(self.comm, g.error)
        self._load_new()
        if mode != "r":
            self.session = self.catalog.last_session + 1
            g = comm_mod.Guard()
            with g:
                if self.is_agg:
                    name = subfile_name(self.session, self.agg_of[self.rank])
                    self._data_fd = _open_in(path, name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                self._data_end = 0
            comm_mod.agree(self.comm, g.error)
            if self.durable and self.rank == 0:
                # the new subfiles' directory entries must survive before a commit names them
                _fsync_dir(path)

    def _prepare_dir(self, path: str, mode: str) -> None:
        """Rank 0: check the directory for *mode*; writers take the lock, then create or truncate."""
        exists = os.path.exists(path)
        if mode == "r":
            commit = os.path.join(path, fmt.COMMIT_NAME)
            if self.wait and not os.path.lexists(commit):  # its writer may not have created it yet
                wait_for(
                    path,
                    self.wait,
                    lambda: os.path.lexists(commit),
                    lambda s: (
                        FileNotFoundError if not os.path.exists(path) else NotALaminaFileError
                    )(f"no lamina file {path!r} after waiting {s:g} s for its writer to create it"),
                )
                return
            if not exists:
                raise FileNotFoundError(f"no such lamina file: {path!r}")
            if not os.path.isdir(path) or not os.path.lexists(commit):
                raise NotALaminaFileError(
                    f"{path!r} is not a lamina file (no {fmt.COMMIT_NAME} inside)"
                )
            return
        if exists and not os.path.isdir(path):
            raise NotALaminaFileError(
                f"cannot create lamina file {path!r}: a file of that name exists"
            )
        if not exists:
            os.makedirs(path, exist_ok=True)
            if self.durable:
                _fsync_dir(os.path.dirname(os.path.abspath(path)))
        self._check_foreign(path)  # before the lock file: leave a stranger's directory as it was
        self._lock = WriterLock(path)
        self._lock.acquire()  # before anything changes: one writing job at a time
        committed = os.path.lexists(os.path.join(path, fmt.COMMIT_NAME))
        if mode == "w" or not committed:
            # a new file; or 'a' where nothing was ever committed (a writer killed while creating it)
            self._check_foreign(path)
            self._create(path)
        self._meta_fd = _open_in(path, fmt.META_NAME, os.O_RDWR)
        self._commit_fd = _open_in(path, fmt.COMMIT_NAME, os.O_RDWR)

    @staticmethod
    def _check_foreign(path: str) -> None:
        """Refuse a directory that is not a lamina file and holds something lamina did not write."""
        if os.path.lexists(os.path.join(path, fmt.COMMIT_NAME)):
            return  # a lamina file: what else it holds is left alone
        foreign = _foreign(path)
        if foreign is not None:
            raise NotALaminaFileError(
                f"cannot create lamina file {path!r}: the directory is not a lamina file and holds "
                f"{foreign!r}, which lamina did not write (lamina removes only its own files)"
            )

    def _create(self, path: str) -> None:
        """Rank 0, holding the lock: remove what lamina wrote here before, start empty logs."""
        for name in sorted(os.listdir(path)):
            if name == LOCK_NAME or not _is_lamina_name(name):
                continue  # only what lamina wrote goes; a link goes as a link
            full = os.path.join(path, name)
            if os.path.isdir(full) and not os.path.islink(full):
                raise NotALaminaFileError(
                    f"cannot truncate lamina file {path!r}: {name} is a directory"
                )
            os.unlink(full)
        identity = fmt.new_identity()
        for name, magic in ((fmt.META_NAME, fmt.META_MAGIC), (fmt.COMMIT_NAME, fmt.COMMIT_MAGIC)):
            fd = _open_in(path, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            try:
                _pwrite_all(fd, fmt.header(magic, identity), 0)
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
        if self.durable:
            _fsync_dir(path)

    # ------------------------------------------------------ metadata I/O
    def _read_new_records(self) -> tuple[list[bytes], list[fmt.CommitEntry], int]:
        """Rank 0: payloads of records committed since the last call (validated), their
        commit entries, and the header size of the logs."""
        where = f"{self.path}/{fmt.COMMIT_NAME}"
        try:
            cbuf, cstat = _read_all(self.path, fmt.COMMIT_NAME)
            mfd = _open_in(self.path, fmt.META_NAME, os.O_RDONLY)
        except FileNotFoundError as e:
            raise NotALaminaFileError(
                f"{self.path!r} is not a lamina file: {e.filename} is missing"
            ) from e
        try:
            meta_size = os.fstat(mfd).st_size
            entries, _valid_end, head = fmt.parse_commits(cbuf, meta_size, where)
            if self._identity is None:
                mhead = fmt.check_header(
                    os.pread(mfd, fmt.HEADER_SIZE, 0),
                    fmt.META_MAGIC,
                    f"{self.path}/{fmt.META_NAME}",
                )
                if (mhead.version, mhead.identity) != (head.version, head.identity):
                    raise FormatError(
                        f"{self.path}: {fmt.META_NAME} and {fmt.COMMIT_NAME} belong to different files "
                        f"(versions {mhead.version}/{head.version}, identities {mhead.identity}/{head.identity})"
                    )
                self._identity = head.identity
                self._commit_inode = (cstat.st_dev, cstat.st_ino)
                # kept open, so that the inode stays this file's and a re-created log gets another
                self._held_fd = _open_in(self.path, fmt.COMMIT_NAME, os.O_RDONLY)
                if os.fstat(self._held_fd).st_ino != cstat.st_ino:
                    raise FormatError(
                        f"{self.path}: the file was re-created while being opened; open it again"
                    )
            elif (
                head.identity != self._identity
                or (cstat.st_dev, cstat.st_ino) != self._commit_inode
            ):
                raise FormatError(
                    f"{self.path}: the file was re-created while open (another writer opened it "
                    "in mode 'w'); open it again to read the new one"
                )
            if len(entries) < self._nentries:
                raise FormatError(
                    f"{self.path}: {len(entries)} committed records, {self._nentries} seen before: "
                    "the file was truncated or re-created while open"
                )
            new = entries[self._nentries :]
            out = [
                fmt.parse_frame(
                    os.pread(mfd, e.length, e.offset), e, f"{self.path}/{fmt.META_NAME}"
                )
                for e in new
            ]
        finally:
            os.close(mfd)
        return out, new, head.size

    def _load_new(self) -> int:
        """Collective: read records committed since the last call on rank 0, apply on all ranks.

        All or nothing: if any record fails to decode or check on any rank,
        every rank restores its catalog and rank 0 keeps its reading position,
        so ranks never disagree on the steps they see.

        A record whose blocks lie beyond the end of their subfile (a copy
        cut short, a subfile truncated) ends what is read: the steps before
        it open, a warning says what was left out, and a writer ('a')
        continues after the intact prefix.
        """
        g = comm_mod.Guard()
        blob = None
        state = None
        cp = self.catalog.checkpoint()
        with g:
            if self.rank == 0:
                payloads, entries, header_size = self._read_new_records()
                good = self._intact_prefix(payloads)
                n = self._nentries + len(good)
                meta_end = (
                    entries[len(good) - 1].offset + entries[len(good) - 1].length if good else None
                )
                state = (
                    n,
                    meta_end if meta_end is not None else max(self._meta_end, header_size),
                    header_size + n * fmt.ENTRY_SIZE,
                )
                e = Encoder()
                e.u32(len(good))
                for p in good:
                    e.blob(p)
                blob = e.getvalue()
        try:
            comm_mod.agree(self.comm, g.error)
        except Exception:
            self.catalog.restore(cp)
            raise
        blob = comm_mod.bcast_bytes(self.comm, blob, root=0)
        g = comm_mod.Guard()
        with g:
            if self.rank != 0:  # rank 0 applied them while checking them
                d = Decoder(blob, "metadata broadcast")
                for _ in range(d.count(8, name="records")):
                    seq = self.catalog.nrecords
                    rec = Record.decode(
                        d.blob(), self.catalog, f"{self.path}/{fmt.META_NAME} record {seq}"
                    )
                    self.catalog.apply_record(rec, ops_applied=True)
            if self.rank == 0 and self.mode != "r":
                # drop anything past the intact commits (a killed writer's torn tail, records whose data is gone)
                assert state is not None  # read on rank 0
                _n, meta_end, commit_end = state
                os.ftruncate(self._meta_fd, meta_end)
                os.ftruncate(self._commit_fd, commit_end)
        try:
            comm_mod.agree(self.comm, g.error)
        except Exception:
            self.catalog.restore(cp)
            raise
        if self.rank == 0:
            # only now that every rank applied the records: read on from after them
            assert state is not None
            self._nentries, self._meta_end, self._commit_end = state
        return len(self.catalog.steps)

    def _intact_prefix(self, payloads: list[bytes]) -> list[bytes]:
        """Rank 0: decode and apply *payloads* in order up to the first whose blocks are not all there."""
        good: list[bytes] = []
        for raw in payloads:
            seq = self.catalog.nrecords
            before = self.catalog.checkpoint()
            rec = Record.decode(raw, self.catalog, f"{self.path}/{fmt.META_NAME} record {seq}")
            missing = self._missing_data(rec)
            if missing is not None:
                self.catalog.restore(before)
                if seq != self._warned:
                    self._warned = seq
                    warnings.warn(
                        f"{self.path}: {len(payloads) - len(good)} committed record(s) from record {seq} "
                        f"(step {len(self.catalog.steps)} on) left out: {missing}",
                        LaminaWarning,
                        stacklevel=5,
                    )
                break
            self.catalog.apply_record(rec, ops_applied=True)
            good.append(raw)
        return good

    def _missing_data(self, rec: Record) -> str | None:
        """What of *rec*'s block data is not in its subfiles (None if everything is)."""
        for b in rec.blocks:
            if b.length == 0:
                continue
            name = b.subfile
            size = self._sizes.get(name)
            if size is None or b.offset + b.length > size:
                try:
                    st = os.lstat(os.path.join(self.path, name))
                except FileNotFoundError:
                    return f"subfile {name} of dataset block {b.box} is missing"
                if stat.S_ISLNK(st.st_mode):
                    return f"subfile {name} is a symbolic link; lamina does not follow links inside its files"
                if not stat.S_ISREG(st.st_mode):
                    return f"subfile {name} is not a regular file"
                size = self._sizes[name] = st.st_size
            if b.offset + b.length > size:
                spec = self.catalog.specs[b.dataset]
                return (
                    f"block {b.box} of dataset {spec.path!r} needs bytes "
                    f"{b.offset}..{b.offset + b.length} of {name}, which has {size}"
                )
        return None

    def refresh(self) -> int:
        """Collective: pick up steps committed by a writer since open (for following a live file)."""
        if self.mode != "r":
            return len(self.catalog.steps)
        return self._load_new()

    def _write_record(self, raw: bytes) -> None:
        framed = fmt.frame(raw)
        off = self._meta_end
        try:
            _pwrite_all(self._meta_fd, framed, off)
            if self.durable:
                os.fsync(self._meta_fd)
            ent = fmt.entry(self._nentries, off, len(framed), stats_mod.crc(raw))
            _pwrite_all(self._commit_fd, ent, self._commit_end)
            if self.durable:
                os.fsync(self._commit_fd)
        except BaseException:
            # the step is discarded on every rank: make sure no reader can see it either
            for fd, end in ((self._commit_fd, self._commit_end), (self._meta_fd, self._meta_end)):
                try:
                    os.ftruncate(fd, end)
                except OSError:
                    pass
            raise
        self._nentries += 1
        self._meta_end = off + len(framed)
        self._commit_end += len(ent)

    # ------------------------------------------------------------ data
    def _stage(self, p: Pending, copy: bool) -> None:
        assert p.data is not None  # a raw block keeps its array until it is stored
        if self.is_agg:
            # write now; the worker thread computes stats/checksums meanwhile
            p.job = stats_mod.BlockJob(p.data, self.segment, background=self.background_stats)
            off = self._data_end
            try:
                _pwrite_all(self._data_fd, p.data, off)
            except OSError as e:
                # raised by end_step, on every rank: raised here, on this rank only, it would
                # leave the other ranks waiting in end_step for this one
                self._put_error = self._put_error or e
            else:
                self._data_end += p.length
            p.location = (self.session, self.agg_of[self.rank], off)
            if copy:
                p.job.result()  # the caller may reuse its buffer as soon as we return
            p.data = None if copy else p.data
            return
        super()._stage(p, copy)

    def _payload(self, p: Pending) -> memoryview:
        if p.codec == BlockCodec.PIPELINE:
            assert p.payload is not None
            return memoryview(p.payload)
        assert p.data is not None
        return p.data.data.cast("B")

    def _move(self, headers: list[Header], mine: list[Pending]):
        """Collective: members send their deferred blocks to their aggregator, which writes them.

        Every expected byte is always sent and received, even after a local
        failure (a full disk, say): the aggregator keeps draining its members'
        messages and raises afterwards, and a member that cannot produce a
        payload sends zeros, so no message is left to be matched by a later
        step and no rank is left blocked in a send or receive.  Tags also
        carry the record number as a second guard.
        """
        tag = comm_mod.Tag.AGGREGATE + self.catalog.nrecords % 4096
        locations = []
        my_agg = self.agg_of[self.rank]
        error: BaseException | None = None
        if self.is_agg:
            agg = my_agg
            for p in mine:
                if p.location is None:
                    off = self._data_end
                    try:
                        if error is None:
                            _pwrite_all(self._data_fd, self._payload(p), off)
                    except Exception as e:
                        error = e
                    self._data_end += p.length
                    p.location = (self.session, agg, off)
                    locations.append((self.rank, p.idx, self.session, agg, off))
            for h in headers:
                if h.rank == self.rank or self.agg_of[h.rank] != agg or h.location is not None:
                    continue
                off = self._data_end
                failed = self._recv_write(
                    h.rank, h.length, off, self._recv_buffers(h.length), tag, write=error is None
                )
                error = error or failed
                self._data_end += h.length
                locations.append((h.rank, h.idx, self.session, agg, off))
            if error is None and self.durable:
                os.fsync(self._data_fd)
        else:
            dest = self.agg_rank[my_agg]
            for p in mine:
                if p.location is None:
                    try:
                        mv = self._payload(p)
                        if len(mv) != p.length:
                            raise ValueError(
                                f"block payload has {len(mv)} bytes, header said {p.length}"
                            )
                    except Exception as e:
                        error = error or e
                        mv = memoryview(bytearray(p.length))
                    for a in range(0, len(mv), MSG_CHUNK):
                        self.comm.Send(
                            [mv[a : a + MSG_CHUNK], comm_mod.MPI.BYTE], dest=dest, tag=tag
                        )
        if error is not None:
            raise error
        return locations

    def _recv_buffers(self, length: int) -> list[bytearray]:
        """Two reusable receive buffers, grown on demand (never larger than MSG_CHUNK)."""
        need = min(MSG_CHUNK, length)
        bufs = getattr(self, "_bufs", None)
        if bufs is None or len(bufs[0]) < need:
            bufs = self._bufs = [bytearray(need), bytearray(need)]
        return bufs

    def _recv_write(
        self,
        src: int,
        length: int,
        offset: int,
        bufs: list[bytearray],
        tag: int,
        write: bool = True,
    ) -> OSError | None:
        """Receive *length* bytes from *src* in pieces, writing piece k while piece k+1 arrives.

        Every piece is always received; after a write error (returned, not
        raised) or with ``write=False`` the remaining pieces are drained unwritten.
        """
        MPI = comm_mod.MPI
        pieces = [(a, min(MSG_CHUNK, length - a)) for a in range(0, length, MSG_CHUNK)]
        error: OSError | None = None
        reqs = []
        if pieces:
            reqs.append(
                self.comm.Irecv(
                    [memoryview(bufs[0])[: pieces[0][1]], MPI.BYTE], source=src, tag=tag
                )
            )
        for k, (a, n) in enumerate(pieces):
            reqs[k].Wait()
            if k + 1 < len(pieces):
                nb = memoryview(bufs[(k + 1) % 2])[: pieces[k + 1][1]]
                reqs.append(self.comm.Irecv([nb, MPI.BYTE], source=src, tag=tag))
            if write and error is None:
                try:
                    _pwrite_all(self._data_fd, memoryview(bufs[k % 2])[:n], offset + a)
                except OSError as e:
                    error = e
        return error

    # ------------------------------------------------------------ read
    def _fd(self, name: str) -> int:
        fd = self._rfds.get(name)
        if fd is None:
            try:
                fd = _open_in(self.path, name, os.O_RDONLY)
            except FileNotFoundError:
                self._check_identity()  # a file re-created under this reader says so, not "missing"
                raise FormatError(f"{self.path}: subfile {name} is missing") from None
            try:
                self._check_identity()  # the subfile opened now must be of the file this rank knows
            except BaseException:
                os.close(fd)
                raise
            self._rfds[name] = fd
        return fd

    def _check_identity(self) -> None:
        """FormatError if the file at this path is no longer the one opened (re-created since).

        Re-creation makes a new commit log (the identity in its header, checked
        at each refresh, and its inode, checked here without reading a byte).
        """
        if self._commit_inode is None:
            return
        try:
            st = os.stat(os.path.join(self.path, fmt.COMMIT_NAME), follow_symlinks=False)
            same = (st.st_dev, st.st_ino) == self._commit_inode
        except OSError:
            same = False
        if not same:
            raise FormatError(
                f"{self.path}: the file was re-created while open (another writer opened it "
                "in mode 'w'); open it again to read the new one"
            )

    def _read_region(self, rec, spec, inter: Box, dst: np.ndarray) -> None:
        what = f"{self.path}/{rec.subfile}: dataset {spec.path!r} block {rec.box}"
        fd = self._fd(rec.subfile)
        if rec.codec != BlockCodec.RAW:
            buf = np.empty(rec.length, dtype=np.uint8)
            self._read_verified(fd, buf.data, rec.offset, 0, rec, what)
            arr = self.decode_payload(rec, spec, buf)
            dst[...] = arr[inter.relative_to(rec.box)]
            return
        item = spec.dtype.itemsize
        if inter == rec.box and dst.flags.c_contiguous:
            # the whole block into the caller's memory: no intermediate copy
            self._read_verified(fd, dst.data.cast("B"), rec.offset, 0, rec, what)
            return
        # byte span of the region in the block's C order, widened to checksum segments
        bshape = rec.box.shape
        first = (
            int(
                np.ravel_multi_index(
                    tuple(a - b for a, b in zip(inter.start, rec.box.start, strict=True)), bshape
                )
            )
            if bshape
            else 0
        )
        last = (
            int(
                np.ravel_multi_index(
                    tuple(a - 1 - b for a, b in zip(inter.stop, rec.box.start, strict=True)), bshape
                )
            )
            if bshape
            else 0
        )
        lo, hi = first * item, (last + 1) * item
        seg = rec.seg
        if seg:
            lo = (lo // seg) * seg
            hi = min(rec.length, -(-hi // seg) * seg)
        else:
            lo, hi = 0, rec.length
        buf = np.empty(hi - lo, dtype=np.uint8)
        self._read_verified(fd, buf.data, rec.offset + lo, lo, rec, what)
        strides = tuple(
            item * int(np.prod(bshape[i + 1 :], dtype=np.int64)) for i in range(len(bshape))
        )
        view = np.lib.stride_tricks.as_strided(
            buf[first * item - lo :].view(spec.dtype),
            shape=inter.shape,
            strides=strides,
            writeable=False,
        )
        dst[...] = view

    def _read_verified(
        self, fd: int, mv: memoryview, file_off: int, block_off: int, rec, what: str
    ) -> None:
        """Read bytes [block_off, block_off+len(mv)) of a block and check their segment checksums.

        Reads segment by segment; the checksum of segment k runs on the worker
        thread while segment k+1 is read.
        """
        seg = rec.seg if rec.seg else rec.length
        n = len(mv)
        futures = []
        pool = stats_mod._pool()
        pos = 0
        while pos < n:
            k = (block_off + pos) // seg if seg else 0
            end = min(n, (k + 1) * seg - block_off)
            piece = mv[pos:end]
            _pread_into(fd, piece, file_off + pos, what)
            futures.append((k, pool.submit(stats_mod.crc, piece)))
            pos = end
        for k, fut in futures:
            got = fut.result()
            if k >= len(rec.crcs) or got != rec.crcs[k]:
                raise ChecksumError(
                    f"checksum mismatch in {what}, segment {k} (bytes {rec.offset + k * seg}.."
                    f"{rec.offset + min(rec.length, (k + 1) * seg)}): the data is corrupt"
                )

    def _close_storage(self) -> None:
        fds = list(getattr(self, "_rfds", {}).values())
        fds += [getattr(self, n, -1) for n in ("_meta_fd", "_commit_fd", "_data_fd", "_held_fd")]
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._rfds = {}
        self._meta_fd = self._commit_fd = self._data_fd = self._held_fd = -1
        lock = getattr(self, "_lock", None)
        if lock is not None:  # last: a new writer may start once the logs are closed
            lock.release()
            self._lock = None
