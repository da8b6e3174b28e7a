"""Data sets stored as metatrain's memory-mapped directory (its "memmap" layout):

- ``ns.npy``: the number of structures (metatrain's writer saves a 0-d array, its docs
  say shape (1,): both are read);
- ``na.npy``: cumulative atom counts, int64, ``ns + 1`` entries from 0;
- ``x.bin``: float32 positions (na[-1], 3); ``a.bin``: int32 atomic numbers (na[-1]);
- ``c.bin`` (optional): float32 cells (ns, 3, 3); a zero row is a non-periodic direction;
- ``<key>.bin`` per target, float32: energy (ns, 1), forces (na[-1], 3, 1), stress
  (ns, 3, 3, 1) in ASE's sign; keys and units as for a file.

A ``.bin`` is raw bytes, so its length is checked against the counts: a truncated
file or one from another data set is named before anything is read from it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DataError
from .columns import Frames, TargetColumn, cache_mapped_sources
from .conventions import SUSPECT_DISTANCE, TargetKeys, Units
from .extxyz import FrameReader
from .frames import FrameSet
from .layout import PAIRS_PREFIX, check_manifest

REQUIRED = ("ns.npy", "na.npy", "x.bin", "a.bin")


class MemmapDirectory:
    """The arrays of one directory, memory-mapped and checked for consistency."""

    def __init__(self, path: Path):
        self.path = path
        missing = [name for name in REQUIRED if not (path / name).is_file()]
        if missing:
            raise DataError(
                f"{path}: a data directory needs {', '.join(REQUIRED)} (metatrain's memmap "
                f"layout); {', '.join(missing)} missing"
            )
        try:
            self.count = int(np.load(path / "ns.npy").reshape(-1)[0])
            self.offsets = np.load(path / "na.npy")
        except (ValueError, OSError, IndexError) as error:
            raise DataError(
                f"{path}: ns.npy or na.npy is not a readable array ({error})"
            ) from error
        if self.offsets.dtype != np.int64 or self.offsets.shape != (self.count + 1,):
            raise DataError(
                f"{path / 'na.npy'}: expected {self.count + 1} int64 cumulative atom counts "
                f"(ns.npy says {self.count} structures), found {self.offsets.shape[0]} "
                f"{self.offsets.dtype} values"
            )
        if self.offsets[0] != 0 or np.any(np.diff(self.offsets) < 0):
            raise DataError(f"{path / 'na.npy'}: atom counts must start at 0 and never decrease")
        self.atoms = int(self.offsets[-1])
        self.manifest = check_manifest(path)
        self.positions = self.widest("x.bin", "atomtrain_x64.bin", (self.atoms, 3))
        self.numbers = self.array("a.bin", np.int32, (self.atoms,))
        self.cells = self.widest("c.bin", "atomtrain_c64.bin", (self.count, 3, 3))
        self.periodic = self.extra("atomtrain_pbc.bin", (self.count, 3))
        # which of energy, forces, stress each structure has (all, without the file)
        self.known = self.extra("atomtrain_known.bin", (self.count, 3))
        self.pair_counts = {
            float(file.name[len(PAIRS_PREFIX) : -len(".bin")]): self.array(
                file.name, np.int32, (self.count,)
            )
            for file in sorted(path.glob(f"{PAIRS_PREFIX}*.bin"))
        }

    def array(self, name: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
        """``name`` mapped as ``shape``, after checking that its size is exactly that."""
        file = self.path / name
        expected = int(np.prod(shape)) * np.dtype(dtype).itemsize
        size = file.stat().st_size
        if size != expected:
            raise DataError(
                f"{file}: {size} bytes, expected {expected} ({' x '.join(map(str, shape))} "
                f"{np.dtype(dtype).name} for {self.count} structures of {self.atoms} atoms "
                "in all); the file is truncated or belongs to another data set"
            )
        if expected == 0:
            return np.zeros(shape, dtype=dtype)
        return np.memmap(file, dtype=dtype, mode="r", shape=shape)

    def target(self, key: str, per_atom: bool, shape: tuple[int, ...]) -> np.ndarray | None:
        """The target ``key`` (None when its file is absent), in float64 where atomtrain
        wrote a float64 copy, else float32."""
        rows = self.atoms if per_atom else self.count
        return self.widest(f"{key}.bin", f"atomtrain_{key}64.bin", (rows, *shape))

    def widest(self, name: str, wide_name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        if (self.path / wide_name).is_file():
            return self.array(wide_name, np.float64, shape)
        if (self.path / name).is_file():
            return self.array(name, np.float32, shape)
        return None

    def extra(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """One of atomtrain's uint8 additions, as booleans (None when absent)."""
        if not (self.path / name).is_file():
            return None
        return self.array(name, np.uint8, shape) != 0


def read_directory(path: Path, keys: TargetKeys, units: Units) -> FrameSet:
    """The structures of a memmap directory, memory-mapped (values in angstrom and eV
    when read); a directory from another tool is checked first (see check_frames)."""
    frames, reader = open_directory(path, keys, units)
    if not reader.checked:
        check_frames(frames, reader, keys)
    return FrameSet.whole(frames)


def open_directory(path: Path, keys: TargetKeys, units: Units) -> tuple[Frames, FrameReader]:
    """A memmap directory's arrays, unchecked, and the reader that names its frames
    (``checked`` when atomtrain converted it and its files are unchanged)."""
    data = MemmapDirectory(path)
    # a directory atomtrain converted, unchanged since (checksums): its frames were
    # checked on the way in
    reader = FrameReader(path, keys, units, checked=data.manifest is not None)
    energies = data.target(keys.energy, False, (1,))
    if energies is None and keys.require_energy:
        raise DataError(
            f"{path}: no {keys.energy}.bin for the energy (key '{keys.energy}'); set the "
            "target's 'key' to the name of the file holding it"
        )
    forces = data.target(keys.forces, True, (3, 1)) if keys.read_forces is not False else None
    if forces is None and keys.read_forces:
        raise DataError(f"{path}: no {keys.forces}.bin for the forces; set 'forces: false'")
    stress = data.target(keys.stress, False, (3, 3, 1)) if keys.read_stress is not False else None
    if stress is None and keys.read_stress:
        raise DataError(f"{path}: no {keys.stress}.bin for the stress; set 'stress: false'")
    if reader.checked and (reader.length != 1.0 or reader.energy != 1.0):
        raise DataError(
            f"{path}: atomtrain convert stored this directory in angstrom and eV; leave "
            "length_unit and the energy unit at angstrom and eV when reading it"
        )
    count = data.count
    cells = data.cells if data.cells is not None else np.broadcast_to(np.zeros(3), (count, 3, 3))
    pbc = data.periodic if data.periodic is not None else np.any(cells != 0.0, axis=2)
    known = data.known if data.known is not None else np.ones((count, 3), dtype=bool)
    if energies is not None and not known[:, 0].all():
        index = int(np.argmin(known[:, 0]))
        raise reader.fail(index, f"no energy ({keys.energy}.bin marks it unknown)")
    frames = Frames(
        targets=other_targets(data, keys),
        source=str(path),
        offsets=data.offsets,
        positions=data.positions,
        numbers=data.numbers,
        cells=cells,
        pbc=pbc,
        energy=None if energies is None else energies[:, 0],
        forces=None if forces is None else forces[:, :, 0],
        stress=None if stress is None else stress[:, :, :, 0],
        energy_known=np.ones(count, dtype=bool) if energies is not None else np.zeros(count, bool),
        forces_known=known[:, 1].copy() if forces is not None else np.zeros(count, dtype=bool),
        stress_known=known[:, 2] & pbc.all(axis=1)
        if stress is not None
        else np.zeros(count, dtype=bool),
        length=reader.length,
        energy_unit=reader.energy,
        stored_pairs=data.pair_counts,
        cache_neighbors=cache_mapped_sources(),
    )
    return frames, reader


def other_targets(data: MemmapDirectory, keys: TargetKeys) -> dict[str, TargetColumn]:
    """The mtt:: targets of a directory: ``<key>.bin``, float32 (ns or na, *components,
    subtargets) as metatrain writes them, every structure's known."""
    columns = {}
    for spec in keys.others + keys.extra:
        values = data.target(spec.key, spec.per_atom, (spec.width,))
        if values is None:
            raise DataError(
                f"{data.path}: no {spec.key}.bin for target {spec.name}; set the target's "
                "'key' to the name of the file holding it"
            )
        if spec in keys.others:  # extra data is checked, not kept
            known = np.ones(data.count, dtype=bool)
            columns[spec.name] = TargetColumn(values, known, spec.per_atom)
    return columns


def check_frames(
    frames: Frames, reader: FrameReader, keys: TargetKeys, start: int = 0, stop: int | None = None
) -> None:
    """What a directory from another tool is checked for before training (structures
    ``start`` to ``stop``): finite values (vectorised, a chunk of rows at a time) and
    atoms on top of each other (see distance_candidates; no structure kept)."""
    stop = len(frames) if stop is None else stop
    first_atom, last_atom = int(frames.offsets[start]), int(frames.offsets[stop])
    per_atom = [("positions (x.bin)", frames.positions)]
    if frames.forces is not None:
        per_atom.append((f"forces ({keys.forces}.bin)", frames.forces))
    for name, values in per_atom:
        row = first_non_finite(values[first_atom:last_atom])
        if row is not None:
            index = int(np.searchsorted(frames.offsets, first_atom + row, side="right")) - 1
            raise reader.fail(index, f"{name} contains NaN or infinite values")
    per_structure = []
    if frames.energy is not None:
        per_structure.append((f"energy ({keys.energy}.bin)", frames.energy))
    if frames.stress is not None:
        per_structure.append((f"stress ({keys.stress}.bin)", frames.stress))
    for name, column in frames.targets.items():
        if column.per_atom:
            per_atom_rows = column.values[first_atom:last_atom]
            row = first_non_finite(per_atom_rows)
            if row is not None:
                index = int(np.searchsorted(frames.offsets, first_atom + row, side="right")) - 1
                raise reader.fail(index, f"target {name} contains NaN or infinite values")
        else:
            per_structure.append((f"target {name}", column.values))
    for name, values in per_structure:
        index = first_non_finite(values[start:stop])
        if index is not None:
            raise reader.fail(start + index, f"{name} contains NaN or infinite values")
    for index in distance_candidates(frames, start, stop):
        reader.check_distances(
            index, frames.positions_of(index), frames.cell_of(index), frames.pbc[index]
        )
    reader.report_close_pairs()


# Molecules of up to this many atoms are screened for close atoms all pairs at once
# (numpy, a chunk of same-sized molecules at a time): 1M ethanol molecules in about a
# second instead of a neighbor search per molecule.
SCREENED_ATOMS = 48
SCREENED_PAIRS_PER_CHUNK = 1 << 20


def distance_candidates(frames: Frames, start: int = 0, stop: int | None = None) -> np.ndarray:
    """The structures (of ``start`` to ``stop``) that need the per-frame check of close
    atoms, in order: periodic and large ones, and small molecules with a pair closer
    than SUSPECT_DISTANCE (with a margin for float32 positions); small molecules without
    such a pair pass."""
    stop = len(frames) if stop is None else stop
    counts = np.zeros(len(frames), dtype=np.int64)
    counts[start:stop] = np.diff(frames.offsets[start : stop + 1])
    screened = ~frames.pbc.any(axis=1) & (counts <= SCREENED_ATOMS) & (counts > 1)
    flagged = [np.flatnonzero(~screened & (counts > 1))]
    for size in np.unique(counts[screened]):
        first, second = np.triu_indices(int(size), 1)
        molecules = np.flatnonzero(screened & (counts == size))
        step = max(1, SCREENED_PAIRS_PER_CHUNK // len(first))
        for begin in range(0, len(molecules), step):
            chunk = molecules[begin : begin + step]
            atoms = frames.offsets[chunk][:, None] + np.arange(size)
            positions = np.asarray(frames.positions[atoms.reshape(-1)], dtype=np.float64)
            positions = positions.reshape(len(chunk), int(size), 3) * frames.length
            gaps = positions[:, first] - positions[:, second]
            closest = np.sqrt(np.min(np.einsum("mpx,mpx->mp", gaps, gaps), axis=1))
            flagged.append(chunk[closest < SUSPECT_DISTANCE * 1.001])
    return np.sort(np.concatenate(flagged))


def first_non_finite(values: np.ndarray, rows: int = 1 << 20) -> int | None:
    """The first row of ``values`` holding NaN or an infinity, reading a chunk at a time."""
    for start in range(0, values.shape[0], rows):
        chunk = np.asarray(values[start : start + rows])
        finite = np.isfinite(chunk).reshape(chunk.shape[0], -1).all(axis=1)
        if not finite.all():
            return start + int(np.argmin(finite))
    return None
