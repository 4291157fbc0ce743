"""The writer lock of a native file: one writing job at a time.

A writer (rank 0 of the writing job) holds an exclusive POSIX record lock
(``fcntl.lockf``) on ``lamina.lock`` inside the file's directory for as long
as the file is open for writing, and writes who it is into that file (host,
process id, time).  POSIX locks work on local file systems, NFS (through its
lock manager), Lustre mounted with ``flock``/``localflock`` and GPFS; the
kernel releases them when the holder dies, so a lock left by a killed writer
is simply taken again: stale locks recover by themselves.

Where the file system refuses locks (``ENOLCK``, ``EOPNOTSUPP``, ``ENOSYS``,
``EINVAL``), the lock file itself is the lock.  It appears whole: the writer
writes who it is into a file of its own and links that file to
``lamina.lock`` (``link`` fails where the name exists, atomically, NFS
included), so no other writer ever finds it empty and takes it for a free
one.  It is removed at close, if it is still the writer's own.  One left
behind by a process that no longer runs on this host (or an empty one, left
where locks were taken with ``lockf``) is taken over: moved aside, and
removed only if what moved is the file judged stale, so that two writers
taking over one stale lock do not each remove the other's new one.  One from
another host is reported, with what to remove if that process is known to be
gone.  A file system without hard links creates the lock file with
``O_EXCL`` and writes it after.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import sys
import time

from ...errors import LockError
from .format import link_refused

LOCK_NAME = "lamina.lock"
#: errors of fcntl.lockf that mean "this file system has no locks" (not "someone holds it")
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_HELD = {errno.EACCES, errno.EAGAIN}
#: errors of os.link that mean "this file system has no hard links"
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK, errno.EXDEV}
MAX_INFO = 512
#: files this process holds for writing (POSIX locks are per process: a second lockf here would succeed)
_HELD_HERE: dict[str, str] = {}  # the files this process holds: real path -> since when (_who)


def _host() -> str:
    """This machine's name, as ``socket.gethostname()`` gives it on POSIX (the ``uname`` node
    name), without importing ``socket`` (3 ms of every process's start)."""
    return os.uname().nodename


def _who() -> str:
    return f"host {_host()} pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"


def _info() -> bytes:
    """What a holder writes into its lock file: who it is (:func:`_who`), a line."""
    return (_who() + "\n").encode()


def _read_info(fd: int) -> str:
    """Who holds the lock, as its holder wrote it ('' if nobody wrote anything: a free lock file)."""
    try:
        raw = os.pread(fd, MAX_INFO, 0)
    except OSError:
        return "an unknown process"
    return raw.decode("utf-8", "replace").strip()


def _alive_here(info: str) -> bool | None:
    """True/False if *info* names a process on this host that does / does not run; None if another host."""
    words = info.split()
    try:
        host, pid = words[words.index("host") + 1], int(words[words.index("pid") + 1])
    except (ValueError, IndexError):
        return None
    if host != _host():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: ``struct flock`` of 64-bit Linux (type, whence, start, length, pid), for F_GETLK
_FLOCK = struct.Struct("@hhqqi4x")


def _held_elsewhere(fd: int) -> bool | None:
    """Whether another process holds a lock on *fd*'s file (asked with F_GETLK, which takes
    none: a probe that took one could make a writer starting that moment fail); None where
    that cannot be asked (not 64-bit Linux, a file system without locks)."""
    if not sys.platform.startswith("linux") or struct.calcsize("P") != 8:
        return None
    probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, probe)
    except OSError:
        return None
    return _FLOCK.unpack(got)[0] != fcntl.F_UNLCK


def _open_lock(name: str, flags: int, mode: int = 0o644) -> int:
    """``os.open`` of the lock file *name*, never through a link, without waiting: LockError
    where it is not a regular file (a named pipe's open waited for a writer to come for ever;
    a directory, a device), as with any other name of the file (the native engine's
    ``_open_in``)."""
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            what = "a named pipe" if stat.S_ISFIFO(kind) else "not a regular file"
            raise LockError(
                f"{os.path.dirname(name)!r}: its lock file {os.path.basename(name)} is {what}, "
                "which lamina did not make; remove it to write the file"
            )
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def writer_running(path: str) -> bool | None:
    """Whether a writer holds the file in directory *path* open now: True, False (a writer
    that took the lock ended without closing the file: killed, its program ended first, or
    it let go of the file without a close, as ranks that leave after an error do), or None
    where that cannot be told (no writer's trace, another host's writer on a file system
    without locks).  Asked only of a file with no close record.  Reads only: never takes
    the lock."""
    if os.path.realpath(path) in _HELD_HERE:
        return True
    try:
        fd = _open_lock(os.path.join(path, LOCK_NAME), os.O_RDONLY)
    except (OSError, LockError):  # (none, or not lamina's: no writer's trace to ask)
        return None
    try:
        info = _read_info(fd)
        held = _held_elsewhere(fd)
        if not info:
            # released without a close record: its writer let go of the file (a writer that
            # has just taken the lock, before it wrote who it is, still holds it)
            return False if held is None else held
        if held is not None:
            return held
        return _alive_here(info)  # the lock file is the lock: its writer's process
    finally:
        os.close(fd)


class WriterLock:
    """The lock of the file in directory *path*; :meth:`acquire` takes it or raises LockError."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = os.path.join(path, LOCK_NAME)
        self.fd = -1
        self.key = ""
        self.exclusive_file = False  # the fallback: the lock file is the lock

    def acquire(self) -> None:
        key = os.path.realpath(self.path)
        if key in _HELD_HERE:
            raise LockError(
                f"{self.path!r} is already open for writing in this process ({_HELD_HERE[key]})"
            )
        self._acquire()
        _HELD_HERE[key] = _who()
        self.key = key

    def _acquire(self) -> None:
        try:
            fd = _open_lock(self.name, os.O_RDWR | os.O_CREAT)
        except IsADirectoryError:
            raise LockError(
                f"{self.path!r}: its lock file {os.path.basename(self.name)} is a directory, "
                "which lamina did not make; remove it to write the file"
            ) from None
        except OSError as e:
            link = link_refused(e, self.path, LOCK_NAME)  # (O_NOFOLLOW met a link)
            if link is not None:
                raise link from None
            raise
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in _HELD:
                holder = _read_info(fd) or "another process"
                os.close(fd)
                raise LockError(
                    f"{self.path!r} is open for writing by {holder}: one writing job at a time "
                    "(readers may open it meanwhile)"
                ) from None
            os.close(fd)
            if e.errno not in _NO_LOCKS:
                raise
            self._acquire_without_locks()
            return
        self.fd = fd
        self._write_info()

    def _acquire_without_locks(self) -> None:
        for _ in range(4):
            fd = self._create_whole()
            if fd >= 0:
                self.fd = fd
                self.exclusive_file = True
                return
            self._take_over()  # raises LockError where the holder may live
        raise LockError(f"cannot take the writer lock {self.name}: it keeps coming back")

    def _create_whole(self) -> int:
        """The lock file, made with who holds it in one step (a file of this process's own
        linked to the lock's name); its descriptor, or -1 where the name exists."""
        mine = f"{self.name}.{_host()}.{os.getpid()}"
        fd = os.open(
            mine, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        linked = False
        try:
            os.pwrite(fd, _info(), 0)
            try:
                os.link(mine, self.name)
                linked = True
            except FileExistsError:
                return -1
            except OSError as e:
                if e.errno not in _NO_LINKS:
                    raise
        finally:
            if not linked:
                os.close(fd)
            try:
                os.unlink(mine)  # (the lock's name keeps the file)
            except OSError:
                pass
        return fd if linked else self._create_excl()

    def _create_excl(self) -> int:
        """:meth:`_create_whole` where the file system has no hard links: ``O_EXCL``, then
        who holds it (a writer looking in between finds it empty)."""
        try:
            fd = os.open(
                self.name,
                os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
            )
        except FileExistsError:
            return -1
        os.pwrite(fd, _info(), 0)
        return fd

    def _take_over(self) -> None:
        """The lock file exists: LockError if its holder may run; else it is moved aside and
        removed, if what moved is the file judged stale (else it is put back)."""
        try:
            fd = _open_lock(self.name, os.O_RDONLY)
        except FileNotFoundError:
            return  # released meanwhile: try again
        try:
            judged = os.fstat(fd)
            holder = _read_info(fd)
        finally:
            os.close(fd)
        alive = _alive_here(holder) if holder else False
        if alive is not False:
            more = (
                ""
                if alive
                else f"; this file system has no locks: if that process is gone, remove {self.name}"
            )
            raise LockError(f"{self.path!r} is open for writing by {holder}{more}")
        aside = f"{self.name}.stale.{_host()}.{os.getpid()}"
        try:
            os.rename(self.name, aside)
        except FileNotFoundError:
            return  # another writer took it over first
        moved = os.stat(aside)
        if (moved.st_dev, moved.st_ino) != (judged.st_dev, judged.st_ino):
            # another writer's new lock, made since it was judged: back where it was
            try:
                os.link(aside, self.name)
            except OSError:
                pass
        os.unlink(aside)

    def _write_info(self) -> None:
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, _info(), 0)
        except OSError as e:  # (a full disk: say which file, as open does)
            raise OSError(
                e.errno, f"{e.strerror} (writing who holds the lock)", self.name
            ) from None

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            if self.exclusive_file:
                mine, there = os.fstat(self.fd), os.stat(self.name)
                if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                    os.unlink(self.name)  # (not another writer's, after a takeover)
            else:
                os.ftruncate(self.fd, 0)  # nobody holds it (the kernel drops the lock at close)
        except OSError:
            pass
        finally:
            # forgotten first: an interrupt here may leave the descriptor open (the kernel
            # drops the lock at exit), never closed twice (the number may be another file's)
            fd, self.fd = self.fd, -1
            _HELD_HERE.pop(self.key, None)
            os.close(fd)


__all__ = ["LOCK_NAME", "WriterLock", "writer_running"]
