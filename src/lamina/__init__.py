"""lamina: parallel I/O for simulations and their analyses.

>>> import lamina
>>> with lamina.open("run.lam", "w") as f:
...     t = f.create_dataset("fields/T", shape=(64, 64), dtype="f8")
...     with f.step():
...         t[0:32, :] = 1.0
"""

from .api import Attributes, Dataset, File, Group, StepView, open
from .engines.base import BlockInfo
from .errors import (
    BoundsError,
    ChecksumError,
    CodecError,
    CollectiveMismatchError,
    ConfigError,
    DeviceUnavailableError,
    DTypeError,
    ExistsError,
    ExpressionError,
    FormatError,
    LaminaError,
    LaminaWarning,
    LockError,
    ModeError,
    MPIStateError,
    NotALaminaFileError,
    NotFoundError,
    OverlapError,
    RangeError,
    RemoteError,
    SelectionError,
    ShapeError,
    StepError,
    StepTimeoutError,
    TransportError,
)
from .geometry import Box
from .layouts import Multires

__version__ = "0.1.0"

__all__ = [
    "Attributes",
    "BlockInfo",
    "BoundsError",
    "Box",
    "ChecksumError",
    "CodecError",
    "CollectiveMismatchError",
    "ConfigError",
    "DeviceUnavailableError",
    "DTypeError",
    "Dataset",
    "ExistsError",
    "ExpressionError",
    "File",
    "FormatError",
    "Group",
    "LaminaError",
    "LaminaWarning",
    "LockError",
    "Multires",
    "ModeError",
    "MPIStateError",
    "NotALaminaFileError",
    "NotFoundError",
    "OverlapError",
    "RangeError",
    "RemoteError",
    "SelectionError",
    "ShapeError",
    "StepError",
    "StepTimeoutError",
    "StepView",
    "TransportError",
    "open",
]
