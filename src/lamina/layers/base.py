"""The forwarding base of all layers."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ..catalog import BlockTable, Catalog, DatasetSpec
from ..engines.base import BlockInfo, Engine
from ..geometry import Box

if TYPE_CHECKING:
    from mpi4py.MPI import Comm


def _read_only(what: str) -> NoReturn:
    raise AttributeError(f"a layer's {what} is its inner engine's; set it there")


class Layer(Engine):
    """An engine that forwards every call of the interface to :attr:`inner`.

    Each method is forwarded explicitly (as zarr's ``WrapperStore`` does):
    what the interface does not declare is not reachable through a layer,
    so the interface stays the whole contract.  Subclasses override the
    calls they change; :meth:`open` hands the layer the options it declares
    (:attr:`OPTIONS`, via :meth:`configure`) and passes the rest inward.
    """

    is_layer = True
    #: a layer streams nothing itself: whether the engine under it does, stack() tells
    ENDS_STREAMS = False

    def __init__(self, inner: Engine) -> None:
        self.inner = inner

    # -- identity (the inner engine's) --------------------------------------
    @property
    def name(self) -> str:
        return self.inner.name

    @name.setter
    def name(self, value: str) -> None:
        _read_only("name")

    @property
    def comm(self) -> Comm:
        return self.inner.comm

    @comm.setter
    def comm(self, value: Comm) -> None:
        _read_only("communicator")

    @property
    def mode(self) -> str:
        return self.inner.mode

    @mode.setter
    def mode(self, value: str) -> None:
        _read_only("mode")

    @property
    def path(self) -> str:
        return self.inner.path

    @path.setter
    def path(self, value: str) -> None:
        _read_only("path")

    @property
    def catalog(self) -> Catalog:
        return self.inner.catalog

    @catalog.setter
    def catalog(self, value: Catalog) -> None:
        _read_only("catalog")

    def stack(self) -> list[Engine]:
        return [self, *self.inner.stack()]

    # -- lifetime -------------------------------------------------------------
    def open(self, path: str, mode: str, comm: Comm, options: dict[str, Any]) -> None:
        own = {k: v for k, v in options.items() if k in self.OPTIONS}
        self.configure(own)  # before any message: a refused option fails on every rank alike
        self.inner.open(
            path, mode, comm, {k: v for k, v in options.items() if k not in self.OPTIONS}
        )
        self.opened()

    def validate_open(self, mode: str, options: dict[str, Any], size: int) -> None:
        self.configure({k: v for k, v in options.items() if k in self.OPTIONS})
        self.inner.validate_open(
            mode, {k: v for k, v in options.items() if k not in self.OPTIONS}, size
        )

    def configure(self, options: dict[str, Any]) -> None:
        """Independent, before the inner engine opens: take this layer's own *options* (check them)."""

    def opened(self) -> None:
        """Collective, after the inner engine opened: set up what needs the open file."""

    def close(self) -> None:
        self.inner.close()

    def abandon(self) -> None:
        self.inner.abandon()

    def leave(self, exc: BaseException) -> None:
        self.inner.leave(exc)

    def agree(self, flag: int = 0, call: int = 0) -> int:
        return self.inner.agree(flag, call)

    @property
    def closed(self) -> bool:
        return self.inner.closed

    # -- metadata -------------------------------------------------------------
    def define(self, spec: DatasetSpec) -> DatasetSpec:
        return self.inner.define(spec)

    def make_group(self, path: str) -> None:
        self.inner.make_group(path)

    def set_attr(self, path: str, name: str, value: Any) -> None:
        self.inner.set_attr(path, name, value)

    def del_attr(self, path: str, name: str) -> None:
        self.inner.del_attr(path, name)

    def attrs_of(self, path: str) -> dict[str, Any]:
        return self.inner.attrs_of(path)

    def set_ext(self, key: str, payload: bytes) -> None:
        self.inner.set_ext(key, payload)

    # -- steps ----------------------------------------------------------------
    def begin_step(self) -> int:
        return self.inner.begin_step()

    def put(self, name: str, box: Box, array: np.ndarray, copy: bool = True) -> None:
        self.inner.put(name, box, array, copy)

    def lend(self, name: str, start: tuple[int, ...], array: np.ndarray) -> bool:
        # not forwarded: no block goes past a layer's own put unless the layer says so (one
        # that changes no write asks its inner engine)
        return False

    def put_many(self, name: str, starts: np.ndarray, arrays, copy: bool = True) -> None:
        self.inner.put_many(name, starts, arrays, copy)

    def put_stats(self, name: str, box: Box, array: np.ndarray) -> None:
        self.inner.put_stats(name, box, array)

    def put_stats_many(self, name: str, starts: np.ndarray, arrays) -> None:
        self.inner.put_stats_many(name, starts, arrays)

    def end_step(self) -> None:
        self.inner.end_step()

    def discard_step(self) -> None:
        self.inner.discard_step()

    def skip_steps(self, n: int) -> None:
        self.inner.skip_steps(n)

    def cut_step(self) -> None:
        self.inner.cut_step()

    @property
    def in_step(self) -> bool:
        return self.inner.in_step

    # -- reading --------------------------------------------------------------
    @property
    def steps(self) -> int:
        return self.inner.steps

    def check_step(self, step: int | None) -> int:
        return self.inner.check_step(step)

    def check_read(
        self, name: str, box: Box, step: int | None, out: np.ndarray
    ) -> tuple[DatasetSpec, int]:
        return self.inner.check_read(name, box, step, out)

    def check_can_read(self) -> None:
        self.inner.check_can_read()

    def get(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        self.inner.get(name, box, step, out)

    def get_collective(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        self.inner.get_collective(name, box, step, out)

    def take_read_ahead(self, name: str, box: Box, step: int | None) -> np.ndarray | None:
        return self.inner.take_read_ahead(name, box, step)

    def reading_ahead(self) -> AbstractContextManager[None]:
        return self.inner.reading_ahead()

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
        return self.inner.get_level(name, box, step, out, level, cache, tolerance)

    def blocks(self, name: str, step: int) -> Sequence[BlockInfo]:
        return self.inner.blocks(name, step)

    def block_table(self, name: str, step: int, stats: bool = True, level: int = 0) -> BlockTable:
        return self.inner.block_table(name, step, stats, level)

    def coverage(self, path: str, step: int | None) -> list[Box]:
        return self.inner.coverage(path, step)

    @property
    def bytes_read(self) -> int:
        return self.inner.bytes_read

    def refresh(self) -> int:
        return self.inner.refresh()

    def flush(self, durable: bool = True) -> None:
        self.inner.flush(durable)

    @property
    def writer_closed(self) -> bool:
        return self.inner.writer_closed

    @property
    def format_version(self) -> int | None:
        return self.inner.format_version

    @property
    def records_left_out(self) -> int:
        return self.inner.records_left_out

    def wait_steps(self, count: int, seconds: float) -> None:
        self.inner.wait_steps(count, seconds)

    # -- derived quantities ---------------------------------------------------
    def derive(
        self,
        name: str,
        expression: str,
        strategy: str = "stats",
        *,
        spacing: Any = None,
        hints: dict | None = None,
    ) -> Any:
        return self.inner.derive(name, expression, strategy, spacing=spacing, hints=hints)

    def definitions(self) -> dict[str, Any]:
        return self.inner.definitions()

    def definition(self, path: str) -> Any:
        return self.inner.definition(path)

    def unusable(self) -> dict[str, str]:
        return self.inner.unusable()

    def note_query(
        self, elements: int, per_unit: float, seconds: float, judged: Sequence[str] = ()
    ) -> None:
        self.inner.note_query(elements, per_unit, seconds, judged)


__all__ = ["Layer"]
