"""Seeded random split of one data set into training, validation and test parts."""

from __future__ import annotations

import numpy as np
import torch


def split_indices(n_structures: int, fractions: list[float], seed: int) -> list[np.ndarray]:
    """Shuffle ``range(n_structures)`` with ``seed`` and cut off one part per fraction
    (rounded, at least one structure for a non-zero fraction); the first returned part
    holds the rest (the training part), which may be empty. Arrays, not lists: a
    million Python integers weigh 36 MB per process."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n_structures, generator=generator).numpy()
    parts = []
    start = 0
    for fraction in fractions:
        size = max(1, round(fraction * n_structures)) if fraction > 0 else 0
        parts.append(np.sort(order[start : start + size]))
        start += size
    return [np.sort(order[start:]), *parts]
