"""How a dataset becomes blocks: the multiresolution layout (plain datasets need no code here).

A layout is a property of a dataset definition, kept in the catalog with
it.  The block engines call :mod:`.write` at the end of a step to turn
what ranks wrote into blocks, and :mod:`.read` to answer reads; what
lies between (steps, commits, checksums, statistics, subfiles) is the
engine's, the same for every layout.
"""

from .spec import LEVEL, MULTIRES, Layout, Multires, level_specs

__all__ = ["LEVEL", "MULTIRES", "Layout", "Multires", "level_specs"]
