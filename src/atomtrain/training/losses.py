"""Losses normalised by global counts, so that summing over ranks gives the loss of the
whole global batch (and the sum of the ranks' gradients the single-process gradient)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..data.batch import Batch
from ..options import LossOptions
from ..targets import is_per_volume


@dataclass(frozen=True)
class GlobalCounts:
    """How many of each target the whole global batch holds (all ranks together)."""

    structures: int
    force_components: int
    stress_components: int
    target_values: dict[str, int] = field(default_factory=dict)  # known values, mtt::


def elementwise(kind: str, difference: torch.Tensor, huber_delta: float) -> torch.Tensor:
    if kind == "mse":
        return difference**2
    if kind == "mae":
        return difference.abs()
    return torch.nn.functional.huber_loss(
        difference, torch.zeros_like(difference), reduction="none", delta=huber_delta
    )


def known_only(difference: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Differences of unknown targets set to zero: they add nothing to any loss or error
    sum (every elementwise loss is zero at zero). A product, not a selection, so that
    the step needs no host-device synchronisation."""
    if mask is None:
        return difference
    return difference * mask.reshape(-1, *[1] * (difference.dim() - 1)).to(difference.dtype)


def weighted(terms: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Elementwise loss terms [rows, ...] times each row's weight (rows: structures, or
    atoms with their structure's weight)."""
    if weights is None:
        return terms
    return terms * weights.reshape(-1, *[1] * (terms.dim() - 1)).to(terms.dtype)


def atom_weights(batch: Batch) -> torch.Tensor | None:
    if batch.weights is None:
        return None
    return batch.weights.index_select(0, batch.system_index)


def volume_per_atom(batch: Batch) -> torch.Tensor:
    """[structures, 1, 1]: turns a stress error into one of the virial per atom (eV/atom),
    which weighs like the energy per atom whatever the cell size (metatrain's convention
    too); a stress error in eV/A^3 is some 20 times smaller for silicon, and strained
    cells were learnt poorly on it."""
    volume = torch.abs(torch.linalg.det(batch.cell)) / batch.n_atoms
    return volume.reshape(-1, 1, 1).to(batch.cell.dtype)


def batch_loss(
    predictions: dict[str, torch.Tensor],
    batch: Batch,
    options: LossOptions,
    counts: GlobalCounts,
) -> torch.Tensor:
    """This rank's share of the global-batch loss: its error sums over global counts,
    each structure's terms times its weight (``batch.weights``)."""
    weights = options.weights
    per_structure, per_atom = batch.weights, atom_weights(batch)

    def term(
        difference: torch.Tensor,
        row_weights: torch.Tensor | None,
        kind: str = options.type,
        delta: float = options.huber_delta,
    ) -> torch.Tensor:
        return weighted(elementwise(kind, difference, delta), row_weights).sum()

    loss = predictions["energy"].new_zeros(())
    if batch.energy is not None:
        difference = (predictions["energy"] - batch.energy) / batch.n_atoms
        loss = loss + weights.energy * term(difference, per_structure) / max(counts.structures, 1)
    if batch.forces is not None and "forces" in predictions:
        difference = known_only(predictions["forces"] - batch.forces, batch.forces_mask)
        loss = loss + weights.forces * term(difference, per_atom) / max(counts.force_components, 1)
    if batch.stress is not None and "stress" in predictions:
        difference = (predictions["stress"] - batch.stress) * volume_per_atom(batch)
        difference = known_only(difference, batch.stress_mask)
        loss = loss + weights.stress * term(difference, per_structure) / max(
            counts.stress_components, 1
        )
    for name, reference in batch.targets.items():
        if name not in predictions:
            continue
        difference = predictions[name] - reference
        if is_per_volume(name):  # as the stress's: on the virial per atom
            difference = difference * volume_per_atom(batch).reshape(-1, 1)
        difference = known_only(difference, batch.target_masks.get(name))
        rows = per_atom if name in batch.atom_targets else per_structure
        weight = options.target_weight(name)
        kind, delta = options.target_loss(name)
        total = term(difference, rows, kind, delta)
        loss = loss + weight * total / max(counts.target_values.get(name, 0), 1)
    return loss
