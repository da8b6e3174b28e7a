"""Data sets as flat arrays: one representation for a file read into memory and for a
memory-mapped directory of millions of structures.

A :class:`Frames` (data/columns.py) holds one source's structures as columns (positions,
atomic numbers, cells, targets) with per-structure atom offsets; a :class:`FrameSet` is a
choice of structures from one or more of them (a training set split from several files).
Nothing is built per structure up front: batches are cut from the arrays by index,
statistics stream over them in chunks, and a memory-mapped directory is only read where
a batch or a statistic touches it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from .batch import Batch
from .columns import Frames, StructureValues, TargetColumn, frames_from_values
from .system import Structure

# structures per chunk when a statistic streams over a set: a few MB of arrays at a time
CHUNK = 65_536


def frames_from_structures(source: str, structures: Sequence[Structure]) -> Frames:
    """Structures built in memory (tests, the ASE calculator's callers) as columns."""
    return frames_from_values(source, [values_of(structure) for structure in structures])


def values_of(structure: Structure) -> StructureValues:
    """A structure's arrays, as a reader gives them (sharing the tensors' memory)."""
    return StructureValues(
        positions=structure.positions.numpy(),
        atomic_numbers=structure.atomic_numbers.numpy(),
        cell=structure.cell.numpy(),
        pbc=structure.pbc.numpy(),
        energy=structure.energy,
        forces=None if structure.forces is None else structure.forces.numpy(),
        stress=None if structure.stress is None else structure.stress.numpy(),
        targets={name: value.numpy() for name, value in structure.targets.items()},
        weight=structure.weight,
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
