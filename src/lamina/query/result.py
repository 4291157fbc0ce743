"""The answer to a query: candidate blocks, the exact selection, and what each cost."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from ..geometry import Box
from ..text import fmt_box, fmt_bytes, json_value, plural


class Units(Sequence[Box]):
    """The units of a query, in order of their starts: a sequence of boxes kept as two
    ``(n, ndim)`` int64 columns of corners, ``starts`` and ``stops``.

    The units of a step of many blocks are its block table's corners cut to
    the region: the query judges them as columns, and a :class:`Box` is made
    only for a unit asked for (by index or by iterating), so that a query
    that answers a few candidates of 100,000 blocks makes a few boxes, not
    100,000.  Compares equal to any sequence of the same boxes in the same
    order (a list of boxes too).
    """

    __slots__ = ("starts", "stops")

    def __init__(self, starts: np.ndarray, stops: np.ndarray) -> None:
        self.starts = starts
        self.stops = stops

    @classmethod
    def of(cls, boxes: Sequence[Box], ndim: int) -> Units:
        """The units of a few *boxes* (of *ndim* dimensions), in the order given."""
        n = len(boxes)
        return cls(
            np.array([b.start for b in boxes], dtype=np.int64).reshape(n, ndim),
            np.array([b.stop for b in boxes], dtype=np.int64).reshape(n, ndim),
        )

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, k: int) -> Box: ...

    @overload
    def __getitem__(self, k: slice) -> Units: ...

    def __getitem__(self, k: int | slice) -> Box | Units:
        if isinstance(k, slice):
            return Units(self.starts[k], self.stops[k])
        return Box(tuple(self.starts[k].tolist()), tuple(self.stops[k].tolist()))

    def __iter__(self) -> Iterator[Box]:
        return iter(self.boxes())

    def boxes(self, rows: np.ndarray | None = None) -> list[Box]:
        """The boxes of the units at *rows* (default: all), in that order: the corners
        converted at once, not unit by unit."""
        starts = self.starts if rows is None else self.starts[rows]
        stops = self.stops if rows is None else self.stops[rows]
        return [
            Box(a, b)
            for a, b in zip(map(tuple, starts.tolist()), map(tuple, stops.tolist()), strict=True)
        ]

    def __contains__(self, box: object) -> bool:
        if not isinstance(box, Box) or box.ndim != self.starts.shape[1]:
            return False
        same = np.ones(len(self), dtype=bool)
        for d, (a, b) in enumerate(zip(box.start, box.stop, strict=True)):
            same &= (self.starts[:, d] == a) & (self.stops[:, d] == b)
        return bool(same.any())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Units):
            return np.array_equal(self.starts, other.starts) and np.array_equal(
                self.stops, other.stops
            )
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(b) for b in self[:3])
        return f"Units([{head}{', ...' if len(self) > 3 else ''}], {len(self)} units)"


@dataclass
class QueryResult:
    """What :func:`lamina.query.query` found, and what it read to find it.

    Two answers, each with its cost:

    * the **block answer** -- ``candidates``, the boxes (units) whose block
      statistics say the predicate can hold there, ``certain`` (it holds at
      every element of that box), and ``candidate_values``, the ``select``
      datasets over each candidate box; ``candidate_blocks_read`` and
      ``candidate_bytes_read`` count what was read for it (exact ranges of
      datasets without statistics, the selected values);
    * the **exact answer** (``exact=True``) -- ``coords`` of the matching
      elements (global indices, C order), ``values`` of the ``select``
      datasets at those elements, ``count``, and ``mask``, a boolean array of
      the region's shape made from ``coords`` when first asked for (it costs
      one byte per element of the region: over a large region, use
      ``coords``); ``exact_blocks_read`` and ``exact_bytes_read`` count the
      exact phase only (it reuses what the block answer already read).
      The exact answer itself takes memory for the matches, not for the
      region: it evaluates the candidates unit by unit, a large unit part by
      part.

    ``unit_boxes`` are the units the region was cut into (:class:`Units`: the
    boxes as columns of corners, a box made for each unit asked for).

    Bytes are storage bytes as the engine counts them (``bytes_read``);
    blocks are distinct stored blocks (dataset, block) whose data a read
    touched, including the inputs a derived value was computed from.
    """

    where: str
    step: int
    region: Box
    grid: str | None
    select: tuple[str, ...]
    unit_boxes: Units
    candidates: list[Box]
    certain: list[bool]
    candidate_values: list[dict[str, np.ndarray]]
    candidate_blocks_read: int = 0
    candidate_bytes_read: int = 0
    candidate_seconds: float = 0.0
    exact: bool = False
    coords: np.ndarray | None = None
    values: dict[str, np.ndarray] = field(default_factory=dict)
    count: int | None = None
    exact_blocks_read: int = 0
    exact_bytes_read: int = 0
    exact_seconds: float = 0.0
    level: int = (
        0  # the resolution the query ran at (0: full); region and coords are in its coordinates
    )
    #: the shape numpy gives the region's key where integer indices drop axes (``region=np.s_[2]``
    #: of a 2-D domain: one axis), the shape of :attr:`mask`; None: the region's own
    mask_shape: tuple[int, ...] | None = None
    _mask: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def mask(self) -> np.ndarray | None:
        """Boolean array of the region's shape, True at the matches (exact answers only); a
        region given as a key with integer indices (``np.s_[2]``, ``"2,:"``) has the shape
        numpy gives that key, as ``(x > t)[key]``.

        Made from :attr:`coords` on first access, then kept: it takes one byte
        per element of the region, so over a large region use :attr:`coords`.
        """
        if not self.exact or self.coords is None:
            return None
        if self._mask is None:
            m = np.zeros(self.region.shape, dtype=bool)
            if self.coords.shape[0]:  # (a 0-D region: coords of shape (1, 0), m[()] = True)
                rel = self.coords - np.asarray(self.region.start, dtype=np.int64)
                m[tuple(rel.T)] = True
            self._mask = m if self.mask_shape is None else m.reshape(self.mask_shape)
        return self._mask

    # -- derived figures ------------------------------------------------------
    @property
    def units(self) -> int:
        """Number of boxes the region was cut into (grid blocks in it, plus the parts outside them)."""
        return len(self.unit_boxes)

    @property
    def candidate_elements(self) -> int:
        """Elements in the candidate boxes."""
        return sum(b.size for b in self.candidates)

    @property
    def certain_elements(self) -> int:
        """Elements in the candidate boxes where the predicate holds everywhere."""
        return sum(b.size for b, c in zip(self.candidates, self.certain, strict=True) if c)

    @property
    def bytes_read(self) -> int:
        """Bytes read by both answers together."""
        return self.candidate_bytes_read + (self.exact_bytes_read if self.exact else 0)

    def matches(self, limit: int | None = None) -> list[tuple[tuple[int, ...], dict[str, object]]]:
        """The first *limit* matches (all if None) as ``(index, {path: value})``; exact answers only."""
        if not self.exact or self.coords is None:
            return []
        n = self.coords.shape[0] if limit is None else min(int(limit), self.coords.shape[0])
        return [
            (
                tuple(int(x) for x in self.coords[i]),
                {p: v[i] for p, v in self.values.items()},
            )
            for i in range(n)
        ]

    # -- presentation ---------------------------------------------------------
    def summary(self) -> str:
        """A few lines for humans: units, candidates, the cost of each answer, the count."""
        grid = (
            f"the blocks of {self.grid!r}"
            if self.grid
            else "none (no dataset the condition names has blocks)"
        )
        ncert = sum(self.certain)
        lines = [
            f"query {self.where!r} at step {self.step}"
            + (f", level {self.level}" if self.level else "")
            + f", region {fmt_box(self.region)} "
            f"({plural(self.region.size, 'element')})",
            f"units: {self.units} (grid: {grid})",
            f"candidate blocks: {len(self.candidates)} of {self.units} ({ncert} certain), "
            f"{plural(self.candidate_elements, 'element')}",
            f"block answer: {plural(self.candidate_blocks_read, 'block')} read, "
            f"{fmt_bytes(self.candidate_bytes_read)} read ({self.candidate_bytes_read} B)",
        ]
        if self.exact:
            lines.append(
                f"exact answer: {plural(self.exact_blocks_read, 'block')} read, "
                f"{fmt_bytes(self.exact_bytes_read)} read ({self.exact_bytes_read} B)"
            )
            lines.append(f"matching elements: {self.count}")
        return "\n".join(lines)

    def as_dict(self, limit: int | None = None) -> dict:
        """Plain JSON data; with *limit*, only the first *limit* matches are listed."""

        def box(b: Box) -> dict:
            return {"start": list(b.start), "stop": list(b.stop)}

        out: dict = {
            "where": self.where,
            "step": self.step,
            "level": self.level,
            "region": box(self.region),
            "grid": self.grid,
            "select": list(self.select),
            "units": self.units,
            "candidates": [box(b) for b in self.candidates],
            "certain": [bool(c) for c in self.certain],
            "candidate_elements": self.candidate_elements,
            "block_answer": {
                "blocks_read": self.candidate_blocks_read,
                "bytes_read": self.candidate_bytes_read,
                "seconds": self.candidate_seconds,
            },
        }
        if self.exact:
            assert self.coords is not None
            n = self.coords.shape[0] if limit is None else min(int(limit), self.coords.shape[0])
            out["exact_answer"] = {
                "blocks_read": self.exact_blocks_read,
                "bytes_read": self.exact_bytes_read,
                "seconds": self.exact_seconds,
                "count": self.count,
                "coords": self.coords[:n].tolist(),
                "values": {p: json_value(v[:n]) for p, v in self.values.items()},
            }
        else:
            out["exact_answer"] = None
        return out
