"""``lamina model derived``: predicted costs of the Store / Stats / Expression strategies;
``lamina model async``: predicted epoch times of synchronous and background I/O.

::

    lamina model derived --expr "magnitude(vx, vy, vz)" --query-fraction 0.1 \\
        --readers 3 --read-bandwidth 0.5GB/s [--shape 512,512,512] [--dtype f8] \\
        [--blocks 64] [--write-bandwidth BW] [--calibration FILE] [--json]
    lamina model async --bytes 64MiB [--ranks 4] [--compute 0.1,1] [--history FILE] [--json]
    lamina model checks [--file FILE] [--json]

Bad input prints one line on stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import Any, NoReturn

import numpy as np

from ..errors import ExpressionError
from ..text import (
    finite_json,
    fmt_bytes,
    fmt_duration,
    fmt_rate,
    parse_rate,
    parse_size,
    plural,
    table,
)
from . import asyncmodel as async_model
from . import checks
from .model import MAX_COUNT, STRATEGIES, best, combine, terms

PROG = "lamina model"
USAGE = f"""usage: {PROG} {{derived,async,checks}} [options]   ({PROG} NAME --help for the options)
  derived  predicted compute, write, read and total time and storage of keeping a derived
           quantity as data (store), as statistics only (stats) or as its expression only
  async    predicted epoch times of synchronous and background I/O (io='sync' / 'async'), from
           the I/O history measured on this machine, and the mode io='auto' would pick
  checks   how far both models' predictions fell from what their benchmarks measured on this
           machine (lamina bench strategies, lamina bench async), side by side"""


#: most writer ranks of ``lamina model async`` (a communicator's size is a C int)
MAX_RANKS = (1 << 31) - 1


class UsageError(ValueError):
    """Bad command-line input (one line on stderr, status 2)."""


def parse_bandwidth(text: str) -> float:
    """``'500MB/s'``, ``'2GiB/s'``, ... -> bytes per second (:func:`lamina.text.parse_rate`); UsageError otherwise."""
    try:
        return parse_rate(text)
    except ValueError as e:
        raise UsageError(str(e)) from None


def parse_shape(text: str) -> tuple[int, ...]:
    """``'512,512,512'`` (or ``512x512x512``) -> (512, 512, 512)."""
    parts = [p.strip() for p in re.split(r"[,x]", str(text))]
    if not parts or any(re.fullmatch(r"[+-]?[0-9]+", p) is None for p in parts):
        # (ASCII digits only: str.isdigit takes '²', which int() refuses, and '٣' as 3)
        raise UsageError(f"--shape: expected integers separated by commas, got {text!r}")
    shape = tuple(int(p) for p in parts)
    if min(shape) < 0:
        raise UsageError(f"--shape: a size is an integer >= 0, got {min(shape)} in {text!r}")
    return shape


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, status 2
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=f"{PROG} derived",
        description=(
            "Predict the compute, write, read and total time and the storage of a derived "
            "quantity kept as data (store), as block statistics (stats) or as its expression "
            "(expression), and recommend the cheapest. Rates come from this machine's "
            "calibration (measured once and cached)."
        ),
    )
    p.add_argument(
        "--expr", required=True, help="the derived quantity, e.g. 'magnitude(vx, vy, vz)'"
    )
    p.add_argument(
        "--shape",
        default="512,512,512",
        help="global shape of each input, comma-separated (default 512,512,512)",
    )
    p.add_argument("--dtype", default="f8", help="dtype of the inputs (default f8)")
    p.add_argument(
        "--blocks", default="64", help="blocks per component, at most its elements (default 64)"
    )
    p.add_argument(
        "--query-fraction",
        default="1",
        help="fraction of the data a query needs, in [0, 1] (default 1)",
    )
    p.add_argument("--readers", default="1", help="how many times the data are queried (default 1)")
    p.add_argument(
        "--read-bandwidth",
        default=None,
        help="read bandwidth of the storage, e.g. 0.5GB/s (default: calibrated page cache)",
    )
    p.add_argument(
        "--write-bandwidth",
        default=None,
        help="write bandwidth of the storage, e.g. 2GiB/s (default: calibrated page cache)",
    )
    p.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="use this calibration file as is (default: the cached one, measured if missing)",
    )
    p.add_argument(
        "--history",
        default=None,
        metavar="FILE|none",
        help="measured history the times come from where it has samples (default: this "
        "machine's, as strategy='auto' uses; 'none': the calibration alone)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _number(text: str, what: str, integer: bool = False, most: int = MAX_COUNT) -> Any:
    """*text* as a number (*integer*: an integer of at most *most*); UsageError otherwise."""
    try:
        v = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise UsageError(f"{what} must be {kind}, got {text!r}") from None
    if integer and v > most:
        got = repr(text) if len(text) <= 40 else f"an integer of {len(text.strip())} digits"
        raise UsageError(f"{what} must be at most {most}, got {got}")
    return v


def _print_json(doc: dict[str, Any]) -> None:
    print(json.dumps(finite_json(doc), indent=1, allow_nan=False))


def _expression_message(e: ExpressionError) -> str:
    msg = getattr(e, "reason", None) or str(e).splitlines()[0]
    if getattr(e, "position", None) is not None:
        msg += f" (at position {e.position})"
        if e.expression is not None:
            msg += f" in {e.expression!r}"
    return msg.replace("\n", " ")


def run_derived(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    shape = parse_shape(ns.shape)
    nblocks = _number(ns.blocks, "--blocks", integer=True)
    q = _number(ns.query_fraction, "--query-fraction")
    if not 0.0 <= q <= 1.0:
        raise UsageError(f"--query-fraction must be in [0, 1], got {ns.query_fraction}")
    readers = _number(ns.readers, "--readers", integer=True)
    if readers < 0:
        raise UsageError(f"--readers must be >= 0, got {readers}")
    if nblocks < 1:
        raise UsageError(f"--blocks must be >= 1, got {nblocks}")
    if nblocks > max(1, math.prod(shape)):
        raise UsageError(
            f"--blocks {nblocks}: more blocks than the {math.prod(shape)} elements of --shape"
        )
    b_r = parse_bandwidth(ns.read_bandwidth) if ns.read_bandwidth is not None else None
    b_w = parse_bandwidth(ns.write_bandwidth) if ns.write_bandwidth is not None else None

    from .calibrate import default_path, load_calibration, read_calibration

    if ns.calibration is not None:
        try:
            cal = read_calibration(ns.calibration)
        except (OSError, ValueError) as e:
            raise UsageError(f"--calibration {ns.calibration}: {e}") from None
        source = ns.calibration
    else:
        source = default_path()

        def note(path: str) -> None:
            print(
                f"{PROG}: calibrating this machine (once; cached at {path})...",
                file=sys.stderr,
                flush=True,
            )

        cal = load_calibration(source, on_measure=note)
    try:
        t = terms(
            ns.expr,
            shape,
            ns.dtype,
            nblocks=nblocks,
            read_bandwidth=b_r,
            write_bandwidth=b_w,
            calibration=cal,
        )
    except ExpressionError as e:
        raise UsageError(_expression_message(e)) from None
    from .history import default_path as history_default
    from .history import load_history

    if ns.history == "none":
        hist, hist_source = None, "none"
    else:
        hist_source = ns.history or history_default()
        hist = _history(ns.history, hist_source, load_history)
    preds = combine(t, q, readers, hist)
    choice = best(preds)
    if ns.json:
        doc = {
            "expression": ns.expr,
            "shape": list(shape),
            "dtype": np.dtype(ns.dtype).str,
            "blocks": nblocks,
            "query_fraction": q,
            "readers": readers,
            "read_bandwidth": t.read_bandwidth,
            "write_bandwidth": t.write_bandwidth,
            "terms": t.as_dict(),
            "predictions": {s: preds[s].as_dict() for s in STRATEGIES},
            "recommendation": choice,
            "calibration": {"path": source, **json.loads(cal.to_json())},
            "history": hist_source,
        }
        _print_json(doc)
        return 0
    print(report(ns.expr, shape, ns.dtype, nblocks, q, readers, t, preds, choice, source, cal))
    used = sorted({p.source for p in preds.values()})
    print(f"measured history: {hist_source} (times from: {', '.join(used)})")
    return 0


def report(expr, shape, dtype, nblocks, q, readers, t, preds, choice, source, cal) -> str:
    """The text report: the inputs, a table of the three strategies, the recommendation."""
    lines = [
        f"{PROG} derived: {expr} over {'x'.join(map(str, shape))} {np.dtype(dtype).name} "
        f"({t.inputs} input{'s' if t.inputs != 1 else ''}, {t.components} component"
        f"{'s' if t.components != 1 else ''}, {nblocks} block{'s' if nblocks != 1 else ''})",
        f"query fraction {q:g}, {readers} reader{'s' if readers != 1 else ''}; "
        f"read {fmt_rate(t.read_bandwidth)}, write {fmt_rate(t.write_bandwidth)}",
        f"compute {fmt_duration(t.compute_s)} per full evaluation "
        f"({t.bytes_per_element} B and {t.flops_per_element} operations per element, "
        f"{fmt_rate(t.memory_bandwidth)}, {cal.flop_rate / 1e9:.3g} Gop/s); "
        f"statistics {fmt_duration(t.stats_s)}"
        + (f"; gathering a writer's inputs {fmt_duration(t.gather_s)}" if t.gather_s else "")
        + (f"; first touches of the result {fmt_duration(t.fresh_s)}" if t.fresh_s else "")
        + (f"; a query's own time {fmt_duration(t.query_s)}" if t.query_s else ""),
        "times per block size, from the calibration's tables"
        if t.tables is not None
        else "times at the rates of large arrays (the calibration has no per-block tables)",
        "",
    ]
    body = []
    for s in STRATEGIES:
        p = preds[s]
        body.append(
            [
                s + (" *" if s == choice else ""),
                fmt_duration(p.compute_s),
                fmt_duration(p.write_s),
                fmt_duration(p.read_s),
                fmt_duration(p.total_s),
                fmt_bytes(p.storage_bytes),
                p.source,
            ]
        )
    lines.append(
        table(
            ["strategy", "compute", "write", "read (each)", "total", "storage", "times from"],
            body,
            "lrrrrrl",
        )
    )
    others = sorted((s for s in STRATEGIES if s != choice), key=lambda s: preds[s].total_s)
    nxt = others[0]
    lines.append(
        f"primary data (written by every strategy, not in the totals): "
        f"{fmt_bytes(t.input_bytes)}, {fmt_duration(preds[choice].primary_write_s)}"
    )
    lines.append(f"total = write + {readers} x read; compute = at the write and at every read")
    lines.append(f"calibration: {source} (host {cal.host})")
    lines.append(
        f"recommendation: {choice} (total {fmt_duration(preds[choice].total_s)}, "
        f"storage {fmt_bytes(preds[choice].storage_bytes)}; next: {nxt} "
        f"{fmt_duration(preds[nxt].total_s)})"
    )
    return "\n".join(lines)


def build_async_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=f"{PROG} async",
        description="Epoch times of one step of I/O and one compute phase: t_sync = t_io + t_comp, "
        "t_async = max(t_comp + t_copy, t_io), with t_io from the I/O rate fitted to the history "
        "of background steps on this host (linear and linear-log regressions on bytes and ranks) "
        "and t_copy from the steps' measured hand-over (else the copy rate measured at put).",
    )
    p.add_argument(
        "--bytes", required=True, help="bytes of one step, all ranks together (e.g. 64MiB)"
    )
    p.add_argument("--ranks", default="1", help="writer ranks (default 1)")
    p.add_argument(
        "--compute",
        default="0,0.01,0.1,1",
        help="compute phases to predict for, seconds, comma-separated (default 0,0.01,0.1,1)",
    )
    p.add_argument("--history", default=None, help="history file (default: this host's)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _rate_source(kind: str, r2: float, fit_all: async_model.Fit, calibrated: bool = False) -> str:
    """Words for where a prediction's I/O rate came from: the median rate of the history's
    steps of that size and rank count (kind ``local``) or the fit to every step."""

    def fit_words(k: str, r: float) -> str:
        return f"{k} fit to every step, r^2 {'-' if r != r else f'{r:.3f}'}"

    if kind == "calibration":
        return "this machine's calibration (no step in the history)"
    if kind == "beyond":
        return f"no step in the history within {async_model.BEYOND}x of this size: " + (
            "this machine's calibration" if calibrated else "the default rate"
        )
    if kind == "local":
        return (
            "median of the newest steps of this size and rank count "
            f"(not the {fit_words(fit_all.kind, fit_all.r2)})"
        )
    return fit_words(kind, r2)


def _history(given: str | None, path: str, load) -> Any:
    """The history at *path* by *load*; where the command names it (*given*), a UsageError
    unless it exists and holds samples of this host (the words of a file that is no history
    are the error's, not a warning that a later save rewrites it: these commands save none)."""
    import warnings

    from ..errors import LaminaWarning

    if given is None:
        return load(path)
    if not os.path.exists(given):
        raise UsageError(f"--history {given}: no such file")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", LaminaWarning)
        hist = load(path)
    if not hist.series:
        why = "; ".join(str(w.message).split(" (the next save")[0] for w in said)
        raise UsageError(
            f"--history {given}: no samples of this host in it (not a measured history, "
            f"another host or version, or empty){': ' + why if why else ''}"
        )
    for w in said:  # (samples left out of a history that has others: said as before)
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return hist


def run_async(argv: list[str]) -> int:
    ns = build_async_parser().parse_args(argv)
    try:
        nbytes = parse_size(ns.bytes)
    except ValueError as e:
        raise UsageError(f"--bytes: {e}") from None
    ranks = _number(ns.ranks, "--ranks", integer=True, most=MAX_RANKS)
    comps = [_number(c, "--compute") for c in str(ns.compute).split(",") if c.strip()]
    if nbytes <= 0 or ranks < 1 or not comps or not all(0 <= c < float("inf") for c in comps):
        raise UsageError("need --bytes > 0, --ranks >= 1 and finite compute times >= 0")
    path = ns.history or async_model.default_path()
    hist = _history(ns.history, path, async_model.load_history)
    cal = None
    sizes = [
        x1
        for name in (async_model.IO_SERIES, async_model.SYNC_IO_SERIES)
        for x1, _, _ in hist.samples(name)
    ]
    if not sizes or nbytes > async_model.BEYOND * max(sizes):
        from .calibrate import cached

        # a new machine, or steps far larger than any measured here: what its calibration says
        cal = cached()
    m = async_model.AsyncModel(hist, calibration=cal)
    preds = [m.predict(nbytes, ranks, c) for c in comps]
    fit = m.fit
    used = preds[0]  # every row is the same step size, so one rate source for all rows
    if ns.json:
        doc = {
            "history": path,
            "samples": len(m.history.samples(async_model.IO_SERIES)),
            "samples_waited": len(m.history.samples(async_model.SYNC_IO_SERIES)),
            "fit": used.fit,
            "r2": used.r2,
            "fit_all": fit.kind,
            "r2_all": fit.r2,
            "copy_rate": m.copy_rate(),
            "predictions": [p.as_dict() for p in preds],
        }
        _print_json(doc)
        return 0
    rows = [
        [
            fmt_duration(p.t_comp),
            fmt_duration(p.t_io_sync),
            fmt_duration(p.t_io),
            fmt_duration(p.t_copy),
            fmt_duration(p.t_sync),
            fmt_duration(p.t_async),
            p.mode,
        ]
        for p in preds
    ]
    print(
        f"one step of {fmt_bytes(nbytes)} from {plural(ranks, 'rank')}; history {path}: "
        f"{len(m.history.samples(async_model.IO_SERIES))} background steps, "
        f"{len(m.history.samples(async_model.SYNC_IO_SERIES))} waited for; "
        f"background I/O rate: {_rate_source(used.fit, used.r2, fit, cal is not None)}; "
        f"copy rate {fmt_rate(m.copy_rate())}"
    )
    print(
        table(
            [
                "t_comp",
                "t_io waited",
                "t_io background",
                "t_copy",
                "t_sync",
                "t_async",
                "io='auto' picks",
            ],
            rows,
        )
    )
    note = _async_note(m, used.fit, cal is not None)
    if note:
        print(note)
    return 0


def _async_note(m: async_model.AsyncModel, kind: str, calibrated: bool) -> str | None:
    """The footnote of ``lamina model async``: where ``t_io`` (and ``t_copy``) came from when
    not from the background steps measured on this host; *kind* the rows' rate source."""
    if kind not in ("calibration", "beyond") and m.history.samples(async_model.IO_SERIES):
        return None
    if kind not in ("calibration", "beyond") and m.history.samples(async_model.SYNC_IO_SERIES):
        said = ["t_io from the steps written while the program waited"]
    elif calibrated:
        said = ["t_io from the calibration's write of the step's bytes by one process"]
    else:
        said = [f"t_io assumes {fmt_rate(async_model.DEFAULT_IO_RATE)}"]
    if m.history.median_rate(async_model.COPY_SERIES) is None:
        said.append(
            "t_copy from its memcpy rate"
            if calibrated
            else f"t_copy assumes {fmt_rate(async_model.DEFAULT_COPY_RATE)}"
        )
    said_, them = ", ".join(said), ("them" if len(said) > 1 else "it")
    if kind == "calibration":
        return f"(no step measured on this host yet: {said_}; runs with io='async' or 'auto' measure {them})"
    if kind == "beyond":
        return (
            f"(no step measured on this host within {async_model.BEYOND}x of this size, the "
            f"largest {fmt_bytes(m.fit.hi[0])}: {said_}; runs with io='async' or 'auto' "
            f"writing steps of about this size measure {them})"
        )
    return (
        f"(no background step measured on this host yet: {said_}; runs with io='async' or "
        f"'auto' measure {them})"
    )


def run_checks(argv: list[str]) -> int:
    """``lamina model checks``: the models' last recorded errors on this host, side by side."""
    p = _Parser(
        prog=f"{PROG} checks",
        description=(
            "How far the derived-quantity model and the background I/O model predicted what "
            "their benchmarks (lamina bench strategies, lamina bench async) last measured on "
            "this machine: one row per model."
        ),
    )
    p.add_argument(
        "--file", help=f"the records (default $LAMINA_MODEL_CHECKS or {checks.default_path()})"
    )
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    ns = p.parse_args(argv)
    if ns.file is None:
        got = checks.load()
    else:  # named: a file that is no records is an error, not "nothing checked yet"
        try:
            got = checks.read_records(ns.file).get(checks.host(), {})
        except FileNotFoundError:
            raise UsageError(f"--file {ns.file}: no such file") from None
        except (OSError, ValueError) as e:
            why = str(e).removeprefix("model checks: ")
            raise UsageError(f"--file {ns.file}: not model checks ({why})") from None
    if ns.json:
        _print_json({m: c.as_dict() for m, c in got.items()})
    else:
        print(checks.table(got))
    return 0


def _glue_shape(argv: list[str]) -> list[str]:
    """*argv* with ``--shape -5,4`` written ``--shape=-5,4``: argparse takes a value starting
    with '-' for an option and says the shape is missing; :func:`parse_shape` says why it is
    wrong."""
    out: list[str] = []
    for a in argv:
        if out and out[-1] == "--shape" and a.startswith("-"):
            out[-1] = f"--shape={a}"
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run ``lamina model ARGS`` (*argv* without ``model``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        out = sys.stdout if argv else sys.stderr
        print(USAGE, file=out)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    commands = {"derived": run_derived, "async": run_async, "checks": run_checks}
    if name not in commands:
        print(
            f"{PROG}: error: unknown model {name!r}; choose from: {', '.join(commands)}",
            file=sys.stderr,
        )
        return 2
    rest = _glue_shape(rest)
    try:
        return commands[name](rest)
    except BrokenPipeError:  # e.g. `lamina model derived ... --json | head`
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except (UsageError, ValueError) as e:
        msg = str(e).replace("\n", " ")
        print(f"{PROG} {name}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG} {name}: interrupted", file=sys.stderr)
        return 130
