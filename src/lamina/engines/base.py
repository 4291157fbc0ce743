"""The engine interface: the seam every way of moving bytes plugs into.

An engine stores and retrieves blocks of N-D datasets, step by step, and
keeps the metadata tree (:class:`~lamina.catalog.Catalog`).  The API layer
(``File``, ``Group``, ``Dataset``), the layers and the query engine talk
only to this interface.  A *layer* (derived quantities, background I/O) is
an engine that wraps an inner engine and forwards what it does not change
(:class:`lamina.layers.base.Layer`), like HDF5 pass-through VOL connectors;
:mod:`.registry` builds the stack of them for ``lamina.open``.

Every method says in its docstring whether it is **collective** (every rank
of the engine's communicator makes the call, in the same order, with the
same arguments where it says so) or **independent** (any rank alone).

This module imports no engine: the built-in ones register themselves in
:mod:`lamina.engines`.
"""

from __future__ import annotations

import functools
import operator
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast, overload

import numpy as np

from ..catalog import BlockCodec, BlockRecord, BlockTable, Catalog, DatasetSpec, Stats
from ..errors import StepError
from ..geometry import Box, as_int


def step_number(step: Any) -> int:
    """*step* (an int or a numpy integer; negative counts from the end) as an int;
    StepError for anything else: a float, a string or a bool is not rounded, parsed or
    taken as 0 and 1 (``int(-0.5)`` would read step 0, not the last)."""
    try:
        return as_int(step)
    except TypeError:
        raise StepError(
            f"a step is an integer (negative counts from the end), not {step!r}"
        ) from None


if TYPE_CHECKING:
    from mpi4py.MPI import Comm


_F = TypeVar("_F", bound=Callable[..., Any])


def under(attr: str) -> Callable[[_F], _F]:
    """A decorator: the method runs inside ``with self.<attr>:`` (a lock, or a gate such
    as :class:`.native.descriptors.InUse` that a close waits on)."""

    def wrap(method: _F) -> _F:
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            with getattr(self, attr):
                return method(self, *args, **kwargs)

        return cast(_F, run)

    return wrap


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """A written block as users and the query code see it."""

    box: Box
    stats: Stats | None
    nbytes: int  # bytes stored (after compression)
    raw_nbytes: int  # bytes of the uncompressed block
    subfile: str
    offset: int
    codec: str
    rank: int

    @classmethod
    def from_row(cls, t: BlockTable, i: int, spec: DatasetSpec) -> BlockInfo:
        """Block *i* of a table."""
        return cls.from_record(t.record(i, spec.id), spec)

    @classmethod
    def from_record(cls, rec: BlockRecord, spec: DatasetSpec) -> BlockInfo:
        if rec.codec == BlockCodec.STATS_ONLY:
            codec = "stats-only"
        elif rec.codec == BlockCodec.RAW:
            codec = "raw"
        elif rec.codec == BlockCodec.MULTIRES:
            codec = "multires"
        else:
            codec = "+".join(c["id"] for c in spec.codecs)
        return cls(
            rec.box,
            rec.stats,
            rec.length,
            rec.box.size * spec.dtype.itemsize,
            rec.subfile,
            rec.offset,
            codec,
            rec.rank,
        )


class BlockInfos(Sequence[BlockInfo]):
    """The blocks of a dataset at one step as a sequence of :class:`BlockInfo`, each built when used.

    ``len()`` costs nothing; a step of many blocks builds an object only
    for the blocks a program looks at.
    """

    __slots__ = ("table", "spec")

    def __init__(self, table: BlockTable, spec: DatasetSpec) -> None:
        self.table = table
        self.spec = spec

    def __len__(self) -> int:
        return len(self.table)

    @overload
    def __getitem__(self, i: int) -> BlockInfo: ...
    @overload
    def __getitem__(self, i: slice) -> list[BlockInfo]: ...
    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self.table)
        k = operator.index(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"block {i} out of range: {n} block(s)")
        return BlockInfo.from_row(self.table, k, self.spec)

    def stored_bytes(self) -> int:
        """Bytes the blocks take in storage (after compression): ``sum(b.nbytes for b in self)``
        without an object per block."""
        return self.table.stored_bytes()

    def raw_bytes(self) -> int:
        """Bytes of the blocks' values uncompressed: ``sum(b.raw_nbytes for b in self)``."""
        return self.table.value_bytes(self.spec.dtype.itemsize)

    def __eq__(self, other) -> bool:
        if isinstance(other, BlockInfos | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"<{len(self)} block(s) of {self.spec.path!r}>"


def storage_of(blocks: Sequence[BlockInfo]) -> tuple[int, int]:
    """(bytes stored, bytes of the values) of *blocks*: from a table's columns where the
    sequence has one (a step of 100,000 blocks makes no object per block)."""
    if isinstance(blocks, BlockInfos):
        return blocks.stored_bytes(), blocks.raw_bytes()
    return sum(b.nbytes for b in blocks), sum(b.raw_nbytes for b in blocks)


def storage_by_step(
    ds, steps: int, released: list[int] | None = None
) -> tuple[list[int], int, int, int]:
    """(steps with blocks, blocks, bytes stored, bytes of the values) of dataset view *ds*
    over its first *steps* steps, step by step from its block index.  With a list
    *released*, the steps the engine no longer holds (an in situ consumer's, released) are
    put there and left out, instead of raising StepError."""
    written, nblocks, stored, raw = [], 0, 0, 0
    for k in range(steps):
        try:
            blocks = ds.blocks(k)
        except StepError:
            if released is None:
                raise
            released.append(k)
            continue
        if blocks:
            written.append(k)
        nblocks += len(blocks)
        s, r = storage_of(blocks)
        stored += s
        raw += r
    return written, nblocks, stored, raw


class Engine(ABC):
    """Abstract engine.  See the module docstring for the calling rules."""

    #: the registry name (an instance may be told another, see lamina.engines.transport)
    name: str = "?"
    #: True for layers: engines that wrap another engine
    is_layer: ClassVar[bool] = False
    #: the options ``open`` takes (the registry gives each level of a stack only its own)
    OPTIONS: ClassVar[frozenset[str]] = frozenset()

    comm: Comm
    mode: str = "r"
    path: str = ""
    catalog: Catalog

    # -- lifetime -----------------------------------------------------------
    def validate_open(self, mode: str, options: dict[str, Any], size: int) -> None:  # noqa: B027
        """Independent, before any message: raise for *mode* or *options* this engine (with the
        layers above it) refuses on *size* ranks.  ``lamina.open`` calls it on every rank and
        agrees on the outcome, so that a rank given other arguments raises with the others
        instead of leaving them waiting in the open's first collective call."""

    @abstractmethod
    def open(self, path: str, mode: str, comm: Comm, options: dict[str, Any]) -> None:
        """Collective: open or create *path* in *mode* ('r', 'w', 'a') over *comm* (duplicated for the engine)."""

    @abstractmethod
    def close(self) -> None:
        """Collective: commit what is pending (writers), then release every resource."""

    @abstractmethod
    def abandon(self) -> None:
        """Independent: release this rank's resources without committing anything.

        For leaving a file after an error that other ranks may not share: a
        collective close could pair with a different collective call on
        them.  Committed steps stay intact; the current step is dropped.
        """

    @abstractmethod
    def leave(self, exc: BaseException) -> None:
        """Independent: let go of the file after *exc*, an error only this rank saw.

        Unlike :meth:`abandon`, tells the other ranks first: they raise a
        ``RemoteError`` (marked ``lamina_left``) at their next collective call
        on this file instead of waiting for this rank there.  Where every rank
        leaves at once (:func:`lamina.comm.leave` marks *exc* collective), it
        lets go of nothing: the ranks close the file together.
        """

    @abstractmethod
    def agree(self, flag: int = 0, call: int = 0) -> int:
        """Collective: the largest *flag* over the ranks; raises if a rank left the file (see
        :meth:`leave`).  *call* (one of :data:`lamina.comm.CALL_NAMES`, 0: none) names the
        collective call this agreement begins: ranks that name different calls raise
        CollectiveMismatchError (see :func:`lamina.comm.agree`)."""

    @property
    @abstractmethod
    def closed(self) -> bool:
        """Independent: True once :meth:`close` or :meth:`abandon` was called."""

    def stack(self) -> list[Engine]:
        """Independent: this engine and, for a layer, the engines under it, outermost first."""
        return [self]

    #: whether other programs follow what this engine writes as it writes it (an in situ
    #: producer): a program that leaves ``with lamina.open(...)`` on an error then abandons
    #: it on every rank, so that they learn the stream failed, not that it ended
    ENDS_STREAMS: ClassVar[bool] = False

    # -- metadata (collective on writers) ---------------------------------
    @abstractmethod
    def define(self, spec: DatasetSpec) -> DatasetSpec:
        """Collective: add a dataset; returns the spec with its id assigned."""

    @abstractmethod
    def make_group(self, path: str) -> None:
        """Collective: add a group (and its parents)."""

    @abstractmethod
    def set_attr(self, path: str, name: str, value: Any) -> None:
        """Collective: set an attribute; every rank must pass the same value."""

    @abstractmethod
    def del_attr(self, path: str, name: str) -> None:
        """Collective: delete an attribute."""

    def attrs_of(self, path: str) -> dict[str, Any]:
        """Independent: the attributes of *path* as this rank sees them (its own changes since
        the last commit included); not to be changed."""
        return self.catalog.attrs.get(path, {})

    def set_ext(self, key: str, payload: bytes) -> None:
        """Collective: record an extension entry (used by layers, e.g. derived definitions)."""
        raise NotImplementedError(f"engine {self.name!r} does not store extension records")

    # -- steps ------------------------------------------------------------
    @abstractmethod
    def begin_step(self) -> int:
        """Collective: start a new step; returns its index."""

    @abstractmethod
    def put(self, name: str, box: Box, array: np.ndarray, copy: bool = True) -> None:
        """Independent: write *array* to *box* of dataset *name* in the current step.

        With ``copy=False`` the engine may keep a reference to *array* until
        :meth:`end_step`; the caller must not modify it before then.  A put
        outside a step opens one on this rank (committed by the next
        ``end_step`` or ``close``, which every rank makes).
        """

    def lend(self, name: str, start: tuple[int, ...], array: np.ndarray) -> bool:
        """Independent: keep *array*, lent with its corner at *start*, if this engine takes it
        as it is; False where the caller must go through :meth:`put` instead.

        The common case of a program that writes many small blocks: ``put(name,
        box, array, copy=False)`` without the box, for an engine that can
        check and keep such a block for less than ``put`` costs.  *start* is
        a tuple; a block taken is kept as ``put`` keeps a lent one.  This
        default takes none, and so does a layer unless it changes no write
        (it then asks its inner engine).
        """
        return False

    def put_many(self, name: str, starts: np.ndarray, arrays, copy: bool = True) -> None:
        """Independent: write many blocks of dataset *name* in the current step.

        *starts*: an ``(n, ndim)`` integer array of the blocks' corners;
        *arrays*: one array of shape ``(n, *block_shape)`` (block ``k`` is
        ``arrays[k]``) or a sequence of ``n`` arrays.  Like ``n`` calls of
        :meth:`put`, except that the built-in engines check every block first
        and store none if one is bad.  This default calls :meth:`put` per block.
        """
        for k in range(len(starts)):
            a = np.asarray(arrays[k])
            self.put(name, Box.from_offset(starts[k], a.shape), a, copy)

    def put_stats(self, name: str, box: Box, array: np.ndarray) -> None:
        """Independent: record the statistics of *array* as a block of *name*, without its data.

        The block (codec :attr:`~lamina.catalog.BlockCodec.STATS_ONLY`) takes
        part in the step like any other: boxes may not overlap, queries prune
        with its statistics; its values are computed by a layer that can (the
        derived layer).
        """
        raise NotImplementedError(f"engine {self.name!r} does not keep statistics-only blocks")

    def put_stats_many(self, name: str, starts: np.ndarray, arrays) -> None:
        """Independent: :meth:`put_stats` for many blocks of dataset *name* in one call.

        *starts* and *arrays* as :meth:`put_many` takes them.  The built-in
        engines check every block first and record none if one is bad, and
        take the statistics of small blocks together.  This default calls
        :meth:`put_stats` per block.
        """
        for k in range(len(starts)):
            a = np.asarray(arrays[k])
            self.put_stats(name, Box.from_offset(starts[k], a.shape), a)

    @abstractmethod
    def end_step(self) -> None:
        """Collective: commit the current step atomically."""

    @abstractmethod
    def discard_step(self) -> None:
        """Independent: drop what this rank put in the current step; nothing committed changes."""

    def cut_step(self) -> None:  # noqa: B027 - a no-op unless overridden
        """Independent: a write call into the current step was cut short above this engine
        (an interrupt, KeyboardInterrupt, escaped it before it returned, wherever it was),
        so that the step may lack what that call was writing: the step must not be
        committed (``end_step`` raises on every rank, ``close`` drops it on every rank).
        Where no step is open, the step the next write opens (that call's) is meant;
        ``begin_step`` starts a new one, which it does not touch.  Engines that keep no
        steps ignore it."""

    def skip_steps(self, n: int) -> None:  # noqa: B027 - a no-op unless overridden
        """Independent: *n* steps this rank began and discarded in a layer above this engine,
        which never handed them down: counted as the engine counts the steps it opens, so
        that the step counts the ranks compare at each commit stay true (a step discarded on
        one rank alone puts the ranks a step apart).  Engines that count none ignore it."""

    @property
    @abstractmethod
    def in_step(self) -> bool:
        """Independent: True between begin_step (or an implicit step's first put) and end_step."""

    # -- reading ----------------------------------------------------------
    @property
    def steps(self) -> int:
        """Independent: number of committed steps this rank knows of (see :meth:`refresh`)."""
        return len(self.catalog.steps)

    @abstractmethod
    def check_step(self, step: int | None) -> int:
        """Independent: the committed step *step* means (None: the last; negative: from the end); StepError if none."""

    @abstractmethod
    def check_read(
        self, name: str, box: Box, step: int | None, out: np.ndarray
    ) -> tuple[DatasetSpec, int]:
        """Independent: ``(spec, step)`` of a read of *box* of *name* into *out*, after checking all four."""

    def check_can_read(self) -> None:  # noqa: B027 - a no-op unless overridden
        """Independent: raise :class:`~lamina.errors.ModeError` if this engine cannot read
        back the values of its steps (a producer of the memory transport: its blocks are
        served to its consumers).  A query asks before it looks at any statistics, so that
        whether it raises never depends on the values."""

    @abstractmethod
    def get(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        """Independent: read *box* of dataset *name* at *step* into *out* (shape of box, dtype of the dataset)."""

    def get_collective(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        """Collective: as :meth:`get`, every rank with its own *box*; an engine may read the
        blocks several ranks need once and share them (the block engines do).  By default
        each rank reads its own."""
        self.get(name, box, step, out)

    def take_read_ahead(self, name: str, box: Box, step: int | None) -> np.ndarray | None:
        """Independent: *box* of *name* at *step* if it was read ahead, handed over without a
        copy (the caller owns it); None otherwise (then :meth:`get` reads it).  Only the
        background layer reads ahead (``iter_steps(prefetch=True)``)."""
        return None

    def reading_ahead(self) -> AbstractContextManager[None]:
        """Independent: the reads made inside are made ahead of the program (the background
        layer's read-ahead thread): they leave the steps the program may read as they were.
        An engine that lets a reader's earlier steps go when it asks for a later one (the in
        situ transport's consumer) keeps them here; the others read as usual."""
        return nullcontext()

    @abstractmethod
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
        """Independent: read *box* (level-*level* coordinates) of a multiresolution dataset into *out*.

        Level 0 of a plain dataset is :meth:`get`.  *cache* (a dict kept
        by the caller across reads) spares reading a stored band twice.
        *tolerance* (None: the one written) looser than the one written
        lets the read leave out bands whose coefficients are small enough.
        Returns the stored bytes read.
        """

    def blocks(self, name: str, step: int) -> Sequence[BlockInfo]:
        """Independent: the blocks of *name* written in committed *step* (each built when used)."""
        spec = self.catalog.datasets[name]
        return BlockInfos(self.catalog.table_of(spec, step), spec)

    def block_table(self, name: str, step: int, stats: bool = True, level: int = 0) -> BlockTable:
        """Independent: the blocks of *name* in committed *step* as columns (for queries and tools).

        With *stats* False the caller uses boxes and locations only: an
        engine whose statistics arrive after the step (the memory
        transport's consumer) need not wait for them.  *level* > 0: the
        bands of that level of a multiresolution dataset (boxes in its
        coordinates, statistics of the values there).
        """
        # (a reader's derived quantity has id -1: no blocks)
        spec = self.catalog.level(name, level)
        return self.catalog.table_of(spec, step)

    def coverage(self, path: str, step: int | None) -> list[Box]:
        """Independent: the boxes of *path* that hold values at *step*; the rest reads as the fill value."""
        t = self.block_table(path, self.check_step(step), stats=False)
        return [t.box(i) for i in range(len(t))]

    @property
    def bytes_read(self) -> int:
        """Independent: stored bytes of data this stack has read (counted by the block engines; 0 here)."""
        return 0

    @abstractmethod
    def refresh(self) -> int:
        """Collective: pick up steps committed since open; returns the step count."""

    def flush(self, durable: bool = True) -> None:  # noqa: B027 - a no-op unless overridden
        """Collective: every step committed so far on stable storage where *durable* (a file's
        bytes fsynced).  Engines that keep nothing on storage have nothing to do."""

    @property
    def writer_closed(self) -> bool:
        """Independent: True when the last writer of this file has closed it (no more steps coming)."""
        return self.catalog.closed

    @property
    def format_version(self) -> int | None:
        """Independent: the on-disk format version of the file (docs/format.md: a reader's, the
        file's; a writer's, the version it writes, an appending one the file's); None for
        engines that keep no file of that format."""
        return None

    @property
    def records_left_out(self) -> int:
        """Independent: committed records a reader left out as it last read the file (one cut
        short: a copy taken while it was written, a subfile truncated; docs/format.md), the
        steps before them open; 0 where it read every one."""
        return 0

    def wait_steps(self, count: int, seconds: float) -> None:
        """Independent: wait up to *seconds* for the writer to reach *count* steps or close.

        A hint for :meth:`lamina.File.wait_for_step`, which calls
        :meth:`refresh` afterwards: engines that are told of new steps
        return as soon as news arrives; files are polled, so the default
        sleeps.
        """
        time.sleep(seconds)

    # -- derived quantities (implemented by the derived layer) -------------
    def derive(
        self,
        name: str,
        expression: str,
        strategy: str = "stats",
        *,
        spacing: Any = None,
        hints: dict | None = None,
    ) -> Any:
        """Collective: declare a derived quantity (see :class:`lamina.layers.DerivedLayer`)."""
        raise NotImplementedError(
            f"derived quantities need the 'derived' layer; engine {self.name!r} was opened without it"
        )

    def definitions(self) -> dict[str, Any]:
        """Independent: the derived quantities known here, by name (none without the derived layer)."""
        return {}

    def definition(self, path: str) -> Any:
        """Independent: the definition of derived quantity or component *path*, None for a plain dataset."""
        return None

    def unusable(self) -> dict[str, str]:
        """Independent: the derived quantities the file records that this lamina cannot
        evaluate (a newer definition version, an unknown function, a damaged record), by
        name: why.  Reading one raises FormatError where the file stores no values of it."""
        return {}

    def note_query(
        self, elements: int, per_unit: float, seconds: float, judged: Sequence[str] = ()
    ) -> None:
        """Independent: a query spent *seconds* besides its reads judging *elements* elements in
        units of *per_unit* elements each, its condition over the datasets *judged*; the layer
        that keeps the measured history of derived quantities records it (here: nothing)."""
        return None


def flag_option(value: object, name: str, call: str = "lamina.open()") -> bool:
    """*value* of option *name* (of *call*) as a bool: a bool or numpy's; anything else is a
    TypeError naming it (``"no"`` or ``0`` is not taken for what Python's truth says of it)."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{call}: {name} must be a bool (True or False), got {value!r}")
    return bool(value)


def durable_flag(value: object, call: str) -> bool:
    """*value* of ``durable=`` (of *call*: ``flush()``, ``lamina.open()``) as a bool
    (:func:`flag_option`)."""
    return flag_option(value, "durable", call)


def unusable_of(unusable: Mapping[str, str], path: str) -> tuple[str, str] | None:
    """``(name, why)`` of the derived quantity among *unusable* (:meth:`Engine.unusable`)
    that dataset or group *path* is, or is a component of; None where it is none."""
    p = path.strip("/")
    for name, why in unusable.items():
        if p == name or p.startswith(name + "/"):
            return name, why
    return None


__all__ = ["BlockInfo", "BlockInfos", "Engine", "durable_flag", "unusable_of"]
