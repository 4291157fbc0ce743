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

from . import probe as _probe  # noqa: F401 - registers the calibration's query probe
from .core import query, run, subtract
from .result import QueryResult

__all__ = ["QueryResult", "query", "run", "subtract"]
