"""Reading structures through ASE (extended XYZ, or any format ASE reads with energies
and forces: trajectories, databases, VASP output, ...), with configurable keys and units."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import ase
import ase.io
import ase.io.extxyz
import ase.io.formats
import ase.units
import numpy as np
import vesin

from ..errors import DataError
from ..targets import TargetSpec
from ..units import unit_factor
from .columns import Frames, StructureValues, frames_from_values
from .conventions import MINIMUM_DISTANCE, SUSPECT_DISTANCE, TargetKeys, Units

logger = logging.getLogger(__name__)

# vesin bins space into cells of the search radius: at 0.5 A a 64-atom periodic cell
# has thousands of empty bins (0.5 ms per frame, as long as reading it); at 2 A it takes
# 0.1 ms and still finds few pairs, which are then filtered by distance.
SEARCH_RADIUS = 2.0


def close_pairs(
    positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, second, distance) of the pairs of atoms closer than ``cutoff``."""
    calculator = vesin.NeighborList(cutoff=max(cutoff, SEARCH_RADIUS), full_list=False)
    box = cell if bool(np.any(pbc)) else np.zeros((3, 3))
    first, second, distances = calculator.compute(
        points=positions,
        box=np.ascontiguousarray(box),
        periodic=[bool(p) for p in pbc],
        quantities="ijd",
        copy=True,
    )
    close = distances < cutoff
    return first[close], second[close], distances[close]


def _lookup(atoms: ase.Atoms, key: str, per_atom: bool):
    """A value from atoms.info / atoms.arrays, or from ASE's stored calculator results."""
    source = atoms.arrays if per_atom else atoms.info
    if key in source:
        return np.asarray(source[key], dtype=np.float64)
    if atoms.calc is not None and key in atoms.calc.results:
        return np.asarray(atoms.calc.results[key], dtype=np.float64)
    return None


def _present_keys(atoms: ase.Atoms) -> str:
    keys = sorted(set(atoms.info) | (set(atoms.arrays) - {"numbers", "positions"}))
    if atoms.calc is not None:
        keys += sorted(atoms.calc.results)
    return ", ".join(keys) if keys else "none"


def _to_matrix(stress: np.ndarray) -> np.ndarray | None:
    if stress.size == 9:
        return stress.reshape(3, 3)
    if stress.size == 6:  # Voigt order xx yy zz yz xz xy, as ASE stores it
        xx, yy, zz, yz, xz, xy = stress.reshape(6)
        return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    return None


def file_format(path: Path) -> str:
    """The format ASE recognises ``path`` by (name and content: an ASE trajectory or
    database, VASP output, ...), extended XYZ when it recognises none it can read."""
    try:
        name = ase.io.formats.filetype(str(path), read=True, guess=True)
    except Exception:  # ASE raises several types for files it cannot place
        return "extxyz"
    known = ase.io.formats.ioformats.get(name)
    return name if known is not None and known.can_read else "extxyz"


def read_frames(path: Path) -> list[ase.Atoms]:
    if not path.exists():
        raise DataError(f"{path}: data file not found; check its path")
    kind = file_format(path)
    try:
        frames = ase.io.read(path, index=":", format=kind)
    except Exception as error:  # ASE raises many types for malformed files
        raise DataError(unreadable(path, kind, error, failing_frame(path, kind))) from error
    if not frames:
        raise DataError(f"{path}: the file holds no structure")
    return frames


def failing_frame(path: Path, kind: str) -> int | None:
    """The index of the first frame ASE cannot read, or None if it reads them all."""
    index = 0
    try:
        for _ in ase.io.iread(path, index=":", format=kind):
            index += 1
    except Exception:
        return index
    return None


def unreadable(path: Path, kind: str, error: Exception, frame: int | None) -> str:
    """What is said of a file ASE cannot read: the frame, and for XYZ files its lines
    and a truncated frame told as such (ASE says 'generator raised StopIteration')."""
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    described = "extended XYZ" if kind == "extxyz" else f"ASE format '{kind}'"
    if frame is None:
        return f"{path}: cannot read as {described} ({message})"
    where = f"{path}, frame {frame}"
    lines = xyz_frame_lines(path, frame) if kind == "extxyz" else None
    if lines is None:
        return f"{where}: cannot read as {described} ({message})"
    first, last, announced = lines
    if last - first < announced + 1:
        return (
            f"{where} (line {first}): the file ends inside this frame, whose first line "
            f"announces {announced} atoms; complete the frame or remove it"
        )
    quoted = re.search(r"'([^']+)'", message)  # the value ASE could not convert
    line = token_line(path, first, last, quoted.group(1)) if quoted else None
    place = f"line {line}" if line is not None else f"lines {first}-{last}"
    return f"{where} ({place}): cannot read as {described} ({message})"


def token_line(path: Path, first: int, last: int, token: str) -> int | None:
    """The first of lines ``first`` to ``last`` (from 1) holding ``token`` as a word."""
    with open(path, errors="replace") as stream:
        for number, text in enumerate(stream, start=1):
            if number > last:
                break
            if number >= first and token in text.split():
                return number
    return None


def xyz_frame_lines(path: Path, frame: int) -> tuple[int, int, int] | None:
    """(first line, last line, atoms its count line announces) of frame ``frame`` of an
    XYZ file, lines counted from 1; None where its count lines do not lead there."""
    number = 0
    with open(path, errors="replace") as stream:
        for _ in range(frame + 1):
            header = stream.readline()
            number += 1
            try:
                announced = int(header.split()[0])
            except (IndexError, ValueError):
                return None
            first = number
            for _ in range(announced + 1):
                if not stream.readline():
                    break
                number += 1
    return first, number, announced


class FrameReader:
    def __init__(self, path: Path, keys: TargetKeys, units: Units, checked: bool = False):
        """``checked``: the frames passed these checks already (a directory atomtrain
        convert wrote, its checksums unchanged), so check_finite and check_distances,
        which would take minutes on a million frames, pass at once."""
        self.path = path
        self.checked = checked
        self.keys = keys
        self.length = unit_factor(units.length, "length")
        self.energy = unit_factor(units.energy, "energy")
        self.close_frame: tuple[int, int, int, float] | None = None  # the first suspect
        self.close_count = 0

    def fail(self, index: int, message: str) -> DataError:
        return DataError(f"{self.path}, frame {index}: {message}")

    def check_finite(self, index: int, name: str, value: np.ndarray) -> None:
        if not self.checked and not np.all(np.isfinite(value)):
            raise self.fail(index, f"{name} contains NaN or infinite values")

    def check_distances(
        self, index: int, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray
    ) -> None:
        """Atoms on top of each other make the descriptors undefined (NaN): refuse them,
        naming both; note pairs closer than any bond, which train but are suspect."""
        if self.checked:
            return
        first, second, distances = close_pairs(positions, cell, pbc, SUSPECT_DISTANCE)
        if distances.size == 0:
            return
        closest = int(np.argmin(distances))
        i, j, distance = int(first[closest]), int(second[closest]), float(distances[closest])
        if distance < MINIMUM_DISTANCE:
            raise self.fail(
                index,
                f"atoms {i} and {j} are {distance:.3g} A apart (under {MINIMUM_DISTANCE} A: "
                "the same atom twice?); remove or fix this structure",
            )
        if self.close_frame is None:
            self.close_frame = (index, i, j, distance)
        self.close_count += 1

    def report_close_pairs(self) -> None:
        if self.close_frame is None:
            return
        index, i, j, distance = self.close_frame
        logger.warning(
            f"{self.path}: {self.close_count} structure(s) have atoms closer than "
            f"{SUSPECT_DISTANCE} A (first: frame {index}, atoms {i} and {j}, {distance:.3g} "
            "A apart); they are used, but check that they are meant"
        )

    def other_target_of(self, index: int, atoms: ase.Atoms, spec: TargetSpec) -> np.ndarray:
        """An mtt:: target's values, [width] (or [atoms, width] per atom), as metatrain's
        ASE reader reshapes them: any array of the right size, row-major."""
        value = _lookup(atoms, spec.key, per_atom=spec.per_atom)
        where = "per-atom arrays" if spec.per_atom else "info"
        if value is None:
            elsewhere = _lookup(atoms, spec.key, per_atom=not spec.per_atom) is not None
            hint = (
                f"it is in the frame's {'info' if spec.per_atom else 'per-atom arrays'}: set "
                f"per_atom: {str(not spec.per_atom).lower()}"
                if elsewhere
                else f"keys present: {_present_keys(atoms)}. Set the target's 'key' to one of them"
            )
            raise self.fail(
                index, f"no '{spec.key}' in the frame's {where} for {spec.name}; {hint}"
            )
        if spec.symmetric and value.size == 6 and not spec.per_atom:
            value = _to_matrix(value)  # a stress in Voigt's order, as ASE writes it
        expected = ((len(atoms),) if spec.per_atom else ()) + spec.shape_in_file()
        if value.size != int(np.prod(expected)):
            kind = f"{spec.kind} rank {spec.rank}" if spec.kind == "cartesian" else spec.kind
            raise self.fail(
                index,
                f"target {spec.name} ('{spec.key}') has shape {value.shape}, expected "
                f"{expected} ({kind}, {spec.num_subtargets} subtarget(s)"
                f"{', per atom' if spec.per_atom else ''}); fix the data or the target's type",
            )
        self.check_finite(index, f"target {spec.name} ('{spec.key}')", value)
        shape = (len(atoms), spec.width) if spec.per_atom else (spec.width,)
        return np.ascontiguousarray(value.reshape(shape))

    def weight_of(self, index: int, atoms: ase.Atoms) -> float | None:
        if self.keys.weight is None:
            return None
        value = _lookup(atoms, self.keys.weight, per_atom=False)
        if value is None or value.size != 1:
            found = "no" if value is None else f"{value.size} values for the"
            raise self.fail(
                index,
                f"{found} weight under key '{self.keys.weight}' (weight_key); keys present: "
                f"{_present_keys(atoms)}. Give every frame one number, or unset weight_key",
            )
        weight = float(value.reshape(()))
        if not weight >= 0:
            raise self.fail(index, f"weight '{self.keys.weight}' is {weight}: give 0 or more")
        return weight

    def energy_of(self, index: int, atoms: ase.Atoms) -> float | None:
        if not self.keys.read_energy:
            return None
        value = _lookup(atoms, self.keys.energy, per_atom=False)
        if value is None:
            if self.keys.require_energy:
                raise self.fail(
                    index,
                    f"no energy under key '{self.keys.energy}'; keys present: "
                    f"{_present_keys(atoms)}. Set the target's 'key' to one of them",
                )
            return None
        if value.size != 1:
            raise self.fail(index, f"energy '{self.keys.energy}' is not a single number")
        self.check_finite(index, f"energy '{self.keys.energy}'", value)
        return float(value.reshape(())) * self.energy

    def forces_of(self, index: int, atoms: ase.Atoms, wanted: bool) -> np.ndarray | None:
        value = _lookup(atoms, self.keys.forces, per_atom=True)
        if value is None:
            if wanted:
                raise self.fail(
                    index,
                    f"no forces under key '{self.keys.forces}'; keys present: "
                    f"{_present_keys(atoms)}. Set 'forces' to the right key, or to false "
                    "to train on energies only",
                )
            return None
        if value.shape != (len(atoms), 3):
            raise self.fail(
                index,
                f"forces '{self.keys.forces}' have shape {value.shape}, expected ({len(atoms)}, 3)",
            )
        self.check_finite(index, f"forces '{self.keys.forces}'", value)
        return value * self.energy / self.length

    def stress_of(self, index: int, atoms: ase.Atoms, wanted: bool) -> np.ndarray | None:
        stress = _lookup(atoms, self.keys.stress, per_atom=False)
        virial = _lookup(atoms, self.keys.virial, per_atom=False)
        if stress is None and virial is None:
            if wanted:
                raise self.fail(
                    index,
                    f"no stress under key '{self.keys.stress}' nor virial under key "
                    f"'{self.keys.virial}'; keys present: {_present_keys(atoms)}. Set 'stress' "
                    "(or 'virial') to the right key, or to false to train without stress",
                )
            return None
        if not atoms.pbc.all():
            raise self.fail(index, "stress is only defined for fully periodic structures")
        name = self.keys.stress if stress is not None else self.keys.virial
        matrix = _to_matrix(stress if stress is not None else virial)
        if matrix is None:
            raise self.fail(index, f"'{name}' must hold 6 (Voigt) or 9 values")
        self.check_finite(index, f"'{name}'", matrix)
        if stress is None:
            matrix = -matrix / atoms.get_volume()
        else:
            matrix = matrix * self.energy / self.length**3
        return matrix

    def values(self, index: int, atoms: ase.Atoms, forces: bool, stress: bool) -> StructureValues:
        positions = np.asarray(atoms.positions, dtype=np.float64) * self.length
        self.check_finite(index, "positions", positions)
        cell = np.asarray(atoms.cell.array, dtype=np.float64) * self.length
        if atoms.pbc.any() and abs(np.linalg.det(cell)) < 1e-6:
            raise self.fail(
                index,
                "the structure is periodic but its cell has zero volume; "
                'give a Lattice or set pbc="F F F"',
            )
        self.check_distances(index, positions, cell, np.asarray(atoms.pbc, dtype=bool))
        for spec in self.keys.extra:
            self.other_target_of(index, atoms, spec)
        return StructureValues(
            positions=positions,
            atomic_numbers=atoms.numbers.astype(np.int64),
            cell=cell,
            pbc=np.asarray(atoms.pbc, dtype=bool),
            energy=self.energy_of(index, atoms),
            forces=self.forces_of(index, atoms, forces) if forces else None,
            stress=self.stress_of(index, atoms, stress) if stress else None,
            targets={
                spec.name: self.other_target_of(index, atoms, spec) for spec in self.keys.others
            },
            weight=self.weight_of(index, atoms),
        )


def read_file(path: Path, keys: TargetKeys, units: Units) -> Frames:
    """Every frame of ``path`` (any file ASE reads), checked, as columns."""
    reader = FrameReader(path, keys, units)
    frames = read_frames(path)
    forces, stress = targets_wanted(frames[0], keys)
    structures = [reader.values(index, atoms, forces, stress) for index, atoms in enumerate(frames)]
    reader.report_close_pairs()
    return frames_from_values(str(path), structures)


def targets_wanted(first: ase.Atoms, keys: TargetKeys) -> tuple[bool, bool]:
    """Whether forces and stress are read from every frame: as ``keys`` says, or, where
    it leaves the choice, when the first frame has them."""
    forces = keys.read_forces
    if forces is None:
        forces = _lookup(first, keys.forces, per_atom=True) is not None
    stress = keys.read_stress
    if stress is None:
        stress = (
            _lookup(first, keys.stress, per_atom=False) is not None
            or _lookup(first, keys.virial, per_atom=False) is not None
        )
    return forces, stress


def iterate_frames(
    path: Path, start: int = 0, stop: int | None = None, chunk_offsets: np.ndarray | None = None
) -> Iterator[ase.Atoms]:
    """Frames ``start`` to ``stop`` of ``path`` one at a time (constant memory), with
    read_frames' errors. ``chunk_offsets``: an extended XYZ file's chunk offsets (see
    :func:`extxyz_chunks`), which let a share of the file be read without scanning what
    comes before it; ``stop`` is then required."""
    if not path.exists():
        raise DataError(f"{path}: data file not found; check the path")
    kind = file_format(path)
    if chunk_offsets is None:
        frames = ase.io.iread(path, index=slice(start, stop), format=kind)
    else:
        assert stop is not None, "reading by chunk offsets needs the last frame"
        frames = extxyz_chunks(path, start, stop, chunk_offsets)
    index = start
    while True:
        try:
            atoms = next(frames)
        except StopIteration:
            break
        except Exception as error:  # ASE raises many types for malformed files
            raise DataError(unreadable(path, kind, error, index)) from error
        yield atoms
        index += 1
    if index == 0 and start == 0:
        raise DataError(f"{path}: the file holds no structure")


# A survey of an extended XYZ file records the byte offset of every FRAMES_PER_CHUNK-th
# frame: 8 bytes per 64 frames, and a share of the file parses at most 63 frames it
# does not keep at each end.
FRAMES_PER_CHUNK = 64


def extxyz_chunks(
    path: Path, start: int, stop: int, chunk_offsets: np.ndarray
) -> Iterator[ase.Atoms]:
    """Frames ``start`` to ``stop`` of an extended XYZ file, one chunk of frames read and
    parsed at a time. ``chunk_offsets[k]`` is the byte offset of frame k *
    FRAMES_PER_CHUNK, its last entry the end of the last frame. ASE's own reader would
    index every frame before ``stop`` first (a readline and a tell() per line), so the
    process converting the end of a file would scan all of it."""
    with open(path, "rb") as stream:
        for chunk in range(start // FRAMES_PER_CHUNK, -(-stop // FRAMES_PER_CHUNK)):
            first = chunk * FRAMES_PER_CHUNK
            stream.seek(int(chunk_offsets[chunk]))
            size = int(chunk_offsets[chunk + 1] - chunk_offsets[chunk])
            text = io.StringIO(stream.read(size).decode())
            wanted = slice(max(start - first, 0), min(stop - first, FRAMES_PER_CHUNK))
            count = 0
            for atoms in ase.io.extxyz.read_xyz(text, index=wanted):
                count += 1
                yield atoms
            if count < wanted.stop - wanted.start:
                raise ValueError("a blank line between frames ends the file early; remove it")
