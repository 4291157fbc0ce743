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

import glob
import os
import shutil

import numpy as np

from ... import comm as comm_mod
from ... import stats as stats_mod
from ...catalog import BlockCodec, Decoder, Encoder, Record
from ...errors import ChecksumError, FormatError, NotALaminaFileError
from ...geometry import Box, split_range
from ..block import BlockEngine, Header, Pending
from . import format as fmt

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


def _only_lamina_names(names: list[str]) -> bool:
    """True if a directory holds nothing but what a lamina writer creates."""
    return all(n in (fmt.META_NAME, fmt.COMMIT_NAME) or n.startswith("data.") for n in names)


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
        self._nentries = 0
        self._meta_end = fmt.HEADER_SIZE
        self._commit_end = fmt.HEADER_SIZE

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
                    name = os.path.join(path, f"data.{self.session}.{self.agg_of[self.rank]}")
                    self._data_fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                self._data_end = 0
            comm_mod.agree(self.comm, g.error)
            if self.durable and self.rank == 0:
                # the new subfiles' directory entries must survive before a commit names them
                _fsync_dir(path)

    def _prepare_dir(self, path: str, mode: str) -> None:
        """Rank 0: create, truncate or check the directory for *mode*."""
        meta = os.path.join(path, fmt.META_NAME)
        commit = os.path.join(path, fmt.COMMIT_NAME)
        exists = os.path.exists(path)
        if mode == "a" and exists and os.path.isdir(path) and not os.path.exists(commit):
            if _only_lamina_names(os.listdir(path)):
                # a writer was killed while creating the file: nothing was committed
                self._prepare_dir(path, "w")
                return
        if mode == "r" or (mode == "a" and exists):
            if not exists:
                raise FileNotFoundError(f"no such lamina file: {path!r}")
            if not os.path.isdir(path) or not os.path.exists(commit):
                raise NotALaminaFileError(
                    f"{path!r} is not a lamina file (no {fmt.COMMIT_NAME} inside)"
                )
        if mode == "w":
            if exists:
                if not os.path.isdir(path):
                    raise NotALaminaFileError(
                        f"cannot create lamina file {path!r}: a file of that name exists"
                    )
                if not os.path.exists(commit) and not _only_lamina_names(os.listdir(path)):
                    raise NotALaminaFileError(
                        f"cannot create lamina file {path!r}: the directory exists and is not a lamina file"
                    )
                for name in glob.glob(os.path.join(glob.escape(path), "data.*")) + [meta, commit]:
                    if os.path.isdir(name):
                        shutil.rmtree(name)
                    elif os.path.exists(name):
                        os.remove(name)
            os.makedirs(path, exist_ok=True)
            if self.durable:
                _fsync_dir(os.path.dirname(os.path.abspath(path)))
            for name, magic in ((meta, fmt.META_MAGIC), (commit, fmt.COMMIT_MAGIC)):
                with open(name, "wb") as f:
                    f.write(fmt.header(magic))
                    f.flush()
                    if self.durable:
                        os.fsync(f.fileno())
            if self.durable:
                _fsync_dir(path)
        elif mode == "a" and not exists:
            self._prepare_dir(path, "w")
            return
        if mode != "r":
            self._meta_fd = os.open(meta, os.O_RDWR)
            self._commit_fd = os.open(commit, os.O_RDWR)

    # ------------------------------------------------------ metadata I/O
    def _read_new_records(self) -> tuple[list[bytes], tuple[int, int, int]]:
        """Rank 0: payloads of records committed since the last call (validated), and the
        reader state (entries, meta end, commit end) to adopt once every rank applied them."""
        meta = os.path.join(self.path, fmt.META_NAME)
        commit = os.path.join(self.path, fmt.COMMIT_NAME)
        try:
            with open(commit, "rb") as f:
                cbuf = f.read()
            meta_size = os.path.getsize(meta)
        except FileNotFoundError as e:
            raise NotALaminaFileError(
                f"{self.path!r} is not a lamina file: {e.filename} is missing"
            ) from e
        entries, valid_end = fmt.parse_commits(cbuf, meta_size, f"{self.path}/{fmt.COMMIT_NAME}")
        if len(entries) < self._nentries:
            raise FormatError(
                f"{self.path}: {len(entries)} committed records, {self._nentries} seen before: "
                "the file was truncated or re-created while open"
            )
        new = entries[self._nentries :]
        out = []
        if new or self._nentries == 0:
            with open(meta, "rb") as f:
                if self._nentries == 0:
                    fmt.check_header(
                        f.read(fmt.HEADER_SIZE), fmt.META_MAGIC, f"{self.path}/{fmt.META_NAME}"
                    )
                for ent in new:
                    f.seek(ent.offset)
                    out.append(
                        fmt.parse_frame(f.read(ent.length), ent, f"{self.path}/{fmt.META_NAME}")
                    )
        meta_end = entries[-1].offset + entries[-1].length if entries else fmt.HEADER_SIZE
        return out, (len(entries), meta_end, valid_end)

    def _load_new(self) -> int:
        """Collective: read records committed since the last call on rank 0, apply on all ranks.

        All or nothing: if any record fails to decode or check on any rank,
        every rank restores its catalog and rank 0 keeps its reading position,
        so ranks never disagree on the steps they see.
        """
        g = comm_mod.Guard()
        blob = None
        state = None
        with g:
            if self.rank == 0:
                payloads, state = self._read_new_records()
                e = Encoder()
                e.u32(len(payloads))
                for p in payloads:
                    e.blob(p)
                blob = e.getvalue()
        comm_mod.agree(self.comm, g.error)
        blob = comm_mod.bcast_bytes(self.comm, blob, root=0)
        cp = self.catalog.checkpoint()
        g = comm_mod.Guard()
        with g:
            d = Decoder(blob, "metadata broadcast")
            for _ in range(d.count(8, name="records")):
                seq = self.catalog.nrecords
                rec = Record.decode(
                    d.blob(), self.catalog, f"{self.path}/{fmt.META_NAME} record {seq}"
                )
                if self.rank == 0:
                    self._check_locations(rec)
                self.catalog.apply_record(rec, ops_applied=True)
            if self.rank == 0 and self.mode != "r":
                # drop anything a killed writer left past the last commit
                assert state is not None  # read on rank 0
                _nentries, meta_end, commit_end = state
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

    def _check_locations(self, rec: Record) -> None:
        for b in rec.blocks:
            name = b.subfile
            size = self._sizes.get(name)
            if size is None or b.offset + b.length > size:
                try:
                    size = os.path.getsize(os.path.join(self.path, name))
                except OSError:
                    raise FormatError(
                        f"{self.path}: subfile {name} of dataset block {b.box} is missing"
                    ) from None
                self._sizes[name] = size
            if b.offset + b.length > size:
                spec = self.catalog.specs[b.dataset]
                raise FormatError(
                    f"{self.path}: block {b.box} of dataset {spec.path!r} needs bytes "
                    f"{b.offset}..{b.offset + b.length} of {name}, which has {size}"
                )

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
            _pwrite_all(self._data_fd, p.data, off)
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
                fd = os.open(os.path.join(self.path, name), os.O_RDONLY)
            except FileNotFoundError:
                raise FormatError(f"{self.path}: subfile {name} is missing") from None
            self._rfds[name] = fd
        return fd

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
        fds += [getattr(self, n, -1) for n in ("_meta_fd", "_commit_fd", "_data_fd")]
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._rfds = {}
        self._meta_fd = self._commit_fd = self._data_fd = -1
