"""What a data file's reader is told and holds to, without the readers (ASE's import
takes half a second, and a data set read before is not read again: see remembered.py):
where the targets live in a file (TargetKeys), its units (Units), and the distances
between atoms that reading refuses or notes."""

from __future__ import annotations

from dataclasses import dataclass

from ..targets import TargetSpec

# Closer than this, two atoms are the same atom twice (a bad merge or conversion): the
# shortest bond, H2's, is 0.74 A. Closer than SUSPECT_DISTANCE is rare outside
# high-energy collisions, and worth a note.
MINIMUM_DISTANCE = 0.1
SUSPECT_DISTANCE = 0.5


@dataclass(frozen=True)
class Units:
    """Units of a data file; values are converted to angstrom and eV when read."""

    length: str = "angstrom"
    energy: str = "eV"


@dataclass(frozen=True)
class TargetKeys:
    """Where targets live in the file. ``None`` means "use when present" for forces and
    stress, True/False force the choice; energy is required when ``require_energy``."""

    energy: str = "energy"
    forces: str = "forces"
    stress: str = "stress"
    virial: str = "virial"
    read_forces: bool | None = None
    read_stress: bool | None = None
    require_energy: bool = True
    read_energy: bool = True  # False: the section has no energy target (mtt:: ones only)
    others: tuple[TargetSpec, ...] = ()  # mtt:: targets, read from every frame
    # metatrain's extra data: checked in every frame as targets are, and not kept
    extra: tuple[TargetSpec, ...] = ()
    weight: str | None = None  # a per-structure loss weight in each frame's info
