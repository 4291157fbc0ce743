"""``lamina query FILE --where EXPR ...``: the query engine (:mod:`lamina.query`) from the command line."""

from __future__ import annotations

import argparse
import sys
import textwrap

import numpy as np

from .. import selection
from ..text import fmt_box, fmt_name, fmt_num, print_json, table
from .common import CLIError, glue_dashed, guarded, open_file

USAGE_EPILOG = """\
examples:
  lamina query run.lam --where 'T > 1200'
  lamina query run.lam --where 'T > 1200 & vmag < 0.3' --select T,vx --step -1 --limit 20
  lamina query run.lam --where 'magnitude(curl(u, v, w)) > 1' --region '0:64,:,10:' --json
  lamina query run.lam --where '`fields/T` < 300' --blocks-only

Paths with '/' go in backticks. The condition combines comparisons with
& (and), | (or) and ~ (not); see lamina.derived for the functions.
"""


def select_names(text: str) -> list[str]:
    """``--select``'s names: split at commas, except inside backticks, where a name is written
    as the condition writes a path (`` `a,b` ``, a doubled backtick for one: `` `a``b` ``) and
    kept as written (spaces too); bare names lose the spaces around them.  CLIError for a
    backtick not closed."""
    names: list[str] = []
    pieces: list[tuple[bool, str]] = []  # (quoted, text) of the name being read

    def end_name() -> None:
        if pieces and not pieces[0][0]:
            pieces[0] = (False, pieces[0][1].lstrip())
        if pieces and not pieces[-1][0]:
            pieces[-1] = (False, pieces[-1][1].rstrip())
        name = "".join(t for _, t in pieces)
        if name:
            names.append(name)
        pieces.clear()

    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == ",":
            end_name()
            i += 1
        elif ch == "`":
            j, part = i + 1, []
            while True:
                if j >= n:
                    raise CLIError(f"--select: a backtick is not closed in {text!r}")
                if text[j] == "`":
                    if text[j + 1 : j + 2] != "`":
                        break
                    j += 1  # a doubled backtick: one, inside the name
                part.append(text[j])
                j += 1
            pieces.append((True, "".join(part)))
            i = j + 1
        else:  # bare characters: one piece up to the next comma or backtick
            if pieces and not pieces[-1][0]:
                pieces[-1] = (False, pieces[-1][1] + ch)
            else:
                pieces.append((False, ch))
            i += 1
    end_name()
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lamina query",
        description=(
            "Find the elements where a condition over datasets (primary or derived) holds. "
            "Block statistics first select the candidate blocks; the condition is then "
            "evaluated on them element by element. Prints what each answer read."
        ),
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--where", "-w", required=True, metavar="EXPR", help="the condition, e.g. 'T > 1200'"
    )
    p.add_argument(
        "--select",
        "-s",
        default="",
        metavar="A,B,...",
        help="datasets whose values to show at the matches (comma-separated paths; a name "
        "holding a comma in backticks, as in --where: `a,b`)",
    )
    p.add_argument(
        "--step",
        type=int,
        default=None,
        metavar="K",
        help="step to search (default: the last; negative counts from the end)",
    )
    p.add_argument(
        "--region",
        "-r",
        default=None,
        metavar="R",
        help="part of the domain to search, numpy-style without brackets, e.g. '0:10,:,5:'",
    )
    p.add_argument(
        "--level",
        type=int,
        default=0,
        metavar="K",
        help="answer at level K of multiresolution datasets (coordinates of that level; default 0)",
    )
    p.add_argument(
        "--blocks-only",
        action="store_true",
        help="stop after the candidate blocks (no exact answer)",
    )
    p.add_argument(
        "--limit",
        "-n",
        type=int,
        default=10,
        metavar="N",
        help="matches (or candidate blocks) to list (default: 10)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``lamina query`` with *argv* (default: ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(glue_dashed(list(sys.argv[1:] if argv is None else argv), parser))
    except SystemExit as e:  # --help, usage errors (argparse printed them)
        return e.code if isinstance(e.code, int) else 2
    return guarded("lamina query", lambda: _run(args))


def _run(args) -> int:
    if args.limit < 0:
        raise CLIError(f"--limit must be >= 0, got {args.limit}")
    select = select_names(args.select)
    region = selection.parse_text(args.region) if args.region is not None else None
    with open_file(args.file) as f:
        res = f.query(
            args.where,
            select=select,
            region=region,
            step=args.step,
            exact=not args.blocks_only,
            level=args.level,
        )
    if args.json:
        print_json({"file": args.file, **res.as_dict(limit=args.limit)})
    else:
        _print_text(res, args.limit)
    return 0


def _print_text(res, limit: int) -> None:
    print(res.summary())
    if not res.exact:
        shown = list(zip(res.candidates, res.certain, strict=True))[:limit]
        if shown:
            print(
                f"first {len(shown)} candidate blocks:"
                if len(shown) < len(res.candidates)
                else "candidate blocks:"
            )
            for b, sure in shown:
                print(f"  {fmt_box(b)}" + ("  (matches everywhere)" if sure else ""))
        return
    rows = res.matches(limit)
    if not rows:
        return
    head = "first " + str(len(rows)) + " matches:" if len(rows) < (res.count or 0) else "matches:"
    print(head)
    rows_text = [
        ["(" + ", ".join(str(i) for i in idx) + ")"]
        + [fmt_num(np.asarray(vals[p])[()]) for p in res.select]
        for idx, vals in rows
    ]
    columns = ["index", *map(fmt_name, res.select)]  # (names on one line, escaped)
    print(textwrap.indent(table(columns, rows_text, markdown=False), "  "))
