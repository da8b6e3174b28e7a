"""Neighbor lists from vesin, computed once per structure and cutoff."""

from __future__ import annotations

import numpy as np
import torch
import vesin

from .system import NeighborList, Structure


def compute_neighbor_list(
    positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float
) -> NeighborList:
    """Full neighbor list for one structure, laid out as each pair once (vesin's half
    list) followed by the same pairs reversed, in the same order: the model then computes
    the geometry of the first half only (see SoapBpnn.energies)."""
    calculator = vesin.NeighborList(cutoff=cutoff, full_list=False)
    box = cell if bool(np.any(pbc)) else np.zeros((3, 3))
    first, second, shifts = calculator.compute(
        points=np.ascontiguousarray(positions, dtype=np.float64),
        box=np.ascontiguousarray(box, dtype=np.float64),
        periodic=[bool(p) for p in pbc],
        quantities="ijS",
        copy=True,
    )
    first = torch.from_numpy(first.astype(np.int64))
    second = torch.from_numpy(second.astype(np.int64))
    shifts = torch.from_numpy(shifts.astype(np.int64))
    return NeighborList(
        first=torch.cat([first, second]),
        second=torch.cat([second, first]),
        cell_shifts=torch.cat([shifts, -shifts]),
    )


def neighbor_list(structure: Structure, cutoff: float) -> NeighborList:
    """The cached neighbor list of ``structure``; positions never change during training."""
    cached = structure.neighbor_lists.get(cutoff)
    if cached is None:
        cached = compute_neighbor_list(
            structure.positions.numpy(),
            structure.cell.numpy(),
            structure.pbc.numpy(),
            cutoff,
        )
        structure.neighbor_lists[cutoff] = cached
    return cached


def pair_count(structure: Structure, cutoff: float) -> int:
    """Neighbor pairs of ``structure`` (at least one), the measure of its work."""
    return max(int(neighbor_list(structure, cutoff).first.numel()), 1)
