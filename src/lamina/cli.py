"""The ``lamina`` command: inspect files, dump data, convert to and from HDF5, demos, benchmarks.

::

    lamina ls FILE [PATH] [--json]              tree of groups and datasets, with attributes
    lamina info FILE DATASET [--step K] [--json]  blocks per step: box, statistics, size, location
    lamina dump FILE DATASET [--select S] [--step K] [--json]   values of a selection
    lamina convert SRC DST [--force] [--quiet] [--gzip N]     lamina <-> HDF5 (docs/hdf5.md)
    lamina demo ...                             lamina.demo.main(args)
    lamina bench ...                            lamina.bench.main(args)
    lamina query FILE --where EXPR ...          lamina.query.main(args)
    lamina model derived ...                    lamina.perf.main(args)
    lamina run WORKFLOW.yaml [--dry-run] ...    lamina.workflow_run.main(args)

Errors that come from the file or the arguments (lamina errors, missing
files, a bad ``--select``) print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import re
import shutil
import sys

import numpy as np

#: subcommands whose arguments go unparsed to ``<module>.main(argv)``
PASSTHROUGH = {
    "demo": "run a demonstration (arguments go to lamina.demo)",
    "bench": "run a benchmark (arguments go to lamina.bench)",
    "query": "select data by a condition over datasets and derived quantities (lamina query --help)",
    "model": "predict the costs of derived-quantity strategies (lamina model derived --help)",
    "run": "launch the tasks of a workflow file as one MPMD job (lamina run --help)",
}
#: the module of each pass-through subcommand (default: lamina.<name>)
PASSTHROUGH_MODULE = {"query": "lamina.query", "model": "lamina.perf", "run": "lamina.workflow_run"}


class CLIError(Exception):
    """A usage problem found by the command (reported like a lamina error: one line, status 2)."""


class SelectError(CLIError, ValueError):
    """A ``--select`` string that does not parse."""


# --------------------------------------------------------------------------
# entry point


def main(argv: list[str] | None = None) -> int:
    """Run the ``lamina`` command with *argv* (default: ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        return _passthrough(argv[0], argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors (argparse prints them)
        return _code(e.code)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    from .errors import LaminaError

    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `lamina dump ... | head`
        _silence_stdout()
        return 1
    except (LaminaError, OSError, CLIError) as e:
        print(f"lamina {args.command}: error: {_message(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lamina {args.command}: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="lamina",
        description="Inspect lamina files, dump their data, convert them to and from HDF5.",
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
        help="blocks of a dataset per step",
        description=(
            "Blocks of a dataset in each step: box, statistics (min, max, sum, count), "
            "stored and raw size, subfile, offset, codec, writer rank."
        ),
    )
    s.add_argument("file", metavar="FILE")
    s.add_argument("dataset", metavar="DATASET")
    s.add_argument(
        "--step", type=int, metavar="K", help="only step K (negative counts from the end)"
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
        help="e.g. '0:4,:,7' (default: everything)",
    )
    s.add_argument(
        "--step", type=int, default=-1, metavar="K", help="step to read (default: the last, -1)"
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_dump)

    s = sub.add_parser(
        "convert",
        help="convert lamina <-> HDF5",
        description=(
            "Convert a lamina file to HDF5 or an HDF5 file to lamina; the direction follows the kind "
            "of SRC. The HDF5 layout is described in docs/hdf5.md. Runs on one rank."
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


def _message(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# --------------------------------------------------------------------------
# opening


def _open(path: str):
    import lamina
    from lamina.errors import NotALaminaFileError

    try:
        return lamina.open(path, "r")
    except NotALaminaFileError:
        if os.path.isfile(path) and _is_hdf5(path):
            raise CLIError(
                f"{path!r} is an HDF5 file, not a lamina file; convert it with 'lamina convert {path} OUT.lam'"
            ) from None
        raise


def _is_hdf5(path: str) -> bool:
    try:
        import h5py

        return bool(h5py.is_hdf5(path))
    except Exception:
        return False


def _dataset(f, name: str):
    from lamina import Dataset
    from lamina.errors import NotFoundError

    obj = f[name]
    if not isinstance(obj, Dataset):
        names = [p for p, o in f.walk() if isinstance(o, Dataset)]
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise NotFoundError(f"{obj.name!r} is a group, not a dataset; datasets: {shown or 'none'}")
    return obj


# --------------------------------------------------------------------------
# ls


def cmd_ls(args) -> int:
    from lamina import Dataset

    with _open(args.file) as f:
        top = f if args.path.strip("/") == "" else f[args.path]
        nodes = [(top.name, top)]
        if not isinstance(top, Dataset):
            nodes += list(top.walk())
        infos = [_node_info(f, path, obj) for path, obj in nodes]
        nds = sum(1 for i in infos if i["type"] == "dataset")
        head = {
            "file": f.filename,
            "engine": f.engine.name,
            "steps": f.steps,
            "step_times": list(f.engine.catalog.step_times[: f.steps]),
            "closed": bool(f.engine.writer_closed),
            "datasets": nds,
            "nbytes": sum(i.get("nbytes", 0) for i in infos),
            "raw_nbytes": sum(i.get("raw_nbytes", 0) for i in infos),
        }
    if args.json:
        _print_json({**head, "nodes": infos})
        return 0
    state = "closed" if head["closed"] else "open for writing"
    print(
        f"{head['file']}: {head['engine']}, {_plural(head['steps'], 'step')} ({state}), "
        f"{_plural(nds, 'dataset')}, {fmt_bytes(head['nbytes'])} stored"
    )
    base = nodes[0][0].rstrip("/").count("/") if nodes[0][0] != "/" else 0
    for info in infos:
        depth = 0 if info["path"] == "/" else info["path"].count("/") - base
        pad = "  " * depth
        name = info["path"] if info is infos[0] else info["path"].rsplit("/", 1)[-1]
        if info["type"] == "group":
            print(f"{pad}{name if name == '/' else name.rstrip('/') + '/'}{_derived_note(info)}")
        else:
            print(f"{pad}{name}  {_dataset_line(info, head['steps'])}")
        for k, v in info["_attrs"].items():
            print(f"{pad}  @{k} = {fmt_value(v)}")
    return 0


def _node_info(f, path: str, obj) -> dict:
    from lamina import Dataset

    attrs = {k: obj.attrs[k] for k in obj.attrs}
    info: dict = {"path": path, "type": "dataset" if isinstance(obj, Dataset) else "group"}
    d = f.engine.definition(path) if path.strip("/") else None
    if d is not None and (isinstance(obj, Dataset) or path.strip("/") == d.name):
        info["derived"] = {"expression": d.text, "strategy": d.strategy}
        if len(d.components) > 1:
            info["derived"]["components"] = list(d.components)
    if isinstance(obj, Dataset):
        written, nblocks, nbytes, raw = [], 0, 0, 0
        for k in range(f.steps):
            blocks = obj.blocks(k)
            if blocks:
                written.append(k)
            nblocks += len(blocks)
            nbytes += sum(b.nbytes for b in blocks)
            raw += sum(b.raw_nbytes for b in blocks)
        info.update(
            shape=list(obj.shape),
            dtype=str(obj.dtype),
            fill=json_value(obj.fill),
            compression=list(obj.compression),
            steps_written=written,
            blocks=nblocks,
            nbytes=nbytes,
            raw_nbytes=raw,
        )
        info["_fill"] = obj.fill
    info["attrs"] = {k: json_value(v) for k, v in attrs.items()}
    info["_attrs"] = attrs
    return info


def _dataset_line(info: dict, nsteps: int) -> str:
    shape = (
        "("
        + ", ".join(str(n) for n in info["shape"])
        + ("," if len(info["shape"]) == 1 else "")
        + ")"
    )
    w = info["steps_written"]
    derived = info.get("derived")
    if w:
        steps = f"steps {fmt_ranges(w)} ({len(w)} of {nsteps})"
    elif derived is not None:
        steps = "computed when read"
    else:
        steps = "never written"
    size = fmt_bytes(info["nbytes"])
    if info["nbytes"] != info["raw_nbytes"]:
        size += f" (raw {fmt_bytes(info['raw_nbytes'])})"
    comp = fmt_codecs(info["compression"])
    return (
        f"{info['dtype']} {shape}  {steps}  {_plural(info['blocks'], 'block')}  {size}  "
        f"compression {comp}  fill {fmt_value(info['_fill'])}{_derived_note(info)}"
    )


def _derived_note(info: dict) -> str:
    """'  derived = EXPR (strategy S)' for a derived dataset or vector group, else ''."""
    d = info.get("derived")
    if d is None:
        return ""
    return f"  derived = {d['expression']} (strategy {d['strategy']})"


# --------------------------------------------------------------------------
# info


def cmd_info(args) -> int:
    with _open(args.file) as f:
        ds = _dataset(f, args.dataset)
        eng = f.engine
        steps = [eng.check_step(args.step)] if args.step is not None else list(range(f.steps))
        times = eng.catalog.step_times
        per_step = [(k, times[k] if k < len(times) else None, ds.blocks(k)) for k in steps]
        nsteps, fname = f.steps, f.filename
    if args.json:
        _print_json(
            {
                "file": fname,
                "dataset": ds.name,
                "shape": list(ds.shape),
                "dtype": str(ds.dtype),
                "fill": json_value(ds.fill),
                "compression": list(ds.compression),
                "steps": [
                    {
                        "step": k,
                        "time": t,
                        "blocks": [_block_json(b) for b in blocks],
                        "covered": sum(b.box.size for b in blocks),
                        "nbytes": sum(b.nbytes for b in blocks),
                        "raw_nbytes": sum(b.raw_nbytes for b in blocks),
                    }
                    for k, t, blocks in per_step
                ],
            }
        )
        return 0
    print(
        f"{ds.name}: {ds.dtype} {tuple(ds.shape)}, fill {fmt_value(ds.fill)}, "
        f"compression {fmt_codecs(ds.compression)}; {fname}: {_plural(nsteps, 'step')}"
    )
    if not per_step:
        print("no committed steps")
    for k, t, blocks in per_step:
        when = f"  committed {fmt_time(t)}" if t is not None else ""
        if not blocks:
            print(f"step {k}{when}: no blocks (reads as the fill value {fmt_value(ds.fill)})")
            continue
        covered = sum(b.box.size for b in blocks)
        pct = f" ({100.0 * covered / ds.size:.1f}%)" if ds.size else ""
        stored = sum(b.nbytes for b in blocks)
        raw = sum(b.raw_nbytes for b in blocks)
        print(
            f"step {k}{when}: {_plural(len(blocks), 'block')}, {covered} of {ds.size} elements{pct}, "
            f"{fmt_bytes(stored)} stored, {fmt_bytes(raw)} raw"
        )
        rows = [
            [
                "box",
                "min",
                "max",
                "sum",
                "count",
                "stored",
                "raw",
                "subfile",
                "offset",
                "codec",
                "rank",
            ]
        ]
        for b in blocks:
            st = b.stats
            rows.append(
                [
                    fmt_box(b.box),
                    fmt_num(st.min) if st else "-",
                    fmt_num(st.max) if st else "-",
                    fmt_num(st.sum) if st else "-",
                    str(st.count) if st else "-",
                    fmt_bytes(b.nbytes),
                    fmt_bytes(b.raw_nbytes),
                    b.subfile,
                    str(b.offset),
                    b.codec,
                    str(b.rank),
                ]
            )
        for line in fmt_table(rows, right={1, 2, 3, 4, 5, 6, 8, 10}):
            print("  " + line)
    return 0


def _block_json(b) -> dict:
    return {
        "box": {"start": list(b.box.start), "stop": list(b.box.stop)},
        "stats": None if b.stats is None else _stats_json(b.stats),
        "nbytes": b.nbytes,
        "raw_nbytes": b.raw_nbytes,
        "subfile": b.subfile,
        "offset": b.offset,
        "codec": b.codec,
        "rank": b.rank,
    }


def _stats_json(st) -> dict:
    return {
        "min": json_value(st.min),
        "max": json_value(st.max),
        "sum": json_value(st.sum),
        "count": int(st.count),
    }


# --------------------------------------------------------------------------
# dump


_INT = re.compile(r"[+-]?\d{1,19}")


def parse_select(text: str) -> tuple:
    """Parse a selection string like ``'0:4,:,7'`` or ``'...,-1'`` into ints, slices and Ellipsis.

    No ``eval``: the string is split at commas; each item is an int, ``...``,
    or a slice ``a:b`` / ``a:b:c`` with optional int parts.  Surrounding
    brackets are allowed; an empty string selects everything.  Raises
    :class:`SelectError` with the position of the bad item.
    """
    if not isinstance(text, str):
        raise SelectError(f"selection must be a string, got {type(text).__name__}")
    s = text.strip()
    if s.startswith("[") and s.endswith("]"):
        s = s[1:-1].strip()
    if s == "":
        return ()
    items = [p.strip() for p in s.split(",")]
    if len(items) > 1 and items[-1] == "":  # a trailing comma, as in numpy's a[0,]
        items.pop()
    out: list = []
    for i, item in enumerate(items, 1):
        where = f"bad selection {text!r}: item {i} ({item!r})"
        if item == "":
            raise SelectError(f"bad selection {text!r}: item {i} is empty")
        if item == "...":
            if Ellipsis in out:
                raise SelectError(f"bad selection {text!r}: only one '...' is allowed")
            out.append(Ellipsis)
        elif ":" in item:
            parts = [p.strip() for p in item.split(":")]
            if len(parts) > 3:
                raise SelectError(f"{where}: a slice has at most two ':' (start:stop:step)")
            vals = [None if p == "" else _int(p, where) for p in parts]
            vals += [None] * (3 - len(vals))
            if vals[2] is not None and vals[2] <= 0:
                raise SelectError(f"{where}: the slice step must be a positive integer")
            out.append(slice(*vals))
        else:
            out.append(_int(item, where))
    return tuple(out)


def _int(tok: str, where: str) -> int:
    if not _INT.fullmatch(tok):
        raise SelectError(f"{where}: expected an integer, a slice a:b:c or '...'")
    return int(tok)


def cmd_dump(args) -> int:
    key = parse_select(args.select)
    with _open(args.file) as f:
        ds = _dataset(f, args.dataset)
        view = f.at(args.step)
        k = view.index
        data = np.asarray(view[ds.name][key])
        nsteps = f.steps
        fname = f.filename
    sel = fmt_select(key)
    if args.json:
        _print_json(
            {
                "file": fname,
                "dataset": ds.name,
                "step": k,
                "select": sel,
                "shape": list(data.shape),
                "dtype": str(data.dtype),
                "data": json_value(data),
            },
            indent=None,
        )
        return 0
    print(f"{ds.name}[{sel}] at step {k} of {nsteps}: {data.dtype} {tuple(data.shape)}")
    width = max(40, shutil.get_terminal_size((120, 24)).columns)
    with np.printoptions(threshold=sys.maxsize, linewidth=width):
        print(fmt_value(data[()]) if data.ndim == 0 else np.array2string(data, separator=" "))
    return 0


# --------------------------------------------------------------------------
# convert


def cmd_convert(args) -> int:
    from .hdf5 import convert

    res = convert(
        args.src,
        args.dst,
        overwrite=args.force,
        progress=False if args.quiet else None,
        gzip=args.gzip,
    )
    for w in res.warnings:
        print(f"lamina convert: warning: {w}", file=sys.stderr)
    if not args.quiet:
        kind = (
            "lamina to HDF5"
            if res.direction == "lamina->hdf5"
            else (
                "HDF5 (made by lamina) to lamina"
                if res.source_kind == "lamina"
                else "HDF5 to lamina"
            )
        )
        print(
            f"{res.src} -> {res.dst} ({kind}): {_plural(res.groups, 'group')}, {_plural(res.datasets, 'dataset')}, "
            f"{_plural(res.steps, 'step')}, {_plural(res.blocks, 'block')}, {fmt_bytes(res.nbytes)} "
            f"in {res.seconds:.2f} s"
        )
    return 0


# --------------------------------------------------------------------------
# formatting helpers


def fmt_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    n = int(n)
    if abs(n) < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024.0
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}"
    return f"{n} B"  # pragma: no cover


def fmt_ranges(values: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    out, i = [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)


def fmt_box(box) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in zip(box.start, box.stop, strict=True)) + "]"


def fmt_select(key: tuple) -> str:
    if not key:
        return "..."
    parts = []
    for k in key:
        if k is Ellipsis:
            parts.append("...")
        elif isinstance(k, slice):
            a = "" if k.start is None else str(k.start)
            b = "" if k.stop is None else str(k.stop)
            parts.append(f"{a}:{b}" + ("" if k.step is None else f":{k.step}"))
        else:
            parts.append(str(k))
    return ", ".join(parts)


def fmt_codecs(codecs) -> str:
    if not codecs:
        return "none"
    out = []
    for c in codecs:
        params = ",".join(f"{k}={v}" for k, v in sorted(c.items()) if k != "id")
        out.append(c.get("id", "?") + (f"({params})" if params else ""))
    return "+".join(out)


def fmt_num(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (complex, np.complexfloating)):
        return format(complex(v), ".6g")
    return format(float(v), ".6g")


def fmt_value(v) -> str:
    """An attribute value or fill value for humans."""
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, list):
        return repr(v)
    a = np.asarray(v)
    if a.ndim == 0:
        return str(a[()])
    with np.printoptions(threshold=16, edgeitems=3, linewidth=sys.maxsize):
        body = " ".join(np.array2string(a, separator=", ").split()).replace("[ ", "[")  # one line
    return f"{body} ({a.dtype}, shape {a.shape})"


def fmt_time(t: float) -> str:
    try:
        return datetime.datetime.fromtimestamp(t).isoformat(sep=" ", timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return str(t)


def fmt_table(rows: list[list[str]], right: set[int] = frozenset()) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def json_value(v):
    """A value (str, list of str, numpy scalar or array) -> plain JSON data.

    Complex numbers become ``[re, im]``; NaN and infinities become the
    strings ``'nan'``, ``'inf'``, ``'-inf'`` (JSON has no such numbers).
    """
    if isinstance(v, str) or v is None:
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    if isinstance(v, complex):
        v = np.complex128(v)
    a = np.asarray(v)
    if a.dtype.kind == "c":
        a = np.stack([a.real, a.imag], axis=-1)
    out = a.tolist()
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        out = _fix_nonfinite(out)
    return out


def _fix_nonfinite(x):
    if isinstance(x, list):
        return [_fix_nonfinite(y) for y in x]
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    return x


def _print_json(obj, indent: int | None = 2) -> None:
    def strip(o):
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if not k.startswith("_")}
        if isinstance(o, list):
            return [strip(v) for v in o]
        return o

    print(json.dumps(strip(obj), indent=indent, allow_nan=False))


if __name__ == "__main__":  # python -m lamina.cli
    sys.exit(main())
