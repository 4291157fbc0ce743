"""The metadata tree (groups, datasets, attributes, per-step block tables) and its encoding."""

from .blocks import BlockTable, Section, StepBlocks
from .model import (
    KIND_CLOSE,
    KIND_META,
    KIND_STEP,
    OP_ATTR,
    OP_DATASET,
    OP_DELATTR,
    OP_EXT,
    OP_GROUP,
    BlockCodec,
    BlockRecord,
    DatasetSpec,
    Stats,
    check_dtype,
    normalize_attr,
    normpath,
    parent,
    present_attr,
    subfile_name,
)
from .record import Record, decode_packed, pack
from .tree import Catalog
from .wire import Decoder, Encoder, load_json

__all__ = [
    "KIND_CLOSE",
    "KIND_META",
    "KIND_STEP",
    "OP_ATTR",
    "OP_DATASET",
    "OP_DELATTR",
    "OP_EXT",
    "OP_GROUP",
    "BlockCodec",
    "BlockRecord",
    "BlockTable",
    "Catalog",
    "DatasetSpec",
    "Decoder",
    "Encoder",
    "Record",
    "Section",
    "Stats",
    "StepBlocks",
    "check_dtype",
    "decode_packed",
    "load_json",
    "normalize_attr",
    "normpath",
    "pack",
    "parent",
    "present_attr",
    "subfile_name",
]
