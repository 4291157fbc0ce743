"""Shared by the derived-quantity scenarios and tests: fields, uneven decompositions, quantities, references.

Everything here is a pure function of its arguments, so a writer job and a
reader launched separately (with another rank count) agree on what was
written where, and on what every derived quantity must read as.

The references are independent of lamina's kernels: plain numpy on the
assembled global arrays (``numpy.gradient(..., edge_order=2)`` for the
stencils), with cells nobody wrote set to the input's fill value, and the
derived value set to its fill (NaN for float, 0 for integer results) where
the quantity's anchor (the first dataset its expression names) was not
written in the step.
"""

from __future__ import annotations

import numpy as np

from lamina.geometry import Box

SHAPE = (9, 8, 7)
#: per-axis grid spacing used by some of the stencil quantities
SPACING = (0.5, 2.0, 1.0)
STRATEGIES = ("store", "stats", "expression")
NSTEPS = 3

# input dataset -> (dtype, fill)
INPUTS: dict[str, tuple[str, float]] = {
    "u": ("f8", 0.0),
    "v": ("f8", 0.0),
    "w": ("f8", 0.25),
    "q": ("f8", 0.0),
    "p": ("f8", 1.0),
    "s": ("f8", 0.0),
    "k": ("i4", 0),
}


def _b(start, stop) -> Box:
    return Box(tuple(start), tuple(stop))


# each input is written as these blocks (a partition of SHAPE): uneven, cut along different
# axes for different inputs, some one cell thick (at the domain boundary and inside)
BLOCKS: dict[str, list[Box]] = {
    "u": [
        _b((0, 0, 0), (1, 8, 7)),
        _b((1, 0, 0), (4, 8, 3)),
        _b((1, 0, 3), (4, 8, 7)),
        _b((4, 0, 0), (9, 8, 7)),
    ],
    "v": [_b((0, 0, 0), (9, 3, 7)), _b((0, 3, 0), (9, 4, 7)), _b((0, 4, 0), (9, 8, 7))],
    "w": [_b((0, 0, 0), (9, 8, 2)), _b((0, 0, 2), (5, 8, 7)), _b((5, 0, 2), (9, 8, 7))],
    "q": [_b((0, 0, 0), (6, 2, 7)), _b((0, 2, 0), (6, 8, 7)), _b((6, 0, 0), (9, 8, 7))],
    "p": [_b((0, 0, 0), (9, 8, 7))],
    "s": [_b((0, 0, 0), (9, 8, 6)), _b((0, 0, 6), (9, 8, 7))],
    "k": [_b((0, 0, 0), (3, 8, 7)), _b((3, 0, 0), (9, 8, 7))],
}
_OFFSET = {"u": 0, "v": 1, "w": 2, "q": 1, "p": 0, "s": 1, "k": 0}

# blocks (by index) left unwritten at a step; None: the input is not written at all
SKIPPED: dict[int, dict[str, list[int] | None]] = {
    1: {"u": [2], "w": None, "k": [0]},
}


def writers(nranks: int) -> int:
    """Ranks that write anything: with 3 or more ranks the last one writes nothing."""
    return nranks if nranks <= 2 else nranks - 1


def owner(name: str, i: int, nranks: int) -> int:
    """The rank that writes block *i* of input *name* (some ranks get two blocks)."""
    return (i + _OFFSET[name]) % writers(nranks)


def written(name: str, step: int) -> list[Box]:
    """Boxes of input *name* written at *step* (by whichever ranks)."""
    skip = SKIPPED.get(step, {})
    if name in skip and skip[name] is None:
        return []
    gone = set(skip.get(name) or [])
    return [b for i, b in enumerate(BLOCKS[name]) if i not in gone]


def my_blocks(name: str, step: int, rank: int, nranks: int) -> list[Box]:
    out = []
    boxes = written(name, step)
    for i, b in enumerate(BLOCKS[name]):
        if b in boxes and owner(name, i, nranks) == rank:
            out.append(b)
    return out


def field(name: str, box: Box, step: int) -> np.ndarray:
    """Values of input *name* over *box* at *step*: smooth, non-polynomial, except q (quadratic) and k (int)."""
    i, j, m = np.meshgrid(
        *[np.arange(a, b, dtype=np.float64) for a, b in zip(box.start, box.stop, strict=True)],
        indexing="ij",
    )
    t = float(step)
    if name == "u":
        return np.sin(0.37 * i + 0.21 * j + 0.1 * t) * np.cos(0.29 * m) + 0.05 * i
    if name == "v":
        return np.exp(0.11 * j - 0.05 * m) * np.cos(0.23 * i - 0.13 * m + 0.2 * t)
    if name == "w":
        return np.sin(0.0475 * i * j + 0.31 * m) - 0.2 * t
    if name == "q":
        return 0.5 * i * i - 0.3 * i * j + 0.2 * m * m + j - 0.7 * m + 1.0 + t
    if name == "p":
        return 1.5 + 0.8 * np.sin(0.4 * i + 0.3 * j + 0.2 * m + t)
    if name == "s":
        return 0.9 * np.sin(0.5 * i - 0.35 * j + 0.45 * m + 0.3 * t)
    if name == "k":
        return ((7 * i + 3 * j + m + t) % 11).astype(np.int32)
    raise KeyError(name)


def global_input(name: str, step: int) -> np.ndarray:
    """The assembled global array of input *name* at *step*, as a reader sees it."""
    dt, fill = INPUTS[name]
    out = np.full(SHAPE, fill, dtype=dt)
    for b in written(name, step):
        out[b.slices] = field(name, b, step)
    return out


def coverage_mask(name: str, step: int) -> np.ndarray:
    m = np.zeros(SHAPE, dtype=bool)
    for b in written(name, step):
        m[b.slices] = True
    return m


# ---------------------------------------------------------------------------
# quantities: name, expression, spacing, anchor input, numpy reference
# ---------------------------------------------------------------------------


def g(a, ax, h):
    """numpy's derivative along *ax* (integers in float64, as the expression language does)."""
    a = np.asarray(a)
    if a.dtype.kind in "biu":
        a = a.astype(np.float64)
    return np.gradient(a, h[ax], axis=ax, edge_order=2)


def _curl(u, v, w, h):
    return [g(w, 1, h) - g(v, 2, h), g(u, 2, h) - g(w, 0, h), g(v, 0, h) - g(u, 1, h)]


def _lap(a, h):
    return sum(g(g(a, j, h), j, h) for j in range(3))


def _f64(a):
    return a.astype(np.float64) if a.dtype.kind in "biu" else a


class Q:
    """One derived quantity of the scenarios."""

    def __init__(self, name, expr, ref, anchor="u", spacing=None, strategy=None, late=False):
        self.name = name
        self.expr = expr
        self.ref = ref  # (G, h) -> list of global arrays (one per component)
        self.anchor = anchor  # the input whose coverage the quantity follows
        self.spacing = spacing
        self.strategy = strategy  # fixed strategy, else the file's
        self.late = late  # declared after step 0

    def components(self, n: int) -> list[str]:
        return [self.name] if n == 1 else [f"{self.name}/{c}" for c in "xyz"[:n]]


H = SPACING
QUANTITIES: list[Q] = [
    # binary, unary, float, fold, vector functions
    Q("f_add", "add(u, v)", lambda G, h: [G["u"] + G["v"]]),
    Q("f_sub", "subtract(v, u)", lambda G, h: [G["v"] - G["u"]], anchor="v"),
    Q("f_mul", "multiply(u, w)", lambda G, h: [G["u"] * G["w"]]),
    Q("f_div", "divide(u, p)", lambda G, h: [G["u"] / G["p"]]),
    Q("f_pow", "pow(p, v)", lambda G, h: [G["p"] ** G["v"]], anchor="p"),
    Q("f_sqrt", "sqrt(p)", lambda G, h: [np.sqrt(G["p"])], anchor="p"),
    Q("f_abs", "abs(s)", lambda G, h: [np.abs(G["s"])], anchor="s"),
    Q("f_exp", "exp(u)", lambda G, h: [np.exp(G["u"])]),
    Q("f_log", "log(p)", lambda G, h: [np.log(G["p"])], anchor="p"),
    Q("f_sin", "sin(v)", lambda G, h: [np.sin(G["v"])], anchor="v"),
    Q("f_cos", "cos(w)", lambda G, h: [np.cos(G["w"])], anchor="w"),
    Q("f_tan", "tan(s)", lambda G, h: [np.tan(G["s"])], anchor="s"),
    Q("f_asin", "asin(s)", lambda G, h: [np.arcsin(G["s"])], anchor="s"),
    Q("f_acos", "acos(s)", lambda G, h: [np.arccos(G["s"])], anchor="s"),
    Q("f_atan", "atan(q)", lambda G, h: [np.arctan(G["q"])], anchor="q"),
    Q("f_min", "min(u, v, w)", lambda G, h: [np.minimum(np.minimum(G["u"], G["v"]), G["w"])]),
    Q("f_max", "max(q, u)", lambda G, h: [np.maximum(G["q"], G["u"])], anchor="q"),
    Q(
        "f_mag",
        "magnitude(u, v, w)",
        lambda G, h: [np.sqrt(G["u"] ** 2 + G["v"] ** 2 + G["w"] ** 2)],
    ),
    Q(
        "f_dot",
        "dot(u, v, w, q, p, s)",
        lambda G, h: [G["u"] * G["q"] + G["v"] * G["p"] + G["w"] * G["s"]],
    ),
    Q(
        "f_cross",
        "cross(u, v, w, q, p, s)",
        lambda G, h: [
            G["v"] * G["s"] - G["w"] * G["p"],
            G["w"] * G["q"] - G["u"] * G["s"],
            G["u"] * G["p"] - G["v"] * G["q"],
        ],
    ),
    # integer input: sqrt in float64, arithmetic keeps int32 (fill 0 where k was not written)
    Q("i_sqrt", "sqrt(k)", lambda G, h: [np.sqrt(G["k"].astype(np.float64))], anchor="k"),
    Q("i_lin", "k * 3 - 1", lambda G, h: [G["k"] * 3 - 1], anchor="k"),
    # stencils: exactly numpy.gradient(global, edge_order=2), default and per-axis spacing
    Q("s_gx", "gradient(u, 0)", lambda G, h: [g(G["u"], 0, h)]),
    Q("s_gy", "gradient(v, 1)", lambda G, h: [g(G["v"], 1, h)], anchor="v", spacing=H),
    Q("s_gz", "gradient(w, 2)", lambda G, h: [g(G["w"], 2, h)], anchor="w"),
    Q("s_gneg", "gradient(s, -1)", lambda G, h: [g(G["s"], 2, h)], anchor="s", spacing=H),
    Q(
        "s_gq",
        "gradient(q)",
        lambda G, h: [g(G["q"], j, h) for j in range(3)],
        anchor="q",
        spacing=H,
    ),
    Q("s_gu", "gradient(u)", lambda G, h: [g(G["u"], j, h) for j in range(3)]),
    Q("s_gk", "gradient(k, 0)", lambda G, h: [g(G["k"], 0, h)], anchor="k"),
    Q(
        "s_div",
        "divergence(u, v, w)",
        lambda G, h: [g(G["u"], 0, h) + g(G["v"], 1, h) + g(G["w"], 2, h)],
        spacing=H,
    ),
    Q(
        "s_divq",
        "divergence(q, q, q)",
        lambda G, h: [g(G["q"], 0, h) + g(G["q"], 1, h) + g(G["q"], 2, h)],
        anchor="q",
    ),
    Q("s_curl", "curl(u, v, w)", lambda G, h: _curl(G["u"], G["v"], G["w"], h)),
    Q(
        "s_curlh",
        "curl(q, p, w)",
        lambda G, h: _curl(G["q"], G["p"], G["w"], h),
        anchor="q",
        spacing=H,
    ),
    Q("s_lap", "laplacian(u)", lambda G, h: [_lap(G["u"], h)]),
    Q("s_lapq", "laplacian(q)", lambda G, h: [_lap(G["q"], h)], anchor="q", spacing=H),
    # infix operators, unary minus, constants, precedence
    Q(
        "x_arith",
        "u + v * w - p / 2",
        lambda G, h: [G["u"] + G["v"] * G["w"] - G["p"] / 2],
    ),
    Q(
        "x_pow",
        "p ^ 2 + v ** 3 - 2 ^ 3",
        lambda G, h: [G["p"] ** 2 + G["v"] ** 3 - 8.0],
        anchor="p",
    ),
    Q("x_neg", "-u + -(v * 2.5) - -1e-3", lambda G, h: [-G["u"] + -(G["v"] * 2.5) + 1e-3]),
    Q(
        "x_prec",
        "-q ^ 2 + (u - v) * (u + v)",
        lambda G, h: [-(G["q"] ** 2) + (G["u"] - G["v"]) * (G["u"] + G["v"])],
        anchor="q",
    ),
    # nested expressions, stencils of expressions
    Q(
        "n_vortmag",
        "magnitude(curl(u, v, w))",
        lambda G, h: [np.sqrt(sum(c**2 for c in _curl(G["u"], G["v"], G["w"], h)))],
        spacing=H,
    ),
    Q("n_lap1", "laplacian(u) + 1", lambda G, h: [_lap(G["u"], h) + 1]),
    Q(
        "n_gmag",
        "gradient(magnitude(u, v), 1)",
        lambda G, h: [g(np.sqrt(G["u"] ** 2 + G["v"] ** 2), 1, h)],
        spacing=H,
    ),
    Q(
        "n_divgrad",
        "divergence(gradient(q, 0), gradient(q, 1), gradient(q, 2))",
        lambda G, h: [sum(g(g(G["q"], j, h), j, h) for j in range(3))],
        anchor="q",
    ),
    # derived quantities over derived quantities (computed in order at the end of the step)
    Q(
        "vmag",
        "magnitude(u, v, w)",
        lambda G, h: [np.sqrt(G["u"] ** 2 + G["v"] ** 2 + G["w"] ** 2)],
    ),
    Q("vmag2", "vmag * 2", lambda G, h: [G["vmag"] * 2]),
    Q("gvmag", "gradient(vmag, 1)", lambda G, h: [g(G["vmag"], 1, h)]),
    Q(
        "cmag",
        "magnitude(`s_curl/x`, `s_curl/y`, `s_curl/z`)",
        lambda G, h: [np.sqrt(G["s_curl/x"] ** 2 + G["s_curl/y"] ** 2 + G["s_curl/z"] ** 2)],
    ),
    # an input computed only when read, under a quantity computed at the end of each step
    Q(
        "emag",
        "magnitude(u, v)",
        lambda G, h: [np.sqrt(G["u"] ** 2 + G["v"] ** 2)],
        strategy="expression",
    ),
    Q("emag3", "emag * 3", lambda G, h: [G["emag"] * 3]),
    # declared after step 0: its values at step 0 are recomputed under every strategy
    Q("late", "laplacian(q) - u", lambda G, h: [_lap(G["q"], h) - G["u"]], anchor="q", late=True),
]


def fill_for(dt: np.dtype):
    return np.nan if np.dtype(dt).kind in "fc" else 0


def references(step: int) -> dict[str, np.ndarray]:
    """Global reference arrays at *step* of every input and of every component of every quantity."""
    G: dict[str, np.ndarray] = {name: global_input(name, step) for name in INPUTS}
    for q in QUANTITIES:
        h = q.spacing or (1.0, 1.0, 1.0)
        with np.errstate(all="ignore"):
            res = q.ref(G, h)
        mask = coverage_mask(q.anchor, step)
        for c, a in zip(q.components(len(res)), res, strict=True):
            a = np.array(a)
            a[~mask] = fill_for(a.dtype)
            G[c] = a
    return G


def derived_names() -> list[str]:
    """Every dataset of every quantity (components of vectors by path)."""
    G = references(0)
    return [n for n in G if n not in INPUTS]


def scale(a: np.ndarray) -> float:
    f = np.abs(a[np.isfinite(a)]) if a.dtype.kind == "f" else np.abs(a)
    return float(f.max()) if f.size else 1.0


def check_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal to floating-point rounding (rtol 1e-12, atol 1e-12 of the data's scale), NaN where NaN."""
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {got.shape}, expected {want.shape}")
    if got.dtype != want.dtype:
        raise AssertionError(f"{what}: dtype {got.dtype}, expected {want.dtype}")
    if want.dtype.kind in "iub":
        if not np.array_equal(got, want):
            bad = np.argwhere(got != want)[:3]
            raise AssertionError(f"{what}: differs at {bad.tolist()}")
        return
    np.testing.assert_allclose(
        got, want, rtol=1e-12, atol=1e-12 * max(scale(want), 1.0), equal_nan=True, err_msg=what
    )


def check_stats(st, want: np.ndarray, what: str) -> None:
    """Block statistics *st* against numpy over the block's values *want* (NaN-aware)."""
    fin = want[~np.isnan(want)] if want.dtype.kind == "f" else want
    if st.count != fin.size:
        raise AssertionError(f"{what}: count {st.count}, expected {fin.size}")
    if fin.size == 0:
        return
    sc = max(scale(want), 1.0)
    for key, got, exp in (
        ("min", st.min, fin.min()),
        ("max", st.max, fin.max()),
    ):
        if abs(float(got) - float(exp)) > 1e-12 * sc:
            raise AssertionError(f"{what}: {key} {got!r}, expected {exp!r}")
    exp_sum = float(fin.astype(np.float64).sum())
    if abs(float(st.sum) - exp_sum) > 1e-10 * sc * fin.size:
        raise AssertionError(f"{what}: sum {st.sum!r}, expected {exp_sum!r}")
