"""The metadata tree (groups, datasets, attributes, per-step block records) and its encoding."""

from .model import (
    KIND_CLOSE,
    KIND_META,
    KIND_STEP,
    OP_ATTR,
    OP_DATASET,
    OP_DELATTR,
    OP_EXT,
    OP_GROUP,
    BlockRecord,
    Catalog,
    DatasetSpec,
    Record,
    Stats,
    check_dtype,
    normalize_attr,
    normpath,
    parent,
    present_attr,
    subfile_name,
)
from .wire import Decoder, Encoder

__all__ = [
    "KIND_CLOSE", "KIND_META", "KIND_STEP", "OP_ATTR", "OP_DATASET", "OP_DELATTR", "OP_EXT",
    "OP_GROUP", "BlockRecord", "Catalog", "DatasetSpec", "Decoder", "Encoder", "Record", "Stats",
    "check_dtype", "normalize_attr", "normpath", "parent", "present_attr", "subfile_name",
]
