"""Derived-quantity definitions: what one quantity is, and its record in the file.

A definition is one extension record ``derived:<name>`` in the metadata log
(version, expression text, strategy, per-axis spacing, and a JSON object
with what ``auto`` chose and why), committed with the next record like any
metadata.  The text is parsed again by :func:`lamina.derived.parse` when
the file is opened; it is never evaluated as Python.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import derived
from ...catalog import Catalog, Decoder, Encoder, load_json
from ...errors import ExistsError, ExpressionError, FormatError, ShapeError

if TYPE_CHECKING:
    from ...derived import Expr

STRATEGIES = ("store", "stats", "expression")
EXT_PREFIX = "derived:"
FORMAT_VERSION = 1
#: limits on a definition read from a file
MAX_TEXT = 1 << 16
MAX_INFO = 1 << 16


@dataclass
class Definition:
    """One derived quantity: its expression, strategy and what it produces."""

    name: str
    text: str
    expr: Expr
    strategy: str
    spacing: tuple[float, ...]
    shape: tuple[int, ...]
    dtypes: list[np.dtype]
    components: list[str]
    anchor: str
    info: dict = field(default_factory=dict)
    persistent: bool = True  # False: declared by a reader, lives only in this process

    @property
    def inputs(self) -> frozenset[str]:
        return self.expr.inputs

    @property
    def dtype(self) -> np.dtype:
        return self.dtypes[0]

    @property
    def computed_at_write(self) -> bool:
        return self.strategy in ("store", "stats")

    def fill(self, k: int = 0):
        return fill_for(self.dtypes[k])

    def encode(self) -> bytes:
        e = Encoder()
        e.u8(FORMAT_VERSION)
        e.str(self.text)
        e.str(self.strategy)
        e.u8(len(self.spacing))
        for s in self.spacing:
            e.f64(s)
        e.str(json.dumps(self.info, sort_keys=True, separators=(",", ":")))
        return e.getvalue()

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "expression": self.text,
            "strategy": self.strategy,
            "components": list(self.components),
            "spacing": list(self.spacing),
            "dtype": str(self.dtype),
            "info": self.info,
        }


def fill_for(dt: np.dtype):
    """Fill value of a derived dataset: NaN where the dtype has one, else 0."""
    dt = np.dtype(dt)
    return dt.type(np.nan) if dt.kind in "fc" else dt.type(0)


def decode_definition(name: str, raw: bytes) -> tuple[str, str, tuple[float, ...], dict]:
    """(text, strategy, spacing, info) of an extension record; FormatError if malformed."""
    d = Decoder(raw, f"definition of derived quantity {name!r}")
    version = d.u8()
    if version != FORMAT_VERSION:
        newer = "; a newer lamina wrote it" if version > FORMAT_VERSION else ""
        raise FormatError(
            f"derived quantity {name!r}: definition version {version} is not supported (this "
            f"lamina reads version {FORMAT_VERSION}{newer})"
        )
    text = d.str()
    strategy = d.str()
    nsp = d.u8()
    spacing = tuple(d.f64() for _ in range(nsp))
    info_text = d.str()
    d.expect_end()
    if len(text) > MAX_TEXT or len(info_text) > MAX_INFO:
        raise FormatError(f"derived quantity {name!r}: definition too long")
    if strategy not in STRATEGIES:
        raise FormatError(f"derived quantity {name!r}: unknown strategy {strategy!r}")
    if not all(math.isfinite(s) and s > 0 for s in spacing):
        raise FormatError(f"derived quantity {name!r}: bad grid spacing {spacing}")
    info = load_json(info_text, f"derived quantity {name!r}: bad info record", limit=MAX_INFO)
    if not isinstance(info, dict):
        raise FormatError(f"derived quantity {name!r}: info record is not an object")
    return text, strategy, spacing, info


def check_spacing(spacing, ndim: int, name: str) -> tuple[float, ...]:
    if spacing is None:
        return (1.0,) * ndim
    vals: list[Any] = [spacing] * ndim if np.isscalar(spacing) else list(spacing)
    if len(vals) != ndim:
        raise ValueError(
            f"derived quantity {name!r}: spacing has {len(vals)} entries, the data has {ndim} dimensions"
        )
    for v in vals:  # (float() would take the string "12", and True as 1)
        if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
            raise TypeError(
                f"derived quantity {name!r}: spacing {spacing!r} holds {v!r}, not a real number"
            )
    out = tuple(float(v) for v in vals)
    if not all(math.isfinite(v) and v > 0 for v in out):
        raise ValueError(
            f"derived quantity {name!r}: spacing {out} must be finite and > 0 on every axis"
        )
    return out


def build_definition(
    name: str,
    text: str,
    strategy: str,
    spacing,
    info: dict,
    catalog: Catalog,
    known: dict[str, Definition],
    where: str,
    check_clash: bool,
) -> Definition:
    """Check and build the definition of *name* = *text* over the datasets of *catalog*.

    *known*: the quantities defined already (a new one may not clash with
    them); *where* names the file in errors.  Raises ExpressionError,
    ShapeError, ExistsError or ValueError.
    """
    if not isinstance(text, str):
        raise TypeError(
            f"derived quantity {name!r}: the expression must be a string, got {type(text).__name__}"
        )
    expr = derived.parse(text)
    if expr.is_predicate:
        pass  # a boolean quantity (a mask) is allowed
    if not expr.inputs:
        raise ExpressionError(
            f"derived quantity {name!r}: the expression reads no dataset", 0, text
        )
    cat = catalog
    shapes = {}
    for p in sorted(expr.inputs):
        spec = cat.datasets.get(p)
        if spec is not None:
            shapes[p] = spec.shape
    derived.check_inputs(expr, cat.datasets.keys(), text)  # unknown names first, with suggestions
    distinct = sorted(set(shapes.values()))
    if len(distinct) > 1:
        listing = ", ".join(f"{p} {s}" for p, s in sorted(shapes.items()))
        raise ShapeError(f"derived quantity {name!r}: inputs have different shapes: {listing}")
    shape = distinct[0]
    derived.check_stencils(expr, shape, text)
    ncomp = expr.ncomponents
    comps = derived.component_names(name, ncomp)
    if check_clash:
        # (derived quantities first: their components are datasets of the catalog too, which
        # said "a dataset 'd' already exists" of a quantity declared again)
        for p in (name, *comps):
            for existing, d in known.items():
                if p == existing or p.startswith(existing + "/") or existing.startswith(p + "/"):
                    said = (
                        f"is defined already as {d.text!r} (strategy {d.strategy}): a quantity "
                        "is declared once; declare this one under another name"
                        if existing == name
                        else f"clashes with derived quantity {existing!r} = {d.text!r}"
                    )
                    raise ExistsError(f"derived quantity {name!r} {said}")
        for p in [name, *comps]:
            kind = cat.kind_of(p)
            if kind is not None:
                raise ExistsError(
                    f"derived quantity {name!r}: a {kind} {p!r} already exists in {where!r}"
                )
    dtypes = derived.result_dtype(expr, {p: cat.datasets[p].dtype for p in expr.inputs}, len(shape))
    anchor = next(expr.refs()).path
    sp = check_spacing(spacing, len(shape), name)
    return Definition(
        name, text, expr, strategy, sp, shape, list(dtypes), comps, anchor, dict(info)
    )


__all__ = [
    "EXT_PREFIX",
    "STRATEGIES",
    "Definition",
    "build_definition",
    "check_spacing",
    "decode_definition",
    "fill_for",
]
