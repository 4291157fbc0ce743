"""Layers: engines that wrap an inner engine and change part of what it does.

Like HDF5 pass-through VOL connectors or LowFive's layered VOL, a layer
implements the engine interface, forwards what it does not change, and can
be stacked over any engine (native files, memory, the in situ transport).

* :class:`~lamina.layers.base.Layer` -- the forwarding base;
* :class:`~lamina.layers.derived.DerivedLayer` -- derived quantities
  (``File.derive``): computed at the end of a step and stored as data, as
  statistics only, or kept as the expression and computed when read.

The built-in layers are registered here (:mod:`lamina.engines.registry`):
``derived`` is in every stack unless ``lamina.open(layers=...)`` says
otherwise.
"""

from ..engines import registry
from .base import Layer
from .derived import STRATEGIES, Definition, DerivedLayer

registry.register_layer(
    "derived",
    DerivedLayer,
    DerivedLayer.OPTIONS,
    default=True,
    description="derived quantities and the queries over them (docs/derived.md)",
)

__all__ = ["Definition", "DerivedLayer", "Layer", "STRATEGIES"]
