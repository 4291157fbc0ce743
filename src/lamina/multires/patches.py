"""Cut an array into patches, batched by shape, and put levels of them back together.

A dataset of shape ``N`` is covered by a grid of ``ceil(N / P)`` patches of
shape ``P`` (powers of two); along a dimension that ``P`` does not divide,
the last patch is cut short (a *partial* patch of extent ``N % P``).
Patches of one shape form one batch (at most ``2**ndim`` batches: full
or partial along each dimension), which is what the batched transform and
encoder take.  At level ``k`` a full patch has shape ``P / 2**k`` and a
partial one ``ceil((N % P) / 2**k)``, so :func:`join` rebuilds an array of
exactly ``ceil(N / 2**k)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from .wavelet import check_level, check_patch, level_shape, nlevels


@dataclass(frozen=True)
class Batch:
    """Patches of one shape: where they sit in the grid and their values.

    Attributes
    ----------
    shape
        The shape of each patch.
    coords
        ``(npatches, ndim)`` grid coordinates of the patches.
    data
        ``(npatches, *shape)`` values (or, after :func:`cut`, whatever a
        caller puts in a batch of the same patches, e.g. a decoded level).
    """

    shape: tuple[int, ...]
    coords: np.ndarray
    data: np.ndarray


def grid(shape: Sequence[int], patch: Sequence[int]) -> tuple[int, ...]:
    """Patches along each dimension: ``ceil(shape / patch)``.

    Raises
    ------
    ShapeError
        If the patch is not made of powers of two, does not match the
        dataset's number of dimensions, or is larger than the dataset along
        every dimension (a dataset smaller than one patch would be a single
        partial patch, whose levels a smaller patch stores just as well).
    """
    p = check_patch(patch)
    s = tuple(int(n) for n in shape)
    if len(s) != len(p):
        raise ShapeError(f"patch {p} has {len(p)} dimensions, the dataset {len(s)} (shape {s})")
    if any(n < 1 for n in s):
        raise ShapeError(f"an empty dataset (shape {s}) has no patches")
    if all(a < b for a, b in zip(s, p, strict=True)):
        raise ShapeError(
            f"patch {p} is larger than the dataset (shape {s}) along every dimension; "
            "use a patch that fits in it along at least one"
        )
    return tuple(-(-a // b) for a, b in zip(s, p, strict=True))


def _pieces(n: int, p: int) -> list[tuple[int, int, int, int]]:
    """Along one dimension: (first grid index, count, start, edge) of full, then partial patches."""
    full, rest = divmod(n, p)
    out = []
    if full:
        out.append((0, full, 0, p))
    if rest:
        out.append((full, 1, full * p, rest))
    return out


def cut(array: np.ndarray, patch: Sequence[int]) -> list[Batch]:
    """Cut *array* into patches of *patch*, one :class:`Batch` per patch shape.

    Parameters
    ----------
    array
        The dataset's values.
    patch
        Patch shape, powers of two.

    Returns
    -------
    list of Batch
        Full patches first (if any), then the partial ones; within a batch
        patches in row-major order of the grid.  Every cell of *array* is
        in exactly one patch.
    """
    array = np.asarray(array)
    p = check_patch(patch)
    grid(array.shape, p)
    out = []
    for choice in itertools.product(*(_pieces(n, e) for n, e in zip(array.shape, p, strict=True))):
        sub = array[tuple(slice(start, start + count * edge) for _, count, start, edge in choice)]
        split = [x for _, count, _, edge in choice for x in (count, edge)]
        nd = len(choice)
        order = [2 * a for a in range(nd)] + [2 * a + 1 for a in range(nd)]
        edges = tuple(edge for *_, edge in choice)
        data = sub.reshape(split).transpose(order).reshape(-1, *edges)
        ranges = [np.arange(first, first + count) for first, count, _, _ in choice]
        coords = np.stack(np.meshgrid(*ranges, indexing="ij"), axis=-1).reshape(-1, nd)
        out.append(Batch(edges, coords, data))
    return out


def join(
    batches: Sequence[Batch], shape: Sequence[int], patch: Sequence[int], level: int = 0
) -> np.ndarray:
    """Put level *level* of every patch back into one array of ``ceil(shape / 2**level)``.

    Parameters
    ----------
    batches
        What :func:`cut` gave, with ``data`` replaced by each patch's level
        ``level`` (shape ``ceil(batch.shape / 2**level)``).
    shape
        The dataset's shape.
    patch
        The patch shape.
    level
        The level of the data in *batches*.

    Returns
    -------
    numpy.ndarray
        Level *level* of the dataset.

    Raises
    ------
    ShapeError
        If a batch's data does not have its patches' level shape.
    """
    p = check_patch(patch)
    g = grid(shape, p)
    level = check_level(level, nlevels(p))
    if not batches:
        raise ShapeError("no batches to join")
    dtype = np.result_type(*(b.data.dtype for b in batches))
    out = np.empty(level_shape(shape, level), dtype=dtype)
    step = level_shape(p, level)
    for b in batches:
        lshape = level_shape(b.shape, level)
        if b.data.shape != (len(b.coords), *lshape):
            raise ShapeError(
                f"batch of {len(b.coords)} patches of shape {b.shape} holds data of shape "
                f"{b.data.shape}, expected {(len(b.coords), *lshape)} at level {level}"
            )
        if not len(b.coords):
            continue
        lo, hi = b.coords.min(axis=0), b.coords.max(axis=0) + 1
        counts = tuple(int(x) for x in hi - lo)
        if int(np.prod(counts)) != len(b.coords) or (hi > np.asarray(g)).any():
            raise ShapeError("a batch's patches do not form a block of the grid")
        # the batch's patches in row-major grid order, as cut made them
        rank = np.ravel_multi_index(tuple((b.coords - lo).T), counts)
        data = np.empty_like(b.data)
        data[rank] = b.data
        nd = len(p)
        tiled = data.reshape(*counts, *lshape)
        order = [x for a in range(nd) for x in (a, nd + a)]
        block = tiled.transpose(order).reshape([c * e for c, e in zip(counts, lshape, strict=True)])
        start = tuple(int(c) * s for c, s in zip(lo, step, strict=True))
        out[tuple(slice(a, a + n) for a, n in zip(start, block.shape, strict=True))] = block
    return out
