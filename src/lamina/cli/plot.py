"""``lamina plot``: a 2-D slice of a dataset as a PNG, or its per-step statistics (:mod:`lamina.plot`)."""

from __future__ import annotations

import os
import sys

from ..errors import suggest
from ..text import fmt_name, plural
from .common import CLIError, open_file


def add_parser(sub) -> None:
    s = sub.add_parser(
        "plot",
        help="draw a 2-D slice of a dataset, or its statistics per step, as a PNG",
        description=(
            "Draw a 2-D slice of DATASET at one step as an image with a colorbar (a vector derived "
            "quantity: its magnitude), or with --stats its min, mean and max per step from the "
            "block statistics alone (no data read). Needs matplotlib: pip install 'lamina[plot]'."
        ),
    )
    s.add_argument("file", metavar="FILE")
    s.add_argument("dataset", metavar="DATASET")
    s.add_argument(
        "--slice",
        action="append",
        default=[],
        metavar="DIM=INDEX",
        help="fix a dimension, by name (from the dataset's 'dims' attribute) or number, e.g. "
        "z=32; repeat for more; free dimensions beyond two are cut in the middle",
    )
    s.add_argument(
        "--step", type=int, default=-1, metavar="K", help="step to draw (default: the last, -1)"
    )
    s.add_argument(
        "-o", "--output", metavar="PNG", help="output file (default: a name from the dataset)"
    )
    s.add_argument(
        "--blocks", action="store_true", help="draw the boundaries of the blocks over the image"
    )
    s.add_argument(
        "--index",
        action="store_true",
        help="axes in index units even where the group has coordinate datasets",
    )
    s.add_argument(
        "--stats",
        action="store_true",
        help="min, mean and max per step from the block statistics instead of a slice",
    )
    s.add_argument("--cmap", default="inferno", help="matplotlib colormap (default inferno)")
    s.add_argument("--dpi", type=int, default=110, help="resolution (default 110)")
    s.set_defaults(func=cmd_plot)


#: the resolutions --dpi takes (a picture of a few MiB at the most; 0 is none)
DPI_MIN, DPI_MAX = 10, 1200


def _check_cmap(name: str) -> None:
    """CLIError naming close colormaps unless matplotlib knows *name* (nothing to check
    without matplotlib: the picture's own error says what is missing)."""
    try:
        import matplotlib
    except ImportError:
        return
    if name not in matplotlib.colormaps:
        raise CLIError(f"unknown colormap {name!r}.{suggest(name, matplotlib.colormaps)}")


def _default_name(args) -> str:
    # (a file name of printable characters: a newline or an escape in a dataset's name
    # made one holding them)
    base = "".join(c if c.isprintable() else "_" for c in args.dataset.strip("/"))
    base = base.replace("/", "_") or "data"
    if args.stats:
        return f"{base}_stats.png"
    where = "_".join(s.replace("=", "") for s in args.slice)
    step = "last" if args.step == -1 else str(args.step)
    return f"{base}{'_' + where if where else ''}_step{step}.png"


def cmd_plot(args) -> int:
    try:
        from .. import plot
    except ImportError as e:  # pragma: no cover - lamina.plot itself imports no matplotlib
        raise CLIError(str(e)) from None
    out = args.output or _default_name(args)
    if os.path.isdir(out):
        raise CLIError(f"{out!r} is a directory; give a file name with -o")
    ext = os.path.splitext(out)[1]
    if ext and ext.lower() != ".png":
        raise CLIError(f"the picture is a PNG: give -o a name ending in .png, not {out!r}")
    if not DPI_MIN <= args.dpi <= DPI_MAX:
        raise CLIError(f"--dpi must be between {DPI_MIN} and {DPI_MAX}, got {args.dpi}")
    _check_cmap(args.cmap)
    if args.stats:  # (a slice's options: taken and left unused, even nonsense, before)
        given = [
            o
            for o, on in (
                ("--slice", args.slice),
                ("--step", args.step != -1),
                ("--blocks", args.blocks),
                ("--index", args.index),
            )
            if on
        ]
        if given:
            raise CLIError(
                f"{', '.join(given)}: for a slice; --stats draws every step's statistics"
            )
    try:
        with open_file(args.file) as f:
            if args.stats:
                pic = plot.stats_png(f, args.dataset, out, dpi=args.dpi)
            else:
                pic = plot.slice_png(
                    f,
                    args.dataset,
                    out,
                    slices=args.slice,
                    step=args.step,
                    blocks=args.blocks,
                    coords=not args.index,
                    cmap=args.cmap,
                    dpi=args.dpi,
                )
            steps = f.steps
    except plot.NoMatplotlib as e:
        print(f"lamina plot: {e}", file=sys.stderr)
        return 2
    print(
        f"{fmt_name(str(pic.path))}: {fmt_name(pic.what)} ({pic.width}x{pic.height} px; "
        f"{plural(steps, 'step')} in {fmt_name(args.file)})"
    )
    return 0
