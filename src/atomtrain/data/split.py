"""Seeded random split of one data set into training, validation and test parts."""

from __future__ import annotations

import torch


def split_indices(n_structures: int, fractions: list[float], seed: int) -> list[list[int]]:
    """Shuffle ``range(n_structures)`` with ``seed`` and cut off one part per fraction
    (rounded down); the first returned part holds the rest (the training part)."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n_structures, generator=generator).tolist()
    parts = []
    start = 0
    for fraction in fractions:
        size = int(fraction * n_structures)
        parts.append(sorted(order[start : start + size]))
        start += size
    return [sorted(order[start:]), *parts]
