"""The derived-quantity layer: expressions over datasets, computed by lamina, kept three ways.

* :mod:`.layer` -- :class:`DerivedLayer`, the layer itself (declaring, computing at the end of a
  step, reading by recomputation);
* :mod:`.definition` -- what a quantity is and its record in the file;
* :mod:`.exchange` -- the halo exchange between ranks that stencils need.
"""

from .definition import EXT_PREFIX, STRATEGIES, Definition, decode_definition, fill_for
from .layer import DerivedLayer

__all__ = [
    "EXT_PREFIX",
    "STRATEGIES",
    "Definition",
    "DerivedLayer",
    "decode_definition",
    "fill_for",
]
