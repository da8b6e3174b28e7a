"""One atomic structure with its reference targets."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class NeighborList:
    """A full neighbor list: every pair (i, j) within the cutoff appears in both orders,
    each pair once in the first half and reversed (j, i, -shift) at the same place in the
    second half.

    The vector from i to j is ``positions[j] - positions[i] + cell_shifts @ cell``.
    """

    first: torch.Tensor  # [n_pairs] int64
    second: torch.Tensor  # [n_pairs] int64
    cell_shifts: torch.Tensor  # [n_pairs, 3] int64


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
    neighbor_lists: dict[float, NeighborList] = field(default_factory=dict, repr=False)

    @property
    def n_atoms(self) -> int:
        return int(self.atomic_numbers.shape[0])

    @property
    def is_periodic(self) -> bool:
        return bool(self.pbc.any())

    @property
    def volume(self) -> float:
        return abs(float(torch.linalg.det(self.cell)))
