"""Global batch order: one seeded permutation per epoch, cut into global batches, each
dealt to the ranks. Every rank computes the same order, so no communication is needed
and a run with N processes sees exactly the batches of a run with one."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .neighbors import pair_count
from .system import Structure


def epoch_order(n_structures: int, seed: int, epoch: int) -> list[int]:
    """The permutation of the training set used in ``epoch`` (0-based)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n_structures, generator=generator).tolist()


def global_batches(order: list[int], batch_size: int) -> list[list[int]]:
    """Consecutive global batches; the last one may be short."""
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


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
    structures: Sequence[Structure],
    indices: list[int],
    cutoff: float,
    rank: int,
    world_size: int,
) -> list[int]:
    """This rank's part of ``indices`` (into ``structures``), balanced by neighbor
    pairs, which predict a structure's share of a step's time better than atoms. With
    one rank, ``indices`` unchanged, without counting pairs."""
    if world_size == 1:
        return list(indices)
    sizes = [pair_count(structures[index], cutoff) for index in indices]
    return balanced_shard(indices, sizes, rank, world_size)


def steps_per_epoch(n_structures: int, batch_size: int) -> int:
    return (n_structures + batch_size - 1) // batch_size
