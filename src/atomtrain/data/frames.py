"""Data sets as flat arrays: one representation for a file read into memory and for a
memory-mapped directory of millions of structures.

A :class:`Frames` holds one source's structures as columns (positions, atomic numbers,
cells, targets) with per-structure atom offsets; a :class:`FrameSet` is a choice of
structures from one or more of them (a training set split from several files). Nothing
is built per structure up front: batches are cut from the arrays by index, statistics
stream over them in chunks, and a memory-mapped directory is only read where a batch
or a statistic touches it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import DataError, OptionsError
from .batch import Batch
from .neighbors import compute_neighbor_list
from .system import NeighborList, Structure

# structures per chunk when a statistic streams over a set: a few MB of arrays at a time
CHUNK = 65_536
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
            cached = compute_neighbor_list(
                self.positions_of(index), self.cell_of(index), self.pbc[index], cutoff
            )
            if self.cache_neighbors and NEIGHBOR_CACHE.admit(cached):
                self.neighbor_lists[key] = cached
        return cached

    def structure(self, index: int) -> Structure:
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


def frames_from_structures(source: str, structures: Sequence[Structure]) -> Frames:
    """Structures (read from a file, or built in a test) as columns, in float64."""
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
            [
                s.forces.numpy() if s.forces is not None else np.zeros((s.n_atoms, 3))
                for s in structures
            ],
            (0, 3),
        )
    stress = None
    if stress_known.any():
        stress = np.stack(
            [s.stress.numpy() if s.stress is not None else np.zeros((3, 3)) for s in structures]
        )
    targets = {}
    for name in dict.fromkeys(name for s in structures for name in s.targets):
        known = np.array([name in s.targets for s in structures], dtype=bool)
        example = next(s.targets[name] for s in structures if name in s.targets)
        per_atom = example.dim() == 2
        rows = [
            s.targets[name].numpy()
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
        positions=stacked([s.positions.numpy() for s in structures], (0, 3)).astype(np.float64),
        numbers=stacked([s.atomic_numbers.numpy() for s in structures], (0,)).astype(np.int64),
        cells=np.stack([s.cell.numpy() for s in structures]) if n else np.zeros((0, 3, 3)),
        pbc=np.stack([s.pbc.numpy() for s in structures]) if n else np.zeros((0, 3), bool),
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


class FrameSet(Sequence):
    """Structures chosen from one or more :class:`Frames`, in order. Indexing gives a
    :class:`Structure`, built when asked; training, statistics and evaluation use the
    vectorised methods and :meth:`batch` instead."""

    def __init__(self, parts: list[Frames], part: np.ndarray, index: np.ndarray):
        self.parts = parts
        self.part = part.astype(np.int32)  # [n] which of parts
        self.index = index.astype(np.int64)  # [n] structure within it
        # by cutoff: neighbor pairs counted at the start, and what batches are dealt by
        self.pair_counts: dict[float, np.ndarray] = {}
        self.work: dict[float, np.ndarray] = {}

    @classmethod
    def whole(cls, frames: Frames) -> FrameSet:
        return cls([frames], np.zeros(len(frames), np.int32), np.arange(len(frames)))

    @classmethod
    def from_structures(cls, structures: Sequence[Structure], source: str = "") -> FrameSet:
        return cls.whole(frames_from_structures(source, structures))

    @classmethod
    def joined(cls, sets: Sequence[FrameSet]) -> FrameSet:
        """The structures of ``sets`` one after the other."""
        parts: list[Frames] = []
        which, where = [], []
        for chosen in sets:
            numbering = []
            for frames in chosen.parts:
                found = next((k for k, known in enumerate(parts) if known is frames), None)
                if found is None:
                    parts.append(frames)
                    found = len(parts) - 1
                numbering.append(found)
            which.append(np.asarray(numbering, dtype=np.int32)[chosen.part])
            where.append(chosen.index)
        if not which:
            return cls([], np.zeros(0, np.int32), np.zeros(0, np.int64))
        return cls(parts, np.concatenate(which), np.concatenate(where))

    def subset(self, positions: Sequence[int] | np.ndarray) -> FrameSet:
        positions = np.asarray(positions, dtype=np.int64)
        return FrameSet(self.parts, self.part[positions], self.index[positions])

    def __len__(self) -> int:
        return int(self.part.shape[0])

    def __add__(self, other: FrameSet) -> FrameSet:
        return FrameSet.joined([self, other])

    def __getitem__(self, position):
        if isinstance(position, slice):
            return self.subset(np.arange(len(self))[position])
        return self.parts[self.part[position]].structure(int(self.index[position]))

    def locate(self, position: int) -> tuple[Frames, int]:
        return self.parts[self.part[position]], int(self.index[position])

    def by_part(self, positions: np.ndarray) -> Iterator[tuple[Frames, np.ndarray, np.ndarray]]:
        """(frames, indices within them, where they are in ``positions``) for each part."""
        parts = self.part[positions]
        for number, frames in enumerate(self.parts):
            where = np.nonzero(parts == number)[0]
            if where.size:
                yield frames, self.index[positions[where]], where

    def gathered(self, attribute: str, positions: np.ndarray | None = None) -> np.ndarray:
        """A per-structure column (atom_counts, energy_known, forces_known, stress_known)
        for ``positions`` (all by default)."""
        positions = np.arange(len(self)) if positions is None else np.asarray(positions)
        result = None
        for frames, indices, where in self.by_part(positions):
            values = getattr(frames, attribute)[indices]
            if result is None:
                result = np.zeros(len(positions), dtype=values.dtype)
            result[where] = values
        return result if result is not None else np.zeros(len(positions), dtype=np.int64)

    @property
    def atom_counts(self) -> np.ndarray:
        return self.gathered("atom_counts")

    def fully_periodic(self) -> np.ndarray:
        """Whether each structure is periodic in all three directions."""
        result = np.zeros(len(self), dtype=bool)
        for frames, indices, where in self.by_part(np.arange(len(self))):
            result[where] = np.asarray(frames.pbc[indices]).all(axis=1)
        return result

    def target_known(self, name: str, positions: np.ndarray | None = None) -> np.ndarray:
        """Which of the structures at ``positions`` (all by default) have mtt:: target
        ``name``."""
        positions = np.arange(len(self)) if positions is None else np.asarray(positions)
        result = np.zeros(len(positions), dtype=bool)
        for frames, indices, where in self.by_part(positions):
            column = frames.targets.get(name)
            if column is not None:
                result[where] = column.known[indices]
        return result

    def weights(self) -> np.ndarray:
        """Each structure's loss weight."""
        result = np.ones(len(self), dtype=np.float64)
        for frames, indices, where in self.by_part(np.arange(len(self))):
            if frames.weights is not None:
                result[where] = frames.weights[indices]
        return result

    def energy_variants(self) -> np.ndarray:
        """Each structure's energy_variant (which of the model's energies it has)."""
        result = np.zeros(len(self), dtype=np.int64)
        for frames, _, where in self.by_part(np.arange(len(self))):
            result[where] = frames.energy_variant
        return result

    def target_columns(self) -> dict[str, TargetColumn]:
        """An example column of each mtt:: target some source has, by name."""
        columns: dict[str, TargetColumn] = {}
        for frames in self.parts:
            for name, column in frames.targets.items():
                columns.setdefault(name, column)
        return columns

    def count_known(self) -> tuple[int, int]:
        """How many structures have forces, and how many a stress."""
        if not len(self):
            return 0, 0
        return int(self.gathered("forces_known").sum()), int(self.gathered("stress_known").sum())

    def chunks(self, positions: np.ndarray) -> Iterator[tuple[Frames, np.ndarray]]:
        """(frames, indices within them) over ``positions``, at most CHUNK at a time."""
        for start in range(0, len(positions), CHUNK):
            for frames, indices, _ in self.by_part(positions[start : start + CHUNK]):
                yield frames, indices

    def stored_pair_counts(self, cutoff: float) -> np.ndarray | None:
        """Each structure's neighbor pairs within ``cutoff`` when every source stored
        them (``atomtrain convert --cutoff``), else None."""
        if not len(self) or any(cutoff not in frames.stored_pairs for frames in self.parts):
            return None
        counts = np.zeros(len(self), dtype=np.int64)
        for frames, indices, where in self.by_part(np.arange(len(self))):
            counts[where] = frames.stored_pairs[cutoff][indices]
        return counts

    def elements(self) -> set[int]:
        """The atomic numbers in these structures. Their sources' elements (one pass
        over each source, kept) bound them: the scan of these structures, a chunk at a
        time, stops once it has found them all, usually in the first chunk (a split of
        a million cells asked five times took 1.2 s of gathers before)."""
        used = np.unique(self.part).tolist()
        possible = set().union(*(self.parts[number].elements() for number in used))
        found: set[int] = set()
        for frames, indices in self.chunks(np.arange(len(self))):
            found |= set(np.unique(frames.numbers[frames.atoms_of(indices)]).tolist())
            if found == possible:
                break
        return found

    def batch(self, positions: Sequence[int], cutoff: float) -> Batch:
        """The structures at ``positions`` as one batch, their neighbor lists within
        ``cutoff`` laid out as each structure's pairs, then all of them reversed."""
        located = [self.locate(int(position)) for position in positions]
        return collate_frames(located, cutoff)


def collate(structures: Sequence[Structure], cutoff: float) -> Batch:
    """Structures built in memory (tests, the ASE calculator's callers) as one batch."""
    return FrameSet.from_structures(structures).batch(range(len(structures)), cutoff)


def collate_frames(located: list[tuple[Frames, int]], cutoff: float) -> Batch:
    starts = [int(frames.offsets[index]) for frames, index in located]
    ends = [int(frames.offsets[index + 1]) for frames, index in located]
    n_atoms = np.array([end - start for start, end in zip(starts, ends)], dtype=np.int64)
    atom_offsets = np.concatenate([[0], np.cumsum(n_atoms)[:-1]]).astype(np.int64)
    lists = [frames.neighbors(index, cutoff) for frames, index in located]
    first = np.concatenate(
        [nl.first.numpy().astype(np.int64) + offset for nl, offset in zip(lists, atom_offsets)]
    )
    second = np.concatenate(
        [nl.second.numpy().astype(np.int64) + offset for nl, offset in zip(lists, atom_offsets)]
    )
    shifts = np.concatenate([nl.cell_shifts.numpy() for nl in lists]).astype(np.float64)
    energy_known = np.array([frames.energy_known[index] for frames, index in located], dtype=bool)
    forces_known = np.array(
        [frames.forces is not None and frames.forces_known[index] for frames, index in located],
        dtype=bool,
    )
    stress_known = np.array(
        [frames.stress is not None and frames.stress_known[index] for frames, index in located],
        dtype=bool,
    )
    forces = stress = forces_mask = stress_mask = None
    if forces_known.any():
        forces = np.concatenate(
            [
                frames.forces_of(start, end) if known else np.zeros((end - start, 3))
                for (frames, _), start, end, known in zip(located, starts, ends, forces_known)
            ]
        )
        if not forces_known.all():
            forces_mask = torch.from_numpy(np.repeat(forces_known, n_atoms))
    if stress_known.any():
        stress = np.stack(
            [
                frames.stress_of(index) if known else np.zeros((3, 3))
                for (frames, index), known in zip(located, stress_known)
            ]
        )
        if not stress_known.all():
            stress_mask = torch.from_numpy(stress_known)
    energy = None
    if energy_known.all():
        energy = torch.tensor(
            [float(frames.energy[index]) * frames.energy_unit for frames, index in located],
            dtype=torch.float64,
        )
    targets, target_masks = collate_targets(located, n_atoms)
    atom_targets = tuple(
        name
        for name in targets
        if any(name in f.targets and f.targets[name].per_atom for f, _ in located)
    )
    weights = None
    if any(frames.weights is not None for frames, _ in located):
        weights = torch.tensor(
            [1.0 if f.weights is None else float(f.weights[i]) for f, i in located],
            dtype=torch.float64,
        )
    variants = [frames.energy_variant for frames, _ in located]
    energy_variant = torch.tensor(variants, dtype=torch.long) if any(variants) else None
    n_atoms_tensor = torch.from_numpy(n_atoms)
    first_tensor, second_tensor = torch.from_numpy(first), torch.from_numpy(second)
    shifts_tensor = torch.from_numpy(shifts)
    return Batch(
        positions=torch.from_numpy(
            np.concatenate([frames.positions_of(index) for frames, index in located])
        ),
        atomic_numbers=torch.from_numpy(
            np.concatenate(
                [
                    np.asarray(frames.numbers[start:end], dtype=np.int64)
                    for (frames, _), start, end in zip(located, starts, ends)
                ]
            )
        ),
        system_index=torch.repeat_interleave(torch.arange(len(located)), n_atoms_tensor),
        cell=torch.from_numpy(np.stack([frames.cell_of(index) for frames, index in located])),
        periodic=torch.tensor([bool(frames.pbc[index].any()) for frames, index in located]),
        pair_first=torch.cat([first_tensor, second_tensor]),
        pair_second=torch.cat([second_tensor, first_tensor]),
        cell_shifts=torch.cat([shifts_tensor, -shifts_tensor]),
        n_atoms=n_atoms_tensor,
        energy=energy,
        forces=None if forces is None else torch.from_numpy(forces),
        stress=None if stress is None else torch.from_numpy(stress),
        forces_mask=forces_mask,
        stress_mask=stress_mask,
        targets=targets,
        target_masks=target_masks,
        energy_variant=energy_variant,
        weights=weights,
        atom_targets=atom_targets,
    )


def collate_targets(
    located: list[tuple[Frames, int]], n_atoms: np.ndarray
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The mtt:: targets of the structures ``located``: values (zeros where unknown) and,
    when some are unknown, the mask of the known samples."""
    names = dict.fromkeys(name for frames, _ in located for name in frames.targets)
    targets, masks = {}, {}
    for name in names:
        example = next(frames.targets[name] for frames, _ in located if name in frames.targets)
        width = example.values.shape[1]
        known = np.array(
            [
                name in frames.targets and bool(frames.targets[name].known[index])
                for frames, index in located
            ],
            dtype=bool,
        )
        rows = [
            frames.targets[name].of(frames, index)
            if is_known
            else np.zeros((count, width) if example.per_atom else (width,))
            for (frames, index), is_known, count in zip(located, known, n_atoms)
        ]
        values = np.concatenate(rows) if example.per_atom else np.stack(rows)
        targets[name] = torch.from_numpy(values.reshape(-1, width))
        if not known.all():
            mask = np.repeat(known, n_atoms) if example.per_atom else known
            masks[name] = torch.from_numpy(mask)
    return targets, masks
