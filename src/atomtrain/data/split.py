"""Seeded random split of one data set into training, validation and test parts."""

from __future__ import annotations

import torch


def split_indices(n_structures: int, fractions: list[float], seed: int) -> list[list[int]]:
    """Shuffle ``range(n_structures)`` with ``seed`` and cut off one part per fraction
    (rounded, at least one structure for a non-zero fraction); the first returned part
    holds the rest (the training part), which may be empty."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n_structures, generator=generator).tolist()
    parts = []
    start = 0
    for fraction in fractions:
        size = max(1, round(fraction * n_structures)) if fraction > 0 else 0
        parts.append(sorted(order[start : start + size]))
        start += size
    return [sorted(order[start:]), *parts]
