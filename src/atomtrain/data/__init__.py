"""Reading structures, neighbor lists, batching, splitting and sampling."""

from .batch import Batch, collate
from .extxyz import TargetKeys, Units, read_structures
from .system import Structure

__all__ = ["Batch", "Structure", "TargetKeys", "Units", "collate", "read_structures"]
