"""One atomic structure with its reference targets."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class NeighborList:
    """Every pair (i, j) within the cutoff once, in 32-bit integers: what a structure
    keeps for the whole run (a quarter of a full list in 64 bits, which on dense
    materials weighs some 20 times the structure itself). ``full()`` gives each pair in
    both orders, the reversed pairs (j, i, -shift) after all the others, in the same
    order.

    The vector from i to j is ``positions[j] - positions[i] + cell_shifts @ cell``.
    """

    first: torch.Tensor  # [n_unique_pairs] int32
    second: torch.Tensor  # [n_unique_pairs] int32
    cell_shifts: torch.Tensor  # [n_unique_pairs, 3] int32

    @property
    def n_pairs(self) -> int:
        """Pairs of the full list, both orders counted."""
        return 2 * int(self.first.shape[0])

    def full(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(first, second, cell_shifts) of the full list, in 64-bit integers."""
        return (
            torch.cat([self.first, self.second]).long(),
            torch.cat([self.second, self.first]).long(),
            torch.cat([self.cell_shifts, -self.cell_shifts]).long(),
        )


@dataclass
class Structure:
    """Positions in angstrom, energy in eV, forces in eV/angstrom, stress in eV/angstrom^3.

    Stress follows ASE's sign convention: ``stress = (1/V) dE/dstrain``.
    """

    positions: torch.Tensor  # [n_atoms, 3] float64
    atomic_numbers: torch.Tensor  # [n_atoms] int64
    cell: torch.Tensor  # [3, 3] float64, rows are lattice vectors
    pbc: torch.Tensor  # [3] bool
    energy: float | None = None
    forces: torch.Tensor | None = None  # [n_atoms, 3]
    stress: torch.Tensor | None = None  # [3, 3]
    # mtt:: targets it has: [width] per structure, [n_atoms, width] per atom (float64)
    targets: dict[str, torch.Tensor] = field(default_factory=dict)
    weight: float | None = None  # its loss weight, when the data gives one

    @property
    def n_atoms(self) -> int:
        return int(self.atomic_numbers.shape[0])

    @property
    def is_periodic(self) -> bool:
        return bool(self.pbc.any())

    @property
    def volume(self) -> float:
        return abs(float(torch.linalg.det(self.cell)))
