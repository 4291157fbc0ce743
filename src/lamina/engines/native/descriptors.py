"""The subfiles a reader holds open: the most recently read, as many as the process can spare.

A file has a subfile per aggregator per writer session: a 1,024-rank job, or 64 ranks
restarted 16 times, leaves 1,024 of them, the common descriptor limit (``ulimit -n``).
A reader therefore keeps at most :func:`subfiles_kept` of them open, the least recently
used closed first.  Reads from several threads share them: a read holds the subfile it
reads from (:meth:`Subfiles.hold`) until it is done, and one evicted meanwhile by other
reads is closed when its last read lets it go, never under a read (its descriptor number
could otherwise be reused by another open and the read take another file's bytes).  The
count of reads holding a subfile is kept under one lock, taken twice per read (a lookup
and a release: well under a microsecond each, against a pread of at least a few).
"""

from __future__ import annotations

import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable

#: subfiles a reader keeps open at most (the least recently read closed first) ...
SUBFILES_KEPT = 256
#: ... and at most this part of the process's descriptor limit (the soft ``ulimit -n``),
#: whose rest is left to the program's other files, but never fewer than two
LIMIT_SHARE = 4


def subfiles_kept() -> int:
    """How many subfiles a reader opened now keeps open at most."""
    most = SUBFILES_KEPT
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):  # (no limit to know)
        return most
    if soft != resource.RLIM_INFINITY and soft > 0:
        most = min(most, max(2, soft // LIMIT_SHARE))
    return most


class Held:
    """A subfile open for reading: its descriptor, the reads that hold it, and whether the
    reader still keeps it (once evicted, the last read to let it go closes it).  ``with``
    gives the descriptor and lets the subfile go at the end of the block."""

    __slots__ = ("fd", "users", "kept", "_owner")

    def __init__(self, fd: int, owner: Subfiles) -> None:
        self.fd = fd
        self.users = 0
        self.kept = True
        self._owner = owner

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *exc) -> None:
        self._owner.release(self)


class Subfiles:
    """The subfiles one reader keeps open, by name, at most *most* of them (see the module)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._open: OrderedDict[str, Held] = OrderedDict()  # the least recently held first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    def names(self) -> list[str]:
        """The subfiles kept open now, the least recently read first."""
        with self._lock:
            return list(self._open)

    def hold(self, name: str, opener: Callable[[], int]) -> Held:
        """Subfile *name*, held for a read until :meth:`release` (or the end of a ``with``):
        the descriptor kept, or one *opener* makes.  Threads opening one subfile at once
        each open it; the first kept is every thread's, the others are closed."""
        with self._lock:
            held = self._open.get(name)
            if held is not None:
                held.users += 1
                self._open.move_to_end(name)
                return held
        fd = opener()  # (outside the lock: an open on a parallel file system takes a while)
        with self._lock:
            held = self._open.get(name)
            if held is None:
                held = self._open[name] = Held(fd, self)
                fd = -1
                drop = self._trim()
            else:
                self._open.move_to_end(name)
                drop = []
            held.users += 1
        if fd >= 0:
            drop.append(fd)
        _close_all(drop)
        return held

    def release(self, held: Held) -> None:
        """A read done with *held*: closed if the reader no longer keeps it and no other
        read holds it."""
        with self._lock:
            held.users -= 1
            if held.users or held.kept:
                return
        os.close(held.fd)

    def close_idle(self) -> int:
        """Close every subfile kept that no read holds (the process ran out of descriptors);
        how many were."""
        with self._lock:
            idle = [name for name, held in self._open.items() if not held.users]
            drop = [self._drop(name) for name in idle]
        _close_all(drop)
        return len(drop)

    def close(self) -> None:
        """Close every subfile (the file is closed); one a read holds, when it lets it go."""
        with self._lock:
            names = list(self._open)
            drop = [fd for fd in map(self._drop, names) if fd >= 0]
        _close_all(drop)

    def _drop(self, name: str) -> int:
        """(Under the lock.) *name* no longer kept: its descriptor, to close, if no read
        holds it (else -1: its last read closes it)."""
        held = self._open.pop(name)
        held.kept = False
        return -1 if held.users else held.fd

    def _trim(self) -> list[int]:
        """(Under the lock.) The least recently held subfiles beyond :attr:`most` no longer
        kept: the descriptors of those no read holds, to close."""
        drop = []
        while len(self._open) > self.most:
            fd = self._drop(next(iter(self._open)))
            if fd >= 0:
                drop.append(fd)
        return drop


class InUse:
    """The reads of one file under way, in any thread: ``with`` around a read that uses the
    file's descriptors.  :meth:`close` (the file closed, in another thread) waits for the
    reads under way, then refuses new ones with the ValueError a read of a closed file
    raises: a descriptor is never closed under a read (EBADF, or another file's bytes once
    its number is reused).  h5py's global lock orders a close and the reads alike.  A lock
    taken twice a read, as :class:`Subfiles` takes its own."""

    __slots__ = ("_closed", "_idle", "_lock", "_n", "_path")

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Event()  # set by the last read under way once closed
        self._closed = False
        self._n = 0
        self._path = path

    def __enter__(self) -> None:
        with self._lock:
            if self._closed:
                raise ValueError(f"cannot read: file {self._path!r} is closed")
            self._n += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._n -= 1
            if self._closed and not self._n:
                self._idle.set()

    def close(self) -> None:
        """Refuse new reads, and wait for those under way (a close is never made inside a
        read of the same file: the read has ended, by an error, before a close it leads to)."""
        with self._lock:
            self._closed = True
            if not self._n:
                return
        self._idle.wait()


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
