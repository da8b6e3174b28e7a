"""Losses normalised by global counts, so that summing over ranks gives the loss of the
whole global batch (and the sum of the ranks' gradients the single-process gradient)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..data.batch import Batch
from ..options import LossOptions


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
    """This rank's share of the global-batch loss: its error sums over global counts."""
    weights = options.weights
    loss = predictions["energy"].new_zeros(())
    if batch.energy is not None:
        difference = (predictions["energy"] - batch.energy) / batch.n_atoms
        term = elementwise(options.type, difference, options.huber_delta).sum()
        loss = loss + weights.energy * term / max(counts.structures, 1)
    if batch.forces is not None and "forces" in predictions:
        difference = known_only(predictions["forces"] - batch.forces, batch.forces_mask)
        term = elementwise(options.type, difference, options.huber_delta).sum()
        loss = loss + weights.forces * term / max(counts.force_components, 1)
    if batch.stress is not None and "stress" in predictions:
        difference = (predictions["stress"] - batch.stress) * volume_per_atom(batch)
        difference = known_only(difference, batch.stress_mask)
        term = elementwise(options.type, difference, options.huber_delta).sum()
        loss = loss + weights.stress * term / max(counts.stress_components, 1)
    for name, reference in batch.targets.items():
        if name not in predictions:
            continue
        difference = known_only(predictions[name] - reference, batch.target_masks.get(name))
        term = elementwise(options.type, difference, options.huber_delta).sum()
        weight = options.target_weight(name)
        loss = loss + weight * term / max(counts.target_values.get(name, 0), 1)
    return loss
