"""When background I/O pays: the epoch model, fitted to the run's own history.

An application's time is ``t_app = t_init + sum of epochs + t_term``; an
epoch is one compute phase and one step of I/O.  Synchronous and
asynchronous epochs take::

    t_sync  = t_io + t_comp
    t_async = max(t_comp + t_copy, t_io)

``t_copy`` is what the application thread spends handing a step over (its
transactional copy and the calls' own work) before it computes again.
The seed paper writes ``max(t_comp, t_io - t_comp) + t_ov``; that form
understates ``t_async`` when ``t_io > 2 t_comp``: once the I/O of a step
outlasts the compute phase, the next epoch waits for it, so an epoch takes
at least ``t_io``.  ``max(t_comp, t_io) + t_copy`` is consistent there, but
it adds the hand-over to the I/O, and here the two overlap: the program
copies step k + 1 while the background thread writes step k (numpy's copy
and the writes release the GIL).  The program and the background thread are
the two stages of a pipeline, and an epoch is the longer stage
(:func:`async_epoch`; docs/performance.md, "The hand-over in the model").

* ``t_io = bytes / rate``, the rate fitted to the measured history of
  steps (:mod:`lamina.perf.history`, the machinery the derived-quantity
  model uses too): ``rate = c0 + c1 x1 + c2 x2`` with ``x = (bytes,
  ranks)`` (linear) and with ``x = (log bytes, log ranks)`` (linear-log),
  by least absolute deviations (a few slow steps do not drag the line);
  the fit with the smaller error is used, and its ``r^2`` is reported.
  With fewer than :data:`~lamina.perf.history.MIN_FIT` samples the rate is
  their median.  Two series: steps written while the program computes
  (series ``async.io``, the background thread's) and steps written while
  the program waits for them (series ``sync.io``: ``io='auto'``'s
  synchronous steps).  They differ where no core is spare: a step written
  beside the program's next copies and calls takes longer than one written
  alone.  ``t_sync`` takes ``t_io`` from
  ``sync.io``, ``t_async`` from ``async.io``, each from the other series
  while it has no samples of its own.  Where a series holds at least 3
  steps of the same rank count within a factor
  :data:`~lamina.perf.history.LOCAL_SPAN` of the step's size (a run again,
  the usual case), their median rate (the newest
  :data:`~lamina.perf.history.LOCAL_MAX`) predicts instead of the fit to
  every step, which a history of many sizes and conditions bends away from
  any one of them (fit kind ``local``;
  :meth:`~lamina.perf.history.History.local_rate`).  Steps of this run
  like the one asked (one is enough) come before all of these (fit kind
  ``run``): the history holds other runs' steps, written when the machine
  may have been busier or quieter, and a series the run no longer writes
  (the mode ``io='auto'`` does not pick) would otherwise keep what those
  runs measured for good.
* ``t_copy = bytes / copy rate``, the median rate of the copies measured at
  put (series ``async.copy``: one sample per step, its copies together),
  into buffers reused from earlier steps: the copies of the first steps go
  into new memory and pay a page fault per page (about 5x slower here),
  once; counted in the rate they kept ``io='auto'`` from choosing the
  background, and its direct steps copy nothing, so the rate never learned
  better.  A step without any reused buffer after the pool has had
  buffers back samples its copies into new memory (the layer's ``Step.copy_sample``).
  That is the copy alone: ``t_copy`` is the step's hand-over as measured, the
  program's time in the step's calls (its copies, the calls' own work and, under
  ``io='auto'``, the decision and its agreements; not its waits for the budget or in
  ``end_step``'s first agreement with the other ranks, which steps still being written
  cause), series ``async.submit.copied``, one
  sample per step whose copies all went into reused buffers (or all into new ones
  once the pool has served, as for the copies) and that was opened and ended while
  no step was being written (a write beside the calls slows them, and then ``t_io``
  bounds the epoch), by the bytes the step copied: this run's steps that copied about
  as many bytes as the step asked (one is enough), else the history's (three), else
  the copy rate.  A step of arrays lent with ``copy=False`` copies nothing: its calls are
  its hand-over, kept apart (series ``async.submit.lent``, by the bytes it lent) and
  predicting only steps that copy nothing (:meth:`AsyncModel.lent_seconds`).  Counted
  with the copies' samples by all their bytes, lent steps of 32 MiB handed over in
  0.12-0.16 ms predicted a copy of 64 MiB at 0.3 ms where the copy rate said 17 ms.
* ``t_comp``: a weighted average of past compute phases (weights halving
  with each older phase), measured as the time between two ``end_step``
  returns minus the time spent inside lamina calls.

Before the history holds a step (a new machine), a model given this
machine's calibration (:mod:`lamina.perf.calibrate`, the derived-quantity
model's) takes ``t_io`` from its write table, the step's bytes written by
one process (ranks on one node share its memory and storage), and
``t_copy`` from its memcpy rate (fit kind ``calibration``); without one,
:data:`DEFAULT_IO_RATE` and :data:`DEFAULT_COPY_RATE`.  ``io='auto'``
builds its model without the calibration: with no history it writes its
first steps in the background to measure them.

The history persists per machine (:func:`lamina.perf.history.default_path`),
like the calibration of the derived-quantity model: a new run starts from
what the last runs measured on this host.  ``io='auto'`` picks, per step, the mode
with the smaller predicted epoch (:meth:`AsyncModel.predict`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..catalog.wire import load_json
from ..errors import FormatError
from .calibrate import Calibration, block_time
from .history import (
    LOCAL_MAX,
    Fit,
    History,
    default_path,
    fit_rate,
    load_history,
    median,
    save_history,
    save_history_soon,
)

#: the series of the history this model fits and keeps: steps written in the background,
#: steps written while the program waited for them, and the copies made at put
IO_SERIES = "async.io"
SYNC_IO_SERIES = "sync.io"
COPY_SERIES = "async.copy"
#: the program's time in the calls of a step handed to the background that copied (its copies
#: and the calls' own work, not its waits for the budget or the other ranks): one sample per
#: step, by the bytes it copied.  Earlier versions kept series ``async.submit``, where a step of
#: arrays lent with copy=False counted with all its bytes as if copied: it is not read
SUBMIT_SERIES = "async.submit.copied"
#: the same for a step that copied nothing (its arrays lent with copy=False), by the bytes lent
LENT_SERIES = "async.submit.lent"
#: largest record of decisions read back
MAX_DECISIONS_BYTES = 1 << 20

#: weight of a compute phase relative to the next newer one
DECAY = 0.5
#: copy rate assumed before any copy was measured (bytes/s)
DEFAULT_COPY_RATE = 2e9
#: I/O rate assumed before any step was measured (bytes/s): async is tried first
DEFAULT_IO_RATE = 5e8
#: a step this many times larger than any the history holds is predicted as on a new machine
BEYOND = 16


@dataclass
class Prediction:
    """The model's epoch times for one step (seconds) and the mode it picks."""

    nbytes: int
    ranks: int
    t_io: float
    t_copy: float
    t_comp: float
    t_sync: float
    t_async: float
    mode: str
    fit: str
    r2: float
    t_io_sync: float = math.nan  # t_io of a step written while the program waits (t_sync's)

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in _PREDICTION_FIELDS}


_PREDICTION_FIELDS = tuple(f.name for f in fields(Prediction))

#: the extension record where a writer under io='auto' keeps its decisions (rank 0's): the
#: first of them, and how many records hold them all (:func:`decisions_key`)
DECISIONS_KEY = "lamina.io.decisions"
#: decisions a writer keeps in ``io_stats``: the last ones (the file keeps every one; files of
#: earlier versions kept these only)
DECISIONS_KEPT = 64
#: a record of decisions holds rows up to about this many bytes, then the next record begins
DECISIONS_PART_BYTES = 256 << 10
#: fields of a decision kept in the file, in this order
DECISION_FIELDS = (
    "step",
    "mode",
    "predicted",
    "nbytes",
    "ranks",
    "t_io",
    "t_copy",
    "t_comp",
    "t_sync",
    "t_async",
    "fit",
    "r2",
    "t_io_measured",
    "t_comp_measured",
    "epoch_measured",
    "t_io_sync",
    "t_sync_ranks",
    "t_async_ranks",
    "probe",
)


def decisions_key(part: int) -> str:
    """The extension record of part *part* of a writer's decisions: :data:`DECISIONS_KEY`, then
    ``lamina.io.decisions.1``, ``.2``, ..."""
    return DECISIONS_KEY if part == 0 else f"{DECISIONS_KEY}.{part}"


def _value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return round(v, 6) if isinstance(v, float) else v


def decision_row(d: dict[str, Any]) -> str:
    """One decision as the JSON list of its :data:`DECISION_FIELDS` (missing ones: null; NaN:
    null): what a writer keeps of it once it is measured, until close (some 250 bytes)."""
    return json.dumps([_value(d.get(k)) for k in DECISION_FIELDS])


def _groups(rows: Sequence[str]) -> list[list[str]]:
    """*rows* in groups of about :data:`DECISIONS_PART_BYTES` at most (one row at least; one
    group, empty, for no rows)."""
    groups: list[list[str]] = [[]]
    size = 0
    for r in rows:
        if groups[-1] and size + len(r) > DECISIONS_PART_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(r)
        size += len(r) + 1
    return groups


_FIELDS_JSON = json.dumps(list(DECISION_FIELDS))


def _record(rows: Sequence[str], tail: str = "") -> bytes:
    return f'{{"fields": {_FIELDS_JSON}, "decisions": [{", ".join(rows)}]{tail}}}'.encode()


def encode_decision_rows(rows: Sequence[str]) -> list[bytes]:
    """The records that hold the decisions *rows* (:func:`decision_row`), in order, each of
    about :data:`DECISIONS_PART_BYTES` at most (one row at least): the JSON ``{"fields": [...],
    "decisions": [rows]}``, the first with ``"parts"``, the number of records (at least one,
    none of them empty unless there are no rows).  What a writer of the previous version
    wrote at its close (writers now hand records down with their steps,
    :func:`encode_decision_parts`): kept to make such files, which still read."""
    groups = _groups(rows)
    return [_record(g, f', "parts": {len(groups)}' if i == 0 else "") for i, g in enumerate(groups)]


def encode_decision_parts(rows: Sequence[str], run: int) -> list[bytes]:
    """Records ``lamina.io.decisions.<k>`` of the decisions *rows* that a writer hands down with
    a step, while it runs: as :func:`encode_decision_rows` makes its records after the first,
    each with ``"run"``, the first step the writer wrote (what tells its records from those
    an earlier writer of the file left, :func:`read_decisions`)."""
    return [_record(g, f', "run": {int(run)}') for g in _groups(rows) if g]


def decisions_head(run: int, parts: int | None = None) -> bytes:
    """Record ``lamina.io.decisions`` of a writer that hands its decisions down with its steps
    (:func:`encode_decision_parts`), which holds none itself: while it runs (*parts* None), the
    first step it wrote; at its close, the number of records, this one included."""
    return _record([], f', "parts": {int(parts)}' if parts is not None else f', "run": {int(run)}')


def encode_decisions(decisions: Sequence[dict[str, Any]]) -> list[bytes]:
    """The records that hold *decisions* (:func:`encode_decision_rows`)."""
    return encode_decision_rows([decision_row(d) for d in decisions])


def _decode(raw: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = load_json(raw, "io decisions", limit=MAX_DECISIONS_BYTES, constants=False)
    if not isinstance(doc, dict) or not isinstance(doc.get("fields"), list):
        raise FormatError("io decisions: not a record of decisions")
    names, rows = doc["fields"], doc.get("decisions")
    if not all(isinstance(n, str) for n in names) or not isinstance(rows, list):
        raise FormatError("io decisions: bad field names or rows")
    out = []
    for r in rows:
        if not isinstance(r, list) or len(r) != len(names):
            raise FormatError(
                f"io decisions: a row of {len(r) if isinstance(r, list) else '?'} values"
            )
        out.append(dict(zip(names, r, strict=True)))
    return doc, out


def decode_decisions(raw: bytes) -> list[dict[str, Any]]:
    """The decisions of one record (:func:`encode_decision_rows`, or the one record of a
    file of an earlier version); FormatError if it is not that."""
    return _decode(raw)[1]


def read_decisions(ext: Mapping[str, bytes]) -> tuple[list[dict[str, Any]], bool] | None:
    """The decisions a file's extension records *ext* hold, in order, and whether they are
    every decision of the run; None without any.  Not every one: a file of an earlier
    version holds the run's last :data:`DECISIONS_KEPT` (where it holds that many, the run
    may have had more), and a writer that stopped without closing the file (killed) handed
    down those of the steps it committed (:func:`decisions_unfinished`).  FormatError for a
    record that is not one, or a part missing."""
    raw = ext.get(DECISIONS_KEY)
    if raw is None:
        return None
    doc, out = _decode(raw)
    if "parts" not in doc:
        run = doc.get("run")
        if run is None:  # one record of the last decisions (files of earlier versions)
            return out, len(out) < DECISIONS_KEPT
        # a writer that did not close: its records, up to the first missing or one another
        # writer of the file left (their rows are of steps before this writer's)
        k = 1
        while (part := ext.get(decisions_key(k))) is not None:
            more, rows = _decode(part)
            if more.get("run") != run:
                break
            out += rows
            k += 1
        return out, False
    n = doc["parts"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:  # a part missing stops the loop
        raise FormatError(f"io decisions: {n!r} records is not a number of records")
    for i in range(1, n):
        part = ext.get(decisions_key(i))
        if part is None:
            raise FormatError(f"io decisions: record {i} of {n} is missing")
        out += decode_decisions(part)
    return out, True


def decisions_unfinished(ext: Mapping[str, bytes]) -> bool:
    """Whether the decisions in *ext* are those a writer handed down with its steps and did not
    close the file after (killed, or its close failed): the decisions of its last steps are
    not in it.  False where there are none, or for a record that is not one."""
    raw = ext.get(DECISIONS_KEY)
    if raw is None:
        return False
    try:
        doc, _ = _decode(raw)
    except FormatError:
        return False
    return "parts" not in doc and doc.get("run") is not None


def async_epoch(t_comp: float, t_io: float, t_copy: float) -> float:
    """An epoch in the background: the longer of the program's stage (compute, then the
    step's hand-over) and the background thread's (the step's I/O), which overlap."""
    return max(t_comp + t_copy, t_io)


class AsyncModel:
    """The epoch model (module docstring) over a :class:`History` and this run's compute phases."""

    def __init__(
        self, history: History | None = None, calibration: Calibration | None = None
    ) -> None:
        self.history = history or History()
        self.calibration = calibration  # what a step costs before the history has one
        self.compute: list[float] = []  # compute phases of this run, oldest first
        self.run = History()  # the steps this run wrote (also in the history), never saved

    # -- measurements ---------------------------------------------------------------
    def add_io(
        self, nbytes: int, ranks: int, seconds: float, waited: bool = False, run: bool = True
    ) -> None:
        """A step of *nbytes* (all ranks) written in *seconds*; *waited*: while the program
        waited for it (a synchronous step), else in the background; *run*: one of this run's
        own samples too (:attr:`run`), not only the history's."""
        name = SYNC_IO_SERIES if waited else IO_SERIES
        self.history.add(name, nbytes, ranks, seconds)
        if run:
            self.run.add(name, nbytes, ranks, seconds)

    def add_copy(self, nbytes: int, seconds: float) -> None:
        if nbytes >= 1 << 16:  # small copies measure call overhead, not a rate
            self.history.add(COPY_SERIES, nbytes, 1, seconds)

    def add_submit(self, nbytes: int, seconds: float, lent: bool = False) -> None:
        """A step that copied *nbytes* (this rank's) handed to the background in *seconds*
        of the program's time in its calls (module docstring, ``t_copy``); *lent*: a step
        that copied nothing, *nbytes* the bytes of the arrays it lent (``copy=False``)."""
        if nbytes >= 1 << 16:
            name = LENT_SERIES if lent else SUBMIT_SERIES
            self.history.add(name, nbytes, 1, seconds)
            self.run.add(name, nbytes, 1, seconds)

    def add_compute(self, seconds: float) -> None:
        if seconds >= 0 and math.isfinite(seconds):
            self.compute.append(float(seconds))
            del self.compute[:-64]

    # -- the model --------------------------------------------------------------------
    @property
    def fit(self) -> Fit:
        """The rate of steps written in the background (the synchronous ones' without samples)."""
        return self._fit(IO_SERIES, SYNC_IO_SERIES)

    def _fit(self, series: str, other: str) -> Fit:
        return self.history.fit(self._series(series, other))

    def _series(self, series: str, other: str) -> str:
        """*series*, or *other* while *series* has no samples."""
        return series if self.history.samples(series) else other

    def copy_rate(self) -> float:
        """Bytes copied per second at put: the history's median, else the calibration's memcpy
        (which counts the bytes read and written), else :data:`DEFAULT_COPY_RATE`."""
        r = self.history.median_rate(COPY_SERIES)
        if r is not None:
            return r
        if self.calibration is not None:
            return self.calibration.memcpy_bandwidth / 2
        return DEFAULT_COPY_RATE

    def submit_rate(self, nbytes: int) -> float:
        """Bytes per second of the program's hand-over of a step that copies *nbytes* per
        rank: this run's steps that copied about that many (one is enough), else the
        history's (three), else :meth:`copy_rate` (the copies alone: a lower bound)."""
        for h, least in ((self.run, 1), (self.history, 3)):
            r = h.local_rate(SUBMIT_SERIES, nbytes, 1, least=least)
            if r is not None:
                return r
        return self.copy_rate()

    def lent_seconds(self, nbytes: int) -> float:
        """Seconds of the program's hand-over of a step that copies nothing and lends
        *nbytes* per rank (``copy=False``): this run's such steps of about that size (one is
        enough), else the history's (three), else the median of the history's newest lent
        steps of any size (their calls' own work hardly depends on the bytes), else 0 (not
        measured yet: the calls, no copy)."""
        for h, least in ((self.run, 1), (self.history, 3)):
            r = h.local_rate(LENT_SERIES, nbytes, 1, least=least)
            if r is not None:
                return nbytes / r
        got = self.history.samples(LENT_SERIES)[-LOCAL_MAX:]
        return median([t for _, _, t in got]) if got else 0.0

    def t_comp(self) -> float:
        """Weighted average of this run's compute phases (the newest weighs most); 0 before any."""
        c = self.compute
        if not c:
            return 0.0
        w = DECAY ** np.arange(len(c) - 1, -1, -1, dtype=np.float64)
        return float(np.dot(w, c) / w.sum())

    def _io_rate(self, series: str, other: str, nbytes: int, ranks: int) -> tuple[float, Fit]:
        """The rate of *series* (of *other* while it has no samples) for a step of *nbytes*:
        this run's steps of that size and rank count where it wrote some (kind ``run``), else
        the history's where it has enough of them (a run again, the usual case: ``local``),
        else the fit to every step; with the fit used."""
        own = self.run.local_rate(series, nbytes, ranks, least=1)
        if own is not None:
            return own, Fit("run", (), math.nan, len(self.run.samples(series)))
        name = self._series(series, other)
        if self.calibration is not None and not self.history.samples(name):
            return self._unmeasured_rate(nbytes), Fit("calibration", (), math.nan, 0)
        local = self.history.local_rate(name, nbytes, ranks)
        if local is not None:
            return local, Fit("local", (), math.nan, len(self.history.samples(name)))
        fit = self.history.fit(name)
        if fit.kind != "none" and nbytes > BEYOND * fit.hi[0]:
            # no step the history holds comes near this one: the rate at its edge (of steps
            # whose fixed costs outweigh their bytes) would predict a step of 64 MiB from
            # steps of 500 bytes at 1 MB/s (52 s); what a new machine is told instead, but
            # never less time than the step at the edge takes (a slow history's 16 MiB took
            # 1.4 s, and 16.1 MiB 34 ms: io='auto' turned at the edge)
            edge = BEYOND * fit.hi[0]
            least = edge / fit.rate(edge, ranks, DEFAULT_IO_RATE)
            rate = min(self._unmeasured_rate(nbytes), nbytes / max(least, 1e-12))
            return rate, Fit("beyond", (), math.nan, fit.samples)
        return fit.rate(nbytes, ranks, DEFAULT_IO_RATE), fit

    def _unmeasured_rate(self, nbytes: int) -> float:
        """The write rate of a step of *nbytes* the history says nothing of: the calibration's,
        else :data:`DEFAULT_IO_RATE`."""
        if self.calibration is None:
            return DEFAULT_IO_RATE
        t = block_time(self.calibration, "write", nbytes)
        if t is None:
            t = nbytes / self.calibration.write_bandwidth
        return nbytes / max(t, 1e-12)

    def predict(
        self, nbytes: int, ranks: int, t_comp: float | None = None, copied: int | None = None
    ) -> Prediction:
        """Epoch times of a step of *nbytes* bytes (all ranks together) written by *ranks*
        ranks, of which it copies *copied* at put (all ranks together; default all of them:
        a step of arrays lent with ``copy=False`` copies none, its hand-over is its calls)."""
        rate, fit = self._io_rate(IO_SERIES, SYNC_IO_SERIES, nbytes, ranks)
        t_io = nbytes / rate
        rate_sync, _ = self._io_rate(SYNC_IO_SERIES, IO_SERIES, nbytes, ranks)
        t_io_sync = nbytes / rate_sync
        share = nbytes / ranks  # each rank hands over its share, at once
        copies = share if copied is None else max(copied, 0) / ranks
        if copies > 0:
            t_copy = copies / self.submit_rate(int(copies))
        else:
            t_copy = self.lent_seconds(int(share))
        comp = self.t_comp() if t_comp is None else t_comp
        t_sync = t_io_sync + comp
        t_async = async_epoch(comp, t_io, t_copy)
        return Prediction(
            nbytes,
            ranks,
            t_io,
            t_copy,
            comp,
            t_sync,
            t_async,
            "async" if t_async < t_sync else "sync",
            fit.kind,
            fit.r2,
            t_io_sync,
        )


__all__ = [
    "DECISIONS_KEPT",
    "DECISIONS_KEY",
    "DECISIONS_PART_BYTES",
    "AsyncModel",
    "COPY_SERIES",
    "LENT_SERIES",
    "SUBMIT_SERIES",
    "async_epoch",
    "IO_SERIES",
    "SYNC_IO_SERIES",
    "decision_row",
    "decisions_head",
    "decisions_key",
    "decisions_unfinished",
    "decode_decisions",
    "encode_decision_parts",
    "encode_decision_rows",
    "encode_decisions",
    "read_decisions",
    "Fit",
    "History",
    "Prediction",
    "default_path",
    "fit_rate",
    "load_history",
    "save_history",
    "save_history_soon",
]
