"""An analytic 3-D premixed flame: the built-in simulation of ``lamina demo``.

Pure numpy, no I/O.  :func:`fields` evaluates the flow at any time for the
cells of any box of the global grid, so a writer computes only its own
blocks and a reader with another decomposition can recompute exactly what
it should read back.

The flow, on a grid of spacing :data:`H` with axes (x, y, z), z the longest:

* a wrinkled flame surface ``z_f(x, y, t)`` that moves in +z at speed
  :data:`S_T` (burnt gas behind it, fresh gas ahead), with a thin
  ``tanh`` profile of width :data:`DELTA` (1.5 cells): temperature jumps
  from :data:`T_U` = 300 K to :data:`T_B` = 1800 K across a few cells and
  is *exactly* 300 or 1800 K far from it, as in real combustion data where
  most blocks are uniform and a few hold all the structure;
* velocity: Taylor-Green vortices (swirl in x-y, advected in z with the
  mean flow) plus the mean flow :data:`U0` in z, accelerated through the
  flame by thermal expansion;
* pressure: the vortices' pressure field plus the small drop across the flame;
* fuel mass fraction: :data:`Y_U` ahead of the flame, 0 behind it.

Bit-for-bit reproducibility for any box: trigonometric functions are
evaluated on 1-D arrays over the *whole* global axis and then sliced, and
everything else is elementwise (IEEE-rounded +, -, *, / and ``tanh`` on
contiguous arrays), so the value of a cell does not depend on the box it
was computed in.  ``tests/test_demo.py`` checks this.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..geometry import Box

#: the names of the grid's axes, in array order
AXES = ("x", "y", "z")
#: grid spacing [m]
H = 1.0e-4
#: fresh and burnt gas temperature [K]
T_U, T_B = 300.0, 1800.0
#: fresh gas fuel mass fraction (lean methane-air)
Y_U = 0.055
#: fresh gas density [kg/m^3] and laminar flame speed [m/s]
RHO_U, S_L = 1.16, 0.4
#: speed of the wrinkled flame front through the grid [m/s]
S_T = 2.0
#: mean flow in z [m/s] and vortex velocity amplitude [m/s]
U0, SWIRL = 1.0, 3.0
#: ambient pressure [Pa]
P0 = 101325.0
#: flame thickness: 1.5 cells
DELTA = 1.5 * H
#: where the front starts and ends (fractions of the z length) over a run
FRONT_START, FRONT_TRAVEL = 0.22, 0.56
#: tanh is exactly +-1 beyond this argument; clipping keeps huge arguments cheap
_CLIP = 40.0

#: dataset names in the order they are written, with units
FIELDS: dict[str, str] = {
    "vx": "m/s",
    "vy": "m/s",
    "vz": "m/s",
    "T": "K",
    "p": "Pa",
    "Y_CH4": "1",
}

DEFAULT_SHAPE = (64, 64, 128)


def time_step(shape: Sequence[int], steps: int) -> float:
    """Time between steps [s] such that the front crosses the middle of the domain in *steps* steps."""
    lz = shape[2] * H
    return FRONT_TRAVEL * lz / (S_T * max(steps - 1, 1))


def step_time(k: int, dt: float) -> float:
    """Time of step *k* (the same float on every rank and in every program)."""
    return k * dt


def _axis(n: int, lo: int, hi: int) -> np.ndarray:
    """Cell-centre coordinates [m] of cells lo..hi of an axis of n cells."""
    return (np.arange(lo, hi, dtype=np.float64) + 0.5) * H


def _full_axis_fn(fn, n: int, k: float, phase: float, lo: int, hi: int) -> np.ndarray:
    """fn(k*x + phase) over the whole axis of n cells, sliced to lo..hi (box independent)."""
    x = _axis(n, 0, n)
    return np.ascontiguousarray(fn(k * x + phase)[lo:hi])


def front_position(global_shape: Sequence[int], t: float) -> float:
    """Mean z of the flame surface at time *t* [m]."""
    return FRONT_START * global_shape[2] * H + S_T * t


def fields(box: Box, global_shape: Sequence[int], t: float) -> dict[str, np.ndarray]:
    """The flow at time *t* on the cells of *box* of a grid of *global_shape*.

    Returns a dict ``name -> float64 array of box.shape`` with the names of
    :data:`FIELDS`.  Deterministic: a cell's value does not depend on *box*.
    """
    nx, ny, nz = (int(n) for n in global_shape)
    if box.ndim != 3 or len(global_shape) != 3:
        raise ValueError(f"the demo flame is 3-D; got box {box} of a grid {tuple(global_shape)}")
    box.check_inside((nx, ny, nz), "the demo grid")
    (x0, y0, z0), (x1, y1, z1) = box.start, box.stop
    lx, ly, lz = nx * H, ny * H, nz * H
    kx, ky, kz = 4 * math.pi / lx, 4 * math.pi / ly, 2 * math.pi / lz

    # 1-D factors (trigonometry over whole axes, then sliced)
    sx = _full_axis_fn(np.sin, nx, kx, 0.0, x0, x1)[:, None, None]
    cx = _full_axis_fn(np.cos, nx, kx, 0.0, x0, x1)[:, None, None]
    sy = _full_axis_fn(np.sin, ny, ky, 0.0, y0, y1)[None, :, None]
    cy = _full_axis_fn(np.cos, ny, ky, 0.0, y0, y1)[None, :, None]
    # vortices advected with the mean flow
    cz = _full_axis_fn(np.cos, nz, kz, -kz * U0 * t, z0, z1)[None, None, :]
    c2x = _full_axis_fn(np.cos, nx, 2 * kx, 0.0, x0, x1)[:, None, None]
    c2y = _full_axis_fn(np.cos, ny, 2 * ky, 0.0, y0, y1)[None, :, None]
    c2z = _full_axis_fn(np.cos, nz, 2 * kz, -2 * kz * U0 * t, z0, z1)[None, None, :]
    z = _axis(nz, z0, z1)[None, None, :]

    # wrinkled flame surface z_f(x, y, t): two travelling modes
    amp1, amp2 = 0.04 * lz, 0.015 * lz
    w1 = _full_axis_fn(np.cos, nx, kx / 2, 2.0e3 * t, x0, x1)[:, None, None]
    w1y = _full_axis_fn(np.cos, ny, ky / 2, 0.0, y0, y1)[None, :, None]
    w2x = _full_axis_fn(np.sin, nx, kx, 0.0, x0, x1)[:, None, None]
    w2y = _full_axis_fn(np.sin, ny, ky, 1.5e3 * t, y0, y1)[None, :, None]
    zf = front_position(global_shape, t) + amp1 * (w1 * w1y) + amp2 * (w2x * w2y)

    s = (zf - z) * (1.0 / DELTA)  # > 0 behind the front (burnt side)
    np.clip(s, -_CLIP, _CLIP, out=s)
    c = np.tanh(s)  # progress variable in [-1, 1] ...
    c += 1.0
    c *= 0.5  # ... now in [0, 1]: 0 fresh, 1 burnt

    expansion = T_B / T_U - 1.0
    shape3 = box.shape
    out: dict[str, np.ndarray] = {}
    out["vx"] = np.ascontiguousarray(np.broadcast_to(SWIRL * (sx * cy) * cz, shape3))
    out["vy"] = np.ascontiguousarray(np.broadcast_to(-SWIRL * (cx * sy) * cz, shape3))
    out["vz"] = U0 + (expansion * S_L) * c
    out["T"] = T_U + (T_B - T_U) * c
    tg = (RHO_U * SWIRL * SWIRL / 16.0) * (c2x + c2y) * (c2z + 2.0)
    out["p"] = (
        np.ascontiguousarray(np.broadcast_to(P0 + tg, shape3)) - (RHO_U * S_L * S_L * expansion) * c
    )
    out["Y_CH4"] = Y_U * (1.0 - c)
    return out


def classify_T(tmin: float, tmax: float, tol: float = 1.0) -> str:
    """'fresh', 'burnt' or 'front' for a block with temperatures in [tmin, tmax]."""
    if tmax <= T_U + tol:
        return "fresh"
    if tmin >= T_B - tol:
        return "burnt"
    return "front"
