"""Derived quantities on a CUDA device (CuPy) against the numpy path, on real hardware.

Skipped where CuPy or a CUDA device is missing (as on CI, whose machines have
no GPU); ``test_derived_kernels.py`` runs the device code path there with a
numpy stand-in.  Here the kernels run on the device and are compared with
``device="cpu"`` on the same inputs:

- arithmetic, comparisons, ``sqrt``, ``abs``, ``min``/``max`` and every
  stencil: the same bits (each operation is one elementwise kernel, rounded
  as numpy rounds it, with no fused multiply-add);
- ``exp``, ``log``, ``sin``, ``cos``, ``tan``, ``asin``, ``acos``, ``atan``
  and powers other than squares (``b ^ 3``, ``pow(a, 0.5)``) come from
  CUDA's math library,
  not the host's: within :data:`ULPS` units in the last place.

Then whole files: quantities written with ``device="gpu"`` under every
strategy read back the same as those written on the host, by readers on
either device, and queries over them select the same points.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import lamina
from lamina.derived import evaluate, gpu_available, input_box, parse
from lamina.geometry import Box, decompose

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from test_derived_kernels import (  # noqa: E402
    POINTWISE,
    STENCIL_EXPRS,
    _arrays,
    pointwise_inputs,
)
from test_derived_layer import fields  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device"),
    pytest.mark.usefixtures("fast_native"),
]

#: largest distance in units in the last place allowed between CUDA's and the host's libm
ULPS = 4
LIBM = ("exp(", "log(", "sin(", "cos(", "tan(", "asin(", "acos(", "atan(", "pow(", "^ 3")


def _ulps(x: np.ndarray, y: np.ndarray) -> float:
    """Largest |x - y| in units in the last place of y (NaNs and infinities must agree)."""
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind not in "fc":
        return 0.0 if np.array_equal(x, y) else np.inf
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    if same.all():
        return 0.0
    if not np.isfinite(y[~same]).all() or not np.isfinite(x[~same]).all():
        return np.inf
    return float(np.max(np.abs(x[~same] - y[~same]) / np.spacing(np.abs(y[~same]))))


def _agree(got: list, want: list, text: str) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, np.ndarray), type(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (text, g.dtype, w.dtype)
        if any(f in text for f in LIBM):
            assert _ulps(g, w) <= ULPS, f"{text}: {_ulps(g, w)} ulps from the host's result"
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{text}: not the host's bits")


@pytest.mark.parametrize("dtype", ["f8", "f4", "i4", "i8", "u1"])
def test_pointwise_on_the_device_equals_the_host(dtype):
    A = pointwise_inputs((37, 41), dtype)
    for text in POINTWISE:
        try:
            want = evaluate(text, A)
        except lamina.LaminaError:  # numpy refuses (a constant out of the dtype's range)
            with pytest.raises(lamina.LaminaError):
                evaluate(text, A, device="gpu")
            continue
        _agree(evaluate(text, A, device="gpu"), want, text)


@pytest.mark.parametrize("dtype", ["f8", "f4", "i4"])
@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_stencils_on_the_device_equal_the_host_for_any_region(ndim, dtype):
    shape = (23, 19, 17)[:ndim]
    A = _arrays(shape, dtype, 7 + ndim)
    rng = np.random.default_rng(ndim)
    regions = [Box((0,) * ndim, shape)]
    for _ in range(4):  # interior, boundary and one-cell-thin regions
        lo = [int(rng.integers(0, n)) for n in shape]
        regions.append(
            Box(
                tuple(lo),
                tuple(int(rng.integers(x + 1, n + 1)) for x, n in zip(lo, shape, strict=True)),
            )
        )
    for text in STENCIL_EXPRS[ndim]:
        for region in regions:
            want = evaluate(text, A, region, shape, spacing=0.5)
            _agree(evaluate(text, A, region, shape, spacing=0.5, device="gpu"), want, text)


def test_predicates_and_results_left_on_the_device():
    import cupy

    shape = (16, 16, 16)
    A = _arrays(shape, "f8", 3)
    for text in ["magnitude(a, b, c) > 3", "(a < 0) & (b >= 0)", "~((a > 1) | (laplacian(c) < 0))"]:
        expr = parse(text, "predicate")
        on_dev = evaluate(expr, A, device="gpu", to_host=False)
        assert all(isinstance(x, cupy.ndarray) for x in on_dev)
        np.testing.assert_array_equal(cupy.asnumpy(on_dev[0]), evaluate(expr, A)[0])
    # "auto" takes the device when there is one
    _agree(evaluate("curl(a, b, c)", A, device="auto"), evaluate("curl(a, b, c)", A), "curl")


def test_inputs_on_the_device_and_results_into_host_arrays():
    import cupy

    shape = (20, 18, 16)
    A = _arrays(shape, "f8", 4)
    on_dev = {k: cupy.asarray(v) for k, v in A.items()}
    region = Box((2, 0, 5), (19, 9, 16))
    for text in ["curl(a, b, c)", "laplacian(a) * b", "magnitude(a, b, c)"]:
        want = evaluate(text, A, region, shape)
        _agree(evaluate(text, on_dev, region, shape, device="gpu"), want, text)
        # a device array covering only the box the region needs
        box = input_box(parse(text), region, shape)
        need = {k: v[box.slices] for k, v in on_dev.items()}
        got = evaluate(text, need, region, shape, device="gpu", origin=box.start)
        _agree(got, want, text)
        out = [np.empty(w.shape, w.dtype) for w in want]
        got = evaluate(text, on_dev, region, shape, device="gpu", out=out)
        assert all(g is o for g, o in zip(got, out, strict=True))
        _agree(got, want, text)


@pytest.mark.parametrize("strategy", ["store", "stats", "expression"])
def test_files_written_on_the_device_read_back_as_on_the_host(tmp_path, strategy):
    shape = (24, 20, 16)
    blocks = decompose(shape, 6)
    paths = {}
    for dev in ("cpu", "gpu"):
        paths[dev] = str(tmp_path / f"{dev}.lam")
        with lamina.open(paths[dev], "w", device=dev) as f:
            for n in "uvw":
                f.create_dataset(n, shape, "f8")
            f.derive("m", "magnitude(u, v, w)", strategy)
            f.derive("c", "curl(u, v, w)", strategy, spacing=(0.5, 2.0, 1.0))
            for s in range(2):
                F = fields(s, shape)
                with f.step():
                    for n in "uvw":
                        for b in blocks:
                            f[n][b.slices] = F[n][b.slices]
    names = ["m", "c/x", "c/y", "c/z"]
    with lamina.open(paths["cpu"], device="cpu") as ref:
        want = {(s, n): ref.at(s)[n][...] for s in range(2) for n in names}
        want_q = ref.query("(m > 2) & (`c/x` < 0)", step=1, select=["u"])
    for dev in ("cpu", "gpu"):
        with lamina.open(paths["gpu"], device=dev) as f:
            for (s, n), w in want.items():
                np.testing.assert_array_equal(f.at(s)[n][...], w, err_msg=f"{n} step {s}")
                np.testing.assert_array_equal(
                    f.at(s)[n][3:11, 2:7, 5:6], w[3:11, 2:7, 5:6], err_msg=f"{n} region"
                )
            got_q = f.query("(m > 2) & (`c/x` < 0)", step=1, select=["u"])
            assert got_q.count == want_q.count > 0
            if strategy != "expression":
                for n in names:
                    got_b = sorted((b.box.start, b.stats.min, b.stats.max) for b in f[n].blocks(1))
                    with lamina.open(paths["cpu"]) as ref:
                        want_b = sorted(
                            (b.box.start, b.stats.min, b.stats.max) for b in ref[n].blocks(1)
                        )
                    assert got_b == want_b
