"""HTML views of files, groups and datasets for Jupyter (``_repr_html_``), from metadata alone.

The tree of groups and datasets with shapes, dtypes, the steps each dataset
was written in, block counts, stored and raw sizes, compression, fill
values, derived definitions and attributes, as ``lamina ls`` prints them;
nothing here reads data.  Collapsible sections are ``<details>`` elements,
so the output needs no script and reads the same in a notebook, in an
exported HTML page or in a plain browser.
"""

from __future__ import annotations

from collections.abc import Iterator
from html import escape
from typing import Any, NamedTuple

from ..engines.base import unusable_of
from ..errors import FormatError
from ..text import fmt_codecs, fmt_steps_written, fmt_stored, fmt_value, plural
from .facts import layout_facts, layout_words, storage_of_datasets

#: a tree with more nodes than this is shown to this many, then a count
MAX_NODES = 200

_STYLE = (
    "<style>"
    ".lamina-repr{font-family:var(--jp-code-font-family,monospace);font-size:12px;line-height:1.5}"
    ".lamina-repr summary{cursor:pointer}"
    ".lamina-repr ul{list-style:none;margin:0;padding-left:1.4em}"
    ".lamina-repr .lam-dim{color:var(--jp-content-font-color2,#777)}"
    ".lamina-repr .lam-name{font-weight:bold}"
    ".lamina-repr table{border-collapse:collapse;margin:2px 0 4px 0}"
    ".lamina-repr td{padding:0 8px 0 0;text-align:left;vertical-align:top}"
    "</style>"
)


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _definition(file, path: str, group: bool = False):
    """The derived quantity *path* is (a dataset: or a component of; a group: a vector's
    group), as ``lamina ls`` finds it (a component ``vort/x`` was shown as never written)."""
    p = path.strip("/")
    d = file.engine.definition(p) if p else None
    return d if d is not None and (not group or d.name == p) else None


def _attrs_table(obj) -> str:
    keys = list(obj.attrs)
    if not keys:
        return ""
    rows = "".join(
        f"<tr><td>@{escape(k)}</td><td>{escape(fmt_value(obj.attrs[k]))}</td></tr>" for k in keys
    )
    return f"<table>{rows}</table>"


def facts_of(file, datasets: list) -> dict[str, dict]:
    """What the repr shows of each of *datasets* (by name), from the block index only: their
    storage summed over the steps for all of them at once, as ``lamina ls`` sums it."""
    released: list[int] = []  # (an in situ consumer's steps gone: no data is read for a repr)
    sums = storage_of_datasets(file, datasets, released=released)
    unusable = file.engine.unusable()
    out = {}
    for ds in datasets:
        written, nblocks, stored, raw = sums.get(ds.name, ([], 0, 0, 0))
        compression = fmt_codecs(ds.compression)
        if ds.layout is not None:  # every band of every patch, as ls counts them
            try:
                lay = layout_facts(file, ds)
                stored, compression = lay["_stored"], layout_words(lay)
            except FormatError as e:
                compression = f"unreadable layout: {e}"
        # the derived quantity this lamina cannot evaluate that it is (or is a component of)
        bad = unusable_of(unusable, ds.name)
        out[ds.name] = {
            "written": written,
            "steps": file.steps,
            "blocks": nblocks,
            "stored": stored,
            "raw": raw,
            "compression": compression,
            "definition": _definition(file, ds.name),
            "unusable": None if bad is None else bad[1],  # why
            "released": len(released),
        }
    return out


def dataset_facts(ds) -> dict:
    """What the repr shows of a dataset, from the block index only."""
    return facts_of(ds.file, [ds])[ds.name]


def _dataset_line(ds, facts: dict) -> str:
    d = facts["definition"]
    steps = fmt_steps_written(facts["written"], facts["steps"], d is not None)
    bad = facts.get("unusable")
    if bad is not None and not facts["written"]:
        steps = "cannot be evaluated"
    if facts.get("released"):
        steps += f" ({plural(facts['released'], 'step')} released)"
    size = fmt_stored(facts["stored"], facts["raw"])
    parts = [
        f"{escape(str(ds.dtype))} {_shape(ds.shape)}",
        steps,
        plural(facts["blocks"], "block"),
        size,
        f"compression {escape(facts['compression'])}",
        f"fill {escape(fmt_value(ds.fill))}",
    ]
    line = " &nbsp; ".join(parts)
    if d is not None:
        line += f" &nbsp; derived = <code>{escape(d.text)}</code> (strategy {escape(d.strategy)})"
    elif bad is not None:
        line += f" &nbsp; derived, cannot be evaluated by this lamina: {escape(bad)}"
    return line


class _Shown(NamedTuple):
    """The part of a group's tree a repr shows: its members in order (a dataset, or a group
    with its own shown part), and how many more it leaves out."""

    members: list[tuple[Any, _Shown | None]]
    more: int


def _shown(g, budget: list[int]) -> _Shown:
    """The first ``budget[0]`` nodes of *g*'s tree, depth first, in the order of its keys
    (one walk: the facts of their datasets are then fetched together)."""
    from .dataset import Dataset

    members: list[tuple[Any, _Shown | None]] = []
    keys = g.keys()
    for i, k in enumerate(keys):
        if budget[0] <= 0:
            return _Shown(members, len(keys) - i)
        budget[0] -= 1
        obj = g[k]
        members.append((obj, None if isinstance(obj, Dataset) else _shown(obj, budget)))
    return _Shown(members, 0)


def _datasets(shown: _Shown) -> Iterator:
    for obj, sub in shown.members:
        if sub is None:
            yield obj
        else:
            yield from _datasets(sub)


def _node(obj, sub: _Shown | None, facts: dict[str, dict]) -> str:
    name = obj.name.rsplit("/", 1)[-1] or "/"
    if sub is None:
        line = _dataset_line(obj, facts[obj.name])
        attrs = _attrs_table(obj)
        head = f"<span class='lam-name'>{escape(name)}</span> <span class='lam-dim'>{line}</span>"
        if attrs:
            return f"<li><details><summary>{head}</summary>{attrs}</details></li>"
        return f"<li>{head}</li>"
    return f"<li><details open><summary>{_group_head(obj, name)}</summary>{_children(obj, sub, facts)}</details></li>"


def _group_head(g, name: str) -> str:
    d = _definition(g.file, g.name, group=True) if g.name != "/" else None
    note = (
        f" <span class='lam-dim'>derived = <code>{escape(d.text)}</code> (strategy {escape(d.strategy)})</span>"
        if d is not None
        else ""
    )
    label = name if name == "/" else name + "/"
    return f"<span class='lam-name'>{escape(label)}</span> <span class='lam-dim'>{plural(len(g), 'member')}</span>{note}"


def _children(g, shown: _Shown, facts: dict[str, dict]) -> str:
    items = [_node(obj, sub, facts) for obj, sub in shown.members]
    if shown.more:
        items.append(f"<li class='lam-dim'>... {shown.more} more</li>")
    return _attrs_table(g) + "<ul>" + "".join(items) + "</ul>"


def group_html(g) -> str:
    """A group (or a file, or a view at one step) as a collapsible tree."""
    file = g.file
    at = g._step  # on a File, .step begins a step; views keep the step they read here
    step = "" if at is None else f", at step {int(at)}"
    engine = file.engine
    state = "closed" if engine.closed else f"mode {escape(file.mode)!r}"
    if engine.closed:
        return f"<div class='lamina-repr'>lamina file {escape(file.filename)} (closed)</div>"
    if g.name == "/":
        title = (
            f"<b>lamina.File</b> {escape(file.filename)} &nbsp;<span class='lam-dim'>"
            f"{plural(file.steps, 'step')}{step}, engine {escape(engine.name)}, {state}</span>"
        )
    else:
        title = (
            f"<b>lamina.Group</b> {escape(g.name)} &nbsp;<span class='lam-dim'>"
            f"{plural(len(g), 'member')} in {escape(file.filename)}{step}</span>"
        )
    shown = _shown(g, [MAX_NODES])
    body = _children(g, shown, facts_of(file, list(_datasets(shown))))
    return f"{_STYLE}<div class='lamina-repr'>{title}{body}</div>"


def dataset_html(ds) -> str:
    """A dataset: its line of facts, then its blocks per step in short and its attributes."""
    file = ds.file
    if file.engine.closed:
        return f"<div class='lamina-repr'>lamina dataset {escape(ds.name)} (file closed)</div>"
    facts = dataset_facts(ds)
    title = (
        f"<b>lamina.Dataset</b> {escape(ds.name)} &nbsp;<span class='lam-dim'>in "
        f"{escape(file.filename)}</span>"
    )
    return (
        f"{_STYLE}<div class='lamina-repr'>{title}<ul><li>{_dataset_line(ds, facts)}</li></ul>"
        f"{_attrs_table(ds)}</div>"
    )
