"""Predictions and exact metrics over a data set, sharded over ranks without padding."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..data.batch import Batch
from ..data.frames import FrameSet
from ..data.sampler import global_batches, pack_by_atoms, shard_by_work
from ..distributed import Context
from .metrics import MetricSums
from .work import work


def model_inputs(batch: Batch) -> dict[str, torch.Tensor]:
    variant = {} if batch.energy_variant is None else {"energy_variant": batch.energy_variant}
    return {
        **variant,
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
    structures: FrameSet,
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
        chunks = pack_by_atoms(indices, structures.atom_counts, max_atoms)
    for chunk in chunks:
        yield chunk, structures.batch(chunk, cutoff)


def metric_sums(
    model: torch.nn.Module,
    structures: FrameSet,
    context: Context,
    batch_size: int,
    dtype: torch.dtype,
    max_atoms: int | None = None,
    targets: tuple[str, ...] = (),
) -> torch.Tensor:
    """This rank's error sums over its shard (every rank must call the reduction), in
    batches of ``batch_size`` structures or of at most ``max_atoms`` atoms; ``targets``:
    the mtt:: targets whose errors are summed too."""
    sums = MetricSums(context.device, targets)
    if not len(structures):
        return sums.values
    cutoff = float(model.cutoff)
    everything = list(range(len(structures)))
    costs = work(structures, cutoff, context)
    indices = shard_by_work(everything, costs, context.rank, context.world_size)
    with_forces, with_stress = structures.count_known()
    for _, batch in local_batches(structures, indices, batch_size, cutoff, max_atoms):
        batch = batch.to(context.device, dtype)
        predictions = predict(model, batch, with_forces > 0, with_stress > 0)
        sums.accumulate(predictions, batch)
    return sums.values
