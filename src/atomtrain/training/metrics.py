"""Error metrics as sums and counts: add up per batch, all-reduce once, divide once."""

from __future__ import annotations

import math

import torch

from ..data.batch import Batch
from .losses import known_only, volume_per_atom

SUM_NAMES = (
    "energy_per_atom_squared",
    "energy_per_atom_absolute",
    "energy_squared",
    "energy_absolute",
    "structures",
    "forces_squared",
    "forces_absolute",
    "force_components",
    "stress_squared",
    "stress_absolute",
    "stress_components",
    "loss",
    "virial_per_atom_squared",
    "virial_per_atom_absolute",
)

# metric name -> (sum name, count name, root?)
METRICS = {
    "energy_per_atom_rmse": ("energy_per_atom_squared", "structures", True),
    "energy_per_atom_mae": ("energy_per_atom_absolute", "structures", False),
    "energy_rmse": ("energy_squared", "structures", True),
    "energy_mae": ("energy_absolute", "structures", False),
    "forces_rmse": ("forces_squared", "force_components", True),
    "forces_mae": ("forces_absolute", "force_components", False),
    "stress_rmse": ("stress_squared", "stress_components", True),
    "stress_mae": ("stress_absolute", "stress_components", False),
    # the stress error as the loss weighs it (volume_per_atom): what picks the best model
    "virial_per_atom_rmse": ("virial_per_atom_squared", "stress_components", True),
    "virial_per_atom_mae": ("virial_per_atom_absolute", "stress_components", False),
}


def known_count(difference: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | int:
    """How many entries of ``difference`` have a known target."""
    if mask is None:
        return difference.numel()
    return mask.sum() * (difference.numel() // max(mask.numel(), 1))


def sum_names(targets: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The sums kept: the energy's, then squared and absolute errors and the count of
    known values of each mtt:: target."""
    extra = tuple(f"{name}_{part}" for name in targets for part in TARGET_PARTS)
    return SUM_NAMES + extra


TARGET_PARTS = ("squared", "absolute", "values")


class MetricSums:
    """Running sums of errors and counts, kept as one float64 tensor."""

    def __init__(self, device: torch.device | str = "cpu", targets: tuple[str, ...] = ()):
        names = sum_names(targets)
        self.targets = targets
        self.values = torch.zeros(len(names), dtype=torch.float64, device=device)
        self.index = {name: position for position, name in enumerate(names)}

    def add(self, name: str, value: torch.Tensor | float) -> None:
        self.values[self.index[name]] += value

    @torch.no_grad()
    def accumulate(
        self,
        predictions: dict[str, torch.Tensor],
        batch: Batch,
        loss: torch.Tensor | None = None,
    ) -> None:
        if batch.energy is not None:
            difference = (predictions["energy"].detach() - batch.energy).double()
            per_atom = difference / batch.n_atoms
            self.add("energy_per_atom_squared", (per_atom**2).sum())
            self.add("energy_per_atom_absolute", per_atom.abs().sum())
            self.add("energy_squared", (difference**2).sum())
            self.add("energy_absolute", difference.abs().sum())
            self.add("structures", batch.n_structures)
        if batch.forces is not None and "forces" in predictions:
            difference = (predictions["forces"].detach() - batch.forces).double()
            difference = known_only(difference, batch.forces_mask)
            self.add("forces_squared", (difference**2).sum())
            self.add("forces_absolute", difference.abs().sum())
            self.add("force_components", known_count(difference, batch.forces_mask))
        if batch.stress is not None and "stress" in predictions:
            difference = (predictions["stress"].detach() - batch.stress).double()
            difference = known_only(difference, batch.stress_mask)
            self.add("stress_squared", (difference**2).sum())
            self.add("stress_absolute", difference.abs().sum())
            self.add("stress_components", known_count(difference, batch.stress_mask))
            virial = difference * volume_per_atom(batch).double()
            self.add("virial_per_atom_squared", (virial**2).sum())
            self.add("virial_per_atom_absolute", virial.abs().sum())
        for name in self.targets:
            if name not in batch.targets or name not in predictions:
                continue
            mask = batch.target_masks.get(name)
            difference = (predictions[name].detach() - batch.targets[name]).double()
            difference = known_only(difference, mask)
            self.add(f"{name}_squared", (difference**2).sum())
            self.add(f"{name}_absolute", difference.abs().sum())
            self.add(f"{name}_values", known_count(difference, mask))
        if loss is not None:
            self.add("loss", loss.detach().double())


def resumed_sums(values: torch.Tensor) -> torch.Tensor:
    """Sums saved by a checkpoint, completed with zeros for sums added to SUM_NAMES since
    (always at its end): a run preempted mid-epoch resumes after an update of atomtrain,
    and only that epoch's new metrics miss the steps before the preemption."""
    missing = len(SUM_NAMES) - values.shape[0]
    return torch.cat([values, values.new_zeros(missing)]) if missing > 0 else values


def finalize(values: torch.Tensor, targets: tuple[str, ...] = ()) -> dict[str, float]:
    """Metrics from (already reduced) sums; targets without data are left out. An mtt::
    target's are ``<name>_rmse`` and ``<name>_mae`` over its known values."""
    sums = dict(zip(sum_names(targets), values.cpu().tolist()))
    metrics = {}
    kinds = dict(METRICS)
    for name in targets:
        kinds[f"{name}_rmse"] = (f"{name}_squared", f"{name}_values", True)
        kinds[f"{name}_mae"] = (f"{name}_absolute", f"{name}_values", False)
    for name, (total, count, root) in kinds.items():
        if sums.get(count, 0) > 0:
            mean = sums[total] / sums[count]
            metrics[name] = math.sqrt(mean) if root else mean
    return metrics


def reduce_together(context, parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Sum several MetricSums tensors (of one layout) over ranks in one fused call; same
    order back."""
    reduced = context.all_reduce_sum(torch.cat(parts))
    return list(reduced.split(parts[0].shape[0]))
