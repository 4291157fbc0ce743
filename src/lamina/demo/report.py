"""The demo's report: from the writer's and the reader's measurements to a few lines of text."""

from __future__ import annotations

from . import simulation as sim

MiB = 1 << 20
#: steps shown in the table of the flame
MAX_ROWS = 10


def _mib(n: float) -> str:
    if n < MiB:
        return f"{n / 1024:,.1f} KiB"
    return f"{n / MiB:,.1f} MiB"


def _rate(nbytes: float, seconds: float) -> str:
    if seconds <= 0:
        return "-"
    rate = nbytes / MiB / seconds
    return f"{rate:,.0f} MiB/s" if rate >= 10 else f"{rate:.2f} MiB/s"


def _grid(dims) -> str:
    return "x".join(str(d) for d in dims)


def verdict_line(w: dict | None, r: dict | None, ok: bool) -> str:
    if not ok or w is None or r is None:
        return "lamina demo: FAILED"
    return (
        f"lamina demo: OK ({r['steps']} steps, {_mib(w['bytes'])} written by {w['ranks']} ranks "
        f"at {_rate(w['bytes'], w['write_s'])}, read back by {r['ranks']} ranks at "
        f"{_rate(r['bytes'], r['read_s'])}, every value checked)"
    )


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
            f"             {strategy:11s}  {_mib(q['candidate_bytes']):>12s} ({share:4.0%} of T)  "
            f"{_mib(q['exact_bytes']):>14s}   {q['seconds'] * 1e3:6.1f} ms"
        )
    return lines


def format_report(w: dict, r: dict, path: str, kept: bool, wall_s: float, how: str) -> str:
    """The full report (several lines, ending with the verdict line)."""
    nx, ny, nz = w["shape"]
    nds = len(w["datasets"])
    lines = [
        f"lamina demo: analytic 3-D premixed flame, {nx} x {ny} x {nz} cells, "
        f"{nds} fields ({w['dtype']}) + time, {r['steps']} steps",
        f"  write    {w['ranks']} ranks (grid {_grid(w['decomposition'])}, {w['blocks_per_rank']} blocks each), "
        f"{w['subfiles']} subfile(s){'' if w['durable'] else ', no fsync'}: "
        f"{_mib(w['bytes'])} in {w['write_s']:.2f} s = {_rate(w['bytes'], w['write_s'])}",
        f"           (+ {w['compute_s']:.2f} s simulating, {w['open_s']:.2f} s open/define, {w['close_s']:.2f} s close)",
        f"  read     {r['ranks']} ranks (grid {_grid(r['decomposition'])}): "
        f"{_mib(r['bytes'])} in {r['read_s']:.2f} s = {_rate(r['bytes'], r['read_s'])}",
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
    lines.append(
        f"  storage  {r['blocks_total']:,} blocks, {_mib(r['stored_bytes'])} of data, "
        f"{_mib(w['disk_bytes'])} on disk ({overhead:.2%} metadata)"
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
    lines.append(f"  total    {wall_s:.1f} s wall ({how})")
    lines.append(verdict_line(w, r, r["ok"]))
    return "\n".join(lines)
