"""Reading structures, neighbor lists, batching, splitting and sampling."""

from .batch import Batch
from .conventions import TargetKeys, Units
from .frames import Frames, FrameSet, collate
from .reading import read_structures
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
