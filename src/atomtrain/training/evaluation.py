"""Predictions and exact metrics over a data set, sharded over ranks without padding."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..data.batch import Batch, collate
from ..data.sampler import global_batches, pack_by_atoms, shard_by_work
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
    structures: list[Structure],
    indices: list[int],
    batch_size: int,
    cutoff: float,
    max_atoms: int | None = None,
) -> Iterator[tuple[list[int], Batch]]:
    """``indices`` in order, ``batch_size`` at a time or, with ``max_atoms``, as many as
    fit in that many atoms."""
    if max_atoms is None:
        chunks = global_batches(indices, batch_size)
    else:
        chunks = pack_by_atoms(indices, [structure.n_atoms for structure in structures], max_atoms)
    for chunk in chunks:
        yield chunk, collate([structures[index] for index in chunk], cutoff)


def metric_sums(
    model: torch.nn.Module,
    structures: list[Structure],
    context: Context,
    batch_size: int,
    dtype: torch.dtype,
    max_atoms: int | None = None,
) -> torch.Tensor:
    """This rank's error sums over its shard (every rank must call the reduction), in
    batches of ``batch_size`` structures or of at most ``max_atoms`` atoms."""
    sums = MetricSums(context.device)
    if not structures:
        return sums.values
    cutoff = float(model.cutoff)
    everything = list(range(len(structures)))
    indices = shard_by_work(structures, everything, cutoff, context.rank, context.world_size)
    forces = any(structure.forces is not None for structure in structures)
    stress = any(structure.stress is not None for structure in structures)
    for _, batch in local_batches(structures, indices, batch_size, cutoff, max_atoms):
        batch = batch.to(context.device, dtype)
        predictions = predict(model, batch, forces, stress)
        sums.accumulate(predictions, batch)
    return sums.values
