"""Cost model of the three strategies of a derived quantity: Store, Stats, Expression.

A derived quantity (``magnitude(vx, vy, vz)``, ``curl(u, v, w)``, ...) can be
kept in three ways, following "To Derive or Not to Derive" (ADIOS2 derived
variables):

``store``
    computed at the end of the step; its data and per-block statistics are written;
``stats``
    computed at the end of the step; only per-block statistics (min, max, sum,
    count) and the expression are kept;
``expression``
    only the expression is kept; it is computed when read.

A later query touches a fraction *q* of the data.  With ``store`` it reads *q*
of the derived data; with ``stats`` the block statistics prune the blocks, so
it reads *q* of the input data and recomputes them; with ``expression``
nothing prunes, so it reads all the input data and computes everything.

Notation
--------
========== =============================================================
N          elements per component (the product of the shape)
k, c       number of inputs, of output components
s_in       itemsize of an input element; s_out of an output element
S_in       k N s_in, bytes of input data (the primary datasets)
S_d        c N s_out, bytes of derived data
b, f       compulsory bytes and operations per element
           (:meth:`~lamina.derived.Expr.bytes_per_element`,
           :attr:`~lamina.derived.Expr.flops_per_element`)
B_mem      effective memory bandwidth of the kernels: the calibrated
           pointwise kernel bandwidth, or the stencil bandwidth when the
           expression has a stencil (halo > 0)
F          effective operation rate of the kernels (calibrated)
B_st       bandwidth of the statistics pass (:func:`lamina.stats.compute`)
B_w, B_r   write and read bandwidth of the storage
nb         blocks per component
R          readers (each runs the query once); q the query fraction
========== =============================================================

Compute time is a roofline over the calibrated effective rates, and the
statistics pass reads the derived data once::

    T_c  = max(b N / B_mem, f N / F)
    T_st = S_d / B_st

Eq. 1, write (at the end of a step; the primary data, written by every
strategy alike, are reported apart as ``T_primary = S_in / B_w``)::

    T_write(store)      = T_c + T_st + S_d / B_w
    T_write(stats)      = T_c + T_st
    T_write(expression) = 0

Eq. 2, read (one reader, query fraction q)::

    T_read(store)       = q S_d / B_r
    T_read(stats)       = q (S_in / B_r + T_c)
    T_read(expression)  = a (S_in / B_r + T_c),   a = 1 + q for a vector (q < 1), else 1

The query reads the derived values of the candidates, as Store's does:
with Stats the block statistics find them, so only they are computed; with
Expression nothing prunes, every block is computed to find its range.  A
scalar's values are kept from there; a vector's candidates are computed
again for the components the condition did not test (the layer keeps the
last two vectors only: all of them would hold the whole quantity in memory),
unless every block is a candidate: the values are then read over the box
the condition was computed over, which the layer still holds (``a = 1``;
measured: curl over 64 blocks computes 1.02 n elements at q = 1/64, 1.5 n at
q = 1/2 and n at q = 1).

Eq. 3, storage, as lamina writes it: ``S_stats = c (nb (78 + 16 d) + 56)``,
one metadata row per block and component of a d-dimensional quantity (its
box, location, one checksum, min, max, sum and count) and one section per
component and step (its head and its directory entry, format 4), ``S_crc``, the further
checksums of stored blocks (4 bytes per 4 MiB segment beyond the first), and
``S_expr``, the definition every strategy keeps: the extension record
``derived:<name>`` (expression text, strategy, spacing) and one dataset
record per component (``len(text) + 2 len(name) + 125`` bytes or so for a
3-D scalar)::

    S(store)            = S_d + S_stats + S_crc + S_expr
    S(stats)            = S_stats + S_expr
    S(expression)       = S_expr

Total time over the life of the data: ``T_total = T_write + R T_read``;
:func:`recommend` picks the smallest total, a tie going to the strategy that
stores less.

Blocks
------
The equations above move and compute every byte at the rates of large
arrays.  lamina works block by block, and a calibration made by
:func:`~lamina.perf.calibrate.calibrate` also times blocks
(``Calibration.block_seconds``: a kernel call, a statistics pass, an engine
write and read of one block, at block sizes from 4 Ki to 2 Mi elements or
32 KiB to 16 MiB).  Where it has them, each term is taken at the size it
works on instead (:func:`lamina.perf.calibrate.block_time` interpolates):

* ``T_c(n)``, one evaluation over n elements: the calibration's own table
  where the expression is one of its kernels (``magnitude``, ``curl`` of
  float64), else the roofline of the tables at n (``a + b`` or
  ``gradient(u, 0)`` scaled by bytes per element, ``magnitude`` and
  ``curl`` by operations).  At the end of a step a writer evaluates the
  box of its blocks at once (``T_c = T_c(N)``); a query computes its
  candidates together (``T_c(q N)``), so a small query pays a kernel call's
  fixed cost and runs on one thread;
* ``T_st = c nb t_st(N / nb)``: one statistics pass per block and component;
* the engine's writes and reads: ``S / s_b`` blocks of ``s_b`` bytes at
  ``t_w(s_b)`` or ``t_r(s_b)`` each (a read or write bandwidth given by the
  caller replaces its table);
* ``T_g = 2 S_in / B_fresh`` when a writer holds several blocks
  (``nb > 1``): the layer copies each input into a new array of the box of
  its blocks before evaluating (bytes read and written, at the calibrated
  rate of a copy into new memory, page faults included; the memcpy rate in
  a calibration without it).  A pointwise expression over blocks of at
  least :data:`IN_PLACE_ELEMENTS` is evaluated block by block on the
  blocks as written instead: no ``T_g``, and ``nb T_c(N / nb)`` at the
  write;
* ``T_q = t_q(nb)``: a query's own time besides its reads and computing
  (statistics tables, units, judging, selecting), timed by the query
  engine by the blocks of the dataset it judges, added to every read;
* ``T_f = 2 S_d (1 / B_fresh - 1 / B_memcpy)``: the result of the
  evaluation at the end of a step is new memory too, and its first touches
  cost what a copy into new memory costs beyond a memcpy (the kernel tables
  are timed on memory already touched).  ``T_g + T_f`` is added to Eq. 1's
  Store and Stats writes.  A query reads into new buffers as well (a
  reader opens the file anew): every byte ``R`` reads, and every byte of
  the values a query computes, pays the same first touches.

Eq. 2 becomes ``T_read(store) = T_q + R(q S_d)``,
``T_read(stats) = T_q + R(q S_in) + T_c(q N)`` and
``T_read(expression) = T_q + R(S_in) + T_c(N)``, plus
``R(q S_in) + T_c(q N)`` for a vector's candidates computed again (``R``:
the engine's reads of blocks).  Without the tables (a calibration made by
hand) these reduce to the equations above.

The calibrated rates are *effective* rates of lamina's own kernels
(:mod:`lamina.perf.calibrate`), Python overhead of a call included (the
tables: at each block size), so ``a + b`` (memory bound) and
``magnitude``/``curl`` (bound by the operation rate) are predicted close
to what they measure.  One rate for every operation is a simplification:
transcendental functions (``exp``, ``sin``, ...) cost several times an
addition and are predicted too fast.  What the model still leaves out:
the contention of the step's other work (the statistics of the primary
blocks on their own thread) with the computing at the end of a step.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from ..derived import Expr, check_inputs, component_names, parse, result_dtype
from ..derived._parallel import IN_PLACE_ELEMENTS  # the derived layer's rule (exchange.regions)
from ..errors import ExpressionError
from ..stats import SEGMENT
from .calibrate import FLOP_TABLES, TABLE_KERNELS, Calibration, block_time
from .history import History, signature

#: the strategies, in order of decreasing storage
STRATEGIES = ("store", "stats", "expression")
#: bytes of the metadata row of one block of one component, besides 16 per axis (its box):
#: writer, location, codec, one checksum, statistics (min, max, sum, count)
BLOCK_RECORD_BYTES = 78
BLOCK_RECORD_BYTES_PER_AXIS = 16
#: bytes of the section of one component in a step (docs/format.md: its 16-byte head, its
#: 36-byte directory entry and the record's growth by one section)
SECTION_BYTES = 56
#: bytes of each further checksum of a stored block (one per checksum segment of the engine,
#: :data:`lamina.stats.SEGMENT` by default)
CHECKSUM_BYTES = 4
#: name assumed for the derived quantity when none is given (its length counts in Eq. 3)
DEFAULT_NAME = "derived"
#: relative difference of totals under which two strategies count as tied
TIE = 1e-9
#: largest count taken (readers, blocks, a dimension): the integers a float holds exactly
MAX_COUNT = 1 << 53


@dataclass(frozen=True)
class Prediction:
    """Predicted costs of one strategy (seconds and bytes).

    ``compute_s`` is the computing of the derived quantity over the life of
    the data: at the write for ``store`` and ``stats``, plus at every read
    for ``stats`` (the pruned fraction) and ``expression`` (everything).
    ``write_s`` is Eq. 1, ``read_s`` Eq. 2 (one reader), ``total_s`` is
    ``write_s + readers * read_s``, ``storage_bytes`` Eq. 3.
    ``primary_write_s`` is the writing of the inputs themselves, the same
    for every strategy and not in ``total_s``.
    """

    strategy: str
    compute_s: float
    write_s: float
    read_s: float
    total_s: float
    storage_bytes: int
    primary_write_s: float = 0.0
    #: where the times come from: 'calibration' (Eq. 1-2 at the calibrated rates), 'history'
    #: (rates fitted to measured history), or 'history+calibration' (some terms each)
    source: str = "calibration"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Terms:
    """The quantities the equations combine (see the module docstring)."""

    elements: int  # N
    inputs: int  # k
    components: int  # c
    input_bytes: int  # S_in
    derived_bytes: int  # S_d
    stats_bytes: int  # S_stats
    checksum_bytes: int  # further checksums of stored blocks (store only)
    expression_bytes: int  # S_expr, without the name of the strategy (added per strategy)
    bytes_per_element: int  # b
    flops_per_element: int  # f
    memory_bandwidth: float  # B_mem used
    compute_s: float  # T_c
    stats_s: float  # T_st
    read_bandwidth: float  # B_r
    write_bandwidth: float  # B_w
    blocks: int = 1  # nb
    signature: str = ""  # the expression's key in the measured history
    gather_s: float = 0.0  # T_g
    fresh_s: float = 0.0  # T_f
    query_s: float = 0.0  # T_q
    #: seconds per byte of the first touches of new memory beyond a memcpy: 2 (1/B_fresh -
    #: 1/B_memcpy); paid by the result at the end of a step (T_f) and by a reader's buffers
    touch_s_per_byte: float = 0.0
    #: a pointwise expression over blocks of at least IN_PLACE_ELEMENTS: evaluated block by
    #: block at the end of a step, on the blocks as written (nothing gathered)
    in_place: bool = False
    #: the calibration's per-block tables, where it has them (not in :meth:`as_dict`); None:
    #: every term at the rates of large arrays
    tables: _Tables | None = field(default=None, compare=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "tables"}

    def write_compute_s(self) -> float:
        """``T_c`` at the end of a step: over the box of a writer's blocks at once, or block by
        block where the expression is evaluated in place."""
        if self.in_place:
            return self.blocks * self.compute_at(self.elements / self.blocks)
        return self.compute_s

    def compute_at(self, n: float) -> float:
        """Seconds to evaluate the expression over *n* elements at once (``T_c`` at ``n = N``)."""
        if n <= 0 or self.elements == 0:
            return 0.0
        if self.tables is None or not self.tables.kernels:
            return self.compute_s * n / self.elements
        return self.tables.compute(n, self.bytes_per_element, self.flops_per_element)

    def read_s(self, nbytes: float, block_bytes: float) -> float:
        """Seconds to read *nbytes* stored in blocks of *block_bytes* each into new buffers (a
        query's, on a file opened anew)."""
        if nbytes <= 0:
            return 0.0
        t = self.tables.per_block("read", block_bytes) if self.tables is not None else None
        moved = nbytes / self.read_bandwidth if t is None else nbytes / block_bytes * t
        return moved + nbytes * self.touch_s_per_byte

    def write_s(self, nbytes: float, block_bytes: float) -> float:
        """Seconds to write *nbytes* in blocks of *block_bytes* each (in a step of several)."""
        if nbytes <= 0:
            return 0.0
        t = self.tables.per_block("write", block_bytes) if self.tables is not None else None
        return nbytes / self.write_bandwidth if t is None else nbytes / block_bytes * t


@dataclass(frozen=True)
class _Tables:
    """The per-block tables of a calibration (:func:`lamina.perf.calibrate.block_time`) as
    they apply to one expression."""

    calibration: Calibration
    #: the table of the calibration's kernel this expression is, if it is one (float64 inputs)
    own: str | None
    stencil: bool  # the expression has a halo: the stencil table bounds its memory traffic
    given: tuple[str, ...]  # "read", "write": rates the caller gave, which replace the tables

    @property
    def kernels(self) -> bool:
        return all(k in self.calibration.block_seconds for k in _table_work())

    def per_block(self, kind: str, size: float) -> float | None:
        if kind in self.given:
            return None
        return block_time(self.calibration, kind, size)

    def compute(self, n: float, b: int, f: int) -> float:
        """Seconds of one evaluation over *n* elements of the expression (*b* bytes and *f*
        operations per element): its own table if the calibration timed it, else the roofline
        of the tables at that size (memory: ``a + b`` or ``gradient(u, 0)`` scaled by bytes,
        operations: ``magnitude`` and ``curl`` together scaled by operations)."""

        def at(kind: str) -> float:
            return block_time(self.calibration, kind, n) or 0.0

        if self.own is not None:
            return at(self.own)
        work = _table_work()
        mem = "stencil" if self.stencil else "kernel"
        t_op = sum(at(k) for k in FLOP_TABLES) * f / sum(work[k] for k in FLOP_TABLES)
        return max(at(mem) * b / work[mem], t_op)


@functools.cache
def _table_work() -> dict[str, int]:
    """Per element, the bytes of the tables' memory-bound kernels and the operations of their
    operation-bound ones (:data:`lamina.perf.calibrate.TABLE_KERNELS`, float64)."""
    out = {}
    for kind, (text, _) in TABLE_KERNELS.items():
        tree = parse(text)
        out[kind] = tree.flops_per_element if kind in FLOP_TABLES else tree.bytes_per_element(8)
    return out


@functools.cache
def _table_signatures() -> dict[str, str]:
    """The signature (:func:`lamina.perf.history.signature`) of each table's kernel -> its kind."""
    return {
        signature(parse(text), np.dtype("f8")): kind for kind, (text, _) in TABLE_KERNELS.items()
    }


# ----------------------------------------------------------------- validation
def _positive_rate(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number of bytes per second, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return v


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"query_fraction must be a number in [0, 1], got {value!r}")
    q = float(value)
    if not (0.0 <= q <= 1.0):  # also rejects nan
        raise ValueError(f"query_fraction must be in [0, 1], got {value!r}")
    return q


def _count(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if int(value) > MAX_COUNT:  # not its digits: an integer may have more than str() writes
        raise ValueError(f"{name} must be at most 2**53 ({MAX_COUNT}), got a larger integer")
    return int(value)


def check_hints(hints: Mapping[str, Any]) -> dict[str, Any]:
    """The derive() hints of the model (``query_fraction``, ``readers``, ``read_bandwidth``,
    ``write_bandwidth``) checked as :func:`predict` checks them, as Python numbers (a numpy
    integer or float as the value it holds: the hints are kept in the file as JSON).
    ValueError naming a hint out of range; names it does not know are the caller's to judge."""
    out: dict[str, Any] = {}
    for k, v in hints.items():
        if k == "query_fraction":
            out[k] = _fraction(v)
        elif k == "readers":
            out[k] = _count(v, "readers", 0)
        elif k in ("read_bandwidth", "write_bandwidth"):
            out[k] = None if v is None else _positive_rate(v, k)
        else:
            out[k] = v
    return out


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, Sequence) or isinstance(shape, str) or not shape:
        raise ValueError(f"shape must be a non-empty sequence of integers >= 0, got {shape!r}")
    out = tuple(_count(s, "shape", 0) for s in shape)
    if math.prod(out) > MAX_COUNT:
        raise ValueError(f"shape: at most 2**53 ({MAX_COUNT}) elements, got {shape!r}")
    return out


def _expression(expr: Expr | str) -> tuple[Expr, str]:
    """The tree and the text of *expr* (text parsed as an expression, else as a predicate)."""
    if isinstance(expr, Expr):
        return expr, getattr(expr, "source", None) or str(expr)
    if not isinstance(expr, str):
        raise ExpressionError(f"an expression must be text or an Expr, not {type(expr).__name__}")
    try:
        return parse(expr, "expr"), expr
    except ExpressionError as first:
        try:
            return parse(expr, "predicate"), expr
        except ExpressionError:
            raise first from None


# ----------------------------------------------------------------- the model
def definition_bytes(name: str, text: str, ndim: int, components: int, dtypes) -> int:
    """Bytes of the metadata that defines a derived quantity, but the name of its strategy.

    The extension record ``derived:<name>`` (format version, expression text,
    strategy, spacing per axis, an empty info object) and one dataset record
    per component (path, dtype, shape, fill value, no codecs), plus the group
    record of a vector (see :mod:`lamina.layers.derived`).
    """
    ext = 1 + (4 + len(f"derived:{name}".encode())) + 8  # operation, key, length of the value
    ext += 1 + (4 + len(text.encode())) + 4 + 1 + 8 * ndim + (4 + 2)
    dts = [np.dtype(d) for d in dtypes]
    comps = component_names(name, components)
    each = 0
    for i, path in enumerate(comps):
        dt = dts[min(i, len(dts) - 1)]
        each += 1 + 4 + (4 + len(path.encode())) + (4 + len(dt.str)) + 1 + 8 * ndim
        each += dt.itemsize + (4 + 2)
    group = 1 + 4 + len(name.encode()) if components > 1 else 0
    return ext + each + group


def terms(
    expr: Expr | str,
    shape: Sequence[int] | int,
    dtype: Any = "f8",
    *,
    nblocks: int = 1,
    read_bandwidth: float | None = None,
    write_bandwidth: float | None = None,
    calibration: Calibration | None = None,
    name: str | None = None,
) -> Terms:
    """The sizes and times the equations combine, for *expr* over data of *shape* and *dtype*.

    Raises ExpressionError for an expression that does not parse or whose
    stencils do not fit *shape*, ValueError for a bad parameter.
    """
    tree, text = _expression(expr)
    shp = _shape(shape)
    nb = _count(nblocks, "nblocks", 1)
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"dtype: not a numpy dtype: {dtype!r}") from e
    if calibration is None:
        from .calibrate import load_calibration

        calibration = load_calibration()
    b_r = _positive_rate(
        calibration.read_bandwidth if read_bandwidth is None else read_bandwidth, "read_bandwidth"
    )
    b_w = _positive_rate(
        calibration.write_bandwidth if write_bandwidth is None else write_bandwidth,
        "write_bandwidth",
    )
    inputs = sorted(tree.inputs)
    if inputs:
        check_inputs(tree, {p: shp for p in inputs}, text)
    out_dtypes = result_dtype(tree, {p: dt for p in inputs}, len(shp))
    s_in = dt.itemsize
    s_out = max(d.itemsize for d in out_dtypes)
    n = math.prod(shp)
    k, c = len(inputs), tree.ncomponents
    b = tree.bytes_per_element(s_in, s_out)
    f = tree.flops_per_element
    b_mem = calibration.stencil_bandwidth if tree.halo > 0 else calibration.kernel_bandwidth
    t_c = max(b * n / b_mem, f * n / calibration.flop_rate)
    s_d = c * n * s_out
    block_bytes = -(-n // nb) * s_out  # the largest block of a component
    segments = max(1, -(-block_bytes // SEGMENT))  # checksums of one stored block
    tables = None
    if calibration.block_seconds:
        sig = signature(tree, dt)
        tables = _Tables(
            calibration,
            own=_table_signatures().get(sig),
            stencil=tree.halo > 0,
            given=tuple(
                k
                for k, v in (("read", read_bandwidth), ("write", write_bandwidth))
                if v is not None
            ),
        )
        if tables.kernels and n:
            t_c = tables.compute(n, b, f)
    t_st = s_d / calibration.stats_bandwidth
    per_stats = tables.per_block("stats", n / nb) if tables is not None and n else None
    if per_stats is not None:  # per element: a block's pass costs about the same in float32
        t_st = c * nb * per_stats
    # a rank holding several blocks evaluates over their box, its inputs first copied into it,
    # unless the expression is pointwise and the blocks large (the derived layer's rule:
    # lamina.layers.derived.exchange.regions); the result at the end of a step is new memory,
    # its first touches cost what a copy into new memory costs beyond a plain memcpy
    in_place = tree.halo == 0 and nb > 1 and n / nb >= IN_PLACE_ELEMENTS
    fresh = calibration.fresh_copy_bandwidth or calibration.memcpy_bandwidth
    gather = 2 * k * n * s_in / fresh if nb > 1 and not in_place else 0.0
    touch = max(0.0, 2 * (1 / fresh - 1 / calibration.memcpy_bandwidth))
    t_q = (tables.per_block("query", nb) if tables is not None else None) or 0.0
    return Terms(
        elements=n,
        inputs=k,
        components=c,
        input_bytes=k * n * s_in,
        derived_bytes=s_d,
        stats_bytes=c
        * (nb * (BLOCK_RECORD_BYTES + BLOCK_RECORD_BYTES_PER_AXIS * len(shp)) + SECTION_BYTES),
        checksum_bytes=nb * c * CHECKSUM_BYTES * (segments - 1),
        expression_bytes=definition_bytes(
            DEFAULT_NAME if name is None else name, text, len(shp), c, out_dtypes
        ),
        bytes_per_element=b,
        flops_per_element=f,
        memory_bandwidth=b_mem,
        compute_s=t_c,
        stats_s=t_st,
        read_bandwidth=b_r,
        write_bandwidth=b_w,
        blocks=nb,
        signature=signature(tree, dt),
        gather_s=gather,
        fresh_s=touch * s_d,
        query_s=t_q,
        touch_s_per_byte=touch,
        in_place=in_place,
        tables=tables,
    )


def _again(components: int, q: float) -> float:
    """How many times Expression computes the candidates of a query of fraction *q* (Eq. 2):
    a vector's candidates twice, once to find them and once for the components the condition
    did not test, unless every block is one (the layer still holds the box it computed)."""
    return 1.0 + q if components > 1 and q < 1.0 else 1.0


def combine(
    t: Terms, query_fraction: float = 1.0, readers: int = 1, history: History | None = None
) -> dict[str, Prediction]:
    """Eq. 1-3 and the totals from the quantities *t* (see the module docstring); with a
    *history*, each time term it has samples for comes from its fitted rates instead."""
    q = _fraction(query_fraction)
    r = _count(readers, "readers", 0)
    t_c, t_st, t_g = t.compute_s, t.stats_s, t.gather_s + t.fresh_s
    t_cw = t.write_compute_s()
    nb, c = max(1, t.blocks), max(1, t.components)
    d_block = t.derived_bytes / (c * nb)  # bytes of a stored block of one component
    in_block = t.input_bytes / (max(1, t.inputs) * nb)  # bytes of a block of one input
    write = {
        "store": t_g + t_cw + t_st + t.write_s(t.derived_bytes, d_block),
        "stats": t_g + t_cw + t_st,
        "expression": 0.0,
    }
    # the candidates of a query are computed in one evaluation (consecutive blocks are read
    # and computed together); a vector's, again for the other components (_again)
    t_cq = t.compute_at(q * t.elements)
    again = _again(t.components, q) > 1.0
    t_q = t.query_s  # the query's own time besides its reads and computing
    # what a query computes lands in new memory too, as what it reads (Terms.read_s)
    touch_d = t.touch_s_per_byte * t.derived_bytes
    read = {
        "store": t_q + t.read_s(q * t.derived_bytes, d_block),
        "stats": t_q + t.read_s(q * t.input_bytes, in_block) + t_cq + q * touch_d,
        "expression": t_q
        + t.read_s(t.input_bytes, in_block)
        + t_c
        + touch_d
        + (t.read_s(q * t.input_bytes, in_block) + t_cq + q * touch_d if again else 0.0),
    }
    compute = {
        "store": t_cw,
        "stats": t_cw + r * t_cq,
        "expression": r * (t_c + (t_cq if again else 0.0)),
    }
    source = dict.fromkeys(STRATEGIES, "calibration")
    if history is not None:
        _from_history(t, q, history, write, read, source)
    s_expr = {s: t.expression_bytes + len(s) for s in STRATEGIES}  # the record names the strategy
    storage = {
        "store": t.derived_bytes + t.stats_bytes + t.checksum_bytes + s_expr["store"],
        "stats": t.stats_bytes + s_expr["stats"],
        "expression": s_expr["expression"],
    }
    primary = t.input_bytes / t.write_bandwidth
    return {
        s: Prediction(
            strategy=s,
            compute_s=compute[s],
            write_s=write[s],
            read_s=read[s],
            total_s=write[s] + r * read[s],
            storage_bytes=storage[s],
            primary_write_s=primary,
            source=source[s],
        )
        for s in STRATEGIES
    }


def _from_history(
    t: Terms,
    q: float,
    history: History,
    write: dict[str, float],
    read: dict[str, float],
    source: dict[str, str],
) -> None:
    """Replace the terms of *write* and *read* that *history* has samples for (in place).

    The series (:mod:`lamina.perf.history`) are timed by the derived layer
    itself, so they hold what the equations leave out: gathering the inputs,
    per-block overheads, page faults of fresh buffers, threads that do not
    start on small blocks.  Each is a rate at the size of a block:
    ``derive.<strategy>.<e>`` the computing at the end of a step,
    ``compute.<e>`` the recomputing at a read (inputs read included),
    ``write`` and ``read`` the engine's bytes, and ``query.<strategy>`` (else
    ``query``) what a query judging the strategy's quantity spends besides
    its reads (statistics, ranges, judging the units, cutting values out of
    runs), added to every read.
    """
    n, nb, c, s_d = t.elements, max(1, t.blocks), t.components, t.derived_bytes
    per_block = n / nb
    again = _again(c, q)
    sig = t.signature

    def term(series: str, x1: float, x2: float, fallback: float) -> tuple[float, bool]:
        # (nothing to handle, x1 = 0: the series' 0 where it has samples, as its rate gives
        # for x1 -> 0; the fallback there made a query of no elements dearer than one of a few)
        got = history.seconds(series, x1, x2)
        return (fallback, False) if got is None else (got, True)

    parts: dict[str, list[tuple[float, bool]]] = {
        "store": [
            # the computing at the end of a step: Stats' whole write, Store's but its own
            term(f"derive.store.{sig}", n, per_block, write["stats"]),
            term("write", s_d, s_d / (c * nb), t.write_s(s_d, s_d / (c * nb))),
        ],
        "stats": [term(f"derive.stats.{sig}", n, per_block, write["stats"])],
    }
    for s, lst in parts.items():
        write[s] = sum(v for v, _ in lst)
    bare = {k: v - t.query_s for k, v in read.items()}  # the calibrated reads, the query apart
    reads = {
        "store": term("read", q * s_d, s_d / (c * nb), bare["store"]),
        "stats": term(f"compute.{sig}", q * n, per_block, bare["stats"]),
        "expression": term(f"compute.{sig}", again * n, per_block, bare["expression"]),
    }
    # the query's own time besides its reads, per element it reads and per unit: the selected
    # components of the candidates; Expression first the tested component everywhere (its
    # values are kept for the selection), then the other components of the candidates
    handled = {"store": c * q * n, "stats": c * q * n, "expression": n + (c - 1) * q * n}
    for s in STRATEGIES:
        # the series of queries judging this strategy's quantities, else of every query
        own, has_own = term(f"query.{s}", handled[s], per_block, 0.0)
        if not has_own:  # else the calibrated query (0 without the table)
            own, has_own = term("query", handled[s], per_block, t.query_s)
        read[s] = reads[s][0] + own
        used = [reads[s][1], *(h for _, h in parts.get(s, []))]
        if has_own or t.query_s:  # (no query calibrated and none measured: no term to say)
            used.append(has_own)
        source[s] = "history" if all(used) else "history+calibration" if any(used) else source[s]


def predict(
    expr: Expr | str,
    shape: Sequence[int] | int,
    dtype: Any = "f8",
    *,
    nblocks: int = 1,
    query_fraction: float = 1.0,
    readers: int = 1,
    read_bandwidth: float | None = None,
    write_bandwidth: float | None = None,
    calibration: Calibration | None = None,
    name: str | None = None,
    history: History | None = None,
) -> dict[str, Prediction]:
    """Predicted costs of keeping *expr* as ``store``, ``stats`` and ``expression``.

    Parameters
    ----------
    expr
        The derived quantity: text or a tree from :func:`lamina.derived.parse`.
    shape, dtype
        Global shape and dtype of each input dataset (default float64).
    nblocks
        Blocks per component (each keeps one set of statistics).
    query_fraction
        Fraction q in [0, 1] of the data a query needs.
    readers
        How many times the data are queried (an integer >= 0).
    read_bandwidth, write_bandwidth
        Bytes per second of the storage; default: the calibration's, which
        measures this machine's page cache.
    calibration
        Rates of this machine; default :func:`~lamina.perf.load_calibration`
        (measured once and cached).
    name
        Name of the derived quantity (its length counts in the storage);
        default ``"derived"``.
    history
        Measured history (:func:`lamina.perf.history.load_history`): each
        time term it has samples for is predicted from the rates fitted to
        them (``Prediction.source`` says which); default none, Eq. 1-2 at
        the calibrated rates alone.

    Returns
    -------
    dict
        ``{"store": Prediction, "stats": Prediction, "expression": Prediction}``.

    Raises
    ------
    ValueError
        A parameter out of range, naming it and the limit
        (:class:`~lamina.errors.ExpressionError`, a ValueError, for an
        expression that does not parse).
    """
    q = _fraction(query_fraction)
    r = _count(readers, "readers", 0)
    t = terms(
        expr,
        shape,
        dtype,
        nblocks=nblocks,
        read_bandwidth=read_bandwidth,
        write_bandwidth=write_bandwidth,
        calibration=calibration,
        name=name,
    )
    return combine(t, q, r, history)


def best(predictions: Mapping[str, Prediction]) -> str:
    """The strategy of smallest total time; a tie goes to the one that stores less (a total
    that is not a number counts as infinite: where every total is, the least storage wins)."""

    def total(s: str) -> float:
        t = predictions[s].total_s
        return t if t == t else math.inf  # NaN: no prediction

    lowest = min(map(total, predictions))
    tied = [s for s in predictions if total(s) <= lowest + TIE * max(abs(lowest), 1e-300)]
    return min(tied, key=lambda s: (predictions[s].storage_bytes, total(s)))


def recommend(
    expr: Expr | str,
    shape: Sequence[int] | int,
    dtype: Any = "f8",
    *,
    nblocks: int = 1,
    query_fraction: float = 1.0,
    readers: int = 1,
    read_bandwidth: float | None = None,
    write_bandwidth: float | None = None,
    calibration: Calibration | None = None,
    name: str | None = None,
    history: History | None = None,
) -> tuple[str, dict[str, Prediction]]:
    """The strategy of least total time and the predictions of all three (see :func:`predict`)."""
    p = predict(
        expr,
        shape,
        dtype,
        nblocks=nblocks,
        query_fraction=query_fraction,
        readers=readers,
        read_bandwidth=read_bandwidth,
        write_bandwidth=write_bandwidth,
        calibration=calibration,
        name=name,
        history=history,
    )
    return best(p), p
