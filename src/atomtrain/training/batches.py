"""Each training step's batch: the global batch's counts (for the loss normalisation)
and this rank's share, collated from the arrays. With ``num_workers`` threads, the next
steps' batches are built while the current step runs: neighbor lists (vesin) and the
copies out of memory-mapped files release the GIL, so they overlap with the model's
work instead of adding to it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ..data.batch import Batch, empty_batch
from ..data.frames import FrameSet
from ..data.sampler import shard_by_work
from ..options import TrainingOptions
from ..targets import TargetSpec
from .augmentation import random_transformations, turned_batch
from .losses import GlobalCounts


def batch_workers(options: TrainingOptions, device: torch.device) -> int:
    """Threads building batches ahead: ``num_workers``; unset, none on a CPU, where a
    step and the builder compete for the same cores (measured: 2.1 s an epoch against
    1.0 s on ethanol, two cores), and one on a GPU, whose steps leave the CPU idle."""
    if options.num_workers is not None:
        return options.num_workers
    return 0 if device.type == "cpu" else 1


def global_counts(structures: FrameSet, indices: list[int]) -> GlobalCounts:
    positions = np.asarray(indices, dtype=np.int64)
    atoms = structures.gathered("atom_counts", positions)
    with_forces = structures.gathered("forces_known", positions)
    with_stress = structures.gathered("stress_known", positions)
    values = {}
    for name, column in structures.target_columns().items():
        known = structures.target_known(name, positions)
        samples = int(atoms[known].sum()) if column.per_atom else int(known.sum())
        values[name] = samples * int(column.values.shape[1])
    return GlobalCounts(
        structures=len(indices),
        force_components=3 * int(atoms[with_forces].sum()),
        stress_components=9 * int(with_stress.sum()),
        target_values=values,
    )


@dataclass
class StepBatches:
    """How this rank cuts its batches out of ``structures``."""

    structures: FrameSet
    cutoff: float
    work: np.ndarray | None  # per structure, for dealing to several ranks
    rank: int
    world_size: int
    forces: bool  # the set has forces somewhere: an empty share still carries the keys
    stress: bool
    workers: int = 0
    energy: bool = True  # the set has energies (an empty share carries the key)
    widths: dict[str, int] | None = None  # of the mtt:: targets, for an empty share
    # set: each structure turned at random every epoch (augmentation.py), from this seed
    rotation_seed: int | None = None
    specs: tuple[TargetSpec, ...] = ()  # the mtt:: targets, to turn with the structures

    def build(self, global_batch: list[int], epoch: int = 0) -> tuple[GlobalCounts, Batch]:
        counts = global_counts(self.structures, global_batch)
        mine = shard_by_work(global_batch, self.work, self.rank, self.world_size)
        if not mine:
            return counts, empty_batch(self.energy, self.forces, self.stress, self.widths)
        batch = self.structures.batch(mine, self.cutoff)
        if self.rotation_seed is not None:
            matrices = random_transformations(self.rotation_seed, epoch, mine)
            batch = turned_batch(batch, matrices, self.specs)
        return counts, batch

    def steps(
        self, batches: list[list[int]], start: int, epoch: int = 0
    ) -> Iterator[tuple[int, GlobalCounts, Batch]]:
        """(step, counts, batch) from step ``start`` on, built ``workers`` steps ahead."""
        if self.workers == 0:
            for step in range(start, len(batches)):
                yield step, *self.build(batches[step], epoch)
            return
        executor = ThreadPoolExecutor(self.workers, thread_name_prefix="atomtrain-batches")
        pending: deque[tuple[int, Future]] = deque()
        upcoming = iter(range(start, len(batches)))
        try:
            for step in upcoming:
                pending.append((step, executor.submit(self.build, batches[step], epoch)))
                if len(pending) > self.workers:
                    break
            while pending:
                step, future = pending.popleft()
                following = next(upcoming, None)
                if following is not None:
                    pending.append(
                        (following, executor.submit(self.build, batches[following], epoch))
                    )
                yield step, *future.result()
        finally:
            executor.shutdown(wait=True, cancel_futures=True)
