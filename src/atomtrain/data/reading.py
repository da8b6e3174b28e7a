"""Reading a data source, whatever it is: an extended XYZ file (or any file ASE reads)
or a memory-mapped directory. The one place that knows both readers, so that neither
imports the other; each is imported when a source needs it (ASE's readers take 0.5 s to
import, and a file read before comes from the data cache: remembered.py)."""

from __future__ import annotations

from pathlib import Path

from ..errors import DataError
from .columns import Frames
from .conventions import TargetKeys, Units
from .frames import FrameSet
from .remembered import read_remembered


def read_structures(
    path: str | Path, keys: TargetKeys | None = None, units: Units | None = None
) -> FrameSet:
    """Read every frame of an extended XYZ file (or a memmap directory) in angstrom and
    eV.

    Forces (stress) are read from every frame when ``keys.read_forces`` is True, when it
    is None and the first frame has them; a frame that lacks them then is an error.
    """
    path = Path(path)
    keys = keys or TargetKeys()
    units = units or Units()
    if path.is_dir():  # metatrain's memory-mapped layout
        if keys.weight is not None:
            raise DataError(
                f"{path}: per-structure weights (weight_key) cannot be read from a "
                "memory-mapped directory yet; give the section a weight instead"
            )
        from .memmap import read_directory

        return read_directory(path, keys, units)
    return FrameSet.whole(read_remembered(path, keys, units, lambda: parsed(path, keys, units)))


def parsed(path: Path, keys: TargetKeys, units: Units) -> Frames:
    """The file read by ASE's readers, imported only where the data cache lacks it."""
    from .extxyz import read_file

    return read_file(path, keys, units)
