"""Neighbor pairs per structure: what a structure costs a step (to deal a global batch
so that the ranks finish together) and the mean neighbor count some architectures are
built with. Each rank counts its share of the set, one all-reduce gives every rank the
whole, the same for any number of processes."""

from __future__ import annotations

import numpy as np
import torch

from ..data.frames import FrameSet
from ..data.sampler import shard
from ..distributed import Context


def pair_counts(structures: FrameSet, cutoff: float, context: Context) -> np.ndarray:
    """Pairs of the full neighbor list within ``cutoff`` (each pair in both orders) of
    every structure of ``structures``, kept on the set for the next call. Collective."""
    cached = structures.pair_counts.get(cutoff)
    if cached is not None:
        return cached
    counts = torch.zeros(len(structures), dtype=torch.int64)
    for position in shard(list(range(len(structures))), context.rank, context.world_size):
        frames, index = structures.locate(position)
        counts[position] = frames.neighbors(index, cutoff).n_pairs
    result = context.all_reduce_sum(counts).numpy()
    structures.pair_counts[cutoff] = result
    return result


def work(structures: FrameSet, cutoff: float, context: Context) -> np.ndarray | None:
    """Each structure's share of a step's time, for dealing batches to several ranks
    (pairs predict it better than atoms); None with one rank, which deals nothing."""
    if context.world_size == 1:
        return None
    return np.maximum(pair_counts(structures, cutoff, context), 1)
