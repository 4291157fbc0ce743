"""The multiresolution layout's description: what a user asks for and what the catalog keeps.

A dataset created with ``layout=lamina.Multires(...)`` is cut into patches;
each patch gets its own CDF 5/3 wavelet hierarchy (:mod:`lamina.multires`)
and every *band* of every patch is one block.  Band ``k`` of a patch is a
block of *level* ``k``: its box is the patch's extent in level-``k``
coordinates and its statistics are those of the patch's values at level
``k``.  Level 0 is the dataset itself; level ``k >= 1`` is an internal
dataset definition (path ``"<dataset> level <k>"``, shape
``ceil(shape / 2**k)``) that the catalog keeps beside the dataset, never
among the names a user lists.  So every level has a block table of its
own, overlap checks and queries work per level, and a reader of level
``k`` finds the bands it needs (``k .. L-1``) by a search of the tables of
those levels.

On disk the description is the first element of the dataset's codec list
(``{"layout": "multires", ...}``), so a file written before layouts
existed reads unchanged, and a reader that predates them refuses the
dataset instead of reading wavelet bytes as values.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..catalog.model import LAYOUT_LEVEL, LAYOUT_MULTIRES, DatasetSpec
from ..errors import BoundsError, DTypeError, FormatError, ShapeError
from ..multires import bound, compress, wavelet

#: the ``layout`` key of a multiresolution dataset's description
MULTIRES = LAYOUT_MULTIRES
#: the ``layout`` key of one of its coarser levels
LEVEL = LAYOUT_LEVEL

ORDERS = ("patch", "level")
DISTRIBUTIONS = ("balanced", "greedy")
AGGREGATIONS = ("balanced", "counts", "local")


def _choice(value, allowed: Sequence[str], what: str, where: str) -> str:
    if value not in allowed:
        raise ValueError(
            f"{where}: {what} must be one of {', '.join(map(repr, allowed))}, got {value!r}"
        )
    return str(value)


@dataclass(frozen=True)
class Multires:
    """The multiresolution layout of a dataset: ``create_dataset(..., layout=lamina.Multires(...))``.

    Parameters
    ----------
    patch
        Patch edge (one int for every dimension) or shape; powers of two,
        none larger than the dataset.  Default 32.
    tolerance
        Largest absolute error of any value read, at any level, against the
        written value (level 0) or the exact level-``k`` approximation
        rounded to the dataset's dtype (level ``k``; docs/multires.md, "The
        error bound").  0 stores the data losslessly (bit for bit).
    order
        Order of the blocks in a subfile: ``"patch"`` (every level of a
        patch together: random access) or ``"level"`` (coarse levels of
        all patches first: progressive reads).
    distribution
        Which rank transforms a patch that several ranks wrote parts of:
        ``"balanced"`` (every rank ends with floor(M/N) or floor(M/N)+1
        patches) or ``"greedy"`` (the rank holding the largest piece).
    aggregation
        Which aggregator writes a patch: ``"balanced"`` (Morton-ordered
        runs of about equal compressed bytes), ``"counts"`` (equal numbers
        of patches) or ``"local"`` (the rank that encoded it, through its
        own aggregator: with ``aggregators`` equal to the number of ranks,
        file per process).
    verify, optimism
        As :func:`lamina.multires.compress.encode`.
    """

    patch: int | Sequence[int] = 32
    tolerance: float = 1e-3
    order: str = "patch"
    distribution: str = "balanced"
    aggregation: str = "balanced"
    verify: str = "coefficients"
    optimism: float = 1.0

    def describe(self, path: str, shape: Sequence[int], dtype: np.dtype) -> dict:
        """The catalog's description for dataset *path*; a clear error for anything that cannot be."""
        where = f"dataset {path!r}"
        shape = tuple(int(n) for n in shape)
        if not shape:
            raise ShapeError(f"{where}: a multiresolution dataset needs 1 to 4 dimensions, not 0")
        dt = np.dtype(dtype)
        if dt not in (np.float32, np.float64):
            native = dt.newbyteorder("=") if dt.kind == "f" else dt
            if native in (np.float32, np.float64):  # (>f8 on a little-endian machine)
                raise DTypeError(
                    f"{where}: the multiresolution layout stores float32 or float64 data in "
                    f"this machine's byte order, not {dt.str}: give {native.name}"
                )
            raise DTypeError(
                f"{where}: the multiresolution layout stores float32 or float64 data, not {dt}"
            )
        if any(n == 0 for n in shape):
            raise ShapeError(
                f"{where}: a multiresolution dataset has no empty dimension, got shape {tuple(shape)}"
            )
        edges = (
            (self.patch,) * len(shape) if isinstance(self.patch, int | np.integer) else self.patch
        )

        def whole(n) -> bool:  # an int, not a bool, a float or a string of digits
            return isinstance(n, int | np.integer) and not isinstance(n, bool | np.bool_)

        if isinstance(edges, str | bytes) or not (
            isinstance(edges, Sequence | np.ndarray) and all(whole(n) for n in edges)
        ):
            raise ShapeError(
                f"{where}: patch must be an int or a tuple of ints, got {self.patch!r}"
            )
        patch = tuple(int(n) for n in edges)
        if len(patch) != len(shape):
            raise ShapeError(
                f"{where}: patch {patch} has {len(patch)} dimensions, the dataset {len(shape)}"
            )
        try:
            patch = wavelet.check_patch(patch)
        except ShapeError as e:
            raise ShapeError(f"{where}: {e}") from None
        for d, (p, n) in enumerate(zip(patch, shape, strict=True)):
            if p > n:
                raise ShapeError(
                    f"{where}: patch edge {p} (dimension {d}) is larger than the dataset's extent {n}; "
                    f"use a patch edge of at most {1 << (n.bit_length() - 1) if n else 1}"
                )
        try:
            tol = bound.check_tolerance(self.tolerance)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if self.verify not in compress.VERIFY:
            raise ValueError(
                f"{where}: verify must be one of {compress.VERIFY}, got {self.verify!r}"
            )
        if not (
            isinstance(self.optimism, numbers.Real)
            and not isinstance(self.optimism, bool)
            and 1 <= self.optimism < math.inf
        ):
            raise ValueError(
                f"{where}: optimism must be a finite number >= 1, got {self.optimism!r}"
            )
        return {
            "layout": MULTIRES,
            "patch": list(patch),
            "tolerance": tol,
            "order": _choice(self.order, ORDERS, "order", where),
            "distribution": _choice(self.distribution, DISTRIBUTIONS, "distribution", where),
            "aggregation": _choice(self.aggregation, AGGREGATIONS, "aggregation", where),
            "verify": self.verify,
            "optimism": float(self.optimism),
        }


#: the fields of a multiresolution layout record, as :meth:`Multires.describe` writes them
LAYOUT_FIELDS = (
    "layout",
    "patch",
    "tolerance",
    "order",
    "distribution",
    "aggregation",
    "verify",
    "optimism",
)


@dataclass(frozen=True)
class Layout:
    """A multiresolution dataset's layout, checked (from a user or from disk)."""

    patch: tuple[int, ...]
    tolerance: float
    order: str
    distribution: str
    aggregation: str
    verify: str
    optimism: float

    @property
    def levels(self) -> int:
        """Number of levels ``L`` (0 .. L-1)."""
        return wavelet.nlevels(self.patch)

    @classmethod
    def of(cls, spec: DatasetSpec) -> Layout | None:
        """The layout of *spec* (None for a plain dataset or a level); FormatError if it makes no sense."""
        d = spec.layout
        if d is None or d.get("layout") != MULTIRES:
            return None
        where = f"layout of dataset {spec.path!r}"
        if spec.origin:
            where = f"{spec.origin}: {where}"
        # every field is needed, and one this lamina does not write may be a newer writer's
        # that changes what the bands mean: both are refused, not guessed
        missing = [k for k in LAYOUT_FIELDS if k not in d]
        if missing:
            raise FormatError(
                f"{where}: the layout has no field{'s' * (len(missing) > 1)} "
                f"{', '.join(map(repr, missing))}"
            )
        unknown = sorted(k for k in d if k not in LAYOUT_FIELDS)
        if unknown:
            raise FormatError(
                f"{where}: the layout has the field{'s' * (len(unknown) > 1)} "
                f"{', '.join(map(repr, unknown))}, which this lamina does not know (written by a "
                "newer lamina?): the dataset is not read"
            )
        patch = d.get("patch")
        if not isinstance(patch, list | tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in patch
        ):  # int() took "44" for (4, 4), 4.9 for 4 and true for 1
            raise FormatError(f"{where}: patch {patch!r} is not a list of integers")
        try:
            m = Multires(
                patch=tuple(patch),
                tolerance=float(d["tolerance"]),
                order=str(d["order"]),
                distribution=str(d["distribution"]),
                aggregation=str(d["aggregation"]),
                verify=str(d["verify"]),
                optimism=float(d["optimism"]),
            )
            checked = m.describe(spec.path, spec.shape, spec.dtype)
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise FormatError(f"{where}: {e}") from None
        return cls(
            tuple(checked["patch"]),
            checked["tolerance"],
            checked["order"],
            checked["distribution"],
            checked["aggregation"],
            checked["verify"],
            checked["optimism"],
        )

    def user(self) -> Multires:
        """The :class:`Multires` this layout was made from."""
        return Multires(
            self.patch,
            self.tolerance,
            self.order,
            self.distribution,
            self.aggregation,
            self.verify,
            self.optimism,
        )

    def shapes(self, shape: Sequence[int]) -> list[tuple[int, ...]]:
        """The dataset's shape at every level."""
        return [wavelet.level_shape(shape, k) for k in range(self.levels)]

    def check_level(self, level, path: str) -> int:
        """*level* as an int; TypeError for anything but an int (2.5 is no level), BoundsError
        naming the dataset and its levels if it does not exist."""
        if not isinstance(level, int | np.integer) or isinstance(level, bool | np.bool_):
            raise TypeError(f"dataset {path!r}: a level is an int, got {level!r}")
        k = int(level)
        if not 0 <= k < self.levels:
            raise BoundsError(
                f"dataset {path!r} has levels 0 to {self.levels - 1} (patch {self.patch}); "
                f"level {level} does not exist"
            )
        return k

    def check_read_tolerance(self, tolerance, path: str) -> None:
        """A reader's tolerance: None, or no tighter than the one written."""
        if tolerance is None:
            return
        try:
            t = bound.check_tolerance(tolerance)
        except ValueError as e:
            raise ValueError(f"dataset {path!r}: read {e}") from None
        if t < self.tolerance:
            raise ValueError(
                f"dataset {path!r} was written with tolerance {self.tolerance:g}; "
                f"a read cannot be more accurate (asked for {t:g})"
            )


def level_path(path: str, level: int) -> str:
    """The path of level *level*'s internal definition (in messages only)."""
    return f"{path} level {level}"


def level_specs(spec: DatasetSpec, layout: Layout, first_id: int) -> list[DatasetSpec]:
    """The internal definitions of levels 1 .. L-1 of *spec*, numbered from *first_id*."""
    out = []
    for k in range(1, layout.levels):
        out.append(
            DatasetSpec(
                level_path(spec.path, k),
                wavelet.level_shape(spec.shape, k),
                spec.dtype,
                spec.fill,
                (),
                first_id + k - 1,
                {"layout": LEVEL, "of": spec.path, "level": k},
            )
        )
    return out


__all__ = ["LEVEL", "MULTIRES", "Layout", "Multires", "level_path", "level_specs"]
