"""Global batch order: one seeded permutation per epoch, cut into global batches (or
batches packed once by atom count, presented in a seeded order per epoch), each dealt to
the ranks. Every rank computes the same order, so no communication is needed and a run
with N processes sees exactly the batches of a run with one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


def epoch_order(n_structures: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of the training set used in ``epoch`` (0-based), as an array (a
    list of a million Python integers weighs 36 MB)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n_structures, generator=generator).numpy()


def global_batches(order: Sequence[int], batch_size: int) -> list[Sequence[int]]:
    """Consecutive global batches (views of ``order``); the last one may be short."""
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def pack_by_atoms(
    order: list[int], atom_counts: Sequence[int], max_atoms: int, min_atoms: int = 0
) -> list[list[int]]:
    """Consecutive batches of ``order`` (indices into ``atom_counts``) holding at most
    ``max_atoms`` atoms: a batch is closed when the next structure would take it past
    the limit. A structure larger than the limit is a batch of its own (it cannot be
    split, and dropping it would train on less data than the user gave). Batches with
    fewer than ``min_atoms`` atoms are left out."""
    batches: list[list[int]] = []
    current: list[int] = []
    atoms = 0
    for index in order:
        if current and atoms + atom_counts[index] > max_atoms:
            batches.append(current)
            current, atoms = [], 0
        current.append(index)
        atoms += atom_counts[index]
    if current:
        batches.append(current)
    return [batch for batch in batches if sum(atom_counts[i] for i in batch) >= min_atoms]


@dataclass(frozen=True)
class BatchPlan:
    """How the training set is cut into global batches, epoch by epoch: ``batch_size``
    structures from each epoch's permutation, or, when ``packed`` is given, those fixed
    batches in a new seeded order each epoch (so every epoch has the same number of
    steps, which the learning-rate schedule needs up front)."""

    n_structures: int
    batch_size: int
    seed: int
    packed: list[list[int]] | None = None
    # (first position, count, epoch fraction) of each part of the set, when some part is
    # seen more or less than once an epoch
    shares: tuple[tuple[int, int, float], ...] = ()

    @property
    def per_epoch(self) -> int:
        """Structures an epoch holds."""
        if not self.shares:
            return self.n_structures
        return sum(int(f) * n + round((f - int(f)) * n) for _, n, f in self.shares)

    @property
    def steps_per_epoch(self) -> int:
        if self.packed is not None:
            return len(self.packed)
        return steps_per_epoch(self.per_epoch, self.batch_size)

    def sampled(self, epoch: int) -> np.ndarray:
        """The structures of ``epoch`` before shuffling: each part whole as many times as
        its fraction's integer part, and a subset of it (seeded by the seed and the
        epoch) for the rest."""
        generator = np.random.default_rng([self.seed, epoch, 0x5A3])
        pool = []
        for start, count, fraction in self.shares:
            positions = np.arange(start, start + count)
            pool += [positions] * int(fraction)
            rest = round((fraction - int(fraction)) * count)
            if rest:
                pool.append(np.sort(generator.choice(positions, rest, replace=False)))
        return np.concatenate(pool) if pool else np.zeros(0, dtype=np.int64)

    def batches(self, epoch: int) -> list[Sequence[int]]:
        if self.packed is None:
            if not self.shares:
                order = epoch_order(self.n_structures, self.seed, epoch)
            else:
                pool = self.sampled(epoch)
                order = pool[epoch_order(len(pool), self.seed, epoch)]
            return global_batches(order, self.batch_size)
        return [self.packed[i] for i in epoch_order(len(self.packed), self.seed, epoch)]


def pack_once(
    atom_counts: Sequence[int], seed: int, max_atoms: int, min_atoms: int = 0
) -> list[list[int]]:
    """Batches packed by atom count from a seeded permutation of the structures, once
    for the whole run, as metatrain and fairchem pack (the generator's seed is one no
    epoch of the first 999,983 uses)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + 999_983)
    order = torch.randperm(len(atom_counts), generator=generator).tolist()
    return pack_by_atoms(order, atom_counts, max_atoms, min_atoms)


def shard(items: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's part of a list: round-robin, so shards differ in size by at most one
    and nothing is padded or dropped. A rank may get nothing from a short list."""
    return items[rank::world_size]


def balanced_shard(items: list[int], sizes: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's part of a list, dealt so that the ranks get about the same total size
    (work, so that they finish a step together): largest first, each to the least
    loaded rank, ties to the lower rank. Items keep their order within a part. Every
    rank deals the same list the same way; with one rank the list is returned as is."""
    if world_size == 1:
        return list(items)
    loads = [0] * world_size
    owners = [0] * len(items)
    for position in sorted(range(len(items)), key=lambda position: (-sizes[position], position)):
        owner = min(range(world_size), key=lambda candidate: (loads[candidate], candidate))
        owners[position] = owner
        loads[owner] += sizes[position]
    return [item for item, owner in zip(items, owners) if owner == rank]


def shard_by_work(
    indices: list[int], work: Sequence[int] | None, rank: int, world_size: int
) -> list[int]:
    """This rank's part of ``indices``, balanced by each structure's ``work`` (indexed
    like the set ``indices`` point into). With one rank, ``indices`` unchanged."""
    if world_size == 1 or work is None:
        return list(indices)
    sizes = [int(work[index]) for index in indices]
    return balanced_shard(indices, sizes, rank, world_size)


def steps_per_epoch(n_structures: int, batch_size: int) -> int:
    return (n_structures + batch_size - 1) // batch_size
