"""Reading structures, neighbor lists, batching, splitting and sampling."""

from .batch import Batch
from .extxyz import TargetKeys, Units, read_structures
from .frames import Frames, FrameSet, collate
from .system import Structure

__all__ = [
    "Batch",
    "FrameSet",
    "Frames",
    "Structure",
    "TargetKeys",
    "Units",
    "collate",
    "read_structures",
]
