"""Measured history: the one machinery both cost models fit their rates to.

lamina times what it does while it runs (a background step's write, a
transactional copy, the computing of a derived quantity at the end of a
step, its recomputation at a read, the engine's write and read of a step)
and keeps each as a *sample* of a named *series*: ``(x1, x2, seconds)``,
where ``x1`` is the amount of work (bytes or elements) and ``x2`` the
second variable the rate depends on: the number of ranks for background
I/O, the size of a block for everything done block by block (per-block
overheads, page faults of fresh blocks, threads that only start on large
blocks all make the rate a function of the block size).

:func:`fit_rate` fits ``rate = x1 / seconds`` to a series, linear in
``(x1, x2)`` and linear in ``(log x1, log x2)`` (a variable that varies
less than :data:`SPREAD`-fold over the samples is left out), by least
absolute deviations: the fitted line passes through the bulk of the
samples, and a few slow ones (a write that met the page cache flushing, a
step beside a burst of other work: 3-7x slower here, a third of the
writes in some runs) do not drag it, where least squares gave them the
weight of their square and could bend the line below zero.  Of the median
rate and the fits, the one with the smallest absolute error per degree of
freedom is used (a form with more coefficients must fit better by more
than its coefficients take up of noise) and its ``r^2`` over every sample
reported (0 for the median; a fit that leaves slow samples aside can
score a little below it); with fewer than :data:`MIN_FIT` samples, or
where no variable varies, the rate is their median.  A line is not
extrapolated: beyond the sampled range of a variable the rate is the one
at the range's edge.  A prediction is ``x1 / rate``, the rate kept above a
quarter of the slowest rate measured.  A third form, ``per-block``, fits
a cost per unit and a cost per block, ``seconds / x1 = c0 + c1 / x2``
(both >= 0), to the same samples and competes on the same error: it is
what block-by-block work costs, and unlike a line in ``x2`` it
extrapolates to smaller blocks.

Where a series holds at least :data:`MIN_FIT` samples close to the one
predicted (``x1`` within a factor :data:`LOCAL_SPAN`, ``x2`` within
:data:`LOCAL_X2` of it: a run again, the usual case), the median rate of
the newest :data:`LOCAL_MAX` of them predicts instead of the fit to the
whole series, which a history of many sizes and conditions bends away
from any one of them (:meth:`History.local_rate`).

The samples persist per machine (:func:`default_path`), like the
calibration: a run starts from what earlier runs measured on this host, and
what it measures is merged into the file when the process exits
(:func:`save_history_soon`; :func:`save_history` at once), appended to what
other runs saved meanwhile: a save reads, merges and replaces the file
holding a lock on ``<file>.lock`` (``fcntl.flock``; waited for at most
:data:`LOCK_WAIT` seconds, and where a file system has no locks the save
goes on without; the lock file is removed as the save ends), so that
processes saving together lose none of each other's samples.  The file keeps, per series, when a save last added to
it; beyond :data:`MAX_SERIES` series the least recently added are left
out, never one a save is adding.

A sample is usable only within physical bounds (:func:`_usable`: ``x1``
and ``x2`` at most :data:`MAX_AMOUNT`, ``seconds`` at most
:data:`MAX_SECONDS`, the rate ``x1 / seconds`` in [:data:`MIN_RATE`,
:data:`MAX_RATE`]): anything else is no measurement and would make a
prediction 0, infinite or NaN.  A file's unusable samples and series are
left out one by one, and a file that cannot be read at all (damaged, too
long, not a history) is ignored, each with a
:class:`~lamina.errors.LaminaWarning` (once per file); the next save
writes the samples kept.  A file of an earlier version is ignored quietly
(measured again here, replaced at the next save); one of a newer version,
a newer lamina's, is neither read nor replaced (two lamina versions may
share one home directory), with one LaminaWarning naming it
(:func:`~lamina.perf.calibrate.newer_file`).  Hosts that share the path (a home directory the
nodes of a cluster share, the default place) each keep their part, side by
side under the host name: the host that saved last at the top (a file of one
host, as written before several were kept, is that host's part), the others
under ``others``; a save replaces this host's part and keeps the others',
at most :data:`~lamina.perf.calibrate.MAX_HOSTS` hosts and
:data:`MAX_FILE_BYTES` in all, the hosts least recently added to left out
first.  A path that names something
other than a regular file (a device, a FIFO, a directory) is neither read
nor replaced, with one warning per process (none for the null device:
``LAMINA_HISTORY=/dev/null`` keeps no history); a symbolic link's file is
written, the link kept.
The series in use:

=========================  ==========================  ==========================
series                     x1                          x2
=========================  ==========================  ==========================
``async.io``               bytes of a step, all ranks  ranks
``async.copy``             bytes copied at put         1
``derive.<strategy>.<e>``  elements computed at the    elements per block
                           end of a step (store/stats)
``compute.<e>``            elements recomputed at a    elements per block
                           read (stats/expression)
``write``                  bytes of a step (engine)    bytes per block
``read``                   bytes read (engine)         bytes per block
``query.<strategy>``       elements a query read, its  elements per unit (block)
                           time besides the reads
                           (``query``: no derived
                           quantity, or several
                           strategies, judged)
=========================  ==========================  ==========================

``<e>`` is :func:`signature`: the expression with its inputs numbered, and
the input dtype, so that ``magnitude(u, v, w)`` learns from
``magnitude(vx, vy, vz)``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..catalog.wire import load_json
from ..errors import FormatError, LaminaWarning
from .calibrate import (
    LOCK_WAIT,  # noqa: F401 - named here (the module's description)
    MAX_HOSTS,  # noqa: F401 - named here (to_json)
    NotRegularFile,
    cache_path,
    finite_number,
    host,
    locked,
    newer_file,
    newer_version,
    not_kept,
    others_of,
    read_cache_file,
    with_others,
    writable_path,
    write_cache_file,
)

#: bumped when what the history holds changes: older files are ignored
HISTORY_VERSION = 2
#: most samples kept per series (the newest)
MAX_SAMPLES = 256
#: most series kept (the most recently added to)
MAX_SERIES = 256
#: samples needed before a regression is fitted
MIN_FIT = 3
#: largest history file read
MAX_FILE_BYTES = 4 << 20
#: a prediction's rate is kept above this fraction of the slowest measured rate
FLOOR = 0.25
#: a variable enters a fit only if its largest sample is at least this times its smallest
SPREAD = 1.5
#: samples with x1 within this factor and x2 within LOCAL_X2 (relative) of a prediction's
#: predict it by their median rate (the newest LOCAL_MAX of them) instead of the fit
LOCAL_SPAN = 2.0
LOCAL_X2 = 0.1
LOCAL_MAX = 32
#: iterations of the least-absolute-deviations fit (reweighted least squares) at most
LAD_ITERATIONS = 10
#: a series is fitted again once the samples added since its fit are 1/REFIT of it (every
#: sample while it is short; every 16th of a full series)
REFIT = 16
#: bounds of a usable sample: x1 and x2 at most MAX_AMOUNT (an exabyte; elements, ranks),
#: seconds at most MAX_SECONDS, the rate x1 / seconds within [MIN_RATE, MAX_RATE]
MAX_AMOUNT = 1e18
MAX_SECONDS = 1e9
MIN_RATE = 1e-6
MAX_RATE = 1e18
#: the file in words
WHAT = "measured history"

Sample = tuple[float, float, float]


def default_path() -> str:
    """``$LAMINA_HISTORY``, else ``$XDG_CACHE_HOME/lamina/history.json`` (default ``~/.cache``)."""
    return cache_path("LAMINA_HISTORY", "history.json")


@dataclass
class Fit:
    """A fitted rate: ``kind`` 'linear', 'linear-log', 'per-block', 'median' or 'none'; ``r2``
    of the fit (on the rate, whatever the form); ``lo``/``hi`` the sampled range of
    ``(x1, x2)``, beyond which a line is not extrapolated."""

    kind: str
    coef: tuple[float, ...] = ()
    r2: float = float("nan")
    samples: int = 0
    floor: float = 0.0  # FLOOR x the slowest rate measured
    lo: tuple[float, float] = (0.0, 0.0)
    hi: tuple[float, float] = (math.inf, math.inf)

    def rate(self, x1: float, x2: float, default: float = math.nan) -> float:
        """The rate (x1 per second) at ``(x1, x2)``; *default* without samples."""
        if self.kind == "per-block":  # seconds per x1 = c0 + c1 / x2
            per = self.coef[0] + self.coef[1] / max(x2, 1.0)
            return max(1.0 / per, self.floor) if per > 0 else self.floor
        if self.kind == "median":
            return self.coef[0]
        if self.kind not in ("linear", "linear-log"):
            return default
        x1 = min(max(x1, self.lo[0]), self.hi[0])  # the rate at the edge beyond the samples
        x2 = min(max(x2, self.lo[1]), self.hi[1])
        if self.kind == "linear":
            x = (1.0, x1, x2)
        else:
            x = (1.0, math.log(max(x1, 1.0)), math.log(max(x2, 1.0)))
        r = sum(c * v for c, v in zip(self.coef, x, strict=True))
        return max(r, self.floor)

    def seconds(self, x1: float, x2: float) -> float | None:
        """Predicted seconds for *x1* at *x2*; None without samples."""
        if self.kind == "none":
            return None
        return x1 / self.rate(x1, x2) if x1 > 0 else 0.0


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence, as ``statistics.median`` gives it (that module imports
    fractions, decimal and random: 5 ms of every process's start)."""
    r = sorted(values)
    k = len(r) // 2
    return r[k] if len(r) % 2 else (r[k - 1] + r[k]) / 2


def _median(values: np.ndarray) -> float:
    """The median of a non-empty 1-D array (``np.median``'s first call imports numpy.ma)."""
    r = np.sort(values)
    k = len(r) // 2
    return float(r[k] if len(r) % 2 else 0.5 * (r[k - 1] + r[k]))


def _lad(design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least absolute deviations: the coefficients minimizing ``sum |y - design @ c|``, by
    iteratively reweighted least squares from the least-squares solution (the columns
    scaled to at most 1, each step's normal equations solved: a fit of 256 samples in about
    a millisecond)."""
    scale = np.abs(design).max(axis=0)
    scale[scale == 0] = 1.0
    d = design / scale
    sol = np.linalg.lstsq(d, y, rcond=None)[0]
    # residuals below this count as this: no weight without bound on a sample fitted exactly
    tiny = 1e-9 * max(float(np.abs(y).max()), 1e-300)
    for _ in range(LAD_ITERATIONS):
        w = 1.0 / np.maximum(np.abs(y - d @ sol), tiny)
        dw = d.T * w
        try:
            new = np.linalg.solve(dw @ d, dw @ y)
        except np.linalg.LinAlgError:
            break
        done = np.allclose(new, sol, rtol=1e-6, atol=0.0)
        sol = new
        if done:
            break
    return sol / scale


def fit_rate(samples: list[Sample]) -> Fit:
    """The rate ``x1 / seconds`` as a function of ``(x1, x2)``: the median, or the per-block,
    linear or linear-log least-absolute-deviations fit, whichever has the smallest absolute
    error of the rate per degree of freedom (module docstring)."""
    if not samples:
        return Fit("none")
    a = np.asarray(samples, dtype=np.float64)
    x1, x2, secs = a[:, 0], a[:, 1], a[:, 2]
    rate = x1 / secs
    floor = FLOOR * float(rate.min())
    lo = (float(x1.min()), float(x2.min()))
    hi = (float(x1.max()), float(x2.max()))
    med = _median(rate)
    best = Fit("median", (med,), float("nan"), len(samples), floor, lo, hi)
    if len(samples) < MIN_FIT:
        return best
    mean = float(rate.mean())
    ss_tot = float(((rate - mean) ** 2).sum())

    def r2_of(fitted: np.ndarray) -> float:
        """r^2 of *fitted*: 1 where every rate is the same, 0 where it is not defined."""
        if not ss_tot > 0:
            return 1.0 if ss_tot == 0 else 0.0
        r2 = 1.0 - float(((fitted - rate) ** 2).sum()) / ss_tot
        return r2 if math.isfinite(r2) else 0.0

    best.r2 = 1.0 if ss_tot == 0 else 0.0  # the median explains nothing of the variation
    n = len(samples)

    def error(fitted: np.ndarray, params: int) -> float:
        """Absolute error of the rate per degree of freedom: a form with more coefficients
        must fit better by more than what its coefficients take up of noise."""
        return float(np.abs(fitted - rate).sum()) / (n - params) if n > params else math.inf

    err = error(np.full_like(rate, med), 1)
    tie = 1e-9 * med  # errors apart by less are rounding: the form tried first keeps it
    if err <= 0:
        return best
    # a variable that hardly varies over the samples says nothing about the rate: fitted
    # anyway it would tilt the plane at random and throw predictions elsewhere far off
    keep = [float(x.max()) >= SPREAD * float(x.min()) for x in (x1, x2)]
    if not any(keep):
        return best
    # first, so that it wins a tie: a cost per unit and one per block, secs / x1 = c0 + c1 / x2
    if keep[1]:
        design = np.column_stack([np.ones_like(x2), 1.0 / x2])
        sol = _lad(design, secs / x1)
        if sol[0] > 0 and sol[1] >= 0:  # only costs that cannot be negative
            fitted = 1.0 / (design @ sol)
            e = error(fitted, 2)
            if e < err * (1 - 1e-9) - tie:
                err = e
                pb = (float(sol[0]), float(sol[1]))
                best = Fit("per-block", pb, r2_of(fitted), n, floor, lo, hi)
    for kind, u, v in (("linear", x1, x2), ("linear-log", np.log(x1), np.log(x2))):
        cols = [c for c, k in zip((u, v), keep, strict=True) if k]
        design = np.column_stack([np.ones_like(u), *cols])
        sol = _lad(design, rate)
        fitted = np.maximum(design @ sol, floor)
        e = error(fitted, design.shape[1])
        if e < err * (1 - 1e-9) - tie:
            err = e
            it = iter(sol[1:])
            line = (float(sol[0]), *(float(next(it)) if k else 0.0 for k in keep))
            best = Fit(kind, line, r2_of(fitted), n, floor, lo, hi)
    return best


@dataclass
class History:
    """Samples per series, those measured by this run (``added``) kept apart for saving."""

    series: dict[str, list[Sample]] = field(default_factory=dict)
    added: dict[str, list[Sample]] = field(default_factory=dict)
    _fits: dict[str, Fit] = field(default_factory=dict, repr=False, compare=False)
    _medians: dict[str, float] = field(default_factory=dict, repr=False, compare=False)
    #: samples added to each series since its fit: a long series is fitted again only once
    #: enough new samples could move it (REFIT), not at every step of a run
    _stale: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    #: (path, inode, size, mtime) of the file this history was loaded from or saved to:
    #: while the file still has it, saving need not read the file again
    stamp: tuple | None = field(default=None, repr=False, compare=False)

    #: per series, when a save last added samples to it (Unix time; 0: not known): beyond
    #: MAX_SERIES series, the least recently added are left out
    used: dict[str, float] = field(default_factory=dict)
    #: samples and series of the file this history was read from that were left out
    dropped: int = field(default=0, repr=False, compare=False)

    def add(self, name: str, x1: float, x2: float, seconds: float) -> None:
        """Record one measurement (ignored unless usable: :func:`_usable`)."""
        s = _sample(x1, x2, seconds)
        if s is None:
            return
        for d in (self.series, self.added):
            lst = d.setdefault(name, [])
            lst.append(s)
            del lst[:-MAX_SAMPLES]
        stale = self._stale.get(name, 0) + 1
        if stale * REFIT >= len(self.series[name]):  # enough new samples to move the fit
            self._fits.pop(name, None)
            self._medians.pop(name, None)
            stale = 0
        self._stale[name] = stale

    def samples(self, name: str) -> list[Sample]:
        return self.series.get(name, [])

    def fit(self, name: str) -> Fit:
        f = self._fits.get(name)
        if f is None:
            f = self._fits[name] = fit_rate(self.samples(name))
        return f

    def median_rate(self, name: str) -> float | None:
        """The median of ``x1 / seconds`` over series *name*; None without samples."""
        m = self._medians.get(name)
        if m is None:
            got = self.samples(name)
            if not got:
                return None
            rates = np.fromiter((x1 / t for x1, _, t in got), np.float64, len(got))
            m = self._medians[name] = _median(rates)
        return m

    def local_rate(self, name: str, x1: float, x2: float, least: int = MIN_FIT) -> float | None:
        """The median rate of the newest :data:`LOCAL_MAX` samples of series *name* with
        ``x1`` within :data:`LOCAL_SPAN` of *x1* and ``x2`` within :data:`LOCAL_X2` of *x2*;
        None with fewer than *least* of them."""
        rates = []
        lo2, hi2 = x2 * (1.0 - LOCAL_X2), x2 * (1.0 + LOCAL_X2)
        for s1, s2, t in reversed(self.samples(name)):
            if lo2 <= s2 <= hi2 and x1 <= s1 * LOCAL_SPAN and s1 <= x1 * LOCAL_SPAN:
                rates.append(s1 / t)
                if len(rates) == LOCAL_MAX:
                    break
        if len(rates) < max(least, 1):
            return None
        return median(rates)  # np.median costs ~30 us here, at every end_step

    def seconds(self, name: str, x1: float, x2: float) -> float | None:
        """Predicted seconds of *x1* at *x2* from series *name*: the median rate of its samples
        close to ``(x1, x2)`` where it has enough of them (:meth:`local_rate`), else its fit;
        None if it has no samples."""
        if x1 <= 0:
            return 0.0 if self.samples(name) else None
        local = self.local_rate(name, x1, x2)
        return x1 / local if local is not None else self.fit(name).seconds(x1, x2)

    def merged(self, *others: History) -> History:
        """A new history with the samples of this one and *others* (none of them 'added')."""
        out = History()
        for h in (self, *others):
            _extend(out.series, h.series)
            for name, t in h.used.items():
                out.used[name] = max(t, out.used.get(name, 0.0))
        return out

    # -- persistence ------------------------------------------------------------------
    def _order(self, keep: Collection[str] = ()) -> list[str]:
        """The names of the series, the least recently added to first (those in *keep* last)."""
        return sorted(self.series, key=lambda n: (n in keep, self.used.get(n, 0.0), n))

    def evict(self, keep: Collection[str] = ()) -> int:
        """Leave out the least recently added series beyond :data:`MAX_SERIES` (never those in
        *keep*, unless they alone are more); how many were left out."""
        extra = len(self.series) - MAX_SERIES
        if extra <= 0:
            return 0
        for name in self._order(keep)[:extra]:
            for d in (self.series, self.used, self._fits, self._medians, self._stale):
                d.pop(name, None)
        return extra

    def to_json(self, others: Mapping[str, Any] | None = None) -> str:
        """This history as this host's part of a history file, with the parts of the other
        hosts *others* (host name -> part, as :func:`_parse` gives them) beside it: the most
        recently saved of them, :data:`MAX_HOSTS` hosts at most and the text within
        :data:`MAX_FILE_BYTES`."""
        return self._file_text(others or {})[0]

    def _file_text(self, others: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """:meth:`to_json`, and the parts of *others* it kept."""
        names = self._order()[-MAX_SERIES:]
        doc = {
            "version": HISTORY_VERSION,
            "host": host(),
            "series": {n: [list(s) for s in self.series[n][-MAX_SAMPLES:]] for n in names},
            "used": {n: self.used.get(n, 0.0) for n in names},
        }
        return with_others(doc, others, _saved, MAX_FILE_BYTES)

    @classmethod
    def from_json(cls, text: str | bytes) -> History:
        """This host's history in *text* (a history file), its unusable samples and series
        left out (counted in ``dropped``); FormatError unless it is a history of this
        version holding a part of this host."""
        h, _ = _parse(text)
        if h is None:
            raise _Elsewhere("history: measured on other hosts only")
        return h

    @classmethod
    def _of_part(cls, doc: dict) -> History:
        """The history of one host's part of a file (FormatError)."""
        series = doc.get("series")
        if not isinstance(series, dict):
            raise FormatError("history: 'series' must be a mapping")
        used = doc.get("used")
        if not isinstance(used, dict):
            used = {}  # a file written before the times were kept
        out = cls()
        now = time.time()
        for name, lst in series.items():
            if not isinstance(lst, list):
                out.dropped += 1
                continue
            got = [s for s in map(_sample_of, lst[-MAX_SAMPLES:]) if s is not None]
            out.dropped += min(len(lst), MAX_SAMPLES) - len(got)
            if got:
                out.series[name] = got
                t = finite_number(used.get(name))  # a time to come counts as now
                out.used[name] = 0.0 if t is None else min(max(t, 0.0), now)
        out.dropped += out.evict()
        return out


def _parse(text: str | bytes) -> tuple[History | None, dict[str, Any]]:
    """This host's history in the history file *text* (None where it holds none) and the
    other hosts' parts, as they are (host name -> ``{"series": ..., "used": ...}``).

    The host that saved last is at the top of the file (a file of one host, as lamina wrote
    before it kept several, is that host's alone), the others under ``others``.
    FormatError for text that is not a history; :class:`_Elsewhere` for one of another
    version.
    """
    doc = load_json(text, "history", limit=MAX_FILE_BYTES, constants=False)
    if not isinstance(doc, dict):
        raise FormatError("history: not a JSON object")
    newer = newer_version(doc, HISTORY_VERSION)
    if newer is not None:
        raise _Newer(newer)
    if doc.get("version") != HISTORY_VERSION:
        raise _Elsewhere("history: not a history of this version")
    me, top = host(), doc.get("host")
    parts = others_of(doc)
    if isinstance(top, str) and top:
        parts[top] = doc
    mine = parts.pop(me, None)
    others = {
        h: {"series": part["series"], "used": part.get("used", {})}
        for h, part in parts.items()
        if isinstance(h, str) and isinstance(part.get("series"), dict)
    }
    return (None if mine is None else History._of_part(mine)), others


def _saved(part: Any) -> float:
    """When a host's part of a history file was last added to (0 where it does not say)."""
    used = part.get("used") if isinstance(part, dict) else None
    times = [t for t in map(finite_number, used.values())] if isinstance(used, dict) else []
    return max((t for t in times if t is not None), default=0.0)


def pack_series(h: History, names: Sequence[str]) -> bytes:
    """The samples of the series *names* of *h* as bytes, for the other ranks of a job
    (:func:`unpack_series`): per series in that order, its number of samples (int64), then
    the samples (float64, three each).  Far cheaper than the JSON of a whole history (3 ms an
    open on 2 ranks for a history of 200 series)."""
    parts = []
    for name in names:
        got = np.asarray(h.series.get(name, ()), dtype=np.float64).reshape(-1, 3)
        parts += [np.int64(len(got)).tobytes(), got.tobytes()]
    return b"".join(parts)


def unpack_series(raw: bytes, names: Sequence[str]) -> History:
    """:func:`pack_series` back (the series *names*, in that order); FormatError if *raw* is
    not that (a count out of range, bytes left over, a sample :func:`_usable` refuses)."""
    out = History()
    pos = 0
    for name in names:
        if pos + 8 > len(raw):
            raise FormatError(f"history: series {name!r}: its count is missing")
        n = int(np.frombuffer(raw, np.int64, 1, pos)[0])
        pos += 8
        if not 0 <= n <= MAX_SAMPLES or pos + 24 * n > len(raw):
            raise FormatError(f"history: series {name!r}: {n} samples do not fit")
        got = np.frombuffer(raw, np.float64, 3 * n, pos).reshape(n, 3)
        pos += 24 * n
        if not _usable(*got.T).all():
            raise FormatError(f"history: series {name!r}: a sample is not usable")
        if n:
            out.series[name] = [(a, b, c) for a, b, c in got.tolist()]
    if pos != len(raw):
        raise FormatError(f"history: {len(raw) - pos} bytes after the series")
    return out


def _usable(x1: Any, x2: Any, t: Any) -> Any:
    """Whether samples are usable: 0 < x1 <= MAX_AMOUNT, 1 <= x2 <= MAX_AMOUNT,
    0 < seconds <= MAX_SECONDS and the rate x1 / seconds in [MIN_RATE, MAX_RATE] (NaN fails
    every comparison, inf the upper bounds); of numbers, or elementwise of arrays of them."""
    return (
        (0 < x1)
        & (x1 <= MAX_AMOUNT)
        & (1 <= x2)
        & (x2 <= MAX_AMOUNT)
        & (0 < t)
        & (t <= MAX_SECONDS)
        & (t * MIN_RATE <= x1)  # no division by 0, no overflow of unbounded numbers
        & (x1 / MAX_RATE <= t)
    )


def _sample(x1: Any, x2: Any, t: Any) -> Sample | None:
    """``(x1, x2, t)`` as a sample if it is a usable one (:func:`_usable`), else None."""
    try:
        s = (float(x1), float(x2), float(t))
    except (OverflowError, TypeError, ValueError):
        return None
    return s if _usable(*s) else None


def _sample_of(v: Any) -> Sample | None:
    """A sample as a file holds it, a list of three numbers (not bools, not strings), if it
    is a usable one, else None."""
    if type(v) is not list or len(v) != 3 or not all(type(x) in (int, float) for x in v):
        return None
    return _sample(*v)


class _Elsewhere(FormatError):
    """A history of another host or version: ignored without a word (measured again here)."""


class _Newer(_Elsewhere):
    """A history of a newer version, a newer lamina's: neither read nor replaced."""

    def __init__(self, version: int) -> None:
        super().__init__(f"history: version {version}, newer than {HISTORY_VERSION}")
        self.version = version


#: per file, the samples handed to save_history_soon and not written yet (one history, all
#: 'added'), the callbacks of their failures, and when the oldest of them came
_PENDING: dict[str, tuple[History, list[Callable[[OSError], None]], float]] = {}
_PENDING_LOCK = threading.Lock()
_AT_EXIT = [False]  # wait_saves registered with atexit
#: pending samples older than this many seconds are saved at the next handing-over: a long run
#: killed at its time limit loses only its last minutes
FLUSH_AFTER = 300.0
#: held while a history file is read, merged and replaced: one save at a time per process
_SAVE_ORDER = threading.Lock()
#: per file, the series last read from it or written to it, when each was last added to, and
#: the stamp the file had then: parsed again only once the path names another file
_LOADED: dict[str, tuple[tuple, dict[str, list[Sample]], dict[str, float], dict[str, Any]]] = {}
#: the files (their stamps) found unusable or repaired: warned about once
_WARNED: set[tuple] = set()


def _forget_pending() -> None:
    """In a child made by fork: the parent saves what it had pending, not the child too."""
    _PENDING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pending)


def wait_saves() -> None:
    """Write what :func:`save_history_soon` was handed, one file at a time, each in one save
    merging all its samples; an OSError goes to the *on_error* of every history it held (those
    samples are dropped: the history only advises)."""
    while True:
        with _PENDING_LOCK:
            if not _PENDING:
                return
            p = next(iter(_PENDING))
            acc, callbacks, _ = _PENDING.pop(p)
        try:
            with _SAVE_ORDER:
                _save(acc, p)
        except OSError as e:
            for on_error in callbacks:
                on_error(e)


def save_history_soon(
    h: History, path: str | None = None, on_error: Callable[[OSError], None] | None = None
) -> None:
    """:func:`save_history`, later: at the interpreter's exit or at :func:`wait_saves` (or at
    a handing-over once samples have waited :data:`FLUSH_AFTER` seconds), so that a writer's
    close does not wait for the file (about 3 ms for a full history, and a thread would hold
    the GIL the program wants back), and a process that writes many files merges their
    samples in one save.

    The samples *h* measured (``h.added``) are taken over now: *h* keeps none of them.
    :func:`load_history` in this process sees them at once (merged in memory); a process
    killed before it exits loses them (the history only advises).  *on_error* gets the
    OSError of a save that failed.
    """
    if not any(h.added.values()):
        return
    p = path or default_path()
    now = time.monotonic()
    with _PENDING_LOCK:
        got = _PENDING.get(p)
        if got is None:
            got = _PENDING[p] = (History(), [], now)
        acc, callbacks, since = got
        for name, samples in h.added.items():
            for x1, x2, t in samples:
                acc.add(name, x1, x2, t)
        h.added = {}
        if on_error is not None and on_error not in callbacks:  # (one warning, not one a call)
            callbacks.append(on_error)
        if not _AT_EXIT[0]:
            atexit.register(wait_saves)
            _AT_EXIT[0] = True
    if now - since >= FLUSH_AFTER:
        wait_saves()


def load_history(path: str | None = None) -> History:
    """The history at *path* (default :func:`default_path`), with the samples this process
    still has to save there; an empty one if the file is missing or not usable (another
    version, another host, not a history)."""
    p = path or default_path()
    h = _load(p)
    with _PENDING_LOCK:
        got = _PENDING.get(p)
        if got is not None:
            _extend(h.series, got[0].series)
            h.stamp = None  # it holds samples the file has not: a save merges with the file
    return h


def _load(p: str) -> History:
    """The history in the file at *p*; an empty one where it is missing or unusable (the
    history only advises: whatever reading it raises, with a warning once per file)."""
    return _read(p)[0]


def _read(p: str) -> tuple[History, dict[str, Any] | None]:
    """:func:`_load`, and the other hosts' parts of the file (kept by a save); None instead
    of them for a file of a newer version (a newer lamina's, which a save must not replace:
    hosts, or two lamina versions, sharing one home directory)."""
    before = _stamp(p)
    got = _LOADED.get(p)
    if before is not None and got is not None and got[0] == before:
        h = History(series=_copied(got[1]), used=dict(got[2]))
        h.stamp = before
        return h, got[3]
    try:
        mine, others = _parse(read_cache_file(p, "history", MAX_FILE_BYTES))
    except _Newer as e:  # a newer lamina's: neither read nor replaced, said once
        newer_file(p, WHAT, e.version, HISTORY_VERSION, "LAMINA_HISTORY")
        return History(), None
    except (FileNotFoundError, NotADirectoryError, _Elsewhere):  # none, or of an older version
        return History(), {}
    except NotRegularFile:  # a device, a FIFO: once, or never for the null device
        with contextlib.suppress(OSError):
            not_kept(p, WHAT, os.stat(p).st_mode)
        return History(), {}
    except Exception as e:  # noqa: BLE001 - FormatError (an OSError), ValueError, anything
        _warn_once(p, before, f"not usable ({type(e).__name__}: {e}); ignored")
        return History(), {}
    h = History() if mine is None else mine  # (None: only other hosts measured yet)
    if h.dropped:
        _warn_once(p, before, f"{h.dropped} unusable samples or series left out")
    h.stamp = before if before == _stamp(p) else None  # None: it changed while being read
    if h.stamp is not None:
        _LOADED[p] = (h.stamp, _copied(h.series), dict(h.used), others)
    return h, others


def _warn_once(p: str, stamp: tuple | None, what: str) -> None:
    """Warn that the history file at *p* is *what*, once for the file it is (*stamp*)."""
    key = stamp or (os.path.abspath(p),)
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(
        f"measured history {p}: {what} (the next save writes what is kept)",
        LaminaWarning,
        stacklevel=4,
    )


def _extend(series: dict[str, list[Sample]], more: dict[str, list[Sample]]) -> None:
    """Append the samples of *more* to *series*, series by series, each keeping its newest
    :data:`MAX_SAMPLES`."""
    for name, lst in more.items():
        dst = series.setdefault(name, [])
        dst.extend(lst)
        del dst[:-MAX_SAMPLES]


def _copied(series: dict[str, list[Sample]]) -> dict[str, list[Sample]]:
    """*series* with lists of its own (the samples are tuples: shared)."""
    return {n: list(v) for n, v in series.items()}


def _stamp(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _stamp_of(path, st)


def _stamp_of(path: str, st: os.stat_result) -> tuple:
    """What tells one file at *path* from another: (path, inode, size, mtime)."""
    return (os.path.abspath(path), st.st_ino, st.st_size, st.st_mtime_ns)


def save_history(h: History, path: str | None = None) -> None:
    """Merge the samples *h* measured (``h.added``) into the file at *path* (default
    :func:`default_path`), atomically; OSError if it cannot be written.

    The file is read again first, so that what other runs saved since *h*
    was loaded is kept; the samples saved are then no longer 'added'.
    """
    if not any(h.added.values()):
        return
    with _SAVE_ORDER:
        _save(h, path or default_path())


def _save(h: History, p: str) -> None:
    target = writable_path(p, WHAT)
    if target is None:  # the null device, a FIFO: nothing kept (one warning, see not_kept)
        h.added = {}
        return
    # no other process's save between the read and the rename (other hosts' included: a
    # file under a home directory that hosts share)
    with locked(target):
        stamp = _stamp(p)
        got = _LOADED.get(p)
        if h.stamp is not None and h.stamp == stamp and got is not None and got[0] == stamp:
            merged, others = h, got[3]  # the file is what h was loaded from
        else:
            merged, found = _read(p)
            if found is None:  # a newer lamina's file: left as it is
                h.added = {}
                h.stamp = None
                return
            others = found
            _extend(merged.series, h.added)
        now = time.time()
        for name, lst in h.added.items():
            if lst:
                merged.used[name] = now
        merged.evict(keep=h.added)  # what the file keeps, in memory too
        text, others = merged._file_text(others)  # this host's part replaced, the others kept
        st = write_cache_file(p, text, WHAT)
    h.added = {}
    if st is None:  # replaced by something other than a file meanwhile: nothing written
        h.stamp = None
        return
    after = _stamp_of(p, st)  # the file we wrote
    h.stamp = after if merged is h else None
    # what that file holds: a later load need not parse it while the path still names it
    _LOADED[p] = (after, _copied(merged.series), dict(merged.used), others)


class Recorder:
    """What a running program timed, summed per series and block size until it is saved.

    A query reads many blocks, a run writes many steps: one sample per
    series and block size (``x2`` to two significant digits) per file keeps
    the history short and each sample long enough to time well.
    """

    def __init__(self) -> None:
        self._acc: dict[tuple[str, float], list[float]] = {}

    def add(self, series: str, x1: float, x2: float, seconds: float) -> None:
        if x1 > 0 and x2 > 0 and seconds > 0:
            a = self._acc.setdefault((series, float(f"{x2:.2g}")), [0.0, 0.0])
            a[0] += x1
            a[1] += seconds

    def __bool__(self) -> bool:
        return bool(self._acc)

    def history(self) -> History:
        """The sums as samples of a new history (all 'added')."""
        h = History()
        for (series, x2), (x1, secs) in sorted(self._acc.items()):
            h.add(series, x1, max(x2, 1.0), secs)
        return h

    def save(self, path: str | None = None) -> None:
        """Merge the sums into the history file (:func:`save_history`) and start again."""
        h = self.history()
        self._acc.clear()
        save_history(h, path)

    def save_soon(self, on_error: Callable[[OSError], None] | None = None) -> None:
        """The sums to the history file later (:func:`save_history_soon`); start again."""
        h = self.history()
        self._acc.clear()
        save_history_soon(h, on_error=on_error)


def signature(expr: Any, dtype: Any) -> str:
    """The key of a derived expression in the history: its text with the inputs named
    ``$0, $1, ...`` in sorted order of their paths, and the input dtype."""
    from ..derived import Expr, parse
    from ..derived.nodes import Ref

    tree = parse(expr) if isinstance(expr, str) else expr
    order = {p: i for i, p in enumerate(sorted(tree.inputs))}

    def rename(node: Any) -> Any:
        if isinstance(node, Ref):
            return dataclasses.replace(node, path=f"${order[node.path]}")
        changes = {}
        for f in dataclasses.fields(node):
            v = getattr(node, f.name)
            if isinstance(v, Expr):
                changes[f.name] = rename(v)
            elif isinstance(v, tuple) and v and all(isinstance(c, Expr) for c in v):
                changes[f.name] = tuple(rename(c) for c in v)
        return dataclasses.replace(node, **changes) if changes else node

    return f"{rename(tree)}|{np.dtype(dtype).str}"


__all__ = [
    "Fit",
    "History",
    "MIN_FIT",
    "Recorder",
    "default_path",
    "fit_rate",
    "load_history",
    "pack_series",
    "save_history",
    "save_history_soon",
    "wait_saves",
    "signature",
    "unpack_series",
]
