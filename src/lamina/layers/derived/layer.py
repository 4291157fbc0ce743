"""The derived-quantity layer: expressions over datasets, computed by lamina, kept three ways.

``f.derive("vmag", "magnitude(vx, vy, vz)", strategy="stats")`` declares a
quantity the program does not write itself.  Per quantity, a *strategy*
says what the file keeps (after "To Derive or Not to Derive", ADIOS2):

``store``
    computed at the end of each step on the ranks that wrote its inputs;
    data and block statistics are written like any dataset.
``stats``
    computed at the end of each step; only the block statistics are kept
    (blocks with no data, codec ``stats-only``) and the expression.
``expression``
    only the expression is kept; nothing is computed while writing.

Reading a derived dataset gives the same values under every strategy: stored
data where there is some, otherwise the values recomputed from the inputs,
reading only the selected region plus the halo its stencils need.

**Blocks.**  A derived quantity follows its *anchor*, the first dataset its
expression names: it has a value wherever the anchor was written in a step
(each rank computes over the boxes it wrote of the anchor) and reads as its
fill value (NaN for floating results, 0 otherwise) elsewhere, under every
strategy.  Other inputs are read where the anchor's box needs them; cells
nobody wrote read as the input's fill value, exactly as a reader sees them.

**Halos.**  Stencils (gradient, divergence, curl, laplacian) need cells of
neighbouring blocks: :mod:`.exchange` moves exactly the intersections
between ranks at the end of a step.  Pointwise expressions on inputs written
with one decomposition need no message beyond a few small reductions.  The
results equal ``numpy.gradient(global, edge_order=2)`` on the assembled
global array whatever the decomposition.

**Vectors.**  A vector result (curl, cross, gradient(a)) is a group ``name``
holding datasets ``name/x``, ``name/y``, ``name/z``: each component has its
own blocks and statistics, so a query can prune on one component, and tools
that know nothing of lamina (HDF5 export) see three plain datasets.

**On disk.**  A definition is one extension record (:mod:`.definition`),
committed with the next record like any metadata: nothing committed before
is touched.
"""

from __future__ import annotations

import json
import math
import numbers
import threading
import time
import warnings
from collections.abc import Iterator, Sequence

import numpy as np

from ... import comm as comm_mod
from ... import derived
from ... import stats as stats_mod
from ...catalog import CODEC_STATS_ONLY, BlockTable, DatasetSpec, normpath
from ...engines.base import unusable_of
from ...engines.batch import elements
from ...engines.staging import Held, enter_boxes
from ...errors import (
    CollectiveMismatchError,
    ExistsError,
    ExpressionError,
    FormatError,
    LaminaWarning,
    ModeError,
    NotFoundError,
    ShapeError,
    mark_collective,
    suggest,
    warn_caller,
)
from ...geometry import Box, rows_prod
from ...layouts.spec import Layout
from ...perf.history import Recorder, load_history, signature
from ...stats import crc
from ..base import Layer
from . import exchange as halo
from .definition import (
    EXT_PREFIX,
    STRATEGIES,
    Definition,
    build_definition,
    decode_definition,
    fill_for,
)

#: vector results kept after evaluation, so reading x, y, z computes once
CACHE_VECTORS = 2
#: most bytes of buffers kept for the inputs of the next recomputed reads
SCRATCH_BYTES = 64 << 20


#: the hints derive() takes (the cost model's, for strategy='auto'; kept with any strategy)
HINTS = frozenset({"query_fraction", "readers", "read_bandwidth", "write_bandwidth"})


def _why(name: str, text: str | None, e: Exception) -> str:
    """Why the record of quantity *name* (expression *text*, None if it could not be decoded)
    cannot be used, from the error *e* met: the unknown function or mistake and its position
    in the expression, without the hints meant for someone typing one."""
    if isinstance(e, ExpressionError) and text is not None:
        reason = e.reason.split(" The functions are:")[0].split(" Did you mean")[0].rstrip(".")
        at = f" at position {e.position}" if e.position is not None else ""
        return f"expression {text!r}: {reason}{at}"
    why = str(e)
    own = f"derived quantity {name!r}: "
    return why[len(own) :] if why.startswith(own) else why


class DerivedLayer(Layer):
    """Derived quantities over any engine (see the module docstring).

    Option ``device``: where quantities are computed, ``'cpu'`` (default),
    ``'gpu'`` (CuPy; refused at the open with DeviceUnavailableError where
    CuPy or a CUDA device is missing) or ``'auto'``.
    """

    OPTIONS = frozenset({"device"})

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self._defs: dict[str, Definition] = {}  # name -> definition, in declaration order
        self._by_component: dict[str, Definition] = {}
        self._bad: dict[str, str] = {}  # name -> why its record could not be used
        self._held: dict[str, list[tuple[Box, np.ndarray]]] = {}  # path -> blocks of this step
        # a write into the open step was cut short (cut_step): close leaves the step to the
        # engine, which drops it, instead of computing its quantities and ending it
        self._cut = False
        self._lent: set[str] = set()  # inputs written with copy=False in this step
        self._frozen = Held()  # the caller's arrays _hold made read-only
        self._watch: set[str] = set()  # primary datasets whose blocks are held until end_step
        self._cache: dict[
            tuple, list[np.ndarray]
        ] = {}  # (name, step, box) -> components of recent vector evaluations
        self.device = "cpu"
        self._paths: dict[str, str] = {}  # names as passed to put -> normalized paths
        # the measured history of the cost model (lamina.perf.history): what this layer timed
        self._timed = Recorder()
        self._sigs: dict[str, str] = {}  # derived name -> signature of its expression
        self._step_bytes = 0  # bytes put in this step (primary and stored derived data)
        self._step_puts = 0
        self._step_put_s = 0.0  # seconds inside the engine's put in this step
        self._computed = 0  # elements evaluated when read (recomputed quantities)
        self._scratch: list[np.ndarray] = []  # flat buffers free for the inputs of the next read
        # readers of one file in several threads (dask's): the scratch buffers and the cache of
        # vectors are taken and changed under it (an index chosen, then popped by another
        # thread, handed out a buffer too small or of another dtype)
        self._shared = threading.Lock()

    def configure(self, options: dict) -> None:
        self.device = options.get("device", "cpu")
        if self.device not in ("cpu", "gpu", "auto"):
            raise ValueError(f"device must be 'cpu', 'gpu' or 'auto', got {self.device!r}")
        # a GPU that is not there is refused at the open (validate_open runs this under the
        # open's agreement, so every rank raises if one lacks it), not at the first step that
        # computes a quantity: that step, and under io="async" every later one, would be lost
        # ("cpu" and "auto" need no check: nor the kernels' import)
        if self.device == "gpu":
            derived.check_device(self.device)

    def opened(self) -> None:
        self._load()

    def _build(self, name, text, strategy, spacing, info, check_clash: bool) -> Definition:
        return build_definition(
            name, text, strategy, spacing, info, self.catalog, self._defs, self.path, check_clash
        )

    def _load(self) -> None:
        """Take up the definitions recorded in the file (at open, after refresh)."""
        for key, raw in list(self.catalog.ext.items()):
            if not key.startswith(EXT_PREFIX):
                continue
            name = key[len(EXT_PREFIX) :]
            if name in self._defs or name in self._bad:
                continue
            text = None
            try:
                text, strategy, spacing, info = decode_definition(name, raw)
                d = self._build(name, text, strategy, spacing, info, check_clash=False)
                for p in sorted(d.inputs):
                    q = self._unusable_of(p)
                    if q is not None:
                        raise FormatError(
                            f"derived quantity {name!r}: its input {p!r} is derived quantity "
                            f"{q!r}, which cannot be used either"
                        )
                loop = self._cycle(d)
                if loop is not None:  # a damaged or forged record: derive() never makes one
                    raise FormatError(
                        f"derived quantity {name!r} depends on itself (through its input {loop!r})"
                    )
                for c in d.components:  # a writer defines them with the record, in one commit
                    spec = self.catalog.datasets.get(c)
                    if spec is None or spec.shape != d.shape:
                        raise FormatError(
                            f"derived quantity {name!r}: no dataset {c!r} of shape {d.shape} in the file"
                        )
            except (FormatError, ExpressionError, ShapeError, NotFoundError, ValueError) as e:
                why = self._bad[name] = _why(name, text, e)
                then = "; steps written here do not compute it" if self.mode != "r" else ""
                # at the program's call (an open, a refresh), not at a line of the layers
                warn_caller(
                    f"{self.path}: derived quantity {name!r} cannot be used: {why}; reading it "
                    f"raises FormatError where the file stores no values of it{then}"
                )
                continue
            self._add(d)
        # definitions made by this reader live outside the file: keep them visible after a refresh
        for d in self._defs.values():
            if not d.persistent:
                self._add_virtual_specs(d)

    def _cycle(self, d: Definition) -> str | None:
        """A quantity of the recorded ones that *d*'s inputs lead to and that leads back to *d*
        (None: *d* computes from datasets in the end)."""
        mine = {d.name, *d.components}
        seen: set[str] = set()
        todo = [(p, p) for p in d.inputs]  # (a quantity reached, the input of d it came from)
        while todo:
            p, via = todo.pop()
            if p in mine:
                return via
            if p in seen:
                continue
            seen.add(p)
            sub = self._by_component.get(p) or self._defs.get(p)
            if sub is not None:
                todo.extend((q, via) for q in sub.inputs)
        return None

    def _add(self, d: Definition) -> None:
        self._defs[d.name] = d
        for c in d.components:
            self._by_component[c] = d
        self._watch = set()
        for x in self._defs.values():
            if x.computed_at_write:
                self._watch |= self._closure(x)

    def definition(self, path: str) -> Definition | None:
        """The definition of derived quantity or component *path* (None for a plain dataset)."""
        try:
            p = normpath(path)
        except ValueError:
            return None
        return self._by_component.get(p) or self._defs.get(p)

    def definitions(self) -> dict[str, Definition]:
        """Every derived quantity known here, in declaration order."""
        return dict(self._defs)

    def unusable(self) -> dict[str, str]:
        """The derived quantities the file records that this lamina cannot evaluate (a newer
        definition version, a function it does not know, a damaged record), by name: why."""
        return dict(self._bad)

    def _unusable_of(self, path: str) -> str | None:
        """The quantity this lamina cannot evaluate that *path* is (or is a component of), or None."""
        bad = unusable_of(self._bad, path)
        return None if bad is None else bad[0]

    def _refuse_unusable(self, name: str, step: int | None) -> None:
        """FormatError if *name* belongs to a quantity this lamina cannot evaluate and *step*
        stores no values of it (no block, or statistics only): what it holds there is known
        only to a lamina that can evaluate it, never its fill value.  Steps that stored its
        values (strategy ``store``) read them as plain data.  Raised alike on every rank (the
        ranks hold the same records), before any collective call of a read."""
        try:
            path = normpath(name)
        except ValueError:
            return  # (the engine's own error)
        q = self._unusable_of(path)
        if q is None:
            return
        spec = self.catalog.datasets.get(path)
        if spec is None or spec.id < 0:
            return  # a component the file does not have: the engine's NotFoundError
        k = self.inner.check_step(step)
        t = self.catalog.table(spec.id, k)
        stats_only = bool(len(t)) and bool((t.codec == CODEC_STATS_ONLY).any())
        if len(t) and not stats_only:
            return
        held = "only statistics of it" if stats_only else "no values of it"
        raise FormatError(
            f"{self.path}: cannot read {path!r} at step {k}: it is derived quantity {q!r}, "
            f"which this lamina cannot evaluate ({self._bad[q]}); the step stores {held}"
        )

    def note_query(
        self, elements: int, per_unit: float, seconds: float, judged: Sequence[str] = ()
    ) -> None:
        """A sample of the measured history (files with derived quantities only, like the
        reads): what a query costs besides reading and computing.  Series
        ``query.<strategy>`` where the condition judges derived quantities of one strategy (a
        Store answer cuts the candidates' values, an Expression answer first takes the range of
        every unit: different costs per element), else ``query``."""
        if not self._defs:
            return
        kinds = {d.strategy for d in map(self.definition, judged) if d is not None}
        self._timed.add(
            f"query.{kinds.pop()}" if len(kinds) == 1 else "query", elements, per_unit, seconds
        )

    def derive(
        self,
        name: str,
        expression: str,
        strategy: str = "stats",
        *,
        spacing=None,
        hints: dict | None = None,
    ) -> Definition:
        """Collective: declare derived quantity *name* = *expression*, kept with *strategy*.

        Every rank must pass the same arguments: if any rank refuses the
        declaration, every rank raises its error; if ranks pass different
        arguments, every rank raises CollectiveMismatchError (and nothing is
        declared).  On a file opened for reading the quantity exists only in
        this process and is computed when read (strategy ``expression``); no
        message is exchanged then.
        """
        if self.inner.closed:  # its communicator is gone: say so before any collective
            raise ValueError(
                f"cannot declare derived quantity {name!r}: file {self.path!r} is closed"
            )
        reader = self.mode == "r"
        requested = strategy
        info: dict = {}
        g = comm_mod.Guard()
        with g:
            name = normpath(name)
            if not name:
                raise ValueError("a derived quantity needs a name")
            if strategy not in (*STRATEGIES, "auto"):
                raise ValueError(
                    f"derived quantity {name!r}: unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)} or 'auto'.{suggest(str(strategy), STRATEGIES)}"
                )
            if self.in_step:
                raise ModeError(
                    f"derived quantity {name!r}: declare it between steps (step {self.steps} is open)"
                )
            if reader:
                strategy = "expression"
            bad = sorted(set(hints or {}) - HINTS)
            if bad:
                raise ValueError(
                    f"derived quantity {name!r}: unknown hints {bad}; allowed: {sorted(HINTS)}"
                )
            from ...perf.model import check_hints

            try:  # (with any strategy: they are kept in the file, as JSON)
                hints = check_hints(hints or {})
            except ValueError as e:
                raise ValueError(f"derived quantity {name!r}: {e}") from None
            d = self._build(
                name,
                expression,
                "expression" if strategy == "auto" else strategy,
                spacing,
                info,
                check_clash=True,
            )
        if reader:
            if g.error is not None:
                raise g.error
        else:
            # a rank that refuses must not leave the others waiting
            comm_mod.agree(self.comm, g.error, call=comm_mod.CALL_DERIVE)
        if strategy == "auto":
            # rank 0 chooses for every rank: the hints it chooses on must be everyone's
            said = json.dumps(hints or {}, sort_keys=True, default=str).encode()
            if not reader and not comm_mod.same_everywhere(self.comm, crc(said)):
                raise mark_collective(
                    CollectiveMismatchError(
                        f"derived quantity {d.name!r}: ranks passed different hints to "
                        "strategy='auto'; every rank must declare the same"
                    )
                )
            d.strategy, d.info = self._choose(d, hints or {})
        elif hints:
            d.info["hints"] = dict(hints)
        if requested != d.strategy:
            d.info.setdefault("requested", requested)
        if reader:
            d.persistent = False
            self._add_virtual_specs(d)
        else:
            # ranks computing different quantities at the end of a step would pair different
            # collectives (and hang): refuse now, on every rank, before anything is recorded
            if not comm_mod.same_everywhere(self.comm, crc(d.name.encode() + b"\0" + d.encode())):
                raise mark_collective(
                    CollectiveMismatchError(
                        f"derived quantity {d.name!r}: ranks passed different derive() arguments "
                        "(name, expression, strategy, spacing or hints); every rank must declare the same"
                    )
                )
            if len(d.components) > 1:
                self.inner.make_group(name)
            for c, dt in zip(d.components, d.dtypes, strict=True):
                self.inner.define(DatasetSpec(c, d.shape, dt, fill_for(dt)))
            self.inner.set_ext(EXT_PREFIX + name, d.encode())
        self._add(d)
        return d

    def _choose(self, d: Definition, hints: dict) -> tuple[str, dict]:
        """Collective: the strategy of least predicted total cost (decided on rank 0, the same everywhere)."""
        g = comm_mod.Guard()
        choice = b""
        with g:
            if self.comm.rank == 0:
                from ...perf import recommend

                nblocks = max(
                    1,
                    len(self.inner.block_table(d.anchor, self.steps - 1, stats=False))
                    if self.steps
                    else self.comm.size,
                )
                best, preds = recommend(
                    d.text, d.shape, d.dtype, nblocks=nblocks, history=load_history(), **hints
                )
                info = {
                    "requested": "auto",
                    "hints": hints,
                    "predicted": {s: p.as_dict() for s, p in preds.items()},
                    "chosen": best,
                }
                choice = json.dumps(info, sort_keys=True).encode()
        comm_mod.agree(self.comm, g.error)
        info = json.loads(comm_mod.bcast_bytes(self.comm, choice, root=0))
        return info["chosen"], info

    def _add_virtual_specs(self, d: Definition) -> None:
        """Make a reader's derived quantity visible in its catalog (outside the file's records)."""
        cat = self.catalog
        if len(d.components) > 1:
            cat.groups.add(d.name)
            cat.attrs.setdefault(d.name, {})
        for c, dt in zip(d.components, d.dtypes, strict=True):
            if c not in cat.datasets:
                cat.datasets[c] = DatasetSpec(c, d.shape, dt, fill_for(dt), (), -1)
                cat.attrs.setdefault(c, {})

    def _remove_virtual_specs(self, d: Definition) -> None:
        """Take a reader's derived quantity out of its catalog again (:meth:`_add_virtual_specs`)."""
        cat = self.catalog
        for c in d.components:
            spec = cat.datasets.get(c)
            if spec is not None and spec.id < 0:  # (a file's dataset has an id)
                del cat.datasets[c]
                cat.attrs.pop(c, None)
        if len(d.components) > 1 and not any(p.startswith(d.name + "/") for p in cat.datasets):
            cat.groups.discard(d.name)
            cat.attrs.pop(d.name, None)

    def define(self, spec: DatasetSpec) -> DatasetSpec:
        self._clash(spec.path, "dataset")
        return self.inner.define(spec)

    def make_group(self, path: str) -> None:
        self._clash(normpath(path), "group")
        self.inner.make_group(path)

    def _clash(self, path: str, kind: str) -> None:
        """ExistsError if *path* is a derived quantity or lies inside one (its components)."""
        for existing in (*self._defs, *self._bad):
            if path == existing or path.startswith(existing + "/"):
                raise ExistsError(f"{kind} {path!r} clashes with derived quantity {existing!r}")

    def _closure(self, d: Definition) -> set[str]:
        out: set[str] = set()
        for p in d.inputs:
            sub = self._by_component.get(p)
            if sub is not None:
                out |= self._closure(sub)
            else:
                out.add(p)
        return out

    def _written(self, name: str) -> str:
        """The path of dataset *name* a program writes; ModeError if lamina computes it."""
        path = self._paths.get(name)
        if path is None:
            try:
                path = normpath(name)
            except ValueError:
                path = name
            if len(self._paths) < 4096:
                self._paths[name] = path
        d = self._by_component.get(path)
        if d is not None:
            raise ModeError(
                f"dataset {path!r} is derived ({d.text!r}, strategy {d.strategy!r}): lamina computes it; write its inputs"
            )
        q = self._unusable_of(path) if self._bad else None
        if q is not None:
            raise ModeError(
                f"dataset {path!r} is derived quantity {q!r}, which this lamina cannot evaluate "
                f"({self._bad[q]}): a lamina that can computes it; write its inputs"
            )
        return path

    def put_many(self, name: str, starts: np.ndarray, arrays, copy: bool = True) -> None:
        path = self._written(name)
        self._timed_put(
            path, self.inner.put_many, (name, starts, arrays, copy), arrays, len(starts)
        )
        if path in self._watch:  # the engine checked the batch: hold each block as put does
            for k in range(len(starts)):
                given = arrays if isinstance(arrays, np.ndarray) else arrays[k]
                a = np.asarray(arrays[k])
                self._hold(path, Box.from_offset(starts[k], a.shape), a, copy, given)

    def lend(self, name: str, start: tuple[int, ...], array: np.ndarray) -> bool:
        # no derived quantity: nothing to refuse, hold or time
        return not self._defs and not self._bad and self.inner.lend(name, start, array)

    def put(self, name: str, box: Box, array: np.ndarray, copy: bool = True) -> None:
        if not self._defs and not self._bad:  # no derived quantity: nothing to refuse, hold or time
            self.inner.put(name, box, array, copy)
            return
        path = self._written(name)
        self._timed_put(path, self.inner.put, (name, box, array, copy), box.size, 1)
        if path in self._watch:  # an input of a quantity computed at the end of the step
            self._hold(path, box, array, copy, array)

    def refuse_stats(self, name: str) -> None:
        """ModeError if a program records statistics-only blocks of dataset *name*.

        lamina records them itself, at the end of a step, for the derived
        quantities kept with strategy ``stats`` (:meth:`_keep` calls the inner
        engine directly); a derived dataset is refused as :meth:`put` refuses it,
        a plain one because no layer could compute the values such blocks leave
        out.  An unknown name is left to the engine (its NotFoundError).
        """
        path = self._written(name)
        if path in self.catalog.datasets:
            raise ModeError(
                f"dataset {path!r} is not a derived quantity: statistics-only blocks (put_stats) "
                "are for derived quantities kept with strategy='stats', whose statistics lamina "
                "records itself; write its values with put"
            )

    def put_stats(self, name: str, box: Box, array: np.ndarray) -> None:
        self.refuse_stats(name)
        self.inner.put_stats(name, box, array)

    def put_stats_many(self, name: str, starts: np.ndarray, arrays) -> None:
        self.refuse_stats(name)
        self.inner.put_stats_many(name, starts, arrays)

    def _timed_put(self, path: str, fn, args: tuple, blocks, puts: int) -> None:
        """``fn(*args)``; in a file with derived quantities, timed as the step's write of *puts*
        blocks (*blocks*: their element count, or the blocks as ``put_many`` takes them)."""
        if not self._defs:
            fn(*args)
            return
        t0 = time.perf_counter()  # the engine writes at put or at end_step: both are the write
        fn(*args)
        self._step_put_s += time.perf_counter() - t0
        n = blocks if isinstance(blocks, int) else elements(blocks)
        self._step_bytes += n * self.catalog.datasets[path].dtype.itemsize
        self._step_puts += puts

    def _hold(self, path: str, box: Box, array: np.ndarray, copy: bool, given=None) -> None:
        """Keep a block of an input of a quantity computed at the end of the step; kept by
        reference (``copy=False``), *given*, the caller's array it is, read-only until the
        step ends, as the engine makes the arrays it keeps (it kept none where it staged or
        encoded the block at once: a change made then computed the quantity from values the
        file does not hold)."""
        spec = self.catalog.datasets[path]
        a = np.asarray(array)
        if a.shape != box.shape:
            a = np.broadcast_to(a, box.shape)
        a = (
            np.array(a, dtype=spec.dtype, order="C", copy=True)
            if copy
            else np.asarray(a, dtype=spec.dtype, order="C")  # (ascontiguousarray makes 0-D 1-D)
        )
        self._held.setdefault(path, []).append((box, a))
        if not copy:
            self._lent.add(path)
            if isinstance(given, np.ndarray) and np.may_share_memory(a, given):
                self._frozen.hold(given)

    def end_step(self) -> None:
        todo = self._plan()
        if todo:
            if self.mode == "r":
                self.inner.end_step()  # raises the engine's own error
            try:
                active = comm_mod.agree(
                    self.comm, None, flag=int(self.in_step), call=comm_mod.CALL_END_STEP
                )
            except CollectiveMismatchError:  # the ranks were in different calls: as the engine
                self.discard_step()
                raise
            if active:
                try:
                    self._compute_step(todo)
                except BaseException as e:
                    self.discard_step()
                    mark_collective(e)
                    raise
        nbytes, puts, put_s = self._step_bytes, self._step_puts, self._step_put_s
        self._step_bytes = self._step_puts = 0
        self._step_put_s = 0.0
        try:
            t0 = time.perf_counter()
            self.inner.end_step()
            if nbytes:
                self._timed.add("write", nbytes, nbytes / puts, put_s + time.perf_counter() - t0)
        finally:
            self._held.clear()
            self._lent.clear()
            self._thaw()
            self._cut = False

    def _thaw(self) -> None:
        """The arrays :meth:`_hold` made read-only, writeable again (the step ended)."""
        self._frozen.release()

    def begin_step(self) -> int:
        if not self.in_step:  # a new step (one a write opened is taken as it is, as the engine)
            self._cut = False
        return self.inner.begin_step()

    def cut_step(self) -> None:
        self._cut = True
        self.inner.cut_step()

    def _plan(self) -> list[Definition]:
        """Quantities to compute at this end of step, in an order where inputs come first."""
        want: list[Definition] = []
        seen: set[str] = set()

        def visit(d: Definition) -> None:
            if d.name in seen:
                return
            seen.add(d.name)
            for p in sorted(d.inputs):
                sub = self._by_component.get(p)
                if sub is not None:
                    visit(sub)
            want.append(d)

        for d in self._defs.values():
            if d.computed_at_write:
                visit(d)
        return want

    def _check_lent(self, todo: list[Definition]) -> None:
        """OverlapError for overlapping blocks of an input written with ``copy=False`` in this
        step, as the engine raises it at the commit: computed first, they made the quantity's
        blocks overlap, and the error named the quantity instead of the input."""
        inputs = set().union(*(d.inputs for d in todo))
        for p in sorted(self._lent & inputs):
            held = self._held.get(p, [])
            if len(held) > 1:
                enter_boxes(
                    {},
                    self.catalog.datasets[p],
                    np.array([b.start for b, _ in held], dtype=np.int64),
                    np.array([b.stop for b, _ in held], dtype=np.int64),
                    len(self.catalog.steps),
                    lent_by=self.comm.rank,
                )

    def _compute_step(self, todo: list[Definition]) -> None:
        """Collective: compute every quantity of *todo* over the anchor boxes each rank wrote."""
        for first, d in enumerate(todo):
            t0, put0 = time.perf_counter(), self._step_put_s
            mine = [b for b, _ in self._held.get(d.anchor, [])]
            regions = halo.regions(mine, pointwise=d.expr.halo == 0)
            inputs = sorted(d.inputs)
            # an input's block of the very box a region needs is used as it is (no search)
            same = {p: {b: a for b, a in self._held.get(p, [])} for p in inputs}
            g = comm_mod.Guard()
            reqs: dict[tuple[int, int], Box] = {}  # (region, input index) -> needed box
            local_ok = 1
            with g:
                if first == 0:  # (in this agreement: no collective call of its own)
                    self._check_lent(todo)
                for j, (region, _) in enumerate(regions):
                    need = derived.needed_boxes(d.expr, region, d.shape)
                    for i, p in enumerate(inputs):
                        reqs[(j, i)] = need[p]
                        if need[p] not in same[p] and not halo.covered(self._held, p, need[p]):
                            local_ok = 0
            comm_mod.agree(self.comm, g.error)
            pieces: dict[tuple[int, int], list[tuple[Box, np.ndarray]]] = {}
            if not comm_mod.allreduce_int(self.comm, local_ok, "min"):
                specs = [self.catalog.datasets[p] for p in inputs]
                pieces = halo.exchange(self.comm, self._held, specs, reqs)
            g = comm_mod.Guard()
            with g:
                values = self._values(d, regions, inputs, same, reqs, pieces)
                blocks: dict[str, list[tuple[Box, np.ndarray]]] = {c: [] for c in d.components}
                for (region, members), res in zip(regions, values, strict=True):
                    for c, full in zip(d.components, res, strict=True):
                        for b in members:
                            arr = (
                                full
                                if b == region
                                else np.asarray(full[b.relative_to(region)], order="C")
                            )
                            blocks[c].append((b, arr))
                for c, got in blocks.items():
                    self._keep(d, c, got)
            comm_mod.agree(self.comm, g.error)
            if mine:
                n = sum(b.size for b in mine)
                self._timed.add(
                    f"derive.{d.strategy}.{self._signature(d)}",
                    n,
                    n / len(mine),
                    time.perf_counter() - t0 - (self._step_put_s - put0),
                )

    def _keep(self, d: Definition, c: str, got: list[tuple[Box, np.ndarray]]) -> None:
        """The blocks *got* of component *c* of *d*, computed at the end of a step: written
        (Store) or their statistics recorded (Stats) in one call, and held for the quantities
        computed after *d* in this step."""
        if not got:
            return
        arrays = [a for _, a in got]
        nd = len(got[0][0].start)
        starts = np.array([b.start for b, _ in got], dtype=np.int64).reshape(len(got), nd)
        if d.strategy == "store":  # its write: timed apart, in the step's
            t1 = time.perf_counter()
            self.inner.put_many(c, starts, arrays, copy=False)
            self._step_put_s += time.perf_counter() - t1
            self._step_bytes += sum(a.nbytes for a in arrays)
            self._step_puts += len(arrays)
        elif d.strategy == "stats":
            self.inner.put_stats_many(c, starts, arrays)
        self._held.setdefault(c, []).extend(got)

    def _values(
        self,
        d: Definition,
        regions: list[tuple[Box, list[Box]]],
        inputs: list[str],
        same: dict[str, dict[Box, np.ndarray]],
        reqs: dict[tuple[int, int], Box],
        pieces: dict[tuple[int, int], list[tuple[Box, np.ndarray]]],
    ) -> Iterator[list[np.ndarray]]:
        """The values of *d* over each of *regions*, in order.

        A pointwise expression over several regions (blocks evaluated where
        they lie, :func:`.exchange.regions`) is computed in one call that shares
        the regions among the kernels' threads; otherwise region by region, so
        that one region's inputs are held at a time.
        """

        def inputs_of(j: int) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, ...]]]:
            arrays, origin = {}, {}
            for i, p in enumerate(inputs):
                box = reqs[(j, i)]
                got = same[p].get(box)
                arrays[p] = (
                    got
                    if got is not None
                    else halo.assemble(
                        self._held, self.catalog.datasets[p], box, pieces.get((j, i), [])
                    )
                )
                origin[p] = box.start
            return arrays, origin

        on_cpu = self.device == "cpu" or (self.device == "auto" and not derived.gpu_available())
        if d.expr.halo == 0 and len(regions) > 1 and on_cpu:
            items = []
            for j, (region, _) in enumerate(regions):
                arrays, origin = inputs_of(j)
                items.append((arrays, region, origin))
            yield from derived.evaluate_regions(d.expr, items, d.shape, spacing=d.spacing)
            return
        for j, (region, _) in enumerate(regions):
            yield self._values_over(d, *inputs_of(j), region)

    def _values_over(
        self,
        d: Definition,
        arrays: dict[str, np.ndarray],
        origin: dict[str, tuple[int, ...]],
        region: Box,
        out: list[np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        """The values of *d* over *region* from *arrays* (each starting at *origin*), where the
        layer computes (its device)."""
        return derived.evaluate(
            d.expr,
            arrays,
            region,
            d.shape,
            origin=origin,
            spacing=d.spacing,
            device=self.device,
            out=out,
        )

    def discard_step(self) -> None:
        self._cut = False
        self._held.clear()
        self._thaw()
        self._step_bytes = self._step_puts = 0
        self._step_put_s = 0.0
        self.inner.discard_step()

    def abandon(self) -> None:
        self._held.clear()
        self._thaw()
        self.inner.abandon()

    def close(self) -> None:
        left = not self.inner.closed and comm_mod.has_left(self.comm)  # (the engine lets go)
        if self.mode != "r" and not self.inner.closed and not left and self._plan():
            # a step left open is ended here, its quantities computed, unless a write into it
            # was cut short on some rank (2): the engine's close drops it on every rank
            flag = 2 if self._cut else int(self.in_step)
            if comm_mod.agree(self.comm, None, flag=flag, call=comm_mod.CALL_CLOSE) == 1:
                self.end_step()
        rank = -1 if self.inner.closed else self.comm.rank  # close frees the communicator
        with self._shared:  # (a read on another thread may be taking a buffer: IndexError)
            self._scratch.clear()
        try:
            self.inner.close()
        finally:
            self._thaw()  # (a step left open and dropped)
        if rank == 0:
            self._save_timings()

    def _signature(self, d: Definition) -> str:
        sig = self._sigs.get(d.name)
        if sig is None:
            sig = self._sigs[d.name] = signature(d.expr, d.dtype)
        return sig

    def _save_timings(self) -> None:
        """Merge what this layer timed into the measured history of this host (rank 0 only)."""
        if not self._timed:
            return
        path = self.path

        def failed(e: OSError) -> None:
            warnings.warn(
                f"{path}: cannot keep the measured history of derived quantities: {e}",
                LaminaWarning,
                stacklevel=2,
            )

        # later (at exit, merged with what other files measured): the close does not wait
        self._timed.save_soon(on_error=failed)

    def refresh(self) -> int:
        n = self._reader_defs_aside(self.inner.refresh)
        self._load()
        return n

    def check_step(self, step: int | None) -> int:
        if not isinstance(step, numbers.Integral) or step < self.steps:
            return self.inner.check_step(step)  # (it refuses what is not a step)
        # a step past those the ranks agreed on, read alone (``f.at(k)``): an engine told of
        # new steps (the in situ transport) takes up their records here, definitions too
        k = self._reader_defs_aside(self.inner.check_step, step)
        self._load()
        return k

    def wait_steps(self, count: int, seconds: float) -> None:
        if not any(not d.persistent for d in self._defs.values()):
            self.inner.wait_steps(count, seconds)
            return
        # an engine told of new steps (the in situ transport) takes up their records here too
        self._reader_defs_aside(self.inner.wait_steps, count, seconds)
        self._load()  # a name the file took: its definition, as refresh takes it up

    def _reader_defs_aside(self, fn, *args):
        """``fn(*args)``, a call that takes up the file's new records, with the quantities this
        reader declared (they live in its catalog only) out of the catalog: the records are
        checked against the file's own names.  Then each is put back, unless the file now
        defines its name (:meth:`_settle_reader_defs`)."""
        mine = [d for d in self._defs.values() if not d.persistent]
        if not mine:
            return fn(*args)
        for d in mine:
            self._remove_virtual_specs(d)
        try:
            return fn(*args)
        finally:
            self._settle_reader_defs(mine)

    def _settle_reader_defs(self, mine: list[Definition]) -> None:
        """Put this reader's quantities *mine* (in declaration order) back in the catalog.

        The file's definition wins: a quantity whose name (or a component's)
        the file now defines, as a dataset, a group or a derived quantity, is
        dropped with a LaminaWarning naming it.  One that reads a dropped one
        is parsed again over the file's datasets (dropped too, with a warning,
        if it no longer can be).
        """
        cat = self.catalog
        gone: set[str] = set()  # names and components of the quantities dropped or parsed again
        for d in mine:
            taken = self._taken_by_file(d)
            if taken is not None:
                kind = (
                    "derived quantity"
                    if EXT_PREFIX + taken in cat.ext
                    else cat.kind_of(taken) or "dataset"
                )
                self._drop(d)
                gone.update((d.name, *d.components))
                warnings.warn(
                    f"{self.path}: the file now defines {kind} {taken!r}: derived quantity "
                    f"{d.name!r} ({d.text!r}), declared by this reader, is dropped; {d.name!r} "
                    "is the file's from now on",
                    LaminaWarning,
                    stacklevel=5,
                )
                continue
            if d.inputs & gone:
                try:
                    new = self._build(
                        d.name, d.text, d.strategy, d.spacing, d.info, check_clash=False
                    )
                except (ExpressionError, ShapeError, NotFoundError, ValueError) as e:
                    self._drop(d)
                    gone.update((d.name, *d.components))
                    warnings.warn(
                        f"{self.path}: derived quantity {d.name!r} ({d.text!r}), declared by "
                        f"this reader, reads a name the file now defines and no longer applies "
                        f"({e}); it is dropped",
                        LaminaWarning,
                        stacklevel=5,
                    )
                    continue
                new.persistent = False
                for c in d.components:
                    self._by_component.pop(c, None)
                self._sigs.pop(d.name, None)
                self._add(new)  # in d's place: the declaration order stays
                gone.update((d.name, *d.components))
                d = new
            self._add_virtual_specs(d)
        if gone:
            self._cache.clear()
            # names went away and others came: the catalog's listing of children is built again
            cat.paths_changed()

    def _taken_by_file(self, d: Definition) -> str | None:
        """A name of reader quantity *d* (its name, a component, or a dataset above one) that
        the file's catalog holds, with *d*'s own names out of it; None if there is none."""
        cat = self.catalog
        for p in (d.name, *d.components):
            if cat.kind_of(p) is not None:
                return p
            parts = p.split("/")
            for i in range(1, len(parts)):
                q = "/".join(parts[:i])
                if q in cat.datasets:
                    return q
        return None

    def _drop(self, d: Definition) -> None:
        """Forget quantity *d* (a reader's own: nothing in the file)."""
        self._defs.pop(d.name, None)
        for c in d.components:
            if self._by_component.get(c) is d:
                del self._by_component[c]
        self._sigs.pop(d.name, None)

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
        if self._bad:
            self._refuse_unusable(name, step)
        return self.inner.get_level(name, box, step, out, level, cache, tolerance)

    def block_table(self, name: str, step: int, stats: bool = True, level: int = 0) -> BlockTable:
        # (a query judges a quantity by its statistics: none of its blocks are to be trusted
        # where reading it is refused)
        if self._bad:
            self._refuse_unusable(name, step)
        return self.inner.block_table(name, step, stats, level)

    def coverage(self, path: str, step: int | None) -> list[Box]:
        """Independent: boxes of *path* that hold values at *step* (the rest reads as fill)."""
        if self._bad:
            self._refuse_unusable(path, step)
        blocks = self._anchor_blocks(normpath(path), self.check_step(step))
        return [] if blocks is None else [blocks.box(i) for i in range(len(blocks))]

    def _covered_parts(self, path: str, step: int, box: Box) -> list[Box]:
        """The parts of *box* where *path* holds values at checked *step*: each box of
        :meth:`coverage` that meets *box*, cut to it, in the same order.

        A search of the block table (:meth:`BlockTable.hits`) instead of a box per block, so a
        read costs the same whatever the number of blocks of the step.
        """
        blocks = self._anchor_blocks(path, step)
        if blocks is None:
            return []
        _, lo, hi = blocks.hits(box.start, box.stop)
        return [Box(tuple(a), tuple(b)) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)]

    def _anchor_blocks(self, path: str, step: int) -> BlockTable | None:
        """The blocks that say where *path* holds values at checked *step*: its own, or down
        the chain of anchors (a quantity without blocks of its own, or a component of one
        whose anchor wrote them); None if nothing was written."""
        while True:
            if self._bad:  # (an anchor this lamina cannot evaluate: where it has values is unknown)
                self._refuse_unusable(path, step)
            blocks = (
                self.inner.block_table(path, step, stats=False)
                if path in self.catalog.datasets
                else None
            )
            if blocks is None:
                d = self._defs.get(path)
                if d is None:
                    raise NotFoundError(
                        f"no dataset {path!r} in {self.path!r}.{suggest(path, self.catalog.datasets)}"
                    )
                path = d.anchor
                continue
            if len(blocks):
                return blocks
            d = self._by_component.get(path)
            if d is None:
                return None
            path = d.anchor

    def get(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        if self._bad:
            self._refuse_unusable(name, step)
        if not self._defs:  # no derived quantities: nothing to compute, no history to keep
            self.inner.get(name, box, step, out)
            return
        path = normpath(name)
        d = self._by_component.get(path)
        if d is None:
            self._sampled_read(self.inner.get, path, box, step, out)  # (checks box and step)
            return
        spec, step = self.inner.check_read(path, box, step, out)
        if d.strategy == "store" and spec.id >= 0:
            t = self.catalog.table(spec.id, step)
            if len(t) and not bool((t.codec == CODEC_STATS_ONLY).any()):
                self._sampled_read(self.inner.get, path, box, step, out)
                return
        t0, n0 = time.perf_counter(), self._computed
        per_block = self._recompute(d, d.components.index(path), box, step, out)
        if per_block:  # elements computed, not those a vector's earlier evaluation gave
            self._timed.add(
                f"compute.{self._signature(d)}",
                self._computed - n0,
                per_block,
                time.perf_counter() - t0,
            )

    def get_collective(self, name: str, box: Box, step: int | None, out: np.ndarray) -> None:
        if self._bad:  # (on every rank alike, before the read's first message)
            self._refuse_unusable(name, step)
        path = normpath(name)
        if path not in self._by_component:  # stored data: read together
            self._sampled_read(self.inner.get_collective, path, box, step, out)
            return
        self.get(path, box, step, out)  # computed on read: each rank computes its own box

    def _sampled_read(self, read, path: str, box: Box, step, out: np.ndarray) -> None:
        """``read(path, box, step, out)`` of stored data, timed as a sample of the measured
        history (:meth:`_sample_read`)."""
        cold = not stats_mod.fast_crc_loaded()
        t0 = time.perf_counter()
        read(path, box, step, out)
        self._sample_read(path, box, step, time.perf_counter() - t0, cold)

    def _sample_read(self, path: str, box: Box, step, seconds: float, cold: bool) -> None:
        """A read of stored data that took *seconds*, a sample of the measured history (files
        with derived quantities only); *cold*: the checksums' library was not loaded before
        it.  Left out: a read of less than half the blocks it touches (a value of a 16 KiB
        block is a read's fixed costs, not a rate: 8 bytes in 38 ms made the model predict
        78 s for 16 KiB), and a read that imported the checksums' library (the process's
        first large one, 37 ms: a CLI command reading once put such a sample in the
        history)."""
        if not self._defs or seconds <= 0 or (cold and stats_mod.fast_crc_loaded()):
            return
        spec = self.catalog.datasets.get(path)
        if spec is None or spec.id < 0 or Layout.of(spec) is not None:
            return
        t = self.catalog.table(spec.id, self.check_step(step))
        idx = t.hits(box.start, box.stop)[0]
        if not len(idx) or 2 * box.size < int(rows_prod(t.stop[idx] - t.start[idx]).sum()):
            return
        nbytes = box.size * spec.dtype.itemsize
        self._timed.add("read", nbytes, nbytes / len(idx), seconds)

    def _recompute(self, d: Definition, k: int, box: Box, step: int, out: np.ndarray) -> float:
        """Component *k* of *d* over *box* into *out*; the mean elements per block of the
        anchor it computed (0 if none)."""
        if box.empty:
            return 0.0
        # where the quantity holds values: its own blocks if it kept any (statistics-only ones
        # too: the boxes its statistics and queries judge), else its anchor's.  (The anchor's
        # are wider where a multiresolution anchor stores whole patches a step wrote in part.)
        parts = self._covered_parts(d.components[k], step, box)
        if sum(p.size for p in parts) == box.size:
            # one evaluation: inputs read once, halos shared; a scalar goes straight into *out*
            direct = (
                len(d.components) == 1
                and out.flags.c_contiguous
                and (d.name, step, box) not in self._cache
            )
            res = self._evaluate(d, box, step, out=[out] if direct else None)
            if not direct:
                out[...] = res[k]
            return box.size / len(parts)
        out[...] = d.fill(k)
        for region in parts:
            view = out[region.relative_to(box)]
            direct = len(d.components) == 1 and view.flags.c_contiguous
            res = self._evaluate(d, region, step, out=[view] if direct else None)
            if not direct:
                view[...] = res[k]
        return sum(p.size for p in parts) / len(parts) if parts else 0.0

    def _evaluate(
        self, d: Definition, region: Box, step: int, out: list[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        key = (d.name, step, region)
        if out is None:
            with self._shared:
                cached = self._cache.get(key)
            if cached is not None:
                return cached
        arrays, origin = {}, {}
        taken: list[np.ndarray] = []  # scratch buffers holding the inputs
        for p, need in derived.needed_boxes(d.expr, region, d.shape).items():
            flat, buf = self._take(need.shape, self.catalog.datasets[p].dtype)
            taken.append(flat)
            self.get(p, need, step, buf)
            arrays[p] = buf
            origin[p] = need.start
        res = self._values_over(d, arrays, origin, region, out)
        del arrays
        self._give(taken, res)
        self._computed += region.size
        if len(res) > 1:  # the other components of a vector are likely read next
            with self._shared:
                while len(self._cache) >= CACHE_VECTORS:
                    del self._cache[next(iter(self._cache))]
                self._cache[key] = res
        return res

    def _take(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """A buffer for *shape* elements of *dtype* to read an input into: ``(flat, array)``,
        *array* a view of the start of the 1-D *flat*, which goes back with :meth:`_give`.

        The smallest kept buffer that is large enough, else a new one: reads of many blocks
        reuse memory already touched instead of faulting fresh pages for every block.
        """
        n = math.prod(shape)
        best = -1
        with self._shared:
            kept = self._scratch
            for i, b in enumerate(kept):
                if b.dtype == dtype and b.size >= n and (best < 0 or b.size < kept[best].size):
                    best = i
            flat = kept.pop(best) if best >= 0 else None
        if flat is None:
            flat = np.empty(n, dtype=dtype)
        return flat, flat[:n].reshape(shape)

    def _give(self, flats: list[np.ndarray], results: list[np.ndarray]) -> None:
        """Keep the buffers *flats* for the next reads (at most :data:`SCRATCH_BYTES` in all),
        except any that *results* may share memory with."""
        free = [
            flat
            for flat in flats
            if flat.nbytes <= SCRATCH_BYTES
            and not any(isinstance(r, np.ndarray) and np.may_share_memory(r, flat) for r in results)
        ]
        with self._shared:
            self._scratch.extend(free)
            total = sum(b.nbytes for b in self._scratch)
            while total > SCRATCH_BYTES:  # the oldest go first
                total -= self._scratch.pop(0).nbytes


__all__ = ["DerivedLayer"]
