"""Batches padded to a few sizes, for graphs compiled per batch shape (the compiled
step of a model whose graph cannot take every size, and static shapes for CUDA
graphs): atoms of each element, pairs and structures rounded up to eight sizes per
octave (data_sizes.bucket), so that batches of nearby sizes share a graph."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..data.batch import Batch
from ..models.data_sizes import bucket
from ..models.energy_model import EnergyModel, mirrored_half
from .evaluation import model_inputs


@dataclass(frozen=True)
class BatchSizes:
    """What models read from a batch's data (models/data_sizes.py)."""

    pairs: int  # the most pairs one atom is the first of
    pairs_per_element: int  # ... with neighbors of one element
    elements: tuple[int, ...]  # atoms of each of the model's elements


def batch_sizes(model: EnergyModel, batch: Batch) -> BatchSizes:
    n_types = len(model.atomic_types)
    first, second = batch.pair_first, batch.pair_second
    n_atoms = int(batch.atomic_numbers.shape[0])
    element_index = model.type_to_index.index_select(0, batch.atomic_numbers)
    elements = tuple(torch.bincount(element_index, minlength=n_types).tolist())
    if first.numel() == 0:
        return BatchSizes(0, 0, elements)
    per_atom = torch.bincount(first, minlength=n_atoms)
    per_element = torch.bincount(first * n_types + element_index.index_select(0, second))
    return BatchSizes(int(per_atom.max()), int(per_element.max()), elements)


@dataclass(frozen=True)
class BatchShape:
    """Everything a graph traced for one batch shape holds as a constant."""

    inputs: tuple[tuple[int, ...], ...]  # the shape of each model input, in order
    mirrored_pairs: int  # EnergyModel.edge_geometry's half; 0 for another layout
    sizes: BatchSizes  # with the widths rounded up (bucket): any larger width does

    def readable(self) -> str:
        atoms, structures, pairs = self.inputs[0][0], self.inputs[1][0], self.inputs[4][0]
        return f"{structures} structures, {atoms} atoms, {pairs} pairs"


def batch_shape(model: EnergyModel, batch: Batch) -> BatchShape:
    sizes = batch_sizes(model, batch)
    return BatchShape(
        inputs=tuple(tuple(tensor.shape) for tensor in model_inputs(batch).values()),
        mirrored_pairs=mirrored_half(batch.pair_first, batch.pair_second, batch.cell_shifts),
        sizes=dataclasses.replace(
            sizes, pairs=bucket(sizes.pairs), pairs_per_element=bucket(sizes.pairs_per_element)
        ),
    )


def padded(model: EnergyModel, batch: Batch) -> Batch:
    """The batch with atoms, pairs and structures added up to the next sizes of
    ``bucket``, so that batches of nearby sizes share one graph. What is added changes
    no prediction of the batch's own structures: the atoms added belong to structures
    of their own (after the batch's, without a cell), the pairs added join added atoms
    only, and the added atoms come after the batch's, so no index of the batch changes.
    Their outputs are cut off again (CompiledPredictions). Pairs are kept in the
    mirrored layout [pairs; the same reversed]; a batch in another layout is returned
    unchanged (its shape then is its own)."""
    n_pairs = int(batch.pair_first.shape[0])
    half = mirrored_half(batch.pair_first, batch.pair_second, batch.cell_shifts)
    if n_pairs and not half:
        return batch
    added_pairs = bucket(half) - half
    sizes = batch_sizes(model, batch)
    # the added atoms that hold the added pairs: as many as keep each one's pairs near
    # the batch's most per atom and element, so that the widths do not grow
    most = sizes.pairs_per_element
    hosts = 0 if added_pairs == 0 else max(2, -(-2 * added_pairs // max(most, 1)))
    counts = list(sizes.elements)
    counts[0] += hosts  # hosts are of the model's first element
    added_elements: list[int] = [0] * hosts
    for element, count in enumerate(counts):
        added_elements += [element] * (bucket(count) - count)
    n_added = len(added_elements)
    n_structures = batch.n_structures
    total_structures = bucket(n_structures + (1 if n_added else 0))
    if n_added == 0 and total_structures == n_structures:
        return batch
    n_atoms = int(batch.positions.shape[0])
    like = batch.positions
    types = torch.tensor(model.atomic_types, dtype=batch.atomic_numbers.dtype)
    atomic_numbers = types.index_select(0, torch.tensor(added_elements, dtype=torch.long))
    # on a circle well within the cutoff: every added pair has a length, and a small one
    angles = torch.arange(n_added, dtype=torch.float64) * (2 * torch.pi / max(n_added, 1))
    radius = 0.3 * model.cutoff
    circle = torch.stack([radius * angles.cos(), radius * angles.sin(), 0 * angles], 1)
    # added pair k joins host k mod hosts to the next host
    chain = torch.arange(added_pairs, dtype=torch.long)
    index = batch.pair_first
    first = (n_atoms + chain % max(hosts, 1)).to(index.device)
    second = (n_atoms + (chain + 1) % max(hosts, 1)).to(index.device)
    shifts = batch.cell_shifts
    no_shift = shifts.new_zeros((added_pairs, 3))
    real_first, real_second = index[:half], batch.pair_second[:half]
    extra_structures = total_structures - n_structures
    added_counts = [n_added] + [0] * (extra_structures - 1)
    variant = batch.energy_variant
    return dataclasses.replace(
        batch,
        positions=torch.cat([batch.positions, circle.to(like)]),
        atomic_numbers=torch.cat([batch.atomic_numbers, atomic_numbers.to(index.device)]),
        system_index=torch.cat(
            [batch.system_index, batch.system_index.new_full((n_added,), n_structures)]
        ),
        cell=torch.cat([batch.cell, batch.cell.new_zeros((extra_structures, 3, 3))]),
        periodic=torch.cat([batch.periodic, batch.periodic.new_zeros(extra_structures)]),
        pair_first=torch.cat([real_first, first, real_second, second]),
        pair_second=torch.cat([real_second, second, real_first, first]),
        cell_shifts=torch.cat([shifts[:half], no_shift, shifts[half:], no_shift]),
        n_atoms=torch.cat([batch.n_atoms, batch.n_atoms.new_tensor(added_counts)]),
        energy_variant=None
        if variant is None
        else torch.cat([variant, variant.new_zeros(extra_structures)]),
    )
