"""The h5py-like parallel API: File, Group, Dataset, Attributes, selections."""

from .attrs import Attributes
from .dataset import Dataset
from .file import File, StepView, open
from .group import Group

__all__ = ["Attributes", "Dataset", "File", "Group", "StepView", "open"]
