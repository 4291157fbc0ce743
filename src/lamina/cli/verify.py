"""``lamina verify``: read every stored block of a file and check it against its checksums.

A file kept for years is read back seldom: a flipped bit on a disk or a
subfile cut short by a copy is found by the read that meets it, maybe
years later.  ``lamina verify FILE`` reads every block of every committed
step once, as stored, and checks it against the CRC-32C segments its
record holds; a block stored through a codec pipeline is decoded too (so a
codec this installation lacks is found now), and a multiresolution band's
header is checked.  It goes on past a damaged block and names each one:
its step, dataset, box, subfile and bytes.  The metadata is checked by
opening the file: a record left out there (a damaged or cut-short last
record, logs copied at different moments) is reported as damage.

Exit status: 0 when everything is intact, 1 when something is damaged, 2
when the file cannot be opened at all (as the other commands).  HDF5's
``h5check`` checks a file's format; ADIOS2 and zarr have no such command.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..catalog.model import BlockCodec
from ..errors import CodecError, FormatError
from ..text import fmt_box, fmt_bytes, fmt_ranges, plural, print_json
from .common import open_file

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


def _check_decoded(eng, spec, t, row: int, payload) -> None:
    """What the bytes of a block say beyond their checksums: a pipeline's block decodes to its
    box (the codec's error names the block); a multiresolution band starts with a header
    this lamina reads."""
    codec = int(t.codec[row])
    if codec == BlockCodec.PIPELINE:
        eng.decode_payload(t.record(row, spec.id, stats=False), spec, payload)
    elif codec == BlockCodec.MULTIRES:
        from ..layouts.write import HEADER, HEADER_VERSION
        from ..multires import compress

        what = f"{eng.path}: dataset {spec.path!r} block {fmt_box(t.box(row))}"
        if len(payload) < HEADER.size:
            raise FormatError(f"{what}: a band of {len(payload)} bytes, shorter than its header")
        version, mode, _ = HEADER.unpack_from(bytes(payload[: HEADER.size]))
        if version != HEADER_VERSION or mode > max(compress.Mode):
            raise FormatError(
                f"{what}: a band with an unknown header (version {version}, mode {mode})"
            )


def verify(f) -> dict[str, Any]:
    """Every stored block of open file *f* read and checked: a report (see :func:`main`)."""
    eng = f.engine.stack()[-1]  # the block engine under the layers: it reads stored bytes
    cat = eng.catalog
    problems: list[dict[str, Any]] = []
    blocks = nbytes = 0
    for step in range(f.steps):
        for spec in _specs(cat):
            t = cat.table_of(spec, step)
            if not len(t):
                continue
            rows = np.flatnonzero((t.codec != BlockCodec.STATS_ONLY) & (t.length > 0))
            for batch in _batches(t, rows):
                try:
                    got = eng.payloads(step, [(spec, t, batch)])[0]
                except (FormatError, CodecError, OSError):
                    got = None  # some block of the batch: found one by one below
                for k, row in enumerate(batch.tolist()):
                    try:
                        payload = got[k] if got is not None else eng.payload(spec, t, row)
                        _check_decoded(eng, spec, t, row, payload)
                    except (FormatError, CodecError, OSError, ValueError) as e:
                        box = fmt_box(t.box(row))
                        problems.append(
                            {"step": step, "dataset": spec.path, "box": box, "error": str(e)}
                        )
                    blocks += 1
                    nbytes += int(t.length[row])
    return {
        "file": f.filename,
        "steps": f.steps,
        "blocks": blocks,
        "bytes": nbytes,
        "records_left_out": int(getattr(eng, "records_left_out", 0)),
        "problems": problems,
    }


def cmd_verify(args) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = open_file(args.file)
    notes = [str(w.message) for w in caught]
    try:
        report = verify(f)
    finally:
        f.close()
    report["metadata"] = notes
    damaged = bool(report["problems"] or report["records_left_out"])
    if args.json:
        print_json({**report, "intact": not damaged})
        return 1 if damaged else 0
    for note in notes:  # (each names the file)
        print(note)
    for p in report["problems"]:
        print(f"{args.file}: step {p['step']}: {p['error']}")
    checked = (
        f"{plural(report['steps'], 'step')}, {plural(report['blocks'], 'block')}, "
        f"{fmt_bytes(report['bytes'])} read and checked"
    )
    if not damaged:
        print(f"{args.file}: {checked}: intact")
        return 0
    parts = []
    if report["problems"]:
        steps = sorted({p["step"] for p in report["problems"]})
        parts.append(
            f"{len(report['problems'])} of {plural(report['blocks'], 'block')} damaged "
            f"(step{'s' if len(steps) > 1 else ''} {fmt_ranges(steps)})"
        )
    if report["records_left_out"]:
        parts.append(f"{plural(report['records_left_out'], 'committed record')} left out")
    print(f"{args.file}: DAMAGED: {'; '.join(parts)}; {checked}", file=sys.stdout)
    return 1
