"""Flat batches: structures concatenated, with an atom-to-structure index."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from .neighbors import neighbor_list
from .system import Structure


@dataclass
class Batch:
    """Several structures as flat tensors; pair indices point into the flat atom arrays."""

    positions: torch.Tensor  # [n_atoms, 3]
    atomic_numbers: torch.Tensor  # [n_atoms]
    system_index: torch.Tensor  # [n_atoms], structure of each atom
    cell: torch.Tensor  # [n_structures, 3, 3]
    periodic: torch.Tensor  # [n_structures] bool, any direction periodic
    pair_first: torch.Tensor  # [n_pairs]
    pair_second: torch.Tensor  # [n_pairs]
    cell_shifts: torch.Tensor  # [n_pairs, 3], float like positions
    n_atoms: torch.Tensor  # [n_structures]
    energy: torch.Tensor | None = None  # [n_structures]
    forces: torch.Tensor | None = None  # [n_atoms, 3], zeros where unknown
    stress: torch.Tensor | None = None  # [n_structures, 3, 3], zeros where unknown
    # which atoms' forces (structures' stresses) are known, when not all are
    forces_mask: torch.Tensor | None = None  # [n_atoms] bool
    stress_mask: torch.Tensor | None = None  # [n_structures] bool

    @property
    def n_structures(self) -> int:
        return int(self.n_atoms.shape[0])

    def to(self, device: torch.device | str, dtype: torch.dtype) -> Batch:
        moved = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, torch.Tensor):
                # total energies stay float64: they can be large (-20000 eV)
                keep = item.name == "energy" or not value.is_floating_point()
                value = value.to(device=device, dtype=None if keep else dtype)
            moved[item.name] = value
        return Batch(**moved)


def _with_blanks(
    values: list[torch.Tensor | None], blank_shapes: list[tuple[int, ...]]
) -> tuple[list[torch.Tensor] | None, torch.Tensor | None]:
    """Each structure's target, zeros where it has none, and which have one (None when
    all do); (None, None) when none does. Data sets of several files may give a target
    for some structures only."""
    known = [value is not None for value in values]
    if not any(known):
        return None, None
    filled = [
        value if value is not None else torch.zeros(shape, dtype=torch.float64)
        for value, shape in zip(values, blank_shapes)
    ]
    return filled, None if all(known) else torch.tensor(known)


def empty_batch(energy: bool, forces: bool, stress: bool) -> Batch:
    """A batch of no structure: a rank whose share of a short batch is empty still
    runs the model on it, so it takes part in the gradient reduction."""
    real = torch.zeros((0, 3), dtype=torch.float64)
    index = torch.zeros(0, dtype=torch.long)
    return Batch(
        positions=real,
        atomic_numbers=index,
        system_index=index,
        cell=torch.zeros((0, 3, 3), dtype=torch.float64),
        periodic=torch.zeros(0, dtype=torch.bool),
        pair_first=index,
        pair_second=index,
        cell_shifts=real,
        n_atoms=index,
        energy=torch.zeros(0, dtype=torch.float64) if energy else None,
        forces=real if forces else None,
        stress=torch.zeros((0, 3, 3), dtype=torch.float64) if stress else None,
    )


def collate(structures: Sequence[Structure], cutoff: float) -> Batch:
    """Concatenate structures into one batch, using each one's cached neighbor list."""
    offsets = []
    offset = 0
    for structure in structures:
        offsets.append(offset)
        offset += structure.n_atoms
    lists = [neighbor_list(structure, cutoff) for structure in structures]
    # the batch's full list: every structure's pairs, then all of them reversed
    first = torch.cat([nl.first + start for nl, start in zip(lists, offsets)])
    second = torch.cat([nl.second + start for nl, start in zip(lists, offsets)])
    shifts = torch.cat([nl.cell_shifts for nl in lists])
    n_atoms = torch.tensor([structure.n_atoms for structure in structures], dtype=torch.long)
    energies = [structure.energy for structure in structures]
    forces, forces_known = _with_blanks(
        [structure.forces for structure in structures],
        [(structure.n_atoms, 3) for structure in structures],
    )
    stress, stress_mask = _with_blanks(
        [structure.stress for structure in structures], [(3, 3)] * len(structures)
    )
    return Batch(
        positions=torch.cat([structure.positions for structure in structures]),
        atomic_numbers=torch.cat([structure.atomic_numbers for structure in structures]),
        system_index=torch.repeat_interleave(torch.arange(len(structures)), n_atoms),
        cell=torch.stack([structure.cell for structure in structures]),
        periodic=torch.tensor([structure.is_periodic for structure in structures]),
        pair_first=torch.cat([first, second]).long(),
        pair_second=torch.cat([second, first]).long(),
        cell_shifts=torch.cat([shifts, -shifts]).to(torch.float64),
        n_atoms=n_atoms,
        energy=None
        if any(energy is None for energy in energies)
        else torch.tensor(energies, dtype=torch.float64),
        forces=None if forces is None else torch.cat(forces),
        stress=None if stress is None else torch.stack(stress),
        forces_mask=None
        if forces_known is None
        else torch.repeat_interleave(forces_known, n_atoms),
        stress_mask=stress_mask,
    )
