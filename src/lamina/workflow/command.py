"""``lamina run WORKFLOW.yaml``: launch the tasks of a workflow file as one MPMD job."""

from __future__ import annotations

import argparse
import sys

from .. import launch
from ..errors import LaminaError
from .file import MAX_RANKS, TRANSPORTS, load
from .launcher import command, environment, run, script


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lamina run",
        description=(
            "Launch the tasks of a workflow file (YAML) as one MPMD job, a section of mpiexec per task, "
            "with LAMINA_TRANSPORT and LAMINA_WORKFLOW set so that the names tasks write and read travel "
            "in memory (docs/transport.md, 'Launching a workflow: lamina run')."
        ),
    )
    p.add_argument("file", help="the workflow file")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print an equivalent shell script (the variables, each task's command, the launch); run nothing",
    )
    p.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="kill the whole job after S seconds (exit status 124)",
    )
    p.add_argument("--transport", choices=TRANSPORTS, help="override the file's transport")
    p.add_argument(
        "--max-ranks",
        type=int,
        default=MAX_RANKS,
        metavar="N",
        help=f"refuse more than N ranks in all (default {MAX_RANKS})",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    try:
        args = p.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    if args.timeout is not None and not args.timeout > 0:
        print(
            f"lamina run: error: --timeout must be > 0 seconds, got {args.timeout:g}",
            file=sys.stderr,
        )
        return 2
    if args.max_ranks < 1:
        print(
            f"lamina run: error: --max-ranks must be at least 1, got {args.max_ranks}",
            file=sys.stderr,
        )
        return 2
    try:
        wf = load(args.file, max_ranks=args.max_ranks)
        if args.dry_run:
            exe = launch.find_mpiexec(required=False) or "mpiexec"
            cmd = command(wf, exe, oversubscribe=launch.is_open_mpi(exe))
            print(script(wf, cmd, environment(wf, args.transport), args.transport))
            return 0
        return run(wf, args.transport, args.timeout)
    except (LaminaError, OSError) as e:
        print(f"lamina run: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # python -m lamina.workflow.command
    sys.exit(main())
