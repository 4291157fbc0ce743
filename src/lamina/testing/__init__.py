"""Tests any lamina engine can run on itself (they need pytest, the ``test`` extra).

:class:`~lamina.testing.engines.EngineTests` is the behaviour every engine
must show, written as round trips (a writer program, then a reader program)
so that the same cases run in one process for file engines and as one MPMD
launch for the in situ transport, with any number of writer and reader
ranks.  An engine registered by another package (entry point
``lamina.engines``) runs them by subclassing it, as zarr's stores subclass
``zarr.testing.store.StoreTests``.
"""
