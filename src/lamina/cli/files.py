"""``lamina ls``, ``info``, ``dump`` and ``convert``: look into lamina files, convert them to and from HDF5 and OME-Zarr."""

from __future__ import annotations

import math
import shutil
import sys
import textwrap

import numpy as np

from .. import selection
from ..api.facts import layout_facts, layout_words, storage_of_datasets
from ..engines.base import storage_by_step, storage_of, unusable_of
from ..text import (
    fmt_box,
    fmt_bytes,
    fmt_codecs,
    fmt_duration,
    fmt_name,
    fmt_num,
    fmt_steps_written,
    fmt_stored,
    fmt_timestamp,
    fmt_value,
    json_value,
    plural,
    print_json,
    table,
)
from .common import CLIError, find_dataset, open_file

# --------------------------------------------------------------------------
# ls


def _io_decisions(f) -> tuple[list[dict] | None, bool, bool]:
    """The decisions of the last writer under io='auto' (docs/background.md), None if the file
    has none; whether they are all of its run (a file of an earlier version kept the last
    64); and whether that writer stopped without closing the file (it holds the decisions
    of the steps it committed)."""
    from lamina.errors import FormatError
    from lamina.perf.asyncmodel import decisions_unfinished, read_decisions

    ext = f.engine.catalog.ext
    try:
        got = read_decisions(ext)
    except FormatError:
        got = None
    if got is None:
        return None, True, False
    return got[0], got[1], not got[1] and decisions_unfinished(ext)  # (its head read again)


def _io_predicted(d: dict):
    """The t_io a decision predicted for the way its step was written: ``t_io_sync`` (the
    series of steps written while the program waited) for a synchronous one, else ``t_io``
    (written in the background): ``t_io_measured`` is the step's write in that mode."""
    if d.get("mode") == "sync" and isinstance(d.get("t_io_sync"), float | int):
        return d["t_io_sync"]
    return d.get("t_io")


def _decisions_line(decisions: list[dict], complete: bool = True, unfinished: bool = False) -> str:
    """One line: how io='auto' wrote the steps, and how far its I/O predictions were off;
    *complete*: *decisions* are every one of the run (else its last ones, or with
    *unfinished* those of the steps a writer that did not close the file committed)."""
    n_async = sum(1 for d in decisions if d.get("mode") == "async")
    errs = [
        abs(_io_predicted(d) - d["t_io_measured"]) / d["t_io_measured"]
        for d in decisions
        if isinstance(_io_predicted(d), float | int)
        and isinstance(d.get("t_io_measured"), float | int)
        and d["t_io_measured"] > 0
    ]
    err = f"; t_io predicted within {100 * float(np.median(errs)):.0f}% (median)" if errs else ""
    probes = sum(1 for d in decisions if d.get("probe") is True)
    tried = f", {probes} of them the other way to measure it again" if probes else ""
    n = len(decisions)
    head = f"io='auto' wrote {plural(n, 'step')}"
    if unfinished:  # a writer killed (or whose close failed): its committed steps' decisions
        head = (
            f"io='auto' wrote at least {plural(n, 'step')} (its writer did not close the file: "
            "the decisions of its last steps are not in it)"
        )
    elif not complete:  # a writer of an earlier version kept its last decisions only
        steps = [d.get("step") for d in decisions]
        span = f", steps {steps[0]}-{steps[-1]}" if all(isinstance(k, int) for k in steps) else ""
        head = f"io='auto' wrote at least {n} steps; of the last {n}{span}"
    return (
        f"{head}: {n_async} in the background, "
        f"{n - n_async} synchronously{tried}{err} (each decision: lamina info FILE)"
    )


def _file_head(f, infos: list[dict]) -> dict:
    """What ``lamina ls`` and ``lamina info FILE`` say of the file, *infos* its nodes'."""
    running = _writer_running(f)  # (first: it may look at the file again)
    return {
        "file": f.filename,
        "engine": f.engine.name,
        "format_version": f.format_version,
        "steps": f.steps,
        "step_times": list(f.engine.catalog.step_times[: f.steps]),
        "closed": bool(f.engine.writer_closed),
        "records_left_out": int(f.engine.records_left_out),
        "writer_running": running,
        "datasets": sum(1 for i in infos if i["type"] == "dataset"),
        "nbytes": sum(i.get("nbytes", 0) for i in infos),
        "raw_nbytes": sum(i.get("raw_nbytes", 0) for i in infos),
        # (dataset, step) pairs whose blocks fail their checks: left out of the sums
        "unreadable": sum(len(i.get("unreadable_steps", ())) for i in infos),
    }


def _writer_running(f) -> bool | None:
    """Whether a writer holds a native file that is not closed open now (None: closed, not a
    native file, or it cannot be told); False: its writer ended without closing it."""
    if f.engine.writer_closed or f.engine.name != "native":
        return None
    from lamina.engines.native.lock import writer_running

    if writer_running(f.filename):
        return True
    # no writer now: it ended without closing, or it closed since the file was read (its
    # close record is there now), and the steps it committed meanwhile too
    f.refresh()
    return None if f.engine.writer_closed else False


def _head_line(head: dict) -> str:
    state = "closed" if head["closed"] else "open for writing"
    if head["records_left_out"]:  # a copy cut short: whether a writer closed it is not known
        state = f"cut short: {plural(head['records_left_out'], 'committed record')} left out"
    elif head["writer_running"] is False:
        state = "not closed: its writer ended without closing it"
    version = head.get("format_version")
    engine = head["engine"] + (f" (format {version})" if version is not None else "")
    damaged = (
        f"; DAMAGED: {plural(head['unreadable'], 'dataset step')} unreadable (lamina verify "
        "tells every block)"
        if head.get("unreadable")
        else ""
    )
    return (
        f"{fmt_name(head['file'])}: {engine}, {plural(head['steps'], 'step')} ({state}), "
        f"{plural(head['datasets'], 'dataset')}, {fmt_bytes(head['nbytes'])} stored{damaged}"
    )


def cmd_ls(args) -> int:
    from lamina import Dataset

    with open_file(args.file) as f:
        top = f if args.path.strip("/") == "" else f[args.path]
        nodes = [(top.name, top)]
        if not isinstance(top, Dataset):
            nodes += list(top.walk())
        infos = _nodes_info(f, nodes)
        head = _file_head(f, infos)
        decisions, complete, unfinished = _io_decisions(f)
        if decisions is not None:
            head["io_decisions"] = decisions
    if args.json:
        print_json({**head, "nodes": infos})
        return 0
    print(_head_line(head))
    if decisions:
        print(_decisions_line(decisions, complete, unfinished))
    base = nodes[0][0].rstrip("/").count("/") if nodes[0][0] != "/" else 0
    for info in infos:
        depth = 0 if info["path"] == "/" else info["path"].count("/") - base
        pad = "  " * depth
        # (a name is one line: a newline or another control character in it escaped)
        name = fmt_name(info["path"] if info is infos[0] else info["path"].rsplit("/", 1)[-1])
        if info["type"] == "group":
            print(f"{pad}{name if name == '/' else name.rstrip('/') + '/'}{_derived_note(info)}")
        else:
            print(f"{pad}{name}  {_dataset_line(info, head['steps'])}")
        for k, v in info["_attrs"].items():
            print(f"{pad}  @{fmt_name(k)} = {fmt_value(v)}")
    return 0


def _nodes_info(f, nodes: list) -> list[dict]:
    """What ``lamina ls`` says of each of *nodes* (``(path, group or dataset)``), the
    storage of every dataset summed step by step at once (:func:`~lamina.api.facts.storage_of_datasets`)."""
    from lamina import Dataset

    damaged: dict[str, dict[int, str]] = {}
    stored = storage_of_datasets(f, [obj for _, obj in nodes if isinstance(obj, Dataset)], damaged)
    infos = [_node_info(f, path, obj, stored) for path, obj in nodes]
    for info in infos:
        if info["path"] in damaged:
            info["unreadable_steps"] = {str(k): e for k, e in damaged[info["path"]].items()}
    return infos


def _node_info(f, path: str, obj, stored: dict | None = None) -> dict:
    from lamina import Dataset
    from lamina.errors import FormatError

    attrs = {k: obj.attrs[k] for k in obj.attrs}
    info: dict = {"path": path, "type": "dataset" if isinstance(obj, Dataset) else "group"}
    d = f.engine.definition(path) if path.strip("/") else None
    if d is not None and (isinstance(obj, Dataset) or path.strip("/") == d.name):
        info["derived"] = {"expression": d.text, "strategy": d.strategy}
        if len(d.components) > 1:
            info["derived"]["components"] = list(d.components)
    bad = unusable_of(f.engine.unusable(), path)
    if bad is not None and (isinstance(obj, Dataset) or path.strip("/") == bad[0]):
        # a quantity the file defines that this lamina cannot evaluate: not a plain dataset
        info["derived"] = {"name": bad[0], "unusable": bad[1]}
    if isinstance(obj, Dataset):
        summed = None if stored is None else stored.get(path)
        if summed is not None:
            written, nblocks, nbytes, raw = summed
        else:
            written, nblocks, nbytes, raw = storage_by_step(obj, f.steps)
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
        try:
            lay = layout_facts(f, obj) if obj.layout is not None else None
        except FormatError as e:  # a layout this lamina cannot read: the others are listed
            info["error"] = str(e)
            lay = None
        if lay is not None:
            info["layout"] = {k: v for k, v in lay.items() if k not in ("levels", "subfiles")}
            info["layout"]["levels"] = [x["shape"] for x in lay["levels"]]
            info["nbytes"] = lay["_stored"]
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
    steps = fmt_steps_written(info["steps_written"], nsteps, info.get("derived") is not None)
    if not info["steps_written"] and "unusable" in info.get("derived", {}):
        steps = "cannot be evaluated"
    size = fmt_stored(info["nbytes"], info["raw_nbytes"])
    comp = fmt_codecs(info["compression"])
    lay = info.get("layout")
    if lay is not None:
        comp = layout_words(lay)
    if info.get("error"):  # (its layout: what it stores cannot be told)
        return f"{info['dtype']} {shape}  unreadable: {info['error']}"
    bad = info.get("unreadable_steps")
    damaged = ""
    if bad:  # (the steps whose blocks fail their checks: left out of the counts)
        first = next(iter(bad.values()))
        damaged = f"  unreadable at step {', '.join(bad)}: {first}"
    return (
        f"{info['dtype']} {shape}  {steps}  {plural(info['blocks'], 'block')}  {size}  "
        f"compression {comp}  fill {fmt_value(info['_fill'])}{_derived_note(info)}{damaged}"
    )


def _derived_note(info: dict) -> str:
    """'  derived = EXPR (strategy S)' for a derived dataset or vector group, else ''."""
    d = info.get("derived")
    if d is None:
        return ""
    if "unusable" in d:
        return f"  derived, cannot be evaluated by this lamina: {d['unusable']}"
    return f"  derived = {d['expression']} (strategy {d['strategy']})"


# --------------------------------------------------------------------------
# info


def _info_file(args) -> int:
    """``lamina info FILE``: the file (as ``lamina ls`` heads it) and every decision
    ``io='auto'`` made in writing it, with its predictions and what was measured after it
    (docs/background.md, "When async pays"); ``--step K``: step K's."""
    with open_file(args.file) as f:
        head = _file_head(f, _nodes_info(f, [("/", f), *f.walk()]))
        step = f.engine.check_step(args.step) if args.step is not None else None
        decisions, complete, unfinished = _io_decisions(f)
    if decisions is not None and step is not None:
        decisions = [d for d in decisions if d.get("step") == step]
    if args.json:
        print_json(
            {
                **head,
                "io_decisions": decisions,
                "io_decisions_all": complete,
                "io_decisions_unfinished": unfinished,
            }
        )
        return 0
    print(_head_line(head))
    if decisions is None:
        print("no io='auto' decisions (the file was not written with io='auto')")
    elif step is None:
        print(_decisions_line(decisions, complete, unfinished))
    if decisions:
        print(textwrap.indent(_decisions_table(decisions), "  "))
        print(
            "  (t_sync, t_async: the epochs predicted, the ranks together; t_io, t_copy, t_comp:"
            " rank 0's predictions; mode: as written, predicted: rank 0's model alone)"
        )
    elif decisions is not None:
        print(f"no io='auto' decision for step {step}")
    print("(the blocks of a dataset per step: lamina info FILE DATASET)")
    return 0


def _decisions_table(decisions: list[dict]) -> str:
    """One row per decision: the mode, the epochs predicted and measured, their parts."""

    def t(d: dict, *keys: str) -> str:
        for k in keys:
            v = d.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool):
                return fmt_duration(v)
        return "-"

    headers = [
        "step",
        "mode",
        "predicted",
        "probe",
        "t_sync",
        "t_async",
        "epoch measured",
        "t_io",
        "t_io measured",
        "t_copy",
        "t_comp",
        "t_comp measured",
        "fit",
    ]
    rows = [
        [
            str(d.get("step", "-")),
            str(d.get("mode", "-")),
            str(d.get("predicted", "-")),
            "yes" if d.get("probe") is True else "",
            t(d, "t_sync_ranks", "t_sync"),
            t(d, "t_async_ranks", "t_async"),
            t(d, "epoch_measured"),
            t({"t_io": _io_predicted(d)}, "t_io"),  # (for the way the step was written)
            t(d, "t_io_measured"),
            t(d, "t_copy"),
            t(d, "t_comp"),
            t(d, "t_comp_measured"),
            str(d.get("fit") or "-"),
        ]
        for d in decisions
    ]
    return table(headers, rows, align="rlllrrrrrrrrl", markdown=False)


def cmd_info(args) -> int:
    from lamina.errors import FormatError

    if args.dataset is None:
        return _info_file(args)
    with open_file(args.file) as f:
        ds = find_dataset(f, args.dataset)
        eng = f.engine
        steps = [eng.check_step(args.step)] if args.step is not None else list(range(f.steps))
        times = eng.catalog.step_times
        # step by step, each step's table read once: its blocks (each made once, the table
        # let go), their bytes summed from its columns, and the elements that hold values:
        # the blocks' own, or where a step has none (a quantity kept as its expression),
        # its anchor's
        per_step: list[tuple[int, float | None, list | None]] = []  # None: unreadable
        covers: dict[int, int] = {}
        sums: dict[int, tuple[int, int]] = {}
        # a derived quantity this lamina cannot evaluate: where it holds values is not known
        # (its coverage is refused), its blocks are what the file lists
        bad = unusable_of(f.engine.unusable(), ds.name)
        unreadable: dict[int, str] = {}  # the steps whose blocks fail their checks
        for k in steps:
            try:
                blocks = ds.blocks(k)
            except FormatError as e:  # (a damaged file: the other steps are listed)
                unreadable[k] = str(e)
                per_step.append((k, times[k] if k < len(times) else None, None))
                continue
            stored, raw = storage_of(blocks)
            sums[k] = (stored, raw)
            covers[k] = (
                raw // ds.dtype.itemsize
                if len(blocks)
                else 0
                if bad is not None
                else sum(b.size for b in ds.coverage(k))
            )
            per_step.append((k, times[k] if k < len(times) else None, list(blocks)))
        # a derived quantity with no blocks at a step is computed when read there: kept as its
        # expression, or kept as data or statistics from a step after this one (its declaration)
        d = eng.definition(ds.name.strip("/"))
        computed = (
            None
            if d is None
            else "expression"
            if d.strategy == "expression"
            else f"strategy {d.strategy!r}, nothing stored at this step"
        )
        nsteps, fname = f.steps, f.filename
        lay = layout_facts(f, ds) if ds.layout is not None else None
        bands = {} if lay is None else lay["_bands"]  # (a step that wrote none: 0 bytes)
    if args.json:
        print_json(
            {
                "file": fname,
                "dataset": ds.name,
                "shape": list(ds.shape),
                "dtype": str(ds.dtype),
                "fill": json_value(ds.fill),
                "compression": list(ds.compression),
                **({} if bad is None else {"derived": {"name": bad[0], "unusable": bad[1]}}),
                "layout": None
                if lay is None
                else {k: v for k, v in lay.items() if not k.startswith("_")},
                "steps": [
                    {"step": k, "time": t, "error": unreadable[k]}
                    if blocks is None
                    else {
                        "step": k,
                        "time": t,
                        "blocks": [_block_json(b) for b in blocks],
                        "covered": covers[k],
                        # (a multiresolution dataset's blocks are its patches' band 0: the
                        # step stores every band, as the text says and lamina ls counts)
                        "nbytes": bands.get(k, 0) if lay is not None else sums[k][0],
                        "raw_nbytes": sums[k][1],
                    }
                    for k, t, blocks in per_step
                ],
            }
        )
        return 0
    print(
        f"{fmt_name(ds.name)}: {ds.dtype} {tuple(ds.shape)}, fill {fmt_value(ds.fill)}, "
        f"compression {fmt_codecs(ds.compression) if lay is None else layout_words(lay)}; "
        f"{fmt_name(fname)}: {plural(nsteps, 'step')}"
    )
    if bad is not None:
        print(
            f"derived quantity {fmt_name(bad[0])}, cannot be evaluated by this lamina: {bad[1]}; "
            "reading it raises FormatError at a step that stores no values of it"
        )
    if lay is not None and "step" in lay:
        print(
            f"layout at step {lay['step']}: {lay['patches']} patches, order {lay['order']}, "
            f"distribution {lay['distribution']}, aggregation {lay['aggregation']}"
        )
        rows = [
            [
                str(x["level"]),
                "x".join(map(str, x["shape"])),
                str(x["blocks"]),
                fmt_bytes(x["band"]),
                fmt_bytes(x["stored"]),
                fmt_bytes(x["raw"]),
                f"{x['ratio']:.1f}" if x["ratio"] else "-",
            ]
            for x in lay["levels"]
        ]
        print(
            textwrap.indent(
                table(
                    ["level", "shape", "patches", "band", "read", "raw", "ratio"],
                    rows,
                    align="llrrrrr",
                    markdown=False,
                ),
                "  ",
            )
            + "\n  (band: the level's own band; read: the bytes a read of the level takes, its"
            " band and every coarser one; ratio: raw / read)"
        )
        loads = list(lay["subfiles"].values())
        mean = sum(loads) / len(loads) if loads else 0
        print(
            "  bytes per subfile: "
            + ", ".join(f"{n} {fmt_bytes(b)}" for n, b in lay["subfiles"].items())
            + (f" (max/mean {max(loads) / mean:.2f})" if mean else "")
        )
    if not per_step:
        print("no committed steps")
    size = ds.size  # (a product of the shape each time it is asked for)
    for k, t, blocks in per_step:
        when = f"  committed {fmt_timestamp(t)}" if t is not None else ""
        if blocks is None:
            print(f"step {k}{when}: unreadable: {unreadable[k]}")
            continue
        if not blocks:
            if bad is not None:
                print(f"step {k}{when}: no blocks (cannot be evaluated by this lamina)")
            elif computed and covers[k]:
                print(
                    f"step {k}{when}: no blocks: computed when read ({computed}), "
                    f"{covers[k]} of {size} elements"
                )
            else:
                print(f"step {k}{when}: no blocks (reads as the fill value {fmt_value(ds.fill)})")
            continue
        covered = covers[k]
        pct = f" ({100.0 * covered / size:.1f}%)" if size else ""
        stored, raw = sums[k]
        if lay is None:
            said = f"{fmt_bytes(stored)} stored, {fmt_bytes(raw)} raw"
        else:  # a block below is a patch's finest band; the step stores every band
            said = (
                f"{fmt_bytes(bands.get(k, 0))} stored in all bands, "
                f"{fmt_bytes(raw)} raw (a block below: its patch's band 0)"
            )
        print(
            f"step {k}{when}: {plural(len(blocks), 'block')}, {covered} of {size} elements{pct}, "
            + said
        )
        headers = [
            "box",
            "min",
            "max",
            "sum",
            "count",
            "stored" if lay is None else "band 0",
            "raw",
            "subfile",
            "offset",
            "codec",
            "rank",
        ]
        rows = []
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
        print(textwrap.indent(table(headers, rows, align="lrrrrrrlrlr", markdown=False), "  "))
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


#: the most bytes of values ``lamina dump`` reads and prints (1 GiB of float64 is already some
#: 3 GB of text): a larger selection is refused before anything is read
DUMP_LIMIT = 1 << 30


def cmd_dump(args) -> int:
    key = selection.parse_text(args.select)
    with open_file(args.file) as f:
        ds = find_dataset(f, args.dataset)
        view = f.at(args.step)
        k = view.index
        level = getattr(args, "level", 0)
        src = view[ds.name].level(level)
        shape = selection.parse(key, src.shape, f"dataset {ds.name!r}").result_shape
        size = math.prod(shape) * src.dtype.itemsize
        if size > DUMP_LIMIT:
            raise CLIError(
                f"{ds.name}[{selection.format_key(key)}] is {fmt_bytes(size)} "
                f"(shape {shape}), more than dump prints ({fmt_bytes(DUMP_LIMIT)}): select a part "
                "with --select (-s '0:10,:')"
            )
        data = np.asarray(src[key])
        nsteps = f.steps
        fname = f.filename
    sel = selection.format_key(key)
    if args.json:
        print_json(
            {
                "file": fname,
                "dataset": ds.name,
                "step": k,
                "select": sel,
                "level": level,
                "shape": list(data.shape),
                "dtype": str(data.dtype),
                "data": json_value(data),
            },
            indent=None,
        )
        return 0
    at = f" level {level}" if level else ""
    print(
        f"{fmt_name(ds.name)}[{sel}]{at} at step {k} of {nsteps}: {data.dtype} {tuple(data.shape)}"
    )
    width = max(40, shutil.get_terminal_size((120, 24)).columns)
    # (every value as stored: the shortest digits that tell it, as a 0-d value and --json give)
    with np.printoptions(threshold=sys.maxsize, linewidth=width, floatmode="unique"):
        print(fmt_value(data[()]) if data.ndim == 0 else np.array2string(data, separator=" "))
    return 0


# --------------------------------------------------------------------------
# convert


def cmd_convert(args) -> int:
    from ..omezarr import convert

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
        a, b = res.direction.split("->")
        names = {"lamina": "lamina", "hdf5": "HDF5", "zarr": "OME-Zarr"}
        source = names[a] + (
            " (made by lamina)" if a != "lamina" and res.source_kind == "lamina" else ""
        )
        print(
            f"{res.src} -> {res.dst} ({source} to {names[b]}): {plural(res.groups, 'group')}, {plural(res.datasets, 'dataset')}, "
            f"{plural(res.steps, 'step')}, {plural(res.blocks, 'block')}, {fmt_bytes(res.nbytes)} "
            f"in {res.seconds:.2f} s"
        )
    return 0
