"""The derived-quantity layer: f.derive, the three strategies, recompute on read, halos, errors.

Under MPI (``scenarios/derived_layer.py``, launched once per writer count
n = 1..4 and once per reader count): every function of the expression
language, on inputs written with uneven decompositions that differ from
input to input, against numpy on the assembled global arrays; the three
strategies give the same bits (within 1e-14 where numpy's transcendental
functions are involved); block statistics equal numpy's; files are
read back by a different number of ranks; ranks that pass different
derive() arguments all raise CollectiveMismatchError.

In this process (one rank): storage of the strategies, bytes read for a
region (region plus halo only), vector results, reader-side derive, append,
refresh, quantities over quantities, dtype and fill rules, division by zero,
every user error, and damaged definition records.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import pytest

import lamina
from lamina.catalog import Encoder
from lamina.errors import (
    ExistsError,
    ExpressionError,
    FormatError,
    ModeError,
    ShapeError,
)
from lamina.geometry import Box
from lamina.layers import DerivedLayer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import mpi_util as mu  # noqa: E402

pytestmark = [pytest.mark.usefixtures("fast_native"), pytest.mark.timeout(180)]


def _have_mpiexec() -> bool:
    try:
        mu.mpiexec()
    except RuntimeError:  # pragma: no cover - depends on the installation
        return False
    return True


needs_mpi = pytest.mark.skipif(not _have_mpiexec(), reason="no mpiexec")

STRATS = ("store", "stats", "expression")


# ---------------------------------------------------------------------------
# numpy references
# ---------------------------------------------------------------------------


def grad(a, ax, h=1.0):
    return np.gradient(a, h, axis=ax, edge_order=2)


def curl_ref(u, v, w, h=(1.0, 1.0, 1.0)):
    return [
        grad(w, 1, h[1]) - grad(v, 2, h[2]),
        grad(u, 2, h[2]) - grad(w, 0, h[0]),
        grad(v, 0, h[0]) - grad(u, 1, h[1]),
    ]


def close(got, want, what=""):
    sc = max(float(np.nanmax(np.abs(want))), 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * sc, equal_nan=True, err_msg=what)


SH = (12, 10, 8)
# uneven blocks: a 3 x 2 grid with cuts at different places, plus one cell thick slab
BLOCKS = [
    Box((0, 0, 0), (1, 10, 8)),
    Box((1, 0, 0), (4, 5, 8)),
    Box((1, 5, 0), (4, 10, 8)),
    Box((4, 0, 0), (8, 5, 8)),
    Box((4, 5, 0), (8, 10, 8)),
    Box((8, 0, 0), (12, 10, 8)),
]


def fields(step: int = 0, shape=SH) -> dict[str, np.ndarray]:
    i, j, k = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in shape], indexing="ij")
    return {
        "u": np.sin(0.3 * i + 0.2 * j + step) * np.cos(0.25 * k),
        "v": np.exp(0.1 * j) * np.cos(0.2 * i - 0.1 * k) + step,
        "w": 0.5 * i * i - 0.3 * i * j + 0.2 * k * k + j - 0.5 * k + 1.0 + step,  # quadratic
    }


def create_inputs(f, shape=SH, names="uvw") -> None:
    for n in names:
        f.create_dataset(n, shape, "f8")


def write_step(
    f, step: int, blocks=BLOCKS, names="uvw", skip=(), shape=SH
) -> dict[str, np.ndarray]:
    """One committed step of the inputs, block by block; returns what a reader sees."""
    F = fields(step, shape)
    seen = {}
    with f.step():
        for n in names:
            seen[n] = np.zeros(shape)
            for i, b in enumerate(blocks):
                if (n, i) in skip:
                    continue
                f[n][b.slices] = F[n][b.slices]
                seen[n][b.slices] = F[n][b.slices]
    return seen


def dir_bytes(path: str, prefix: str = "") -> int:
    return sum(
        os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n.startswith(prefix)
    )


def snapshot(path: str) -> dict[str, bytes]:
    out = {}
    for n in sorted(os.listdir(path)):
        with open(os.path.join(path, n), "rb") as fh:
            out[n] = fh.read()
    return out


# ---------------------------------------------------------------------------
# MPI: every function, n writers, m readers, strategies agree, mismatched ranks
# ---------------------------------------------------------------------------

# writer ranks -> reader ranks (1: in a plain Python process, no mpiexec)
WRITE_READ = {1: 3, 2: 1, 3: 2, 4: 1}


@needs_mpi
@pytest.mark.parametrize("n", sorted(WRITE_READ))
def test_mpi_every_function_n_writers_m_readers(tmp_path, n):
    """All functions vs numpy, uneven decompositions, the three strategies identical, read by m != n ranks."""
    res = mu.run_mpi(n, "derived_layer", "write", tmp_path, timeout=100)
    lines = res.lines("OK")
    assert any(ln.startswith(f"write {n} ranks") for ln in lines), res.stdout
    assert any(ln.startswith(f"read back by the {n} writer ranks") for ln in lines), res.stdout
    if n > 1:
        cases = [ln for ln in lines if ln.startswith("mismatch")]
        assert len(cases) == 6, res.stdout
        assert sum("CollectiveMismatchError on every rank" in ln for ln in cases) == 5, res.stdout
    m = WRITE_READ[n]
    if m == 1:
        res = mu.run_python("derived_layer", "read", tmp_path, n, timeout=60)
    else:
        res = mu.run_mpi(m, "derived_layer", "read", tmp_path, n, timeout=60)
    assert any(ln.startswith(f"read {m} ranks of files by {n} ranks") for ln in res.lines("OK"))


# ---------------------------------------------------------------------------
# strategies: same values, what each one stores
# ---------------------------------------------------------------------------


def test_strategies_same_values_and_storage(tmp_path):
    """store keeps data, stats only statistics (zero-byte blocks), expression nothing but the record."""
    shape = (32, 32, 32)
    blocks = [
        Box((0, 0, 0), (5, 32, 32)),
        Box((5, 0, 0), (16, 32, 32)),
        Box((16, 0, 0), (30, 32, 32)),
        Box((30, 0, 0), (32, 32, 32)),
    ]
    paths = {}
    for s in ("none", *STRATS):
        paths[s] = str(tmp_path / f"{s}.lam")
        with lamina.open(paths[s], "w") as f:
            create_inputs(f, shape)
            if s != "none":
                f.derive("m", "magnitude(u, v, w)", s)
                f.derive("c", "curl(u, v, w)", s, spacing=(0.5, 2.0, 1.0))
            for k in range(2):
                write_step(f, k, blocks, shape=shape)
    input_bytes = 3 * 2 * 32**3 * 8
    derived_bytes = 4 * 2 * 32**3 * 8  # m and c/x, c/y, c/z at two steps
    size = {s: dir_bytes(p) for s, p in paths.items()}
    data = {s: dir_bytes(p, "data.") for s, p in paths.items()}
    assert data["none"] >= input_bytes
    # store: the subfiles grow by the derived data, the whole file by little more
    assert data["store"] - data["none"] == derived_bytes
    assert derived_bytes <= size["store"] - size["none"] <= derived_bytes + 16384
    # stats: no data at all, only statistics and the record
    assert data["stats"] == data["none"]
    assert 0 < size["stats"] - size["none"] < 0.01 * input_bytes + 4096
    # expression: no blocks, only the record (and the dataset definitions)
    assert data["expression"] == data["none"]
    assert 0 < size["expression"] - size["none"] < 2048
    assert size["expression"] < size["stats"] < size["store"]

    files = {s: lamina.open(paths[s]) for s in STRATS}
    try:
        for k in range(2):
            F = fields(k, shape)
            ref = {"m": np.sqrt(F["u"] ** 2 + F["v"] ** 2 + F["w"] ** 2)}
            for c, a in zip("xyz", curl_ref(F["u"], F["v"], F["w"], (0.5, 2.0, 1.0)), strict=True):
                ref[f"c/{c}"] = a
            for name, want in ref.items():
                got = {s: f.at(k)[name][...] for s, f in files.items()}
                close(got["store"], want, f"{name} step {k}")
                # the same kernels run on the same values: identical bits under every strategy
                assert np.array_equal(got["stats"], got["store"])
                assert np.array_equal(got["expression"], got["store"])
                for s, f in files.items():
                    bl = f[name].blocks(k)
                    if s == "expression":
                        assert bl == []
                        continue
                    assert sorted(b.box.start for b in bl) == sorted(b.start for b in blocks)
                    for b in bl:
                        assert b.codec == ("raw" if s == "store" else "stats-only")
                        assert b.nbytes == (b.raw_nbytes if s == "store" else 0)
                        part = want[b.box.slices]
                        assert b.stats.count == part.size
                        assert b.stats.min == pytest.approx(part.min(), rel=1e-12, abs=1e-12)
                        assert b.stats.max == pytest.approx(part.max(), rel=1e-12, abs=1e-12)
                        assert b.stats.sum == pytest.approx(part.sum(), rel=1e-10, abs=1e-9)
    finally:
        for f in files.values():
            f.close()


def test_quadratic_stencils_exact_at_block_edges_and_boundary(open_file, new_path):
    """numpy.gradient(edge_order=2) is exact for a quadratic, also at the domain boundary and block edges."""
    p = new_path()
    h = (0.5, 2.0, 1.0)
    f = open_file(p, "w")
    create_inputs(f)
    f.derive("g", "gradient(w)", "stats", spacing=h)
    f.derive("lap", "laplacian(w)", "stats", spacing=h)
    f.derive("d", "divergence(w, w, w)", "expression", spacing=h)
    write_step(f, 0)
    f.close()
    i, j, k = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in SH], indexing="ij")
    # w = 0.5 i^2 - 0.3 i j + 0.2 k^2 + j - 0.5 k + 1 with x_a = index * h[a]
    exact = [(i - 0.3 * j) / h[0], (-0.3 * i + 1.0) / h[1], (0.4 * k - 0.5) / h[2]]
    f = open_file(p)
    for c, want in zip("xyz", exact, strict=True):
        close(f[f"g/{c}"][...], want, c)
    close(f["lap"][...], np.full(SH, 1.0 / h[0] ** 2 + 0.4 / h[2] ** 2))
    close(f["d"][...], sum(exact))


def test_blocks_with_gaps_computed_block_by_block(open_file, new_path):
    """A writer whose blocks do not tile their box computes each block on its own: its inputs
    are the blocks of the same box (found by the box), a stencil's halo outside them is the
    fill value where nobody wrote."""
    p = new_path()
    f = open_file(p, "w")
    u = f.create_dataset("u", (40, 6), "f8", fill=0.0)
    v = f.create_dataset("v", (40, 6), "f8", fill=0.0)
    f.derive("s", "u * v + 1", "store")
    f.derive("g", "gradient(u, 1)", "stats")
    f.derive("d", "gradient(u, 0)", "store")
    rng = np.random.default_rng(7)
    uu, vv = np.zeros((40, 6)), np.zeros((40, 6))
    with f.step():
        for r in range(0, 40, 4):  # rows r, r+1 written, r+2, r+3 not
            a, b = rng.random((2, 6)), rng.random((2, 6))
            uu[r : r + 2], vv[r : r + 2] = a, b
            u.write(a, offset=(r, 0))
            v.write(b, offset=(r, 0))
    f.close()
    f = open_file(p)
    rows = np.concatenate([[r, r + 1] for r in range(0, 40, 4)])
    np.testing.assert_array_equal(f["s"][...][rows], (uu * vv + 1)[rows])
    np.testing.assert_array_equal(f["g"][...][rows], np.gradient(uu, axis=1, edge_order=2)[rows])
    # along axis 0 each block's halo is the fill value (0) where nobody wrote
    np.testing.assert_allclose(
        f["d"][...][rows], np.gradient(uu, axis=0, edge_order=2)[rows], rtol=1e-14
    )
    blocks = f["s"].blocks(0)
    assert len(blocks) == 10
    for blk in blocks:
        want = (uu * vv + 1)[blk.box.slices]
        assert blk.stats.min == want.min() and blk.stats.max == want.max()


def test_pointwise_over_large_blocks_is_computed_in_place(open_file, new_path, monkeypatch):
    """Blocks of IN_PLACE_ELEMENTS or more: a pointwise expression is evaluated block by block on
    the arrays as written (nothing gathered into a box over them); a stencil still gathers."""
    from lamina.layers.derived import exchange
    from lamina.perf import model

    assert model.IN_PLACE_ELEMENTS == exchange.IN_PLACE_ELEMENTS  # the model follows the layer
    monkeypatch.setattr(exchange, "IN_PLACE_ELEMENTS", 16)
    gathered = []
    real = exchange.assemble
    monkeypatch.setattr(
        exchange,
        "assemble",
        lambda held, spec, need, rec: gathered.append(need) or real(held, spec, need, rec),
    )
    p = new_path()
    f = open_file(p, "w")
    u = f.create_dataset("u", (8, 6), "f8")
    v = f.create_dataset("v", (8, 6), "f8")
    f.derive("s", "u * v + 1", "store")
    rng = np.random.default_rng(3)
    uu, vv = rng.random((8, 6)), rng.random((8, 6))
    with f.step():
        for r in (0, 4):  # two blocks of 24 elements, tiling the dataset
            u.write(uu[r : r + 4], offset=(r, 0))
            v.write(vv[r : r + 4], offset=(r, 0))
    assert gathered == []
    # v in one block: each of u's blocks takes its part of v (a view of v's block)
    with f.step():
        for r in (0, 4):
            u.write(uu[r : r + 4], offset=(r, 0))
        v.write(vv, offset=(0, 0))
    assert gathered == [Box((0, 0), (4, 6)), Box((4, 0), (8, 6))]
    gathered.clear()
    f.derive("g", "gradient(u, 0)", "store")
    with f.step():
        for r in (0, 4):
            u.write(uu[r : r + 4], offset=(r, 0))
            v.write(vv[r : r + 4], offset=(r, 0))
    assert gathered == [Box((0, 0), (8, 6))]  # the stencil: once, over the box of both blocks
    f.close()
    f = open_file(p)
    for k in (0, 1, 2):
        np.testing.assert_array_equal(f["s"].read(step=k), uu * vv + 1)
        assert [b.box for b in f["s"].blocks(k)] == [Box((0, 0), (4, 6)), Box((4, 0), (8, 6))]
    np.testing.assert_allclose(
        f["g"].read(step=2), np.gradient(uu, axis=0, edge_order=2), rtol=1e-14
    )


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_blocks_evaluated_where_they_lie_in_one_call(open_file, new_path, monkeypatch, device):
    """A pointwise expression over blocks of IN_PLACE_ELEMENTS or more: one evaluate_regions
    call for the rank's blocks (on the CPU, also under device='auto' without a GPU)."""
    from lamina.layers.derived import exchange

    monkeypatch.setattr(exchange, "IN_PLACE_ELEMENTS", 4)
    monkeypatch.setattr(lamina.derived, "gpu_available", lambda: False)
    calls = []
    real = lamina.derived.evaluate_regions
    monkeypatch.setattr(
        lamina.derived,
        "evaluate_regions",
        lambda e, items, *a, **k: calls.append(len(items)) or real(e, items, *a, **k),
    )
    uu = np.arange(48.0).reshape(12, 4)
    with open_file(new_path(), "w", device=device) as f:
        u = f.create_dataset("u", (12, 4), "f8")
        f.derive("s", "u * 2 - 1", "stats")
        with f.step():
            for r in (0, 4, 8):
                u.write(uu[r : r + 4], offset=(r, 0))
        assert calls == [3]
        np.testing.assert_array_equal(f["s"][...], uu * 2 - 1)
        assert [(b.stats.min, b.stats.max) for b in f["s"].blocks()] == [
            (uu[r : r + 4].min() * 2 - 1, uu[r : r + 4].max() * 2 - 1) for r in (0, 4, 8)
        ]


@pytest.mark.parametrize("io", ["sync", "async"])
def test_a_gpu_that_is_not_there_is_refused_at_the_open(open_file, new_path, monkeypatch, io):
    """device='gpu' without CuPy or a CUDA device: DeviceUnavailableError at the open, naming
    the device and what is missing, for a writer (before the file is made) and a reader alike
    (it was accepted, and every step then failed at its commit, or under io='async' at close)."""
    from lamina.derived import compute

    monkeypatch.setattr(compute, "gpu_missing", lambda: "CuPy does not import (simulated)")
    p = new_path()
    with pytest.raises(lamina.DeviceUnavailableError) as info:
        open_file(p, "w", device="gpu", io=io)
    assert "device='gpu'" in str(info.value) and "CuPy does not import" in str(info.value)
    assert not os.path.exists(p)
    with open_file(p, "w", io=io) as f:  # the same stack on the CPU
        f.create_dataset("a", (4, 4))
        f.derive("b", "a * 2", "expression")
        with f.step():
            f["a"][...] = 1.0
    with pytest.raises(lamina.DeviceUnavailableError, match="device='gpu'.*simulated"):
        open_file(p, "r", device="gpu")
    # a GPU that is there: the open goes on (nothing computed here, so CuPy is not needed)
    monkeypatch.setattr(compute, "gpu_missing", lambda: None)
    with open_file(p, "r", device="gpu") as f:
        assert f.steps == 1


def test_device_cpu_or_auto_does_not_look_for_a_gpu_at_the_open(open_file, new_path, monkeypatch):
    from lamina.derived import compute

    def look():
        raise AssertionError("CuPy looked for at the open")

    monkeypatch.setattr(compute, "gpu_missing", look)
    for device in ("cpu", "auto"):
        with open_file(new_path(), "w", device=device) as f:
            layer = next(e for e in f.engine.stack() if isinstance(e, DerivedLayer))
            assert layer.device == device


@pytest.mark.parametrize("io", ["sync", "async", "auto"])
@pytest.mark.parametrize("strategy", ["store", "stats"])
def test_zero_dim_inputs_lent_or_copied(open_file, new_path, io, strategy):
    """A 0-D input held for the end of the step stays 0-D whether it was copied or lent (under
    io='async' the background layer hands its copies down with copy=False)."""
    p = new_path()
    with open_file(p, "w", io=io) as f:
        f.create_dataset("u", (), "f8")
        f.create_dataset("v", (), "f8")
        f.derive("s", "u * v", strategy)
        for k in range(2):
            with f.step():
                f["u"][...] = 2.0 + k
                f["v"].write(np.array(3.0), copy=False)
    with open_file(p) as f:
        assert [float(f.at(k)["s"][...]) for k in range(2)] == [6.0, 9.0]
        assert [b.stats.max for b in f["s"].blocks(1)] == [9.0]


# ---------------------------------------------------------------------------
# reading: region plus halo only
# ---------------------------------------------------------------------------


def _box(start, stop) -> Box:
    return Box(tuple(start), tuple(stop))


# (expression, region read, the box each input must be read over)
HALO_CASES = [
    (
        "magnitude(u, v, w)",
        _box((4, 5, 0), (8, 10, 8)),
        {n: _box((4, 5, 0), (8, 10, 8)) for n in "uvw"},
    ),
    (
        "magnitude(u, v, w)",
        _box((5, 6, 2), (7, 8, 3)),
        {n: _box((5, 6, 2), (7, 8, 3)) for n in "uvw"},
    ),
    (
        "curl(u, v, w)",  # u differentiated along axes 1 and 2, v along 0 and 2, w along 0 and 1
        _box((4, 0, 0), (8, 5, 8)),
        {
            "u": _box((4, 0, 0), (8, 6, 8)),
            "v": _box((3, 0, 0), (9, 5, 8)),
            "w": _box((3, 0, 0), (9, 6, 8)),
        },
    ),
    (
        "divergence(u, v, w)",
        _box((4, 5, 2), (8, 10, 6)),
        {
            "u": _box((3, 5, 2), (9, 10, 6)),
            "v": _box((4, 4, 2), (8, 10, 6)),
            "w": _box((4, 5, 1), (8, 10, 7)),
        },
    ),
    # one cell thick at the domain boundary: the one-sided formula needs 3 cells inward
    ("gradient(u, 0)", _box((0, 2, 3), (1, 4, 5)), {"u": _box((0, 2, 3), (3, 4, 5))}),
    ("gradient(u, 0)", _box((11, 2, 3), (12, 4, 5)), {"u": _box((9, 2, 3), (12, 4, 5))}),
    # two nested derivatives along each axis: the box grown by 2, clipped
    ("laplacian(u)", _box((4, 5, 2), (8, 10, 6)), {"u": _box((2, 3, 0), (10, 10, 8))}),
]


@pytest.mark.parametrize("strategy", STRATS)
@pytest.mark.parametrize("case", range(len(HALO_CASES)))
def test_read_region_reads_region_plus_halo(open_file, new_path, strategy, case):
    expr, region, need = HALO_CASES[case]
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    f.derive("q", expr, strategy)
    comps = f.derived["q"].components
    seen = write_step(f, 0)
    f.close()
    f = open_file(p)
    e = f.engine
    assert isinstance(e, DerivedLayer)
    before = e.bytes_read
    got = f[comps[0]].read(region)
    n = e.bytes_read - before
    if strategy == "store":
        assert n == region.size * 8  # the stored values of the region, nothing else
    else:
        assert n == sum(b.size for b in need.values()) * 8
    # the other components of a vector come from the same evaluation
    for c in comps[1:]:
        before = e.bytes_read
        f[c].read(region)
        assert e.bytes_read - before == (region.size * 8 if strategy == "store" else 0)
    # and the values are those of numpy on the whole arrays
    u, v, w = seen["u"], seen["v"], seen["w"]
    full = {
        "magnitude(u, v, w)": lambda: [np.sqrt(u * u + v * v + w * w)],
        "curl(u, v, w)": lambda: curl_ref(u, v, w),
        "divergence(u, v, w)": lambda: [grad(u, 0) + grad(v, 1) + grad(w, 2)],
        "gradient(u, 0)": lambda: [grad(u, 0)],
        "laplacian(u)": lambda: [sum(grad(grad(u, a), a) for a in range(3))],
    }[expr]()
    close(got, full[0][region.slices])


def test_reading_block_by_block_costs_the_same_per_block(open_file, new_path, monkeypatch):
    """A read of one block of a quantity computed when read looks up only the blocks it meets
    (no box per block of the step, which made reading every block quadratic in their number),
    and a scalar is evaluated straight into the caller's buffer, also where the anchor leaves
    part of the read unwritten."""
    from lamina.catalog.blocks import BlockTable
    from lamina.layers.derived import layer as layer_mod

    n = 48
    shape = (n, 4, 5)
    slabs = [Box((i, 0, 0), (i + 1, 4, 5)) for i in range(n)]
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f, shape)
    f.derive("vmag", "magnitude(u, v, w)", "expression")
    f.derive("lap", "laplacian(u)", "expression")
    seen = write_step(f, 0, slabs, shape=shape, skip={("u", 7)})
    f.close()
    u, v, w = seen["u"], seen["v"], seen["w"]
    vmag = np.sqrt(u * u + v * v + w * w)
    vmag[7] = np.nan  # the anchor u was not written there
    lap = sum(grad(grad(u, a), a) for a in range(3))  # u reads as its fill (0) in slab 7
    lap[7] = np.nan

    built = []  # boxes of block rows the derived layer builds (the engine's reads build their own)
    box_of_row = BlockTable.box

    def box(t, i):
        if sys._getframe(1).f_code.co_filename == layer_mod.__file__:
            built.append(i)
        return box_of_row(t, i)

    monkeypatch.setattr(BlockTable, "box", box)
    outs = []
    evaluate = lamina.derived.evaluate

    def spy(*args, **kw):
        outs.append(kw.get("out"))
        return evaluate(*args, **kw)

    monkeypatch.setattr(lamina.derived, "evaluate", spy)
    f = open_file(p)
    e = f.engine
    for b in [*slabs, Box((5, 0, 0), (10, 4, 5))]:
        outs.clear()
        got = np.empty(b.shape)
        e.get("vmag", b, None, got)
        if b.start[0] == 7:  # nothing to compute where the anchor u was not written
            assert np.isnan(got).all() and outs == []
            continue
        close(got, vmag[b.slices])
        assert outs and all(o is not None and np.shares_memory(o[0], got) for o in outs)
        e.get("lap", b, None, got)
        close(got, lap[b.slices])
    assert built == []


def test_vector_results_are_a_group_of_x_y_z(open_file, new_path):
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    g = f.derive("vort", "curl(u, v, w)", "store")
    f.derive("grad", "gradient(u)", "stats")
    f.derive("cr", "cross(u, v, w, w, v, u)", "expression")
    assert isinstance(g, lamina.Group) and g.name == "/vort"
    seen = write_step(f, 0)
    f.close()
    f = open_file(p)
    for name in ("vort", "grad", "cr"):
        assert list(f[name].keys()) == ["x", "y", "z"]
        assert f.derived[name].components == [f"{name}/x", f"{name}/y", f"{name}/z"]
        for c in "xyz":
            assert isinstance(f[f"{name}/{c}"], lamina.Dataset)
            assert f[name][c].shape == SH
    for c, want in zip("xyz", curl_ref(seen["u"], seen["v"], seen["w"]), strict=True):
        close(f[f"vort/{c}"][...], want)
        assert f[f"vort/{c}"].blocks()[0].codec == "raw"
    for c, a in zip("xyz", range(3), strict=True):
        close(f[f"grad/{c}"][...], grad(seen["u"], a))
        assert f[f"grad/{c}"].blocks()[0].codec == "stats-only"
    u, v, w = seen["u"], seen["v"], seen["w"]
    close(f["cr/x"][...], v * u - w * v)
    close(f["cr/y"][...], w * w - u * u)
    close(f["cr/z"][...], u * v - v * w)


def test_one_and_two_dimensional_data(open_file, new_path):
    """Stencils along every axis of 1-D and 2-D data, blocks cut along different axes, empty puts."""
    p = new_path()
    rng = np.random.default_rng(7)
    A, B, X = rng.random((7, 6)), rng.random((7, 6)), rng.random(9)
    f = open_file(p, "w")
    f.create_dataset("a", (7, 6))
    f.create_dataset("b", (7, 6))
    f.create_dataset("x", (9,))
    f.derive("div", "divergence(a, b)", "store", spacing=(0.5, 3.0))
    f.derive("lap", "laplacian(a)", "stats")
    f.derive("mag", "magnitude(a, b)", "expression")
    f.derive("gx", "gradient(x, 0)", "stats", spacing=0.25)
    f.derive("lx", "laplacian(x) * 2", "expression")
    with f.step():
        f["a"][:3] = A[:3]
        f["a"][3:] = A[3:]
        f["a"].write(np.zeros((0, 6)), offset=(3, 0))  # an empty block changes nothing
        f["b"][:, :2] = B[:, :2]
        f["b"][:, 2:] = B[:, 2:]
        f["x"][:4] = X[:4]
        f["x"][4:] = X[4:]
    f.close()
    f = open_file(p)
    close(f["div"][...], grad(A, 0, 0.5) + grad(B, 1, 3.0))
    close(f["lap"][...], grad(grad(A, 0), 0) + grad(grad(A, 1), 1))
    close(f["mag"][1:5, 2:3], np.sqrt(A * A + B * B)[1:5, 2:3])
    close(f["gx"][...], grad(X, 0, 0.25))
    close(f["lx"][2:3], (grad(grad(X, 0), 0) * 2)[2:3])
    assert sorted(b.box.start for b in f["div"].blocks()) == [(0, 0), (3, 0)]


# ---------------------------------------------------------------------------
# reader-side derive, append, refresh, quantities over quantities
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", [*STRATS, "auto"])
def test_reader_side_derive_writes_nothing(open_file, new_path, engine, strategy):
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    seen = [write_step(f, k) for k in range(2)]
    f.close()
    before = snapshot(p) if engine == "native" else None
    f = open_file(p)
    ds = f.derive("vmag", "magnitude(u, v, w)", strategy)
    f.derive("vort", "curl(u, v, w)", strategy, spacing=2.0)
    d = f.derived["vmag"]
    assert d.strategy == "expression" and not d.persistent
    assert d.info.get("requested", "expression") == strategy
    assert ds.shape == SH and "vmag" in f.keys() and "vort" in f.keys()
    for k in range(2):
        u, v, w = (seen[k][n] for n in "uvw")
        close(f.at(k)["vmag"][...], np.sqrt(u * u + v * v + w * w))
        close(f["vort/z"].read(step=k), curl_ref(u, v, w, (2.0, 2.0, 2.0))[2])
        assert f["vmag"].blocks(k) == []
    with pytest.raises(ModeError):
        f["vmag"][0, 0, 0] = 1.0
    f.close()
    if engine == "native":
        assert snapshot(p) == before
    f = open_file(p)
    assert f.derived == {} and "vmag" not in f
    f.close()


def test_append_definitions_persist_and_cover_new_and_old_steps(open_file, new_path):
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    f.derive("vmag", "magnitude(u, v, w)", "stats")
    seen = [write_step(f, 0), write_step(f, 1)]
    f.close()

    f = open_file(p, "a")
    assert list(f.derived) == ["vmag"] and f.derived["vmag"].strategy == "stats"
    seen.append(write_step(f, 2))  # computed for a new step from the recorded definition
    f.derive("twice", "vmag * 2", "store")  # declared after some steps, over a derived quantity
    f.derive("lap", "laplacian(w) + 1", "store", spacing=(1.0, 0.5, 2.0))
    seen.append(write_step(f, 3))
    f.close()

    f = open_file(p)
    assert list(f.derived) == ["vmag", "twice", "lap"]
    assert f.steps == 4
    for k in range(4):
        u, v, w = (seen[k][n] for n in "uvw")
        vmag = np.sqrt(u * u + v * v + w * w)
        lap = (
            grad(grad(w, 0, 1.0), 0, 1.0)
            + grad(grad(w, 1, 0.5), 1, 0.5)
            + grad(grad(w, 2, 2.0), 2, 2.0)
            + 1
        )
        close(f.at(k)["vmag"][...], vmag)
        close(f.at(k)["twice"][...], vmag * 2)  # steps 0..2: recomputed, step 3: stored
        close(f.at(k)["lap"][...], lap)
        assert [b.codec for b in f["vmag"].blocks(k)] == ["stats-only"] * len(BLOCKS)
        want = ["raw"] * len(BLOCKS) if k == 3 else []
        assert [b.codec for b in f["twice"].blocks(k)] == want
        assert [b.codec for b in f["lap"].blocks(k)] == want


def test_derive_between_steps_of_a_reopened_store_file(open_file, new_path):
    """A 'store' quantity read at a step written before the definition existed is recomputed."""
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    s0 = write_step(f, 0, skip={("u", 2)})  # a hole in the anchor
    f.derive("s", "u - v", "store")
    s1 = write_step(f, 1)
    f.close()
    f = open_file(p)
    want0 = s0["u"] - s0["v"]
    want0[BLOCKS[2].slices] = np.nan  # where the anchor u was not written
    close(f.at(0)["s"][...], want0)
    close(f.at(1)["s"][...], s1["u"] - s1["v"])
    assert f["s"].blocks(0) == [] and len(f["s"].blocks(1)) == len(BLOCKS)


def test_refresh_picks_up_new_definitions(tmp_path):
    p = str(tmp_path / "follow.lam")
    w = lamina.open(p, "w")
    create_inputs(w)
    s0 = write_step(w, 0)
    r = lamina.open(p, "r")
    r.derive("mine", "u + 1", "stats")  # lives in the reader only
    w.derive("vmag", "magnitude(u, v, w)", "stats")
    s1 = write_step(w, 1)
    r.refresh()
    assert r.steps == 2 and sorted(r.derived) == ["mine", "vmag"]
    for k, s in enumerate((s0, s1)):
        close(r.at(k)["vmag"][...], np.sqrt(s["u"] ** 2 + s["v"] ** 2 + s["w"] ** 2))
        close(r.at(k)["mine"][...], s["u"] + 1)
    r.close()
    w.close()


@pytest.mark.parametrize("kind", ["dataset", "derived", "vector"])
def test_a_reader_s_quantity_gives_way_to_the_file_s_of_the_same_name(tmp_path, kind):
    """docs/derived.md: the writer defines a name a reader declared for itself afterwards:
    refresh goes on (the file's definition wins, the reader's is dropped with a LaminaWarning
    naming it); a reader's quantity over the dropped one is parsed again over the file's."""
    p = str(tmp_path / "clash.lam")
    w = lamina.open(p, "w")
    create_inputs(w)
    s0 = write_step(w, 0)
    r = lamina.open(p, "r")
    r.derive("mine", "u + 1")
    r.derive("twice", "mine * 2")
    r.derive("other", "v - 1")
    close(r["mine"][...], s0["u"] + 1)  # read before: nothing of it may stay below the layer
    close(r["twice"][...], 2 * (s0["u"] + 1))
    if kind == "dataset":
        w.create_dataset("mine", SH, "f4")
    elif kind == "derived":
        w.derive("mine", "u * 100", "stats")
    else:  # a group of three datasets where the reader's scalar was
        w.derive("mine", "curl(u, v, w)", "stats")
    s1 = write_step(w, 1)
    if kind == "dataset":
        with w.step():
            w["mine"][...] = np.full(SH, 7.0, "f4")
    with pytest.warns(lamina.LaminaWarning, match="'mine'") as caught:
        r.refresh()
    assert r.steps == w.steps
    said = [str(x.message) for x in caught if issubclass(x.category, lamina.LaminaWarning)]
    assert any("'mine' ('u + 1')" in m and "dropped" in m for m in said)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r.refresh()  # said once: the reader goes on
    assert r.derived["other"].text == "v - 1" and not r.derived["other"].persistent
    close(r.at(1)["other"][...], s1["v"] - 1)
    if kind == "dataset":
        assert "mine" not in r.derived
        assert r["mine"].dtype == np.float32
        np.testing.assert_array_equal(r.at(2)["mine"][...], np.full(SH, 7.0, "f4"))
        assert (r.at(1)["mine"][...] == 0).all()  # not written at that step: its fill
        assert r.derived["twice"].dtype == np.float32  # parsed again over the file's dataset
        np.testing.assert_array_equal(r.at(2)["twice"][...], np.full(SH, 14.0, "f4"))
    elif kind == "derived":
        assert r.derived["mine"].persistent and r.derived["mine"].text == "u * 100"
        close(r.at(1)["mine"][...], s1["u"] * 100)
        close(r.at(1)["twice"][...], s1["u"] * 200)
    else:
        assert sorted(r["mine"].keys()) == ["x", "y", "z"]
        close(r.at(1)["mine/z"][...], curl_ref(s1["u"], s1["v"], s1["w"])[2])
        assert "twice" not in r.derived  # reads 'mine', now a group: dropped too, said
        assert any("'twice'" in m and "dropped" in m for m in said)
    r.close()
    w.close()


def test_put_stats_of_a_derived_dataset_is_refused_as_put_is(open_file, new_path):
    """The engine API's statistics-only blocks of a derived dataset are refused with put's
    ModeError; the quantity's own blocks (computed at the end of the step) are kept."""
    p = new_path()
    f = open_file(p, "w")
    f.create_dataset("u", (8,), "f8")
    f.derive("s", "u * 2", "stats")
    f.derive("t", "u * 3", "store")
    with f.step():
        f["u"][0:4] = np.arange(4.0)
        for name in ("s", "t"):
            with pytest.raises(ModeError) as by_put:
                f.engine.put(name, Box((4,), (8,)), np.full(4, 100.0))
            with pytest.raises(ModeError) as by_stats:
                f.engine.put_stats(name, Box((4,), (8,)), np.full(4, 100.0))
            assert str(by_stats.value) == str(by_put.value)
            assert f"{name!r} is derived" in str(by_put.value)
            with pytest.raises(ModeError, match=f"{name!r} is derived"):
                f.engine.put_stats_many(name, np.array([[4]]), [np.full(4, 100.0)])
    f.close()
    g = open_file(p)
    want = np.array([0.0, 2, 4, 6, np.nan, np.nan, np.nan, np.nan])
    close(g["s"][...], want)
    assert [(b.box, b.codec, b.stats.max) for b in g["s"].blocks()] == [
        (Box((0,), (4,)), "stats-only", 6.0)
    ]
    assert g.query("s > 50").count == 0 and g.query("s < 50").count == 4
    close(g["t"][...], want * 1.5)


def test_put_stats_of_a_plain_dataset_is_refused(open_file, new_path):
    """Statistics-only blocks are for derived quantities kept with strategy='stats': of a
    plain dataset they are refused (its values could never be read), and the step goes on.
    An engine without the derived layer keeps them; reading their values then says why not."""
    p = new_path()
    f = open_file(p, "w")
    f.create_dataset("plain", (8,), "f8")
    with f.step():
        f["plain"][4:8] = 1.0
        with pytest.raises(ModeError, match=r"'plain' is not a derived.*strategy='stats'"):
            f.engine.put_stats("plain", Box((0,), (4,)), np.arange(4.0))
        with pytest.raises(ModeError, match=r"'plain' is not a derived.*strategy='stats'"):
            f.engine.put_stats_many("plain", np.array([[0]]), [np.arange(4.0)])
        with pytest.raises(lamina.NotFoundError, match="nope"):
            f.engine.put_stats("nope", Box((0,), (4,)), np.arange(4.0))
        f["plain"][0:4] = 2.0
    f.close()
    g = open_file(p)
    assert g["plain"][...].tolist() == [2.0] * 4 + [1.0] * 4
    assert g.query("plain > 1.5").count == 4
    g.close()
    q = new_path()
    f = open_file(q, "w", layers=[])
    f.create_dataset("plain", (8,), "f8")
    with f.step():
        f.engine.put_stats("plain", Box((0,), (4,)), np.arange(4.0))
    f.close()
    g = open_file(q, layers=[])
    with pytest.raises(FormatError, match=r"'plain'.*step 0.*\[0:4\] holds statistics only"):
        g["plain"][...]


@pytest.mark.parametrize("strategy", STRATS)
def test_quantity_over_quantity_computed_at_end_of_step(open_file, new_path, strategy):
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    f.derive("vmag", "magnitude(u, v, w)", strategy)
    f.derive("v2", "vmag * 2", "stats")
    f.derive("gv", "gradient(vmag, 2)", strategy)
    seen = write_step(f, 0, skip={("u", 4), ("w", 1)})
    f.close()
    f = open_file(p)
    u, v, w = seen["u"], seen["v"], seen["w"]
    vmag = np.sqrt(u * u + v * v + w * w)
    vmag[BLOCKS[4].slices] = np.nan  # the anchor u was not written there; w reads as its fill (0)
    close(f["vmag"][...], vmag)
    close(f["v2"][...], vmag * 2)
    close(f["gv"][...], grad(vmag, 2))
    blocks = f["v2"].blocks()
    assert sorted(b.box.start for b in blocks) == sorted(
        b.start for i, b in enumerate(BLOCKS) if i != 4
    )
    for b in blocks:
        assert b.codec == "stats-only"
        assert b.stats.min == pytest.approx(np.min(vmag[b.box.slices] * 2), rel=1e-12)
        assert b.stats.max == pytest.approx(np.max(vmag[b.box.slices] * 2), rel=1e-12)
        assert b.stats.count == b.box.size


def test_implicit_step_committed_by_close(open_file, new_path):
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    f.derive("s", "u + v", "stats")
    F = fields(0)
    f["u"][...] = F["u"]  # no begin_step: the write opens the step, close commits it
    f["v"][...] = F["v"]
    f.close()
    f = open_file(p)
    assert f.steps == 1
    close(f["s"][...], F["u"] + F["v"])
    assert [b.codec for b in f["s"].blocks()] == ["stats-only"]


# ---------------------------------------------------------------------------
# numbers: dtypes, fills, division by zero
# ---------------------------------------------------------------------------


def test_dtypes_and_fill_values(open_file, new_path):
    p = new_path()
    f = open_file(p, "w")
    f.create_dataset("a32", (6, 5, 4), "f4")
    f.create_dataset("k", (6, 5, 4), "i4", fill=-1)
    f.create_dataset("b", (6, 5, 4), "i8")
    specs = {
        "f32": ("a32 * 1.5 + 1", np.float32),
        "f32sqrt": ("sqrt(a32)", np.float32),
        "ksqrt": ("sqrt(k)", np.float64),
        "ksin": ("sin(k)", np.float64),
        "klin": ("k * 3 - 1", np.int32),
        "kabs": ("abs(k - 3)", np.int32),
        "kdiv": ("k / 2", np.float64),
        "kb": ("k + b", np.int64),
        "kgrad": ("gradient(k, 0)", np.float64),
        "kmag": ("magnitude(k, k)", np.float64),
    }
    for name, (expr, _) in specs.items():
        f.derive(name, expr, "stats")
    a = np.linspace(0.5, 3.0, 60, dtype=np.float32).reshape(3, 5, 4)
    kk = np.arange(60, dtype=np.int32).reshape(3, 5, 4) % 7
    with f.step():
        f["a32"][:3] = a  # rows 3.. not written: float results read NaN there, int results 0
        f["k"][:3] = kk
        f["b"][...] = 2
    f.close()
    f = open_file(p)
    A = np.full((6, 5, 4), 0, np.float32)
    A[:3] = a
    K = np.full((6, 5, 4), -1, np.int32)
    K[:3] = kk
    with np.errstate(invalid="ignore"):
        ref = {
            "f32": A * np.float32(1.5) + np.float32(1),
            "f32sqrt": np.sqrt(A),
            "ksqrt": np.sqrt(K.astype(np.float64)),
            "ksin": np.sin(K.astype(np.float64)),
            "klin": K * 3 - 1,
            "kabs": np.abs(K - 3),
            "kdiv": K / 2,
            "kb": K.astype(np.int64) + 2,
            "kgrad": grad(K.astype(np.float64), 0),
            "kmag": np.sqrt(2.0 * K.astype(np.float64) ** 2),
        }
    for name, (_, dt) in specs.items():
        ds = f[name]
        assert ds.dtype == np.dtype(dt), name
        got = ds[...]
        assert got.dtype == np.dtype(dt)
        want = ref[name].astype(dt)
        if np.dtype(dt).kind == "f":
            want[3:] = np.nan
            close(got[:3], want[:3], name)
            assert np.isnan(got[3:]).all(), name
            assert np.isnan(ds.fill)
        else:
            want[3:] = 0
            assert np.array_equal(got, want), name
            assert ds.fill == 0


@pytest.mark.parametrize("strategy", STRATS)
def test_division_by_zero_follows_numpy(open_file, new_path, strategy):
    """inf and nan as numpy gives them, no exception, no warning; statistics skip NaN."""
    p = new_path()
    f = open_file(p, "w")
    f.create_dataset("a", (2, 3, 4), "f8")
    f.create_dataset("b", (2, 3, 4), "f8")
    f.create_dataset("k", (2, 3, 4), "i8")
    for name, expr in {
        "q": "a / b",
        "lg": "log(b)",
        "ln": "log(a)",
        "sq": "sqrt(a)",
        "kq": "k / (k - k)",
        "mn": "min(a / b, 1)",
    }.items():
        f.derive(name, expr, strategy)
    a = np.array([-2.0, -1.0, 0.0, 0.0, 1.0, 3.0] * 4).reshape(2, 3, 4)
    b = np.array([0.0, 2.0, 0.0, 1.0, 0.0, -1.0] * 4).reshape(2, 3, 4)
    k = np.arange(24).reshape(2, 3, 4) - 5
    with warnings.catch_warnings():
        # the block statistics of a block holding both inf and -inf (sum nan) may warn: not checked here
        warnings.simplefilter("ignore", RuntimeWarning)
        with f.step():
            f["a"][...] = a
            f["b"][...] = b
            f["k"][...] = k
        f.close()
    f = open_file(p)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # evaluating: not even a RuntimeWarning
        got = {n: f[n][...] for n in ("q", "lg", "ln", "sq", "kq", "mn")}
    with np.errstate(all="ignore"):
        ref = {
            "q": a / b,
            "lg": np.log(b),
            "ln": np.log(a),
            "sq": np.sqrt(a),
            "kq": k / (k - k),
            "mn": np.minimum(a / b, 1),
        }
    for n, want in ref.items():
        assert np.array_equal(got[n], want, equal_nan=True), (n, got[n], want)
    assert np.isposinf(got["q"]).any() and np.isneginf(got["q"]).any() and np.isnan(got["q"]).any()
    if strategy != "expression":
        (blk,) = f["q"].blocks()
        fin = ref["q"][~np.isnan(ref["q"])]
        assert blk.stats.count == fin.size
        assert blk.stats.min == -np.inf and blk.stats.max == np.inf


# ---------------------------------------------------------------------------
# errors: clear, and nothing committed is lost
# ---------------------------------------------------------------------------


def _bad_derive(*args, **kw):
    return lambda f: f.derive(*args, **kw)


def _write_to(name):
    def act(f):
        with f.step():
            f[name][...] = 1.0

    return act


def _declare_in_step(implicit: bool):
    def act(f):
        if implicit:
            f["u"][0:1] = 1.0  # a write opens the step
        else:
            f.begin_step()
        try:
            f.derive("x", "u * 2")
        finally:
            f.engine.discard_step()

    return act


ERRORS = {
    "unknown function": (
        _bad_derive("x", "magnitude(u, v, sqr(w))"),
        ExpressionError,
        ["unknown function 'sqr'", "Did you mean 'sqrt'", "position 16"],
    ),
    "unknown dataset": (
        _bad_derive("x", "magnitude(u, v, ww)"),
        ExpressionError,
        ["unknown dataset 'ww'", "Did you mean 'w'", "position 16"],
    ),
    "path without backticks": (
        _bad_derive("x", "T + 1"),
        ExpressionError,
        ["unknown dataset 'T'", "'grp/T'"],
    ),
    "parse error": (_bad_derive("x", "u + * v"), ExpressionError, ["position 4"]),
    "no dataset": (_bad_derive("x", "2 * 3"), ExpressionError, ["reads no dataset"]),
    "too few arguments": (
        _bad_derive("x", "curl(u, v)"),
        ExpressionError,
        ["curl() takes 3 arguments, got 2"],
    ),
    "too many arguments": (
        _bad_derive("x", "atan(u, v)"),
        ExpressionError,
        ["atan() takes 1 argument, got 2"],
    ),
    "gradient axis": (
        _bad_derive("x", "gradient(u, 3)"),
        ExpressionError,
        ["axis 3 is out of range"],
    ),
    "divergence arity": (
        _bad_derive("x", "divergence(u, v)"),
        ExpressionError,
        ["one argument per axis"],
    ),
    "different shapes": (
        _bad_derive("x", "u + small"),
        ShapeError,
        ["inputs have different shapes", "small (5, 5, 5)", "u (12, 10, 8)"],
    ),
    "clash with dataset": (
        _bad_derive("u", "v * 2"),
        ExistsError,
        ["a dataset 'u' already exists"],
    ),
    "clash with group": (
        _bad_derive("grp", "v * 2"),
        ExistsError,
        ["a group 'grp' already exists"],
    ),
    # (said "a dataset 'm' already exists": its components are datasets of the catalog)
    "clash with derived": (
        _bad_derive("m", "v * 2"),
        ExistsError,
        ["derived quantity 'm' is defined already as", "declare this one under another name"],
    ),
    "inside a derived vector": (
        _bad_derive("c/x/y", "v * 2"),
        ExistsError,
        ["clashes with derived quantity 'c'"],
    ),
    "create_dataset clash": (lambda f: f.create_dataset("m", SH), ExistsError, ["'m'"]),
    "create_dataset in vector": (
        lambda f: f.create_dataset("c/extra", SH),
        ExistsError,
        ["clashes with derived quantity 'c'"],
    ),
    "stencil on short axis": (
        _bad_derive("x", "gradient(thin, 1)"),
        ExpressionError,
        ["at least 3 points along axis 1", "(12, 2, 8)"],
    ),
    "laplacian on short axis": (
        _bad_derive("x", "laplacian(thin) + 1"),
        ExpressionError,
        ["at least 3 points along axis 1"],
    ),
    "write to derived": (_write_to("m"), ModeError, ["'m' is derived", "write its inputs"]),
    "write to derived component": (_write_to("c/y"), ModeError, ["'c/y' is derived"]),
    "unknown strategy": (
        _bad_derive("x", "u * 2", "sotre"),
        ValueError,
        ["unknown strategy 'sotre'", "Did you mean 'store'"],
    ),
    "spacing length": (
        _bad_derive("x", "gradient(u, 0)", spacing=(1.0, 2.0)),
        ValueError,
        ["spacing has 2 entries", "3 dimensions"],
    ),
    "spacing zero": (
        _bad_derive("x", "gradient(u, 0)", spacing=(1.0, 0.0, 1.0)),
        ValueError,
        ["must be finite and > 0"],
    ),
    "spacing negative": (
        _bad_derive("x", "u * 2", spacing=-1.0),
        ValueError,
        ["must be finite and > 0"],
    ),
    "spacing nan": (
        _bad_derive("x", "u * 2", spacing=(1.0, float("nan"), 1.0)),
        ValueError,
        ["must be finite and > 0"],
    ),
    "spacing string": (
        _bad_derive("x", "u * 2", spacing="12"),
        TypeError,
        ["spacing '12' holds '12', not a real number"],
    ),
    "spacing bool": (
        _bad_derive("x", "u * 2", spacing=(1.0, True, 1.0)),
        TypeError,
        ["holds True, not a real number"],
    ),
    "in an open step": (
        _declare_in_step(False),
        ModeError,
        ["declare it between steps", "step 1 is open"],
    ),
    "in an implicit step": (_declare_in_step(True), ModeError, ["declare it between steps"]),
    "unknown hint": (
        _bad_derive("x", "u * 2", "auto", bogus=1),
        ValueError,
        ["unknown hints ['bogus']"],
    ),
    "unknown hint, any strategy": (
        _bad_derive("x", "u * 2", "store", bogus=1),
        ValueError,
        ["unknown hints ['bogus']"],
    ),
    "not a string": (_bad_derive("x", 42), TypeError, ["must be a string"]),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_errors_are_clear_and_lose_nothing(open_file, new_path, case):
    act, exc, texts = ERRORS[case]
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    f.create_dataset("small", (5, 5, 5))
    f.create_dataset("thin", (12, 2, 8))
    f.create_dataset("grp/T", SH)
    f.derive("m", "magnitude(u, v, w)", "stats")
    f.derive("c", "curl(u, v, w)", "store")
    s0 = write_step(f, 0)
    with pytest.raises(exc) as ei:
        act(f)
    msg = str(ei.value)
    for t in texts:
        assert t in msg, (t, msg)
    if exc is ExpressionError and "position" in texts[-1]:
        assert ei.value.position == int(texts[-1].split()[-1])
    # the file goes on, with what it had
    assert sorted(f.derived) == ["c", "m"] and "x" not in f
    s1 = write_step(f, 1)
    f.close()
    f = open_file(p)
    assert f.steps == 2 and sorted(f.derived) == ["c", "m"]
    for k, s in enumerate((s0, s1)):
        close(f.at(k)["u"][...], s["u"])
        close(f.at(k)["m"][...], np.sqrt(s["u"] ** 2 + s["v"] ** 2 + s["w"] ** 2))
        close(f.at(k)["c/z"][...], curl_ref(s["u"], s["v"], s["w"])[2])


def test_error_while_computing_discards_only_that_step(open_file, new_path):
    """numpy refusing a value at the end of a step: ExpressionError, the step is dropped, the file goes on."""
    p = new_path()
    f = open_file(p, "w")
    f.create_dataset("k", (4, 4, 4), "i8")
    f.derive("bad", "k ^ (k - 1)", "stats")  # fine for k >= 1, refused by numpy for k = 0
    with f.step():
        f["k"][...] = 3
    with pytest.raises(ExpressionError, match="negative integer powers"):
        with f.step():
            f["k"][...] = 0
    assert f.steps == 1 and not f.engine.in_step
    with f.step():
        f["k"][...] = 2
    f.close()
    f = open_file(p)
    assert f.steps == 2
    assert (f.at(0)["bad"][...] == 9).all() and (f.at(1)["bad"][...] == 2).all()
    assert (f.at(1)["k"][...] == 2).all()


def test_derive_on_a_closed_file_fails(open_file, new_path):
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.derive("m", "u * 2")


def test_auto_strategy_is_recorded(tmp_path, monkeypatch):
    # the cost model measures this machine once: keep that out of the user's cache
    monkeypatch.setenv("LAMINA_CALIBRATION", str(tmp_path / "calibration.json"))
    p = str(tmp_path / "auto.lam")
    f = lamina.open(p, "w")
    create_inputs(f)
    f.derive("m", "magnitude(u, v, w)", "auto", query_fraction=0.1, readers=2)
    d = f.derived["m"]
    assert d.strategy in STRATS
    assert d.info["requested"] == "auto" and d.info["chosen"] == d.strategy
    assert d.info["hints"] == {"query_fraction": 0.1, "readers": 2}
    seen = write_step(f, 0)
    f.close()
    with lamina.open(p) as f:
        assert f.derived["m"].strategy == d.strategy and f.derived["m"].info["chosen"] == d.strategy
        close(f["m"][...], np.sqrt(seen["u"] ** 2 + seen["v"] ** 2 + seen["w"] ** 2))


# ---------------------------------------------------------------------------
# damaged definition records
# ---------------------------------------------------------------------------


def record(
    version=1, text="u * 3", strategy="stats", spacing=(1.0, 1.0, 1.0), info="{}", extra=b""
) -> bytes:
    e = Encoder()
    e.u8(version)
    e.str(text)
    e.str(strategy)
    e.u8(len(spacing))
    for s in spacing:
        e.f64(s)
    e.str(info)
    return e.getvalue() + extra


BAD_RECORDS = {
    "garbage": (b"\x01garbage", "exceeds the limit"),
    "empty": (b"", "definition of derived quantity 'm'"),
    "truncated": (record()[:-3], "definition of derived quantity 'm'"),
    "trailing bytes": (record(extra=b"xx"), "definition of derived quantity 'm'"),
    "version": (record(version=2), "version 2 is not supported"),
    "strategy": (record(strategy="bogus"), "unknown strategy 'bogus'"),
    "spacing zero": (record(spacing=(1.0, 0.0, 1.0)), "bad grid spacing"),
    "spacing nan": (record(spacing=(float("nan"), 1.0, 1.0)), "bad grid spacing"),
    "spacing length": (record(spacing=(1.0, 1.0)), "spacing has 2 entries"),
    "info not json": (record(info="{nope"), "bad info record"),
    "info not object": (record(info=json.dumps([1, 2])), "not an object"),
    # valid JSON, but deeper than Python's parser can recurse: refused before parsing
    "info nested deeply": (record(info='{"a":' * 5000 + "1" + "}" * 5000), "nested 5000 levels"),
    "parse error": (record(text="u * * 3"), "at position"),
    "unknown dataset": (record(text="nothere * 3"), "unknown dataset 'nothere'"),
    "wrong arity": (record(text="curl(u, v)"), "curl() takes 3 arguments"),
    "other shape": (record(text="small * 3"), "no dataset 'm' of shape (5, 5, 5)"),
    "vector over scalar": (record(text="curl(u, v, w)"), "no dataset 'm/x'"),
    # forged: derive() never records one (reading it looped forever, or opening recursed)
    "depends on itself": (record(text="m * 3"), "depends on itself (through its input 'm')"),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_damaged_record_warns_and_the_rest_stays_readable(open_file, new_path, case):
    raw, why = BAD_RECORDS[case]
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    f.create_dataset("small", (5, 5, 5))
    f.derive("m", "u * 3", "store")
    f.derive("ok", "u + v", "stats")
    s0 = write_step(f, 0)
    f.engine.set_ext("derived:m", raw)  # as if the file's record of 'm' were damaged
    f.close()

    def check(g, steps):
        assert list(g.derived) == ["ok"]
        assert g.steps == len(steps)
        for k, s in enumerate(steps):
            close(g.at(k)["u"][...], s["u"])
            close(g.at(k)["ok"][...], s["u"] + s["v"])
        close(g.at(0)["m"][...], s0["u"] * 3)  # stored data of 'm' is plain data now

    with pytest.warns(UserWarning, match="derived quantity 'm' cannot be used") as rec:
        g = open_file(p)
    assert any(why in str(w.message) for w in rec), [str(w.message) for w in rec]
    check(g, [s0])
    g.close()
    # the file can be appended to: 'ok' is computed, 'm' is left alone
    with pytest.warns(UserWarning, match="derived quantity 'm'"):
        g = open_file(p, "a")
    s1 = write_step(g, 1)
    g.close()
    with pytest.warns(UserWarning, match="derived quantity 'm'"):
        g = open_file(p)
    check(g, [s0, s1])
    assert g["m"].blocks(1) == []


def test_an_unusable_record_warns_with_lamina_warning_at_the_open(tmp_path):
    """The warning is a LaminaWarning shown at the program's ``lamina.open`` (it was a plain
    UserWarning shown at a line of lamina's own layers)."""
    p = str(tmp_path / "w.lam")
    with lamina.open(p, "w") as f:
        create_inputs(f)
        f.derive("m", "u * 3", "expression")
        write_step(f, 0)
        f.engine.set_ext("derived:m", record(version=2))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        g = lamina.open(p)
    g.close()
    said = [w for w in rec if "derived quantity 'm' cannot be used" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in rec]
    assert said[0].category is lamina.errors.LaminaWarning
    assert said[0].filename == __file__, said[0].filename


def test_two_records_that_lead_to_each_other_are_refused(tmp_path):
    """Records of a, computed from b, and b from a (forged: derive() cannot make them): the
    second taken up is refused with a warning, reads end (a read looped forever)."""
    p = str(tmp_path / "c.lam")
    with lamina.open(p, "w") as f:
        create_inputs(f)
        f.derive("a", "u * 2", "expression")
        f.derive("b", "a + 1", "expression")
        write_step(f, 0)
        d = f.engine.definition("a")
        forged = type(d)(
            "a",
            "b * 2",
            d.expr,
            d.strategy,
            d.spacing,
            d.shape,
            d.dtypes,
            d.components,
            d.anchor,
            {},
        )
        f.engine.set_ext("derived:a", forged.encode())
    with pytest.warns(UserWarning, match="depends on itself"):
        g = lamina.open(p)
    with g:
        assert len(g.derived) == 1
        for name in ("a", "b"):  # ends with a clear error (a reads b), never a loop
            with pytest.raises(FormatError, match="'b' depends on itself"):
                g[name][...]


@pytest.mark.skipif(not _have_mpiexec(), reason="no mpiexec")
def test_auto_hints_that_differ_between_ranks_are_refused(tmp_path):
    """strategy='auto' chooses on rank 0's hints for every rank: other hints on rank 1 were
    taken silently; now every rank raises CollectiveMismatchError."""
    res = mu.run_mpi(2, "open_args", "auto-hints", tmp_path / "h.lam", timeout=60)
    assert res.stdout.count("OK auto-hints") == 2, res.stdout


@pytest.mark.skipif(not _have_mpiexec(), reason="no mpiexec")
def test_a_gpu_on_some_ranks_only_fails_the_open_everywhere(tmp_path):
    """device='gpu' where rank 1 has no GPU and rank 0 has one: both raise
    DeviceUnavailableError at the open (rank 0 is not left to open the file alone)."""
    res = mu.run_mpi(2, "open_args", "gpu", tmp_path / "g.lam", timeout=60)
    # (counted, not split in lines: mpiexec may forward one rank's line cut by another's)
    assert res.stdout.count("OK gpu") == 2, res.stdout
    assert res.stdout.count(": DeviceUnavailableError: ") == 2, res.stdout
    assert res.stdout.count("(simulated)") == 2, res.stdout


def test_a_group_inside_a_vector_quantity_is_refused(open_file, new_path):
    f = open_file(new_path(), "w")
    create_inputs(f)
    f.derive("vort", "curl(u, v, w)", "stats")
    with pytest.raises(
        ExistsError, match="group 'vort/extra' clashes with derived quantity 'vort'"
    ):
        f.create_group("vort/extra")
    with pytest.raises(ExistsError, match="clashes with derived quantity 'vort'"):
        f.create_dataset("vort/y", SH)


def test_record_without_its_datasets_is_ignored(open_file, new_path):
    """A definition whose datasets do not exist must not break opening or appending."""
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    s0 = write_step(f, 0)
    f.engine.set_ext("derived:ghost", record(text="magnitude(u, v)"))
    f.close()
    with pytest.warns(UserWarning, match="'ghost' cannot be used"):
        g = open_file(p, "a")
    assert g.derived == {}
    s1 = write_step(g, 1)
    g.close()
    with pytest.warns(UserWarning, match="'ghost'"):
        g = open_file(p)
    close(g.at(1)["u"][...], s1["u"])
    close(g.at(0)["v"][...], s0["v"])


def test_stats_only_block_without_definition_is_a_clear_error(open_file, new_path):
    p = new_path()
    f = open_file(p, "w")
    create_inputs(f)
    f.derive("m", "u * 3", "stats")
    write_step(f, 0)
    f.engine.set_ext("derived:m", b"\x07")
    f.close()
    with pytest.warns(UserWarning):
        g = open_file(p)
    with pytest.raises(FormatError, match="'m'.* cannot evaluate .*stores only statistics"):
        g["m"][...]
    assert sum(b.stats.count for b in g["m"].blocks()) == SH[0] * SH[1] * SH[2]


@pytest.mark.parametrize("strategy", ["stats", "store", "expression"])
def test_a_quantity_over_a_patch_written_in_part_reads_as_its_query_judges(tmp_path, strategy):
    """A multiresolution anchor stores whole patches: a step that writes one cell of a patch
    stores the patch.  A quantity kept as statistics read its values over the anchor's patch
    while its statistics (and the query) covered the cell written: the query left out
    matches a read returns.  Now store and stats read over the boxes they kept, expression
    over the anchor's patches, and each query answers what its reads return."""
    path = tmp_path / "p.lam"
    with lamina.open(path, "w") as f:
        f.create_dataset("c", (8,), "f8", fill=1.0, layout=lamina.Multires(patch=4, tolerance=0))
        f.derive("d", "`c`", strategy)
        with f.step():
            f["c"][3:4] = 5.0
    with lamina.open(path) as f:
        got = f["d"][...]
        want = [1.0, 1.0, 1.0, 5.0] if strategy == "expression" else [np.nan] * 3 + [5.0]
        np.testing.assert_array_equal(got, np.array(want + [np.nan] * 4))
        for text in ("`d` > 0", "`d` != 1"):
            r = f.query(text)
            with np.errstate(invalid="ignore"):
                match = np.flatnonzero(got > 0 if ">" in text else got != 1)
            assert sorted(r.coords.ravel().tolist()) == match.tolist(), (text, r.coords)


@pytest.mark.parametrize("strategy", ["store", "stats"])
def test_overlapping_lent_inputs_are_named_as_the_input(tmp_path, strategy):
    """Blocks of an input written with copy=False that overlap are found when the step is
    committed, as without derived quantities: the error names the input and the rank (the
    quantity computed from them first made its own blocks overlap, and the error named the
    quantity), and the file goes on."""
    path = tmp_path / "lent.lam"
    with lamina.open(path, "w") as f:
        u = f.create_dataset("u", (8, 8), "i4")
        f.derive("d", "u * 2", strategy=strategy)
        with pytest.raises(
            lamina.OverlapError, match=r"dataset 'u', step 0: .*both written by rank 0"
        ):
            with f.step():
                u.write(np.ones((2, 2), "i4"), (0, 0))
                u.write(np.ones((2, 2), "i4"), (0, 1), copy=False)
        with f.step():
            u[...] = 3
    with lamina.open(path) as f:
        assert f.steps == 1 and int(f["d"][0, 0]) == 6
