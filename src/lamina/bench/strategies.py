"""``lamina bench strategies``: Store, Stats and Expression measured against the cost model.

For each kernel (``magnitude``: ``vmag = magnitude(vx, vy, vz)``, ``curl``:
``vort = curl(vx, vy, vz)``, a group of ``vort/x``, ``vort/y``, ``vort/z``)
the program writes, in one process (one rank), files of three primary float64
fields ``vx``, ``vy``, ``vz`` of ``--size`` bytes together, each cut into
``--blocks`` slabs along axis 0:

``baseline``    the three fields alone
``store``       the fields and the derived quantity kept as data
``stats``       the fields and the derived quantity kept as block statistics
``expression``  the fields and the derived quantity kept as its expression

``durable=False`` (page cache), each write preceded by an untimed ``sync``.
The derived layer computes ``store`` and ``stats`` at the end of the step.
Measured, best of ``--repeat``:

* **write** of a strategy: the time of its file (open, define, write the three
  fields with ``copy=False``, derive, end the step, close) minus the
  baseline's; **storage**: its bytes on disk minus the baseline's;
* **read**, per query fraction q (``--fractions``, percent): the query
  ``"<c> < x"`` with ``select=[<derived>]`` and ``exact=False``, where
  ``<c>`` is ``vmag`` or ``vort/x``, on the file opened just before
  (untimed: the derived layer of an open file keeps the last vector values
  it computed, which a second query would find instead of reading).  The
  fields ramp along axis 0, so the threshold x, taken between the smallest
  values of the blocks' statistics, makes the statistics select about q of
  the blocks; the achieved fraction (candidate elements / elements) is what
  the model is given.  The block answer (``exact=False``) reads the derived
  values over the candidate blocks: Eq. 2 of :mod:`lamina.perf.model`, q of
  the derived data (store), q of the inputs recomputed (stats), all of the
  inputs (expression, where nothing prunes).  The exact answer adds a cost
  per matching element (mask, coordinates, sorting) that the model does not
  have; it is timed apart, in the S3D query;
* **S3D case**: a primary dataset selected by a derived condition, ``"vx
  where <c> < x"`` (``select=["vx"]``, exact): the bytes the candidate answer
  reads under each strategy;
* **fresh memory**: minor page faults (first touches of new memory) of the
  fastest run, a large cost on virtual machines.

Totals are ``write + R x read`` (``--readers``).  The predictions come from
:func:`lamina.perf.predict` with this machine's calibration
(:func:`lamina.perf.calibrate`), measured in the run before the first kernel
and after each, keeping the best of each rate as the times keep the best run
(``--calibration quick``, ``cached`` or a file to choose otherwise).

Two models predict side by side: Eq. 1-2 at the calibrated rates, and the
model on measured history (:mod:`lamina.perf.history`), whose samples the
derived layer records while the runs above write and query.  Which
history predicts a run (``--history``):

* ``earlier`` (the default with one block count): before the timed runs,
  an untimed run of every write and query at the same count, as many
  times (``--repeat``), records a history of its own, and the timed runs
  are predicted from it: a job run again on the same machine, the case the
  per-machine history serves;
* ``others`` (the default with several counts, ``--blocks 16,64,256``):
  each count is predicted from what was timed at the *other* counts (leave
  one out), so that the model is judged on block sizes it has not seen;
* ``host``: this host's history as it was before the run.

Targets: predicted totals within 25 % of measured; in the S3D case, Stats
reads the same bytes as Store (within 5 %) and Expression reads all the
inputs; the Stats file within 1 % of the Expression file in size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..perf import checks
from ..perf.checks import Check
from ..text import fmt_bytes, fmt_duration, table
from . import common

STRATEGIES = ("store", "stats", "expression")
FILES = ("baseline", *STRATEGIES)
INPUTS = ("vx", "vy", "vz")
#: predicted total within this fraction of the measured one
TOTAL_TOLERANCE = 0.25
#: S3D case: Stats' candidate bytes within this fraction of Store's
S3D_TOLERANCE = 0.05
#: Stats file size within this fraction of the Expression file size
STORAGE_TOLERANCE = 0.01
DEFAULT_FRACTIONS = "1,10,50,100"
PAGE = resource.getpagesize()


# ------------------------------------------------------------------ data
def grid(total_bytes: int, blocks: int) -> tuple[int, int, int]:
    """Shape of each of the three float64 fields: about *total_bytes* together, axis 0 a multiple of *blocks*."""
    n = max(27, total_bytes // (len(INPUTS) * common.ITEM))
    n0 = blocks * max(1, math.ceil(n ** (1 / 3) / blocks), math.ceil(3 / blocks))
    side = max(3, math.isqrt(max(1, n // n0)))
    return (n0, side, side)


def _full(a: np.ndarray, shape) -> np.ndarray:
    return np.ascontiguousarray(np.broadcast_to(a, shape), dtype=np.float64)


def _axes(shape):
    n0, ny, nz = shape
    i = np.arange(n0, dtype=np.float64)[:, None, None]
    j = np.arange(ny, dtype=np.float64)[None, :, None]
    k = np.arange(nz, dtype=np.float64)[None, None, :]
    ramp = 1.0 + 2.0 * i / max(1, n0 - 1)  # 1 -> 3 along axis 0
    return i, j, k, ramp


def magnitude_fields(shape) -> dict[str, np.ndarray]:
    """|v| ramps from about 1 to 3 along axis 0, with a small smooth variation across it."""
    n0, ny, nz = shape
    i, j, k, ramp = _axes(shape)
    tau = 2 * np.pi
    return {
        "vx": _full(ramp + 0.01 * np.sin(tau * j / ny) * np.cos(tau * k / nz), shape),
        "vy": _full(0.1 * np.sin(tau * k / nz), shape),
        "vz": _full(0.1 * np.cos(tau * j / ny), shape),
    }


def curl_fields(shape) -> dict[str, np.ndarray]:
    """curl/x = d(vz)/d(axis 1) - d(vy)/d(axis 2) equals the ramp 1 -> 3 along axis 0, exactly."""
    n0, ny, nz = shape
    i, j, k, ramp = _axes(shape)
    tau = 2 * np.pi
    return {
        "vx": _full(1.0 + 0.1 * np.sin(tau * k / nz), shape),
        "vy": _full(0.1 * np.sin(tau * j / ny) * np.cos(tau * i / n0), shape),
        "vz": _full(j * ramp + 0.1 * np.cos(tau * k / nz), shape),
    }


@dataclass(frozen=True)
class Case:
    name: str  # the kernel
    derived: str  # name of the derived quantity
    expr: str
    component: str  # the component the condition tests
    fields: Callable[[tuple[int, int, int]], dict[str, np.ndarray]]

    @property
    def cond(self) -> str:
        c = self.component
        return f"`{c}`" if "/" in c else c


CASES = {
    c.name: c
    for c in (
        Case("magnitude", "vmag", "magnitude(vx, vy, vz)", "vmag", magnitude_fields),
        Case("curl", "vort", "curl(vx, vy, vz)", "vort/x", curl_fields),
    )
}


# ------------------------------------------------------------ measuring
def file_bytes(path: str) -> int:
    """Bytes of the files of a lamina file (a directory for the native engine)."""
    if os.path.isdir(path):
        return sum(
            os.path.getsize(os.path.join(root, n))
            for root, _, names in os.walk(path)
            for n in names
        )
    return os.path.getsize(path)


def minor_faults() -> int:
    """Minor page faults of this process so far (every thread): first touches of fresh memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def write_file(
    path: str, case: Case, fields: dict, blocks: int, strategy: str | None
) -> tuple[float, int]:
    """Write one file (a fresh one at *path*): (seconds from open to close, minor page faults)."""
    import lamina

    common.remove(path)
    os.sync()  # untimed: no write pays for the write-back of an earlier one
    shape = fields[INPUTS[0]].shape
    planes = shape[0] // blocks
    f0 = minor_faults()
    t0 = time.perf_counter()
    with lamina.open(path, "w", durable=False) as f:
        dss = {p: f.create_dataset(p, shape, "f8") for p in INPUTS}
        if strategy is not None:
            f.derive(case.derived, case.expr, strategy=strategy)
        with f.step():
            for p in INPUTS:
                a = fields[p]
                for b in range(blocks):
                    lo = b * planes
                    dss[p].write(a[lo : lo + planes], offset=(lo, 0, 0), copy=False)
    return time.perf_counter() - t0, minor_faults() - f0


def thresholds(path: str, case: Case, blocks: int, fractions: list[float]) -> list[float]:
    """Per fraction q, an x such that the blocks' statistics make round(q * blocks) of them candidates of ``c < x``."""
    import lamina

    with lamina.open(path, "r") as f:
        lows = sorted(float(b.stats.min) for b in f[case.component].blocks())
        top = max(float(b.stats.max) for b in f[case.component].blocks())
    out = []
    for q in fractions:
        m = min(len(lows), max(1, round(q * len(lows))))
        out.append(0.5 * (lows[m - 1] + lows[m]) if m < len(lows) else top + 1.0)
    return out


def run_query(path: str, where: str, select: list[str], exact: bool) -> tuple[float, int, object]:
    """Open *path* (untimed), query it (timed), close: (seconds, minor page faults, result).

    Each query opens the file anew, as a reader would: the derived layer keeps
    the last vector values it computed, and a second query of the same open
    file would find them there instead of reading.
    """
    import lamina

    with lamina.open(path, "r") as f:
        f0 = minor_faults()
        t0 = time.perf_counter()
        res = f.query(where, select=select, exact=exact)
        t = time.perf_counter() - t0
        nf = minor_faults() - f0
    return t, nf, res


def _at_best(times: list[float], values: list[int]) -> int:
    """The value recorded in the fastest run."""
    return values[min(range(len(times)), key=times.__getitem__)]


def _rotated(names, r: int) -> list:
    names = list(names)
    k = r % len(names)
    return names[k:] + names[:k]


def measure_case(
    case: Case,
    shape: tuple[int, int, int],
    blocks: int,
    fractions: list[float],
    repeat: int,
    directory: str,
    say: Callable[[str], None],
) -> dict:
    """Write the four files, query them; every measurement of one kernel."""
    n = math.prod(shape)
    say(f"{case.name}: filling 3 fields of shape {shape}...")
    fields = case.fields(shape)
    paths = {s: os.path.join(directory, f"{case.name}-{s}.lam") for s in FILES}
    strategy_of = {"baseline": None, **{s: s for s in STRATEGIES}}
    write_file(paths["baseline"], case, fields, blocks, None)  # untimed: first touch, imports
    writes: dict[str, list[float]] = {s: [] for s in FILES}
    wfaults: dict[str, list[int]] = {s: [] for s in FILES}
    for r in range(repeat):
        say(f"{case.name}: writes, round {r + 1} of {repeat}...")
        for s in _rotated(FILES, r):
            t, nf = write_file(paths[s], case, fields, blocks, strategy_of[s])
            writes[s].append(t)
            wfaults[s].append(nf)
    del fields
    sizes = {s: file_bytes(paths[s]) for s in FILES}
    xs = thresholds(paths["store"], case, blocks, fractions)
    queries = []
    for q, x in zip(fractions, xs, strict=True):
        where = f"{case.cond} < {x!r}"
        say(f"{case.name}: {q:.0%} query {where!r}...")
        reads: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        rfaults: dict[str, list[int]] = {s: [] for s in STRATEGIES}
        got: dict[str, dict] = {}
        for s in STRATEGIES:  # untimed: the first query of each kind
            run_query(paths[s], where, [case.derived], exact=False)
        for r in range(repeat):
            for s in _rotated(STRATEGIES, r):
                t, nf, res = run_query(paths[s], where, [case.derived], exact=False)
                reads[s].append(t)
                rfaults[s].append(nf)
                got[s] = {
                    "candidates": len(res.candidates),
                    "candidate_elements": res.candidate_elements,
                    "bytes_read": res.candidate_bytes_read,
                }
                del res
        s3d = {}
        for s in STRATEGIES:
            t, _, res = run_query(paths[s], where, ["vx"], exact=True)
            s3d[s] = {
                "seconds": t,
                "candidates": len(res.candidates),
                "candidate_bytes": res.candidate_bytes_read,
                "exact_bytes": res.exact_bytes_read,
                "count": res.count,
            }
            del res
        achieved = got["store"]["candidate_elements"] / n
        queries.append(
            {
                "fraction": q,
                "threshold": x,
                "where": where,
                "achieved": achieved,
                "candidates": got["store"]["candidates"],
                "read": {
                    s: {
                        **got[s],
                        **common.summarize(reads[s]),
                        "faults": _at_best(reads[s], rfaults[s]),
                    }
                    for s in STRATEGIES
                },
                "s3d": s3d,
            }
        )
    return {
        "kernel": case.name,
        "derived": case.derived,
        "expression": case.expr,
        "component": case.component,
        "paths": paths,
        "writes": {
            s: {**common.summarize(writes[s]), "faults": _at_best(writes[s], wfaults[s])}
            for s in FILES
        },
        "sizes": sizes,
        "queries": queries,
    }


# -------------------------------------------------------------- the model
def calibrate_now(quick: bool, say: Callable[[str], None]):
    """One calibration of this machine, now."""
    from ..perf import calibrate

    say(f"calibrating this machine ({'quick' if quick else 'full'})...")
    return calibrate(quick=quick)


def best_rates(cals: list):
    """One calibration with the highest of each rate of *cals* (the best case, as the times are)."""
    from ..perf import Calibration
    from ..perf.calibrate import RATES

    doc = json.loads(cals[-1].to_json())
    for r in (*RATES, "fresh_copy_bandwidth"):
        doc[r] = max(getattr(c, r) for c in cals)
    for kind, points in doc["block_seconds"].items():  # the shortest time at each size
        for i, (size, _) in enumerate(points):
            times = [p[1] for c in cals for p in c.block_seconds.get(kind, ()) if p[0] == size]
            points[i] = [size, min(times)]
    return Calibration(**doc)


def fixed_calibration(spec: str):
    """(calibration, how it was obtained) for ``--calibration cached`` or a file."""
    from ..perf import default_path, load_calibration, read_calibration

    if spec == "cached":
        path = default_path()
        return load_calibration(path), f"the cached one ({path})"
    return read_calibration(spec), f"read from {spec}"


def verdict_within(pred: float, meas: float, tol: float) -> tuple[float | None, bool]:
    """(pred / meas, whether pred is within *tol* of meas)."""
    if meas <= 0:
        return None, abs(pred) <= 1e-6
    ratio = pred / meas
    return ratio, abs(ratio - 1.0) <= tol


def evaluate_case(m: dict, shape, blocks: int, readers: int, cal, history=None) -> dict:
    """Predictions, ratios and verdicts of one kernel's measurements (added to *m*): the model
    at the calibrated rates, and the model on the measured *history* (none: not shown)."""
    from ..perf import terms
    from ..perf.model import combine

    n = math.prod(shape)
    name = m["derived"]
    t = terms(m["expression"], shape, "f8", nblocks=blocks, calibration=cal, name=name)
    best = {s: m["writes"][s]["min"] for s in FILES}
    base = best["baseline"]
    m["terms"] = t.as_dict()
    m["write"] = {}
    # the terms once; each fraction and each model combines them (lamina.perf.predict does both)
    p1 = combine(t, 1.0, 0)
    h1 = combine(t, 1.0, 0, history) if history is not None else None
    for s in STRATEGIES:
        # what the strategy adds to the baseline file's write; a strategy that adds next to
        # nothing (expression) can measure below the baseline by the noise: no less than 0
        measured = max(0.0, best[s] - base)
        paired = common.summarize(
            [
                a - b
                for a, b in zip(
                    m["writes"][s]["times"], m["writes"]["baseline"]["times"], strict=True
                )
            ]
        )["median"]
        storage = m["sizes"][s] - m["sizes"]["baseline"]
        m["write"][s] = {
            "measured": measured,
            "paired_median": paired,
            "predicted": p1[s].write_s,
            "predicted_history": h1[s].write_s if h1 else None,
            "source_history": h1[s].source if h1 else None,
            "storage_measured": storage,
            "storage_predicted": p1[s].storage_bytes,
            "file_bytes": m["sizes"][s],
            "fresh_bytes": (m["writes"][s]["faults"] - m["writes"]["baseline"]["faults"]) * PAGE,
        }
    m["baseline"] = {
        "measured": base,
        "predicted": p1["store"].primary_write_s,
        "file_bytes": m["sizes"]["baseline"],
    }
    input_bytes = len(INPUTS) * n * common.ITEM
    for qd in m["queries"]:
        p = combine(t, qd["achieved"], readers)
        ph = combine(t, qd["achieved"], readers, history) if history is not None else None
        model_bytes = {
            "store": qd["achieved"] * t.derived_bytes,
            "stats": qd["achieved"] * t.input_bytes,
            "expression": t.input_bytes,
        }
        for s in STRATEGIES:
            r = qd["read"][s]
            read = r["min"]
            total = m["write"][s]["measured"] + readers * read
            ratio, ok = verdict_within(p[s].total_s, total, TOTAL_TOLERANCE)
            if ph:
                hratio, hok = verdict_within(ph[s].total_s, total, TOTAL_TOLERANCE)
                r.update(
                    {
                        "predicted_history": ph[s].read_s,
                        "total_predicted_history": ph[s].total_s,
                        "ratio_history": hratio,
                        "met_history": hok,
                        "source_history": ph[s].source,
                    }
                )
            r.update(
                {
                    "measured": read,
                    "predicted": p[s].read_s,
                    "model_bytes": model_bytes[s],
                    "fresh_bytes": r["faults"] * PAGE,
                    "total_measured": total,
                    "total_predicted": p[s].total_s,
                    "ratio": ratio,
                    "met": ok,
                }
            )
        s3d = qd["s3d"]
        store_b = s3d["store"]["candidate_bytes"]
        stats_b = s3d["stats"]["candidate_bytes"]
        expr_b = s3d["expression"]["candidate_bytes"]
        qd["s3d_check"] = {
            "stats_vs_store": (stats_b / store_b) if store_b else None,
            "stats_met": abs(stats_b - store_b) <= S3D_TOLERANCE * store_b,
            "expression_vs_inputs": expr_b / input_bytes,
            "expression_met": expr_b >= input_bytes,
            "counts_agree": len({v["count"] for v in s3d.values()}) == 1,
        }
    st, ex = m["sizes"]["stats"], m["sizes"]["expression"]
    m["storage_check"] = {
        "stats_bytes": st,
        "expression_bytes": ex,
        "relative": (st - ex) / ex,
        "met": abs(st - ex) <= STORAGE_TOLERANCE * ex,
    }
    return m


# ------------------------------------------------------------ reporting
def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _hist_cell(pred: float | None, meas: float, source: str | None) -> str:
    """pred/meas of the model on history, '-' where its terms all came from the calibration."""
    if pred is None or source in (None, "calibration"):
        return "-"
    mark = "" if source == "history" else " (part)"
    return (_r(pred / meas) if meas > 0 else "-") + mark


def _ok(flag: bool) -> str:
    return "met" if flag else "NOT met"


def _spread(cals: list[dict]) -> list[str]:
    """A line with the range of the rates over several calibrations (none for one)."""
    if len(cals) < 2:
        return []

    def rng(key: str, scale: float, unit: str) -> str:
        vals = [c[key] / scale for c in cals]
        return f"{min(vals):.3g}-{max(vals):.3g} {unit}"

    return [
        f"  (range over the {len(cals)} calibrations: kernels {rng('kernel_bandwidth', 1e9, 'GB/s')}, "
        f"{rng('flop_rate', 1e9, 'Gop/s')}, write {rng('write_bandwidth', 1e9, 'GB/s')}, "
        f"read {rng('read_bandwidth', 1e9, 'GB/s')})"
    ]


def report(doc: dict) -> str:
    o = doc["options"]
    shape = tuple(doc["shape"])
    cal = doc["calibration"]
    R = o["readers"]
    out = [
        "$ " + doc["command"],
        f"lamina bench strategies: 3 float64 fields vx, vy, vz of shape {shape} "
        f"({fmt_bytes(doc['input_bytes'])} in all), {', '.join(map(str, o['blocks']))} blocks each "
        "(slabs along axis 0); "
        "1 process (one rank): the derived layer computes store and stats at the end of the step; "
        "page cache (durable=False, sync before every write)",
        f"calibration {doc['calibration_source']}: kernels {cal['kernel_bandwidth'] / 1e9:.3g} GB/s, "
        f"stencils {cal['stencil_bandwidth'] / 1e9:.3g} GB/s, {cal['flop_rate'] / 1e9:.3g} Gop/s, "
        f"statistics {cal['stats_bandwidth'] / 1e9:.3g} GB/s, write {cal['write_bandwidth'] / 1e9:.3g} GB/s, "
        f"read {cal['read_bandwidth'] / 1e9:.3g} GB/s, "
        f"copy into new memory {cal.get('fresh_copy_bandwidth', 0) / 1e9:.3g} GB/s, "
        f"per-block tables: {', '.join(cal.get('block_seconds', {})) or 'none'}",
        *_spread(doc.get("calibrations") or []),
        f"times: best of {o['repeat']}; write = the file's open..close minus the baseline file's "
        "(the same fields, no derived quantity); read = one query (block answer) of the file opened just before; "
        f"total = write + {R} x read ({R} reader{'s' if R != 1 else ''}); "
        f"pred/meas within {TOTAL_TOLERANCE:.0%} = met; fresh memory = minor page faults "
        "(first touches of new memory) in the fastest run, write: minus the baseline's",
        f"load average before/after: {doc['load'][0]:.2f} / {doc['load'][1]:.2f} on {os.cpu_count()} CPUs",
        f"history: the model on measured history (lamina.perf.history) predicts from "
        f"{doc.get('history_source', 'none')}; '-' where it has no samples for a term",
        "",
    ]
    targets = []
    for m in doc["kernels"]:
        out.append(
            f"#### {m['kernel']}, {m['blocks']} blocks of shape {tuple(m['shape'])}: "
            f"{m['derived']} = {m['expression']}"
        )
        out.append("")
        b = m["baseline"]
        out.append(
            f"baseline file (3 fields, no derived quantity): {fmt_duration(b['measured'])} to write "
            f"(model: primary data {fmt_duration(b['predicted'])}), {fmt_bytes(b['file_bytes'])} on disk"
        )
        out.append("")
        body = []
        for s in STRATEGIES:
            w = m["write"][s]
            ratio = w["predicted"] / w["measured"] if w["measured"] > 0 else None
            sratio = (
                w["storage_predicted"] / w["storage_measured"]
                if w["storage_measured"] > 0
                else None
            )
            hp = w.get("predicted_history")
            body.append(
                [
                    s,
                    fmt_duration(w["measured"]),
                    fmt_duration(w["paired_median"]),
                    fmt_duration(w["predicted"]),
                    _r(ratio),
                    _hist_cell(hp, w["measured"], w.get("source_history")),
                    f"{w['storage_measured']:,}",
                    f"{w['storage_predicted']:,}",
                    _r(sratio),
                    f"{w['file_bytes']:,}",
                    fmt_bytes(w["fresh_bytes"]),
                ]
            )
        out.append(
            table(
                [
                    "strategy",
                    "write",
                    "(paired median)",
                    "model",
                    "pred/meas",
                    "history: pred/meas",
                    "storage B",
                    "model B",
                    "pred/meas",
                    "file B",
                    "fresh memory",
                ],
                body,
                "lrrrrrrrrrr",
            )
        )
        sc = m["storage_check"]
        targets.append(
            [
                m["kernel"],
                f"stats file within {STORAGE_TOLERANCE:.0%} of expression file",
                f"{sc['relative']:+.4%}",
                _ok(sc["met"]),
            ]
        )
        first = m["queries"][0]["where"].split(" < ")[0] if m["queries"] else m["component"]
        out.append(
            f"read: {first} < x, select=[{m['derived']!r}], exact=False "
            "(the block answer: the derived values over the candidate blocks, Eq. 2)"
        )
        out.append("")
        body = []
        for qd in m["queries"]:
            for s in STRATEGIES:
                r = qd["read"][s]
                body.append(
                    [
                        f"{qd['fraction']:.0%}",
                        f"{qd['achieved']:.1%} ({qd['candidates']}/{m['blocks']})",
                        s,
                        fmt_bytes(r["bytes_read"]),
                        fmt_bytes(r["model_bytes"]),
                        fmt_bytes(r["fresh_bytes"]),
                        fmt_duration(r["measured"]),
                        fmt_duration(r["predicted"]),
                        fmt_duration(r["total_measured"]),
                        fmt_duration(r["total_predicted"]),
                        _r(r["ratio"]),
                        _ok(r["met"]),
                        _hist_cell(
                            r.get("total_predicted_history"),
                            r["total_measured"],
                            r.get("source_history"),
                        ),
                        _ok(r["met_history"]) if "met_history" in r else "-",
                    ]
                )
                at = f"{m['blocks']} blocks, {s} total at {qd['fraction']:.0%}"
                targets.append(
                    [
                        m["kernel"],
                        f"{at}: model within {TOTAL_TOLERANCE:.0%}",
                        _r(r["ratio"]),
                        _ok(r["met"]),
                    ]
                )
                if "met_history" in r:
                    targets.append(
                        [
                            m["kernel"],
                            f"{at}: model on history within {TOTAL_TOLERANCE:.0%}",
                            _r(r["ratio_history"]),
                            _ok(r["met_history"]),
                        ]
                    )
        out.append(
            table(
                [
                    "query",
                    "achieved",
                    "strategy",
                    "bytes read",
                    "model bytes",
                    "fresh memory",
                    "read",
                    "model",
                    "total",
                    "model total",
                    "pred/meas",
                    "verdict",
                    "history: pred/meas",
                    "verdict",
                ],
                body,
                "lrlrrrrrrrrlrl",
            )
        )
        out.append(f"S3D case: vx where {first} < x (select=['vx'], exact answer)")
        out.append("")
        body = []
        for qd in m["queries"]:
            c = qd["s3d_check"]
            for s in STRATEGIES:
                v = qd["s3d"][s]
                store_b = qd["s3d"]["store"]["candidate_bytes"]
                body.append(
                    [
                        f"{qd['fraction']:.0%}",
                        s,
                        f"{v['candidate_bytes']:,}",
                        _r(v["candidate_bytes"] / store_b if store_b else None),
                        f"{v['exact_bytes']:,}",
                        f"{v['count']:,}",
                        fmt_duration(v["seconds"]),
                    ]
                )
            targets.append(
                [
                    m["kernel"],
                    f"S3D {qd['fraction']:.0%}: stats bytes within {S3D_TOLERANCE:.0%} of store",
                    _r(c["stats_vs_store"]),
                    _ok(c["stats_met"]),
                ]
            )
            targets.append(
                [
                    m["kernel"],
                    f"S3D {qd['fraction']:.0%}: expression reads all inputs",
                    f"{c['expression_vs_inputs']:.2f}x inputs",
                    _ok(c["expression_met"]),
                ]
            )
        out.append(
            table(
                [
                    "query",
                    "strategy",
                    "candidate bytes",
                    "vs store",
                    "exact bytes",
                    "matches",
                    "query time",
                ],
                body,
                "llrrrrr",
            )
        )
    out.append("#### targets")
    out.append("")
    out.append(table(["kernel", "target", "value", "verdict"], targets, "lllr"))
    met = sum(1 for t in targets if t[3] == "met")
    out.append(f"{met} of {len(targets)} targets met")
    return "\n".join(out)


# ------------------------------------------------------------------ main
def parser(prog: str = "lamina bench strategies") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Write three primary fields and one derived quantity kept as store, stats or "
            "expression; query them; compare measured time and storage with lamina.perf's model."
        ),
    )
    p.add_argument(
        "--size",
        default="256MiB",
        help="primary data in all, three float64 fields (default 256MiB)",
    )
    p.add_argument(
        "--blocks",
        default="64",
        help="blocks per dataset, comma-separated (default 64)",
    )
    p.add_argument(
        "--history",
        choices=list(HISTORY_SOURCES),
        default=None,
        help="what the model on measured history predicts from: earlier (an untimed run "
        "before, at the same block count; the default with one count), others (the runs at "
        "the other block counts; the default with several), host (this host's history)",
    )
    p.add_argument(
        "--fractions",
        default=DEFAULT_FRACTIONS,
        help=f"query fractions in percent, comma-separated (default {DEFAULT_FRACTIONS})",
    )
    p.add_argument(
        "--readers", type=int, default=1, help="readers in the totals: write + R x read (default 1)"
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="timed runs of every write and read (default 3)"
    )
    p.add_argument(
        "--kernels",
        default=",".join(CASES),
        help=f"comma-separated, from {', '.join(CASES)} (default {','.join(CASES)})",
    )
    p.add_argument(
        "--calibration",
        default="run",
        metavar="run|quick|cached|FILE",
        help="rates for the model: measured now (run, the default; quick: a quarter of the size), "
        "the cached calibration (cached), or a calibration file",
    )
    p.add_argument(
        "--dir",
        default=None,
        help="directory for the files (default: a new one under $TMPDIR, removed)",
    )
    p.add_argument("--keep", action="store_true", help="keep the files written")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the results as JSON on stdout (the table goes to stderr)",
    )
    return p


def _fractions(text: str) -> list[float]:
    vals = common.parse_list(text, "--fractions", float, "percentages")
    if not all(0 < v <= 100 for v in vals):
        raise ValueError(f"--fractions: percentages in (0, 100], got {text!r}")
    return [v / 100 for v in vals]


#: what ``--history`` may name, and what each predicts from (module docstring)
HISTORY_SOURCES = {
    "earlier": "an earlier, untimed run of the same writes and queries at the same block count",
    "others": "what the derived layer timed in this run at the other block counts",
    "host": "this host's history before the run",
}


def _histories(base: str, blocks: list[int], before, source: str):
    """Per block count, the measured history its predictions may use (``HISTORY_SOURCES``)."""
    from ..perf.history import History, load_history

    if source == "host":
        out = dict.fromkeys(blocks, before)
    elif source == "earlier":
        out = {b: load_history(_history_file(base, b, "earlier")) for b in blocks}
    else:
        runs = {b: load_history(_history_file(base, b)) for b in blocks}
        out = {b: History().merged(*(runs[o] for o in blocks if o != b)) for b in blocks}
    return out, HISTORY_SOURCES[source]


def _history_file(base: str, b: int, run: str = "timed") -> str:
    return os.path.join(base, f"history-{run}-{b}.json")


def run(
    size: int,
    blocks: int | list[int],
    fractions: list[float],
    readers: int,
    repeat: int,
    kernels: list[str],
    calibration: str = "run",
    directory: str | None = None,
    keep: bool = False,
    command: str = "lamina bench strategies",
    progress: Callable[[str], None] | None = None,
    history: str | None = None,
) -> dict:
    """Measure every kernel and strategy at every block count; the JSON document of the run.

    *history* names what the model on history predicts from (``HISTORY_SOURCES``; None:
    ``others`` with several block counts, ``earlier`` with one)."""
    from ..perf.history import load_history, wait_saves

    say = progress or (lambda _msg: None)
    counts = [blocks] if isinstance(blocks, int) else list(blocks)
    history = history or ("others" if len(counts) > 1 else "earlier")
    if history not in HISTORY_SOURCES:
        raise ValueError(f"history: one of {', '.join(HISTORY_SOURCES)}, got {history!r}")
    if history == "others" and len(counts) < 2:
        raise ValueError("history 'others' needs at least two block counts")
    load0 = os.getloadavg()[0]
    measure = calibration in ("run", "quick")
    quick = calibration == "quick"
    cals = [calibrate_now(quick, say)] if measure else []
    if not measure:  # read now: a bad file fails before the measurements
        cal, how = fixed_calibration(calibration)
    before = load_history()
    made = directory is None
    base = tempfile.mkdtemp(prefix="lamina-bench-strategies-") if made else directory
    os.makedirs(base, exist_ok=True)
    results = []
    saved = os.environ.get("LAMINA_HISTORY")
    try:
        for b in counts:
            shape = grid(size, b)
            if history == "earlier":  # the job run before: what it times predicts the timed runs
                os.environ["LAMINA_HISTORY"] = _history_file(base, b, "earlier")
                common.remove(_history_file(base, b, "earlier"))
                for k in kernels:
                    say(f"{k}, {b} blocks: the earlier run, untimed, records its history...")
                    m = measure_case(CASES[k], shape, b, fractions, repeat, base, lambda _m: None)
                    for p in m["paths"].values():
                        common.remove(p)
            # what the derived layer times in the timed runs goes to a history of their own
            os.environ["LAMINA_HISTORY"] = _history_file(base, b)
            common.remove(_history_file(base, b))
            for k in kernels:
                m = measure_case(CASES[k], shape, b, fractions, repeat, base, say)
                m["blocks"] = b
                m["shape"] = list(shape)
                results.append(m)
                if not keep:
                    for p in m["paths"].values():
                        common.remove(p)
                if measure:  # again after every kernel: a burst of load during one does not decide
                    cals.append(calibrate_now(quick, say))
        histories, history_source = _histories(base, counts, before, history)
    finally:
        wait_saves()  # whatever the runs measured goes to its files before they are removed
        if saved is None:
            os.environ.pop("LAMINA_HISTORY", None)
        else:
            os.environ["LAMINA_HISTORY"] = saved
        if not keep:
            for b in counts:
                common.remove(_history_file(base, b))
                common.remove(_history_file(base, b, "earlier"))
        if made and not keep:
            shutil.rmtree(base, ignore_errors=True)
    if measure:
        cal = best_rates(cals)
        how = (
            f"measured in this run, {len(cals)} times (before the first kernel and after each; "
            f"lamina.perf.calibrate({'quick=True' if quick else ''})), the best of each rate and of each block time"
        )
    for m in results:
        evaluate_case(m, tuple(m["shape"]), m["blocks"], readers, cal, histories[m["blocks"]])
    reads = [r for m in results for q in m["queries"] for r in q["read"].values()]
    return {
        "benchmark": "strategies",
        "command": command,
        "options": {
            "size": size,
            "blocks": counts,
            "fractions": fractions,
            "readers": readers,
            "repeat": repeat,
            "kernels": kernels,
            "calibration": calibration,
            "history": history,
        },
        "shape": results[0]["shape"] if results else list(grid(size, counts[0])),
        "input_bytes": len(INPUTS) * math.prod(grid(size, counts[0])) * common.ITEM,
        "machine": common.machine(),
        "load": [load0, os.getloadavg()[0]],
        "calibration_source": how,
        "calibration": json.loads(cal.to_json()),
        "calibrations": [json.loads(c.to_json()) for c in cals],
        "history": history,
        "history_source": history_source,
        "kernels": results,
        "all_met": all(r["met"] for r in reads)
        and all(
            q["s3d_check"]["stats_met"] and q["s3d_check"]["expression_met"]
            for m in results
            for q in m["queries"]
        )
        and all(m["storage_check"]["met"] for m in results),
        "all_met_history": bool(reads) and all(r.get("met_history", False) for r in reads),
    }


def model_checks(doc: dict) -> list[Check]:
    """The derived-quantity model's checks of this run: every total (write + queries) the
    model on history and the model on calibrated rates predicted, beside the measured one."""
    history: list[tuple[float, float]] = []
    calibrated: list[tuple[float, float]] = []
    for m in doc["kernels"]:
        for qd in m["queries"]:
            for s in STRATEGIES:
                r = qd["read"][s]
                calibrated.append((r["total_predicted"], r["total_measured"]))
                if r.get("total_predicted_history") is not None:
                    history.append((r["total_predicted_history"], r["total_measured"]))
    out = [Check.of("derived-calibration", calibrated, doc["command"])]
    if history:
        out.insert(0, Check.of("derived-history", history, doc["command"]))
    return out


def main(argv: list[str]) -> int:
    p = parser()
    ns = p.parse_args(argv)
    try:
        size = common.parse_size(ns.size)
        fractions = _fractions(ns.fractions)
    except ValueError as e:
        p.error(str(e))
    try:
        blocks = common.parse_int_list(ns.blocks, "--blocks")
    except ValueError as e:
        p.error(str(e))
    if len(set(blocks)) != len(blocks):
        p.error(f"--blocks: distinct integers of at least 1, got {ns.blocks!r}")
    if ns.repeat < 1:
        p.error("--repeat must be at least 1")
    if ns.readers < 0:
        p.error("--readers must be at least 0")
    try:
        # the fields of the largest block count (axis 0 a multiple of it, each block at
        # least 3 x 3 x 3, whatever --size says: --blocks 3000000 of --size 1MiB made 3 GB),
        # and as much again for what is computed and read back from them
        most = max(2 * math.prod(grid(size, b)) * len(INPUTS) * common.ITEM for b in blocks)
        common.check_memory(max(size, most), f"--size {ns.size} in --blocks {max(blocks)}")
    except ValueError as e:
        p.error(str(e))
    try:
        kernels = common.parse_choices(ns.kernels, "--kernels", CASES)
    except ValueError as e:
        p.error(str(e))
    command = "lamina bench strategies" + ("" if not argv else " " + shlex.join(argv))
    try:
        doc = run(
            size,
            blocks,
            fractions,
            ns.readers,
            ns.repeat,
            kernels,
            ns.calibration,
            ns.dir,
            ns.keep,
            command,
            progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True),
            history=ns.history,
        )
    except (OSError, ValueError, MemoryError) as e:
        print(f"lamina bench strategies: {e}", file=sys.stderr)
        return 2
    text = checks.add_to_report(model_checks(doc), report(doc), doc)
    common.emit(ns.json, text, doc)
    ok = all(q["s3d_check"]["counts_agree"] for m in doc["kernels"] for q in m["queries"])
    return 0 if ok else 1
