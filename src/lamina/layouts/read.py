"""Reading multiresolution datasets: a box at a level, from the bands of the patches it meets.

A read of level ``k`` finds the patches whose level-``k`` block meets the
box (a search of level ``k``'s block table), then the blocks of the same
patches in levels ``k+1 .. L-1`` (searches of those tables with the box
scaled to them), reads each of those blocks once (checked against its
checksums by the engine), decodes the patches batched by shape
(:func:`lamina.multires.compress.decode`) and copies the part of each
that the box holds.  Bands finer than ``k`` are never read.  A *cache*
shared by several reads (``Dataset.progressive``) reads no band twice.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..catalog.blocks import BlockTable
from ..catalog.model import DatasetSpec
from ..catalog.tree import Catalog
from ..errors import CodecError, FormatError
from ..geometry import Box, rows_prod
from ..multires import compress, wavelet
from .spec import Layout
from .write import HEADER, HEADER_VERSION


class Source(Protocol):
    """What the layout needs of a block engine to read."""

    catalog: Catalog

    def payloads(
        self, step: int, wanted: Sequence[tuple[DatasetSpec, BlockTable, np.ndarray]]
    ) -> list[list[np.ndarray]]: ...


def scale_box(box: Box, down: int) -> Box:
    """*box* in the coordinates of a level *down* levels coarser (the cells it touches; an
    empty extent stays empty)."""
    start = tuple(a >> down for a in box.start)
    stop = tuple(
        -((-b) >> down) if b > a else s for a, b, s in zip(box.start, box.stop, start, strict=True)
    )
    return Box(start, stop)


def _patches_of(
    t: BlockTable, box: Box, patch: np.ndarray, level: int, shape: np.ndarray, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of *t* (the bands of *level*) meeting *box*, and the linear patch number of each.
    A band whose box is not its patch's at that level, or a second band of one patch (forged
    or damaged metadata under valid checksums: a writer never records one), is a FormatError:
    its coefficients were decoded as another patch's, values wrong by any amount."""
    idx, _, _ = t.hits(box.start, box.stop)
    if not idx.size:
        return idx, idx
    counts = -(-shape // patch)
    coords = t.start[idx] // (patch >> level)
    lo = coords * patch
    hi = np.minimum(lo + patch, shape)
    bad = np.flatnonzero(
        np.any(
            (coords >= counts) | (t.start[idx] != lo >> level) | (t.stop[idx] != -((-hi) >> level)),
            axis=1,
        )
    )
    if bad.size:
        i = int(idx[bad[0]])
        raise FormatError(
            f"{what}: band {t.box(i)} of level {level} is no patch's extent there: the metadata "
            "is corrupt"
        )
    lin = np.ravel_multi_index(tuple(coords.T), tuple(counts.tolist()))
    if np.unique(lin).size < lin.size:
        srt = np.sort(lin)
        twice = int(srt[np.flatnonzero(srt[1:] == srt[:-1])[0]])
        rows = idx[lin == twice][:2].tolist()
        raise FormatError(
            f"{what}: bands {t.box(rows[0])} and {t.box(rows[1])} of level {level} are both of one "
            "patch: the metadata is corrupt"
        )
    return idx, lin


def plan(
    catalog: Catalog, spec: DatasetSpec, layout: Layout, box: Box, step: int, level: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The patches a read of *box* (level-*level* coordinates) needs and their rows per level.

    Returns ``(patch numbers, rows)`` with ``rows[j - level][i]`` the row of
    patch ``i``'s block in the table of level ``j``.
    """
    patch = np.asarray(layout.patch, dtype=np.int64)
    shape = np.asarray(spec.shape, dtype=np.int64)
    what = f"dataset {spec.path!r}, step {step}"
    specs = [catalog.level(spec.path, j) for j in range(level, layout.levels)]  # (each defined)
    t = catalog.table(specs[0].id, step)
    rows_k, lin = _patches_of(t, box, patch, level, shape, what)
    order = np.argsort(lin, kind="stable")
    lin, rows_k = lin[order], rows_k[order]
    rows = [rows_k]
    for j in range(level + 1, layout.levels):
        tj = catalog.table(specs[j - level].id, step)
        r, lj = _patches_of(tj, scale_box(box, j - level), patch, j, shape, what)
        srt = np.argsort(lj, kind="stable")
        ls = lj[srt]
        pos = np.minimum(np.searchsorted(ls, lin), max(ls.size - 1, 0))
        if lin.size and (not ls.size or not bool(np.all(ls[pos] == lin))):
            raise FormatError(
                f"{what}: the blocks of level {j} do not match those of level {level} (a patch "
                "lacks a band); the step is damaged"
            )
        rows.append(r[srt][pos] if lin.size else r[:0])
    return lin, rows


def skipped(
    catalog: Catalog,
    spec: DatasetSpec,
    layout: Layout,
    rows: list[np.ndarray],
    step: int,
    level: int,
    tolerance: float | None,
) -> np.ndarray:
    """bool ``(patches, levels)``: the bands a read at *tolerance* leaves out (none unless it is
    looser than the one written; :func:`lamina.multires.compress.skippable` says which)."""
    n = rows[0].size if rows else 0
    out = np.zeros((n, layout.levels), dtype=bool)
    if tolerance is None or not tolerance > layout.tolerance or not n:
        return out
    amax = np.full((n, layout.levels), np.inf)
    for j, r in enumerate(rows, start=level):
        t = catalog.table(catalog.level(spec.path, j).id, step)
        if t.amax is not None:  # (files of format 3 do not record it: nothing is left out)
            amax[:, j] = t.amax[r]
    return compress.skippable(amax, spec.ndim, tolerance - layout.tolerance, level)


def nbytes(
    catalog: Catalog,
    spec: DatasetSpec,
    layout: Layout,
    box: Box,
    step: int,
    level: int,
    tolerance: float | None = None,
) -> int:
    """Stored bytes a read of *box* at *level* (and *tolerance*) reads (without reading them)."""
    _, rows = plan(catalog, spec, layout, box, step, level)
    skip = skipped(catalog, spec, layout, rows, step, level, tolerance)
    total = 0
    for j, r in enumerate(rows, start=level):
        t = catalog.table(catalog.level(spec.path, j).id, step)
        total += int(t.length[r][~skip[:, j]].sum())
    return total


def read(
    src: Source,
    spec: DatasetSpec,
    layout: Layout,
    box: Box,
    step: int,
    level: int,
    out: np.ndarray,
    cache: MutableMapping | None = None,
    tolerance: float | None = None,
) -> int:
    """Fill *out* with *box* (level-*level* coordinates) of *spec* at *step*; returns the bytes read.

    A *tolerance* looser than the one written leaves out the bands :func:`skipped` names
    (their coefficients read as 0), so the values stay within it.
    """
    cat = src.catalog
    lin, rows = plan(cat, spec, layout, box, step, level)
    skip = skipped(cat, spec, layout, rows, step, level, tolerance)
    nl = layout.levels
    patch = np.asarray(layout.patch, dtype=np.int64)
    counts = tuple((-(-np.asarray(spec.shape, dtype=np.int64) // patch)).tolist())
    coords = np.asarray(np.unravel_index(lin, counts), dtype=np.int64).T.reshape(-1, len(counts))
    lo0 = coords * patch
    hi0 = np.minimum(lo0 + patch, np.asarray(spec.shape, dtype=np.int64))
    lo_k, hi_k = lo0 >> level, -((-hi0) >> level)
    covered = (
        int(np.prod(np.minimum(hi_k, box.stop) - np.maximum(lo_k, box.start), axis=1).sum())
        if lin.size
        else 0
    )
    if covered < box.size:
        out[...] = spec.fill_scalar()
    if not lin.size:
        return 0
    read_bytes = 0
    blobs: list[list[bytes | None]] = [[b""] * lin.size for _ in range(nl)]
    modes = np.zeros(lin.size, dtype=np.uint8)
    exps = np.zeros(lin.size, dtype=np.int32)
    raws: list[list] = [[None] * lin.size for _ in range(nl)]
    wanted, where = [], []
    for j, r in enumerate(rows, start=level):
        lspec = cat.level(spec.path, j)
        t = cat.table(lspec.id, step)
        missing = []
        for i in range(lin.size):
            if skip[i, j]:
                continue
            raws[j][i] = cache.get((step, j, int(lin[i]))) if cache is not None else None
            if raws[j][i] is None:
                missing.append(i)
        if missing:
            wanted.append((lspec, t, r[missing]))
            where.append((j, missing))
    # one request for all the bands: those back to back in a subfile are read together
    for (j, missing), got in zip(where, src.payloads(step, wanted), strict=True):
        for i, raw in zip(missing, got, strict=True):
            raws[j][i] = raw
            read_bytes += len(raw)
            if cache is not None:
                cache[(step, j, int(lin[i]))] = raw
    for j, r in enumerate(rows, start=level):
        for i, row in enumerate(r.tolist()):
            raw = raws[j][i]
            if skip[i, j]:
                blobs[j][i] = None  # left out: read as zero coefficients
                continue
            bad = "is too short" if len(raw) < HEADER.size else ""
            version, mode, exp = (
                HEADER.unpack_from(bytes(raw[: HEADER.size])) if not bad else (0, 0, 0)
            )
            if not bad and (version != HEADER_VERSION or mode > max(compress.Mode)):
                bad = (
                    f"has an unknown header (version {version}, mode {mode}; this lamina reads "
                    f"version {HEADER_VERSION}, modes 0 to {int(max(compress.Mode))})"
                )
            if bad:
                t = cat.table(cat.level(spec.path, j).id, step)
                # named as the other errors of a read name a block: file, subfile, step
                sub = f"data.{int(t.session[row])}.{int(t.agg[row])}"
                raise FormatError(
                    f"dataset {spec.path!r} step {step}: block {t.box(row)} of level {j} in "
                    f"{getattr(src, 'path', '?')}/{sub} {bad}"
                )
            if j == nl - 1:
                modes[i], exps[i] = mode, exp
            blobs[j][i] = bytes(raw[HEADER.size :])
    shapes = hi0 - lo0
    keys = [tuple(s) for s in shapes.tolist()]
    tolerances = np.zeros(nl)
    for s in sorted(set(keys)):
        sel = np.flatnonzero([k == s for k in keys])
        enc = compress.Encoded(
            s,
            layout.patch,
            spec.dtype,
            layout.tolerance,
            tolerances,
            modes[sel],
            exps[sel],
            [[blobs[b][i] for i in sel.tolist()] for b in range(nl)],
        )
        try:
            vals = compress.decode(enc, level)
        except CodecError as e:
            raise CodecError(f"dataset {spec.path!r}, step {step}, level {level}: {e}") from None
        for k, i in enumerate(sel.tolist()):
            a = np.maximum(lo_k[i], box.start)
            b = np.minimum(hi_k[i], box.stop)
            dst = tuple(slice(x - s0, y - s0) for x, y, s0 in zip(a, b, box.start, strict=True))
            srcs = tuple(slice(x - s0, y - s0) for x, y, s0 in zip(a, b, lo_k[i], strict=True))
            out[dst] = vals[k][srcs]
    return read_bytes


def describe(src: Source, spec: DatasetSpec, layout: Layout, step: int) -> dict:
    """What a step of a multiresolution dataset holds: bytes and ratio per level, patches,
    patches stored losslessly under a lossy tolerance (NaN, inf, or data too close to its
    precision), and bytes per subfile (the aggregators' load).  Reads the coarsest band of
    every patch (its header says how the patch is stored)."""
    cat = src.catalog
    levels: list[dict[str, Any]] = []
    subfiles: dict[str, int] = {}
    for k in range(layout.levels):
        lspec = cat.level(spec.path, k)
        t = cat.table(lspec.id, step)
        # the bytes of the values its patches hold at this level: the level's whole array
        # where every patch was written
        raw = int(rows_prod(t.stop - t.start).sum()) * spec.dtype.itemsize
        levels.append(
            {
                "level": k,
                "shape": list(lspec.shape),
                "blocks": len(t),
                "band": int(t.length.sum()),
                "raw": raw,
            }
        )
        for i in range(len(t)):
            name = t.record(i, lspec.id, stats=False).subfile
            subfiles[name] = subfiles.get(name, 0) + int(t.length[i])
    # a level is read from its band and every coarser one: "stored" is what a read of the
    # whole level takes, and the ratio is raw / stored of the same patches (band k alone
    # made a level whose patches are kept lossless, all in the coarsest band, look 28:1)
    coarser = 0
    for x in reversed(levels):
        coarser += x["band"]
        x["stored"] = coarser
        x["ratio"] = x["raw"] / coarser if coarser else None
    last = cat.level(spec.path, layout.levels - 1)
    t = cat.table(last.id, step)
    lossless = 0
    for raw_bytes in src.payloads(step, [(last, t, np.arange(len(t)))])[0]:
        if len(raw_bytes) >= HEADER.size:
            mode = HEADER.unpack_from(bytes(raw_bytes[: HEADER.size]))[1]
            lossless += int(layout.tolerance > 0 and mode == compress.Mode.RAW)
    return {
        "patch": list(layout.patch),
        "tolerance": layout.tolerance,
        "order": layout.order,
        "distribution": layout.distribution,
        "aggregation": layout.aggregation,
        "patches": len(t),
        "lossless_patches": lossless,
        "levels": levels,
        "subfiles": dict(sorted(subfiles.items())),
    }


def check_box(spec: DatasetSpec, layout: Layout, box: Box, level: int) -> None:
    """BoundsError naming the dataset and level unless *box* lies inside level *level*."""
    box.check_inside(
        wavelet.level_shape(spec.shape, level), f"dataset {spec.path!r} at level {level}"
    )


__all__ = ["Source", "check_box", "describe", "nbytes", "plan", "read", "scale_box", "skipped"]
