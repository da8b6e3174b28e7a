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
import torch

from ..errors import DataError
from .convert import check_manifest
from .extxyz import FrameReader, TargetKeys, Units
from .system import Structure

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


def read_directory(path: Path, keys: TargetKeys, units: Units) -> list[Structure]:
    """Every structure of a memmap directory, in angstrom and eV."""
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
    structures = []
    for index in range(data.count):
        start, end = int(data.offsets[index]), int(data.offsets[index + 1])
        positions = data.positions[start:end].astype(np.float64) * reader.length
        cell = (
            data.cells[index].astype(np.float64) * reader.length
            if data.cells is not None
            else np.zeros((3, 3))
        )
        pbc = data.periodic[index] if data.periodic is not None else np.any(cell != 0.0, axis=1)
        known = data.known[index] if data.known is not None else (True, True, True)
        reader.check_finite(index, "positions (x.bin)", positions)
        reader.check_distances(index, positions, cell, pbc)
        structure = Structure(
            positions=torch.from_numpy(positions),
            atomic_numbers=torch.from_numpy(data.numbers[start:end].astype(np.int64)),
            cell=torch.from_numpy(cell),
            pbc=torch.from_numpy(pbc),
        )
        if energies is not None and not known[0]:
            raise reader.fail(index, f"no energy ({keys.energy}.bin marks it unknown)")
        if energies is not None:
            energy = energies[index].astype(np.float64)
            reader.check_finite(index, f"energy ({keys.energy}.bin)", energy)
            structure.energy = float(energy[0]) * reader.energy
        if forces is not None and known[1]:
            values = forces[start:end, :, 0].astype(np.float64)
            reader.check_finite(index, f"forces ({keys.forces}.bin)", values)
            structure.forces = torch.from_numpy(values * reader.energy / reader.length)
        if stress is not None and known[2] and pbc.all():
            values = stress[index, :, :, 0].astype(np.float64)
            reader.check_finite(index, f"stress ({keys.stress}.bin)", values)
            structure.stress = torch.from_numpy(values * reader.energy / reader.length**3)
        structures.append(structure)
    reader.report_close_pairs()
    return structures
