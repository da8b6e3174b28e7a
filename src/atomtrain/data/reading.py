"""Reading a data source, whatever it is: an extended XYZ file (or any file ASE reads)
or a memory-mapped directory. The one place that knows both readers, so that neither
imports the other."""

from __future__ import annotations

from pathlib import Path

from ..errors import DataError
from .extxyz import FrameReader, TargetKeys, Units, read_frames, targets_wanted
from .frames import FrameSet, frames_from_structures
from .memmap import read_directory


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
    if path.is_dir():  # metatrain's memory-mapped layout
        if keys.weight is not None:
            raise DataError(
                f"{path}: per-structure weights (weight_key) cannot be read from a "
                "memory-mapped directory yet; give the section a weight instead"
            )

        return read_directory(path, keys, units or Units())
    reader = FrameReader(path, keys, units or Units())
    frames = read_frames(path)
    forces, stress = targets_wanted(frames[0], keys)
    structures = [
        reader.structure(index, atoms, forces, stress) for index, atoms in enumerate(frames)
    ]
    reader.report_close_pairs()
    return FrameSet.whole(frames_from_structures(str(path), structures))
