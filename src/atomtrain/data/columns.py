"""One source's structures as columns of numpy arrays (:class:`Frames`), and one
structure's values as a reader gives them (:class:`StructureValues`). Nothing here
imports torch, so that a file can be read into columns by a process that does not
import it (data/ahead.py, alongside the command's own import of torch); building a
structure's tensors or its neighbor list imports what they need when asked.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import DataError, OptionsError

if TYPE_CHECKING:
    from .system import NeighborList, Structure

# atoms read at a time when a whole source is scanned (4 MB of int32)
ATOMS_PER_CHUNK = 1 << 20
CACHE_VARIABLE = "ATOMTRAIN_NEIGHBOR_CACHE_MB"


class NeighborCache:
    """Neighbor lists kept between epochs, up to a memory budget per process. A small
    data set is computed once; beyond the budget, lists are computed again for each
    batch (off the critical path when ``num_workers`` build batches ahead).

    Memory-mapped sources are not cached unless ``ATOMTRAIN_NEIGHBOR_CACHE_MB`` is set:
    their memory must not grow with the data (a 64-atom periodic cell's lists weigh
    some 27 kB), and a batch's lists cost 5-10 % of a step on a CPU
    (docs/performance-notes.md, "Large data sets")."""

    def __init__(self):
        self.used = 0
        self._budget: int | None = None

    @property
    def budget(self) -> int:
        """Bytes, read from the environment on first use (a bad value is then named in
        one line, not a traceback at import)."""
        if self._budget is None:
            self._budget = budget_from_environment()
        return self._budget

    def admit(self, neighbors: NeighborList) -> bool:
        size = 20 * int(neighbors.first.shape[0]) + 400  # three int32 tensors and their objects
        if self.used + size > self.budget:
            return False
        self.used += size
        return True


def budget_from_environment() -> int:
    text = os.environ.get(CACHE_VARIABLE, "1024")
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = -1.0
    if not megabytes >= 0:
        raise OptionsError(
            f"{CACHE_VARIABLE}={text}: give the neighbor-list cache's size in megabytes per "
            "process (0 keeps none)"
        )
    return int(megabytes * 2**20)


def check_cache_setting() -> None:
    """Name a bad cache size before a run starts rather than at its first batch."""
    NEIGHBOR_CACHE.budget  # noqa: B018 (read for its check)


def cache_mapped_sources() -> bool:
    """Whether memory-mapped sources keep their lists too: only when asked."""
    return CACHE_VARIABLE in os.environ


NEIGHBOR_CACHE = NeighborCache()


@dataclass
class TargetColumn:
    """One mtt:: target of a source: values [n, width] (per structure) or [atoms, width]
    (per atom, rows as the positions'), zeros where unknown, and which structures have
    it. No unit conversion: the values are used as the file gives them."""

    values: np.ndarray
    known: np.ndarray  # [n] bool
    per_atom: bool

    def of(self, frames: Frames, index: int) -> np.ndarray:
        """Structure ``index``'s values, [width] or [its atoms, width], in float64."""
        if self.per_atom:
            start, end = int(frames.offsets[index]), int(frames.offsets[index + 1])
            return np.asarray(self.values[start:end], dtype=np.float64)
        return np.asarray(self.values[index], dtype=np.float64)


@dataclass
class Frames:
    """The structures of one source as columns. Arrays may be memory maps in another
    precision or in the file's units: ``length`` and ``energy_unit`` convert to angstrom
    and eV when values are read.

    ``energy`` holds NaN where a structure has no energy (``energy_known`` False);
    forces and stress are zeros where unknown.
    """

    source: str
    offsets: np.ndarray  # [n + 1] int64, cumulative atom counts from 0
    positions: np.ndarray  # [atoms, 3]
    numbers: np.ndarray  # [atoms] integer
    cells: np.ndarray  # [n, 3, 3], rows are lattice vectors
    pbc: np.ndarray  # [n, 3] bool
    energy: np.ndarray | None  # [n]
    forces: np.ndarray | None  # [atoms, 3]
    stress: np.ndarray | None  # [n, 3, 3], ASE's sign
    energy_known: np.ndarray  # [n] bool
    forces_known: np.ndarray  # [n] bool
    stress_known: np.ndarray  # [n] bool
    length: float = 1.0
    energy_unit: float = 1.0
    # neighbor pairs (full list) per structure, by cutoff, as atomtrain convert stored them
    stored_pairs: dict[float, np.ndarray] = field(default_factory=dict)
    cache_neighbors: bool = True  # keep neighbor lists between epochs (NeighborCache)
    neighbor_lists: dict[tuple[float, int], NeighborList] = field(default_factory=dict, repr=False)
    element_set: set[int] | None = field(default=None, repr=False)  # see elements()
    targets: dict[str, TargetColumn] = field(default_factory=dict)  # mtt:: targets
    # which energy its energies are ("energy" or "energy/<variant>"), and that energy's
    # position in the model's list (set by whoever runs the model on it)
    energy_name: str = "energy"
    energy_variant: int = 0
    weights: np.ndarray | None = None  # [n] loss weights, when not all 1

    def elements(self) -> set[int]:
        """The atomic numbers in this source, counted once, a chunk of atoms at a time."""
        if self.element_set is None:
            counts = np.zeros(119, dtype=np.int64)
            for start in range(0, len(self.numbers), ATOMS_PER_CHUNK):
                numbers = np.asarray(self.numbers[start : start + ATOMS_PER_CHUNK])
                if numbers.size and (numbers.min() < 1 or numbers.max() > 118):
                    wrong = int(numbers[(numbers < 1) | (numbers > 118)][0])
                    raise DataError(
                        f"{self.source}: atomic number {wrong} is not an element (1 to 118)"
                    )
                counts += np.bincount(numbers, minlength=119)
            self.element_set = set(np.flatnonzero(counts).tolist())
        return self.element_set

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def atom_counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def atoms_of(self, indices: np.ndarray) -> np.ndarray:
        """The atom rows of structures ``indices``, in order (for vectorised gathers)."""
        indices = np.asarray(indices, dtype=np.int64)
        starts = self.offsets[indices]
        counts = self.offsets[indices + 1] - starts
        placed = np.cumsum(counts) - counts  # where each structure's rows go
        return np.arange(int(counts.sum())) + np.repeat(starts - placed, counts)

    def positions_of(self, index: int) -> np.ndarray:
        start, end = self.offsets[index], self.offsets[index + 1]
        return np.asarray(self.positions[start:end], dtype=np.float64) * self.length

    def cell_of(self, index: int) -> np.ndarray:
        return np.asarray(self.cells[index], dtype=np.float64) * self.length

    def neighbors(self, index: int, cutoff: float) -> NeighborList:
        """The neighbor list of structure ``index``, from the cache when it is there."""
        key = (cutoff, index)
        cached = self.neighbor_lists.get(key)
        if cached is None:
            from .neighbors import compute_neighbor_list  # torch's, as the search needs it

            cached = compute_neighbor_list(
                self.positions_of(index), self.cell_of(index), self.pbc[index], cutoff
            )
            if self.cache_neighbors and NEIGHBOR_CACHE.admit(cached):
                self.neighbor_lists[key] = cached
        return cached

    def structure(self, index: int) -> Structure:
        import torch

        from .system import Structure

        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        structure = Structure(
            positions=torch.from_numpy(self.positions_of(index)),
            atomic_numbers=torch.from_numpy(np.asarray(self.numbers[start:end], dtype=np.int64)),
            cell=torch.from_numpy(self.cell_of(index)),
            pbc=torch.from_numpy(np.array(self.pbc[index], dtype=bool)),
        )
        if self.energy is not None and self.energy_known[index]:
            structure.energy = float(self.energy[index]) * self.energy_unit
        if self.forces is not None and self.forces_known[index]:
            structure.forces = torch.from_numpy(self.forces_of(start, end))
        if self.stress is not None and self.stress_known[index]:
            structure.stress = torch.from_numpy(self.stress_of(index))
        for name, column in self.targets.items():
            if column.known[index]:
                structure.targets[name] = torch.from_numpy(column.of(self, index))
        return structure

    def forces_of(self, start: int, end: int) -> np.ndarray:
        assert self.forces is not None
        factor = self.energy_unit / self.length
        return np.asarray(self.forces[start:end], dtype=np.float64) * factor

    def stress_of(self, index: int) -> np.ndarray:
        assert self.stress is not None
        factor = self.energy_unit / self.length**3
        return np.asarray(self.stress[index], dtype=np.float64) * factor


@dataclass
class StructureValues:
    """One structure as a reader gives it, in angstrom and eV (float64; stress with
    ASE's sign, ``(1/V) dE/dstrain``): what :func:`frames_from_values` stacks."""

    positions: np.ndarray  # [n_atoms, 3]
    atomic_numbers: np.ndarray  # [n_atoms] int64
    cell: np.ndarray  # [3, 3], rows are lattice vectors
    pbc: np.ndarray  # [3] bool
    energy: float | None = None
    forces: np.ndarray | None = None  # [n_atoms, 3]
    stress: np.ndarray | None = None  # [3, 3]
    # mtt:: targets it has: [width] per structure, [n_atoms, width] per atom
    targets: dict[str, np.ndarray] = field(default_factory=dict)
    weight: float | None = None  # its loss weight, when the data gives one

    @property
    def n_atoms(self) -> int:
        return int(self.atomic_numbers.shape[0])


def frames_from_values(source: str, structures: Sequence[StructureValues]) -> Frames:
    """Structures read from a file (or built in a test) as columns, in float64."""
    counts = np.array([structure.n_atoms for structure in structures], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n = len(structures)

    def stacked(values: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
        return np.concatenate(values) if values else np.zeros(shape)

    energy_known = np.array([s.energy is not None for s in structures], dtype=bool)
    forces_known = np.array([s.forces is not None for s in structures], dtype=bool)
    stress_known = np.array([s.stress is not None for s in structures], dtype=bool)
    forces = None
    if forces_known.any():
        forces = stacked(
            [s.forces if s.forces is not None else np.zeros((s.n_atoms, 3)) for s in structures],
            (0, 3),
        )
    stress = None
    if stress_known.any():
        stress = np.stack(
            [s.stress if s.stress is not None else np.zeros((3, 3)) for s in structures]
        )
    targets = {}
    for name in dict.fromkeys(name for s in structures for name in s.targets):
        known = np.array([name in s.targets for s in structures], dtype=bool)
        example = next(s.targets[name] for s in structures if name in s.targets)
        per_atom = example.ndim == 2
        rows = [
            s.targets[name]
            if name in s.targets
            else np.zeros((s.n_atoms, example.shape[-1]) if per_atom else example.shape)
            for s in structures
        ]
        values = np.concatenate(rows) if per_atom else np.stack(rows)
        targets[name] = TargetColumn(values.astype(np.float64), known, per_atom)
    weights = None
    if any(s.weight is not None for s in structures):
        weights = np.array([1.0 if s.weight is None else s.weight for s in structures])
    return Frames(
        weights=weights,
        targets=targets,
        source=source,
        offsets=offsets,
        positions=stacked([s.positions for s in structures], (0, 3)).astype(np.float64),
        numbers=stacked([s.atomic_numbers for s in structures], (0,)).astype(np.int64),
        cells=np.stack([s.cell for s in structures]) if n else np.zeros((0, 3, 3)),
        pbc=np.stack([s.pbc for s in structures]) if n else np.zeros((0, 3), bool),
        energy=np.array(
            [s.energy if s.energy is not None else np.nan for s in structures], dtype=np.float64
        )
        if energy_known.any()
        else None,
        forces=forces,
        stress=stress,
        energy_known=energy_known,
        forces_known=forces_known,
        stress_known=stress_known,
    )
