"""Neighbor pairs per structure: what a structure costs a step (to deal a global batch
so that the ranks finish together) and the mean neighbor count some architectures are
built with. Counted once by the data's converter (``atomtrain convert --cutoff``), or
here: each rank counts its share of the set, one all-reduce gives every rank the whole,
the same for any number of processes."""

from __future__ import annotations

import logging

import numpy as np
import torch

from ..data.frames import FrameSet
from ..data.sampler import shard
from ..distributed import Context
from .outputs import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)

# Counting pairs costs a neighbor search per structure, about in proportion to its
# atoms (40 us for ethanol, 130 us for a 64-atom cell at 5 A): 2-3 s per process on two
# processes up to this many atoms, 15-20 s for a million molecules or 100,000 cells,
# where dealing by atom counts costs nothing (docs/performance-notes.md, "Large data sets").
COUNTED_UP_TO_ATOMS = 2_000_000


def pair_counts(structures: FrameSet, cutoff: float, context: Context) -> np.ndarray:
    """Pairs of the full neighbor list within ``cutoff`` (each pair in both orders) of
    every structure of ``structures``: stored with the data, or counted (kept on the set
    for the next call). Collective unless stored."""
    cached = known_pair_counts(structures, cutoff)
    if cached is None:
        counts = torch.zeros(len(structures), dtype=torch.int64)
        for position in shard(list(range(len(structures))), context.rank, context.world_size):
            frames, index = structures.locate(position)
            counts[position] = frames.neighbors(index, cutoff).n_pairs
        cached = context.all_reduce_sum(counts).numpy()
    structures.pair_counts[cutoff] = cached
    return cached


# The mean neighbor count an architecture is built with (MACE's avg_num_neighbors) is a
# normalisation constant: beyond this many structures it comes from a fixed random
# sample of them (the same for any number of processes), which estimates it to a
# fraction of a percent instead of a neighbor search per structure (a minute or more
# for a million cells, at every fresh start).
AVERAGE_NEIGHBORS_SAMPLE = 100_000


def average_neighbors(structures: FrameSet, cutoff: float, context: Context) -> float:
    """Neighbors per atom within ``cutoff`` (full list) over ``structures``, or over a
    fixed sample of them for large sets without stored pair counts. Collective."""
    sample = structures
    if known_pair_counts(structures, cutoff) is None and len(structures) > (
        AVERAGE_NEIGHBORS_SAMPLE
    ):
        generator = np.random.default_rng(0)
        chosen = generator.choice(len(structures), AVERAGE_NEIGHBORS_SAMPLE, replace=False)
        sample = structures.subset(np.sort(chosen))
        logger.info(
            f"mean neighbor count from a fixed sample of {AVERAGE_NEIGHBORS_SAMPLE} of the "
            f"{len(structures)} training structures"
        )
    pairs = int(pair_counts(sample, cutoff, context).sum())
    return pairs / max(int(sample.atom_counts.sum()), 1)


def known_pair_counts(structures: FrameSet, cutoff: float) -> np.ndarray | None:
    """The pair counts counted earlier on this set or stored with its data, else None."""
    counted = structures.pair_counts.get(cutoff)
    return counted if counted is not None else structures.stored_pair_counts(cutoff)


def work(structures: FrameSet, cutoff: float, context: Context) -> np.ndarray | None:
    """Each structure's share of a step's time, for dealing batches to several ranks:
    its neighbor pairs, which predict it better than atoms (within 4 % against 8 % on
    tio2), where they are stored or the set is small enough to count them quickly;
    else its atoms. Kept on the set: validation asks at every epoch. None with one
    rank, which deals nothing."""
    if context.world_size == 1:
        return None
    chosen = structures.work.get(cutoff)
    if chosen is not None:
        return chosen
    if (
        known_pair_counts(structures, cutoff) is None
        and int(structures.atom_counts.sum()) > COUNTED_UP_TO_ATOMS
    ):
        logger.info(
            f"dealing batches to the processes by atom counts: {len(structures)} structures "
            f"have no stored neighbor-pair counts for the cutoff {cutoff:g} A, and counting "
            f"them takes a neighbor search each (atomtrain convert --cutoff {cutoff:g} "
            "stores them)"
        )
        chosen = structures.atom_counts
    else:
        chosen = np.maximum(pair_counts(structures, cutoff, context), 1)
    structures.work[cutoff] = chosen
    return chosen
