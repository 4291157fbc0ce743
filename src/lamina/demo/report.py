"""The demo's report: from the writer's and the reader's measurements to a few lines of text."""

from __future__ import annotations

from ..text import fmt_bytes
from . import simulation as sim

MiB = 1 << 20
#: steps shown in the table of the flame
MAX_ROWS = 10


def _rate(nbytes: float, seconds: float) -> str:
    if seconds <= 0:
        return "-"
    rate = nbytes / MiB / seconds
    return f"{rate:,.0f} MiB/s" if rate >= 10 else f"{rate:.2f} MiB/s"


def _grid(dims) -> str:
    return "x".join(str(d) for d in dims)


def demo_ok(w: dict | None, r: dict | None, insitu: dict | None, main_part: bool = True) -> bool:
    """The demo's verdict: every value read back equal (if that part ran), the in situ pair agreed (if it ran)."""
    ok = bool(w and r and r.get("ok")) if main_part else True
    return ok and (insitu is None or bool(insitu.get("ok")))


def _insitu_verdict(d: dict) -> str:
    times = ", ".join(
        f"through {'a ' if t == 'file' else ''}{t} in {x['analysis']['loop_s']:.2f} s"
        for t, x in d["runs"].items()
        if "analysis" in x
    )
    return (
        f"in situ: {d['steps']} steps, {fmt_bytes(d['expected_bytes'])} from {d['ranks'][0]} to "
        f"{d['ranks'][1]} ranks {times}, same analysis results"
    )


def verdict_line(w: dict | None, r: dict | None, ok: bool, insitu: dict | None = None) -> str:
    if not ok or (w is None or r is None) and insitu is None:
        return "lamina demo: FAILED"
    parts = []
    if w is not None and r is not None:
        parts.append(
            f"{r['steps']} steps, {fmt_bytes(w['bytes'])} written by {w['ranks']} ranks "
            f"at {_rate(w['bytes'], w['write_s'])}, read back by {r['ranks']} ranks at "
            f"{_rate(r['bytes'], r['read_s'])}, every value checked"
        )
    if insitu is not None:
        parts.append(_insitu_verdict(insitu))
    return f"lamina demo: OK ({'; '.join(parts)})"


def _speedup(slow: dict, fast: dict, key: str) -> float | None:
    """slow / fast of the analysis's *key* time (how many times faster *fast* was), or None."""
    try:
        a, b = slow["analysis"][key], fast["analysis"][key]
    except KeyError:
        return None
    return a / b if b > 0 else None


def _lamina_speedup(slow: dict, fast: dict) -> float | None:
    """Time in lamina calls, simulation + analysis: slow / fast."""
    try:
        a = slow["sim"]["lamina_s"] + slow["analysis"]["lamina_s"]
        b = fast["sim"]["lamina_s"] + fast["analysis"]["lamina_s"]
    except KeyError:
        return None
    return a / b if b > 0 else None


def insitu_lines(d: dict | None, note: str | None = None) -> list[str]:
    """The in situ part: the pair under each transport, the comparison, the analysis per step."""
    if d is None:
        return [f"  in situ  {note}"] if note else []
    nx, ny, nz = d["shape"]
    sims, anas = d["ranks"]
    runs = d["runs"]
    ok_runs = {t: x for t, x in runs.items() if "error" not in x}
    grids = ""
    if ok_runs:
        x = next(iter(ok_runs.values()))
        grids = (
            f" (grid {_grid(x['sim']['decomposition'])} -> {_grid(x['analysis']['decomposition'])})"
        )
    lines = [
        f"  in situ  a simulation on {sims} ranks and an analysis on {anas} rank{'s' if anas > 1 else ''}"
        f"{grids} side by side in one MPMD launch, run twice with",
        f"           LAMINA_TRANSPORT={' and ='.join(runs)}; unchanged programs, {d['steps']} steps x "
        f"{fmt_bytes(d['step_bytes'])} ({nx} x {ny} x {nz}, {len(sim.FIELDS)} fields)",
        f"           {sims + anas} ranks on {d['cpus']} cores{', oversubscribed' if sims + anas > d['cpus'] else ''}"
        f"; load average {d['load']:.1f} before the first run",
        "                                    simulation open..close    analysis open..close",
        "             transport  engine  moved      total (compute+lamina)   total (read+wait+compute)  "
        "rate (analysis)  job     left on disk",
    ]
    for t, x in runs.items():
        if "error" in x:
            lines.append(f"             {t:9s}  FAILED: the job {x['error']}")
            lines += [f"               | {line}" for line in x.get("output", [])]
            continue
        s, a = x["sim"], x["analysis"]
        left = fmt_bytes(x["left_bytes"]) if x["left"] else "nothing"
        wait = max(0.0, a["lamina_s"] - a["read_s"])
        lines.append(
            f"             {t:9s}  {a['engine']:6s}  {fmt_bytes(a['bytes']):>9s}  "
            f"{s['loop_s']:5.2f} s ({s['compute_s']:.2f} + {s['lamina_s']:.2f})    "
            f"{a['loop_s']:5.2f} s ({a['read_s']:.2f} + {wait:.2f} + {a['compute_s']:.2f})  "
            f"{_rate(a['bytes'], a['loop_s']):>12s}   {x['job_s']:4.1f} s  {left}"
        )
    if "memory" in ok_runs and "file" in ok_runs:
        mem, fil = ok_runs["memory"], ok_runs["file"]
        lines.append(
            f"           file time / memory time: {_speedup(fil, mem, 'loop_s'):.2f}x (analysis open..close), "
            f"{_lamina_speedup(fil, mem):.2f}x (time in lamina calls, both programs)"
        )
    lines.append(
        "           (measured inside the programs, slowest rank; lamina: open, writes, commits, close; "
        "wait: open, waiting for steps, close)"
    )
    if d["identical"]:
        lines.append(
            f"  analysis identical under {' and '.join(runs)}: every number below and the SHA-256 of all "
            f"{fmt_bytes(d['expected_bytes'])} it read"
        )
    for p in d["problems"]:
        lines.append(f"  analysis FAILED: {p}")
    rows = next((x["analysis"]["results"] for x in ok_runs.values()), [])
    if rows:
        lines.append(
            f"             step  t [ms]  mean T   burnt  front z  front speed   max |v|  fuel left"
            f"   (the simulation moves the front at {sim.S_T:g} m/s)"
        )
        if len(rows) > MAX_ROWS:
            n = len(rows) - 1
            rows = [rows[round(i * n / (MAX_ROWS - 1))] for i in range(MAX_ROWS)]
        for s in rows:
            speed = "-" if s["front_speed"] is None else f"{s['front_speed']:.3f} m/s"
            lines.append(
                f"           {s['step']:6d} {s['time'] * 1e3:7.3f} {s['mean_T']:6.0f} K {s['burnt']:6.1%} "
                f"{s['front_z']:8.1f} {speed:>12s} {s['max_speed']:5.2f} m/s {s['fuel_left']:9.1%}"
            )
    return lines


def _derived_lines(d: dict) -> list[str]:
    """Derived quantities: the check, and what the same query read under each strategy."""
    if not d:
        return []
    qs = d["queries"]
    first = next(iter(qs.values()))
    lines = [
        f"  derived  speed = magnitude(v) kept as store / stats / expression, vorticity = curl(v) (stats): "
        f"max relative error vs numpy.gradient {d['vorticity_error']:.1e}",
        f"  query    T where speed < {d['threshold']:.3f} m/s at step {d['step']}: "
        f"{first['candidates']} of {first['units']} blocks can match (from statistics), "
        f"{first['matches']:,} cells, mean T {first['mean_T']:.0f} K",
        "             strategy     candidate answer reads   exact answer reads   time",
    ]
    for strategy, q in qs.items():
        share = q["candidate_bytes"] / max(1, d["field_bytes"])
        lines.append(
            f"             {strategy:11s}  {fmt_bytes(q['candidate_bytes']):>12s} ({share:4.0%} of T)  "
            f"{fmt_bytes(q['exact_bytes']):>14s}   {q['seconds'] * 1e3:6.1f} ms"
        )
    return lines


def format_report(
    w: dict | None,
    r: dict | None,
    path: str,
    kept: bool,
    wall_s: float,
    how: str,
    insitu: dict | None = None,
    insitu_note: str | None = None,
) -> str:
    """The full report (several lines, ending with the verdict line).

    *w* and *r* are None when only the in situ part ran; *insitu* is
    :func:`lamina.demo.pair.run_demo`'s result, *insitu_note* says why it
    did not run.
    """
    lines = _main_lines(w, r, path, kept) if w is not None and r is not None else []
    main_part = w is not None or r is not None
    lines += insitu_lines(insitu, insitu_note)
    if insitu is not None:
        where = "kept" if kept else "removed; --keep keeps it"
        lines.append(f"  file     {insitu['path']} ({where})")
    lines.append(f"  total    {wall_s:.1f} s wall ({how})")
    lines.append(verdict_line(w, r, demo_ok(w, r, insitu, main_part), insitu))
    return "\n".join(lines)


def _main_lines(w: dict, r: dict, path: str, kept: bool) -> list[str]:
    """Writing, reading back, the check, derived quantities, queries, the flame per step."""
    nx, ny, nz = w["shape"]
    nds = len(w["datasets"])
    lines = [
        f"lamina demo: analytic 3-D premixed flame, {nx} x {ny} x {nz} cells, "
        f"{nds} fields ({w['dtype']}) + time, {r['steps']} steps",
        f"  write    {w['ranks']} ranks (grid {_grid(w['decomposition'])}, {w['blocks_per_rank']} blocks each), "
        f"{w['subfiles']} subfile(s){'' if w['durable'] else ', no fsync'}: "
        f"{fmt_bytes(w['bytes'])} in {w['write_s']:.2f} s = {_rate(w['bytes'], w['write_s'])}",
        f"           (+ {w['compute_s']:.2f} s simulating, {w['open_s']:.2f} s open/define, {w['close_s']:.2f} s close)",
        f"  read     {r['ranks']} ranks (grid {_grid(r['decomposition'])}): "
        f"{fmt_bytes(r['bytes'])} in {r['read_s']:.2f} s = {_rate(r['bytes'], r['read_s'])}",
    ]
    if r["ok"]:
        lines.append(
            f"  check    {r['values_checked']:,} values bit-identical to the simulation; "
            f"{r['blocks_checked']} block statistics match"
        )
    else:
        lines.append(
            f"  check    FAILED: {r['mismatched']:,} of {r['values_checked']:,} values differ, "
            f"{r['n_errors']} problem(s):"
        )
        lines += [f"           {e}" for e in r["errors"]]
    overhead = (w["disk_bytes"] - r["stored_bytes"]) / max(1, w["disk_bytes"])
    stats_only = r.get("stats_blocks", 0)
    lines.append(
        f"  storage  {r['blocks_total']:,} blocks, {fmt_bytes(r['stored_bytes'])} of data, "
        f"{fmt_bytes(w['disk_bytes'])} on disk ({overhead:.2%} metadata)"
        + (f"; + {stats_only:,} blocks of statistics only" if stats_only else "")
    )
    lines += _derived_lines(r.get("derived") or {})
    lines.append(
        f"  flame    T per block, from the metadata alone (fresh: max <= {sim.T_U + 1:g} K, "
        f"burnt: min >= {sim.T_B - 1:g} K; front z in cells):"
    )
    lines.append(
        "             step  t [ms]  front z  blocks  fresh  front  burnt  mean T   query T > 1000 K reads"
    )
    rows = r["per_step"]
    if len(rows) > MAX_ROWS:  # evenly spaced steps, always the first and the last
        n = len(rows) - 1
        rows = [rows[round(i * n / (MAX_ROWS - 1))] for i in range(MAX_ROWS)]
    for s in rows:
        share = s["query_bytes"] / max(1, s["bytes"])
        lines.append(
            f"           {s['step']:6d} {s['time'] * 1e3:7.3f} {s['front_cell']:8.1f} {s['blocks']:7d} "
            f"{s['fresh']:6d} {s['front']:6d} {s['burnt']:6d} {s['mean_T']:6.0f} K  "
            f"{s['query_blocks']:3d}/{s['blocks']} blocks ({share:.0%} of bytes)"
        )
    where = "kept" if kept else "removed; --keep keeps it"
    lines.append(f"  file     {path} ({where})")
    return lines
