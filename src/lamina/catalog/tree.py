"""The catalog: the metadata tree of a file and the blocks of every step."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from typing import NamedTuple

from ..errors import FormatError
from ..geometry import Box
from .blocks import BlockTable, ReleasedStep, StepBlocks
from .model import (
    KIND_CLOSE,
    KIND_STEP,
    LAYOUT_LEVEL,
    LAYOUT_MULTIRES,
    OP_ATTR,
    OP_DATASET,
    OP_DELATTR,
    OP_EXT,
    OP_GROUP,
    BlockRecord,
    DatasetSpec,
    parent,
)
from .record import Record

#: a catalog keeps the decoded block tables of at most this many steps, the ones read last
#: (the tables of older ones are read again from the file when next used: a reader streaming
#: through a long run kept about 4.7 KB for every step it had read, and never let it go)
KEEP_STEPS = 32

#: an undo entry's old value where the key was not there (a restore takes the key out)
_NEW = object()


class Checkpoint(NamedTuple):
    """What :meth:`Catalog.restore` goes back to besides the changes logged since: the
    lengths of the lists that only grow, and the counts (no copy of the catalog)."""

    serial: int
    nspecs: int
    nlayered: int
    nsteps: int
    ntimes: int
    closed: bool
    last_session: int
    nrecords: int


_gc_lock = threading.Lock()
_gc_pauses = 0  # calls inside paused_gc now, in any thread
_gc_was_on = False  # whether the collector ran when the first of them began


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off while the block inside runs (then as before).

    Decoding a file's records makes a dozen objects a record, none of them in a cycle, and
    the collector, run again and again as they are made, looks at every object the program
    holds each time it reaches the oldest generation: opening a file of 100,000 steps took
    3.0 s with it, 1.5 s without.  The cycles the block makes are collected after it, as
    usual.  Nested and concurrent pauses (threads) count: the last to end turns it back on,
    unless it was off when the first began."""
    global _gc_pauses, _gc_was_on
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_on = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_on:
                gc.enable()


class Catalog:
    """Groups, datasets, attributes and per-step block records of one file.

    Built by applying :class:`Record` objects in commit order; writers apply
    their own records the same way, so readers and writers share one model.
    """

    def __init__(self) -> None:
        self.groups: set[str] = {""}
        self.datasets: dict[str, DatasetSpec] = {}
        #: the coarser levels of multiresolution datasets: path -> {level: internal definition}
        self.levels: dict[str, dict[int, DatasetSpec]] = {}
        self.specs: list[DatasetSpec] = []
        #: the datasets with a layout (multiresolution), in the order defined: what a commit
        #: encodes levels of (a scan of every definition cost a commit O(datasets))
        self.layered: list[DatasetSpec] = []
        self.attrs: dict[str, dict[str, object]] = {"": {}}
        self.ext: dict[str, bytes] = {}
        self.steps: list[StepBlocks] = []
        self.step_times: list[float] = []
        self.closed = False
        self.last_session = -1
        self.nrecords = 0
        # the step a reader asked tables of last, and whether its one-block sections were
        # decoded together (then the next step's are, from its first table)
        self._reading: StepBlocks | None = None
        self._together = False
        # the steps whose decoded tables are kept, least recently read first (KEEP_STEPS);
        # an OrderedDict: its oldest step is taken with one call, never by iterating it
        self._kept: OrderedDict[int, StepBlocks] = OrderedDict()
        # children(): every path's child names, rebuilt when paths were added or restored
        # (paths are only ever added, except by restore and paths_changed, which count), and
        # the sorted lists made of them so far; one tuple (key, names, sorted lists), made
        # whole and stored with one assignment: threads reading the file share it
        self._restores = 0
        self._kids: tuple[tuple[int, int, int], dict[str, set[str]], dict[str, list[str]]] = (
            (-1, 0, 0),
            {},
            {},
        )
        # the changes since the live checkpoint, undone in reverse by restore: (container,
        # key, old value or _NEW); None: no checkpoint is live, nothing is logged
        self._undo: list[tuple] | None = None
        self._serial = 0  # the live checkpoint's number (an older one restores nothing)

    # -- queries --------------------------------------------------------
    def kind_of(self, path: str) -> str | None:
        if path in self.datasets:
            return "dataset"
        if path in self.groups:
            return "group"
        return None

    def _index(self) -> tuple[tuple[int, int, int], dict[str, set[str]], dict[str, list[str]]]:
        """Every path's child names (built again when paths were added or taken away)."""
        key = (self._restores, len(self.groups), len(self.datasets))
        index = self._kids
        if index[0] != key:
            kids: dict[str, set[str]] = {}
            for p in (*self.groups, *self.datasets):
                # p under its parent, and each parent not seen yet under its own: every
                # prefix of every path made once, not once per path below it (a chain of
                # 1,500 groups made 1.1 million prefixes of up to 3,000 characters: 8 s)
                while p:
                    up, _, name = p.rpartition("/")
                    seen = kids.get(up)
                    if seen is not None:
                        seen.add(name)
                        break
                    kids[up] = {name}
                    p = up
            index = self._kids = (key, kids, {})
        return index

    def children(self, path: str) -> list[str]:
        """The names below *path* (groups and datasets), sorted; a walk of n paths costs O(n).
        Sorted once until paths change (the list returned is the caller's)."""
        _, kids, done = self._index()
        names = done.get(path)
        if names is None:
            names = done[path] = sorted(kids.get(path, ()))
        return list(names)

    def nchildren(self, path: str) -> int:
        """How many names are below *path*: ``len(children(path))`` without the list."""
        return len(self._index()[1].get(path, ()))

    def all_paths(self) -> list[str]:
        return sorted((self.groups - {""}) | set(self.datasets))

    def table(self, dataset_id: int, step: int) -> BlockTable:
        """The blocks of a dataset at *step* as columns (decoded on first use)."""
        sb = self.steps[step]
        if sb is not self._reading:  # a reader of many variables a step reads them again
            self._together = self._reading is not None and self._reading.together
            self._reading = sb
            self._keep(step, sb)
        return sb.table(self.specs[dataset_id], self.specs, self._together)

    def table_of(self, spec: DatasetSpec, step: int) -> BlockTable:
        """The blocks of *spec* (a level's too, or a reader's derived quantity: none) at *step*."""
        sb = self.steps[step]
        if sb is not self._reading:
            self._keep(step, sb)
        return sb.table(spec)

    def _keep(self, step: int, sb: StepBlocks) -> None:
        """Count *sb* (step *step*) as read last; release the tables of the step read longest
        ago beyond :data:`KEEP_STEPS` (read again from the file if asked for again).

        Threads reading steps of one file call this at once: each change of the steps kept
        is one call of the OrderedDict's, atomic under the GIL (the oldest step found by
        iterating it, then dropped, was dropped by two threads: KeyError, or met a change
        by another: RuntimeError).  At worst a step is dropped early, and read from the
        file again when next asked for."""
        kept = self._kept
        kept.pop(step, None)
        kept[step] = sb
        if len(kept) > KEEP_STEPS:
            try:
                _, old = kept.popitem(last=False)
            except KeyError:  # (none left: other threads dropped them meanwhile)
                return
            if old is not sb:  # (a step re-made by a restore under the same number)
                old.release()

    def storage(
        self,
        ids: Collection[int],
        steps: int | None = None,
        damaged: dict[tuple[int, int], str] | None = None,
        released: list[int] | None = None,
    ) -> dict[int, tuple[list[int], int, int, int]]:
        """``{dataset: (steps written, blocks, bytes stored, bytes of the values)}`` over the
        first *steps* committed steps (all of them by default) of each dataset of *ids*, as
        the sum over steps of the dataset's tables would give them, without a table or a
        record each: step by step, each step's block area read once
        (:meth:`StepBlocks.storage`).  Datasets by the id of their spec; a multiresolution
        dataset's blocks are its patches' band 0.

        A step whose blocks fail their checks raises that FormatError; with *damaged* (a
        dict), the error of each dataset whose blocks fail them at a step goes there by
        ``(step, dataset)``, that dataset left out at that step, and the others are summed.
        A step the engine no longer holds (an in situ consumer's, released) raises StepError;
        with *released* (a list), it goes there and is left out."""
        n = len(self.steps) if steps is None else steps
        wanted = set(ids)
        out: dict[int, tuple[list[int], int, int, int]] = {d: ([], 0, 0, 0) for d in wanted}
        for k in range(n):
            sb = self.steps[k]
            if released is not None and isinstance(sb, ReleasedStep):
                released.append(k)
                continue
            if sb is not self._reading:
                self._keep(k, sb)  # (its tables released with the steps read longest ago)
            try:
                sums = sb.storage(self.specs, wanted)
            except FormatError:
                if damaged is None:
                    raise
                sums = {}
                for d in sorted(wanted):  # dataset by dataset: which ones, and the others
                    try:
                        sums.update(sb.storage(self.specs, {d}))
                    except FormatError as e:
                        damaged[(k, d)] = str(e)
            for d, (nb, stored, raw) in sums.items():
                written, nb0, stored0, raw0 = out[d]
                written.append(k)
                out[d] = (written, nb0 + nb, stored0 + stored, raw0 + raw)
        return out

    def blocks(self, dataset_id: int, step: int) -> list[BlockRecord]:
        """The blocks of a dataset at *step* as :class:`BlockRecord` objects (built on each call)."""
        return self.table(dataset_id, step).records(dataset_id)

    def hits(self, dataset_id: int, step: int, box: Box) -> list[tuple[BlockRecord, Box]]:
        """The blocks of a dataset at *step* that meet *box*, with the common part: ``[(record, Box)]``.

        A search of the step's table (:meth:`BlockTable.hits`); records are
        built only for the blocks found.
        """
        t = self.table(dataset_id, step)
        idx, lo, hi = t.hits(box.start, box.stop)
        return [
            (t.record(int(i), dataset_id), Box(tuple(a.tolist()), tuple(b.tolist())))
            for i, a, b in zip(idx, lo, hi, strict=True)
        ]

    def forget(self, step: int, why: str | Callable[[int], str]) -> None:
        """Drop the blocks of *step* (a step nobody may read again: the memory transport
        released it): its tables are then a StepError saying *why* (a message, or a function
        of the step that makes it).  A stream of many steps kept each one's record and
        tables, about 120 bytes a block a step."""
        if 0 <= step < len(self.steps) and not isinstance(self.steps[step], ReleasedStep):
            self.steps[step] = ReleasedStep(why, step)

    @property
    def nbytes(self) -> int:
        """Memory held by the decoded block tables of every step."""
        return sum(s.nbytes for s in self.steps)

    # -- rollback ---------------------------------------------------------
    def checkpoint(self) -> Checkpoint:
        """A point to :meth:`restore` if applying new records fails part way.

        From now on every change :meth:`apply_op` and :meth:`apply_record` make is logged
        (its key and the value it replaced), so that taking a checkpoint and restoring one
        cost what changed since, not the catalog: a writer takes one at every commit and a
        reader at every refresh (a copy of every name and attribute made each commit cost
        1.9-8 ms a step with 10,000-30,000 datasets).  Only the latest checkpoint can be
        restored; :meth:`release` stops the logging.
        """
        self._serial += 1
        self._undo = []
        return Checkpoint(
            self._serial,
            len(self.specs),
            len(self.layered),
            len(self.steps),
            len(self.step_times),
            self.closed,
            self.last_session,
            self.nrecords,
        )

    def release(self, cp: Checkpoint) -> None:
        """Keep the changes made since *cp* for good: nothing is logged any more (a reader
        that applied a file's records at open holds no log of them)."""
        if cp.serial == self._serial:
            self._undo = None

    def restore(self, cp: Checkpoint) -> None:
        """Go back to *cp* (the latest :meth:`checkpoint`, else RuntimeError); *cp* stays as
        it was, so that it may be restored again after more changes."""
        undo = self._undo
        if undo is None or cp.serial != self._serial:
            raise RuntimeError(
                f"catalog checkpoint {cp.serial} cannot be restored: the latest is "
                f"{self._serial}, {'released' if undo is None else 'live'}"
            )
        for where, key, old in reversed(undo):
            if old is not _NEW:
                where[key] = old
            elif isinstance(where, set):
                where.discard(key)
            else:
                where.pop(key, None)
        undo.clear()
        self._restores += 1
        del self.specs[cp.nspecs :]
        del self.layered[cp.nlayered :]
        del self.steps[cp.nsteps :]
        del self.step_times[cp.ntimes :]
        self.closed, self.last_session, self.nrecords = cp.closed, cp.last_session, cp.nrecords

    def paths_changed(self) -> None:
        """Paths were taken away or replaced outside :meth:`apply_op` (a reader's derived
        quantities, which live in its catalog only): :meth:`children` builds its index again."""
        self._restores += 1

    def _set(self, where: dict, key: object, value: object) -> None:
        """``where[key] = value``, logged while a checkpoint is live."""
        if self._undo is not None:
            self._undo.append((where, key, where.get(key, _NEW)))
        where[key] = value

    def _made(self, where: dict, key: object) -> dict:
        """``where[key]``, a dict, an empty one made (and logged) on first use."""
        d = where.get(key)
        if d is None:
            d = {}
            self._set(where, key, d)
        return d

    def _node_attrs(self, path: str) -> dict[str, object]:
        """The attributes of node *path*, an empty dict made (and logged) on first use."""
        return self._made(self.attrs, path)

    # -- changes --------------------------------------------------------
    def apply_op(self, op: tuple, what: str = "metadata") -> None:
        """Apply one operation; raises FormatError on an inconsistent op from disk."""
        code = op[0]
        if code == OP_GROUP:
            self._add_group(op[1], what)
        elif code == OP_DATASET:
            spec: DatasetSpec = op[1]
            if spec.id != len(self.specs):
                raise FormatError(
                    f"{what}: dataset {spec.path!r} has id {spec.id}, expected {len(self.specs)}"
                )
            if spec.layout is not None and spec.layout.get("layout") == LAYOUT_LEVEL:
                self._add_level(spec, what)
                return
            if spec.path in self.datasets or spec.path in self.groups:
                raise FormatError(f"{what}: dataset {spec.path!r} defined twice")
            self._add_group(parent(spec.path), what)
            self._set(self.datasets, spec.path, spec)
            self.specs.append(spec)
            if spec.layout is not None:
                self.layered.append(spec)
            self._node_attrs(spec.path)
        elif code == OP_ATTR:
            if self.kind_of(op[1]) is None:
                raise FormatError(f"{what}: attribute on unknown node {op[1]!r}")
            self._set(self._node_attrs(op[1]), op[2], op[3])
        elif code == OP_DELATTR:
            d = self.attrs.get(op[1])
            if d is not None and op[2] in d:
                if self._undo is not None:
                    self._undo.append((d, op[2], d[op[2]]))
                del d[op[2]]
        elif code == OP_EXT:
            self._set(self.ext, op[1], op[2])
        else:
            raise FormatError(f"{what}: unknown operation {code}")

    def _add_level(self, spec: DatasetSpec, what: str) -> None:
        """A coarser level of a multiresolution dataset: kept beside it, never listed."""
        assert spec.layout is not None
        of, k = spec.layout.get("of"), spec.layout.get("level")
        base = self.datasets.get(of) if isinstance(of, str) else None
        if (
            base is None
            or base.layout is None
            or base.layout.get("layout") != LAYOUT_MULTIRES
            or not isinstance(k, int)
            or isinstance(k, bool)
            or not 1 <= k < 64
        ):
            raise FormatError(
                f"{what}: level definition {spec.path!r} belongs to no multiresolution dataset"
            )
        unknown = sorted(set(spec.layout) - {"layout", "of", "level"})
        if unknown:
            raise FormatError(
                f"{what}: level definition {spec.path!r} has the field{'s' * (len(unknown) > 1)} "
                f"{', '.join(map(repr, unknown))}, which this lamina does not know"
            )
        levels = self._made(self.levels, base.path)
        expect = tuple(-(-n // (1 << k)) for n in base.shape)
        if (
            k in levels
            or k - 1 not in (0, *levels)
            or spec.shape != expect
            or spec.dtype != base.dtype
        ):
            raise FormatError(
                f"{what}: level {k} of dataset {base.path!r} is defined out of order, twice, or "
                f"with shape {spec.shape} {spec.dtype} (expected {expect} {base.dtype})"
            )
        self._set(levels, k, spec)
        self.specs.append(spec)

    def level(self, path: str, level: int) -> DatasetSpec:
        """The definition of *level* of dataset *path* (level 0: the dataset itself);
        FormatError where the file's layout of it names a level the file does not define."""
        if level == 0:
            return self.datasets[path]
        spec = self.levels.get(path, {}).get(level)
        if spec is None:
            raise FormatError(
                f"dataset {path!r}: level {level} is not defined in the file, though its "
                "layout says it has that level (the metadata is damaged)"
            )
        return spec

    def _add_group(self, path: str, what: str) -> None:
        """*path* and its parents made groups: up from *path* to the first one that is
        (every group's parents are), each checked before any is made."""
        new = []
        p = path
        while p and p not in self.groups:
            if p in self.datasets:
                raise FormatError(f"{what}: group {path!r} would pass through dataset {p!r}")
            new.append(p)
            p = p.rpartition("/")[0]
        for p in new:
            if self._undo is not None:
                self._undo.append((self.groups, p, _NEW))
            self.groups.add(p)
            self._node_attrs(p)

    def apply_record(
        self,
        rec: Record,
        ops_applied: bool = False,
        blocks: StepBlocks | None = None,
        what: str = "",
    ) -> None:
        """Apply a whole record (its ops unless already applied while decoding).

        *blocks*: the step's blocks (how to load them); by default those the
        record holds already.  *what*: the record, as an error names it (file and number).
        """
        if not ops_applied:
            for op in rec.ops:
                self.apply_op(op)
        self.last_session = max(self.last_session, rec.session)
        self.nrecords += 1
        if rec.kind == KIND_STEP:
            if rec.step != len(self.steps):
                raise FormatError(
                    f"{what + ': ' if what else ''}step record {rec.step} out of order: "
                    f"expected step {len(self.steps)}"
                )
            self.steps.append(
                blocks if blocks is not None else rec.step_blocks(None, f"step {rec.step}")
            )
            self.step_times.append(rec.time)
            self.closed = False
        elif rec.kind == KIND_CLOSE:
            self.closed = True
        else:
            self.closed = False
