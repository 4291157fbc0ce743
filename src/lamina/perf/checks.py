"""How far the cost models' predictions fell from what was measured, kept per machine.

lamina decides with two models on one machinery (:mod:`lamina.perf.history`):
the derived-quantity model (``strategy='auto'``; ``lamina bench strategies``
measures the totals it predicts, on the measured history and on the
calibrated rates) and the background I/O model (``io='auto'``; ``lamina
bench async`` measures the epochs it predicted from step 3 on).  Each
benchmark records its models' predictions beside what it measured
(:func:`record`) and prints :func:`table`: one row per model, its own run
beside the other models' last recorded runs on this machine.  ``lamina
model checks`` prints the same table.

An error is ``|predicted / measured - 1|`` for every model: a prediction
within 25 % (the issues' target) or 15 % (their goal) of what was measured.

The records are a small JSON file (``$LAMINA_MODEL_CHECKS``, else
``$XDG_CACHE_HOME/lamina/model-checks.json``): per host and model, the
command, when and on which host it ran, and its (predicted, measured) pairs
in seconds; a record replaces only its own host's.
A file that cannot be read or holds anything else is ignored, record by
record; nothing read from it is evaluated.  A file of a newer version (a
newer lamina's) is neither read nor replaced, with one LaminaWarning.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..catalog.wire import load_json
from ..errors import FormatError
from ..text import table as text_table
from .calibrate import (
    MAX_HOSTS,  # noqa: F401 - named here (record)
    cache_path,
    finite_number,
    host,
    locked,
    newer_file,
    newer_version,
    others_of,
    read_cache_file,
    with_others,
    writable_path,
    write_cache_file,
)

#: the models, in the table's order, and what each predicts
MODELS = {
    "derived-history": "derived quantities on measured history: write + query totals",
    "derived-calibration": "derived quantities on calibrated rates: write + query totals",
    "async": "background I/O (io='auto'): a step's epoch, from step 3 on",
}
#: a prediction within this fraction of what was measured meets the target
TOLERANCE = 0.25
#: ... and the goal
GOAL = 0.15
VERSION = 1
#: pairs kept per model (a record of more keeps the first these many)
MAX_PAIRS = 4096
MAX_FILE_BYTES = 1 << 20
MAX_COMMAND = 1000
#: the file in words
WHAT = "model checks"
#: seconds a prediction or a measurement may be: beyond, not a timing (a damaged record)
SECONDS_RANGE = (1e-12, 1e9)
#: latest time of a record: the end of year 9999 (time.gmtime's range everywhere)
LATEST = 253402300799.0


def default_path() -> str:
    """``$LAMINA_MODEL_CHECKS``, else ``$XDG_CACHE_HOME/lamina/model-checks.json``."""
    return cache_path("LAMINA_MODEL_CHECKS", "model-checks.json")


def _pair(p) -> tuple[float, float] | None:
    """A (predicted, measured) pair of seconds within :data:`SECONDS_RANGE`, or None."""
    if not isinstance(p, (list, tuple)) or len(p) != 2:
        return None
    a, b = _seconds(p[0]), _seconds(p[1])
    return None if a is None or b is None else (a, b)


def _seconds(v) -> float | None:
    """*v* as seconds within :data:`SECONDS_RANGE` (NaN fails both bounds), or None."""
    f = finite_number(v)
    return f if f is not None and SECONDS_RANGE[0] <= f <= SECONDS_RANGE[1] else None


@dataclass(frozen=True)
class Check:
    """One benchmark run's predictions of one model beside what it measured."""

    model: str
    command: str
    when: float  # Unix time
    host: str
    pairs: tuple[tuple[float, float], ...]  # (predicted, measured) seconds

    @classmethod
    def of(cls, model: str, pairs, command: str) -> Check:
        """This run's check of *model*: the valid pairs of *pairs* (others left out)."""
        if model not in MODELS:
            raise ValueError(f"model check: unknown model {model!r}; one of {', '.join(MODELS)}")
        kept = tuple(q for q in map(_pair, pairs) if q is not None)[:MAX_PAIRS]
        return cls(model, command[:MAX_COMMAND], time.time(), host(), kept)

    def errors(self) -> list[float]:
        return [abs(p / m - 1.0) for p, m in self.pairs]

    def summary(self) -> dict:
        """Predictions, how many within the target and the goal, median and largest error,
        and the range of predicted / measured."""
        errs = sorted(self.errors())
        n = len(errs)
        ratios = [p / m for p, m in self.pairs]
        return {
            "predictions": n,
            "within_target": sum(e <= TOLERANCE for e in errs),
            "within_goal": sum(e <= GOAL for e in errs),
            "median_error": (errs[(n - 1) // 2] + errs[n // 2]) / 2 if n else None,
            "largest_error": errs[-1] if n else None,
            "ratio_range": (min(ratios), max(ratios)) if n else None,
        }

    def stored(self) -> dict:
        """The record as the file keeps it."""
        return {
            "command": self.command,
            "when": self.when,
            "host": self.host,
            "pairs": [list(p) for p in self.pairs],
        }

    def as_dict(self) -> dict:
        return {**self.stored(), "summary": self.summary()}


def _check_of(model: str, d) -> Check | None:
    """The record of *model* in a loaded file, or None if it is not one."""
    if model not in MODELS or not isinstance(d, dict):
        return None
    command, when, where, pairs = d.get("command"), d.get("when"), d.get("host"), d.get("pairs")
    if not (isinstance(command, str) and isinstance(where, str) and isinstance(pairs, list)):
        return None
    when = finite_number(when)
    if when is None or not 0 <= when <= LATEST:  # a time lamina ran at
        return None
    kept = [q for q in map(_pair, pairs[:MAX_PAIRS]) if q is not None]
    if len(kept) != min(len(pairs), MAX_PAIRS):
        return None
    return Check(model, command[:MAX_COMMAND], float(when), where, tuple(kept))


def _read(path: str) -> dict[str, dict[str, Check]]:
    """Every record in the file at *path*, by host, then by model in the table's order (none
    where the file is missing, unreadable, too long or not a record of this version).

    The records of the host that saved last are under ``checks`` (a file from before
    records were kept per host holds each model's last record, whichever host made it),
    the other hosts' under ``others``; each record names its host.
    """
    try:
        return read_records(path)
    except Newer as e:  # a newer lamina's records: neither read nor replaced, said once
        newer_file(path, WHAT, e.version, VERSION, "LAMINA_MODEL_CHECKS")
        return {}
    except (OSError, ValueError):  # FormatError is an OSError
        return {}


class Newer(ValueError):
    """Records of a newer version, a newer lamina's: neither read nor replaced (two lamina
    versions may share one home directory)."""

    def __init__(self, path: str, version: int) -> None:
        super().__init__(
            f"model checks: {path} holds records of version {version}, newer than {VERSION}"
        )
        self.version = version


def read_records(path: str) -> dict[str, dict[str, Check]]:
    """:func:`_read`, raising what is wrong with the file: OSError (FileNotFoundError, ...),
    ValueError (not a regular file, too long, not JSON, not records of this version)."""
    raw = read_cache_file(path, "model checks", MAX_FILE_BYTES)
    try:
        doc = load_json(raw, "model checks", limit=MAX_FILE_BYTES, constants=False)
    except FormatError as e:
        raise ValueError(str(e)) from None
    newer = newer_version(doc, VERSION)
    if newer is not None:
        raise Newer(path, newer)
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ValueError(f"model checks: not records of version {VERSION} of model checks")
    found: dict[str, dict[str, Check]] = {}
    for records in (doc.get("checks"), *others_of(doc).values()):
        if not isinstance(records, dict):
            continue
        for model in MODELS:
            c = _check_of(model, records.get(model))
            if c is None:
                continue
            have = found.setdefault(c.host, {}).get(model)
            if have is None or c.when > have.when:
                found[c.host][model] = c
    return {h: {m: got[m] for m in MODELS if m in got} for h, got in found.items()}


def load(path: str | None = None) -> dict[str, Check]:
    """The last recorded check of each model made on this host."""
    return _read(path or default_path()).get(host(), {})


def record(checks: list[Check], path: str | None = None) -> None:
    """Keep *checks* as their models' last records on their host (the other models' and the
    other hosts' records stay: at most :data:`MAX_HOSTS` hosts, the least recently checked
    left out first); OSError if the file cannot be written, nothing where its path is not a
    regular file (:func:`~lamina.perf.calibrate.write_cache_file`)."""
    p = path or default_path()
    target = writable_path(p, WHAT)
    if target is None:
        return
    with locked(target):  # read again: what another host or process recorded meanwhile stays
        try:
            every = read_records(p)
        except Newer as e:  # a newer lamina's records: left as they are
            newer_file(p, WHAT, e.version, VERSION, "LAMINA_MODEL_CHECKS")
            return
        except (OSError, ValueError):  # none, or unreadable: replaced
            every = {}
        for c in checks:
            every.setdefault(c.host, {})[c.model] = c
        mine = every.pop(host(), {})
        others = {h: {m: c.stored() for m, c in got.items()} for h, got in every.items() if got}
        text, _ = with_others(
            {"version": VERSION, "checks": {m: c.stored() for m, c in mine.items()}},
            others,
            lambda part: max((r["when"] for r in part.values()), default=0.0),
            MAX_FILE_BYTES,
        )
        write_cache_file(p, text, WHAT)


def side_by_side(mine: list[Check], path: str | None = None) -> dict[str, Check]:
    """This run's checks (*mine*) with the other models' last records on this host."""
    return _beside(_read(path or default_path()), mine)


def _beside(every: dict[str, dict[str, Check]], mine: list[Check]) -> dict[str, Check]:
    out = dict(every.get(host(), {}))
    out.update((c.model, c) for c in mine)
    return {m: out[m] for m in MODELS if m in out}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _utc(t: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))
    except (OverflowError, OSError, ValueError):  # a time the platform cannot write
        return "-"


def table(checks: dict[str, Check], this_run: tuple[str, ...] = ()) -> str:
    """The models' errors side by side: one row per model checked (*this_run*: the models
    this run checked), then the command of each row."""
    rows, notes = [], []
    for k, (model, c) in enumerate(checks.items(), 1):
        s = c.summary()
        lo_hi = s["ratio_range"]
        rows.append(
            [
                f"{model} [{k}]",
                "this run" if model in this_run else _utc(c.when),
                str(s["predictions"]),
                f"{s['within_target']} of {s['predictions']}",
                f"{s['within_goal']} of {s['predictions']}",
                _pct(s["median_error"]),
                _pct(s["largest_error"]),
                "-" if lo_hi is None else f"{lo_hi[0]:.2f}-{lo_hi[1]:.2f}",
            ]
        )
        # (the command as recorded: its control characters escaped, never sent to a terminal)
        command = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(c.command))
        notes.append(f"[{k}] {MODELS[model]}; {command}")
    if not rows:
        return "model errors: no model checked on this host yet (lamina bench strategies, lamina bench async)"
    head = [
        "model",
        "run",
        "predictions",
        f"within {TOLERANCE:.0%}",
        f"within {GOAL:.0%}",
        "median error",
        "largest error",
        "pred/meas",
    ]
    return "\n".join(
        [
            "model errors, |predicted / measured - 1| (the other models: their last run on this host)",
            text_table(head, rows, "llrrrrrr"),
            *notes,
        ]
    )


def add_to_report(mine: list[Check], text: str, doc: dict, path: str | None = None) -> str:
    """A benchmark's report *text* followed by :func:`table` of its checks (*mine*) beside the
    other models' last records; *mine* recorded as their models' last, and every row in
    ``doc["model_checks"]``.  A file that cannot be written is said, not raised."""
    p = path or default_path()
    both = _beside(_read(p), mine)
    doc["model_checks"] = {m: c.as_dict() for m, c in both.items()}
    note = ""
    if mine:
        try:
            record(mine, p)
        except OSError as e:
            note = f"\n(this run's model errors not recorded: {e})"
    return text + "\n\n" + table(both, tuple(c.model for c in mine)) + note
