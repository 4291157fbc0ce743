"""``lamina run WORKFLOW.yaml``: launch the tasks of a workflow file as one MPMD job.

The launcher is not an MPI process: when :func:`main` is the program
(``lamina run``, ``python -m lamina run``, ``python -m
lamina.workflow.command``), importing lamina has initialized MPI already,
so before the launch it finalizes MPI and replaces its process with
:mod:`.standalone`, which runs the same command without MPI.
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import launch
from ..errors import LaminaError
from .file import MAX_RANKS, TRANSPORTS, load
from .launcher import command, environment, run, script

#: what ``__main__`` is when this function runs as the program: ``python -m lamina``,
#: ``python -m lamina.cli`` (``lamina run ARGS``) and ``python -m lamina.workflow.command``
#: (``ARGS``)
_PROGRAMS = {"lamina.__main__": True, "lamina.cli.__main__": True, "lamina.workflow.command": False}


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


def _is_program(argv: list[str]) -> bool:
    """True when this process is the ``lamina run`` command with *argv* (not a program that
    calls :func:`main`, such as a test)."""
    top = sys.modules.get("__main__")
    name = getattr(getattr(top, "__spec__", None), "name", None)
    if name in _PROGRAMS:
        with_run = _PROGRAMS[name]
    elif getattr(getattr(top, "main", None), "__module__", None) == "lamina.cli":
        with_run = True  # the ``lamina`` console script: ``from lamina.cli import main``
    else:
        return False
    return sys.argv[1:] == (["run", *argv] if with_run else argv)


def _leave_mpi(argv: list[str]) -> None:
    """When this process is the program and has MPI loaded (importing lamina initializes it),
    finalize MPI and replace this process with :mod:`.standalone`, which runs ``lamina run
    ARGV`` without it: the launcher must not be an MPI process (its own shared-memory segment,
    the SIGHUP handler of the library MPI loads).  Returns only when there is nothing to do (or
    the exec failed: the launch then goes on here)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or os.name != "posix" or not _is_program(argv):
        return
    from . import standalone

    if mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, [sys.executable, "-P", standalone.PATH, *argv])
    except OSError:  # pragma: no cover - the running Python cannot be run again
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    if args.timeout is not None and not args.timeout > 0:
        print(
            f"lamina run: error: --timeout must be > 0 seconds, got {args.timeout:g}",
            file=sys.stderr,
        )
        return 2
    if not 1 <= args.max_ranks <= launch.MAX_RANKS:
        print(
            f"lamina run: error: --max-ranks must be from 1 to {launch.MAX_RANKS:,} (what MPI "
            f"numbers in a launch), got {args.max_ranks}",
            file=sys.stderr,
        )
        return 2
    if not args.dry_run:
        _leave_mpi(argv)
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
