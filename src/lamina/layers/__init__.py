"""Layers: engines that wrap an inner engine and change part of what it does.

Like HDF5 pass-through VOL connectors or LowFive's layered VOL, a layer
implements the engine interface, forwards what it does not change, and can
be stacked over any engine (native files, memory, the in situ transport).

* :class:`~lamina.layers.base.Layer` -- the forwarding base;
* :class:`~lamina.layers.derived.DerivedLayer` -- derived quantities
  (``File.derive``): computed at the end of a step and stored as data, as
  statistics only, or kept as the expression and computed when read;
* :class:`~lamina.layers.background.BackgroundLayer` -- background I/O
  (``lamina.open(io='async')``): steps are committed on a thread of their own.

The built-in layers are registered here (:mod:`lamina.engines.registry`):
``derived`` is in every stack unless ``lamina.open(layers=...)`` says
otherwise.
"""

from ..engines import registry
from .background import BackgroundLayer
from .base import Layer
from .derived import STRATEGIES, Definition, DerivedLayer

registry.register_layer(
    "derived",
    DerivedLayer,
    DerivedLayer.OPTIONS,
    default=True,
    description="derived quantities and the queries over them (docs/derived.md)",
)

registry.register_layer(
    registry.BACKGROUND_LAYER,
    BackgroundLayer,
    BackgroundLayer.OPTIONS,
    description="background I/O: end_step returns once the step is copied (io='async', docs/background.md)",
)

__all__ = ["BackgroundLayer", "Definition", "DerivedLayer", "Layer", "STRATEGIES"]
