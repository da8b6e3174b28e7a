"""Predictions and exact metrics over a data set, sharded over ranks without padding."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..data.batch import Batch, collate
from ..data.sampler import shard_by_work
from ..data.system import Structure
from ..distributed import Context
from .metrics import MetricSums


def model_inputs(batch: Batch) -> dict[str, torch.Tensor]:
    return {
        "positions": batch.positions,
        "cell": batch.cell,
        "atomic_numbers": batch.atomic_numbers,
        "system_index": batch.system_index,
        "pair_first": batch.pair_first,
        "pair_second": batch.pair_second,
        "cell_shifts": batch.cell_shifts,
        "periodic": batch.periodic,
    }


def predict(
    model: torch.nn.Module,
    batch: Batch,
    forces: bool,
    stress: bool,
    create_graph: bool = False,
) -> dict[str, torch.Tensor]:
    return model(
        **model_inputs(batch),
        compute_forces=forces,
        compute_stress=stress,
        create_graph=create_graph,
    )


def local_batches(
    structures: list[Structure], indices: list[int], batch_size: int, cutoff: float
) -> Iterator[tuple[list[int], Batch]]:
    for start in range(0, len(indices), batch_size):
        chunk = indices[start : start + batch_size]
        yield chunk, collate([structures[index] for index in chunk], cutoff)


def metric_sums(
    model: torch.nn.Module,
    structures: list[Structure],
    context: Context,
    batch_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """This rank's error sums over its shard (every rank must call the reduction)."""
    sums = MetricSums(context.device)
    if not structures:
        return sums.values
    cutoff = float(model.cutoff)
    everything = list(range(len(structures)))
    indices = shard_by_work(structures, everything, cutoff, context.rank, context.world_size)
    forces = structures[0].forces is not None
    stress = all(structure.stress is not None for structure in structures)
    for _, batch in local_batches(structures, indices, batch_size, cutoff):
        batch = batch.to(context.device, dtype)
        predictions = predict(model, batch, forces, stress)
        sums.accumulate(predictions, batch)
    return sums.values
