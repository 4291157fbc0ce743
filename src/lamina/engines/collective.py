"""Collective reads: each block that several ranks need is read once, whole, and its parts sent on.

Reading with another decomposition than the one written (four ranks each
reading an axis-1 slab of a file written as axis-0 slabs) makes every rank
need a part of every block.  Read independently, each rank reads and
checks every block it touches in whole checksum segments, so the ranks
together read the file as many times as there are ranks.  A collective
read (:meth:`BlockEngine.get_collective`, ``ds.read(box, collective=True)``)
does what MPI-IO's two-phase collective reads do:

1. every rank's box goes to every rank (one allgather), and every rank
   finds the same plan from the step's block table: a block that one rank
   needs is read by that rank, as an independent read would; a block that
   several ranks need is read once, over the hull of their parts, by one of
   them, chosen to balance the bytes each rank reads (largest blocks first,
   to the needing rank with the least so far);
2. the ranks read their blocks (checked against their checksums as every
   read is) and agree: a failure on any rank raises on every rank, before
   any data moves;
3. each reading rank sends every other needing rank its part straight out
   of the block read (an MPI subarray type: no packing copy), received
   straight into the reader's output the same way.

A rank holds the blocks it reads for others until they are sent: about
its share of the data read, balanced over the ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import comm as comm_mod
from ..catalog import BlockTable, DatasetSpec
from ..geometry import Box

if TYPE_CHECKING:
    from .block import BlockEngine

MPI = comm_mod.MPI
#: MPI subarray types count in C ints: a dimension (bytes, in the last one) must stay below this
_INT_MAX = (1 << 31) - 1


class Plan:
    """Who reads which block, and which parts travel where (the same on every rank)."""

    __slots__ = ("lo", "hi", "own", "shared", "owner", "parts", "hull")

    def __init__(self) -> None:
        #: the parts of every block this rank's box touches, as ``t.hits`` gives them
        self.lo: np.ndarray | None = None
        self.hi: np.ndarray | None = None
        #: blocks only this rank needs: (row, lo, hi) of its part
        self.own: list[tuple[int, np.ndarray, np.ndarray]] = []
        #: blocks several ranks need, ascending rows
        self.shared: list[int] = []
        #: row -> the rank that reads it
        self.owner: dict[int, int] = {}
        #: row -> [(rank, lo, hi)] of every rank that needs a part
        self.parts: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
        #: row -> the box its reader reads: the hull of the parts
        self.hull: dict[int, Box] = {}


def plan(t: BlockTable, boxes: list[Box], rank: int, itemsize: int) -> Plan:
    """The plan for the ranks' *boxes* (rank r's at ``boxes[r]``) over table *t*."""
    p = Plan()
    need: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
    for r, box in enumerate(boxes):
        if box.empty:
            continue
        idx, lo, hi = t.hits(box.start, box.stop)
        if r == rank:
            p.lo, p.hi = lo, hi
        for k, i in enumerate(idx.tolist()):
            need.setdefault(i, []).append((r, lo[k], hi[k]))
    load = np.zeros(len(boxes), dtype=np.int64)
    shared = []
    for i, parts in need.items():
        if len(parts) == 1:
            r, lo, hi = parts[0]
            load[r] += int(np.prod(hi - lo)) * itemsize
            if r == rank:
                p.own.append((i, lo, hi))
        else:
            shared.append(i)
    for i in shared:
        parts = need[i]
        lo = np.min([a for _, a, _ in parts], axis=0).tolist()
        hi = np.max([b for _, _, b in parts], axis=0).tolist()
        p.hull[i] = Box(tuple(lo), tuple(hi))
        p.parts[i] = parts
    # the largest first, each to the needing rank that reads least so far (lowest rank on ties)
    for i in sorted(shared, key=lambda i: (-p.hull[i].size, i)):
        o = min((r for r, _, _ in need[i]), key=lambda r: (int(load[r]), r))
        load[o] += p.hull[i].size * itemsize
        p.owner[i] = o
    p.shared = sorted(shared)
    return p


def fits(t: BlockTable, boxes: list[Box], itemsize: int) -> bool:
    """Whether every array a part travels in can be described by an MPI subarray type."""
    for box in boxes:
        if (
            box.shape
            and box.shape[-1] * itemsize > _INT_MAX
            or any(n > _INT_MAX for n in box.shape)
        ):
            return False
    ext = (t.stop - t.start) if len(t) else np.zeros((0, t.ndim), dtype=np.int64)
    if len(ext) and (int(ext.max()) > _INT_MAX or int(ext[:, -1].max()) * itemsize > _INT_MAX):
        return False
    return True


def _subarray(shape: tuple[int, ...], lo, hi, origin, itemsize: int):
    """A committed MPI type for the part ``[lo, hi)`` of a C-ordered array of *shape* whose
    corner is at *origin* (global coordinates), in bytes."""
    sizes = list(shape)
    subs = [int(b - a) for a, b in zip(lo, hi, strict=True)]
    starts = [int(a - o) for a, o in zip(lo, origin, strict=True)]
    sizes[-1] *= itemsize
    subs[-1] *= itemsize
    starts[-1] *= itemsize
    return MPI.BYTE.Create_subarray(sizes, subs, starts, order=MPI.ORDER_C).Commit()


def read(
    engine: BlockEngine,
    spec: DatasetSpec,
    t: BlockTable,
    box: Box,
    step: int,
    out: np.ndarray,
    boxes: list[Box],
) -> None:
    """Collective: this rank's *box* into *out* (C-contiguous), the ranks' boxes being *boxes*."""
    from .block import fill_uncovered, refuse_stats_only  # (block imports this module)

    comm = engine.comm
    rank = engine.rank
    item = spec.dtype.itemsize
    p = plan(t, boxes, rank, item)
    mine = [i for i in p.shared if p.owner[i] == rank]  # the shared blocks this rank reads
    held: dict[int, np.ndarray] = {}  # row -> the values of its hull
    g = comm_mod.Guard()
    with g:
        t.check_disjoint(f"{engine.path}: dataset {spec.path!r} step {step}")
        if p.lo is not None and p.hi is not None:  # (None: an empty box, nothing to fill)
            fill_uncovered(spec, box, p.lo, p.hi, out)
        rows = [i for i, _, _ in p.own] + mine
        refuse_stats_only(spec, t, np.array(rows, dtype=np.int64), step)
        for i, a, b in p.own:
            part = Box(tuple(a.tolist()), tuple(b.tolist()))
            engine._read_region(
                t.record(i, spec.id, stats=False), spec, part, out[part.within(box)]
            )
        for i in mine:
            held[i] = np.empty(p.hull[i].shape, dtype=spec.dtype)
            engine._read_region(t.record(i, spec.id, stats=False), spec, p.hull[i], held[i])
    comm_mod.agree(comm, g.error)  # a block that failed its checks raises on every rank
    reqs, types = [], []
    try:
        for i in p.shared:
            o = p.owner[i]
            for r, a, b in p.parts[i]:
                if r == o:
                    if r == rank:  # the reader's own part: a copy
                        part = Box(tuple(a.tolist()), tuple(b.tolist()))
                        out[part.within(box)] = held[i][part.within(p.hull[i])]
                    continue
                if r == rank:
                    dt = _subarray(out.shape, a, b, box.start, item)
                    types.append(dt)
                    reqs.append(comm.Irecv([out.reshape(-1).view(np.uint8), 1, dt], o, _TAG))
                elif o == rank:
                    vals = held[i]
                    dt = _subarray(vals.shape, a, b, p.hull[i].start, item)
                    types.append(dt)
                    reqs.append(comm.Isend([vals.reshape(-1).view(np.uint8), 1, dt], r, _TAG))
        if reqs:
            MPI.Request.Waitall(reqs)
    finally:
        for dt in types:
            dt.Free()


_TAG = int(comm_mod.Tag.COLLECTIVE_READ)

__all__ = ["Plan", "fits", "plan", "read"]
