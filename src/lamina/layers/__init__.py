"""Layers: engines that wrap an inner engine and change part of what it does.

Like HDF5 pass-through VOL connectors or LowFive's layered VOL, a layer
implements the engine interface, forwards what it does not change, and can
be stacked over any engine (native files, memory).

* :class:`~lamina.layers.base.Layer` -- the forwarding base;
* :class:`~lamina.layers.derived.DerivedLayer` -- derived quantities
  (``File.derive``): computed at the end of a step and stored as data, as
  statistics only, or kept as the expression and computed when read.
"""

from .base import Layer
from .derived import STRATEGIES, Definition, DerivedLayer

__all__ = ["Definition", "DerivedLayer", "Layer", "STRATEGIES"]
