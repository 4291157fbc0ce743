"""Pictures of lamina files: a 2-D slice of a dataset, per-step statistics from the block index.

Used by ``lamina plot`` and ``lamina demo``; needs matplotlib (the extra
``lamina[plot]``), drawn with the Agg canvas (no display, no pyplot state).

- :func:`slice_png`: one 2-D slice of a dataset at one step as an image
  with a colorbar, the axes in index units or in the units of the group's
  1-D coordinate datasets, the boundaries of the blocks that meet the slice
  optionally drawn over it; for a vector derived quantity (a group ``x``,
  ``y``, ``z``) its magnitude.  Only the blocks that meet the slice are read.
- :func:`stats_png`: min, mean and max of a dataset per step from the
  block statistics alone (no data read).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .api import Dataset, File
from .errors import NotFoundError, SelectionError, StepError
from .text import plural

INSTALL_HINT = "matplotlib is not installed: pip install 'lamina[plot]' (or pip install matplotlib)"


class NoMatplotlib(ImportError):
    """matplotlib is missing; the message says how to get it."""


def _figure(size: tuple[float, float]):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise NoMatplotlib(INSTALL_HINT) from None
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def dim_names(ds: Dataset) -> list[str]:
    """The dataset's dimension names: its ``dims`` attribute, else (a derived quantity) that of an
    input of its shape, else dim_0, dim_1, ..."""
    f = ds.file
    candidates = [ds]
    p = ds.name.strip("/")
    d = f.derived.get(p) or f.derived.get(p.rsplit("/", 1)[0] if "/" in p else "")
    if d is not None:
        candidates += [f[n] for n in sorted(d.inputs) if n in f]
    for c in candidates:
        if isinstance(c, Dataset) and c.shape == ds.shape and "dims" in c.attrs:
            v = c.attrs["dims"]
            names = [v] if isinstance(v, str) else [str(x) for x in np.ravel(v)]
            if len(names) == ds.ndim:
                return names
    return [f"dim_{i}" for i in range(ds.ndim)]


def components(f: File, obj) -> list[Dataset]:
    """A dataset alone, or the components of a vector derived quantity (a group x, y, z)."""
    if isinstance(obj, Dataset):
        return [obj]
    d = f.derived.get(obj.name.strip("/"))
    if d is not None and len(d.components) > 1:
        return [obj[k] for k in obj.keys()]
    raise NotFoundError(
        f"{obj.name!r} is a group, not a dataset or a vector derived quantity; "
        f"its members: {', '.join(obj.keys()) or 'none'}"
    )


def parse_slices(
    texts: Sequence[str], names: Sequence[str], shape: Sequence[int]
) -> dict[int, int]:
    """``["z=32", "1=-1"]`` -> {axis: index}; a dimension by name or by number, negative indices too."""
    out: dict[int, int] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        key = key.strip()
        if not sep:
            raise SelectionError(f"--slice {text!r}: use DIM=INDEX, e.g. z=32")
        if key in names:
            ax = list(names).index(key)
        elif key.lstrip("-").isdigit() and -len(shape) <= int(key) < len(shape):
            ax = int(key) % len(shape)
        else:
            raise SelectionError(
                f"--slice {text!r}: no dimension {key!r} (dimensions: {', '.join(names)})"
            )
        try:
            i = int(value)
        except ValueError:
            raise SelectionError(f"--slice {text!r}: the index must be an integer") from None
        n = shape[ax]
        if not -n <= i < n:
            raise SelectionError(
                f"--slice {text!r}: index out of range for {names[ax]} of length {n}"
            )
        out[ax] = i % n
    return out


@dataclass
class Picture:
    path: str
    width: int
    height: int
    what: str


def _written_by(ds: Dataset, step: int) -> int | None:
    """The step a coordinate's values come from at *step*: *step* where it was written then,
    else the last step before it that wrote it (a coordinate written once, in step 0, as
    ``to_lamina`` writes those that do not change), else None (it holds no values yet)."""
    for k in range(step, -1, -1):
        if ds.coverage(k):
            return k
    return None


def _coord(
    f: File, group: str, name: str, n: int, step: int, units: dict[str, str]
) -> np.ndarray | None:
    """The 1-D dataset *name* of length *n* in *group* or the nearest parent: a coordinate axis."""
    path = group.strip("/")
    while True:
        full = f"{path}/{name}" if path else name
        if full in f:
            obj = f.at(step)[full]
            if isinstance(obj, Dataset) and obj.shape == (n,):
                k = _written_by(obj, step)
                values = None
                if k is not None and sum(b.size for b in obj.coverage(k)) >= n:
                    values = np.asarray(f.at(k)[full][...], dtype=np.float64)
                why = None
                if values is None:
                    why = "no values"
                elif not np.isfinite(values).all():
                    why = "non-finite values"
                elif n > 1:
                    d = np.diff(values)
                    if not ((d > 0).all() or (d < 0).all()):
                        why = "values that neither rise nor fall throughout"
                if why is not None:
                    # fill values, NaN, or centers out of order are no axis (cells drawn at
                    # the wrong places, or of no width): the picture takes index axes instead
                    warnings.warn(
                        f"coordinate {full!r} holds {why} at step {step}: the {name} axis is "
                        "drawn by index",
                        stacklevel=3,
                    )
                    return None
                units[name] = str(obj.attrs["units"]) if "units" in obj.attrs else ""
                return values
        if not path:
            return None
        path = path.rsplit("/", 1)[0] if "/" in path else ""


def slice_png(
    f: File,
    name: str,
    out: str | os.PathLike,
    slices: Sequence[str] = (),
    step: int = -1,
    blocks: bool = False,
    coords: bool = True,
    cmap: str = "inferno",
    dpi: int = 110,
    title: str | None = None,
) -> Picture:
    """Draw a 2-D slice of dataset (or vector) *name* at *step* into the PNG *out*."""
    view = f.at(step)
    k = view.index
    comps = components(f, view[name])
    first = comps[0]
    names = dim_names(first)
    fixed = parse_slices(slices, names, first.shape)
    free = [ax for ax in range(first.ndim) if ax not in fixed]
    if len(free) > 2:  # the middle of the leading free axes
        for ax in free[: len(free) - 2]:
            fixed[ax] = first.shape[ax] // 2
        free = free[-2:]
    if len(free) != 2:
        raise SelectionError(
            f"{name!r} has shape {first.shape}: a picture needs 2 free dimensions, "
            f"{len(free)} are left after --slice"
        )
    # (an empty picture would pass for one; an empty axis cut in its middle holds no index)
    if any(first.shape[ax] == 0 for ax in free) or 0 in first.shape:
        raise SelectionError(f"{name!r} has shape {first.shape}: the slice holds no values")
    key = tuple(fixed.get(ax, slice(None)) for ax in range(first.ndim))
    if len(comps) == 1:
        data = np.asarray(first[key])
        what = name.strip("/")
    else:
        parts = [np.asarray(c[key], dtype=float) for c in comps]
        data = np.sqrt(sum(np.abs(p) ** 2 for p in parts))
        what = f"|{name.strip('/')}|"
    if np.iscomplexobj(data):
        data = np.abs(data)
        what = f"|{what}|"
    data = np.asarray(data, dtype=float)
    a, b = free
    parent = first.name.rsplit("/", 1)[0]
    cu: dict[str, str] = {}
    ca = _coord(f, parent, names[a], first.shape[a], k, cu) if coords else None
    cb = _coord(f, parent, names[b], first.shape[b], k, cu) if coords else None
    ya = ca if ca is not None else np.arange(first.shape[a] + 1) - 0.5
    xb = cb if cb is not None else np.arange(first.shape[b] + 1) - 0.5

    aspect = first.shape[b] / max(first.shape[a], 1)
    w = float(np.clip(3.2 + 3.2 * aspect, 4.5, 11.0))
    fig = _figure((w, 4.2))
    axes = fig.add_subplot()
    if ca is None and cb is None:
        extent = (xb[0], xb[-1], ya[0], ya[-1])
        im = axes.imshow(
            data, origin="lower", extent=extent, cmap=cmap, aspect="equal", interpolation="nearest"
        )
    else:
        im = axes.pcolormesh(
            _edges(xb, cb is not None), _edges(ya, ca is not None), data, cmap=cmap, shading="flat"
        )
        axes.set_aspect("equal" if ca is not None and cb is not None else "auto")
    units = first.attrs["units"] if "units" in first.attrs else None
    bar = fig.colorbar(im, ax=axes, shrink=0.9)
    bar.set_label(f"{what} [{units}]" if units is not None else what)
    axes.set_xlabel(_label(names[b], cb is not None, cu))
    axes.set_ylabel(_label(names[a], ca is not None, cu))
    where = ", ".join(f"{names[ax]}={i}" for ax, i in sorted(fixed.items()))
    axes.set_title(title or f"{what} at step {k}" + (f", {where}" if where else ""), fontsize=10)
    if blocks:
        _draw_blocks(
            axes,
            first,
            k,
            fixed,
            a,
            b,
            ya if ca is None else _edges(ca, True),
            xb if cb is None else _edges(cb, True),
        )
    out = os.fspath(out)
    fig.savefig(out, dpi=dpi, format="png")  # to *out* as named (no '.png' added)
    wpx, hpx = (int(round(v)) for v in fig.get_size_inches() * dpi)
    return Picture(out, wpx, hpx, f"{what} at step {k}" + (f", {where}" if where else ""))


def _label(name: str, coordinate: bool, units: dict[str, str]) -> str:
    if not coordinate:
        return f"{name} (index)"
    return f"{name} [{units[name]}]" if units.get(name) else name


def _edges(c: np.ndarray, centers: bool) -> np.ndarray:
    """Cell edges from cell centers (coordinates), or the edges themselves (indices)."""
    if not centers:
        return c
    if len(c) == 1:
        return np.array([c[0] - 0.5, c[0] + 0.5])
    mid = (c[1:] + c[:-1]) / 2
    return np.concatenate(([c[0] - (mid[0] - c[0])], mid, [c[-1] + (c[-1] - mid[-1])]))


def _draw_blocks(
    axes, ds: Dataset, step: int, fixed: Mapping[int, int], a: int, b: int, ya, xb
) -> None:
    """Rectangles of the blocks that meet the slice, in the picture's units."""
    from matplotlib.patches import Rectangle

    for blk in ds.blocks(step):
        box = blk.box
        if not all(box.start[ax] <= i < box.stop[ax] for ax, i in fixed.items()):
            continue
        x0, x1 = xb[box.start[b]], xb[box.stop[b]]
        y0, y1 = ya[box.start[a]], ya[box.stop[a]]
        axes.add_patch(
            Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, lw=0.6, ec="cyan", alpha=0.8)
        )


def step_stats(ds: Dataset) -> dict[str, np.ndarray]:
    """Per committed step: min, mean, max from the block statistics (NaN where nothing was
    written).  Of a complex dataset, min and max are those of ``|z|`` (as the blocks keep
    them) and the mean is NaN: the blocks' sums give the mean of z, not of ``|z|``."""
    f = ds.file
    n = f.steps
    mins, means, maxs = (np.full(n, np.nan) for _ in range(3))
    complex_ = ds.dtype.kind == "c"
    for k in range(n):
        st = [b.stats for b in ds.blocks(k) if b.stats is not None and b.stats.count]
        if not st:
            continue
        mins[k] = min(float(np.real(s.min)) for s in st)
        maxs[k] = max(float(np.real(s.max)) for s in st)
        total = sum(int(s.count) for s in st)
        if total and not complex_:
            means[k] = float(sum(s.sum for s in st)) / total
    return {"step": np.arange(n), "min": mins, "mean": means, "max": maxs}


def step_times(f: File) -> np.ndarray | None:
    """The root's 0-D ``time`` per step, from its block statistics (no data read), if every step has it."""
    if "time" not in f:
        return None
    t = f["time"]
    if not isinstance(t, Dataset) or t.shape != ():
        return None
    out = []
    for k in range(f.steps):
        bl = [b for b in t.blocks(k) if b.stats is not None and b.stats.count]
        if not bl:
            return None
        out.append(float(np.real(bl[0].stats.min)))
    return np.asarray(out)


def stats_png(f: File, name: str, out: str | os.PathLike, dpi: int = 110) -> Picture:
    """Min, mean and max of dataset *name* per step, from its block statistics alone."""
    obj = f[name]
    if not isinstance(obj, Dataset):
        raise NotFoundError(
            f"{obj.name!r} is a group: --stats takes a dataset (a component of a vector)"
        )
    s = step_stats(obj)
    if np.isnan(s["min"]).all() and np.isnan(s["max"]).all():
        # nothing to draw: an empty picture would pass for one (a mean alone may be NaN:
        # inf and -inf in a step, or complex values)
        if not f.steps:
            raise StepError(f"{obj.name!r}: the file has no committed step to draw statistics of")
        d = f.engine.definition(obj.name.strip("/"))
        written = any(len(obj.blocks(k)) for k in range(f.steps))
        why = (
            "a derived quantity kept as its expression, computed when read"
            if d is not None and d.strategy == "expression"
            else "its blocks hold no value that is not NaN"
            if written and obj.size
            else "it holds no element"
            if not obj.size
            else "no step wrote a block of it"
        )
        raise NotFoundError(
            f"{obj.name!r} has no block statistics at any of the {f.steps} steps ({why}); "
            "--stats draws those: draw a slice of it instead"
        )
    times = step_times(f)
    x = times if times is not None else s["step"]
    fig = _figure((6.4, 3.8))
    axes = fig.add_subplot()
    magnitude = obj.dtype.kind == "c"  # (the blocks keep min and max of |z|: no mean of it)
    axes.fill_between(
        x, s["min"], s["max"], alpha=0.25, label="|z| min .. max" if magnitude else "min .. max"
    )
    if not magnitude:
        axes.plot(x, s["mean"], marker="o", ms=3, label="mean")
    axes.plot(x, s["min"], lw=0.8, color="C0")
    axes.plot(x, s["max"], lw=0.8, color="C0")
    units = obj.attrs["units"] if "units" in obj.attrs else None
    axes.set_ylabel(f"{name.strip('/')} [{units}]" if units is not None else name.strip("/"))
    if times is None:
        axes.set_xlabel("step")
    else:
        tu = f["time"].attrs["units"] if "units" in f["time"].attrs else None
        axes.set_xlabel(f"time [{tu}]" if tu is not None else "time")
    axes.set_title(f"{name.strip('/')} per step, from block statistics", fontsize=10)
    axes.legend(fontsize=8)
    out = os.fspath(out)
    fig.savefig(out, dpi=dpi, format="png")  # to *out* as named (no '.png' added)
    wpx, hpx = (int(round(v)) for v in fig.get_size_inches() * dpi)
    return Picture(out, wpx, hpx, f"statistics of {name.strip('/')} over {plural(f.steps, 'step')}")
