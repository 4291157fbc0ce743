"""The native block-indexed file format (engine ``native``)."""

from .engine import NativeEngine

__all__ = ["NativeEngine"]
