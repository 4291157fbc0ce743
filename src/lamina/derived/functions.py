"""The functions of the expression language: names, arity, shape of the result, cost.

This table is pure data.  The parser checks calls against it, the AST reads
the halo and the operation counts from it, and :mod:`lamina.derived.kernels`
implements each entry.  Adding a function means adding a row here and a case
in the kernels (and a test).

Kinds of functions
------------------
``binary``
    ``add subtract multiply divide pow``: the same as the infix operators.
``unary``
    ``abs``: the numpy ufunc, dtype kept (``abs`` of an int stays int).
``float``
    ``sqrt exp log sin cos tan asin acos atan``: integer and boolean inputs are
    computed in float64 (numpy would give float16 for int8); float inputs
    keep their dtype.
``fold``
    ``min max``: elementwise over two or more arguments (``numpy.minimum``,
    ``numpy.maximum``, so a NaN in any argument gives NaN).
``vector``
    ``magnitude dot cross``: take *components*; an argument that is itself a
    3-component vector (``curl``, ``cross``, ``gradient(a)``) counts as its
    three components, so ``magnitude(curl(u, v, w))`` is the vorticity
    magnitude.
``stencil``
    ``gradient divergence curl laplacian``: finite differences, exactly
    ``numpy.gradient(global_array, edge_order=2)`` on the assembled global
    array (see :mod:`lamina.derived.kernels`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: names of the components of a vector result, in axis order (axes 0, 1, 2)
COMPONENTS = ("x", "y", "z")


@dataclass(frozen=True)
class Function:
    """One function of the expression language."""

    name: str
    kind: str  # binary | unary | float | fold | vector | stencil
    min_args: int
    max_args: int | None  # None: any number
    #: nested stencil depth the function adds (0 pointwise, 1 gradient, 2 laplacian)
    reach: int = 0
    #: numpy ufunc name for binary/unary/float/fold kinds
    ufunc: str = ""
    #: elementary operations per grid point, by category (see :attr:`Expr.op_counts`)
    ops: dict[str, int] = field(default_factory=dict)
    doc: str = ""

    def arity_text(self) -> str:
        """'1 argument', '2 or 3 arguments', 'at least 2 arguments', ..."""
        lo, hi = self.min_args, self.max_args
        plural = "argument" if (hi == lo == 1) else "arguments"
        if hi is None:
            return f"at least {lo} argument{'' if lo == 1 else 's'}"
        if hi == lo:
            return f"{lo} {plural}"
        if hi == lo + 1:
            return f"{lo} or {hi} {plural}"
        return f"{lo} to {hi} {plural}"


def _f(name: str, kind: str, lo: int, hi: int | None, **kw) -> Function:
    return Function(name, kind, lo, hi, **kw)


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in [
        _f("add", "binary", 2, 2, ufunc="add", ops={"add": 1}, doc="a + b"),
        _f("subtract", "binary", 2, 2, ufunc="subtract", ops={"add": 1}, doc="a - b"),
        _f("multiply", "binary", 2, 2, ufunc="multiply", ops={"mul": 1}, doc="a * b"),
        _f("divide", "binary", 2, 2, ufunc="divide", ops={"div": 1}, doc="a / b (true division)"),
        _f("pow", "binary", 2, 2, ufunc="power", ops={"pow": 1}, doc="a ^ b"),
        _f("abs", "unary", 1, 1, ufunc="absolute", ops={"add": 1}, doc="|a|"),
        _f("sqrt", "float", 1, 1, ufunc="sqrt", ops={"sqrt": 1}, doc="square root"),
        _f("exp", "float", 1, 1, ufunc="exp", ops={"transcendental": 1}, doc="e^a"),
        _f("log", "float", 1, 1, ufunc="log", ops={"transcendental": 1}, doc="natural logarithm"),
        _f("sin", "float", 1, 1, ufunc="sin", ops={"transcendental": 1}, doc="sine"),
        _f("cos", "float", 1, 1, ufunc="cos", ops={"transcendental": 1}, doc="cosine"),
        _f("tan", "float", 1, 1, ufunc="tan", ops={"transcendental": 1}, doc="tangent"),
        _f("asin", "float", 1, 1, ufunc="arcsin", ops={"transcendental": 1}, doc="arc sine"),
        _f("acos", "float", 1, 1, ufunc="arccos", ops={"transcendental": 1}, doc="arc cosine"),
        _f("atan", "float", 1, 1, ufunc="arctan", ops={"transcendental": 1}, doc="arc tangent"),
        _f("min", "fold", 2, None, ufunc="minimum", doc="elementwise minimum"),
        _f("max", "fold", 2, None, ufunc="maximum", doc="elementwise maximum"),
        _f("magnitude", "vector", 1, None, doc="sqrt(a*a + b*b + ...)"),
        _f("dot", "vector", 2, None, doc="a1*b1 + a2*b2 + a3*b3 (n + n components)"),
        _f("cross", "vector", 2, 6, doc="a x b (3 + 3 components) -> 3 components"),
        _f(
            "gradient",
            "stencil",
            1,
            2,
            reach=1,
            doc="gradient(a, axis): d a / d x_axis; gradient(a): the 3 components (3-D data)",
        ),
        _f(
            "divergence",
            "stencil",
            1,
            3,
            reach=1,
            doc="divergence(u, v, w) = du/dx0 + dv/dx1 + dw/dx2 (one argument per array axis)",
        ),
        _f(
            "curl",
            "stencil",
            3,
            3,
            reach=1,
            doc="curl(u, v, w) -> (dw/dx1 - dv/dx2, du/dx2 - dw/dx0, dv/dx0 - du/dx1), 3-D data",
        ),
        _f(
            "laplacian",
            "stencil",
            1,
            1,
            reach=2,
            doc="sum over axes of gradient(gradient(a, axis), axis)",
        ),
    ]
}

#: the functions that need neighbouring cells (and so a halo)
STENCILS = frozenset(n for n, f in FUNCTIONS.items() if f.kind == "stencil")


def stencil_ops(name: str, nargs: int, ndim: int = 3) -> dict[str, int]:
    """Operation counts per grid point of a stencil function (interior formula).

    A first derivative in the interior is one subtraction and one division
    (``(f[i+1] - f[i-1]) / (2 h)``); ``ndim`` is assumed for the functions
    whose count depends on it (``laplacian``, ``gradient(a)``).
    """
    if name == "gradient":
        k = ndim if nargs == 1 else 1
        return {"add": k, "div": k}
    if name == "divergence":
        return {"add": 2 * nargs - 1, "div": nargs}
    if name == "curl":
        return {"add": 9, "div": 6}
    if name == "laplacian":
        return {"add": 3 * ndim - 1, "div": 2 * ndim}
    raise KeyError(name)


def vector_ops(name: str, ncomponents: int) -> dict[str, int]:
    """Operation counts per grid point of magnitude/dot/cross over *ncomponents* input components."""
    if name == "magnitude":
        return {"mul": ncomponents, "add": ncomponents - 1, "sqrt": 1}
    if name == "dot":
        n = ncomponents // 2
        return {"mul": n, "add": n - 1}
    if name == "cross":
        return {"mul": 6, "add": 3}
    raise KeyError(name)
