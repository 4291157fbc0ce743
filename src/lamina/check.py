"""Every stored block of a lamina file read and checked against its checksums: what
``lamina verify`` runs (:mod:`lamina.cli.verify` prints it; ``lamina bench verify`` times it).

:func:`verify` reads every block of every committed step of an open file once, as
stored, and checks it against the CRC-32C segments its record holds; a block stored
through a codec pipeline is decoded too (so a codec this installation lacks is found
now), a multiresolution band's header is checked and the dataset's patches decoded from
their bands.  It goes on past a damaged block and names each one: its step, dataset,
box, subfile and bytes; a step's table of a dataset's blocks that fails its checksum, or
a layout this lamina cannot read, is named as the dataset's.  A last commit entry that
fails its checksum is asked about once the rest is read
(:meth:`NativeEngine.unfinished_commit`).  Collective over the file's ranks: they share
the (step, dataset) pairs, and rank 0 gets every rank's findings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import comm as comm_mod
from . import stats as stats_mod
from .buffers import PAGE
from .catalog.model import LAYOUT_LEVEL, BlockCodec
from .errors import CodecError, FormatError
from .geometry import Box
from .text import fmt_box

#: most stored bytes read in one request: blocks back to back in a subfile are read
#: together (:meth:`BlockEngine.payloads`) up to this many, a larger block alone
BATCH_BYTES = 64 << 20


def _specs(cat) -> Iterator[Any]:
    """Every definition that holds stored blocks: datasets and their resolution levels."""
    for path, spec in cat.datasets.items():
        yield spec
        for _, lspec in sorted(cat.levels.get(path, {}).items()):
            yield lspec


def _batches(t, rows: np.ndarray) -> Iterator[np.ndarray]:
    """*rows* of table *t* in runs of at most :data:`BATCH_BYTES` stored bytes (one or more)."""
    lengths = t.length[rows]
    start, total = 0, 0
    for i, n in enumerate(lengths.tolist()):
        if i > start and total + n > BATCH_BYTES:
            yield rows[start:i]
            start, total = i, 0
        total += n
    if start < len(rows):
        yield rows[start:]


def _check_decoded(eng, spec, t, row: int, payload, stats: bool = False) -> None:
    """What the bytes of a block say beyond their checksums: a pipeline's block decodes to its
    box (the codec's error names the block); a multiresolution band starts with a header
    this lamina reads.  With *stats*, a block whose values read back as written (raw, or
    through lossless codecs) holds the statistics its record says (:func:`_check_stats`)."""
    codec = int(t.codec[row])
    if codec in (BlockCodec.RAW, BlockCodec.PIPELINE):
        rec = t.record(row, spec.id, stats=False)
        if codec == BlockCodec.PIPELINE or (stats and t.has_stats[row]):
            values = eng.decode_payload(rec, spec, payload)
            exact = codec == BlockCodec.RAW or not eng._pipeline(spec).lossy
            if stats and t.has_stats[row] and exact:
                _check_stats(eng, spec, t, row, values)
    elif codec == BlockCodec.MULTIRES:
        from .layouts.write import HEADER, HEADER_VERSION
        from .multires import compress

        what = f"{eng.path}: dataset {spec.path!r} block {fmt_box(t.box(row))}"
        if len(payload) < HEADER.size:
            raise FormatError(f"{what}: a band of {len(payload)} bytes, shorter than its header")
        version, mode, _ = HEADER.unpack_from(bytes(payload[: HEADER.size]))
        if version != HEADER_VERSION or mode > max(compress.Mode):
            raise FormatError(
                f"{what}: a band with an unknown header (version {version}, mode {mode})"
            )


def _check_stats(eng, spec, t, row: int, values: np.ndarray) -> None:
    """FormatError unless the statistics of block *row* are those of its *values*: count,
    min and max exactly (docs/format.md, "Block statistics"), the sum within the bound the
    format gives any writer's sum (``n 2^-53 sum |x|``, float32 ``2^-20 sum |x|``), here
    taken four times over."""
    with np.errstate(over="ignore", invalid="ignore"):  # (long double beyond float64, inf sums)
        bad = _stats_disagree(t.stats(row), values)
    if bad:
        raise FormatError(
            f"{eng.path}: dataset {spec.path!r} block {fmt_box(t.box(row))}: its statistics "
            f"disagree with its values ({'; '.join(bad)}): the writer stored wrong statistics"
        )


def _stats_disagree(want, values: np.ndarray) -> list[str]:
    """What of the statistics *want* the *values* disagree with, said (none: agree)."""
    got, _ = stats_mod.compute(values, checksum=False)
    bad = []
    if got.count != want.count:
        bad.append(f"count {want.count}, the values' {got.count}")
    for name in ("min", "max"):
        a, b = getattr(want, name), getattr(got, name)
        if not (a == b or (a != a and b != b)):  # (NaN: a block of NaN values only)
            bad.append(f"{name} {a!r}, the values' {b!r}")
    if not bad and got.count:
        scale = _abs_sum(values)
        # float32: 2^-20 sum |x| with no factor of n (with one, a block of more than 2^18
        # values allowed any sum: 4x the true one passed)
        f32 = values.dtype == np.float32
        allowed = 2.0**-18 * scale if f32 else 2.0**-51 * max(got.count, 1) * scale
        diff = abs(complex(want.sum) - complex(got.sum))
        if not diff <= allowed and math.isfinite(scale):
            bad.append(f"sum {want.sum!r}, the values' {got.sum!r}")
    return bad


#: values taken at a time by :func:`_abs_sum` (1 MiB of float64)
CHUNK = 1 << 17


def _abs_sum(values: np.ndarray) -> float:
    """The sum of ``|x|`` over the values that are not NaN (complex: neither part), in
    float64, a chunk at a time: temporaries the size of a block (4 MiB each, three of them)
    came from fresh memory at every block, a page fault per 4 KiB, and took two thirds of
    the time of ``--stats``."""
    flat = values.reshape(-1)
    wide = np.complex128 if flat.dtype.kind == "c" else np.float64
    total = 0.0
    for i in range(0, flat.size, CHUNK):
        c = flat[i : i + CHUNK]
        a = np.abs(c.astype(wide, copy=False))
        total += float(a.sum(where=~np.isnan(c)) if flat.dtype.kind in "fc" else a.sum())
    return total


def _check_blocks(
    eng, spec, t, step: int, stats: bool, found, scratch: list[np.ndarray]
) -> tuple[int, int]:
    """Every stored block of table *t* (of *spec* at *step*) read and checked, each damaged
    one given to *found*: (blocks, bytes).  The bytes are read into ``scratch[0]``, made
    larger where a batch needs it, and done with before the next batch is read (memory
    reused: fresh memory for every batch cost a page fault per 4 KiB, a third of the
    time of a file read whole)."""
    rows = np.flatnonzero((t.codec != BlockCodec.STATS_ONLY) & (t.length > 0))
    nbytes = 0
    for batch in _batches(t, rows):
        need = int(t.length[batch].sum()) + PAGE * (len(batch) + 1)  # (each run placed)
        if scratch[0].size < need <= 2 * BATCH_BYTES:
            scratch[0] = np.empty(need, np.uint8)
        try:
            # (a batch of one block larger than that, its length the record's word alone,
            # is read into memory the read makes once it has held it to the subfile's size)
            got = eng.payloads(step, [(spec, t, batch)], into=scratch[0])[0]
        except (FormatError, CodecError, OSError):
            got = None  # some block of the batch: found one by one below
        for k, row in enumerate(batch.tolist()):
            try:
                payload = got[k] if got is not None else eng.payload(spec, t, row)
                _check_decoded(eng, spec, t, row, payload, stats)
            except (FormatError, CodecError, OSError, ValueError) as e:
                found("block", fmt_box(t.box(row)), e)
            nbytes += int(t.length[row])
    return len(rows), nbytes


def _check_layout(f, spec, step: int, t, found, said: set[str]) -> None:
    """A multiresolution dataset at *step*: its layout is one this lamina reads, and its
    patches decode from their bands (every level: what a full-resolution read takes), a
    slab of whole patches at a time.  A band that fails its checksum or its header is
    found by :func:`_check_blocks` (on the rank that reads its level), not again here;
    a stream that does not decode is found here."""
    from .layouts import read as layout_read
    from .layouts.spec import Layout

    try:
        layout = Layout.of(spec)
    except FormatError as e:
        if spec.path not in said:  # (the same at every step: said once)
            said.add(spec.path)
            found("layout", None, e)
        return
    if layout is None or not len(t) or not spec.shape:
        return
    try:  # the bands' boxes: each its patch's at its level, one a patch (as a read plans them)
        layout_read.plan(
            f.engine.stack()[-1].catalog, spec, layout, Box.from_shape(spec.shape), step, 0
        )
    except FormatError as e:
        found("bands", None, e)
        return
    ds = f[spec.path]
    row_bytes = math.prod(spec.shape[1:]) * spec.dtype.itemsize
    rows = max(1, BATCH_BYTES // max(1, row_bytes * layout.patch[0])) * layout.patch[0]
    for a in range(0, spec.shape[0], rows):
        box = Box(
            (a,) + (0,) * (len(spec.shape) - 1), (min(a + rows, spec.shape[0]),) + spec.shape[1:]
        )
        try:
            ds.read(box, step=step)
        except FormatError:
            continue  # a band's checksum or header: named block by block
        except (CodecError, OSError, ValueError, ImportError) as e:
            found(
                "patches",
                fmt_box(box),
                f"dataset {spec.path!r}: the patches of {fmt_box(box)} do not decode: {e}",
            )


def verify(f, stats: bool = False) -> dict[str, Any]:
    """Every stored block of open file *f* read and checked: a report (see :func:`cmd_verify`).

    Collective over the file's ranks (``mpiexec -n N lamina verify FILE``): each reads the
    (step, dataset) pairs dealt to it in turn, and rank 0 gets every rank's findings, in
    the order of steps and datasets (the others get their own)."""
    eng = f.engine.stack()[-1]  # the block engine under the layers: it reads stored bytes
    cat = eng.catalog
    comm = f.comm
    rank, size = comm.rank, comm.size
    problems: list[dict[str, Any]] = []
    blocks = nbytes = 0
    pair = -1
    bad_layouts: set[str] = set()  # datasets whose layout this lamina cannot read
    scratch = [np.empty(0, np.uint8)]  # the bytes of a batch of blocks, read there
    g = comm_mod.Guard()
    with g:  # (an error out of this rank's part is raised on every rank: no rank left waiting)
        for step in range(f.steps):
            for spec in _specs(cat):
                pair += 1
                if pair % size != rank:
                    continue

                def found(
                    what: str, box: str | None, e: object, step=step, spec=spec, pair=pair
                ) -> None:
                    problems.append(
                        {"step": step, "dataset": spec.path, "what": what, "box": box,
                         "error": str(e), "_order": (pair, len(problems))}
                    )  # fmt: skip

                try:  # its table of blocks: a section of the record, decoded when first asked for
                    t = cat.table_of(spec, step)
                except (FormatError, OSError, ValueError) as e:
                    found("table", None, e)
                    continue
                banded = spec.layout is not None and spec.layout.get("layout") != LAYOUT_LEVEL
                if not banded:  # (as a read asks before it puts blocks together; the bands of
                    # a multiresolution dataset are checked as its reads plan them, below)
                    try:
                        t.check_disjoint(f"dataset {spec.path!r}")
                    except FormatError as e:
                        found("table", None, e)
                n, nb = _check_blocks(eng, spec, t, step, stats, found, scratch)
                blocks, nbytes = blocks + n, nbytes + nb
                if banded:
                    _check_layout(f, spec, step, t, found, bad_layouts)
    comm_mod.agree(comm, g.error)
    if size > 1:  # JSON between the ranks: findings are text and numbers
        mine = json.dumps([blocks, nbytes, problems]).encode()
        parts = comm_mod.gather_bytes(comm, mine)
        if parts is not None:
            blocks = nbytes = 0
            problems = []
            for raw in parts:
                b, n, p = json.loads(raw)
                blocks, nbytes = blocks + b, nbytes + n
                problems.extend(p)
            problems.sort(key=lambda p: tuple(p["_order"]))
    ask = getattr(eng, "unfinished_commit", None)  # (the native engine's commit log)
    commit_log = ask() if ask is not None and rank == 0 else None
    return {
        "file": f.filename,
        "format_version": f.format_version,
        "steps": f.steps,
        "ranks": size,
        "blocks": blocks,
        "bytes": nbytes,
        "records_left_out": int(getattr(eng, "records_left_out", 0)),
        "commit_log": commit_log,
        "problems": problems,
    }


__all__ = ["BATCH_BYTES", "verify"]
