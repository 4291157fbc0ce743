"""The forwarding base of all layers."""

from __future__ import annotations

import numpy as np

from ..catalog import DatasetSpec
from ..engines.base import BlockInfo, Engine
from ..geometry import Box


class Layer(Engine):
    """An engine that forwards every call to :attr:`inner`.

    Subclasses override the calls they change.  Attributes the interface
    does not name (the engine's path, catalog, options, private hooks the
    API uses such as ``check_step``) are forwarded too, so a layer can stand
    wherever its inner engine stood.
    """

    def __init__(self, inner: Engine) -> None:
        self.inner = inner

    def __getattr__(self, attr: str):
        # only called for attributes not found on the layer itself
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def comm(self):  # type: ignore[override]
        return self.inner.comm

    @property
    def mode(self) -> str:  # type: ignore[override]
        return self.inner.mode

    @property
    def path(self) -> str:  # type: ignore[override]
        return self.inner.path

    @property
    def catalog(self):  # type: ignore[override]
        return self.inner.catalog

    def open(self, path: str, mode: str, comm, options: dict) -> None:
        self.inner.open(path, mode, comm, options)

    def define(self, spec: DatasetSpec) -> DatasetSpec:
        return self.inner.define(spec)

    def make_group(self, path: str) -> None:
        self.inner.make_group(path)

    def set_attr(self, path: str, name: str, value) -> None:
        self.inner.set_attr(path, name, value)

    def del_attr(self, path: str, name: str) -> None:
        self.inner.del_attr(path, name)

    def set_ext(self, key: str, payload: bytes) -> None:
        self.inner.set_ext(key, payload)

    def begin_step(self) -> int:
        return self.inner.begin_step()

    def put(self, name: str, box: Box, array: np.ndarray, copy: bool = True) -> None:
        self.inner.put(name, box, array, copy)

    def end_step(self) -> None:
        self.inner.end_step()

    @property
    def in_step(self) -> bool:
        return self.inner.in_step

    @property
    def steps(self) -> int:
        return self.inner.steps

    def get(self, name: str, box: Box, step: int, out: np.ndarray) -> None:
        self.inner.get(name, box, step, out)

    def blocks(self, name: str, step: int) -> list[BlockInfo]:
        return self.inner.blocks(name, step)

    def refresh(self) -> int:
        return self.inner.refresh()

    def wait_steps(self, count: int, seconds: float) -> None:
        self.inner.wait_steps(count, seconds)

    @property
    def writer_closed(self) -> bool:
        return self.inner.writer_closed

    def close(self) -> None:
        self.inner.close()
