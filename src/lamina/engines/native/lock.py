"""The writer lock of a native file: one writing job at a time.

A writer (rank 0 of the writing job) holds an exclusive POSIX record lock
(``fcntl.lockf``) on ``lamina.lock`` inside the file's directory for as long
as the file is open for writing, and writes who it is into that file (host,
process id, time).  POSIX locks work on local file systems, NFS (through its
lock manager), Lustre mounted with ``flock``/``localflock`` and GPFS; the
kernel releases them when the holder dies, so a lock left by a killed writer
is simply taken again: stale locks recover by themselves.

Where the file system refuses locks (``ENOLCK``, ``EOPNOTSUPP``, ``ENOSYS``,
``EINVAL``), the lock file itself is the lock: created with ``O_EXCL`` and
removed at close; one left behind by a process that no longer runs on this
host is taken over; one from another host is reported, with what to remove
if that process is known to be gone.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time

from ...errors import LockError

LOCK_NAME = "lamina.lock"
#: errors of fcntl.lockf that mean "this file system has no locks" (not "someone holds it")
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_HELD = {errno.EACCES, errno.EAGAIN}
MAX_INFO = 512
#: files this process holds for writing (POSIX locks are per process: a second lockf here would succeed)
_HELD_HERE: set[str] = set()


def _who() -> str:
    return (
        f"host {socket.gethostname()} pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"
    )


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
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            raise LockError(f"{self.path!r} is already open for writing in this process ({_who()})")
        self._acquire()
        _HELD_HERE.add(key)
        self.key = key

    def _acquire(self) -> None:
        fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
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
        for _ in range(2):
            try:
                fd = os.open(
                    self.name,
                    os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o644,
                )
            except FileExistsError:
                fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                holder = _read_info(fd)
                os.close(fd)
                alive = _alive_here(holder) if holder else False
                if alive is False:  # nobody, or a writer of this host that is gone: take it over
                    os.unlink(self.name)
                    continue
                more = (
                    ""
                    if alive
                    else f"; this file system has no locks: if that process is gone, remove {self.name}"
                )
                raise LockError(f"{self.path!r} is open for writing by {holder}{more}") from None
            self.fd = fd
            self.exclusive_file = True
            self._write_info()
            return
        raise LockError(f"cannot take the writer lock {self.name}: it keeps coming back")

    def _write_info(self) -> None:
        info = (_who() + "\n").encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, info, 0)

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            if self.exclusive_file:
                os.unlink(self.name)
            else:
                os.ftruncate(self.fd, 0)  # nobody holds it (the kernel drops the lock at close)
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.fd = -1
            _HELD_HERE.discard(self.key)


__all__ = ["LOCK_NAME", "WriterLock"]
