"""Engines: one module or package per way of moving bytes, all implementing :mod:`.base`."""

from .base import BlockInfo, Engine, engine_names, get_engine_class, register

__all__ = ["BlockInfo", "Engine", "engine_names", "get_engine_class", "register"]
