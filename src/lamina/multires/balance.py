"""Where patches go: balanced patch owners, size-balanced aggregators, and a simulation.

Writing a multiresolution dataset takes two moves of data:

1. *Patches to owners* (:func:`distribute`).  Ranks write boxes that need
   not align with the patch grid; the wavelet needs whole patches, so each
   patch gets one owner rank that gathers its pieces and transforms it.
   Balanced, every rank owns ``floor(M/N)`` or ``floor(M/N) + 1`` of the
   ``M`` patches written at the step (a patch nobody wrote any of is not
   encoded, and not shared out), so that the transform's work is even.
2. *Compressed patches to aggregators* (:func:`aggregate`).  Compressed
   sizes vary widely (an empty region compresses to almost nothing, a
   shock front hardly at all); ``F`` aggregator ranks write contiguous
   runs of patches in Morton order, balanced by bytes rather than by
   counts, so that no aggregator writes much more than the others.

Both run on arrays (boxes as corner arrays, one row per patch), so
:func:`simulate` runs them for 10^4 to 10^5 virtual ranks in seconds.

Distribution, balanced (the default)
------------------------------------
Let ``q, r = divmod(M, N)``: every rank gets at least ``q`` patches, and
``r`` ranks one more.  Patches are taken in Morton order of their grid
coordinates.

1. A patch that lies wholly inside the boxes of one rank stays there, up
   to ``q`` patches a rank; further ones wait for step 3.
2. A *shared* patch (pieces on several ranks) goes to the smallest of its
   sharing ranks that holds fewer than ``q`` (with ``prefer="piece"``: the
   one with the largest piece, which moves fewer cells).  This runs in rounds: each
   waiting patch proposes to the smallest sharing rank with room, each
   rank accepts proposals in patch order up to its room, and patches
   turned away propose to their next sharing rank in the next round (a
   rank that turned one away is full, so the rounds are at most the
   largest number of ranks sharing a patch).
3. Waiting patches (shared ones whose sharing ranks are full, and whole
   patches beyond a rank's ``q``) may take one of the ``r`` extra places:
   each goes to the smallest of its sharing ranks (its own rank, for a
   whole patch) that has no extra yet, in patch order, while extras last.
4. Whatever still waits goes to the first ranks below target, in rank
   order: first those below ``q``, then, while extras last, those at
   ``q``.

Counts end at ``q`` or ``q + 1`` (exactly ``r`` ranks at ``q + 1``), and a
patch leaves the ranks that hold it only when they are all full.

Distribution, greedy
--------------------
The rank holding the largest piece of a patch owns it (the smallest rank
on ties): fewest bytes moved, no balance.

Aggregation
-----------
Aggregator ``j`` of ``F`` lives on rank ``floor(j N / F)`` (spread evenly).
Patches in Morton order are cut into ``F`` contiguous runs.  *Balanced*
(the default): aggregator ``j`` aims at the bytes still to place divided
by the aggregators left, ``(T - placed) / (F - j)``, and ends its run at
the patch boundary closest to that target.  The naive rule (stop before
exceeding ``T / F``) always falls short, and the shortfall piles up on the
last aggregator; the running target spreads each aggregator's rounding
over those after it, so no deficit accumulates.  Rounding to the nearest
boundary can still overshoot by half a patch; so each run is also capped
at the smallest largest-run that any cut into ``F`` runs can achieve
(found by bisection, each test a greedy cover whose ``F`` jumps are
composed by repeated squaring), and must leave the patches after it
coverable by the aggregators after it under that cap.  The busiest
aggregator then writes the least any contiguous cut allows.  *Counts*: equal numbers of
patches per aggregator, regardless of size (for comparison).  A rank sends
each of its patches to the patch's aggregator, so it may send to several;
a message is one (rank, aggregator) pair.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..geometry import dims_create
from .wavelet import check_patch

# --------------------------------------------------------------------------
# patch grid


def morton_keys(coords: np.ndarray, bits: int = 21) -> np.ndarray:
    """Z-order keys of non-negative integer points, one row each (as :func:`lamina.geometry.morton_key`).

    Parameters
    ----------
    coords
        ``(n, ndim)`` integer array.
    bits
        Bits per coordinate; ``bits * ndim`` must stay below 64.

    Returns
    -------
    numpy.ndarray
        uint64 keys: bit ``b`` of coordinate ``d`` at position ``b * ndim + d``.
    """
    c = np.asarray(coords, dtype=np.uint64)
    n, nd = c.shape
    if bits * nd > 64:
        raise ShapeError(f"Morton keys of {nd}-D points with {bits} bits each exceed 64 bits")
    if n and int(c.max()) >> bits:
        raise ShapeError(f"coordinates reach {int(c.max())}, beyond {bits} bits")
    key = np.zeros(n, dtype=np.uint64)
    one = np.uint64(1)
    for b in range(bits):
        for d in range(nd):
            key |= ((c[:, d] >> np.uint64(b)) & one) << np.uint64(b * nd + d)
    return key


@dataclass(frozen=True)
class Grid:
    """The patch grid of a dataset, patches numbered in Morton order.

    Attributes
    ----------
    shape, patch
        The dataset's and the patches' shapes.
    coords
        ``(M, ndim)`` grid coordinates of patch ``i`` (patch ``i`` is the
        ``i``-th in Morton order).
    lo, hi
        ``(M, ndim)`` corners of each patch, clipped to the dataset.
    """

    shape: tuple[int, ...]
    patch: tuple[int, ...]
    coords: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def of(cls, shape: Sequence[int], patch: Sequence[int]) -> Grid:
        """The grid of *shape* in patches of *patch* (edges powers of two)."""
        p = check_patch(patch)
        s = tuple(int(n) for n in shape)
        if len(s) != len(p) or any(n < 1 for n in s):
            raise ShapeError(
                f"patch {p} does not match a non-empty {len(s)}-D dataset of shape {s}"
            )
        counts = tuple(-(-a // b) for a, b in zip(s, p, strict=True))
        coords = np.indices(counts).reshape(len(s), -1).T.astype(np.int64)
        # as many bits as the largest coordinate takes: the same keys as with more bits (the
        # bits above it are zero), within 64 bits for any grid that fits in memory (a 4-D
        # grid of 2^16 patches an edge, or a 1-D one of 2^63)
        bits = max(1, max(counts) - 1).bit_length()
        coords = coords[np.argsort(morton_keys(coords, bits), kind="stable")]
        lo = coords * np.asarray(p, dtype=np.int64)
        hi = np.minimum(lo + np.asarray(p), np.asarray(s))
        return cls(s, p, coords, lo, hi)

    @property
    def counts(self) -> tuple[int, ...]:
        """Patches along each dimension."""
        return tuple(-(-a // b) for a, b in zip(self.shape, self.patch, strict=True))

    @property
    def size(self) -> int:
        """Number of patches ``M``."""
        return len(self.coords)

    def index(self) -> np.ndarray:
        """Patch number (Morton rank) at each grid position, an array of shape :attr:`counts`."""
        out = np.empty(self.counts, dtype=np.int64)
        out[tuple(self.coords.T)] = np.arange(self.size)
        return out


# --------------------------------------------------------------------------
# pieces: where rank boxes meet patches


@dataclass(frozen=True)
class Pieces:
    """Non-empty intersections of rank boxes with patches, one row each.

    ``box[i]``: the row of the boxes given to :func:`pieces` that piece
    ``i`` comes from (None where a caller built pieces without it).
    """

    rank: np.ndarray
    patch: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    box: np.ndarray | None = None

    @property
    def volume(self) -> np.ndarray:
        return np.prod(self.hi - self.lo, axis=1)


def pieces(grid: Grid, rank: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Pieces:
    """Cut each rank box along the patch grid.

    Parameters
    ----------
    grid
        The patch grid.
    rank, lo, hi
        Box ``k`` is ``[lo[k], hi[k])`` written by rank ``rank[k]``; boxes
        must lie inside the dataset (empty boxes are skipped).

    Returns
    -------
    Pieces
        One row per (box, patch) pair that overlaps.
    """
    rank = np.asarray(rank, dtype=np.int64)
    lo = np.asarray(lo, dtype=np.int64).reshape(len(rank), -1)
    hi = np.asarray(hi, dtype=np.int64).reshape(len(rank), -1)
    p = np.asarray(grid.patch, dtype=np.int64)
    if lo.shape[1] != len(p):
        raise ShapeError(f"boxes have {lo.shape[1]} dimensions, the dataset {len(p)}")
    if (lo < 0).any() or (hi > np.asarray(grid.shape)).any():
        raise ShapeError(f"a box leaves the dataset of shape {grid.shape}")
    keep = np.flatnonzero((hi > lo).all(axis=1))
    rank, lo, hi = rank[keep], lo[keep], hi[keep]
    first = lo // p
    span = (hi - 1) // p - first + 1  # patches each box meets along each dimension
    count = np.prod(span, axis=1)
    box = np.repeat(np.arange(len(rank)), count)
    # the j-th patch of a box, unravelled over its span (row-major)
    j = np.arange(box.size) - np.repeat(np.cumsum(count) - count, count)
    offs = np.empty((box.size, len(p)), dtype=np.int64)
    for d in reversed(range(len(p))):
        offs[:, d] = j % span[box, d]
        j //= span[box, d]
    cell = first[box] + offs
    plo = cell * p
    plo_c = np.maximum(plo, lo[box])
    phi_c = np.minimum(plo + p, hi[box])
    patch_id = grid.index()[tuple(cell.T)]
    return Pieces(rank[box], patch_id, plo_c, phi_c, keep[box])


# --------------------------------------------------------------------------
# distribution


@dataclass(frozen=True)
class Distribution:
    """Owner of each patch and the pieces that move to it.

    Attributes
    ----------
    owner
        ``(M,)`` owner rank of each patch (Morton-numbered); -1 where no rank wrote any
        of the patch (nothing to encode: it is not shared out).
    src, dst, lo, hi
        The moves: piece ``[lo, hi)`` goes from rank ``src`` to ``dst``.
    """

    owner: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    def counts(self, nranks: int) -> np.ndarray:
        """Patches per rank."""
        return np.bincount(self.owner[self.owner >= 0], minlength=nranks)

    def moved(self) -> int:
        """Cells moved between ranks."""
        return int(np.prod(self.hi - self.lo, axis=1).sum())

    def messages(self) -> int:
        """Distinct (source, destination) pairs."""
        if not self.src.size:
            return 0
        return int(np.unique(self.src * (int(self.dst.max()) + 1) + self.dst).size)


def _rounds(
    pending: np.ndarray,
    cand_patch: np.ndarray,
    cand_rank: np.ndarray,
    room: np.ndarray,
    budget: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Patches propose to their smallest candidate with room; ranks accept in patch order.

    *cand_patch*, *cand_rank* list candidates sorted by (patch, rank);
    *room* is updated in place.  With a *budget*, at most that many
    patches are placed in all, the first in patch order.  Returns the
    accepted (patches, ranks).
    """
    got_p, got_r = [], []
    waiting = pending.copy()
    while budget is None or budget > 0:
        ok = waiting[cand_patch] & (room[cand_rank] > 0)
        if not ok.any():
            break
        cp, cr = cand_patch[ok], cand_rank[ok]
        first = np.r_[True, cp[1:] != cp[:-1]]
        pp, pr = cp[first], cr[first]  # each patch's smallest candidate with room
        order = np.lexsort((pp, pr))
        pp, pr = pp[order], pr[order]
        start = np.r_[True, pr[1:] != pr[:-1]]
        run = np.arange(pr.size) - np.maximum.accumulate(np.where(start, np.arange(pr.size), 0))
        take = run < room[pr]
        pp, pr = pp[take], pr[take]
        if budget is not None:
            first_ones = np.argsort(pp, kind="stable")[:budget]
            pp, pr = pp[first_ones], pr[first_ones]
            budget -= pp.size
        np.subtract.at(room, pr, 1)
        waiting[pp] = False
        got_p.append(pp)
        got_r.append(pr)
    if not got_p:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(got_p), np.concatenate(got_r)


def distribute(
    grid: Grid, nranks: int, pcs: Pieces, *, scheme: str = "balanced", prefer: str = "rank"
) -> Distribution:
    """Choose an owner for every patch (see the module docstring).

    Parameters
    ----------
    grid
        The patch grid (``M`` patches).
    nranks
        ``N``, the number of ranks.
    pcs
        Where the rank boxes meet the patches (:func:`pieces`).
    scheme
        ``"balanced"``: ``floor(M/N)`` or ``floor(M/N) + 1`` patches per
        rank, patches kept where they are when possible; ``"greedy"``: the
        rank with the largest piece owns a patch.
    prefer
        Balanced only: which sharing rank a shared patch tries first,
        ``"rank"`` (the smallest) or ``"piece"`` (the one holding the
        largest piece, which moves fewer cells).

    Returns
    -------
    Distribution
        Owners and the pieces that move.

    Raises
    ------
    ValueError
        If *scheme* or *prefer* is unknown or *nranks* < 1.
    """
    if nranks < 1:
        raise ValueError(f"need at least 1 rank, not {nranks}")
    m = grid.size
    # volume per (patch, rank), sorted by patch then rank
    key = pcs.patch * nranks + pcs.rank
    uk, inv = np.unique(key, return_inverse=True)
    vol = np.bincount(inv, weights=pcs.volume, minlength=uk.size)
    cp, cr = uk // nranks, uk % nranks
    written = np.zeros(m, dtype=bool)  # patches some rank holds part of: the M shared out
    written[cp] = True
    if scheme == "greedy":
        owner = np.full(m, -1, dtype=np.int64)
        order = np.lexsort((cr, -vol, cp))  # per patch: largest piece, then smallest rank
        first = order[np.r_[True, cp[order][1:] != cp[order][:-1]]]
        owner[cp[first]] = cr[first]
        return _moves(owner, pcs)
    if scheme != "balanced":
        raise ValueError(f"scheme must be 'balanced' or 'greedy', not {scheme!r}")
    if prefer == "piece":  # candidates of a patch by decreasing piece, then rank
        order = np.lexsort((cr, -vol, cp))
        cp, cr, vol = cp[order], cr[order], vol[order]
    elif prefer != "rank":
        raise ValueError(f"prefer must be 'rank' or 'piece', not {prefer!r}")
    q, r = divmod(int(written.sum()), nranks)
    owner = np.full(m, -1, dtype=np.int64)
    patch_vol = np.prod(grid.hi - grid.lo, axis=1)
    whole = vol == patch_vol[cp]  # one rank holds all of the patch
    # 1. whole patches stay, up to q per rank (in patch order)
    wp, wr = cp[whole], cr[whole]
    order = np.lexsort((wp, wr))
    wp, wr = wp[order], wr[order]
    start = np.r_[True, wr[1:] != wr[:-1]] if wr.size else np.zeros(0, bool)
    run = np.arange(wr.size) - np.maximum.accumulate(np.where(start, np.arange(wr.size), 0))
    keep = run < q
    owner[wp[keep]] = wr[keep]
    count = np.bincount(wr[keep], minlength=nranks)
    # 2. shared patches to the smallest sharing rank below q
    pending = owner < 0
    room = q - count
    ap, ar = _rounds(pending, cp, cr, room)
    owner[ap] = ar
    count = q - room
    # 3. one extra each, smallest candidate first, in patch order, while the r extras last
    pending = owner < 0
    extra = np.where(count == q, 1, 0)
    ap, ar = _rounds(pending, cp, cr, extra, budget=r)
    owner[ap] = ar
    count += np.bincount(ar, minlength=nranks)
    left = r - ap.size
    # 4. the rest to the first ranks below target
    rest = np.flatnonzero((owner < 0) & written)
    if rest.size:
        deficit = np.repeat(np.arange(nranks), np.maximum(q - count, 0))  # in rank order
        extras = np.flatnonzero(np.maximum(count, q) == q)[:left]
        owner[rest] = np.concatenate([deficit, extras])[: rest.size]
    return _moves(owner, pcs)


def _moves(owner: np.ndarray, pcs: Pieces) -> Distribution:
    away = owner[pcs.patch] != pcs.rank
    return Distribution(
        owner,
        pcs.rank[away],
        owner[pcs.patch[away]],
        pcs.lo[away],
        pcs.hi[away],
    )


# --------------------------------------------------------------------------
# aggregation


@dataclass(frozen=True)
class Aggregation:
    """Runs of Morton-ordered patches per aggregator.

    Attributes
    ----------
    bounds
        ``(F + 1,)``: aggregator ``j`` writes patches ``bounds[j] ..
        bounds[j+1] - 1`` (Morton numbers).
    ranks
        ``(F,)`` the rank each aggregator runs on.
    bytes
        ``(F,)`` bytes each aggregator writes.
    """

    bounds: np.ndarray
    ranks: np.ndarray
    bytes: np.ndarray

    @classmethod
    def of_bounds(cls, bounds: np.ndarray, sizes: np.ndarray, nranks: int) -> Aggregation:
        """The aggregation whose runs are *bounds* (as :func:`aggregate` cut them elsewhere)."""
        bounds = np.asarray(bounds, dtype=np.int64)
        cum = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])
        if (
            bounds.size < 2
            or bounds[0] != 0
            or bounds[-1] != cum.size - 1
            or np.any(np.diff(bounds) < 0)
        ):
            raise ValueError(
                f"run bounds {bounds.tolist()[:8]} do not cover {cum.size - 1} patches"
            )
        f = bounds.size - 1
        return cls(bounds, aggregator_ranks(f, nranks), cum[bounds[1:]] - cum[bounds[:-1]])

    def of_patch(self) -> np.ndarray:
        """Aggregator of each patch."""
        m = int(self.bounds[-1])
        return np.repeat(np.arange(len(self.ranks)), np.diff(self.bounds))[:m]

    def balance(self) -> float:
        """Bytes of the busiest aggregator over the mean (1 is perfect)."""
        mean = self.bytes.mean() if self.bytes.size else 0.0
        return float(self.bytes.max() / mean) if mean > 0 else 1.0


def aggregator_ranks(naggregators: int, nranks: int) -> np.ndarray:
    """Ranks of *naggregators* aggregators spread evenly over *nranks*: ``floor(j N / F)``."""
    if not 1 <= naggregators:
        raise ValueError(f"need at least 1 aggregator, not {naggregators}")
    return (np.arange(naggregators, dtype=np.int64) * nranks) // naggregators


def aggregate(
    sizes: np.ndarray, naggregators: int, nranks: int, *, scheme: str = "balanced"
) -> Aggregation:
    """Cut Morton-ordered patches into runs, one per aggregator.

    Parameters
    ----------
    sizes
        ``(M,)`` compressed bytes of each patch, in Morton order.
    naggregators
        ``F``.
    nranks
        ``N`` (for placing the aggregators).
    scheme
        ``"balanced"``: the running byte target of the module docstring;
        ``"counts"``: equal numbers of patches.

    Returns
    -------
    Aggregation
        The runs, the aggregators' ranks and their bytes.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    m, f = sizes.size, int(naggregators)
    ranks = aggregator_ranks(f, nranks)
    cum = np.concatenate([[0], np.cumsum(sizes)])
    if scheme == "counts":
        bounds = (np.arange(f + 1, dtype=np.int64) * m) // f
    elif scheme == "balanced":
        bounds = _running_target(cum, f)
    else:
        raise ValueError(f"scheme must be 'balanced' or 'counts', not {scheme!r}")
    return Aggregation(bounds, ranks, cum[bounds[1:]] - cum[bounds[:-1]])


#: how close the bisection of :func:`_running_target` brings the cap to its smallest value
CAP_PRECISION = 1e-4


def _fits(cum: np.ndarray, cap: float, runs: int) -> bool:
    """Whether runs of at most *cap* bytes cover all patches in at most *runs* runs.

    The greedy cover (each run as long as *cap* allows) uses the fewest
    runs; its jump from each start is vectorized, and *runs* jumps from
    the first patch are composed by repeated squaring.
    """
    m = cum.size - 1
    nxt = np.searchsorted(cum, cum + cap, side="right") - 1
    nxt[m] = m
    pos, table, k = 0, nxt, runs
    while k:
        if k & 1:
            pos = int(table[pos])
        k >>= 1
        if k:
            table = table[table]
    return pos == m


def _running_target(cum: np.ndarray, f: int) -> np.ndarray:
    """Run boundaries: each aggregator aims at (bytes left) / (aggregators left).

    Each run ends at the patch boundary closest to its target, within what
    keeps every run at most the smallest possible largest run (found by
    bisection on :func:`_fits`) and leaves the patches after it coverable
    by the aggregators after it.
    """
    m = cum.size - 1
    total = float(cum[-1])
    sizes = np.diff(cum)
    lo = max(total / f, float(sizes.max(initial=0)))
    hi = max(lo, total)
    if m and not _fits(cum, lo, f):
        # to a part in 10^4 of the smallest possible largest run (or a byte): closer changes
        # no aggregator's load measurably and costs a pass over the patches per halving
        for _ in range(60):
            mid = (lo + hi) / 2
            if _fits(cum, mid, f):
                hi = mid
            else:
                lo = mid
            if hi - lo <= max(0.5, CAP_PRECISION * lo):
                break
        cap = hi
    else:
        cap = lo
    # latest[k]: the smallest start from which k runs of at most cap reach the end
    prev = np.searchsorted(cum, cum - cap, side="left").tolist()
    latest = [m]
    for _ in range(f):
        latest.append(prev[latest[-1]])
    cl = cum.tolist()
    bounds = [0]
    start = 0
    for j in range(f - 1):
        base = cl[start]
        want = base + (total - base) / (f - j)
        top = bisect.bisect_right(cl, base + cap) - 1  # the longest run within the cap
        low = max(start, latest[f - j - 1])
        e = min(max(bisect.bisect_right(cl, want) - 1, low), top)
        if e < top and cl[e + 1] - want < want - cl[e]:
            e += 1
        bounds.append(e)
        start = e
    bounds.append(m)
    return np.asarray(bounds, dtype=np.int64)


def traffic(owner: np.ndarray, agg: Aggregation, sizes: np.ndarray) -> dict[str, int]:
    """Messages (distinct rank -> aggregator-rank pairs) and bytes from owners to aggregators.

    Patches whose owner runs their aggregator are not sent.
    """
    dst = agg.ranks[agg.of_patch()]
    away = dst != owner
    width = int(dst.max(initial=0)) + 1
    pairs = np.unique(owner[away] * width + dst[away])
    per_rank = np.bincount(pairs // width) if pairs.size else np.zeros(1, np.int64)
    return {
        "messages": int(pairs.size),
        "bytes_sent": int(np.asarray(sizes)[away].sum()),
        "max_destinations_per_rank": int(per_rank.max()),
    }


# --------------------------------------------------------------------------
# simulation


def block_decomposition(
    shape: Sequence[int], nranks: int, *, jitter: float = 0.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One box per rank on a process grid (``dims_create``), optionally with uneven cuts.

    Parameters
    ----------
    shape
        The dataset's shape.
    nranks
        Number of ranks.
    jitter
        Move each cut by up to this fraction of a cell's width at random,
        so boxes are uneven (as an adaptive code's are).
    seed
        Random seed for *jitter*.

    Returns
    -------
    tuple of numpy.ndarray
        ``rank (N,)``, ``lo (N, ndim)``, ``hi (N, ndim)``.
    """
    s = tuple(int(n) for n in shape)
    dims = list(dims_create(nranks, len(s)))
    order = sorted(range(len(s)), key=lambda d: -s[d])
    grid_dims = [1] * len(s)
    for d, f in zip(order, dims, strict=True):
        grid_dims[d] = f
    rng = np.random.default_rng(seed)
    cuts = []
    for n, k in zip(s, grid_dims, strict=True):
        c = (np.arange(k + 1) * n) // k
        if jitter and k > 1:
            width = n / k
            move = rng.uniform(-jitter, jitter, k - 1) * width
            c[1:-1] = np.clip(np.round(c[1:-1] + move), 0, n).astype(np.int64)
            c = np.maximum.accumulate(c)
        cuts.append(c)
    idx = np.indices(grid_dims).reshape(len(s), -1).T
    lo = np.stack([cuts[d][idx[:, d]] for d in range(len(s))], axis=1)
    hi = np.stack([cuts[d][idx[:, d] + 1] for d in range(len(s))], axis=1)
    return np.arange(nranks, dtype=np.int64), lo, hi


def synthetic_sizes(
    grid: Grid, seed: int = 0, *, itemsize: int = 4, empty: float = 0.2
) -> np.ndarray:
    """Compressed sizes with spatial structure, as a field's patches give them.

    Compression ratios vary smoothly over space (log-normal around 16:1:
    turbulence compresses less, quiet flow more), no patch grows beyond its
    raw size, and the *empty* fraction of patches (a region of constant
    values) shrinks to about a hundred bytes.

    Returns
    -------
    numpy.ndarray
        int64 bytes per patch, Morton order.
    """
    rng = np.random.default_rng(seed)
    c = grid.coords.astype(np.float64) / np.maximum(1, np.asarray(grid.counts) - 1)
    field = np.zeros(grid.size)
    for _ in range(6):
        k = rng.normal(0, 3, c.shape[1])
        field += np.sin(c @ k * 2 * np.pi + rng.uniform(0, 2 * np.pi))
    field = field / (field.std() or 1.0) + 0.3 * rng.standard_normal(grid.size)
    raw = np.prod(grid.hi - grid.lo, axis=1) * itemsize
    ratio = np.clip(16 * np.exp(-field), 1.0, None)
    if empty > 0:
        ratio[field < np.quantile(field, empty)] = np.inf
    return np.maximum(raw / ratio, 96).astype(np.int64)


def simulate(
    nranks: int,
    shape: Sequence[int],
    patch: Sequence[int],
    naggregators: int,
    *,
    jitter: float = 0.3,
    sizes: np.ndarray | None = None,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Run distribution and aggregation for *nranks* virtual ranks; report balance and traffic.

    Parameters
    ----------
    nranks
        Virtual ranks ``N`` (10^4 to 10^5 run in seconds).
    shape, patch
        The dataset and patch shapes.
    naggregators
        ``F``.
    jitter
        Unevenness of the rank boxes (:func:`block_decomposition`).
    sizes
        Compressed bytes per patch in Morton order; default
        :func:`synthetic_sizes`.
    seed
        Random seed.

    Returns
    -------
    dict
        Per scheme (``distribute/balanced``, ``distribute/balanced-piece``
        (``prefer="piece"``), ``distribute/greedy``,
        ``aggregate/balanced``, ``aggregate/counts``): patches per rank
        max - min, cells moved, messages; aggregator bytes max / mean,
        messages and bytes sent.
    """
    grid = Grid.of(shape, patch)
    rank, lo, hi = block_decomposition(shape, nranks, jitter=jitter, seed=seed)
    pcs = pieces(grid, rank, lo, hi)
    if sizes is None:
        sizes = synthetic_sizes(grid, seed)
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.shape != (grid.size,):
        raise ShapeError(f"{sizes.size} sizes for {grid.size} patches")
    report: dict[str, dict[str, float]] = {}
    owners = {}
    for scheme, prefer in (("balanced", "rank"), ("balanced", "piece"), ("greedy", "rank")):
        dist = distribute(grid, nranks, pcs, scheme=scheme, prefer=prefer)
        if prefer == "piece":
            scheme = "balanced-piece"
        counts = dist.counts(nranks)
        owners[scheme] = dist.owner
        report[f"distribute/{scheme}"] = {
            "patches": grid.size,
            "patches_max_minus_min": int(counts.max() - counts.min()),
            "patches_max": int(counts.max()),
            "cells_moved": dist.moved(),
            "cells_moved_fraction": dist.moved() / math.prod(grid.shape),
            "messages": dist.messages(),
        }
    for scheme in ("balanced", "counts"):
        agg = aggregate(sizes, naggregators, nranks, scheme=scheme)
        t = traffic(owners["balanced"], agg, sizes)
        report[f"aggregate/{scheme}"] = {
            "aggregators": naggregators,
            "bytes_max_over_mean": agg.balance(),
            "bytes_min_over_mean": float(agg.bytes.min() / agg.bytes.mean()),
            **t,
        }
    return report
