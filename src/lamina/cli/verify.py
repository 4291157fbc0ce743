"""``lamina verify``: read every stored block of a file and check it against its checksums.

A file kept for years is read back seldom: a flipped bit on a disk or a
subfile cut short by a copy is found by the read that meets it, maybe
years later.  ``lamina verify FILE`` reads every block of every committed
step once, as stored, and checks it against the CRC-32C segments its
record holds; a block stored through a codec pipeline is decoded too (so a
codec this installation lacks is found now), a multiresolution band's
header is checked and the dataset's patches decoded from their bands.  It
goes on past a damaged block and names each one: its step, dataset, box,
subfile and bytes; a step's table of a dataset's blocks that fails its
checksum, or a layout this lamina cannot read, is named as the dataset's.
The metadata is checked by opening the file: a record left out there (a
damaged or cut-short last record, logs copied at different moments) is
reported as damage, and so is a last commit entry that fails its checksum
(:meth:`NativeEngine.unfinished_commit`).  Under
``mpiexec -n N`` the ranks share the reading and rank 0 prints the report.

Exit status: 0 when everything is intact, 1 when something is damaged (a
file whose damaged metadata keeps it from opening too), 2 when there is no
lamina file at the path or the command is wrong (as the other commands).  HDF5's
``h5check`` checks a file's format; ADIOS2 and zarr have no such command.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from .. import comm as comm_mod
from ..check import verify
from ..engines.native.format import COMMIT_NAME
from ..errors import FormatError, NotALaminaFileError
from ..text import fmt_bytes, fmt_name, fmt_steps, plural, print_json
from .common import open_file


def _unopenable(args, e: FormatError) -> int:
    """A lamina file that does not open (a record in the middle of its metadata damaged,
    its two logs from different files): damage, status 1, said by the first rank alone."""
    if comm_mod.world().rank == 0:
        if args.json:
            print_json({"file": args.file, "intact": False, "opens": False, "error": str(e)})
        else:
            print(f"{fmt_name(args.file)}: DAMAGED: the file does not open: {e}")
    return 1


def _steps_words(problems: list[dict[str, Any]]) -> str:
    return fmt_steps(sorted({p["step"] for p in problems}))


def cmd_verify(args) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            f = open_file(args.file)
        except FormatError as e:
            # no lamina file there: status 2, as the other commands; a lamina file (its commit
            # log is there) whose metadata is damaged, a log's header too: 1
            commit = os.path.join(args.file, COMMIT_NAME)
            if isinstance(e, NotALaminaFileError) and not os.path.lexists(commit):
                raise
            return _unopenable(args, e)
    notes = [str(w.message) for w in caught]
    try:
        report = verify(f, stats=args.stats)
    finally:
        f.close()
    report["metadata"] = notes
    if report["ranks"] > 1 and f.comm.rank != 0:
        return 0  # rank 0 speaks for all (every rank's status: rank 0's is the job's)
    damaged = bool(report["problems"] or report["records_left_out"] or report["commit_log"])
    if args.json:
        print_json({**report, "intact": not damaged})
        return 1 if damaged else 0
    shown = fmt_name(args.file)  # (on one line, escaped, as ls and info show it)
    for note in notes:  # (each names the file)
        print(note)
    if report["commit_log"]:
        print(report["commit_log"])
    for p in report["problems"]:
        print(f"{shown}: step {p['step']}: {p['error']}")
    checked = (
        f"format {report['format_version']}, "
        f"{plural(report['steps'], 'step')}, {plural(report['blocks'], 'block')}, "
        f"{fmt_bytes(report['bytes'])} read and checked"
    )
    if not damaged:
        print(f"{shown}: {checked}: intact")
        return 0
    parts = []
    blocks_bad = [p for p in report["problems"] if p["what"] == "block"]
    if blocks_bad:
        parts.append(
            f"{len(blocks_bad)} of {plural(report['blocks'], 'block')} damaged "
            f"({_steps_words(blocks_bad)})"
        )
    other = [p for p in report["problems"] if p["what"] != "block"]
    if other:  # a step's table of blocks, a layout, patches that do not decode
        n = len({p["dataset"] for p in other})
        parts.append(f"{plural(n, 'dataset')} unreadable ({_steps_words(other)})")
    if report["commit_log"]:
        parts.append("the commit log's last entry damaged")
    if report["records_left_out"]:
        parts.append(f"{plural(report['records_left_out'], 'committed record')} left out")
    print(f"{shown}: DAMAGED: {'; '.join(parts)}; {checked}", file=sys.stdout)
    return 1
