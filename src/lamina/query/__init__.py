"""Queries: which elements satisfy a condition over datasets and derived quantities.

:func:`query` answers in two stages, each with what it read:

1. **candidate blocks** -- the region is cut into units along the blocks of
   the first dataset of the condition that has blocks (plus the unwritten
   rest); each dataset's range over a unit comes from the statistics of its
   blocks there (and its fill value where it was not written), and
   :class:`lamina.derived.Bounds`, under the arithmetic of the datasets'
   dtypes, keeps the units where the condition *can* hold -- it never drops
   a match -- and marks those where it provably holds everywhere.  Only
   datasets without statistics there (derived quantities kept as an
   expression) are read to find their range;
2. **exact selection** -- over the candidates where the condition may fail,
   the datasets are read (with the halo stencils need), unit by unit, and
   the condition is evaluated element by element: the coordinates and the
   selected values (and a mask of the region, made when asked for).

``lamina query FILE --where EXPR ...`` (:mod:`lamina.cli.query`) does the
same from the command line.  The query code sees a file only through its
engine stack (:class:`~.source.Source`): ``File.query`` calls :func:`run`.  Queries are independent calls: any rank may make them alone.

>>> import lamina, numpy as np
>>> from lamina.query import query
>>> f = lamina.open("doc-query", "w", engine="memory")
>>> T = f.create_dataset("T", (4, 4))
>>> with f.step():
...     T[:2] = np.arange(8).reshape(2, 4)
...     T[2:] = 100 + np.arange(8).reshape(2, 4)
>>> r = query(f, "T > 104", select=["T"])
>>> r.units, len(r.candidates), r.count, r.values["T"].tolist()
(2, 1, 3, [105.0, 106.0, 107.0])
>>> f.close()
"""

from typing import TYPE_CHECKING

from .. import lazy
from ..perf.calibrate import register_probe

if TYPE_CHECKING:
    from .core import query, run, subtract
    from .result import QueryResult

#: where each name below lives: imported at its first use (lamina.lazy), with the expression
#: parser and kernels the query code imports
_WHERE = {"query": ".core", "run": ".core", "subtract": ".core", "QueryResult": ".result"}

__getattr__ = lazy.getattr_for(__name__, _WHERE, globals())


def _probe(directory: str | None, quick: bool) -> dict[str, list[tuple[float, float]]]:
    """The calibration's query probe (:mod:`.probe`), imported when a calibration runs."""
    from .probe import probe

    return probe(directory, quick)


register_probe("query", _probe)

__all__ = ["QueryResult", "query", "run", "subtract"]
