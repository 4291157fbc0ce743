"""Collective reads in one process: the plan that shares blocks between ranks, and the call on one rank.

The reads themselves, on 2-4 ranks with every value compared, misuse and
a damaged block, are in ``tests/scenarios/collective_read.py`` (run by
``test_mpi.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

import lamina
from lamina.engines import collective
from lamina.geometry import Box

SHAPE = (16, 12, 6)


def value(box: Box) -> np.ndarray:
    g = np.meshgrid(
        *[np.arange(a, b) for a, b in zip(box.start, box.stop, strict=True)], indexing="ij"
    )
    return np.ravel_multi_index(g, SHAPE).astype(np.float64)


@pytest.fixture
def slabs_file(tmp_path):
    """4 blocks, axis-0 slabs of 4 rows, as 4 writers would have written them."""
    path = tmp_path / "s.lam"
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("a", SHAPE, "f8")
        with f.step():
            for q in range(4):
                box = Box((4 * q, 0, 0), (4 * q + 4, *SHAPE[1:]))
                ds.write(value(box), offset=box.start)
    return path


def table(path):
    with lamina.open(path, "r") as f:
        return f._engine.block_table("a", 0)


def test_plan_reads_each_shared_block_once_balanced_over_the_ranks(slabs_file):
    t = table(slabs_file)
    boxes = [Box((0, 3 * r, 0), (16, 3 * r + 3, 6)) for r in range(4)]  # axis-1 slabs
    owners = {}
    for rank in range(4):
        p = collective.plan(t, boxes, rank, 8)
        assert p.own == []  # every block is needed by every rank
        assert p.shared == [0, 1, 2, 3]
        owners[rank] = dict(p.owner)
        for i in p.shared:
            assert sorted(r for r, _, _ in p.parts[i]) == [0, 1, 2, 3]
    assert all(o == owners[0] for o in owners.values())  # the same plan on every rank
    assert sorted(owners[0].values()) == [0, 1, 2, 3]  # one block each


def test_plan_leaves_a_block_one_rank_needs_to_that_rank(slabs_file):
    t = table(slabs_file)
    boxes = [Box((4 * r, 0, 0), (4 * r + 4, 12, 6)) for r in range(4)]  # the blocks as written
    for rank in range(4):
        p = collective.plan(t, boxes, rank, 8)
        assert p.shared == [] and [i for i, _, _ in p.own] == [rank]
    # rank 1 needs half of block 2 as well: that block is shared by ranks 1 and 2 and read once
    boxes[1] = Box((4, 0, 0), (10, 12, 6))
    p = collective.plan(t, boxes, 2, 8)
    assert p.shared == [2] and p.owner[2] in (1, 2)
    assert [i for i, _, _ in p.own] == []
    assert [i for i, _, _ in collective.plan(t, boxes, 1, 8).own] == [1]


@pytest.mark.parametrize("io", ["sync", "async"])
def test_collective_read_on_one_rank_is_a_read(slabs_file, io):
    box = Box((2, 1, 0), (15, 11, 6))
    with lamina.open(slabs_file, "r", io=io) as f:
        got = f["a"].read(box, collective=True)
        out = np.zeros((6, 10, 13)).T
        f["a"].read(box, out=out, collective=True)
    np.testing.assert_array_equal(got, value(box))
    np.testing.assert_array_equal(out, value(box))


def test_collective_read_of_a_derived_quantity(tmp_path):
    path = tmp_path / "d.lam"
    with lamina.open(path, "w") as f:
        ds = f.create_dataset("a", SHAPE, "f8")
        f.derive("twice", "2 * a", strategy="expression")
        with f.step():
            ds.write(value(Box.from_shape(SHAPE)))
    box = Box((1, 2, 3), (9, 10, 5))
    with lamina.open(path, "r") as f:
        np.testing.assert_array_equal(f["twice"].read(box, collective=True), 2 * value(box))
