"""Neighbor lists from vesin."""

from __future__ import annotations

import numpy as np
import torch
import vesin

from .system import NeighborList


def compute_neighbor_list(
    positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float
) -> NeighborList:
    """Each pair within the cutoff once (vesin's half list); batches lay out the full list
    as these pairs followed by the same reversed, in the same order, and the model then
    computes the geometry of the first half only (see SoapBpnn.energies)."""
    calculator = vesin.NeighborList(cutoff=cutoff, full_list=False)
    box = cell if bool(np.any(pbc)) else np.zeros((3, 3))
    first, second, shifts = calculator.compute(
        points=np.ascontiguousarray(positions, dtype=np.float64),
        box=np.ascontiguousarray(box, dtype=np.float64),
        periodic=[bool(p) for p in pbc],
        quantities="ijS",
        copy=True,
    )
    return NeighborList(
        first=torch.from_numpy(first.astype(np.int32)),
        second=torch.from_numpy(second.astype(np.int32)),
        cell_shifts=torch.from_numpy(shifts.astype(np.int32)),
    )
