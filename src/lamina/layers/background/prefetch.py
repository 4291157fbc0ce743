"""Read-ahead for a reader that streams steps: ``f.iter_steps(prefetch=True)`` under ``io='async'``,
or that names what it reads next: ``ds.prefetch(box, step)``.

A program that streams a file step by step usually reads the same
selections at every step.  The :class:`Prefetcher` records the reads made
at each step; when ``iter_steps`` hands out step *k*, it reads, on a thread
of its own, what the program read at the step before, at steps *k* and
*k + 1* (those already committed); and a selection read at step *k* for
the first time is read ahead at step *k + 1* at once, so the step after
the first one is ready too while the program computes on the first.  A read that finds its block fetched
(or being fetched) takes it from there; any other read goes to the engine
as usual, so a change of selections costs nothing but the unused
read-ahead.  Everything fetched is bounded by the layer's
``max_inflight_bytes`` and dropped once the stream has moved past its step.

Reads only: the thread makes no collective call, and it calls the engine
under the layer's lock, as the program's reads do, inside
:meth:`~lamina.engines.base.Engine.reading_ahead`: an engine that lets a
reader's earlier steps go when it asks for a later one (the in situ
transport's consumer) keeps the step the program is reading while the next
one is read ahead.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import numpy as np

from ...catalog import normpath
from ...engines.base import Engine
from ...geometry import Box


class _Fetch:
    """One selection of one step: read ahead, or being read."""

    __slots__ = ("done", "array", "error", "nbytes")

    def __init__(self, nbytes: int) -> None:
        self.done = threading.Event()
        self.array: np.ndarray | None = None
        self.error: BaseException | None = None
        self.nbytes = nbytes


#: seconds without a read of the program's before the thread reads ahead
QUIET = 3e-4


class _Reading:
    __slots__ = ("p",)

    def __init__(self, p: Prefetcher) -> None:
        self.p = p

    def __enter__(self) -> None:
        with self.p.cond:
            self.p.reading += 1

    def __exit__(self, *exc) -> None:
        with self.p.cond:
            self.p.reading -= 1
            self.p.last_read = time.monotonic()
            self.p.cond.notify_all()


class Prefetcher:
    """Reads ahead of a streaming reader (see the module docstring)."""

    def __init__(self, inner: Engine, lock: Any, budget: int, stats: Any) -> None:
        self.inner = inner
        self.lock = lock
        self.budget = budget
        self.stats = stats
        self.stream: int | None = None  # the step iter_steps handed out last
        self.asked = False  # the program asked for read-ahead itself (ds.prefetch)
        self.pattern: dict[int, list[tuple[str, Box]]] = {}  # step -> selections read at it
        self.cache: dict[tuple[int, str, Box], _Fetch] = {}
        self.held = 0  # bytes of the fetches in the cache
        self.jobs: collections.deque[tuple[tuple[int, str, Box], _Fetch]] = collections.deque()
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.stopping = False
        # the program's reads: how many are under way, and when the last one ended (the
        # thread reads ahead between them, not beside them: both take the layer's lock)
        self.reading = 0
        self.last_read = 0.0
        self.waiting = 0  # the program waits for a fetch: the thread goes on meanwhile

    # -- the program's side -----------------------------------------------------
    def streaming(self, k: int) -> None:
        """Independent: ``iter_steps`` hands out step *k*: read ahead *k* and *k + 1* like *k - 1*."""
        self.stream = k
        with self.cond:
            for key in [key for key in self.cache if key[0] < k]:
                self._drop(key)
            for j in [j for j in self.pattern if j < k - 1]:
                del self.pattern[j]
        like = self.pattern.get(k - 1)
        if not like:
            return
        known = self.inner.steps
        for step in (k, k + 1):
            if step < known:
                for name, box in like:
                    self._schedule((step, name, box))

    def stream_ended(self) -> None:
        """Independent: ``iter_steps`` ended: nothing more is read ahead for the stream, and
        what was read ahead of steps it did not hand out goes (a loop left by ``break`` kept
        them, and what it read at its step was read ahead of the next, until the close)."""
        last, self.stream = self.stream, None
        if last is None:
            return
        with self.cond:
            for key in [key for key in self.cache if key[0] > last]:
                self._drop(key)
            self.pattern.clear()

    def request(self, name: str, box: Box, step: int) -> bool:
        """Independent: read (*step*, *name*, *box*) ahead now (``ds.prefetch``); whether it is
        fetched or being fetched (False: over the budget with what is fetched already, an
        empty box, or not a dataset of this file).  Fetches of steps before *step* - 1 that
        were never read go first: a program that reads step k and asks for step k + 1 has
        moved past them, and boxes it asked for and did not read do not keep the budget
        from later ones."""
        key = (step, name, box)
        self.asked = True
        with self.cond:
            for old in [k for k in self.cache if k[0] < step - 1]:
                self._drop(old)
        self._schedule(key)
        with self.cond:
            return key in self.cache

    @property
    def serving(self) -> bool:
        """Whether reads should look here (and count a hit or a miss): a stream is read
        ahead, or the program asked for fetches (each read after its first request counts:
        a read that came once the cache was empty was no miss, and hits and misses did not
        add up to the reads)."""
        return self.stream is not None or self.asked or bool(self.cache)

    def get(self, name: str, box: Box, step: int, out: np.ndarray) -> bool:
        """Independent: fill *out* from a fetch of (*step*, *name*, *box*) if there is one; True if so."""
        arr = self._fetched(name, box, step)
        if arr is None or arr.shape != out.shape or arr.dtype != out.dtype:
            self.stats.prefetch_misses += 1
            return False
        out[...] = arr
        self.stats.prefetch_hits += 1
        return True

    def take(self, name: str, box: Box, step: int) -> np.ndarray | None:
        """Independent: the fetch of (*step*, *name*, *box*), handed over without a copy; None if
        there is none (the read then goes through :meth:`get`, which counts the miss)."""
        arr = self._fetched(name, box, step)
        if arr is not None:
            self.stats.prefetch_hits += 1
        return arr

    def reads(self) -> _Reading:
        """Context of a read of the program's: the thread waits until it is over (and the
        program has not read for :data:`QUIET` seconds) before it reads ahead again."""
        return _Reading(self)

    def _fetched(self, name: str, box: Box, step: int) -> np.ndarray | None:
        """Note the read in the pattern; the array fetched for it (dropped from the cache), or
        None if there is none or it failed (the program's own read then raises the error)."""
        if self.stream is not None and step >= self.stream - 1:
            seen = self.pattern.setdefault(step, [])
            if (name, box) not in seen and len(seen) < 256:
                seen.append((name, box))
                if step == self.stream and step + 1 < self.inner.steps:
                    self._schedule((step + 1, name, box))  # the next step, while this one computes
        key = (step, name, box)
        with self.cond:
            fetch = self.cache.get(key)
        if fetch is None:
            return None
        if not fetch.done.is_set():
            with self.cond:
                self.waiting += 1
                self.cond.notify_all()
            try:
                fetch.done.wait()
            finally:
                with self.cond:
                    self.waiting -= 1
        with self.cond:
            mine = self.cache.get(key) is fetch
            if mine:
                self._drop(key)
        # the array goes to one read alone (take hands it over, no copy): another thread that
        # waited on the same fetch reads for itself (two threads were given one array)
        return fetch.array if mine else None

    def close(self) -> None:
        with self.cond:
            self.stopping = True
            # a read waiting for a fetch that will not be made now reads for itself (it waited
            # for ever: the close emptied the queue, and no fetch of it was marked done)
            for _, fetch in self.jobs:
                fetch.done.set()
            for fetch in self.cache.values():
                fetch.done.set()
            self.jobs.clear()
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        with self.cond:
            for key in list(self.cache):
                self._drop(key)

    # -- the thread's side --------------------------------------------------------
    def _nbytes(self, name: str, box: Box) -> int:
        """Bytes of *box* of dataset *name* (0: no such dataset)."""
        try:
            spec = self.inner.catalog.datasets.get(normpath(name))
        except ValueError:
            spec = None
        return box.size * spec.dtype.itemsize if spec is not None else 0

    def _schedule(self, key: tuple[int, str, Box]) -> None:
        step, name, box = key
        nbytes = self._nbytes(name, box)
        with self.cond:
            if self.stopping or key in self.cache or not nbytes:
                return
            if self.held + nbytes > self.budget:
                return  # over the budget: this one is read when asked for
            fetch = _Fetch(nbytes)
            self.cache[key] = fetch
            self.held += nbytes
            self.jobs.append((key, fetch))
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._work, name="lamina-prefetch", daemon=True
                )
                self.thread.start()
            self.cond.notify_all()

    def _drop(self, key: tuple[int, str, Box]) -> None:
        """Forget a fetch (under ``cond``)."""
        fetch = self.cache.pop(key)
        self.held -= fetch.nbytes

    def _work(self) -> None:
        while True:
            with self.cond:
                while not self.jobs and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
                # the program reads a step's selections one after the other: read ahead once
                # it has done so (its compute phase), not between two of its reads
                while (
                    not self.stopping
                    and not self.waiting
                    and (self.reading or time.monotonic() - self.last_read < QUIET)
                ):
                    self.cond.wait(QUIET)
                if self.stopping:
                    return
                key, fetch = self.jobs.popleft()
                if self.cache.get(key) is not fetch:  # dropped: the stream has moved past it
                    fetch.done.set()
                    continue
            step, name, box = key
            try:
                spec = self.inner.catalog.datasets[normpath(name)]
                arr = np.empty(box.shape, dtype=spec.dtype)
                with self.lock, self.inner.reading_ahead():
                    self.inner.get(name, box, step, arr)
                fetch.array = arr
                self.stats.prefetched_bytes += arr.nbytes
            except BaseException as e:  # the program's own read raises it
                fetch.error = e
            finally:
                fetch.done.set()


__all__ = ["Prefetcher"]
