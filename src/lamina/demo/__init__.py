"""``lamina demo``: a simulation writes, an analysis with another rank count reads back and checks.

The built-in simulation (:mod:`lamina.demo.simulation`) is an analytic 3-D
premixed flame: a thin, wrinkled, moving front makes the data uneven, as in
real combustion data.  The writer runs on ``--ranks`` MPI ranks, writes
``--steps`` steps of every field, and the reader, on ``--readers`` ranks
and another decomposition, reads every value back, compares it bit for bit
with the simulation, checks the per-block statistics, and reports sizes,
bandwidths and what the block statistics say about the flame.

Then, in situ (:mod:`lamina.demo.insitu`): a simulation program and an
analysis program run side by side in one MPMD launch, the analysis
following the simulation's steps as they come.  The same pair runs twice,
under ``LAMINA_TRANSPORT=memory`` (over MPI, nothing written) and
``LAMINA_TRANSPORT=file`` (through a native file), and the report shows
what moved, how fast, and that the analysis found the same numbers.

Started without ``mpiexec`` (the usual way), the demo launches ``mpiexec``
itself: once for the writer, once for the reader, and once per transport
for the in situ pair.  Started under ``mpiexec -n N`` (N > 1), it runs the
writer and the reader in place (the writer on all N ranks, the reader on
fewer) and skips the in situ part, which needs a launch of its own.

:func:`main` returns 0 only if every value was read back equal and the in
situ analysis found the same results under both transports.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from .. import comm as comm_mod
from ..launch import RANK_MEMORY, check_ranks
from ..machine import usable_memory
from ..text import fmt_bytes, positive_seconds
from . import launch, pair, phases, report
from .simulation import DEFAULT_SHAPE

__all__ = ["main"]


def _shape(text: str) -> tuple[int, ...]:
    """'64x64x128', '64,64,128', or 'N' for N x N x 2N."""
    parts = [p for p in text.replace("x", ",").replace("X", ",").split(",") if p.strip()]
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: use e.g. 64x64x128 or 64") from None
    if len(vals) == 1:
        vals = [vals[0], vals[0], 2 * vals[0]]
    if len(vals) != 3 or min(vals) < 1:
        raise argparse.ArgumentTypeError(
            f"the shape must be 3 positive integers (or one N for N x N x 2N), got {text!r}"
        )
    return tuple(vals)


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _ranks(text: str) -> int:
    """A count of ranks: at least 1, at most what MPI numbers (:data:`lamina.launch.MAX_RANKS`)."""
    n = _positive(text)
    try:
        return check_ranks(n, "ranks")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _ranks_pair(text: str) -> tuple[int, int]:
    """'P:C': simulation ranks : analysis ranks."""
    try:
        p, c = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"use SIM:ANALYSIS ranks, e.g. 2:1, not {text!r}"
        ) from None
    if min(p, c) < 1:
        raise argparse.ArgumentTypeError(f"both rank counts must be at least 1, got {text!r}")
    try:
        check_ranks(p + c, f"{text} (one launch)")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return p, c


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lamina demo",
        description="Run a built-in 3-D flame simulation on several MPI ranks, write it with lamina, "
        "read it back on a different number of ranks, check every value and report; then run a "
        "simulation and an analysis side by side in one MPMD launch, in memory and through a file, "
        "and compare.",
    )
    p.add_argument("--ranks", type=_ranks, default=4, help="writer (simulation) ranks (default 4)")
    p.add_argument("--readers", type=_ranks, default=3, help="reader (analysis) ranks (default 3)")
    p.add_argument("--steps", type=_positive, default=5, help="steps to write (default 5)")
    p.add_argument(
        "--shape",
        type=_shape,
        default=DEFAULT_SHAPE,
        metavar="NXxNYxNZ",
        help="global grid, e.g. 64x64x128 (default), or N for N x N x 2N",
    )
    p.add_argument(
        "--blocks",
        type=_positive,
        default=None,
        help="blocks per writer rank and field (default: up to 32, of at least 16^3 cells)",
    )
    p.add_argument(
        "--aggregators",
        type=_positive,
        default=None,
        help="subfiles the writers aggregate into (default: one per rank)",
    )
    p.add_argument(
        "--no-fsync", action="store_true", help="do not fsync at each commit (durable=False)"
    )
    p.add_argument("--out", default=None, help="directory for the file (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory and the file")
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=300.0,
        help="seconds allowed to each MPI program, more than 0 (default 300; inf: no limit)",
    )
    p.add_argument(
        "--insitu-steps",
        type=_positive,
        default=pair.DEFAULT_STEPS,
        help=f"steps of the in situ pair (default {pair.DEFAULT_STEPS})",
    )
    p.add_argument(
        "--insitu-ranks",
        type=_ranks_pair,
        default=pair.DEFAULT_RANKS,
        metavar="SIM:ANALYSIS",
        help="ranks of the in situ simulation and analysis (default {}:{})".format(
            *pair.DEFAULT_RANKS
        ),
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--skip-insitu", action="store_true", help="do not run the in situ pair (memory vs file)"
    )
    which.add_argument(
        "--insitu-only", action="store_true", help="run only the in situ pair (memory vs file)"
    )
    p.add_argument(
        "--picture",
        default=None,
        metavar="PNG",
        help="where to draw the flame (default: flame.png in --out, else lamina-demo-flame.png "
        "in the temporary directory); needs matplotlib",
    )
    p.add_argument(
        "--quiet", "-q", action="store_true", help="print only the verdict line (and draw nothing)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the exit status (0: every value read back equal)."""
    try:
        args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as e:  # --help, or a usage error already printed
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    world = comm_mod.world()
    if world.size > 1:
        if args.insitu_only:
            if world.rank == 0:
                print(
                    "lamina demo: --insitu-only launches its own MPMD job: run it without mpiexec",
                    file=sys.stderr,
                )
            return 1
        return _run_in_place(args, world)
    if os.environ.get(launch.CHILD_ENV):
        print(
            "lamina demo: refusing to start mpiexec from a rank the demo started", file=sys.stderr
        )
        return 2
    mpiexec = launch.find_mpiexec()
    if mpiexec is None and args.insitu_only:
        print(
            "lamina demo: no mpiexec found (install the 'mpich' wheel or an MPI): "
            "the in situ pair needs one to run side by side",
            file=sys.stderr,
        )
        return 1
    if mpiexec is None:
        print(
            "lamina demo: no mpiexec found (install the 'mpich' wheel or an MPI); "
            "running writer and reader in this process, on one rank each",
            file=sys.stderr,
        )
        return _run_in_place(args, world)
    if not _launches_fit(args):
        return 2
    return _run_launched(args, mpiexec)


def _launches_fit(args) -> bool:
    """Whether the ranks of the largest launch the demo will make fit in this machine's memory
    (:data:`lamina.launch.RANK_MEMORY` a rank, before any data); says why not."""
    sizes = [] if args.insitu_only else [args.ranks, args.readers]
    if not args.skip_insitu:
        sizes.append(sum(args.insitu_ranks))
    most = max(sizes)
    have = usable_memory()
    if have is not None and most * RANK_MEMORY > have:
        print(
            f"lamina demo: error: a launch of {most} ranks needs at least "
            f"{fmt_bytes(most * RANK_MEMORY)} of memory for the ranks alone; this machine has "
            f"{fmt_bytes(have)}",
            file=sys.stderr,
        )
        return False
    return True


# ------------------------------------------------------------------ helpers


def _workdir(args) -> tuple[str, str]:
    """(temporary directory for results, path of the .lam file)."""
    work = tempfile.mkdtemp(prefix="lamina-demo-")
    base = work
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        base = args.out
    return work, os.path.join(os.path.abspath(base), "flame.lam")


def _cleanup(args, work: str, ok: bool) -> bool:
    """Remove what the demo made, unless asked to keep it; returns whether the file is still there.

    After a failure the file stays for inspection (in --out, or in the temporary directory).
    """
    if args.keep:
        return True
    if ok or args.out:
        shutil.rmtree(work, ignore_errors=True)
    return bool(args.out) or not ok


def _say(args, msg: str) -> None:
    if not args.quiet:
        print(msg, flush=True)


def _picture(args, path: str) -> None:
    """Draw the temperature of the last step through the middle of y, with the blocks; say where.

    The same picture as ``lamina plot FILE flame/T --slice y=MID --blocks``.
    """
    if args.quiet:
        return
    from .. import plot

    out = args.picture or (
        os.path.join(args.out, "flame.png")
        if args.out
        else os.path.join(tempfile.gettempdir(), "lamina-demo-flame.png")
    )
    name = phases.dataset_path("T")
    try:
        with lamina_open(path) as f:
            mid = f[name].shape[1] // 2
            pic = plot.slice_png(f, name, out, slices=[f"y={mid}"], blocks=True)
    except plot.NoMatplotlib as e:
        print(f"lamina demo: no picture: {e}", flush=True)
        return
    except OSError as e:
        print(f"lamina demo: no picture: cannot write {out!r}: {e}", flush=True)
        return
    print(
        f"lamina demo: a picture of the flame ({pic.what}, block outlines): {pic.path}",
        flush=True,
    )


def lamina_open(path: str):
    """The demo's file, on this process alone, to draw it."""
    import lamina

    return lamina.open(path, "r", comm=comm_mod.self_comm(), transport="file")


def _insitu_skipped(args, why: str) -> str | None:
    """The report's note when the in situ pair cannot run here (None if it was not asked for)."""
    return None if args.skip_insitu else f"skipped: {why}"


def _finish(
    args,
    w: dict | None,
    r: dict | None,
    path: str,
    kept: bool,
    wall: float,
    how: str,
    ins: dict | None = None,
    ins_note: str | None = None,
) -> int:
    ok = report.demo_ok(w, r, ins, main_part=not args.insitu_only)
    if args.quiet:
        print(report.verdict_line(w, r, ok, ins))
        if r and not r.get("ok"):
            for e in r.get("errors", []):
                print(f"  {e}")
        for e in (ins or {}).get("problems", []):
            print(f"  in situ: {e}")
    else:
        print(report.format_report(w, r, path, kept, wall, how, insitu=ins, insitu_note=ins_note))
    return 0 if ok else 1


def _writer_args(args, path: str, result: str) -> list[str]:
    out = [
        "write",
        path,
        "--result",
        result,
        "--shape",
        "x".join(map(str, args.shape)),
        "--steps",
        str(args.steps),
        "--blocks",
        str(args.blocks),
    ]
    if args.aggregators:
        out += ["--aggregators", str(args.aggregators)]
    if args.no_fsync:
        out.append("--no-fsync")
    return out


def _run_launched(args, mpiexec: str) -> int:
    """The usual way: mpiexec runs of the writer, the reader and the in situ pair, then the report here."""
    t0 = time.perf_counter()
    if args.blocks is None:
        args.blocks = phases.auto_blocks(args.shape, args.ranks)
    try:
        work, path = _workdir(args)
    except OSError as e:
        print(f"lamina demo: cannot make the output directory: {e}", file=sys.stderr)
        return 1
    w = r = ins = None
    try:
        nx, ny, nz = args.shape
        if not args.insitu_only:
            _say(
                args,
                f"lamina demo: simulating a {nx}x{ny}x{nz} flame for {args.steps} steps on "
                f"{args.ranks} ranks, then checking it on {args.readers} ranks (in {os.path.dirname(path)})",
            )
            results = {}
            for role, n in (("write", args.ranks), ("read", args.readers)):
                result = os.path.join(work, f"{role}.json")
                if role == "write":
                    mod_args = _writer_args(args, path, result)
                else:
                    mod_args = ["read", path, "--result", result]
                done = launch.run(launch.mpi_command(mpiexec, n, mod_args), args.timeout)
                if done.timed_out or done.returncode != 0 or not os.path.exists(result):
                    _report_crash(
                        args, role, n, done, path if _cleanup(args, work, False) else None
                    )
                    return 1
                with open(result) as fh:
                    results[role] = json.load(fh)
            w, r = results["write"], results["read"]
        if not args.skip_insitu:
            sims, anas = args.insitu_ranks
            _say(
                args,
                f"lamina demo: in situ: the {nx}x{ny}x{nz} flame on {sims} ranks and an analysis on "
                f"{anas} rank{'s' if anas > 1 else ''} side by side, {args.insitu_steps} steps, "
                "through memory, then through a file",
            )
            ins = pair.run_demo(
                mpiexec,
                os.path.dirname(path),
                work,
                args.shape,
                args.insitu_steps,
                args.insitu_ranks,
                timeout=args.timeout,
                durable=not args.no_fsync,
            )
    except BaseException:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        raise
    ok = report.demo_ok(w, r, ins, main_part=not args.insitu_only)
    if ok and not args.insitu_only:
        _picture(args, path)
    kept = _cleanup(args, work, ok)
    launches = (0 if args.insitu_only else 2) + (len(ins["runs"]) if ins else 0)
    how = f"{launches} mpiexec launches"
    return _finish(args, w, r, path, kept, time.perf_counter() - t0, how, ins)


def _report_crash(args, role: str, n: int, done: launch.Launched, kept_path: str | None) -> None:
    if done.timed_out:
        why = f"timed out after {args.timeout:g} s"
    else:
        why = f"exited with status {done.returncode}"
    print(
        f"lamina demo: the {role}r ({n} ranks) {why}:\n  {' '.join(done.command)}", file=sys.stderr
    )
    tail = done.output.strip().splitlines()[-20:]
    if tail:
        print("\n".join("  | " + line for line in tail), file=sys.stderr)
    if kept_path:
        print(f"lamina demo: the file is left in {kept_path}", file=sys.stderr)
    print("lamina demo: FAILED", file=sys.stderr)


def _run_in_place(args, world) -> int:
    """Under ``mpiexec -n N``: write on all N ranks, read on fewer, report on rank 0."""
    t0 = time.perf_counter()
    rank, size = world.rank, world.size
    if args.blocks is None:
        args.blocks = phases.auto_blocks(args.shape, size)
    nread = min(args.readers, size)
    if nread == size and size > 1:
        nread = size - 1  # the point is a different rank count
    work = path = None
    guard = comm_mod.Guard()
    with guard:
        if rank == 0:
            work, path = _workdir(args)
    comm_mod.agree(world, guard.error)
    if rank == 0:
        if args.ranks != size and size > 1:
            _say(
                args,
                f"lamina demo: running under mpiexec: {size} writer ranks (not {args.ranks}), {nread} readers",
            )
    path = comm_mod.bcast_bytes(world, path.encode() if path else None).decode()
    w = phases.write(
        path,
        world,
        args.shape,
        args.steps,
        blocks_per_rank=args.blocks,
        aggregators=args.aggregators,
        durable=not args.no_fsync,
    )
    sub = world.Split(0 if rank < nread else 1, rank)
    try:
        r = phases.read(path, sub) if rank < nread else None
    finally:
        comm_mod.free(sub)
    status = 0
    if rank == 0:
        if r and r.get("ok"):
            _picture(args, path)
        kept = _cleanup(args, work, bool(r and r.get("ok")))
        status = _finish(
            args,
            w,
            r,
            path,
            kept,
            time.perf_counter() - t0,
            f"in place under mpiexec -n {size}" if size > 1 else "in this process",
            ins_note=_insitu_skipped(
                args,
                "it needs a launch of its own: run lamina demo without mpiexec"
                if size > 1
                else "no mpiexec to run the simulation and the analysis side by side",
            ),
        )
    return comm_mod.allreduce_int(world, status, "max") if size > 1 else status
