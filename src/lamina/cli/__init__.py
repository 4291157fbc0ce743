"""The ``lamina`` command: inspect files, dump data, convert to and from HDF5 and OME-Zarr, demos, benchmarks.

::

    lamina ls FILE [PATH] [--json]              tree of groups and datasets, with attributes
    lamina info FILE [DATASET] [--step K] [--json]  blocks per step: box, statistics, size, location;
                                                without DATASET the file and io='auto''s decisions
    lamina dump FILE DATASET [--select S] [--step K] [--level L] [--json]   values of a selection
    lamina convert SRC DST [--force] [--quiet] [--gzip N]     lamina <-> HDF5, OME-Zarr (docs/hdf5.md, docs/omezarr.md)
    lamina verify FILE [--json]                 every stored block read and checked (:mod:`.verify`)
    lamina plot FILE DATASET [--slice z=32] [--step K] [-o OUT.png] [--blocks] [--stats]
    lamina demo ...                             lamina.demo.main(args)
    lamina bench ...                            lamina.bench.main(args)
    lamina query FILE --where EXPR ...          lamina.cli.query.main(args)
    lamina model derived ...                    lamina.perf.command.main(args)
    lamina run WORKFLOW.yaml [--dry-run] ...    lamina.workflow.command.main(args)

The commands that read files live in :mod:`.files` (ls, info, dump,
convert), :mod:`.plot` and :mod:`.query`; what they print is formatted by
:mod:`lamina.text`.

Errors that come from the file or the arguments (lamina errors, missing
files, a bad ``--select``) print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .common import CLIError, glue_dashed, guarded
from .files import cmd_convert, cmd_dump, cmd_info, cmd_ls
from .plot import add_parser as add_plot_parser
from .verify import cmd_verify

#: subcommands whose arguments go unparsed to ``<module>.main(argv)``
PASSTHROUGH = {
    "demo": "run a demonstration (arguments go to lamina.demo)",
    "bench": "run a benchmark (arguments go to lamina.bench)",
    "query": "select data by a condition over datasets and derived quantities (lamina query --help)",
    "model": "predicted costs: derived-quantity strategies, sync vs background I/O (lamina model derived|async --help)",
    "run": "launch the tasks of a workflow file as one MPMD job (lamina run --help)",
}
#: the module of each pass-through subcommand (default: lamina.<name>)
PASSTHROUGH_MODULE = {
    "query": "lamina.cli.query",
    "model": "lamina.perf.command",
    "run": "lamina.workflow.command",
}


# --------------------------------------------------------------------------
# entry point


def main(argv: list[str] | None = None) -> int:
    """Run the ``lamina`` command with *argv* (default: ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        return _passthrough(argv[0], argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(glue_dashed(argv, parser))
    except SystemExit as e:  # --help, --version, usage errors (argparse prints them)
        return _code(e.code)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return guarded(f"lamina {args.command}", lambda: args.func(args))


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = argparse.ArgumentParser(
        prog="lamina",
        description="Inspect lamina files, dump their data, convert them to and from HDF5 and OME-Zarr.",
        epilog="Run 'lamina COMMAND --help' for the options of a command.",
    )
    p.add_argument("--version", action="version", version=f"lamina {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser(
        "ls",
        help="list groups, datasets and attributes",
        description=(
            "Tree of groups and datasets: shape, dtype, the steps each dataset was written in, "
            "stored bytes, compression, fill value, attributes."
        ),
    )
    s.add_argument("file", metavar="FILE")
    s.add_argument(
        "path", metavar="PATH", nargs="?", default="/", help="group or dataset to list (default: /)"
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_ls)

    s = sub.add_parser(
        "info",
        help="blocks of a dataset per step; without DATASET the file and io='auto''s decisions",
        description=(
            "Blocks of a dataset in each step: box, statistics (min, max, sum, count), "
            "stored and raw size, subfile, offset, codec, writer rank. Without DATASET: the "
            "file (engine, steps, datasets, bytes stored) and every decision io='auto' made "
            "in writing it (docs/background.md): the mode each step was written in, the "
            "epochs predicted for both modes and their parts, and what was measured after it."
        ),
    )
    s.add_argument("file", metavar="FILE")
    s.add_argument(
        "dataset",
        metavar="DATASET",
        nargs="?",
        help="the dataset whose blocks to show (default: the file and its io decisions)",
    )
    s.add_argument(
        "--step",
        type=int,
        metavar="K",
        help="only step K (negative counts from the end): its blocks, or its io decision",
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser(
        "dump",
        help="print values of a dataset",
        description=(
            "Print the values of a selection of a dataset at one step. SELECT is numpy-style "
            "without brackets: comma-separated ints, slices a:b:c and '...', e.g. '0:4,:,7'."
        ),
    )
    s.add_argument("file", metavar="FILE")
    s.add_argument("dataset", metavar="DATASET")
    s.add_argument(
        "--select",
        "-s",
        default="...",
        metavar="SELECT",
        help="e.g. '0:4,:,7' or -1,0 (default: everything)",
    )
    s.add_argument(
        "--step", type=int, default=-1, metavar="K", help="step to read (default: the last, -1)"
    )
    s.add_argument(
        "--level",
        type=int,
        default=0,
        metavar="L",
        help="resolution level of a multiresolution dataset (0: full; SELECT in its coordinates)",
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_dump)

    s = sub.add_parser(
        "convert",
        help="convert lamina <-> HDF5 or OME-Zarr",
        description=(
            "Convert a lamina file to HDF5, or to OME-Zarr when DST ends in .zarr; convert an HDF5 "
            "file or an OME-Zarr store (a directory holding .zgroup, .zattrs or zarr.json) to "
            "lamina. The direction follows the kind of SRC. The layouts are described in "
            "docs/hdf5.md and docs/omezarr.md (OME-Zarr needs zarr-python: pip install "
            "'lamina[zarr]'). Runs on one rank."
        ),
    )
    s.add_argument("src", metavar="SRC")
    s.add_argument("dst", metavar="DST")
    s.add_argument("--force", "-f", action="store_true", help="replace DST if it exists")
    s.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress bar, no summary (warnings still show)",
    )
    s.add_argument(
        "--gzip",
        type=int,
        choices=range(10),
        metavar="LEVEL",
        help="compress the HDF5 datasets with gzip at LEVEL 0-9 (lamina -> HDF5 only)",
    )
    s.set_defaults(func=cmd_convert)

    s = sub.add_parser(
        "verify",
        help="read every stored block and check it against its checksums",
        description=(
            "Read every block of every committed step once, as stored, and check it against "
            "its CRC-32C checksums; decode blocks stored through a codec pipeline; check the "
            "metadata as an open does. Goes on past damage and names each damaged block "
            "(step, dataset, box, subfile, bytes). Exit status 0: intact; 1: damaged; 2: the "
            "file cannot be opened."
        ),
    )
    s.add_argument("file", metavar="FILE")
    s.add_argument(
        "--stats",
        action="store_true",
        help="also check each block's statistics against its values (raw and losslessly "
        "compressed blocks: count, min, max exactly, the sum within rounding)",
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_verify)

    add_plot_parser(sub)

    for name, text in PASSTHROUGH.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


def _passthrough(name: str, rest: list[str]) -> int:
    modname = PASSTHROUGH_MODULE.get(name, f"lamina.{name}")
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name != modname:
            raise
        mod = None
    fn = getattr(mod, "main", None)
    if fn is None:
        print(
            f"lamina {name}: error: not available in this installation ({modname}.main is missing)",
            file=sys.stderr,
        )
        return 2
    return _code(fn(list(rest)))


def _code(c) -> int:
    if c is None:
        return 0
    if isinstance(c, int):
        return c
    print(c, file=sys.stderr)
    return 1


__all__ = ["CLIError", "build_parser", "main"]
