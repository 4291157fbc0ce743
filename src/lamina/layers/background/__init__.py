"""Background I/O (``lamina.open(io='async')``): steps committed on a thread, reads read ahead.

* :mod:`.layer` -- :class:`BackgroundLayer`: the transaction of a step, the
  background thread, the budget, errors, zero copy (docs/background.md);
* :mod:`.step` -- a step as the program made it, the counters, the report of a failure;
* :mod:`.prefetch` -- read-ahead for a reader that streams steps.
"""

from .layer import BackgroundLayer
from .prefetch import Prefetcher
from .step import DEFAULT_INFLIGHT_BYTES, BackgroundError, IOStats

__all__ = ["BackgroundError", "BackgroundLayer", "DEFAULT_INFLIGHT_BYTES", "IOStats", "Prefetcher"]
