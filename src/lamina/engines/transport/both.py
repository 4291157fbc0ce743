"""Engine ``both`` for writers: a producer that writes the native file *and* serves consumers in memory.

Every collective and independent call of the producer goes to a native
engine (the file, with the dataset's compression) and to the transport's
producer (memory, served to the consumer programs); consumers read from
memory, as with engine ``mpi``.  After the run the file holds every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import comm as comm_mod
from ...errors import is_collective
from ...geometry import Box
from ..native import NativeEngine
from .producer import Producer

#: options handed to the native engine as well
NATIVE_OPTIONS = ("aggregators", "durable", "checksum_segment", "background_stats")


class BothProducer(Producer):
    """The producer of engine ``both``: native file plus in situ transport (see the module docstring)."""

    OPTIONS = Producer.OPTIONS | NativeEngine.OPTIONS
    #: the file's record carries the statistics, and consumers get that same record
    DEFER_STATS = False
    FORGETS = False  # the file keeps every step's blocks

    def __init__(self) -> None:
        super().__init__("both")
        self.file: NativeEngine | None = None

    def open(self, path: str, mode: str, comm, options: dict[str, Any]) -> None:
        if mode != "w":
            super().open(path, mode, comm, options)  # refuses the mode
            return
        native = NativeEngine()
        native.open(path, mode, comm, {k: v for k, v in options.items() if k in NATIVE_OPTIONS})
        try:
            super().open(path, mode, comm, options)
        except BaseException:
            native.close()  # the transport's errors are raised on every rank alike
            raise
        self.file = native

    def define(self, spec):
        assert self.file is not None
        self.file.define(spec)
        return super().define(spec)

    def make_group(self, path: str) -> None:
        assert self.file is not None
        self.file.make_group(path)
        super().make_group(path)

    def set_attr(self, path: str, name: str, value) -> None:
        assert self.file is not None
        self.file.set_attr(path, name, value)
        super().set_attr(path, name, value)

    def del_attr(self, path: str, name: str) -> None:
        assert self.file is not None
        self.file.del_attr(path, name)
        super().del_attr(path, name)

    def set_ext(self, key: str, payload: bytes) -> None:
        assert self.file is not None
        self.file.set_ext(key, payload)
        super().set_ext(key, payload)

    def begin_step(self) -> int:
        assert self.file is not None
        self.file.begin_step()
        return super().begin_step()

    def flush(self, durable: bool = True) -> None:
        assert self.file is not None
        self.file.flush(durable)

    # -- reading: from the file, as a writer of engine "native" reads (the blocks in memory are
    # the consumers'); the file commits each step as the transport does
    def check_can_read(self) -> None:
        pass

    def get(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        assert self.file is not None
        self.file.get(name, box, step, out)

    def get_collective(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        assert self.file is not None
        self.file.get_collective(name, box, step, out)

    def get_level(
        self,
        name: str,
        box: Box,
        step: int | None,
        out: np.ndarray,
        level: int = 0,
        cache: dict | None = None,
        tolerance: float | None = None,
    ) -> int:
        assert self.file is not None
        return self.file.get_level(name, box, step, out, level, cache, tolerance)

    @property
    def bytes_read(self) -> int:
        return 0 if self.file is None else self.file.bytes_read

    def put(self, name: str, box: Box, array: np.ndarray, copy: bool = True) -> None:
        assert self.file is not None
        self.file.put(name, box, array, copy)
        super().put(name, box, array, copy)

    def lend(self, name: str, start: tuple[int, ...], array: np.ndarray) -> bool:
        """A small block lent (``write(copy=False)``): to the file and to consumers alike, or
        to neither (then ``put`` writes it to both)."""
        assert self.file is not None
        if not self.file.lend(name, start, array):
            return False
        if not super().lend(name, start, array):  # the file has it: consumers get it all the same
            stop = tuple(a + n for a, n in zip(start, array.shape, strict=True))
            super().put(name, Box(tuple(start), stop), array, copy=False)
        return True

    def put_many(self, name: str, starts: np.ndarray, arrays, copy: bool = True) -> None:
        assert self.file is not None
        self.file.put_many(name, starts, arrays, copy)
        super().put_many(name, starts, arrays, copy)

    def put_stats(self, name: str, box: Box, array: np.ndarray) -> None:
        assert self.file is not None
        self.file.put_stats(name, box, array)
        super().put_stats(name, box, array)

    def put_stats_many(self, name: str, starts: np.ndarray, arrays) -> None:
        assert self.file is not None
        self.file.put_stats_many(name, starts, arrays)
        super().put_stats_many(name, starts, arrays)

    def end_step(self) -> None:
        assert self.file is not None
        try:
            self.file.end_step()  # durable first, then served
        except BaseException:
            # the file dropped the step (on every rank: its commit's errors are collective):
            # consumers are not served it either, and both sides count their steps alike (a
            # step left open here failed every later step and the close)
            if self.in_step:
                super().discard_step()
            raise
        super().end_step()

    def skip_steps(self, n: int) -> None:
        assert self.file is not None
        self.file.skip_steps(n)
        super().skip_steps(n)

    def cut_step(self) -> None:
        if self.file is not None:
            self.file.cut_step()
        super().cut_step()

    def discard_step(self) -> None:
        if self.file is not None:
            self.file.discard_step()
        super().discard_step()

    def abandon(self) -> None:
        if self.file is not None:
            self.file.abandon()
        super().abandon()

    def leave(self, exc: BaseException) -> None:
        # the other ranks wait in the file's collective calls first (end_step commits the file
        # before it serves the step): met there only by the file's leave (the producer's alone
        # left them waiting for ever); where they heard it, they let go of both
        f = self.file
        if f is not None and not f.closed and not self._closed and comm_mod.leave(f.comm, exc):
            if not is_collective(exc):  # (every rank left at once: they close together)
                self.abandon()
            return
        super().leave(exc)

    def close(self) -> None:
        if self._closed:
            if self.file is not None and not self.file.closed:
                self.file.close()  # an interrupt cut the file's close short: the rest of it
            return
        try:
            if self.file is not None:
                self.file.close()
        finally:
            super().close()


__all__ = ["BothProducer"]
