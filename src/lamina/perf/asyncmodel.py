"""When background I/O pays: the epoch model, fitted to the run's own history.

An application's time is ``t_app = t_init + sum of epochs + t_term``; an
epoch is one compute phase and one step of I/O.  Synchronous and
asynchronous epochs take::

    t_sync  = t_io + t_comp
    t_async = max(t_comp, t_io) + t_copy

``t_copy`` is the transactional copy the application thread makes before
it goes on.  (The seed paper writes ``max(t_comp, t_io - t_comp) + t_ov``;
that form understates ``t_async`` when ``t_io > 2 t_comp``: once the I/O of
a step outlasts the compute phase, the next epoch waits for it, so an
epoch takes at least ``t_io``.  The consistent form is used here.)

* ``t_io = bytes / rate``, the rate fitted to the measured history of
  background steps: ``rate = c0 + c1 x1 + c2 x2`` with ``x = (bytes, ranks)``
  (linear) and with ``x = (log bytes, log ranks)`` (linear-log), by least
  squares; the fit with the larger ``r^2`` is used, and its ``r^2`` is
  reported.  With fewer than :data:`MIN_FIT` samples the rate is the mean
  of the measured ones.
* ``t_copy = bytes / copy rate``, the rate of the copies measured at put.
* ``t_comp``: a weighted average of past compute phases (weights halving
  with each older phase), measured as the time between two ``end_step``
  returns minus the time spent inside lamina calls.

The history persists per machine (:func:`default_path`), like the
calibration of the derived-quantity model: a new run starts from what the
last runs measured on this host.  ``io='auto'`` picks, per step, the mode
with the smaller predicted epoch (:meth:`AsyncModel.predict`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..catalog.wire import load_json
from ..errors import FormatError
from .calibrate import cache_path, host, read_cache_file, write_cache_file

#: bumped when what the history holds changes: older files are ignored
HISTORY_VERSION = 1
#: most I/O samples kept (the newest)
MAX_SAMPLES = 256
#: samples needed before a regression is fitted
MIN_FIT = 3
#: largest history file read
MAX_FILE_BYTES = 1 << 20
#: weight of a compute phase relative to the next newer one
DECAY = 0.5
#: copy rate assumed before any copy was measured (bytes/s)
DEFAULT_COPY_RATE = 2e9
#: I/O rate assumed before any step was measured (bytes/s): async is tried first
DEFAULT_IO_RATE = 5e8


def default_path() -> str:
    """``$LAMINA_ASYNC_HISTORY``, else ``$XDG_CACHE_HOME/lamina/async-history.json`` (default ``~/.cache``)."""
    return cache_path("LAMINA_ASYNC_HISTORY", "async-history.json")


@dataclass
class Fit:
    """A fitted I/O rate: ``kind`` 'linear', 'linear-log', 'mean' or 'none'; ``r2`` of the fit."""

    kind: str
    coef: tuple[float, ...] = ()
    r2: float = float("nan")
    samples: int = 0

    def rate(self, nbytes: float, ranks: float, floor: float) -> float:
        if self.kind == "linear":
            x = (1.0, nbytes, ranks)
        elif self.kind == "linear-log":
            x = (1.0, math.log(max(nbytes, 1.0)), math.log(max(ranks, 1.0)))
        elif self.kind == "mean":
            return self.coef[0]
        else:
            return DEFAULT_IO_RATE
        r = sum(c * v for c, v in zip(self.coef, x, strict=True))
        return max(r, floor)  # a line fitted to a few points may dip below anything measured


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class History:
    """What was measured on this host: I/O samples ``(bytes, ranks, seconds)`` and copy rates."""

    io: list[tuple[int, int, float]] = field(default_factory=list)
    copy_rates: list[float] = field(default_factory=list)

    def to_json(self) -> str:
        doc = {
            "version": HISTORY_VERSION,
            "host": host(),
            "io": [list(s) for s in self.io[-MAX_SAMPLES:]],
            "copy_rates": self.copy_rates[-MAX_SAMPLES:],
        }
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str | bytes) -> History:
        """The history in *text*; FormatError unless it is one of this version, from this host."""
        doc = load_json(text, "async history", limit=MAX_FILE_BYTES, constants=False)
        if not isinstance(doc, dict) or doc.get("version") != HISTORY_VERSION:
            raise FormatError("async history: not a history of this version")
        if doc.get("host") != host():
            raise FormatError("async history: measured on another host")
        io, rates = doc.get("io"), doc.get("copy_rates")
        if not isinstance(io, list) or not isinstance(rates, list):
            raise FormatError("async history: 'io' and 'copy_rates' must be lists")
        out = cls()
        for s in io[-MAX_SAMPLES:]:
            if (
                not isinstance(s, list)
                or len(s) != 3
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in s)
                or not (s[0] > 0 and s[1] >= 1 and s[2] > 0 and math.isfinite(s[2]))
            ):
                raise FormatError(f"async history: bad sample {s!r}")
            out.io.append((int(s[0]), int(s[1]), float(s[2])))
        for r in rates[-MAX_SAMPLES:]:
            if not isinstance(r, int | float) or isinstance(r, bool) or not 0 < r < math.inf:
                raise FormatError(f"async history: bad copy rate {r!r}")
            out.copy_rates.append(float(r))
        return out


def load_history(path: str | None = None) -> History:
    """The history at *path* (default :func:`default_path`); an empty one if it is missing or not usable."""
    try:
        return History.from_json(
            read_cache_file(path or default_path(), "async history", MAX_FILE_BYTES)
        )
    except (OSError, ValueError):  # FormatError is an OSError
        return History()


def save_history(h: History, path: str | None = None) -> None:
    """Write *h* to *path* atomically (a temporary file renamed over it); OSError if it cannot."""
    write_cache_file(path or default_path(), h.to_json())


#: the extension record where a writer under io='auto' keeps its decisions (rank 0's)
DECISIONS_KEY = "lamina.io.decisions"
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
)


def encode_decisions(decisions: list[dict[str, Any]]) -> bytes:
    """The decisions as the JSON of their :data:`DECISION_FIELDS` (missing ones: null; NaN: null)."""

    def value(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return round(v, 6) if isinstance(v, float) else v

    rows = [[value(d.get(k)) for k in DECISION_FIELDS] for d in decisions]
    return json.dumps({"fields": list(DECISION_FIELDS), "decisions": rows}).encode()


def decode_decisions(raw: bytes) -> list[dict[str, Any]]:
    """:func:`encode_decisions` back; FormatError if it is not that."""
    doc = load_json(raw, "io decisions", limit=MAX_FILE_BYTES, constants=False)
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
    return out


def fit_rate(samples: list[tuple[int, int, float]]) -> Fit:
    """The I/O rate as a function of (bytes, ranks): the better of the linear and linear-log fits."""
    if not samples:
        return Fit("none")
    a = np.asarray(samples, dtype=np.float64)
    nbytes, ranks, secs = a[:, 0], a[:, 1], a[:, 2]
    rate = nbytes / secs
    if len(samples) < MIN_FIT:
        return Fit("mean", (float(rate.mean()),), float("nan"), len(samples))
    best = Fit("mean", (float(rate.mean()),), 0.0, len(samples))
    ss_tot = float(((rate - rate.mean()) ** 2).sum())
    for kind, x1, x2 in (
        ("linear", nbytes, ranks),
        ("linear-log", np.log(nbytes), np.log(ranks)),
    ):
        design = np.column_stack([np.ones_like(x1), x1, x2])
        coef, *_ = np.linalg.lstsq(design, rate, rcond=None)
        ss_res = float(((design @ coef - rate) ** 2).sum())
        r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
        if r2 > best.r2:
            best = Fit(kind, tuple(float(c) for c in coef), r2, len(samples))
    return best


class AsyncModel:
    """The epoch model (module docstring) over a :class:`History` and this run's compute phases."""

    def __init__(self, history: History | None = None) -> None:
        self.history = history or History()
        self.compute: list[float] = []  # compute phases of this run, oldest first
        self._fit: Fit | None = None

    # -- measurements ---------------------------------------------------------------
    def add_io(self, nbytes: int, ranks: int, seconds: float) -> None:
        if nbytes > 0 and seconds > 0 and math.isfinite(seconds):
            self.history.io.append((int(nbytes), int(ranks), float(seconds)))
            del self.history.io[:-MAX_SAMPLES]
            self._fit = None

    def add_copy(self, nbytes: int, seconds: float) -> None:
        if nbytes >= 1 << 16 and seconds > 0:  # small copies measure call overhead, not a rate
            self.history.copy_rates.append(nbytes / seconds)
            del self.history.copy_rates[:-MAX_SAMPLES]

    def add_compute(self, seconds: float) -> None:
        if seconds >= 0 and math.isfinite(seconds):
            self.compute.append(float(seconds))
            del self.compute[:-64]

    # -- the model --------------------------------------------------------------------
    @property
    def fit(self) -> Fit:
        if self._fit is None:
            self._fit = fit_rate(self.history.io)
        return self._fit

    def copy_rate(self) -> float:
        r = self.history.copy_rates
        return float(np.median(r)) if r else DEFAULT_COPY_RATE

    def t_comp(self) -> float:
        """Weighted average of this run's compute phases (the newest weighs most); 0 before any."""
        c = self.compute
        if not c:
            return 0.0
        w = DECAY ** np.arange(len(c) - 1, -1, -1, dtype=np.float64)
        return float(np.dot(w, c) / w.sum())

    def predict(self, nbytes: int, ranks: int, t_comp: float | None = None) -> Prediction:
        """Epoch times of a step of *nbytes* bytes (all ranks together) written by *ranks* ranks."""
        fit = self.fit
        measured = [b / s for b, _, s in self.history.io]
        floor = 0.25 * min(measured) if measured else DEFAULT_IO_RATE
        t_io = nbytes / fit.rate(nbytes, ranks, floor)
        t_copy = nbytes / ranks / self.copy_rate()  # each rank copies its share, at once
        comp = self.t_comp() if t_comp is None else t_comp
        t_sync = t_io + comp
        t_async = max(comp, t_io) + t_copy
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
        )


__all__ = [
    "DECISIONS_KEY",
    "AsyncModel",
    "decode_decisions",
    "encode_decisions",
    "Fit",
    "History",
    "Prediction",
    "default_path",
    "fit_rate",
    "load_history",
    "save_history",
]
